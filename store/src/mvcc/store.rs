//! The MVCC key-value store on sled.
//!
//! Trees:
//! - `hist`: revision -> [`Record`]: every change ever made (until compacted), in revision order.
//!   Every read of a key's value reads it; it is the only tree with a write per changed key.
//!   Which revision holds a key's version at a given revision is in the [`KeyIndex`], in
//!   memory, rebuilt from `hist` when the store opens. (Until 2026-12 two more trees held the
//!   index and the live versions; a DeleteRange of a hundred thousand keys then made three
//!   hundred thousand sled writes, and took longer than a request may. A store of an older
//!   build drops them when it opens.)
//! - `leases`: lease id -> [`Lease`]; `lkeys`: lease id ‖ key -> (): the keys attached to a lease.
//! - `meta`: the store revision, the compacted revision, member attributes, and whatever the
//!   caller (the Raft state machine) commits with each change.
//!
//! # Correctness
//! Only [`MvccStore::commit`] (which [`MvccStore::apply`] uses) and [`MvccStore::restore`]
//! write, and the Raft state machine calls them one at a time. Commands are staged in memory
//! ([`Changes`]) and committed together (one redo record, then plain writes: see [`Redo`]), with
//! the caller's metadata (the last applied log id), so a crash never leaves half a set of
//! commands on disk and re-applying the log after a restart starts exactly where the state
//! ends. The one command
//! whose work follows its commit, a compaction, commits its revision first and is finished on
//! the next open. Readers hold the read side of `index` while the writer holds the write side
//! for the commit, so a read never sees half a transaction.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::index::{KeyIndex, Version};
use super::keys::Revision;
use super::types::*;
use crate::error::{MvccError, StorageError};

mod apply;
mod commit;
mod compaction;
mod history_runs;
mod interchange;
mod reads;
mod snapshot;
mod validate;

use apply::stageable_after_others;
pub use commit::Changes;
use commit::{StagedKeys, WriteSet};
use history_runs::{group_records, remove_records, values_in, HistReader, HistValue, Runs};
pub use interchange::HistoryRecord;
use reads::{live_in, Live};
pub use validate::validate_txn;

/// Largest TTL etcd accepts for a lease, in seconds.
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;
/// etcd's limit on operations in one transaction.
pub const MAX_TXN_OPS: usize = 128;
/// A DeleteRange of up to this many keys carries each deleted version in its event
/// ([`Event::prev_kv`]); a larger one carries it only for keys its own transaction wrote, and
/// a watcher that wants the others reads them from the history
/// ([`MvccStore::version_before_revision`]). Reading them all made `etcdctl check perf`'s
/// final delete of 200,000 keys read 250 MiB that nobody asked for, and pass the request
/// timeout. Kubernetes deletes one object per request.
pub const DELETED_VERSIONS_IN_EVENTS: usize = 1000;

const META_REVISION: &[u8] = b"revision";
const META_COMPACT: &[u8] = b"compact_revision";
/// The revision of the newest committed compaction, which may not have been carried out yet.
const META_COMPACT_SCHEDULED: &[u8] = b"compact_scheduled";
const META_MEMBER_PREFIX: &[u8] = b"member/";
/// The active alarms, one sorted list.
const META_ALARMS: &[u8] = b"alarms";
/// The key of the last commit's [`RedoHead`] in the `redo` tree; its chunks are under
/// `redo/<index>` ([`redo_chunk_key`]).
const META_REDO: &[u8] = b"redo";
const REDO_CHUNK: usize = 64 * 1024;
/// Set when the data did not come through this cluster's Raft log (a restore, a forced new
/// cluster): the log cannot rebuild it, so a snapshot must be taken and the log purged before
/// a member is caught up from it.
const META_BASELINE_PENDING: &[u8] = b"baseline_snapshot_pending";

/// One blind write of a commit: (tree, key, value or removal).
type Write = (u8, Vec<u8>, Option<Vec<u8>>);
/// (1 and 2 were the key index and live-version trees of older builds; no redo names them.)
const TREE_HIST: u8 = 0;
const TREE_LEASES: u8 = 3;
const TREE_LKEYS: u8 = 4;
const TREE_META: u8 = 5;

/// One change in the history: a new version of a key, or its deletion (a tombstone).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    kv: KeyValue,
    tombstone: bool,
}

impl Record {
    /// The key, the lease and whether it is a deletion, read from an encoded record without
    /// decoding (and copying) its value: bincode writes the key first, length first (u64,
    /// little endian), and the lease (i64) and the tombstone flag last.
    fn indexed(bytes: &[u8]) -> Option<(&[u8], i64, bool)> {
        let len = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let key_end = 8usize.checked_add(usize::try_from(len).ok()?)?;
        let key = bytes.get(8..key_end)?;
        // Create, mod and version revisions and the value's length follow the key.
        if bytes.len() < key_end.checked_add(4 * 8 + 8 + 1)? {
            return None;
        }
        let (rest, tombstone) = bytes.split_at(bytes.len() - 1);
        let lease = i64::from_le_bytes(rest.get(rest.len() - 8..)?.try_into().ok()?);
        let tombstone = match tombstone {
            [0] => false,
            [1] => true,
            _ => return None,
        };
        Some((key, lease, tombstone))
    }
}

/// Old trees of the store that it no longer keeps (see the module doc).
const DROPPED_TREES: [&str; 2] = ["mvcc_kidx", "mvcc_cur"];

/// A [`Record`] encoded from borrowed parts (the same bytes), so that a commit writes the
/// history from its events without copying them.
#[derive(Clone, Copy, Serialize)]
struct RecordRef<'a> {
    kv: &'a KeyValue,
    tombstone: bool,
}

impl<'a> RecordRef<'a> {
    fn of(event: &'a Event) -> Self {
        Self {
            kv: &event.kv,
            tombstone: event.kind == EventKind::Delete,
        }
    }
}

/// All events of one revision, as the watch hub broadcasts them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionBatch {
    pub revision: i64,
    pub events: Vec<Event>,
    /// The whole state was replaced (a snapshot was installed): watchers re-read history.
    pub restored: bool,
}

/// Published attributes of a member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberAttrs {
    pub name: String,
    pub client_urls: Vec<String>,
}

#[derive(Clone)]
struct Trees {
    hist: sled::Tree,
    leases: sled::Tree,
    lkeys: sled::Tree,
    meta: sled::Tree,
    /// The last commit's redo (not part of the state: not in dumps).
    redo: sled::Tree,
}

/// Adds the encoded history record of `rev` to `index` (records come in revision order).
fn index_record(index: &mut KeyIndex, rev: Revision, record: &[u8]) -> Result<(), StorageError> {
    let (key, lease, tombstone) =
        Record::indexed(record).ok_or_else(|| StorageError::Corrupt("history record".into()))?;
    index.record_read(
        key,
        Version {
            rev,
            tombstone,
            lease,
        },
    );
    Ok(())
}

impl Trees {
    fn all(&self) -> [(&'static str, &sled::Tree); 4] {
        [
            ("hist", &self.hist),
            ("leases", &self.leases),
            ("lkeys", &self.lkeys),
            ("meta", &self.meta),
        ]
    }
}

/// A raw copy of every tree: what a Raft snapshot carries.
#[derive(Serialize, Deserialize)]
pub struct Dump {
    trees: Vec<(String, Rows)>,
}

/// A tree's rows, key and value.
type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// The metadata values under the keys a dump was asked for, as of the dump (None: absent).
pub type MetaValues = Vec<Option<Vec<u8>>>;

impl Dump {
    /// Every tree's rows, the history's one record per row under its own revision: what two
    /// stores that applied the same commands hold, however the commands were batched into
    /// commits (see `history_runs`).
    #[cfg(test)]
    pub(crate) fn contents(&self) -> Vec<(String, Rows)> {
        let records = |rows: &Rows| -> Rows {
            rows.iter()
                .flat_map(|(k, v)| {
                    let value = HistValue::parse(k, v.as_slice()).expect("history value");
                    value
                        .records()
                        .map(|(rev, r)| (rev.to_bytes().to_vec(), r.to_vec()))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        self.trees
            .iter()
            .map(|(n, rows)| match n.as_str() {
                "hist" => (n.clone(), records(rows)),
                _ => (n.clone(), rows.clone()),
            })
            .collect()
    }

    fn rows(&self, tree: &str) -> &[(Vec<u8>, Vec<u8>)] {
        self.trees
            .iter()
            .find(|(n, _)| n == tree)
            .map_or(&[], |(_, rows)| rows.as_slice())
    }

    fn meta_i64(&self, key: &[u8]) -> i64 {
        self.meta(key)
            .and_then(|v| v.try_into().ok())
            .map_or(0, i64::from_be_bytes)
    }

    /// The store revision the dump holds.
    pub fn revision(&self) -> i64 {
        self.meta_i64(META_REVISION)
    }

    pub fn compact_revision(&self) -> i64 {
        self.meta_i64(META_COMPACT)
    }

    /// Live keys in the dump: keys whose last history record is not a deletion.
    pub fn key_count(&self) -> usize {
        let mut last: HashMap<Vec<u8>, bool> = HashMap::new();
        for (k, v) in self.rows("hist") {
            let Ok(value) = HistValue::parse(k, v.as_slice()) else {
                continue;
            };
            for (_, record) in value.records() {
                if let Some((key, _, tombstone)) = Record::indexed(record) {
                    last.insert(key.to_vec(), tombstone);
                }
            }
        }
        last.values().filter(|tombstone| !**tombstone).count()
    }

    /// The same value [`MvccStore::hash_kv`] gives at the dump's revision.
    pub fn hash_kv(&self) -> u32 {
        let lo = Revision::first_of_rev(self.compact_revision() + 1);
        let hi = Revision::first_of_rev(self.revision() + 1);
        let mut hasher = crc32fast::Hasher::new();
        for (k, v) in self.rows("hist") {
            match HistValue::parse(k, v.as_slice()) {
                Ok(value) => {
                    for (rev, record) in value.records_in(lo, hi) {
                        hasher.update(&rev.to_bytes());
                        hasher.update(record);
                    }
                }
                // A damaged value still changes the hash, as it did before runs.
                Err(_) => {
                    hasher.update(k);
                    hasher.update(v);
                }
            }
        }
        hasher.finalize()
    }

    /// A metadata value as of the dump.
    pub fn meta(&self, key: &[u8]) -> Option<&[u8]> {
        let (_, rows) = self.trees.iter().find(|(n, _)| n == "meta")?;
        rows.iter()
            .find(|(k, _)| k.as_slice() == key)
            .map(|(_, v)| v.as_slice())
    }
}

pub struct MvccStore {
    trees: Trees,
    /// The sled database's directory, for [`MvccStore::sync`] (none for a temporary one).
    dir: Option<std::path::PathBuf>,
    /// Where each key's versions are in `hist`; also the lock that keeps reads and commits
    /// apart (see the module doc).
    index: RwLock<KeyIndex>,
    /// Held (read) by a dump while it reads the history without `index`'s lock, and (write)
    /// by what removes history: compaction and restore. Taken before `index`, never after.
    compaction_gate: RwLock<()>,
    /// Blob files [`MvccStore::sync`] has synced.
    synced_blobs: std::sync::Mutex<HashSet<std::ffi::OsString>>,
    revision: AtomicI64,
    compact_revision: AtomicI64,
    hub: broadcast::Sender<Arc<RevisionBatch>>,
    /// The active alarms as committed, a copy of `META_ALARMS` kept by every write of it: a
    /// member's status and quota checks read them without the key index's lock, which a
    /// snapshot's restore holds for its whole length (seconds for a large store).
    alarms: RwLock<Vec<Alarm>>,
    /// Watchers running on the hub, counted by the watcher sets (`super::watch`).
    pub(in crate::mvcc) watchers: AtomicUsize,
}

fn lkey(id: i64, key: &[u8]) -> Vec<u8> {
    let mut out = (id as u64).to_be_bytes().to_vec();
    out.extend_from_slice(key);
    out
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, StorageError> {
    Ok(bincode::deserialize(bytes)?)
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing plain data structs into a Vec cannot fail.
    bincode::serialize(value).unwrap_or_default()
}

fn read_i64(tree: &sled::Tree, key: &[u8]) -> Result<i64, StorageError> {
    match tree.get(key)? {
        Some(v) => Ok(i64::from_be_bytes(v.as_ref().try_into().map_err(|_| {
            StorageError::Corrupt(format!("meta {}", String::from_utf8_lossy(key)))
        })?)),
        None => Ok(0),
    }
}

impl MvccStore {
    /// Opens (or creates) the MVCC trees in sled's database in `dir`, which
    /// [`MvccStore::sync`] makes durable.
    pub fn open_dir(db: &sled::Db, dir: &std::path::Path) -> Result<Self, StorageError> {
        let mut store = Self::open(db)?;
        store.dir = Some(dir.to_path_buf());
        Ok(store)
    }

    /// Opens (or creates) the MVCC trees in `db`.
    pub fn open(db: &sled::Db) -> Result<Self, StorageError> {
        let trees = Trees {
            hist: db.open_tree("mvcc_hist")?,
            leases: db.open_tree("mvcc_leases")?,
            lkeys: db.open_tree("mvcc_lkeys")?,
            meta: db.open_tree("mvcc_meta")?,
            redo: db.open_tree("mvcc_redo")?,
        };
        let store = Self {
            trees,
            dir: None,
            index: RwLock::new(KeyIndex::default()),
            compaction_gate: RwLock::new(()),
            synced_blobs: Default::default(),
            revision: AtomicI64::new(0),
            compact_revision: AtomicI64::new(0),
            hub: broadcast::channel(4096).0,
            alarms: RwLock::default(),
            watchers: AtomicUsize::new(0),
        };
        store.finish_redo()?;
        store.reload_alarms()?;
        for name in DROPPED_TREES {
            if db.drop_tree(name)? {
                tracing::info!(
                    tree = name,
                    "dropped a tree that this build no longer keeps"
                );
            }
        }
        store.revision.store(
            read_i64(&store.trees.meta, META_REVISION)?,
            Ordering::Release,
        );
        store.compact_revision.store(
            read_i64(&store.trees.meta, META_COMPACT)?,
            Ordering::Release,
        );
        store.rebuild_index(&mut store.index.write().unwrap_or_else(|e| e.into_inner()))?;
        store.finish_compaction()?;
        Ok(store)
    }

    /// Builds the key index from the history, one record at a time in revision order.
    fn rebuild_index(&self, index: &mut KeyIndex) -> Result<(), StorageError> {
        index.clear();
        for item in self.trees.hist.iter() {
            let (k, v) = item?;
            for (rev, record) in HistValue::parse(&k, v)?.records() {
                index_record(index, rev, record)?;
            }
        }
        Ok(())
    }

    /// The version a history record holds (none for a deletion).
    fn version_at(&self, rev: Revision) -> Result<Option<KeyValue>, StorageError> {
        self.version_read(&mut HistReader::new(&self.trees.hist), rev)
    }

    /// [`MvccStore::version_at`] through `reader`, which keeps the run it read last.
    fn version_read(
        &self,
        reader: &mut HistReader<'_>,
        rev: Revision,
    ) -> Result<Option<KeyValue>, StorageError> {
        match reader.get(rev)? {
            Some(v) => {
                let record: Record = decode(v)?;
                Ok((!record.tombstone).then_some(record.kv))
            }
            None => Err(StorageError::Corrupt(format!(
                "the key index names revision {}/{}, which the history does not hold",
                rev.main, rev.sub
            ))),
        }
    }

    /// The read side of `index`, which every public read takes, so that no read sees half a
    /// commit. A long commit (a DeleteRange of a hundred thousand keys takes seconds in sled)
    /// holds the write side; a reader on one of the async runtime's workers then waits through
    /// `block_in_place`, which hands the worker's other tasks to another thread, so the peer
    /// service still answers heartbeats and votes meanwhile.
    fn read_lock(&self) -> std::sync::RwLockReadGuard<'_, KeyIndex> {
        match self.index.try_read() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                let wait = || self.index.read().unwrap_or_else(|e| e.into_inner());
                let multi_thread = tokio::runtime::Handle::try_current().is_ok_and(|h| {
                    h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
                });
                if multi_thread {
                    tokio::task::block_in_place(wait)
                } else {
                    wait()
                }
            }
        }
    }

    /// The newest revision.
    pub fn revision(&self) -> i64 {
        self.revision.load(Ordering::Acquire)
    }

    pub fn compact_revision(&self) -> i64 {
        self.compact_revision.load(Ordering::Acquire)
    }

    /// Live events, one batch per revision. A receiver that falls too far behind gets
    /// `Lagged` and must catch up from [`MvccStore::history`].
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<RevisionBatch>> {
        self.hub.subscribe()
    }

    pub fn watcher_count(&self) -> usize {
        self.watchers.load(Ordering::Relaxed)
    }

    /// A value the caller committed alongside a command.
    pub fn meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        let _guard = self.read_lock();
        Ok(self.trees.meta.get(key)?.map(|v| v.to_vec()))
    }

    /// Approximate bytes on disk of the MVCC trees.
    pub fn size_estimate(&self) -> u64 {
        self.trees
            .all()
            .iter()
            .map(|(_, t)| {
                t.iter()
                    .filter_map(|r| r.ok())
                    .map(|(k, v)| (k.len() + v.len()) as u64)
                    .sum::<u64>()
            })
            .sum()
    }

    /// Removes metadata entries (local bookkeeping outside the log).
    pub fn remove_meta(&self, keys: &[&[u8]]) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for k in keys {
            batch.remove(*k);
        }
        self.trees.meta.apply_batch(batch)?;
        Ok(())
    }

    /// Whether the data still needs its baseline Raft snapshot (see `META_BASELINE_PENDING`).
    pub fn baseline_pending(&self) -> Result<bool, StorageError> {
        Ok(self.trees.meta.contains_key(META_BASELINE_PENDING)?)
    }

    pub fn set_baseline_pending(&self, pending: bool) -> Result<(), StorageError> {
        if pending {
            self.trees.meta.insert(META_BASELINE_PENDING, &[][..])?;
        } else {
            self.trees.meta.remove(META_BASELINE_PENDING)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    /// The key index is rebuilt from records without decoding their values.
    #[test]
    fn a_record_gives_its_key_lease_and_deletion_without_decoding() {
        for (key, value, tombstone) in [
            (&b""[..], &b""[..], false),
            (b"k\0\x01", b"value", false),
            (b"gone", b"", true),
            (b"big", &[7u8; 70_000][..], false),
        ] {
            let record = Record {
                kv: KeyValue {
                    key: Bytes::copy_from_slice(key),
                    value: Bytes::copy_from_slice(value),
                    create_revision: 1,
                    mod_revision: 2,
                    version: 3,
                    lease: -1,
                },
                tombstone,
            };
            let bytes = encode(&record);
            assert_eq!(Record::indexed(&bytes), Some((key, -1, tombstone)));
            assert_eq!(
                Record::indexed(&bytes[..bytes.len() - 1]).map(|r| r.0),
                None
            );
        }
        assert_eq!(Record::indexed(&[1, 0, 0, 0, 0, 0, 0, 0]), None);
        assert_eq!(Record::indexed(&[]), None);
    }

    /// A commit writes history records from its events through [`RecordRef`]; they are read
    /// back as [`Record`]s.
    #[test]
    fn a_record_encodes_the_same_from_its_parts() {
        let kv = KeyValue {
            key: Bytes::from_static(b"k\0ey"),
            create_revision: 3,
            mod_revision: 7,
            version: 2,
            value: Bytes::from_static(&[0, 1, 255]),
            lease: -5,
        };
        for tombstone in [false, true] {
            let owned = Record {
                kv: kv.clone(),
                tombstone,
            };
            let borrowed = RecordRef { kv: &kv, tombstone };
            assert_eq!(encode(&borrowed), encode(&owned), "tombstone: {tombstone}");
        }
    }
}
