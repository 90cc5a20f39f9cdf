//! Bringing a cluster back from quorum loss (etcd's `--force-new-cluster`), and the baseline
//! snapshot that any data not built by this cluster's own log needs.
//!
//! # Correctness
//! A forced new cluster keeps everything the surviving member holds: entries in its log that it
//! had not applied yet are applied first (some may have been committed by the lost quorum and
//! acknowledged to clients), then the Raft state — log, vote, membership, snapshot — is
//! forgotten and the member starts alone, with the same member and cluster IDs and revisions.
//!
//! Such a member's log starts empty over data that no log entry describes, and so does a
//! restored cluster's. A member added later and caught up from the log alone would miss that
//! data, so until a snapshot has been taken and the log purged behind it (the baseline), the
//! data dir carries a marker, and [`baseline_snapshot`] finishes the job after every start.

use std::sync::Arc;
use std::time::Duration;

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::RaftLogReader;

use super::node::Node;
use crate::raft::log_store::LogStore;
use crate::raft::state_machine::StateMachine;

#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error("{0}")]
    Raft(#[from] openraft::StorageError<u64>),
    #[error(transparent)]
    Storage(#[from] crate::error::StorageError),
    #[error(transparent)]
    Sled(#[from] sled::Error),
    #[error(transparent)]
    Wal(#[from] crate::raft::wal::WalError),
}

/// What a forced new cluster kept.
#[derive(Debug)]
pub struct Forced {
    /// Log entries applied on the way (they were in the log but not yet applied).
    pub replayed: usize,
    pub revision: i64,
}

/// Applies the rest of the log, then forgets the Raft state, leaving the data and a pending
/// baseline snapshot. The caller then initializes a one-member cluster.
pub async fn force_new_cluster(
    log: &mut LogStore,
    sm: &mut StateMachine,
) -> Result<Forced, RecoveryError> {
    let (applied, _) = sm.applied_state().await?;
    let last = log.get_log_state().await?.last_log_id;
    let from = applied.map_or(0, |l| l.index + 1);
    let mut replayed = 0;
    if let Some(last) = last {
        let entries = log.try_get_log_entries(from..=last.index).await?;
        replayed = entries.len();
        sm.apply(entries).await?;
    }
    sm.mvcc().set_baseline_pending(true)?;
    sm.forget_raft_state()?;
    // The log is about to forget entries only the state machine now holds.
    sm.mvcc().sync()?;
    log.wipe()?;
    Ok(Forced {
        replayed,
        revision: sm.mvcc().revision(),
    })
}

/// Once the member has applied an entry of its new log, takes a snapshot and purges the log
/// behind it, then clears the marker. Runs until done or until the member stops.
pub async fn baseline_snapshot(node: Arc<Node>) {
    let mut rx = node.raft.metrics();
    let applied = match rx
        .wait_for(|m| m.last_applied.is_some())
        .await
        .map(|m| m.last_applied)
    {
        Ok(Some(applied)) => applied,
        _ => return,
    };
    if let Err(e) = node.raft.trigger().snapshot().await {
        tracing::warn!(error = %e, "baseline snapshot could not be started");
        return;
    }
    let snapshot = match rx
        .wait_for(|m| m.snapshot.is_some_and(|s| s.index >= applied.index))
        .await
        .map(|m| m.snapshot)
    {
        Ok(Some(s)) => s,
        _ => return,
    };
    if let Err(e) = node.raft.trigger().purge_log(snapshot.index).await {
        tracing::warn!(error = %e, "baseline log purge could not be started");
        return;
    }
    // The purge may wait for a replication stream to let go of the entries.
    loop {
        if rx
            .borrow()
            .purged
            .is_some_and(|p| p.index >= snapshot.index)
        {
            break;
        }
        if tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .is_ok_and(|r| r.is_err())
        {
            return;
        }
    }
    match node.mvcc.set_baseline_pending(false) {
        Ok(()) => tracing::info!(
            index = snapshot.index,
            "baseline snapshot taken, log purged"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot clear the baseline marker"),
    }
}

/// What a stopped member's data dir holds, read offline (`rkube recover`): enough to tell
/// which surviving member is the most up to date.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemberState {
    pub name: String,
    pub member_id: u64,
    pub cluster_id: u64,
    pub peer_addr: String,
    /// The term of the member's vote.
    pub term: u64,
    /// The last entry in its log (or covered by its snapshot): term and index.
    pub last_log_term: u64,
    pub last_log_index: u64,
    pub committed_index: u64,
    pub applied_index: u64,
    pub revision: i64,
    /// The membership the member last applied.
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
}

impl MemberState {
    /// Raft's order of up-to-dateness: the last log entry's term, then its index; then what
    /// was applied.
    pub fn freshness(&self) -> (u64, u64, u64) {
        (self.last_log_term, self.last_log_index, self.applied_index)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("{dir} is not a member's data dir (no member.json)")]
    NotADataDir { dir: std::path::PathBuf },
    #[error("{dir} is in use by a running member{pid}; stop it first")]
    Running {
        dir: std::path::PathBuf,
        pid: String,
    },
    #[error("{dir}: {reason}")]
    Unreadable {
        dir: std::path::PathBuf,
        reason: String,
    },
}

/// Reads a stopped member's data dir: its identity, Raft state and revision. The dir is locked
/// meanwhile, so a member cannot start on it.
pub async fn inspect(dir: &std::path::Path) -> Result<MemberState, InspectError> {
    use fs2::FileExt;
    use std::io::Read;
    let unreadable = |reason: String| InspectError::Unreadable {
        dir: dir.to_path_buf(),
        reason,
    };
    let record = std::fs::read(dir.join("member.json")).map_err(|_| InspectError::NotADataDir {
        dir: dir.to_path_buf(),
    })?;
    let record: super::datadir::MemberRecord =
        serde_json::from_slice(&record).map_err(|e| unreadable(format!("member.json: {e}")))?;
    let mut lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join("LOCK"))
        .map_err(|e| unreadable(e.to_string()))?;
    if lock.try_lock_exclusive().is_err() {
        let mut pid = String::new();
        let _ = lock.read_to_string(&mut pid);
        let pid = pid.trim();
        return Err(InspectError::Running {
            dir: dir.to_path_buf(),
            pid: if pid.is_empty() {
                String::new()
            } else {
                format!(" (pid {pid})")
            },
        });
    }
    let storage = |e: crate::error::StorageError| unreadable(e.to_string());
    let db = sled::Config::new()
        .path(dir.join("db"))
        .open()
        .map_err(|e| unreadable(format!("its database: {e}")))?;
    let mvcc = Arc::new(crate::mvcc::MvccStore::open_dir(&db, &dir.join("db")).map_err(storage)?);
    let mut sm = StateMachine::open(mvcc.clone(), dir).map_err(storage)?;
    let mut log = LogStore::open(dir, &db, false).map_err(|e| unreadable(e.to_string()))?;
    let raft = |e: openraft::StorageError<u64>| unreadable(e.to_string());
    let (applied, membership) = sm.applied_state().await.map_err(raft)?;
    let last = log.get_log_state().await.map_err(raft)?.last_log_id;
    let vote = log.read_vote().await.map_err(raft)?;
    let committed = log.read_committed().await.map_err(raft)?;
    // The state machine is made durable lazily: a killed member's may be behind its log, and
    // so may its membership. The log's last membership entry is the newest.
    let mut config = membership.membership().clone();
    let from = applied.map_or(0, |l| l.index + 1);
    if let Some(last) = last.filter(|l| l.index >= from) {
        for entry in log
            .try_get_log_entries(from..=last.index)
            .await
            .map_err(raft)?
        {
            if let openraft::EntryPayload::Membership(m) = entry.payload {
                config = m;
            }
        }
    }
    let state = MemberState {
        name: record.name,
        member_id: record.member_id,
        cluster_id: record.cluster_id,
        peer_addr: record.peer_addr,
        term: vote.map_or(0, |v| v.leader_id.term),
        last_log_term: last.map_or(0, |l| l.leader_id.term),
        last_log_index: last.map_or(0, |l| l.index),
        committed_index: committed.map_or(0, |l| l.index),
        applied_index: applied.map_or(0, |l| l.index),
        revision: mvcc.revision(),
        voters: config.voter_ids().collect(),
        learners: config.learner_ids().collect(),
    };
    drop(lock);
    Ok(state)
}
