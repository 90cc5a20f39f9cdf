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
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::index::{KeyIndex, Version};
use super::keys::Revision;
use super::types::*;
use crate::error::{MvccError, StorageError};

mod interchange;
pub use interchange::HistoryRecord;

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

#[derive(Serialize, Deserialize)]
struct RedoHead {
    chunks: u32,
    len: u64,
    crc: u32,
}

fn redo_chunk_key(i: usize) -> Vec<u8> {
    format!("redo/{i}").into_bytes()
}

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
#[derive(Debug, Clone)]
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

/// What [`MvccStore::dump_rows`] gives: a tree's name, then its rows.
enum DumpRow<'a> {
    Tree(&'static str),
    Row(&'a [u8], &'a [u8]),
}

impl Dump {
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
        let mut last: HashMap<&[u8], bool> = HashMap::new();
        for (_, v) in self.rows("hist") {
            if let Some((key, _, tombstone)) = Record::indexed(v) {
                last.insert(key, tombstone);
            }
        }
        last.values().filter(|tombstone| !**tombstone).count()
    }

    /// The same value [`MvccStore::hash_kv`] gives at the dump's revision.
    pub fn hash_kv(&self) -> u32 {
        let lo = Revision::first_of(self.compact_revision() + 1);
        let hi = Revision::first_of(self.revision() + 1);
        let mut hasher = crc32fast::Hasher::new();
        for (k, v) in self.rows("hist") {
            if k.as_slice() >= lo.as_slice() && k.as_slice() < hi.as_slice() {
                hasher.update(k);
                hasher.update(v);
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
}

/// What one command changes, over the changes of the commands staged before it in the same
/// [`Changes`].
struct WriteSet<'a> {
    /// Keys changed by the commands staged before this one.
    base: &'a BTreeMap<Vec<u8>, Option<KeyValue>>,
    own: Staged,
}

impl<'a> WriteSet<'a> {
    fn new(main: i64, base: &'a BTreeMap<Vec<u8>, Option<KeyValue>>) -> Self {
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

    fn detach(&mut self, lease: i64, key: &[u8]) {
        self.own.lkeys.push((lease, key.to_vec(), false));
    }
}

/// What one command changed.
struct Staged {
    /// The revision its changes get.
    main: i64,
    /// Keys it changed, over the earlier commands' keys.
    overlay: BTreeMap<Vec<u8>, Option<KeyValue>>,
    /// Its changes in order: the `n`th has revision (`main`, `n`) and is the history record
    /// the commit writes (a put, or a delete's tombstone) as well as what watchers get.
    events: Vec<Event>,
    lease_puts: Vec<Lease>,
    lease_removes: Vec<i64>,
    /// Lease attachments (`true`) and detachments, in order.
    lkeys: Vec<(i64, Vec<u8>, bool)>,
    meta_puts: Vec<(Vec<u8>, Vec<u8>)>,
    compact: Option<i64>,
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
    keys: BTreeMap<Vec<u8>, Option<KeyValue>>,
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
    pub(super) fn into_commit(self) -> Commit {
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
        self.keys.extend(staged.overlay);
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
pub(super) struct Redo {
    /// The first and last revision (main, sub) of the commit's history records, and how many
    /// there are.
    first: (i64, i64),
    last: (i64, i64),
    records: u64,
    /// The writes to the other trees (leases, lease attachments, metadata).
    other: Vec<Write>,
}

impl Commit {
    /// How many writes the commit makes, and how many of them are history records.
    #[cfg(test)]
    pub(super) fn write_count(&self) -> (usize, usize) {
        (
            commit_writes(&self.batches, self.redo.other.clone()).count(),
            self.redo.records as usize,
        )
    }
}

/// The history records of staged revisions, in revision order: the `n`th change of a revision
/// has sub-revision `n`.
fn staged_records(
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

/// Every write of a commit, in the order [`Redo`] relies on: history, then the rest, each made
/// (encoded) only when the one before it is written.
fn commit_writes(batches: &[RevisionBatch], other: Vec<Write>) -> impl Iterator<Item = Write> + '_ {
    staged_records(batches)
        .map(|(rev, r)| (TREE_HIST, rev.to_bytes().to_vec(), Some(encode(&r))))
        .chain(other)
}

/// What [`MvccStore::commit`] does with [`Changes`].
pub(super) struct Commit {
    pub(super) redo: Redo,
    /// The new revision, if the changes made one.
    revision: Option<i64>,
    /// The staged revisions: their history records, then their events to publish.
    batches: Vec<RevisionBatch>,
    compact: Option<i64>,
}

/// A live key of a range, as a read or a delete finds it: its staged version, or where its
/// stored version is.
enum Live<'a> {
    Staged(KeyValue),
    Stored(&'a [u8], Version),
}

/// The live keys in `range` in key order: the staged ones (`layers`, later ones over earlier
/// ones; a staged deletion hides the key) merged with the index's.
fn live_in<'a>(
    index: &'a KeyIndex,
    range: &KeyRange,
    layers: &[&BTreeMap<Vec<u8>, Option<KeyValue>>],
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
            staged.insert(k, v.as_ref());
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
        if !take_staged(&mut out, Some(k)) {
            out.push(Live::Stored(k, version));
        }
    }
    take_staged(&mut out, None);
    out
}

/// Whether `cmd` reads only what [`Changes`] overlays (live keys), so that it can be staged
/// after other commands.
fn stageable_after_others(cmd: &Command) -> bool {
    fn reads_live_only(ops: &[Op]) -> bool {
        ops.iter().all(|op| match op {
            Op::Range(req) => req.revision == 0,
            Op::Txn(inner) => reads_live_only(&inner.success) && reads_live_only(&inner.failure),
            Op::Put(_) | Op::Delete(_) => true,
        })
    }
    match cmd {
        Command::Txn(txn) => reads_live_only(&txn.success) && reads_live_only(&txn.failure),
        _ => false,
    }
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
        };
        store.finish_redo()?;
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
            let rev = Revision::from_bytes(&k)
                .ok_or_else(|| StorageError::Corrupt("history key".into()))?;
            let (key, lease, tombstone) = Record::indexed(&v)
                .ok_or_else(|| StorageError::Corrupt("history record".into()))?;
            index.record(
                key,
                Version {
                    rev,
                    tombstone,
                    lease,
                },
            );
        }
        Ok(())
    }

    /// The version a history record holds (none for a deletion).
    fn version_at(&self, rev: Revision) -> Result<Option<KeyValue>, StorageError> {
        match self.trees.hist.get(rev.to_bytes())? {
            Some(v) => {
                let record: Record = decode(&v)?;
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
        self.hub.receiver_count()
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

    // ---- reads ----

    /// A range read at the newest or at a past revision. Returns the result and the store
    /// revision the read saw.
    pub fn range(&self, req: &RangeRequest) -> Result<(RangeResult, i64), MvccError> {
        let index = self.read_lock();
        let current = self.revision();
        let result = self.range_locked(&index, req, current, None)?;
        Ok((result, current))
    }

    fn range_locked(
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
    fn scan_current(
        &self,
        index: &KeyIndex,
        range: &KeyRange,
        layers: &[&BTreeMap<Vec<u8>, Option<KeyValue>>],
    ) -> Result<Vec<KeyValue>, StorageError> {
        if range.is_single() {
            let staged = layers.iter().rev().find_map(|l| l.get(&range.key));
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
    fn versions_of(&self, live: Vec<Live>) -> Result<Vec<KeyValue>, StorageError> {
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
        for (rev, i) in stored {
            found[i] = self.version_at(rev)?;
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
    fn scan_at(
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
    fn version_before(
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

    fn history_locked(
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
        for item in self
            .trees
            .hist
            .range(Revision::first_of(from)..Revision::first_of(to.saturating_add(1)))
        {
            let (k, v) = item?;
            let rev = Revision::from_bytes(&k)
                .ok_or_else(|| StorageError::Corrupt("history key".into()))?;
            if seen >= max_events && out.last().map_or(false, |b| b.revision != rev.main) {
                break;
            }
            let record: Record = decode(&v)?;
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
    fn lease_unlocked(&self, id: i64) -> Result<Option<Lease>, StorageError> {
        match self.trees.leases.get((id as u64).to_be_bytes())? {
            Some(v) => Ok(Some(decode(&v)?)),
            None => Ok(None),
        }
    }

    pub fn lease_keys(&self, id: i64) -> Result<Vec<Vec<u8>>, StorageError> {
        let _guard = self.read_lock();
        self.lease_keys_unlocked(id)
    }

    fn lease_keys_unlocked(&self, id: i64) -> Result<Vec<Vec<u8>>, StorageError> {
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

    /// The active alarms, in member then kind order.
    pub fn alarms(&self) -> Result<Vec<Alarm>, StorageError> {
        let _guard = self.read_lock();
        self.alarms_unlocked()
    }

    fn alarms_unlocked(&self) -> Result<Vec<Alarm>, StorageError> {
        match self.trees.meta.get(META_ALARMS)? {
            Some(v) => decode(&v),
            None => Ok(Vec::new()),
        }
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
        let mut hasher = crc32fast::Hasher::new();
        for item in self
            .trees
            .hist
            .range(Revision::first_of(compact + 1)..Revision::first_of(at + 1))
        {
            let (k, v) = item.map_err(|_| MvccError::FutureRevision)?;
            hasher.update(&k);
            hasher.update(&v);
        }
        Ok((hasher.finalize(), compact))
    }

    // ---- writes ----

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
        let no_space = || -> Result<bool, StorageError> {
            Ok(self
                .alarms_unlocked()?
                .iter()
                .any(|a| a.kind == AlarmKind::NoSpace))
        };
        let output = match cmd {
            Command::Batch(_) => {
                return Err(StorageError::Corrupt(
                    "a batch is applied command by command by the state machine".into(),
                ))
            }
            // With a NOSPACE alarm active every member refuses what would grow the database.
            _ if cmd.takes_space() && no_space()? => Err(MvccError::NoSpace),
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
                let mut alarms = self.alarms_unlocked()?;
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
    fn write_redo(&self, redo: &[u8]) -> Result<(), StorageError> {
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
    pub(super) fn commit_torn(&self, changes: Changes, kept: usize) -> Result<(), StorageError> {
        let commit = changes.into_commit();
        self.write_redo(&encode(&commit.redo))?;
        self.write(commit_writes(&commit.batches, commit.redo.other).take(kept))
    }

    /// Writes only the first `chunks` chunks of `changes`' redo, as a crash while writing it
    /// leaves them (over the last commit's redo).
    #[cfg(test)]
    pub(super) fn redo_torn(&self, changes: Changes, chunks: usize) -> Result<(), StorageError> {
        let redo = encode(&changes.into_commit().redo);
        for (i, chunk) in redo.chunks(REDO_CHUNK).take(chunks).enumerate() {
            self.trees.redo.insert(redo_chunk_key(i), chunk)?;
        }
        Ok(())
    }

    /// Makes `writes`, in order, one sled operation each.
    fn write(&self, writes: impl IntoIterator<Item = Write>) -> Result<(), StorageError> {
        let t = &self.trees;
        for (tree, key, value) in writes {
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
        Ok(())
    }

    /// Completes or undoes the last commit, whichever its writes that survived a crash allow
    /// (see [`Redo`]).
    fn finish_redo(&self) -> Result<(), StorageError> {
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
                let (k, _) = item?;
                found += 1;
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

    fn current_kv(
        &self,
        index: &KeyIndex,
        key: &[u8],
        ws: &WriteSet,
    ) -> Result<Option<KeyValue>, StorageError> {
        if let Some(v) = ws.own.overlay.get(key).or_else(|| ws.base.get(key)) {
            return Ok(v.clone());
        }
        match index.at(key, i64::MAX) {
            Some(v) => self.version_at(v.rev),
            None => Ok(None),
        }
    }

    fn apply_txn(
        &self,
        index: &KeyIndex,
        txn: &TxnRequest,
        current: i64,
        ws: &mut WriteSet,
    ) -> Result<TxnResult, MvccError> {
        let mut succeeded = true;
        for cmp in &txn.compare {
            if !self.compare(index, cmp, ws.base)? {
                succeeded = false;
                break;
            }
        }
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            responses.push(self.apply_op(index, op, current, ws)?);
        }
        Ok(TxnResult {
            succeeded,
            responses,
        })
    }

    /// # Correctness
    /// As in etcd (`compareToPath`), every compare of a transaction, those of nested
    /// transactions included, sees the state before the transaction, never its own writes.
    /// Earlier commands of the same [`Changes`] are seen through `staged`.
    fn compare(
        &self,
        index: &KeyIndex,
        cmp: &Compare,
        staged: &BTreeMap<Vec<u8>, Option<KeyValue>>,
    ) -> Result<bool, MvccError> {
        let kvs = self
            .scan_current(index, &cmp.range, &[staged])
            .map_err(|_| MvccError::FutureRevision)?;
        if kvs.is_empty() {
            if matches!(cmp.target, CompareTarget::Value(_)) {
                return Ok(false);
            }
            return Ok(compare_kv(cmp, &KeyValue::default()));
        }
        Ok(kvs.iter().all(|kv| compare_kv(cmp, kv)))
    }

    fn apply_op(
        &self,
        index: &KeyIndex,
        op: &Op,
        current: i64,
        ws: &mut WriteSet,
    ) -> Result<OpResult, MvccError> {
        let storage = |_: StorageError| MvccError::FutureRevision;
        match op {
            Op::Range(req) => {
                // Reads inside a transaction see the transaction's own earlier writes.
                let mut req = req.clone();
                if req.revision == current {
                    req.revision = 0;
                }
                Ok(OpResult::Range(self.range_locked(
                    index,
                    &req,
                    current,
                    Some(ws),
                )?))
            }
            Op::Put(req) => {
                let prev = self.current_kv(index, &req.key, ws).map_err(storage)?;
                let value = if req.ignore_value {
                    prev.as_ref()
                        .map(|p| p.value.clone())
                        .ok_or(MvccError::KeyNotFound)?
                } else {
                    req.value.clone()
                };
                let lease = if req.ignore_lease {
                    prev.as_ref()
                        .map(|p| p.lease)
                        .ok_or(MvccError::KeyNotFound)?
                } else {
                    req.lease
                };
                if lease != 0 && self.lease_unlocked(lease).map_err(storage)?.is_none() {
                    return Err(MvccError::LeaseNotFound);
                }
                let main = ws.own.main;
                let kv = KeyValue {
                    key: req.key.clone(),
                    create_revision: prev.as_ref().map_or(main, |p| p.create_revision),
                    mod_revision: main,
                    version: prev.as_ref().map_or(1, |p| p.version + 1),
                    value,
                    lease,
                };
                if let Some(p) = &prev {
                    if p.lease != 0 && p.lease != lease {
                        ws.detach(p.lease, &req.key);
                    }
                }
                if lease != 0 {
                    ws.own.lkeys.push((lease, req.key.clone(), true));
                }
                ws.own.overlay.insert(req.key.clone(), Some(kv.clone()));
                let result = PutResult {
                    prev_kv: if req.prev_kv { prev.clone() } else { None },
                };
                // The event is also the history record the commit writes.
                ws.own.events.push(Event {
                    kind: EventKind::Put,
                    kv,
                    prev_kv: prev,
                });
                Ok(OpResult::Put(result))
            }
            Op::Delete(req) => {
                let live = live_in(index, &req.range, &[ws.base, &ws.own.overlay]);
                let deleted = live.len() as i64;
                let mut prev_kvs = Vec::new();
                let mut delete = |key: Vec<u8>, lease: i64, prev: Option<KeyValue>| {
                    if lease != 0 {
                        ws.detach(lease, &key);
                    }
                    ws.own.overlay.insert(key.clone(), None);
                    if req.prev_kv {
                        prev_kvs.extend(prev.clone());
                    }
                    ws.own.events.push(Event {
                        kind: EventKind::Delete,
                        kv: KeyValue {
                            key,
                            mod_revision: ws.own.main,
                            ..Default::default()
                        },
                        prev_kv: prev,
                    });
                };
                if req.prev_kv || live.len() <= DELETED_VERSIONS_IN_EVENTS {
                    // Each deleted version moves into its event (a copy only for the response
                    // when the request asked for the previous versions).
                    for prev in self.versions_of(live).map_err(storage)? {
                        delete(prev.key.clone(), prev.lease, Some(prev));
                    }
                } else {
                    for live in live {
                        match live {
                            Live::Staged(prev) => delete(prev.key.clone(), prev.lease, Some(prev)),
                            Live::Stored(key, version) => delete(key.to_vec(), version.lease, None),
                        }
                    }
                }
                Ok(OpResult::Delete(DeleteResult { deleted, prev_kvs }))
            }
            Op::Txn(inner) => Ok(OpResult::Txn(self.apply_txn(index, inner, current, ws)?)),
        }
    }

    fn apply_grant(&self, id: i64, ttl: i64, ws: &mut WriteSet) -> Result<Output, MvccError> {
        if ttl > MAX_LEASE_TTL {
            return Err(MvccError::LeaseTtlTooLarge);
        }
        if self
            .lease_unlocked(id)
            .map_err(|_| MvccError::LeaseNotFound)?
            .is_some()
        {
            return Err(MvccError::LeaseExists);
        }
        ws.own.lease_puts.push(Lease { id, ttl });
        Ok(Output::LeaseGranted { id, ttl })
    }

    fn apply_revoke(
        &self,
        index: &KeyIndex,
        id: i64,
        ws: &mut WriteSet,
    ) -> Result<Output, MvccError> {
        if self
            .lease_unlocked(id)
            .map_err(|_| MvccError::LeaseNotFound)?
            .is_none()
        {
            return Err(MvccError::LeaseNotFound);
        }
        let keys = self
            .lease_keys_unlocked(id)
            .map_err(|_| MvccError::LeaseNotFound)?;
        for key in keys {
            let current = ws.own.main - 1;
            self.apply_op(
                index,
                &Op::Delete(DeleteRequest {
                    range: KeyRange::single(key),
                    prev_kv: false,
                }),
                current,
                ws,
            )?;
        }
        ws.own.lease_removes.push(id);
        Ok(Output::LeaseRevoked)
    }

    fn check_compact(&self, revision: i64, current: i64) -> Result<(), MvccError> {
        let compact = self.compact_revision();
        if revision <= compact {
            return Err(MvccError::Compacted {
                compact_revision: compact,
            });
        }
        if revision > current {
            return Err(MvccError::FutureRevision);
        }
        Ok(())
    }

    /// Drops history older than `revision`, keeping for every key its newest version at or
    /// before it (unless that version is a deletion). Idempotent, so a crash midway is mended
    /// by running it again, which [`MvccStore::finish_compaction`] does at the next start.
    fn compact(&self, revision: i64) -> Result<(), StorageError> {
        let t = &self.trees;
        let _gate = self
            .compaction_gate
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        let mut hist_batch = sled::Batch::default();
        for rev in index.compact(revision) {
            hist_batch.remove(&rev.to_bytes());
        }
        t.hist.apply_batch(hist_batch)?;
        t.meta.insert(META_COMPACT, &revision.to_be_bytes())?;
        self.compact_revision.store(revision, Ordering::Release);
        Ok(())
    }

    /// Carries out a compaction that was committed but not done, because the member stopped
    /// in between (etcd's scheduled compact revision).
    fn finish_compaction(&self) -> Result<(), StorageError> {
        let scheduled = read_i64(&self.trees.meta, META_COMPACT_SCHEDULED)?;
        if scheduled > self.compact_revision() {
            self.compact(scheduled)?;
        }
        Ok(())
    }

    // ---- snapshots ----

    /// Every row of every tree (in [`Trees::all`]'s order), consistent with one commit, given
    /// to `visit` as a tree's name before its rows. Commits go on meanwhile: the index lock is
    /// held only while the small trees are copied and the revision is read; the history up to
    /// that revision is then read without it, since commits only add later revisions, and
    /// `compaction_gate` keeps compactions and restores, which remove history, out until the
    /// dump is done. (Under the lock, a Raft snapshot of 200,000 keys held every write of the
    /// cluster for two seconds.)
    fn dump_rows(
        &self,
        mut visit: impl FnMut(DumpRow<'_>) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let _gate = self
            .compaction_gate
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let (revision, small) = {
            let _index = self.read_lock();
            let mut small = Vec::new();
            for (name, tree) in self.trees.all() {
                if name == "hist" {
                    continue;
                }
                let mut rows = Vec::new();
                for item in tree.iter() {
                    let (k, v) = item?;
                    rows.push((k, v));
                }
                small.push((name, rows));
            }
            (self.revision(), small)
        };
        for (name, tree) in self.trees.all() {
            visit(DumpRow::Tree(name))?;
            if name == "hist" {
                for item in tree.range(..Revision::first_of(revision.saturating_add(1))) {
                    let (k, v) = item?;
                    visit(DumpRow::Row(&k, &v))?;
                }
            } else if let Some((_, rows)) = small.iter().find(|(n, _)| *n == name) {
                for (k, v) in rows {
                    visit(DumpRow::Row(k, v))?;
                }
            }
        }
        Ok(())
    }

    /// A raw copy of every tree, consistent with one point of the applied log.
    pub fn dump(&self) -> Result<Dump, StorageError> {
        let mut trees: Vec<(String, Rows)> = Vec::new();
        self.dump_rows(|row| {
            match row {
                DumpRow::Tree(name) => trees.push((name.to_string(), Vec::new())),
                DumpRow::Row(k, v) => {
                    if let Some((_, rows)) = trees.last_mut() {
                        rows.push((k.to_vec(), v.to_vec()));
                    }
                }
            }
            Ok(())
        })?;
        Ok(Dump { trees })
    }

    /// [`MvccStore::dump`] as bincode encodes a [`Dump`], written straight from the trees,
    /// with the metadata values under `keys` as of the dump. A Raft snapshot needs only the
    /// bytes: built from a [`Dump`], a large store was in memory as rows and again as their
    /// encoding.
    pub fn dump_encoded(
        &self,
        keys: &[&[u8]],
    ) -> Result<(Vec<u8>, Vec<Option<Vec<u8>>>), StorageError> {
        fn put_len(out: &mut Vec<u8>, len: usize) {
            out.extend_from_slice(&(len as u64).to_le_bytes());
        }
        fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
            put_len(out, bytes.len());
            out.extend_from_slice(bytes);
        }
        let mut out = Vec::new();
        let mut values = vec![None; keys.len()];
        put_len(&mut out, self.trees.all().len());
        // Where the row count of the tree being written goes, its name, and its rows so far:
        // the count goes before the rows and is known once they are written.
        let mut open: Option<(usize, &str, u64)> = None;
        let close = |out: &mut Vec<u8>, open: Option<(usize, &str, u64)>| {
            if let Some((at, _, count)) = open {
                out[at..at + 8].copy_from_slice(&count.to_le_bytes());
            }
        };
        self.dump_rows(|row| {
            match row {
                DumpRow::Tree(name) => {
                    close(&mut out, open.take());
                    put_bytes(&mut out, name.as_bytes());
                    open = Some((out.len(), name, 0));
                    put_len(&mut out, 0);
                }
                DumpRow::Row(k, v) => {
                    let Some((_, name, count)) = open.as_mut() else {
                        return Err(StorageError::Corrupt("a dump row before its tree".into()));
                    };
                    if *name == "meta" {
                        if let Some(i) = keys.iter().position(|key| *key == k) {
                            values[i] = Some(v.to_vec());
                        }
                    }
                    put_bytes(&mut out, k);
                    put_bytes(&mut out, v);
                    *count += 1;
                }
            }
            Ok(())
        })?;
        close(&mut out, open);
        Ok((out, values))
    }

    /// Makes everything written so far durable. sled's own flush writes its buffers but ends
    /// in `sync_file_range`, which syncs neither the file's metadata nor the drive's cache;
    /// the fsync of sled's file and directory that follows does. Not on the commit path: the
    /// Raft log is what makes a write durable, and this runs only where the log is about to
    /// forget entries (a snapshot install, a forced new cluster) and at shutdown.
    pub fn sync(&self) -> Result<(), StorageError> {
        self.trees.meta.flush()?;
        if let Some(dir) = &self.dir {
            // Values larger than a quarter of sled's segment go to files of their own, which
            // sled writes and never syncs; each is written once, under a new name.
            let blobs = dir.join("blobs");
            if blobs.is_dir() {
                let mut synced = self.synced_blobs.lock().unwrap_or_else(|e| e.into_inner());
                let mut present = HashSet::new();
                for item in std::fs::read_dir(&blobs)? {
                    let name = item?.file_name();
                    if !synced.contains(&name) {
                        match std::fs::File::open(blobs.join(&name)) {
                            Ok(f) => f.sync_all()?,
                            // Removed by sled meanwhile.
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                            Err(e) => return Err(e.into()),
                        }
                    }
                    present.insert(name);
                }
                std::fs::File::open(&blobs)?.sync_all()?;
                *synced = present;
            }
            // The log that points at them after them.
            std::fs::File::open(dir.join("db"))?.sync_all()?;
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Replaces the whole state with a dump.
    pub fn restore(&self, dump: Dump) -> Result<(), StorageError> {
        let gate = self
            .compaction_gate
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        // The last commit's redo is about the state being replaced.
        self.trees.redo.clear()?;
        for (name, tree) in self.trees.all() {
            tree.clear()?;
            if let Some((_, rows)) = dump.trees.iter().find(|(n, _)| n == name) {
                let mut batch = sled::Batch::default();
                for (k, v) in rows {
                    batch.insert(k.as_slice(), v.as_slice());
                }
                tree.apply_batch(batch)?;
            }
        }
        self.revision.store(
            read_i64(&self.trees.meta, META_REVISION)?,
            Ordering::Release,
        );
        self.compact_revision
            .store(read_i64(&self.trees.meta, META_COMPACT)?, Ordering::Release);
        self.rebuild_index(&mut index)?;
        drop(index);
        drop(gate);
        // A dump taken between a compaction's commit and its work carries it half done.
        self.finish_compaction()?;
        let _ = self.hub.send(Arc::new(RevisionBatch {
            revision: self.revision(),
            events: Vec::new(),
            restored: true,
        }));
        Ok(())
    }

    /// Loads a backup as the first state of a new cluster: the keys, values, leases and
    /// revisions of the dump, without the old cluster's Raft and member metadata. With `bump`,
    /// the revision jumps ahead by that much and all older history is compacted, so that
    /// watchers and caches of the old cluster re-list instead of missing changes silently.
    pub fn restore_for_new_cluster(&self, dump: Dump, bump: i64) -> Result<(), StorageError> {
        self.restore(dump)?;
        let mut batch = sled::Batch::default();
        for item in self.trees.meta.iter() {
            let (k, _) = item?;
            if k.starts_with(b"raft_")
                || k.starts_with(META_MEMBER_PREFIX)
                || k.as_ref() == META_ALARMS
            {
                batch.remove(k);
            }
        }
        batch.insert(META_BASELINE_PENDING, &[][..]);
        self.trees.meta.apply_batch(batch)?;
        if bump > 0 {
            let revision = self.revision();
            self.compact(revision)?;
            let bumped = revision + bump;
            let _guard = self.index.write().unwrap_or_else(|e| e.into_inner());
            self.trees
                .meta
                .insert(META_REVISION, &bumped.to_be_bytes())?;
            self.trees
                .meta
                .insert(META_COMPACT, &bumped.to_be_bytes())?;
            self.revision.store(bumped, Ordering::Release);
            self.compact_revision.store(bumped, Ordering::Release);
        }
        Ok(())
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

fn compare_kv(cmp: &Compare, kv: &KeyValue) -> bool {
    use std::cmp::Ordering as O;
    let ord = match &cmp.target {
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::CreateRevision(v) => kv.create_revision.cmp(v),
        CompareTarget::ModRevision(v) => kv.mod_revision.cmp(v),
        CompareTarget::Lease(v) => kv.lease.cmp(v),
        CompareTarget::Value(v) => kv.value.as_slice().cmp(v.as_slice()),
    };
    match cmp.result {
        CompareResult::Equal => ord == O::Equal,
        CompareResult::NotEqual => ord != O::Equal,
        CompareResult::Greater => ord == O::Greater,
        CompareResult::Less => ord == O::Less,
    }
}

fn sort_kvs(kvs: &mut [KeyValue], order: SortOrder, target: SortTarget) {
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

/// Checks a transaction before it is proposed, as etcd does (`checkTxnRequest`, then
/// `checkIntervals` on each branch): op counts, empty keys, and keys written twice on one path.
pub fn validate_txn(txn: &TxnRequest) -> Result<(), MvccError> {
    check_requests(txn)?;
    check_intervals(&txn.success)?;
    check_intervals(&txn.failure)?;
    Ok(())
}

fn check_requests(txn: &TxnRequest) -> Result<(), MvccError> {
    if txn.compare.len() > MAX_TXN_OPS
        || txn.success.len() > MAX_TXN_OPS
        || txn.failure.len() > MAX_TXN_OPS
    {
        return Err(MvccError::TooManyOps);
    }
    if txn.compare.iter().any(|c| c.range.key.is_empty()) {
        return Err(MvccError::EmptyKey);
    }
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            Op::Put(p) => {
                if p.key.is_empty() {
                    return Err(MvccError::EmptyKey);
                }
                if p.ignore_value && !p.value.is_empty() {
                    return Err(MvccError::ValueProvided);
                }
                if p.ignore_lease && p.lease != 0 {
                    return Err(MvccError::LeaseProvided);
                }
            }
            Op::Range(r) if r.range.key.is_empty() => return Err(MvccError::EmptyKey),
            Op::Delete(d) if d.range.key.is_empty() => return Err(MvccError::EmptyKey),
            Op::Txn(t) => check_requests(t)?,
            _ => {}
        }
    }
    Ok(())
}

/// Whether a delete of `range` overlaps a put of `key`, with the intervals of etcd's
/// `checkIntervals`: a `range_end` of `"\0"` makes an empty interval there, so etcd lets a
/// from-key delete and a put share a transaction, and so do we.
fn deletes(range: &KeyRange, key: &[u8]) -> bool {
    if range.range_end.is_empty() {
        range.key.as_slice() == key
    } else {
        range.key.as_slice() <= key && key < range.range_end.as_slice()
    }
}

/// The keys put and the ranges deleted along `ops` (etcd's `checkIntervals`). A key may be
/// written once on a path: put twice, or put and deleted, is a duplicate. The two branches of a
/// nested transaction exclude each other, so they may write the same key.
fn check_intervals(ops: &[Op]) -> Result<(BTreeSet<&[u8]>, Vec<&KeyRange>), MvccError> {
    let mut dels: Vec<&KeyRange> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Delete(d) => Some(&d.range),
            _ => None,
        })
        .collect();
    let deleted = |dels: &[&KeyRange], key: &[u8]| dels.iter().any(|r| deletes(r, key));
    let mut puts: BTreeSet<&[u8]> = BTreeSet::new();
    for op in ops {
        let Op::Txn(t) = op else { continue };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for &key in &puts_then {
            if puts.contains(key) || deleted(&dels, key) {
                return Err(MvccError::DuplicateKey);
            }
            puts.insert(key);
        }
        for key in puts_else {
            if (puts.contains(key) && !puts_then.contains(key)) || deleted(&dels, key) {
                return Err(MvccError::DuplicateKey);
            }
            puts.insert(key);
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let Op::Put(p) = op else { continue };
        if puts.contains(p.key.as_slice()) || deleted(&dels, &p.key) {
            return Err(MvccError::DuplicateKey);
        }
        puts.insert(&p.key);
    }
    Ok((puts, dels))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoded_dump_is_the_dump_encoded() {
        let db = sled::Config::new().temporary(true).open().expect("db");
        let store = MvccStore::open(&db).expect("store");
        let empty = store.dump_encoded(&[META_REVISION]).expect("encoded dump");
        assert_eq!(empty.0, encode(&store.dump().expect("dump")));
        assert_eq!(empty.1, vec![None]);
        let put = |key: &str, value: &[u8], lease| {
            let cmd = Command::Txn(TxnRequest {
                success: vec![Op::Put(PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: value.to_vec(),
                    lease,
                    ..Default::default()
                })],
                ..Default::default()
            });
            store.apply(&cmd, vec![(b"raft_applied".to_vec(), vec![7; 3])])
        };
        store
            .apply(&Command::LeaseGrant { id: 3, ttl: 60 }, Vec::new())
            .expect("grant");
        for i in 0..300 {
            put(
                &format!("k{i}"),
                &vec![i as u8; i],
                if i % 3 == 0 { 3 } else { 0 },
            )
            .expect("put");
        }
        let (bytes, values) = store
            .dump_encoded(&[b"raft_applied", META_REVISION, b"absent"])
            .expect("encoded dump");
        let dump = store.dump().expect("dump");
        assert_eq!(bytes, encode(&dump));
        assert_eq!(
            values,
            vec![
                Some(vec![7; 3]),
                Some(dump.revision().to_be_bytes().to_vec()),
                None
            ]
        );
    }

    /// A dump reads the history without holding up commits: a commit made while a dump is
    /// halfway through the history finishes, and the dump holds the state before it.
    #[test]
    fn a_commit_goes_through_while_a_dump_reads_the_history() {
        let db = sled::Config::new().temporary(true).open().expect("db");
        let store = std::sync::Arc::new(MvccStore::open(&db).expect("store"));
        let put = |key: &str| {
            let cmd = Command::Txn(TxnRequest {
                success: vec![Op::Put(PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: b"v".to_vec(),
                    ..Default::default()
                })],
                ..Default::default()
            });
            store.apply(&cmd, Vec::new()).expect("put")
        };
        for i in 0..10 {
            put(&format!("k{i}"));
        }
        let before = store.dump().expect("dump");
        let (reached, wait) = std::sync::mpsc::channel::<()>();
        let (go_on, resume) = std::sync::mpsc::channel::<()>();
        let dumping = {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut paused = false;
                let mut trees: Vec<(String, Rows)> = Vec::new();
                store
                    .dump_rows(|row| {
                        match row {
                            DumpRow::Tree(name) => trees.push((name.to_string(), Vec::new())),
                            DumpRow::Row(k, v) => {
                                if !paused {
                                    paused = true;
                                    reached.send(()).expect("test waits");
                                    resume.recv().expect("test resumes");
                                }
                                let rows = &mut trees.last_mut().expect("tree").1;
                                rows.push((k.to_vec(), v.to_vec()));
                            }
                        }
                        Ok(())
                    })
                    .expect("dump");
                Dump { trees }
            })
        };
        wait.recv().expect("the dump reads the history");
        let (done, committed) = std::sync::mpsc::channel();
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                let cmd = Command::Txn(TxnRequest {
                    success: vec![Op::Put(PutRequest {
                        key: b"during".to_vec(),
                        value: b"v".to_vec(),
                        ..Default::default()
                    })],
                    ..Default::default()
                });
                store.apply(&cmd, Vec::new()).expect("put");
                done.send(()).expect("test waits");
            })
        };
        let went_through = committed.recv_timeout(std::time::Duration::from_secs(30));
        go_on.send(()).expect("dump waits");
        let dump = dumping.join().expect("dump thread");
        writer.join().expect("writer thread");
        assert!(went_through.is_ok(), "the commit waited for the dump");
        assert_eq!(encode(&dump), encode(&before));
        assert_eq!(store.revision(), before.revision() + 1);
    }

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
                    key: key.to_vec(),
                    value: value.to_vec(),
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
            key: b"k\0ey".to_vec(),
            create_revision: 3,
            mod_revision: 7,
            version: 2,
            value: vec![0, 1, 255],
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
