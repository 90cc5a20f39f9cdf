//! Reads: ranges at the newest or a past revision, history for watchers, leases, alarms and
//! HashKV.

use super::*;

/// A live key of a range, as a read or a delete finds it: its staged version, or where its
/// stored version is.
pub(super) enum Live<'a> {
    Staged(KeyValue),
    Stored(&'a Bytes, Version),
}

/// The live keys in `range` in key order: the staged ones (`layers`, later ones over earlier
/// ones; a staged deletion hides the key) merged with the index's.
pub(super) fn live_in<'a>(
    index: &'a KeyIndex,
    range: &KeyRange,
    layers: &[&StagedKeys],
) -> Vec<Live<'a>> {
    use std::ops::Bound;
    let single_end;
    let (start, end) = if range.is_single() {
        // Exactly the key: the next key after it is the key and a zero byte.
        single_end = [range.key.as_slice(), &[0]].concat();
        (range.key.as_slice(), Some(single_end.as_slice()))
    } else {
        (range.start(), range.end())
    };
    if end.is_some_and(|end| end <= start) {
        return Vec::new();
    }
    let bounds = (
        Bound::Included(start),
        end.map_or(Bound::Unbounded, Bound::Excluded),
    );
    let mut staged: BTreeMap<&[u8], Option<&KeyValue>> = BTreeMap::new();
    for layer in layers {
        for (k, v) in layer.range::<[u8], _>(bounds) {
            staged.insert(k.as_ref(), v.as_ref());
        }
    }
    let mut staged = staged.into_iter().peekable();
    let mut out = Vec::new();
    // Staged keys up to `until` (all with `None`); true when `until` itself is staged (the
    // staged version or deletion wins over the stored one).
    let mut take_staged = |out: &mut Vec<Live>, until: Option<&[u8]>| {
        while let Some((k, _)) = staged.peek() {
            if until.is_some_and(|u| *k > u) {
                break;
            }
            let (k, v) = staged.next().expect("peeked");
            if let Some(kv) = v {
                out.push(Live::Staged(kv.clone()));
            }
            if until == Some(k) {
                return true;
            }
        }
        false
    };
    for (k, version) in index.range(start, end, i64::MAX) {
        if !take_staged(&mut out, Some(k.as_ref())) {
            out.push(Live::Stored(k, version));
        }
    }
    take_staged(&mut out, None);
    out
}

pub(super) fn sort_kvs(kvs: &mut [KeyValue], order: SortOrder, target: SortTarget) {
    let order = match (order, target) {
        (SortOrder::None, SortTarget::Key) => return,
        (SortOrder::None, _) => SortOrder::Ascend,
        (o, _) => o,
    };
    kvs.sort_by(|a, b| {
        let ord = match target {
            SortTarget::Key => a.key.cmp(&b.key),
            SortTarget::Version => a.version.cmp(&b.version),
            SortTarget::Create => a.create_revision.cmp(&b.create_revision),
            SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
            SortTarget::Value => a.value.cmp(&b.value),
        };
        if order == SortOrder::Descend {
            ord.reverse()
        } else {
            ord
        }
    });
}

impl MvccStore {
    /// A range read at the newest or at a past revision. Returns the result and the store
    /// revision the read saw.
    pub fn range(&self, req: &RangeRequest) -> Result<(RangeResult, i64), MvccError> {
        let index = self.read_lock();
        let current = self.revision();
        let result = self.range_locked(&index, req, current, None)?;
        Ok((result, current))
    }

    pub(super) fn range_locked(
        &self,
        index: &KeyIndex,
        req: &RangeRequest,
        current: i64,
        ws: Option<&WriteSet>,
    ) -> Result<RangeResult, MvccError> {
        let layers = match ws {
            Some(ws) => vec![ws.base, &ws.own.overlay],
            None => Vec::new(),
        };
        let at = if req.revision > 0 {
            req.revision
        } else {
            current
        };
        if at > current {
            return Err(MvccError::FutureRevision);
        }
        let compact = self.compact_revision();
        if req.revision > 0 && at < compact {
            return Err(MvccError::Compacted {
                compact_revision: compact,
            });
        }
        let mut kvs = if at == current {
            self.scan_current(index, &req.range, &layers)
                .map_err(|_| MvccError::FutureRevision)?
        } else {
            self.scan_at(index, &req.range, at)
                .map_err(|_| MvccError::FutureRevision)?
        };
        let count = kvs.len() as i64;
        kvs.retain(|kv| {
            (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
                && (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
                && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
                && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
        });
        sort_kvs(&mut kvs, req.sort_order, req.sort_target);
        let mut more = false;
        if req.limit > 0 && kvs.len() as i64 > req.limit {
            kvs.truncate(req.limit as usize);
            more = true;
        }
        if req.count_only {
            kvs.clear();
        } else if req.keys_only {
            for kv in &mut kvs {
                kv.value.clear();
            }
        }
        Ok(RangeResult { kvs, more, count })
    }

    /// Live keys in the range in key order, with staged changes (`layers`, later ones over
    /// earlier ones) laid over the index.
    pub(super) fn scan_current(
        &self,
        index: &KeyIndex,
        range: &KeyRange,
        layers: &[&StagedKeys],
    ) -> Result<Vec<KeyValue>, StorageError> {
        if range.is_single() {
            let staged = layers
                .iter()
                .rev()
                .find_map(|l| l.get(range.key.as_slice()));
            return Ok(match staged {
                Some(kv) => kv.iter().cloned().collect(),
                None => match index.at(&range.key, i64::MAX) {
                    Some(v) => self.version_at(v.rev)?.into_iter().collect(),
                    None => Vec::new(),
                },
            });
        }
        self.versions_of(live_in(index, range, layers))
    }

    /// The versions of `live` (the stored ones read from the history) in the order of `live`.
    /// The history is read in revision order: in key order the reads of a large range jump all
    /// over the history's tree, which took twice as long for 175,000 keys.
    pub(super) fn versions_of(&self, live: Vec<Live>) -> Result<Vec<KeyValue>, StorageError> {
        let mut stored: Vec<(Revision, usize)> = live
            .iter()
            .enumerate()
            .filter_map(|(i, l)| match l {
                Live::Stored(_, v) => Some((v.rev, i)),
                Live::Staged(_) => None,
            })
            .collect();
        stored.sort_unstable();
        let mut found: Vec<Option<KeyValue>> = vec![None; live.len()];
        let mut reader = HistReader::new(&self.trees.hist);
        for (rev, i) in stored {
            found[i] = self.version_read(&mut reader, rev)?;
        }
        Ok(live
            .into_iter()
            .zip(found)
            .filter_map(|(l, found)| match l {
                Live::Staged(kv) => Some(kv),
                Live::Stored(..) => found,
            })
            .collect())
    }

    /// Keys in the range as they were at revision `at`.
    pub(super) fn scan_at(
        &self,
        index: &KeyIndex,
        range: &KeyRange,
        at: i64,
    ) -> Result<Vec<KeyValue>, StorageError> {
        if range.is_single() {
            return match index.at(&range.key, at) {
                Some(v) => Ok(self.version_at(v.rev)?.into_iter().collect()),
                None => Ok(Vec::new()),
            };
        }
        self.versions_of(
            index
                .range(range.start(), range.end(), at)
                .map(|(key, version)| Live::Stored(key, version))
                .collect(),
        )
    }

    /// The version of `key` live just before revision `before`, for a watch's prev_kv.
    pub(super) fn version_before(
        &self,
        index: &KeyIndex,
        key: &[u8],
        before: Revision,
    ) -> Result<Option<KeyValue>, StorageError> {
        match index.before(key, before) {
            Some(rev) => self.version_at(rev),
            None => Ok(None),
        }
    }

    /// The version of `key` live just before main revision `revision`: a watcher's prev_kv for
    /// a delete event that does not carry it (see [`DELETED_VERSIONS_IN_EVENTS`]). `None` once a
    /// compaction dropped it.
    pub fn version_before_revision(
        &self,
        key: &[u8],
        revision: i64,
    ) -> Result<Option<KeyValue>, StorageError> {
        let index = self.read_lock();
        self.version_before(&index, key, Revision::first_of_rev(revision))
    }

    /// Events of revisions `from..=to` inside `range`, grouped per revision, at most about
    /// `max_events` of them (a revision is never split). With `prev_kv`, each event carries the
    /// version it replaced.
    pub fn history(
        &self,
        range: &KeyRange,
        from: i64,
        to: i64,
        prev_kv: bool,
        max_events: usize,
    ) -> Result<Vec<RevisionBatch>, MvccError> {
        let index = self.read_lock();
        let compact = self.compact_revision();
        if from < compact {
            return Err(MvccError::Compacted {
                compact_revision: compact,
            });
        }
        self.history_locked(&index, range, from, to, prev_kv, max_events)
            .map_err(|_| MvccError::Compacted {
                compact_revision: compact,
            })
    }

    pub(super) fn history_locked(
        &self,
        index: &KeyIndex,
        range: &KeyRange,
        from: i64,
        to: i64,
        prev_kv: bool,
        max_events: usize,
    ) -> Result<Vec<RevisionBatch>, StorageError> {
        let mut out: Vec<RevisionBatch> = Vec::new();
        let mut seen = 0usize;
        let (lo, hi) = (
            Revision::first_of_rev(from),
            Revision::first_of_rev(to.saturating_add(1)),
        );
        'values: for value in values_in(&self.trees.hist, lo, hi) {
            let value = value?;
            for (rev, record) in value.records_in(lo, hi) {
                if seen >= max_events && out.last().is_some_and(|b| b.revision != rev.main) {
                    break 'values;
                }
                let record: Record = decode(record)?;
                if !range.contains(&record.kv.key) {
                    continue;
                }
                let prev = if prev_kv {
                    self.version_before(index, &record.kv.key, rev)?
                } else {
                    None
                };
                let event = Event {
                    kind: if record.tombstone {
                        EventKind::Delete
                    } else {
                        EventKind::Put
                    },
                    kv: record.kv,
                    prev_kv: prev,
                };
                seen += 1;
                match out.last_mut() {
                    Some(batch) if batch.revision == rev.main => batch.events.push(event),
                    _ => out.push(RevisionBatch {
                        revision: rev.main,
                        events: vec![event],
                        restored: false,
                    }),
                }
            }
        }
        Ok(out)
    }

    /// All leases with their TTL.
    pub fn leases(&self) -> Result<Vec<Lease>, StorageError> {
        let _guard = self.read_lock();
        let mut out = Vec::new();
        for item in self.trees.leases.iter() {
            let (_, v) = item?;
            out.push(decode(&v)?);
        }
        Ok(out)
    }

    pub fn lease(&self, id: i64) -> Result<Option<Lease>, StorageError> {
        let _guard = self.read_lock();
        self.lease_unlocked(id)
    }

    /// [`MvccStore::lease`] for the writer, which holds the index already (a second read lock
    /// on the same thread could wait behind a waiting writer).
    pub(super) fn lease_unlocked(&self, id: i64) -> Result<Option<Lease>, StorageError> {
        match self.trees.leases.get((id as u64).to_be_bytes())? {
            Some(v) => Ok(Some(decode(&v)?)),
            None => Ok(None),
        }
    }

    pub fn lease_keys(&self, id: i64) -> Result<Vec<Vec<u8>>, StorageError> {
        let _guard = self.read_lock();
        self.lease_keys_unlocked(id)
    }

    pub(super) fn lease_keys_unlocked(&self, id: i64) -> Result<Vec<Vec<u8>>, StorageError> {
        let mut out = Vec::new();
        for item in self.trees.lkeys.scan_prefix((id as u64).to_be_bytes()) {
            let (k, _) = item?;
            out.push(k[8..].to_vec());
        }
        Ok(out)
    }

    pub fn member_attrs(&self) -> Result<HashMap<u64, MemberAttrs>, StorageError> {
        let _guard = self.read_lock();
        let mut out = HashMap::new();
        for item in self.trees.meta.scan_prefix(META_MEMBER_PREFIX) {
            let (k, v) = item?;
            let id = std::str::from_utf8(&k[META_MEMBER_PREFIX.len()..])
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| StorageError::Corrupt("member attribute key".into()))?;
            out.insert(id, decode(&v)?);
        }
        Ok(out)
    }

    /// The active alarms, in member then kind order, as last committed (while a snapshot is
    /// being restored: as before it).
    pub fn alarms(&self) -> Vec<Alarm> {
        self.alarms
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the alarms from the metadata tree into the copy [`MvccStore::alarms`] returns.
    pub(super) fn reload_alarms(&self) -> Result<(), StorageError> {
        let alarms = match self.trees.meta.get(META_ALARMS)? {
            Some(v) => decode(&v)?,
            None => Vec::new(),
        };
        *self.alarms.write().unwrap_or_else(|e| e.into_inner()) = alarms;
        Ok(())
    }

    /// A hash of the key history in (compact revision, `revision`], equal on every member that
    /// applied the same log (etcd's HashKV). Returns the hash and the compact revision.
    pub fn hash_kv(&self, revision: i64) -> Result<(u32, i64), MvccError> {
        let _guard = self.read_lock();
        let current = self.revision();
        let at = if revision > 0 { revision } else { current };
        if at > current {
            return Err(MvccError::FutureRevision);
        }
        let compact = self.compact_revision();
        if at < compact {
            return Err(MvccError::Compacted {
                compact_revision: compact,
            });
        }
        // Record by record under its own revision, as the records were stored before runs
        // (the runs differ between members: see `history_runs`).
        let mut hasher = crc32fast::Hasher::new();
        let (lo, hi) = (
            Revision::first_of_rev(compact + 1),
            Revision::first_of_rev(at + 1),
        );
        for value in values_in(&self.trees.hist, lo, hi) {
            let value = value.map_err(|_| MvccError::FutureRevision)?;
            for (rev, record) in value.records_in(lo, hi) {
                hasher.update(&rev.to_bytes());
                hasher.update(record);
            }
        }
        Ok((hasher.finalize(), compact))
    }

    // ---- writes ----
}
