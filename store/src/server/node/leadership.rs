//! Leadership: the leader's heartbeats, and moving the leadership to another voter (etcd's
//! MoveLeader), which openraft 0.9 cannot do by itself.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Forward, ForwardError, Node};
use crate::error::StoreError;
use crate::raft::{Member, NodeId};

impl Node {
    /// While leader, asks openraft for a heartbeat to every follower each `every` (openraft's
    /// own heartbeat interval is the AppendEntries timeout, see `server::start`). A heartbeat
    /// queues behind an AppendEntries still in flight to a slow follower instead of failing it.
    /// None during a leadership transfer, which needs the followers' leases to run out.
    pub async fn send_heartbeats(
        self: Arc<Self>,
        every: Duration,
        stopped: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(stopped);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                _ = tick.tick() => {}
                // A commit index the peer network held back until this log synced it: send it
                // now, not at the next tick, so followers apply (and their reads and watches
                // see) the write as soon as they may.
                _ = self.wal.released() => {}
            }
            if self.is_leader()
                && !self.transferring.load(Ordering::Acquire)
                && self.raft.trigger().heartbeat().await.is_err()
            {
                return;
            }
        }
    }

    /// Moves the leadership to the voter `to` (etcd's MoveLeader), through whichever member
    /// leads now; returns once this member, too, follows it, so that what the client asks this
    /// member next already sees the new leader.
    pub async fn move_leader(&self, to: NodeId) -> Result<(), StoreError> {
        self.to_leader(Forward::MoveLeader(to)).await?;
        self.raft
            .wait(Some(self.timing.request_timeout))
            .metrics(
                |m| m.current_leader == Some(to),
                "the new leader known here",
            )
            .await
            .map(|_| ())
            .map_err(|_| StoreError::Timeout)
    }

    /// openraft 0.9 has no leadership transfer of its own, so the leader arranges one: it stops
    /// taking work and sending heartbeats, asks the other voters to hold their elections, and
    /// asks the caught-up transferee to campaign. The transferee wins as soon as enough voters
    /// consider the old leader's lease over (the old leader's own vote comes at once).
    pub(super) async fn move_leader_local(&self, to: NodeId) -> Result<(), ForwardError> {
        if to == self.id {
            return Ok(());
        }
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        if !voters.contains(&to) {
            return Err(ForwardError::FailedPrecondition(
                "bad leader transferee".into(),
            ));
        }
        if self.transferring.swap(true, Ordering::AcqRel) {
            return Err(ForwardError::FailedPrecondition(
                "a leader transfer is already in progress".into(),
            ));
        }
        let result = self.transfer_to(to, &voters).await;
        let rc = self.raft.runtime_config();
        rc.heartbeat(true);
        self.allow_elections(true);
        self.transferring.store(false, Ordering::Release);
        result
    }

    async fn transfer_to(&self, to: NodeId, voters: &BTreeSet<NodeId>) -> Result<(), ForwardError> {
        let budget = self.timing.request_timeout.mul_f64(0.9);
        let deadline = Instant::now() + budget;
        let too_long =
            || ForwardError::Unavailable("request timed out, leader transfer took too long".into());
        let mut rx = self.raft.metrics();
        let caught_up = |m: &openraft::RaftMetrics<NodeId, Member>| {
            let last = m.last_log_index.unwrap_or(0);
            m.replication
                .as_ref()
                .and_then(|r| r.get(&to).cloned().flatten())
                .is_some_and(|matched| matched.index >= last)
        };
        tokio::time::timeout_at(deadline.into(), rx.wait_for(|m| caught_up(m)))
            .await
            .map_err(|_| too_long())?
            .map_err(|_| ForwardError::Unavailable("server stopped".into()))?;

        let rc = self.raft.runtime_config();
        rc.heartbeat(false);
        self.allow_elections(false);
        let hold = Forward::HoldElections {
            to,
            millis: budget.as_millis() as u64,
        };
        for &v in voters.iter().filter(|v| **v != to && **v != self.id) {
            // A voter that cannot be told cannot be reached by the transferee either.
            if let Err(e) = self.send_forward(v, &hold, deadline).await {
                tracing::info!(member = format!("{v:x}"), error = ?e, "could not hold elections");
            }
        }
        // The first campaign wins at once when the voters it needs see no live leader lease (the
        // old leader's own lease usually ran out long ago); otherwise it campaigns again once the
        // followers' leases, last renewed by the final heartbeat, have run out.
        let lease = self.timing.election_timeout * 2 + Duration::from_millis(100);
        loop {
            self.send_forward(to, &Forward::Campaign, deadline).await?;
            let until = deadline.min(Instant::now() + lease);
            match tokio::time::timeout_at(
                until.into(),
                rx.wait_for(|m| m.current_leader == Some(to)),
            )
            .await
            {
                Ok(Ok(_)) => break,
                Ok(Err(_)) => return Err(ForwardError::Unavailable("server stopped".into())),
                Err(_) if Instant::now() >= deadline => return Err(too_long()),
                Err(_) => {}
            }
        }
        tracing::info!(to = format!("{to:x}"), "leadership moved");
        Ok(())
    }

    /// Keeps this member from campaigning until `to` leads, or for at most `window`.
    pub(super) fn hold_elections(&self, to: NodeId, window: Duration) {
        self.allow_elections(false);
        let (raft, elections) = (self.raft.clone(), self.elections.clone());
        tokio::spawn(async move {
            let mut rx = raft.metrics();
            let _ =
                tokio::time::timeout(window, rx.wait_for(|m| m.current_leader == Some(to))).await;
            elections.store(true, Ordering::Release);
        });
    }
}
