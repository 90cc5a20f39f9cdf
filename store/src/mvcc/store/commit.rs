//! Staging commands into [`Changes`] and committing them: the redo record, the history
//! writes, and completing or undoing the last commit after a crash ([`Redo`]).

use super::*;

#[derive(Serialize, Deserialize)]
pub(in crate::mvcc) struct RedoHead {
    chunks: u32,
    len: u64,
    crc: u32,
}

pub(super) fn redo_chunk_key(i: usize) -> Vec<u8> {
    format!("redo/{i}").into_bytes()
}

/// Keys changed by staged commands: the new version, or `None` for a deletion. A key is the
/// same shared buffer as in the index and the events.
pub(super) type StagedKeys = BTreeMap<Bytes, Option<KeyValue>>;

/// What one command changes, over the changes of the commands staged before it in the same
/// [`Changes`].
pub(super) struct WriteSet<'a> {
    /// Keys changed by the commands staged before this one.
    pub(super) base: &'a StagedKeys,
    pub(super) own: Staged,
}

impl<'a> WriteSet<'a> {
    pub(super) fn new(main: i64, base: &'a StagedKeys) -> Self {
        Self {
            base,
            own: Staged {
                main,
                overlay: BTreeMap::new(),
                events: Vec::new(),
                lease_puts: Vec::new(),
                lease_removes: Vec::new(),
                lkeys: Vec::new(),
                meta_puts: Vec::new(),
                compact: None,
            },
        }
    }

    pub(super) fn detach(&mut self, lease: i64, key: &[u8]) {
        self.own.lkeys.push((lease, key.to_vec(), false));
    }
}

/// What one command changed.
pub(super) struct Staged {
    /// The revision its changes get.
    pub(super) main: i64,
    /// Keys it changed, over the earlier commands' keys.
    pub(super) overlay: StagedKeys,
    /// Its changes in order: the `n`th has revision (`main`, `n`) and is the history record
    /// the commit writes (a put, or a delete's tombstone) as well as what watchers get.
    pub(super) events: Vec<Event>,
    pub(super) lease_puts: Vec<Lease>,
    pub(super) lease_removes: Vec<i64>,
    /// Lease attachments (`true`) and detachments, in order.
    pub(super) lkeys: Vec<(i64, Vec<u8>, bool)>,
    pub(super) meta_puts: Vec<(Vec<u8>, Vec<u8>)>,
    pub(super) compact: Option<i64>,
}

/// The changes of consecutive commands (and the caller's metadata), staged in memory by
/// [`MvccStore::stage`] and committed together by [`MvccStore::commit`] (whole or not at all
/// after a crash: see [`Redo`]).
///
/// # Correctness
/// Each command reads the store as the commands staged before it left it: key reads go
/// through the staged keys first. Only transactions whose reads are all at the newest
/// revision are staged after other commands; every other command (lease grants and revokes,
/// compactions, alarms, member attributes, a transaction that reads at a past revision) reads
/// state that only sled holds, so it is staged only into empty changes and closes them.
pub struct Changes {
    /// The newest revision, staged changes included.
    revision: i64,
    /// Keys changed by the staged commands.
    keys: StagedKeys,
    /// The changes of each staged revision, in revision order: the history records to
    /// write (see [`Staged::events`]), then the events to publish.
    batches: Vec<RevisionBatch>,
    lease_puts: Vec<Lease>,
    lease_removes: Vec<i64>,
    lkeys: Vec<(i64, Vec<u8>, bool)>,
    meta: BTreeMap<Vec<u8>, Vec<u8>>,
    compact: Option<i64>,
    commands: usize,
    closed: bool,
}

impl Changes {
    /// The newest revision, counting the staged commands.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Commits `value` under `key` in the store's metadata with the staged changes.
    pub fn set_meta(&mut self, key: &[u8], value: Vec<u8>) {
        self.meta.insert(key.to_vec(), value);
    }

    /// What committing the changes takes: their [`Redo`], and the staged revisions, from
    /// which [`commit_writes`] makes the writes one at a time as the commit goes (gathered
    /// first, the writes of a DeleteRange of a hundred thousand keys held three hundred
    /// thousand keys and records in memory at once).
    pub(in crate::mvcc) fn into_commit(self) -> Commit {
        let Changes {
            revision,
            batches,
            lease_puts,
            lease_removes,
            lkeys,
            mut meta,
            compact,
            ..
        } = self;
        let changed = !batches.is_empty();
        if changed {
            meta.insert(META_REVISION.to_vec(), revision.to_be_bytes().to_vec());
        }
        let mut other: Vec<Write> =
            Vec::with_capacity(lease_puts.len() + lease_removes.len() + lkeys.len() + meta.len());
        for lease in &lease_puts {
            other.push((
                TREE_LEASES,
                (lease.id as u64).to_be_bytes().to_vec(),
                Some(encode(lease)),
            ));
        }
        for id in &lease_removes {
            other.push((TREE_LEASES, (*id as u64).to_be_bytes().to_vec(), None));
        }
        for (id, key, attach) in &lkeys {
            other.push((TREE_LKEYS, lkey(*id, key), attach.then(Vec::new)));
        }
        for (k, v) in meta {
            other.push((TREE_META, k, Some(v)));
        }
        // Every staged revision has at least one change (see `absorb`).
        let redo = Redo {
            first: batches.first().map_or((0, 0), |b| (b.revision, 0)),
            last: batches
                .last()
                .map_or((0, 0), |b| (b.revision, b.events.len() as i64 - 1)),
            records: batches.iter().map(|b| b.events.len() as u64).sum(),
            other,
        };
        Commit {
            redo,
            revision: changed.then_some(revision),
            batches,
            compact,
        }
    }

    fn absorb(&mut self, staged: Staged) {
        if !staged.events.is_empty() {
            self.revision = staged.main;
            self.batches.push(RevisionBatch {
                revision: staged.main,
                events: staged.events,
                restored: false,
            });
        }
        // Moved, not inserted again, when nothing was staged before (a DeleteRange on its own
        // changes hundreds of thousands of keys).
        if self.keys.is_empty() {
            self.keys = staged.overlay;
        } else {
            self.keys.extend(staged.overlay);
        }
        self.lease_puts.extend(staged.lease_puts);
        self.lease_removes.extend(staged.lease_removes);
        self.lkeys.extend(staged.lkeys);
        self.meta.extend(staged.meta_puts);
        if staged.compact.is_some() {
            self.compact = staged.compact;
        }
    }
}

/// What a commit is about to write, kept (in the `redo` tree) before anything else of it.
///
/// A commit writes its history records first, then `other`. sled recovers a prefix of its log
/// after a crash, so at open ([`MvccStore::finish_redo`]): if every history record of the last
/// commit is there, `other` is written (again: the writes are blind, so twice is harmless); if
/// only some are, the crash came before anything else of the commit was written, and they are
/// removed. Either way the store holds whole commits (the key index is built from the history
/// after this); the Raft log applies again whatever is not there.
#[derive(Serialize, Deserialize)]
pub(in crate::mvcc) struct Redo {
    /// The first and last revision (main, sub) of the commit's history records, and how many
    /// there are.
    first: (i64, i64),
    last: (i64, i64),
    records: u64,
    /// The writes to the other trees (leases, lease attachments, metadata).
    other: Vec<Write>,
}

impl Commit {
    /// How many writes the commit makes, and how many of them are history values (a record
    /// or a run of them).
    #[cfg(test)]
    pub(in crate::mvcc) fn write_count(&self) -> (usize, usize) {
        let writes = || commit_writes(&self.batches, self.redo.other.clone());
        (
            writes().count(),
            writes().filter(|(tree, ..)| *tree == TREE_HIST).count(),
        )
    }
}

/// The history records of staged revisions, in revision order: the `n`th change of a revision
/// has sub-revision `n`.
pub(super) fn staged_records(
    batches: &[RevisionBatch],
) -> impl Iterator<Item = (Revision, RecordRef<'_>)> + Clone {
    batches.iter().flat_map(|b| {
        b.events.iter().enumerate().map(move |(sub, e)| {
            let rev = Revision {
                main: b.revision,
                sub: sub as i64,
            };
            (rev, RecordRef::of(e))
        })
    })
}

/// Every write of a commit, in the order [`Redo`] relies on: history (in runs: see
/// [`group_records`]), then the rest, each made (encoded) only when the one before it is
/// written.
pub(super) fn commit_writes(
    batches: &[RevisionBatch],
    other: Vec<Write>,
) -> impl Iterator<Item = Write> + '_ {
    group_records(staged_records(batches).map(|(rev, r)| (rev, encode(&r))))
        .map(|(rev, value)| (TREE_HIST, rev.to_bytes().to_vec(), Some(value)))
        .chain(other)
}

/// What [`MvccStore::commit`] does with [`Changes`].
pub(in crate::mvcc) struct Commit {
    pub(super) redo: Redo,
    /// The new revision, if the changes made one.
    revision: Option<i64>,
    /// The staged revisions: their history records, then their events to publish.
    batches: Vec<RevisionBatch>,
    compact: Option<i64>,
}

impl MvccStore {
    /// Applies one command and commits its changes together with `extra_meta`. An `Err` inside
    /// [`Applied::output`] means the command was refused and nothing but `extra_meta` changed.
    pub fn apply(
        &self,
        cmd: &Command,
        extra_meta: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Applied, StorageError> {
        let mut changes = self.changes();
        for (k, v) in extra_meta {
            changes.set_meta(&k, v);
        }
        let applied = self
            .stage(&mut changes, cmd)?
            .ok_or_else(|| StorageError::Corrupt("empty changes refused a command".into()))?;
        self.commit(changes)?;
        Ok(applied)
    }

    /// Empty changes over the newest revision, for [`MvccStore::stage`].
    pub fn changes(&self) -> Changes {
        Changes {
            revision: self.revision(),
            keys: BTreeMap::new(),
            batches: Vec::new(),
            lease_puts: Vec::new(),
            lease_removes: Vec::new(),
            lkeys: Vec::new(),
            meta: BTreeMap::new(),
            compact: None,
            commands: 0,
            closed: false,
        }
    }

    /// Applies `cmd` to `changes`, in memory, and returns what it produced; nothing is written
    /// until [`MvccStore::commit`]. `None` when the command needs changes of its own (see
    /// [`Changes`]): commit these first and stage it into new ones. An `Err` inside
    /// [`Applied::output`] means the command was refused and changed nothing.
    pub fn stage(
        &self,
        changes: &mut Changes,
        cmd: &Command,
    ) -> Result<Option<Applied>, StorageError> {
        let alone = !stageable_after_others(cmd);
        if changes.closed || (alone && changes.commands > 0) {
            return Ok(None);
        }
        changes.commands += 1;
        changes.closed |= alone;
        let current = changes.revision;
        let index = self.read_lock();
        let index = &*index;
        let mut ws = WriteSet::new(current + 1, &changes.keys);
        let no_space = || self.alarms().iter().any(|a| a.kind == AlarmKind::NoSpace);
        let output = match cmd {
            Command::Batch(_) => {
                return Err(StorageError::Corrupt(
                    "a batch is applied command by command by the state machine".into(),
                ))
            }
            // With a NOSPACE alarm active every member refuses what would grow the database.
            _ if cmd.takes_space() && no_space() => Err(MvccError::NoSpace),
            Command::Txn(txn) => self
                .apply_txn(index, txn, current, &mut ws)
                .map(Output::Txn),
            Command::LeaseGrant { id, ttl } => self.apply_grant(*id, *ttl, &mut ws),
            Command::LeaseRevoke { id } => self.apply_revoke(index, *id, &mut ws),
            Command::Compact { revision } => {
                self.check_compact(*revision, current).map(|_| {
                    // Committed with the command (and the caller's applied log id), so that a
                    // crash before the compaction is done cannot lose it.
                    ws.own.meta_puts.push((
                        META_COMPACT_SCHEDULED.to_vec(),
                        revision.to_be_bytes().to_vec(),
                    ));
                    ws.own.compact = Some(*revision);
                    Output::Compacted
                })
            }
            Command::MemberAttrs {
                id,
                name,
                client_urls,
            } => {
                let mut key = META_MEMBER_PREFIX.to_vec();
                key.extend_from_slice(id.to_string().as_bytes());
                ws.own.meta_puts.push((
                    key,
                    encode(&MemberAttrs {
                        name: name.clone(),
                        client_urls: client_urls.clone(),
                    }),
                ));
                Ok(Output::MemberAttrs)
            }
            Command::Alarm {
                activate,
                member,
                alarm,
            } => {
                let mut alarms = self.alarms();
                let this = Alarm {
                    member: *member,
                    kind: *alarm,
                };
                let present = alarms.contains(&this);
                if *activate && !present {
                    alarms.push(this);
                    alarms.sort();
                } else if !*activate && present {
                    alarms.retain(|a| *a != this);
                }
                let changed = *activate != present;
                if changed {
                    ws.own
                        .meta_puts
                        .push((META_ALARMS.to_vec(), encode(&alarms)));
                }
                Ok(Output::Alarms(if changed { vec![this] } else { vec![] }))
            }
        };
        match output {
            // Refused: the command's changes are dropped.
            Err(e) => Ok(Some(Applied {
                revision: current,
                output: Err(e),
            })),
            Ok(output) => {
                let staged = ws.own;
                changes.absorb(staged);
                Ok(Some(Applied {
                    revision: changes.revision,
                    output: Ok(output),
                }))
            }
        }
    }

    /// Commits staged changes (their [`Redo`], then their writes), then publishes their events
    /// and carries out a staged compaction.
    pub fn commit(&self, changes: Changes) -> Result<(), StorageError> {
        let Commit {
            redo,
            revision,
            batches,
            compact,
        } = changes.into_commit();
        if batches.is_empty() && redo.other.is_empty() {
            return Ok(());
        }
        let encoded = encode(&redo);
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        self.write_redo(&encoded)?;
        self.write(commit_writes(&batches, redo.other))?;
        for (rev, record) in staged_records(&batches) {
            let version = Version {
                rev,
                tombstone: record.tombstone,
                lease: record.kv.lease,
            };
            index.record(&record.kv.key, version);
        }
        if let Some(revision) = revision {
            self.revision.store(revision, Ordering::Release);
        }
        drop(index);
        // No receivers is fine: nobody is watching.
        for batch in batches {
            let _ = self.hub.send(Arc::new(batch));
        }
        if let Some(rev) = compact {
            self.compact(rev)?;
        }
        Ok(())
    }

    /// Keeps a commit's [`Redo`] in the `redo` tree, in chunks small enough to stay in sled's
    /// log (larger values go to blob files, which sled does not sync), the header last.
    pub(super) fn write_redo(&self, redo: &[u8]) -> Result<(), StorageError> {
        let chunks = redo.chunks(REDO_CHUNK).collect::<Vec<_>>();
        for (i, chunk) in chunks.iter().enumerate() {
            self.trees.redo.insert(redo_chunk_key(i), *chunk)?;
        }
        let head = RedoHead {
            chunks: chunks.len() as u32,
            len: redo.len() as u64,
            crc: crc32fast::hash(redo),
        };
        self.trees.redo.insert(META_REDO, encode(&head))?;
        Ok(())
    }

    /// Commits only the first `kept` writes of `changes` after their redo, as a crash in
    /// their middle leaves them.
    #[cfg(test)]
    pub(in crate::mvcc) fn commit_torn(
        &self,
        changes: Changes,
        kept: usize,
    ) -> Result<(), StorageError> {
        let commit = changes.into_commit();
        self.write_redo(&encode(&commit.redo))?;
        self.write(commit_writes(&commit.batches, commit.redo.other).take(kept))
    }

    /// Writes only the first `chunks` chunks of `changes`' redo, as a crash while writing it
    /// leaves them (over the last commit's redo).
    #[cfg(test)]
    pub(in crate::mvcc) fn redo_torn(
        &self,
        changes: Changes,
        chunks: usize,
    ) -> Result<(), StorageError> {
        let redo = encode(&changes.into_commit().redo);
        for (i, chunk) in redo.chunks(REDO_CHUNK).take(chunks).enumerate() {
            self.trees.redo.insert(redo_chunk_key(i), chunk)?;
        }
        Ok(())
    }

    /// Makes `writes`, in order, one sled operation each.
    pub(super) fn write(
        &self,
        writes: impl IntoIterator<Item = Write>,
    ) -> Result<(), StorageError> {
        let t = &self.trees;
        let mut alarms = false;
        for (tree, key, value) in writes {
            alarms |= tree == TREE_META && key == META_ALARMS;
            let tree = match tree {
                TREE_HIST => &t.hist,
                TREE_LEASES => &t.leases,
                TREE_LKEYS => &t.lkeys,
                TREE_META => &t.meta,
                other => return Err(StorageError::Corrupt(format!("redo names tree {other}"))),
            };
            match value {
                Some(v) => tree.insert(key, v)?,
                None => tree.remove(key)?,
            };
        }
        if alarms {
            self.reload_alarms()?;
        }
        Ok(())
    }

    /// Completes or undoes the last commit, whichever its writes that survived a crash allow
    /// (see [`Redo`]).
    pub(super) fn finish_redo(&self) -> Result<(), StorageError> {
        let Some(head) = self.trees.redo.get(META_REDO)? else {
            return Ok(());
        };
        let head: RedoHead = decode(&head)?;
        let mut bytes = Vec::with_capacity(head.len as usize);
        for i in 0..head.chunks as usize {
            match self.trees.redo.get(redo_chunk_key(i))? {
                Some(chunk) => bytes.extend_from_slice(&chunk),
                None => break,
            }
        }
        // The header is written after its chunks: a header whose chunks do not match it is the
        // last whole commit's, with the next commit's redo cut while it was being written over
        // it. That commit wrote nothing else yet (its redo comes first, and sled keeps a prefix
        // of its log), and the one before it finished before it began: nothing to complete.
        if bytes.len() as u64 != head.len || crc32fast::hash(&bytes) != head.crc {
            tracing::info!(
                "the last commit was cut while its redo was written: nothing of it to undo"
            );
            self.trees.redo.clear()?;
            return Ok(());
        }
        let redo: Redo = decode(&bytes)?;
        let mut found = 0u64;
        let mut undo: Vec<Write> = Vec::new();
        if redo.records > 0 {
            let first = Revision {
                main: redo.first.0,
                sub: redo.first.1,
            }
            .to_bytes();
            let last = Revision {
                main: redo.last.0,
                sub: redo.last.1,
            }
            .to_bytes();
            for item in self.trees.hist.range(first..=last) {
                let (k, v) = item?;
                found += HistValue::parse(&k, &v)?.len() as u64;
                undo.push((TREE_HIST, k.to_vec(), None));
            }
        }
        if found == redo.records {
            self.write(redo.other)
        } else {
            tracing::info!(
                found,
                of = redo.records,
                "the last commit was cut short before its history was written: undoing it"
            );
            self.write(undo)
        }
    }
}
