//! openraft's log storage over the write-ahead log ([`super::wal`]).
//!
//! # Correctness
//! `append` hands openraft's callback to the log's group commit, which calls it only after an
//! fdatasync that covers the entries; `save_vote`, `truncate` and `purge` return once their
//! record is synced. The state machine (sled) is not synced on this path at all: it is made
//! durable lazily, and at start-up openraft applies again the entries after the state machine's
//! durable applied index, which the log still has because a purge waits until a snapshot
//! covering it is on disk.
//!
//! One exception, for speed: a leader's own new entries (of its term, no membership change)
//! are reported written as soon as they are written, before their fdatasync. openraft 0.9 waits
//! for that report before it replicates them, so the leader's sync and its followers' round trip
//! would otherwise run one after the other; now they overlap. openraft may then count the
//! leader in a quorum before its sync, so "committed" stops meaning "on stable storage on a
//! quorum" inside this member, and two rules put it back where anyone can see it:
//! - the state machine applies an entry only once the local log has synced it
//!   (`StateMachine::applying_durable`), so no client is answered, and no read or watch sees a
//!   write, before the leader's copy is durable (and a follower's, which answered only after
//!   its own sync);
//! - a leader tells followers a commit index only up to what its log has synced
//!   (`PeerNetwork::holding_commit_to`), so a follower never applies an entry that a
//!   quorum does not hold durably.
//!
//! Membership entries keep the synced path, because openraft acts on a committed membership
//! itself (it moves from a joint configuration to the new one).

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::histogram::Histogram;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};

use super::wal::{Waiter, Wal, WalError, WalStats};
use super::{
    logs_delete, logs_read, logs_write, vote_write, Entry, LogId, NodeId, RaftStorageError,
    TypeConfig, Vote,
};

/// Where the log lives inside a data dir.
pub const WAL_DIR: &str = "wal";

#[derive(Clone)]
pub struct LogStore {
    wal: Arc<Wal>,
    /// The committed index as openraft last reported it, for status and metrics.
    committed: Arc<AtomicU64>,
    /// The state machine's [`super::state_machine::StateMachine::snapshot_watermark`]: a purge
    /// is persisted only once a snapshot covering it is on disk.
    snapshot_on_disk: Option<tokio::sync::watch::Receiver<u64>>,
    /// This member's id: its own entries, as leader, are reported before their sync.
    own_id: Option<NodeId>,
}

impl LogStore {
    /// Opens the log in `DATA_DIR/wal`. A data dir of an older rkube keeps its log in sled's
    /// `raft_log` and `raft_meta` trees: that log is moved into the new one first.
    pub fn open(data_dir: &Path, db: &sled::Db, no_fsync: bool) -> Result<Self, WalError> {
        let dir = data_dir.join(WAL_DIR);
        let fresh = !dir.exists();
        let wal = Wal::open(&dir, no_fsync)?;
        if fresh {
            import_sled_log(&wal, db)?;
        }
        Ok(Self {
            wal,
            committed: Arc::new(AtomicU64::new(0)),
            snapshot_on_disk: None,
            own_id: None,
        })
    }

    /// Reports the entries this member appends as leader (`id`) before their sync (see the
    /// module's notes: the state machine and the peer network must hold back what is not
    /// synced yet).
    pub fn early_for_leader(self, id: NodeId) -> Self {
        Self {
            own_id: Some(id),
            ..self
        }
    }

    /// Whether `entries` are this member's own, appended as the leader of its current vote,
    /// with no membership change among them.
    fn own_new_entries(&self, entries: &[Entry]) -> bool {
        let (Some(id), Some(vote)) = (self.own_id, self.wal.vote()) else {
            return false;
        };
        // Only the leader of a term makes entries of that term; a member whose vote names
        // another member is following and syncs before it answers.
        vote.leader_id.node_id == id
            && entries.iter().all(|e| {
                e.log_id.leader_id == vote.leader_id
                    && !matches!(e.payload, openraft::EntryPayload::Membership(_))
            })
    }

    /// Purges wait until the state machine's snapshot on disk covers them.
    pub fn purging_behind(mut self, snapshot_on_disk: tokio::sync::watch::Receiver<u64>) -> Self {
        self.snapshot_on_disk = Some(snapshot_on_disk);
        self
    }

    /// Reports the committed index into `committed` and fsync times into `fsync_seconds`.
    pub fn observed(self, committed: Arc<AtomicU64>, fsync_seconds: Histogram) -> Self {
        self.wal.observe_fsyncs(fsync_seconds);
        Self { committed, ..self }
    }

    /// The write-ahead log itself, for what the member reads of it beside openraft (the last
    /// log id a PreVote question carries).
    pub fn wal(&self) -> Arc<Wal> {
        self.wal.clone()
    }

    /// Counts of the log's fdatasyncs and appended batches.
    pub fn stats(&self) -> Arc<WalStats> {
        self.wal.stats.clone()
    }

    /// Number of entries currently kept.
    pub fn len(&self) -> usize {
        self.wal.len()
    }

    pub fn is_empty(&self) -> bool {
        self.wal.is_empty()
    }

    /// Forgets the whole log, the vote and the commit index, durably (a forced new cluster
    /// starts its Raft state afresh over the applied data).
    pub fn wipe(&self) -> Result<(), WalError> {
        self.wal.wipe()
    }
}

/// Moves a log kept in sled (rkube before the write-ahead log) into `wal`, then drops the
/// trees. The new log is synced before the old one goes.
fn import_sled_log(wal: &Wal, db: &sled::Db) -> Result<(), WalError> {
    let names = db.tree_names();
    if !names
        .iter()
        .any(|n| n.as_ref() == b"raft_log" || n.as_ref() == b"raft_meta")
    {
        return Ok(());
    }
    let corrupt = |e: String| WalError::Corrupt {
        path: Path::new("db").to_path_buf(),
        offset: 0,
        reason: format!("the old log in sled: {e}"),
    };
    let log = db
        .open_tree("raft_log")
        .map_err(|e| corrupt(e.to_string()))?;
    let meta = db
        .open_tree("raft_meta")
        .map_err(|e| corrupt(e.to_string()))?;
    let get = |key: &[u8]| -> Result<Option<sled::IVec>, WalError> {
        meta.get(key).map_err(|e| corrupt(e.to_string()))
    };
    let vote: Option<Vote> = match get(b"vote")? {
        Some(v) => Some(bincode::deserialize(&v)?),
        None => None,
    };
    let committed: Option<LogId> = match get(b"committed")? {
        Some(v) => bincode::deserialize::<Option<LogId>>(&v)?,
        None => None,
    };
    let purged: Option<LogId> = match get(b"last_purged")? {
        Some(v) => Some(bincode::deserialize(&v)?),
        None => None,
    };
    let mut entries = Vec::new();
    for item in log.iter() {
        let (_, v) = item.map_err(|e| corrupt(e.to_string()))?;
        entries.push(bincode::deserialize::<Entry>(&v)?);
    }
    if vote.is_none() && entries.is_empty() && purged.is_none() {
        return Ok(());
    }
    tracing::info!(
        entries = entries.len(),
        "moving the Raft log from sled into the write-ahead log"
    );
    wal.import(vote, committed, purged, entries)?;
    for name in ["raft_log", "raft_meta"] {
        db.drop_tree(name).map_err(|e| corrupt(e.to_string()))?;
    }
    Ok(())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, RaftStorageError> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        };
        self.wal.read(start, end).map_err(logs_read)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftStorageError> {
        let (last_purged_log_id, last_log_id) = self.wal.state();
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), RaftStorageError> {
        self.wal.save_vote(vote).await.map_err(vote_write)
    }

    /// The saved vote, never as committed: openraft 0.9 makes a member whose saved vote is a
    /// committed vote for itself leader again at once, in the same term, with the commit index
    /// it read back — which may be older than what it had acknowledged before a power cut (the
    /// commit index is written unsynced), so its read index would be stale. An uncommitted vote
    /// makes it win a new election first, and a new leader commits an entry of its own term
    /// before it serves a read index. (The power-loss campaign caught stale reads without this.)
    async fn read_vote(&mut self) -> Result<Option<Vote>, RaftStorageError> {
        Ok(self.wal.vote().map(|mut v| {
            v.committed = false;
            v
        }))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), RaftStorageError> {
        self.committed
            .store(committed.map_or(0, |l| l.index), Ordering::Relaxed);
        self.wal.set_committed(committed).map_err(logs_write)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, RaftStorageError> {
        let committed = self.wal.committed();
        self.committed
            .store(committed.map_or(0, |l| l.index), Ordering::Relaxed);
        Ok(committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), RaftStorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        if !self.own_new_entries(&entries) {
            return self
                .wal
                .append(entries, Waiter::Log(callback))
                .map_err(logs_write);
        }
        match self.wal.append(entries, Waiter::Nobody) {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(logs_write(e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        self.wal.truncate(log_id.index).await.map_err(logs_delete)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        if let Some(on_disk) = &mut self.snapshot_on_disk {
            // openraft purges up to a snapshot it is still installing; the install runs on the
            // state machine's task and raises the watermark once its file is durable.
            loop {
                let wait = on_disk.wait_for(|i| *i >= log_id.index);
                let waited = tokio::time::timeout(std::time::Duration::from_secs(10), wait)
                    .await
                    .map(|r| r.is_ok());
                match waited {
                    Ok(true) => break,
                    // The state machine is gone (shutting down): purge nothing.
                    Ok(false) => return Ok(()),
                    Err(_) => tracing::warn!(
                        upto = log_id.index,
                        on_disk = *on_disk.borrow(),
                        "log purge waiting for a snapshot covering it to be on disk"
                    ),
                }
            }
        }
        self.wal.purge(log_id).await.map_err(logs_delete)
    }
}
