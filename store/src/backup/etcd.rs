//! Snapshots in etcd 3.4's format: etcd's bbolt database (`crate::bolt`) followed by the
//! SHA-256 of it, what `etcdctl snapshot save` receives from etcd and `etcdctl snapshot
//! status|restore` read.
//!
//! The buckets, as etcd 3.4 keeps them:
//! - `key`: the MVCC history. A key is a revision, main (8 bytes, big-endian) `_` sub (8 bytes),
//!   with a trailing `t` for a deletion; a value is an `mvccpb.KeyValue` (only the key for a
//!   deletion). It holds every revision since the last compaction and, for each key live at the
//!   compaction, its last version before it: what etcd rebuilds its index and revision from.
//! - `meta`: `consistent_index` (8 bytes, big-endian: the last applied Raft index, which a
//!   restore replaces), `finishedCompactRev` and `scheduledCompactRev` (revisions encoded as in
//!   `key`) once something was compacted. 3.4 writes no `term`.
//! - `lease`: lease id (8 bytes, big-endian) -> `leasepb.Lease` (ID, TTL).
//! - `members` (member id in hex -> `{"id","peerURLs","name","clientURLs"}`, which a restore
//!   replaces by its `--initial-cluster`), `members_removed`, `cluster` (`clusterVersion`),
//!   `alarm`, `auth` (`authRevision`), `authUsers`, `authRoles`.
//!
//! Reading takes `key`, `lease` and `meta`; the other buckets are about the cluster the file
//! came from, which a restore replaces.

use std::collections::BTreeMap;

use prost::Message;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{BackupError, BackupInfo, EtcdStatus, Format};
use crate::bolt::{self, Bucket, Entry};
use crate::error::StorageError;
use crate::mvcc::keys::Revision;
use crate::mvcc::store::Dump;
use crate::mvcc::{HistoryRecord, KeyValue, Lease};
use crate::proto::mvccpb;
use crate::raft::{LogId, StoredMembership};

/// The cluster version the file claims: the format is etcd 3.4's.
const CLUSTER_VERSION: &str = "3.4.0";
const TOMBSTONE: u8 = b't';

/// etcd's `leasepb.Lease`.
#[derive(Clone, PartialEq, Message)]
struct LeasePb {
    #[prost(int64, tag = "1")]
    id: i64,
    #[prost(int64, tag = "2")]
    ttl: i64,
    #[prost(int64, tag = "3")]
    remaining_ttl: i64,
}

/// A member as etcd 3.4 keeps it in the `members` bucket.
#[derive(Serialize)]
struct MemberJson {
    id: u64,
    #[serde(rename = "peerURLs")]
    peer_urls: Vec<String>,
    #[serde(rename = "isLearner", skip_serializing_if = "std::ops::Not::not")]
    is_learner: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(rename = "clientURLs", skip_serializing_if = "Vec::is_empty")]
    client_urls: Vec<String>,
}

fn revision_key(main: i64, sub: i64, tombstone: bool) -> Vec<u8> {
    let mut k = Vec::with_capacity(18);
    k.extend_from_slice(&main.to_be_bytes());
    k.push(b'_');
    k.extend_from_slice(&sub.to_be_bytes());
    if tombstone {
        k.push(TOMBSTONE);
    }
    k
}

/// A `key` bucket key: the revision and whether it is a deletion.
fn parse_revision_key(k: &[u8]) -> Option<(Revision, bool)> {
    let tombstone = match k.len() {
        17 => false,
        18 if k[17] == TOMBSTONE => true,
        _ => return None,
    };
    if k[8] != b'_' {
        return None;
    }
    let main = i64::from_be_bytes(k[..8].try_into().ok()?);
    let sub = i64::from_be_bytes(k[9..17].try_into().ok()?);
    Some((Revision { main, sub }, tombstone))
}

fn sorted_bucket(mut rows: Vec<(Vec<u8>, Vec<u8>)>) -> Bucket {
    rows.sort();
    Bucket {
        entries: rows
            .into_iter()
            .map(|(k, v)| (k, Entry::Value(v)))
            .collect(),
    }
}

/// The database etcd would hold with the dump's state.
fn to_db(dump: &Dump) -> Result<Bucket, StorageError> {
    let mut key = Bucket::default();
    for h in dump.history() {
        let h = h?;
        let kv = if h.tombstone {
            mvccpb::KeyValue {
                key: h.kv.key,
                ..Default::default()
            }
        } else {
            mvccpb::KeyValue {
                key: h.kv.key,
                create_revision: h.kv.create_revision,
                mod_revision: h.kv.mod_revision,
                version: h.kv.version,
                value: h.kv.value,
                lease: h.kv.lease,
            }
        };
        key.put(
            revision_key(h.revision.main, h.revision.sub, h.tombstone),
            kv.encode_to_vec(),
        );
    }

    let leases = dump
        .leases()?
        .into_iter()
        .map(|l| {
            let value = LeasePb {
                id: l.id,
                ttl: l.ttl,
                remaining_ttl: 0,
            };
            (l.id.to_be_bytes().to_vec(), value.encode_to_vec())
        })
        .collect();

    let mut meta = Vec::new();
    let applied: Option<LogId> = match dump.meta(crate::raft::state_machine::META_APPLIED) {
        Some(v) => bincode::deserialize(v)?,
        None => None,
    };
    let applied = applied.map_or(0, |l| l.index);
    meta.push((b"consistent_index".to_vec(), applied.to_be_bytes().to_vec()));
    let compacted = dump.compact_revision();
    let scheduled = dump.scheduled_compaction().max(compacted);
    if compacted > 0 {
        meta.push((
            b"finishedCompactRev".to_vec(),
            revision_key(compacted, 0, false),
        ));
    }
    if scheduled > 0 {
        meta.push((
            b"scheduledCompactRev".to_vec(),
            revision_key(scheduled, 0, false),
        ));
    }

    let mut members = Vec::new();
    if let Some(v) = dump.meta(crate::raft::state_machine::META_MEMBERSHIP) {
        let stored: StoredMembership = bincode::deserialize(v)?;
        let attrs = dump.member_attrs()?;
        let config = stored.membership();
        let voters: std::collections::BTreeSet<u64> = config.voter_ids().collect();
        for (id, node) in config.nodes() {
            let attr = attrs.get(id);
            let member = MemberJson {
                id: *id,
                peer_urls: vec![format!("https://{}", node.peer_addr)],
                is_learner: !voters.contains(id),
                name: attr.map(|a| a.name.clone()).unwrap_or_default(),
                client_urls: attr.map(|a| a.client_urls.clone()).unwrap_or_default(),
            };
            let json =
                serde_json::to_vec(&member).map_err(|e| StorageError::Corrupt(e.to_string()))?;
            members.push((format!("{id:x}").into_bytes(), json));
        }
    }

    let mut root = Bucket::default();
    // bbolt keeps top-level buckets in name order.
    let buckets: BTreeMap<&str, Bucket> = BTreeMap::from([
        ("alarm", Bucket::default()),
        (
            "auth",
            sorted_bucket(vec![(
                b"authRevision".to_vec(),
                1u64.to_be_bytes().to_vec(),
            )]),
        ),
        ("authRoles", Bucket::default()),
        ("authUsers", Bucket::default()),
        (
            "cluster",
            sorted_bucket(vec![(b"clusterVersion".to_vec(), CLUSTER_VERSION.into())]),
        ),
        ("key", key),
        ("lease", sorted_bucket(leases)),
        ("members", sorted_bucket(members)),
        ("members_removed", Bucket::default()),
        ("meta", sorted_bucket(meta)),
    ]);
    for (name, bucket) in buckets {
        root.put_bucket(name, bucket);
    }
    Ok(root)
}

/// What a snapshot of `dump` holds, with what etcdctl shows of its file.
fn info(dump: &Dump, etcd: EtcdStatus) -> BackupInfo {
    BackupInfo {
        format: Format::Etcd,
        compressed: false,
        revision: dump.revision(),
        compact_revision: dump.compact_revision(),
        keys: dump.key_count() as u64,
        hash: dump.hash_kv(),
        etcd: Some(etcd),
    }
}

/// A snapshot file of the dump's state: the database, then its SHA-256.
pub fn encode(dump: &Dump) -> Result<(BackupInfo, Vec<u8>), StorageError> {
    let root = to_db(dump)?;
    let mut bytes = bolt::write(&root).map_err(|e| StorageError::Corrupt(e.to_string()))?;
    let etcd = status(&root, bytes.len() as u64);
    let sum = Sha256::digest(&bytes);
    bytes.extend_from_slice(&sum);
    let info = info(dump, etcd);
    Ok((info, bytes))
}

/// What `etcdctl snapshot status` shows: a CRC-32C over each top-level bucket's name and its
/// keys and values, the revision of the last `key` entry, the entries of all buckets, the size.
fn status(root: &Bucket, size: u64) -> EtcdStatus {
    let mut hash = Crc32c::default();
    let mut revision = 0;
    let mut total_key = 0;
    for (name, entry) in &root.entries {
        let Entry::Bucket(bucket) = entry else {
            continue;
        };
        hash.update(name);
        for (k, e) in &bucket.entries {
            hash.update(k);
            if let Entry::Value(v) = e {
                hash.update(v);
            }
            if name == b"key" {
                revision = parse_revision_key(k).map_or(revision, |(r, _)| r.main);
            }
            total_key += 1;
        }
    }
    EtcdStatus {
        hash: hash.finish(),
        revision,
        total_key,
        total_size: size,
    }
}

/// Whether `bytes` end with the SHA-256 of what comes before them, as etcd decides it: by the
/// length (a database of whole pages, plus 32 bytes).
pub fn has_hash(bytes: &[u8]) -> bool {
    bytes.len() % 512 == 32
}

/// Checks and reads a snapshot in etcd's format. Without its SHA-256 (a copy of a data dir's
/// `member/snap/db`) the file is refused unless `skip_hash_check`, as etcdctl does.
pub fn decode(bytes: &[u8], skip_hash_check: bool) -> Result<(BackupInfo, Dump), BackupError> {
    let body = if has_hash(bytes) {
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if Sha256::digest(body).as_slice() != sum {
            return Err(match bolt::read(body) {
                Err(bolt::BoltError::NotBolt) => BackupError::NotASnapshot,
                _ => BackupError::Corrupt("its SHA-256 checksum does not match".into()),
            });
        }
        body
    } else {
        bytes
    };
    let db = bolt::read(body).map_err(|e| match e {
        bolt::BoltError::NotBolt => BackupError::NotASnapshot,
        other => BackupError::Corrupt(other.to_string()),
    })?;
    if !has_hash(bytes) {
        // A data dir's database file is whole pages (bbolt grows it ahead of use); anything
        // else after the database is a snapshot's SHA-256 cut short.
        let extra = bytes.len() as u64 - db.size();
        if !extra.is_multiple_of(db.page_size as u64) {
            return Err(BackupError::Corrupt(format!(
                "the file ends {extra} bytes after its database, where a saved snapshot has its \
                 32-byte SHA-256: it is cut short"
            )));
        }
        if !skip_hash_check {
            return Err(BackupError::MissingHash);
        }
    }
    let etcd = status(&db.root, db.size());
    let dump = from_db(&db.root)?;
    let info = info(&dump, etcd);
    Ok((info, dump))
}

fn from_db(root: &Bucket) -> Result<Dump, BackupError> {
    let corrupt = |what: String| BackupError::Corrupt(what);
    let key = root.bucket(b"key").ok_or(BackupError::NotEtcd)?;
    let mut history = Vec::with_capacity(key.entries.len());
    for (k, v) in key.values() {
        let (revision, tombstone) = parse_revision_key(k)
            .ok_or_else(|| corrupt(format!("a key bucket entry is not a revision: {k:02x?}")))?;
        let pb = mvccpb::KeyValue::decode(v).map_err(|e| {
            corrupt(format!(
                "the value at revision {} is not a KeyValue: {e}",
                revision.main
            ))
        })?;
        let kv = if tombstone {
            KeyValue {
                key: pb.key,
                mod_revision: revision.main,
                ..Default::default()
            }
        } else {
            KeyValue {
                key: pb.key,
                create_revision: pb.create_revision,
                mod_revision: pb.mod_revision,
                version: pb.version,
                value: pb.value,
                lease: pb.lease,
            }
        };
        history.push(HistoryRecord {
            revision,
            kv,
            tombstone,
        });
    }
    let mut leases = Vec::new();
    if let Some(bucket) = root.bucket(b"lease") {
        for (k, v) in bucket.values() {
            let pb = LeasePb::decode(v)
                .map_err(|e| corrupt(format!("lease {k:02x?} is not a Lease: {e}")))?;
            leases.push(Lease {
                id: pb.id,
                ttl: pb.ttl,
            });
        }
    }
    let compact = |name: &[u8]| -> Result<i64, BackupError> {
        match root.bucket(b"meta").and_then(|m| m.get(name)) {
            None => Ok(0),
            Some(v) => parse_revision_key(v).map(|(r, _)| r.main).ok_or_else(|| {
                corrupt(format!(
                    "meta {} is not a revision",
                    String::from_utf8_lossy(name)
                ))
            }),
        }
    };
    let compacted = compact(b"finishedCompactRev")?;
    let scheduled = compact(b"scheduledCompactRev")?;
    // etcd's revision after a restore: the newest in the history, or the compaction if later
    // (compaction may have removed the newest revisions, deletions).
    let revision = history.last().map_or(0, |h| h.revision.main).max(compacted);
    Dump::from_history(history, leases, revision, compacted, scheduled)
        .map_err(|e| corrupt(e.to_string()))
}

/// CRC-32C (Castagnoli), the checksum `etcdctl snapshot status` reports.
struct Crc32c {
    table: [u32; 256],
    crc: u32,
}

impl Default for Crc32c {
    fn default() -> Self {
        let mut table = [0u32; 256];
        for (i, slot) in table.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
            }
            *slot = c;
        }
        Self { table, crc: !0 }
    }
}

impl Crc32c {
    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.crc = self.table[((self.crc ^ u32::from(b)) & 0xff) as usize] ^ (self.crc >> 8);
        }
    }

    fn finish(&self) -> u32 {
        !self.crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        let mut c = Crc32c::default();
        c.update(b"123456789");
        assert_eq!(c.finish(), 0xE306_9283);
    }

    #[test]
    fn revision_keys_round_trip() {
        for (main, sub, tomb) in [(1, 0, false), (7, 3, true), (1 << 40, 0, false)] {
            let k = revision_key(main, sub, tomb);
            assert_eq!(k.len(), if tomb { 18 } else { 17 });
            assert_eq!(parse_revision_key(&k), Some((Revision { main, sub }, tomb)));
        }
        assert_eq!(parse_revision_key(b"consistent_index"), None);
    }
}
