//! openraft's state machine over the MVCC store, and its snapshots.
//!
//! A snapshot is a raw dump of every MVCC tree (history included, so watches can still resume
//! from any retained revision after a member was caught up by snapshot). The newest snapshot is
//! kept as a file in the data dir, written to a temporary name and renamed into place. A
//! snapshot is never in memory whole: it is written as the trees are read, sent and received
//! through files ([`SnapshotData`]), and restored as it is read.
//!
//! # Correctness
//! The entries openraft hands over in one call are applied as one commit (split only
//! where a command must be committed on its own, see [`crate::mvcc::Changes`]), committed with
//! the last applied log id, the membership and, where a batch entry is split, how many of its
//! commands are in; so after a crash openraft re-applies exactly the entries (and commands)
//! that follow. sled is not synced when entries are applied (the write-ahead log made them
//! durable already; the server syncs sled once a second), so after a power cut the trees
//! may be older than the newest snapshot file, whose entries the log may have purged: at open,
//! a state machine behind the snapshot on disk is restored from it first, and openraft then
//! re-applies the log from there. Installing a snapshot first writes the snapshot file and a
//! marker; the marker is removed once the trees hold the snapshot and are synced, and a member
//! that finds the marker at start-up installs again.

use std::io::{BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, RaftSnapshotBuilder, SnapshotMeta};

use super::snapshot_data::{self, SnapshotData};
use super::wal::Wal;
use super::{
    sm_read, sm_write, snapshot_read, snapshot_write, Entry, LogId, NodeId, RaftStorageError,
    SnapshotMetadata, StoredMembership, TypeConfig,
};
use crate::error::StorageError;
use crate::failpoints::{
    crash_point, APPLY_AFTER, APPLY_BEFORE, SNAPSHOT_BUILD_AFTER_SAVE, SNAPSHOT_BUILD_BEFORE_SAVE,
    SNAPSHOT_INSTALL_AFTER, SNAPSHOT_INSTALL_BEFORE,
};
use crate::mvcc::store::Dump;
use crate::mvcc::{Applied, Changes, Command, MvccStore, Output};

/// The last applied log id (what a backup in etcd's format carries as its consistent index).
pub(crate) const META_APPLIED: &[u8] = b"raft_applied";
/// The membership (the members a backup in etcd's format lists).
pub(crate) const META_MEMBERSHIP: &[u8] = b"raft_membership";
/// How many commands of a batch entry are applied: (its log id, count). Committed with each
/// command, so a crash in the middle of a batch resumes after the last applied command.
pub(super) const META_BATCH_PROGRESS: &[u8] = b"raft_batch_progress";

const SNAPSHOT_FILE: &str = "snapshot.bin";
/// What an install writes the snapshot file under before it renames it into place (not the
/// build's name: a build may run meanwhile).
const INSTALL_TMP: &str = "snapshot.bin.install.tmp";
const INSTALL_MARKER: &str = "snapshot.installing";
/// How long applying entries may take before a member warns (etcd's expected duration).
const SLOW_APPLY: std::time::Duration = std::time::Duration::from_millis(100);

#[derive(Clone)]
pub struct StateMachine {
    mvcc: Arc<MvccStore>,
    dir: PathBuf,
    counter: Arc<AtomicU64>,
    /// Snapshots installed from a leader since start.
    pub installs: Arc<AtomicU64>,
    /// Snapshots begun to be received since start (each gets a file of its own).
    receiving: Arc<AtomicU64>,
    /// The last log index that durable state covers (the snapshot file on disk, raised once a
    /// new one is durable, or the trees as synced at open). The log store waits for it before it persists a purge (see
    /// [`StateMachine::snapshot_watermark`]).
    durable: Arc<tokio::sync::watch::Sender<u64>>,
    /// The member's log: an entry is applied only once it has synced it (see
    /// [`StateMachine::applying_durable`]).
    log: Option<Arc<Wal>>,
    /// This member, when entries another member led are applied after the answers that are
    /// ready (see [`StateMachine::answering_first`]).
    answering_first: Option<NodeId>,
}

impl StateMachine {
    /// Applies an entry only once `log` has it on stable storage. A leader reports its own
    /// entries to openraft before their sync (`LogStore::early_for_leader`), so openraft may
    /// hand over an entry that is committed in its count but not yet durable here; applying it
    /// then would answer a client, or show a read or a watch a write that a power cut could
    /// still take from this member.
    pub fn applying_durable(self, log: Arc<Wal>) -> Self {
        Self {
            log: Some(log),
            ..self
        }
    }

    /// Applies entries that another member led (a follower's) only after the tasks ready to
    /// run have run. On a follower, openraft hands over the entries that an AppendEntries
    /// commits together with that AppendEntries' answer, once its own entries are synced; the
    /// apply (a read of the log and a commit to the trees, about 60 µs measured here) would
    /// otherwise run first and hold the answer the leader waits for to commit the next write.
    /// A leader's own entries are applied at once: its clients wait for them.
    pub fn answering_first(self, me: NodeId) -> Self {
        Self {
            answering_first: Some(me),
            ..self
        }
    }

    /// Opens the state machine, finishing a snapshot installation a crash interrupted.
    pub fn open(mvcc: Arc<MvccStore>, dir: &Path) -> Result<Self, StorageError> {
        let sm = Self {
            mvcc,
            dir: dir.to_path_buf(),
            counter: Arc::new(AtomicU64::new(0)),
            installs: Arc::new(AtomicU64::new(0)),
            receiving: Arc::new(AtomicU64::new(0)),
            durable: Arc::new(tokio::sync::watch::channel(0).0),
            log: None,
            answering_first: None,
        };
        // An install a crash interrupted, or trees that lost their last changes (they are
        // synced lazily) while the snapshot on disk, which the log may be purged behind, did
        // not: both start from the snapshot, and openraft applies the log again from there.
        let interrupted = dir.join(INSTALL_MARKER).exists();
        // What a crash left half written: snapshots being received or copied into place.
        snapshot_data::remove_received(dir)?;
        snapshot_data::remove_if_present(&dir.join(INSTALL_TMP))?;
        let meta = sm.read_snapshot_meta()?;
        let applied = sm.applied()?;
        let behind = meta.as_ref().is_some_and(|m| m.last_log_id > applied);
        if behind {
            tracing::warn!(
                applied = %applied.map_or("none".into(), |l| l.to_string()),
                snapshot = %meta.as_ref().and_then(|m| m.last_log_id).map_or("none".into(), |l| l.to_string()),
                "the state machine is behind the snapshot on disk (its last changes were not \
                 yet synced when the member stopped): restoring it from the snapshot, then \
                 applying the log again"
            );
        }
        if interrupted || behind {
            if let Some((_, start)) = sm.read_snapshot_head()? {
                sm.restore_from_snapshot_file(start, true)?;
            }
        }
        // What the trees hold now is made durable, so the log may be purged up to it (openraft
        // purges a log that ends before the applied index at start-up), and the marker may go.
        sm.mvcc.sync()?;
        if interrupted {
            std::fs::remove_file(dir.join(INSTALL_MARKER))?;
        }
        if let Some(meta) = &meta {
            sm.snapshot_durable(meta);
        }
        if let Some(applied) = sm.applied()? {
            sm.durable.send_modify(|d| *d = (*d).max(applied.index));
        }
        Ok(sm)
    }

    /// The snapshot file's metadata only: it comes first in the file, so the data (which may be
    /// large) is not read.
    fn read_snapshot_meta(&self) -> Result<Option<SnapshotMetadata>, StorageError> {
        Ok(self.read_snapshot_head()?.map(|(meta, _)| meta))
    }

    /// The snapshot file's metadata and where its data starts. The file is bincode's encoding
    /// of the metadata, the data's length (u64) and the data, which runs to the file's end.
    fn read_snapshot_head(&self) -> Result<Option<(SnapshotMetadata, u64)>, StorageError> {
        let file = match std::fs::File::open(self.dir.join(SNAPSHOT_FILE)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let size = file.metadata()?.len();
        let mut head = BufReader::new(file);
        let (meta, len): (SnapshotMetadata, u64) = bincode::deserialize_from(&mut head)?;
        let start = data_start(&meta)?;
        if start.checked_add(len) != Some(size) {
            return Err(StorageError::Corrupt(format!(
                "the snapshot file holds {size} bytes, not the {start} of its header and the \
                 {len} of data it names"
            )));
        }
        Ok(Some((meta, start)))
    }

    /// The last log index the snapshot on disk covers. openraft purges the log up to a
    /// snapshot it is installing at the same time as it hands the snapshot to the state
    /// machine; a purge persisted before the snapshot is would leave, after a crash, a log that
    /// starts beyond everything the member has (a data dir that cannot start). The log store
    /// waits on this before it persists a purge.
    pub fn snapshot_watermark(&self) -> tokio::sync::watch::Receiver<u64> {
        self.durable.subscribe()
    }

    fn snapshot_durable(&self, meta: &SnapshotMetadata) {
        let index = meta.last_log_id.map_or(0, |l| l.index);
        self.durable.send_modify(|d| *d = (*d).max(index));
    }

    pub fn mvcc(&self) -> &Arc<MvccStore> {
        &self.mvcc
    }

    /// Forgets the Raft state kept with the data: the applied log id, the membership and the
    /// snapshot file. The keys, history and leases stay.
    pub fn forget_raft_state(&self) -> Result<(), StorageError> {
        self.durable.send_replace(0);
        self.mvcc
            .remove_meta(&[META_APPLIED, META_MEMBERSHIP, META_BATCH_PROGRESS])?;
        snapshot_data::remove_if_present(&self.dir.join(SNAPSHOT_FILE)).map_err(Into::into)
    }

    /// Applies entries in order (warning, as etcd does, when that takes longer than
    /// [`SLOW_APPLY`]), all in one commit with the last one's applied log
    /// id (a command that must be committed on its own splits them; see
    /// [`crate::mvcc::Changes`]).
    fn apply_entries(&self, entries: Vec<Entry>) -> Result<Vec<Applied>, StorageError> {
        let started = std::time::Instant::now();
        let first = entries.first().map(|e| e.log_id.index);
        let last = entries.last().map(|e| e.log_id.index);
        let out = self.apply_in_one_commit(entries)?;
        let took = started.elapsed();
        // etcd's warning, with its threshold (100 ms) and words.
        if took > SLOW_APPLY {
            tracing::warn!(
                took = ?took,
                expected_duration = ?SLOW_APPLY,
                first_index = first,
                last_index = last,
                "apply request took too long"
            );
        }
        Ok(out)
    }

    fn apply_in_one_commit(&self, entries: Vec<Entry>) -> Result<Vec<Applied>, StorageError> {
        let mut changes = self.mvcc.changes();
        let mut out = Vec::with_capacity(entries.len());
        crash_point(APPLY_BEFORE);
        for entry in entries {
            let applied = match &entry.payload {
                EntryPayload::Normal(Command::Batch(cmds)) => {
                    // A crash between two commits of this entry's commands left how many of
                    // them are in the store.
                    let done = match self.mvcc.meta(META_BATCH_PROGRESS)? {
                        Some(v) => match bincode::deserialize::<(LogId, usize)>(&v)? {
                            (id, n) if id == entry.log_id => n,
                            _ => 0,
                        },
                        None => 0,
                    };
                    let mut results = Vec::with_capacity(cmds.len());
                    for (i, cmd) in cmds.iter().enumerate().skip(done) {
                        results.push(self.stage(&mut changes, cmd, Some((entry.log_id, i)))?);
                    }
                    Applied {
                        revision: changes.revision(),
                        output: Ok(Output::Batch(results)),
                    }
                }
                EntryPayload::Normal(cmd) => self.stage(&mut changes, cmd, None)?,
                EntryPayload::Membership(m) => {
                    let stored = StoredMembership::new(Some(entry.log_id), m.clone());
                    changes.set_meta(META_MEMBERSHIP, bincode::serialize(&stored)?);
                    Applied {
                        revision: changes.revision(),
                        output: Ok(Output::None),
                    }
                }
                EntryPayload::Blank => Applied {
                    revision: changes.revision(),
                    output: Ok(Output::None),
                },
            };
            changes.set_meta(META_APPLIED, bincode::serialize(&Some(entry.log_id))?);
            out.push(applied);
        }
        self.mvcc.commit(changes)?;
        crash_point(APPLY_AFTER);
        Ok(out)
    }

    /// Stages `cmd` (command `batch.1` of the batch entry `batch.0`, if it is one); a command
    /// that needs a commit of its own gets one, after what was staged before it, which is
    /// committed with the batch's progress.
    fn stage(
        &self,
        changes: &mut Changes,
        cmd: &Command,
        batch: Option<(LogId, usize)>,
    ) -> Result<Applied, StorageError> {
        if let Some(applied) = self.mvcc.stage(changes, cmd)? {
            return Ok(applied);
        }
        let mut staged = std::mem::replace(changes, self.mvcc.changes());
        if let Some(progress) = batch {
            staged.set_meta(META_BATCH_PROGRESS, bincode::serialize(&progress)?);
        }
        self.mvcc.commit(staged)?;
        *changes = self.mvcc.changes();
        self.mvcc
            .stage(changes, cmd)?
            .ok_or_else(|| StorageError::Corrupt("empty changes refused a command".into()))
    }

    /// The last applied log id as committed in the store.
    pub fn applied(&self) -> Result<Option<LogId>, StorageError> {
        match self.mvcc.meta(META_APPLIED)? {
            Some(v) => Ok(bincode::deserialize(&v)?),
            None => Ok(None),
        }
    }

    fn membership(&self) -> Result<StoredMembership, StorageError> {
        match self.mvcc.meta(META_MEMBERSHIP)? {
            Some(v) => Ok(bincode::deserialize(&v)?),
            None => Ok(StoredMembership::default()),
        }
    }

    /// Replaces the trees with the snapshot file's data (which starts at `start`), read as it
    /// is restored; with `check`, read through once first, so that a damaged file changes
    /// nothing.
    fn restore_from_snapshot_file(&self, start: u64, check: bool) -> Result<(), StorageError> {
        let mut file = std::fs::File::open(self.dir.join(SNAPSHOT_FILE))?;
        file.seek(SeekFrom::Start(start))?;
        if check {
            check_in_place(&mut file)?;
        }
        self.mvcc.restore_from(&mut BufReader::new(file))
    }

    /// The current snapshot's data, for openraft to send.
    fn snapshot_data(&self, start: u64) -> Result<SnapshotData, StorageError> {
        Ok(SnapshotData::open(&self.dir.join(SNAPSHOT_FILE), start)?)
    }

    /// Writes a snapshot of the store to the snapshot file as the store is read (the metadata,
    /// the data's length, the data), and returns its metadata: the applied id and membership
    /// as of the dump, not as of now.
    fn write_snapshot_from_store(&self) -> Result<SnapshotMetadata, StorageError> {
        let tmp = self.dir.join(format!("{SNAPSHOT_FILE}.tmp"));
        let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        let mut made = None;
        self.mvcc
            .write_dump(&mut out, &[META_APPLIED, META_MEMBERSHIP], |out, values| {
                let applied: Option<LogId> = match &values[0] {
                    Some(v) => bincode::deserialize(v)?,
                    None => None,
                };
                let membership: StoredMembership = match &values[1] {
                    Some(v) => bincode::deserialize(v)?,
                    None => StoredMembership::default(),
                };
                let n = self.counter.fetch_add(1, Ordering::Relaxed);
                let snapshot_id = match applied {
                    Some(id) => format!("{}-{}-{n}", id.leader_id.term, id.index),
                    None => format!("0-0-{n}"),
                };
                let meta = SnapshotMeta {
                    last_log_id: applied,
                    last_membership: membership,
                    snapshot_id,
                };
                out.write_all(&bincode::serialize(&meta)?)?;
                // The data's length, known once it is written.
                let len_at = out.stream_position()?;
                out.write_all(&0u64.to_le_bytes())?;
                made = Some((meta, len_at));
                Ok(())
            })?;
        let (meta, len_at) =
            made.ok_or_else(|| StorageError::Corrupt("the dump wrote no header".into()))?;
        let end = out.stream_position()?;
        out.seek(SeekFrom::Start(len_at))?;
        out.write_all(&(end - len_at - 8).to_le_bytes())?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        crash_point(SNAPSHOT_BUILD_BEFORE_SAVE);
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, self.dir.join(SNAPSHOT_FILE))?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        crash_point(SNAPSHOT_BUILD_AFTER_SAVE);
        self.snapshot_durable(&meta);
        Ok(meta)
    }

    /// Moves a received file into place as the snapshot file when it is one already, its data
    /// (from `base`) after the head that `meta` and the data's length make: a snapshot stream
    /// writes that head before the data (`snapshot_stream`), so that the data need not be
    /// copied. Returns where the data starts, or None when the file is not laid out so.
    fn adopt_received(
        &self,
        meta: &SnapshotMetadata,
        path: &Path,
        data: &mut std::fs::File,
        base: u64,
    ) -> Result<Option<u64>, StorageError> {
        use std::os::unix::fs::FileExt;
        let len = data.metadata()?.len().saturating_sub(base);
        let head = snapshot_file_head(meta, len)?;
        if base == 0 || head.len() as u64 != base {
            return Ok(None);
        }
        let mut found = vec![0u8; head.len()];
        data.read_exact_at(&mut found, 0)?;
        if found != head {
            return Ok(None);
        }
        data.sync_all()?;
        std::fs::rename(path, self.dir.join(SNAPSHOT_FILE))?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        self.snapshot_durable(meta);
        Ok(Some(base))
    }

    /// Makes the snapshot file `meta` and the data `data` holds from where it stands to its
    /// end (copied file to file), durably; returns where the data starts in it.
    fn write_snapshot_file(
        &self,
        meta: &SnapshotMetadata,
        data: &mut std::fs::File,
    ) -> Result<u64, StorageError> {
        let from = data.stream_position()?;
        let len = data.metadata()?.len().saturating_sub(from);
        let head = snapshot_file_head(meta, len)?;
        crate::durable_file::replace_with(
            &self.dir.join(SNAPSHOT_FILE),
            &self.dir.join(INSTALL_TMP),
            |out| {
                out.write_all(&head)?;
                let copied = std::io::copy(data, out)?;
                if copied != len {
                    return Err(std::io::Error::other(format!(
                        "a snapshot's data changed while it was copied ({copied} of {len} bytes)"
                    )));
                }
                Ok(())
            },
        )?;
        self.snapshot_durable(meta);
        Ok(head.len() as u64)
    }
}

/// Reads the dump in `data` from where it stands to its end ([`Dump::check`]), and comes back.
fn check_in_place(data: &mut std::fs::File) -> Result<(), StorageError> {
    let from = data.stream_position()?;
    Dump::check(&mut BufReader::new(&mut *data))?;
    data.seek(SeekFrom::Start(from))?;
    Ok(())
}

/// What a snapshot file holds before its data: `meta` and the data's length, `len`.
pub(super) fn snapshot_file_head(
    meta: &SnapshotMetadata,
    len: u64,
) -> Result<Vec<u8>, bincode::Error> {
    bincode::serialize(&(meta, len))
}

/// Where a snapshot file with `meta` has its data: after the metadata and the data's length.
fn data_start(meta: &SnapshotMetadata) -> Result<u64, StorageError> {
    Ok(bincode::serialized_size(meta)? + 8)
}

/// Most commands applied on the runtime's thread at once (see [`StateMachine::apply`]).
const SMALL_APPLY: usize = 64;

fn is_small(entries: &[Entry]) -> bool {
    let mut commands = 0;
    for entry in entries {
        match &entry.payload {
            EntryPayload::Normal(cmd) => {
                if !cmd.is_small() {
                    return false;
                }
                commands += match cmd {
                    Command::Batch(cmds) => cmds.len(),
                    _ => 1,
                };
            }
            EntryPayload::Membership(_) | EntryPayload::Blank => commands += 1,
        }
    }
    commands <= SMALL_APPLY
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, RaftStorageError> {
        let sm = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A thread of its own, at a lower CPU priority: the dump reads the whole store while
        // entries are applied, and on a busy member it took the cores an apply needed (an
        // `etcdctl check perf` delete that overlapped a snapshot build took 8 s instead of 3 s
        // and timed out). The thread ends with the build, so the priority never has to be
        // raised again (which needs a privilege).
        std::thread::Builder::new()
            .name("snapshot-build".into())
            .spawn(move || {
                lower_this_threads_priority();
                let _ = tx.send(sm.write_snapshot_from_store());
            })
            .map_err(snapshot_write)?;
        let meta = rx
            .await
            .map_err(|e| snapshot_write(std::io::Error::other(e.to_string())))?
            .map_err(snapshot_write)?;
        // openraft 0.9 keeps only the metadata of a snapshot it asked to be built
        // (`core/sm/worker.rs`: `Response::BuildSnapshot(snap.meta)`), and reads the data
        // through `get_current_snapshot` (the file) when it sends one. What is handed back
        // here is a handle on the file, not its data.
        let data = self
            .snapshot_data(data_start(&meta).map_err(snapshot_read)?)
            .map_err(snapshot_read)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(data),
        })
    }
}

/// The nice value of a snapshot build's thread (the process's own is usually 0).
const SNAPSHOT_BUILD_NICE: libc::c_int = 10;

/// Raises the calling thread's nice value to [`SNAPSHOT_BUILD_NICE`] unless it is higher
/// already (Linux gives each thread its own). A failure leaves the priority as it was: the
/// build only runs faster than meant.
fn lower_this_threads_priority() {
    // SAFETY: gettid, getpriority and setpriority take and return plain integers and touch no
    // memory.
    let failed = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        libc::setpriority(libc::PRIO_PROCESS, tid, now.max(SNAPSHOT_BUILD_NICE)) != 0
    };
    if failed {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "could not lower the snapshot build's priority"
        );
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership), RaftStorageError> {
        let applied = self.applied().map_err(sm_read)?;
        let membership = self.membership().map_err(sm_read)?;
        Ok((applied, membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, RaftStorageError>
    where
        I: IntoIterator<Item = Entry> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        // Applying blocks the thread. A few small commands take tens of microseconds and are
        // applied here; anything larger goes to tokio's blocking pool (one more thread hop),
        // so that a large command (a DeleteRange of a hundred thousand keys) holds no runtime
        // worker, which the peer service and openraft's own tasks need to answer heartbeats
        // and votes meanwhile.
        let entries: Vec<Entry> = entries.into_iter().collect();
        if let (Some(me), Some(last)) = (self.answering_first, entries.last()) {
            if last.log_id.leader_id.node_id != me {
                tokio::task::yield_now().await;
            }
        }
        if let (Some(log), Some(last)) = (&self.log, entries.last()) {
            log.durable(last.log_id.index).await;
        }
        if is_small(&entries) {
            return self.apply_entries(entries).map_err(sm_write);
        }
        let sm = self.clone();
        tokio::task::spawn_blocking(move || sm.apply_entries(entries))
            .await
            .map_err(|e| sm_write(std::io::Error::other(e.to_string())))?
            .map_err(sm_write)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, RaftStorageError> {
        tracing::info!("receiving a snapshot from the leader");
        let n = self.receiving.fetch_add(1, Ordering::Relaxed);
        let data = SnapshotData::create(&snapshot_data::receiving_path(&self.dir, n))
            .map_err(snapshot_write)?;
        Ok(Box::new(data))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetadata,
        snapshot: Box<SnapshotData>,
    ) -> Result<(), RaftStorageError> {
        let sm = self.clone();
        let meta = meta.clone();
        let received = snapshot_data::is_received(&self.dir, snapshot.path())
            .then(|| (snapshot.path().to_path_buf(), snapshot.base()));
        let mut data = snapshot.into_std().await.map_err(snapshot_write)?;
        tokio::task::spawn_blocking(move || -> Result<(), StorageError> {
            let began = Instant::now();
            // Read through once before anything changes: a damaged snapshot is refused whole.
            check_in_place(&mut data)?;
            let checked = began.elapsed();
            crash_point(SNAPSHOT_INSTALL_BEFORE);
            let adopted = match &received {
                Some((path, base)) => sm.adopt_received(&meta, path, &mut data, *base)?,
                None => None,
            };
            let start = match adopted {
                Some(start) => start,
                None => sm.write_snapshot_file(&meta, &mut data)?,
            };
            drop(data);
            if let Some((path, _)) = &received {
                snapshot_data::remove_if_present(path)?;
            }
            std::fs::File::create(sm.dir.join(INSTALL_MARKER))?.sync_all()?;
            std::fs::File::open(&sm.dir)?.sync_all()?;
            let saved = began.elapsed();
            // Checked above, as received.
            sm.restore_from_snapshot_file(start, false)?;
            let restored = began.elapsed();
            // The marker goes only once the restored trees are on disk: a crash before that
            // restores again at the next start.
            sm.mvcc.sync()?;
            std::fs::remove_file(sm.dir.join(INSTALL_MARKER))?;
            crash_point(SNAPSHOT_INSTALL_AFTER);
            sm.installs.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                snapshot = %meta.snapshot_id,
                check_ms = checked.as_millis() as u64,
                save_ms = (saved - checked).as_millis() as u64,
                restore_ms = (restored - saved).as_millis() as u64,
                sync_ms = (began.elapsed() - restored).as_millis() as u64,
                "installed the leader's snapshot"
            );
            Ok(())
        })
        .await
        .map_err(|e| snapshot_write(std::io::Error::other(e.to_string())))?
        .map_err(snapshot_write)
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, RaftStorageError> {
        let Some((meta, start)) = self.read_snapshot_head().map_err(snapshot_read)? else {
            return Ok(None);
        };
        let data = self.snapshot_data(start).map_err(snapshot_read)?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(data),
        }))
    }
}

#[cfg(test)]
mod priority_tests {
    use super::*;

    /// The snapshot build's thread runs at a lower priority, and only that thread.
    #[test]
    fn a_snapshot_build_thread_runs_at_a_lower_priority() {
        // SAFETY: as in `lower_this_threads_priority`.
        let nice = || unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::getpriority(libc::PRIO_PROCESS, tid)
        };
        let before = nice();
        let inside = std::thread::spawn(move || {
            lower_this_threads_priority();
            nice()
        })
        .join()
        .expect("thread");
        assert_eq!(inside, before.max(SNAPSHOT_BUILD_NICE));
        assert_eq!(nice(), before, "the calling thread's priority changed");
    }
}
