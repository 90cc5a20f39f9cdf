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
