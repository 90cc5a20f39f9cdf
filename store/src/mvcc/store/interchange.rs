//! A [`Dump`] as other stores of etcd's data model hold it: the history, one key-value or
//! tombstone per revision, and the leases, with the revision and the compaction. Backups in
//! etcd's format (`crate::backup`) are written from it and read back into it; the lease
//! attachments follow from the history, as they do on commit (and the key index, when the dump
//! is restored).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{
    decode, encode, lkey, Dump, HistValue, MemberAttrs, Record, META_COMPACT,
    META_COMPACT_SCHEDULED, META_MEMBER_PREFIX, META_REVISION,
};
use crate::error::StorageError;
use crate::mvcc::keys::Revision;
use crate::mvcc::{KeyValue, Lease};

/// One change of the history: a key's new version, or its deletion at `revision` (then `kv`
/// holds the key and `mod_revision` only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRecord {
    pub revision: Revision,
    pub kv: KeyValue,
    pub tombstone: bool,
}

impl Dump {
    /// The history in revision order: every change since the last compaction, and the last
    /// version at or before it of every key that was live then.
    pub fn history(&self) -> impl Iterator<Item = Result<HistoryRecord, StorageError>> + '_ {
        self.rows("hist").iter().flat_map(|(k, v)| {
            let records: Vec<Result<HistoryRecord, StorageError>> =
                match HistValue::parse(k, v.as_slice()) {
                    Ok(value) => value
                        .records()
                        .map(|(revision, record)| {
                            let record: Record = decode(record)?;
                            Ok(HistoryRecord {
                                revision,
                                kv: record.kv,
                                tombstone: record.tombstone,
                            })
                        })
                        .collect(),
                    Err(e) => vec![Err(e)],
                };
            records
        })
    }

    /// The leases in id order (as unsigned, the store's key order).
    pub fn leases(&self) -> Result<Vec<Lease>, StorageError> {
        self.rows("leases").iter().map(|(_, v)| decode(v)).collect()
    }

    /// The revision of a compaction that was committed but not carried out yet (0: none).
    pub fn scheduled_compaction(&self) -> i64 {
        self.meta_i64(META_COMPACT_SCHEDULED)
    }

    /// The attributes the members published.
    pub fn member_attrs(&self) -> Result<HashMap<u64, MemberAttrs>, StorageError> {
        let mut out = HashMap::new();
        for (k, v) in self.rows("meta") {
            let Some(id) = k.strip_prefix(META_MEMBER_PREFIX) else {
                continue;
            };
            let id = std::str::from_utf8(id)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| StorageError::Corrupt("member attribute key".into()))?;
            out.insert(id, decode(v)?);
        }
        Ok(out)
    }

    /// The dump of a store holding `history` and `leases` at `revision`, compacted at
    /// `compacted` with a compaction up to `scheduled` still to carry out (restoring the dump
    /// carries it out). Lease attachments are made for live keys whose lease exists.
    pub fn from_history(
        history: Vec<HistoryRecord>,
        leases: Vec<Lease>,
        revision: i64,
        compacted: i64,
        scheduled: i64,
    ) -> Result<Dump, StorageError> {
        let mut hist = Vec::with_capacity(history.len());
        let mut records = Vec::with_capacity(history.len());
        for h in history {
            if records
                .last()
                .is_some_and(|(prev, _): &(Revision, Record)| *prev >= h.revision)
            {
                return Err(StorageError::Corrupt(format!(
                    "history out of order at revision {}/{}",
                    h.revision.main, h.revision.sub
                )));
            }
            let record = Record {
                kv: h.kv,
                tombstone: h.tombstone,
            };
            hist.push((h.revision.to_bytes().to_vec(), encode(&record)));
            records.push((h.revision, record));
        }
        // A key's last record is its current version, unless it is a deletion.
        let mut last: BTreeMap<&[u8], &Record> = BTreeMap::new();
        for (_, r) in &records {
            last.insert(&r.kv.key[..], r);
        }
        let ids: HashSet<i64> = leases.iter().map(|l| l.id).collect();
        let mut lkeys = Vec::new();
        for (key, r) in last.into_iter().filter(|(_, r)| !r.tombstone) {
            if r.kv.lease != 0 && ids.contains(&r.kv.lease) {
                lkeys.push((lkey(r.kv.lease, key), Vec::new()));
            }
        }
        lkeys.sort();
        let mut lease_rows: Vec<(Vec<u8>, Vec<u8>)> = leases
            .iter()
            .map(|l| ((l.id as u64).to_be_bytes().to_vec(), encode(l)))
            .collect();
        lease_rows.sort();
        let mut meta = vec![(META_REVISION.to_vec(), revision.to_be_bytes().to_vec())];
        if compacted > 0 {
            meta.push((META_COMPACT.to_vec(), compacted.to_be_bytes().to_vec()));
        }
        if scheduled > compacted {
            meta.push((
                META_COMPACT_SCHEDULED.to_vec(),
                scheduled.to_be_bytes().to_vec(),
            ));
        }
        meta.sort();
        Ok(Dump {
            trees: vec![
                ("hist".into(), hist),
                ("leases".into(), lease_rows),
                ("lkeys".into(), lkeys),
                ("meta".into(), meta),
            ],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{Command, DeleteRequest, KeyRange, MvccStore, Op};

    use crate::mvcc::test_ops::{put, txn};

    /// The dump's trees that are state (not Raft's or the member's metadata).
    fn state(dump: &Dump) -> Vec<(String, super::super::Rows)> {
        dump.contents()
            .into_iter()
            .map(|(n, rows)| {
                let rows = rows
                    .iter()
                    .filter(|(k, _)| n != "meta" || !k.starts_with(b"raft_"))
                    .cloned()
                    .collect();
                (n.clone(), rows)
            })
            .collect()
    }

    #[test]
    fn a_dump_rebuilt_from_its_history_is_the_same_dump() {
        let db = sled::Config::new().temporary(true).open().expect("db");
        let store = MvccStore::open(&db).expect("store");
        store
            .apply(&Command::LeaseGrant { id: 7, ttl: 600 }, vec![])
            .expect("grant");
        store
            .apply(&Command::LeaseGrant { id: -3, ttl: 60 }, vec![])
            .expect("grant");
        txn(&store, vec![put("a", "1", 0), put("b", "1", 7)]);
        txn(&store, vec![put("a", "2", 0)]);
        txn(&store, vec![put("c", "x", 7)]);
        txn(&store, vec![put("b", "2", 0)]);
        txn(
            &store,
            vec![Op::Delete(DeleteRequest {
                range: KeyRange::single("c"),
                ..Default::default()
            })],
        );
        txn(&store, vec![put("d", "\0bin\u{1}", -3)]);
        store
            .apply(&Command::Compact { revision: 3 }, vec![])
            .expect("compact");
        txn(&store, vec![put("a", "3", 0)]);

        let dump = store.dump().expect("dump");
        let history: Vec<HistoryRecord> =
            dump.history().collect::<Result<_, _>>().expect("history");
        assert!(history.iter().any(|h| h.tombstone));
        let rebuilt = Dump::from_history(
            history,
            dump.leases().expect("leases"),
            dump.revision(),
            dump.compact_revision(),
            dump.scheduled_compaction(),
        )
        .expect("rebuilt");
        let mut want = state(&dump);
        // The scheduled compaction's marker stays behind the finished one in the live store.
        for (n, rows) in want.iter_mut() {
            if n == "meta" {
                rows.retain(|(k, _)| k.as_slice() != META_COMPACT_SCHEDULED);
            }
        }
        assert_eq!(state(&rebuilt), want);
        assert_eq!(rebuilt.hash_kv(), dump.hash_kv());
        assert_eq!(rebuilt.key_count(), 3);
    }

    #[test]
    fn refuses_history_out_of_order() {
        let record = |main| HistoryRecord {
            revision: Revision { main, sub: 0 },
            kv: KeyValue {
                key: bytes::Bytes::from_static(b"k"),
                mod_revision: main,
                ..Default::default()
            },
            tombstone: false,
        };
        assert!(Dump::from_history(vec![record(2), record(1)], vec![], 2, 0, 0).is_err());
        assert!(Dump::from_history(vec![record(2), record(2)], vec![], 2, 0, 0).is_err());
    }
}
