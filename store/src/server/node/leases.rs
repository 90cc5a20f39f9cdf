//! Leases: keep-alive and time-to-live, which the leader decides; the leader's in-memory clock
//! of when each lease expires; and expiry, through the log.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Forward, ForwardError, ForwardReply, Node};
use crate::error::{MvccError, StoreError};
use crate::mvcc::Command;

/// The leader's view of when each lease expires. Kept in memory only: a new leader starts every
/// lease's clock afresh at its full TTL, so a leadership change never expires a lease early.
#[derive(Default)]
pub(super) struct LeaseClock {
    inner: Mutex<LeaseClockInner>,
}

#[derive(Default)]
struct LeaseClockInner {
    /// The term these deadlines belong to; a different term means they are stale.
    term: u64,
    deadlines: HashMap<i64, Instant>,
    /// Leases whose revoke has been proposed, and when (to retry if it got lost).
    revoking: HashMap<i64, Instant>,
}

impl Node {
    pub async fn lease_keep_alive(&self, id: i64) -> Result<i64, StoreError> {
        match self.to_leader(Forward::LeaseKeepAlive(id)).await? {
            ForwardReply::KeepAlive { ttl } => Ok(ttl),
            other => Err(StoreError::Unavailable(format!(
                "unexpected reply from leader: {other:?}"
            ))),
        }
    }

    /// Remaining and granted TTL of a lease, in seconds.
    pub async fn lease_time_to_live(&self, id: i64) -> Result<(i64, i64), StoreError> {
        match self.to_leader(Forward::LeaseTimeToLive(id)).await? {
            ForwardReply::TimeToLive { ttl, granted } => Ok((ttl, granted)),
            other => Err(StoreError::Unavailable(format!(
                "unexpected reply from leader: {other:?}"
            ))),
        }
    }

    fn lease_clock(&self) -> std::sync::MutexGuard<'_, LeaseClockInner> {
        let term = self.term();
        let mut clock = self.leases.inner.lock().unwrap_or_else(|e| e.into_inner());
        if clock.term != term {
            clock.term = term;
            clock.deadlines.clear();
            clock.revoking.clear();
        }
        clock
    }

    fn existing_lease(&self, id: i64) -> Result<crate::mvcc::Lease, ForwardError> {
        let lease = self
            .mvcc
            .lease(id)
            .map_err(|e| ForwardError::Unavailable(e.to_string()))?;
        lease.ok_or(ForwardError::Mvcc(MvccError::LeaseNotFound))
    }

    pub(super) fn keep_alive_local(&self, id: i64) -> Result<i64, ForwardError> {
        let lease = self.existing_lease(id)?;
        let mut clock = self.lease_clock();
        if clock.revoking.contains_key(&id) {
            return Err(ForwardError::Mvcc(MvccError::LeaseNotFound));
        }
        clock
            .deadlines
            .insert(id, Instant::now() + Duration::from_secs(lease.ttl as u64));
        Ok(lease.ttl)
    }

    pub(super) fn ttl_local(&self, id: i64) -> Result<(i64, i64), ForwardError> {
        let lease = self.existing_lease(id)?;
        let mut clock = self.lease_clock();
        let full = Instant::now() + Duration::from_secs(lease.ttl as u64);
        let deadline = *clock.deadlines.entry(id).or_insert(full);
        let left = deadline.saturating_duration_since(Instant::now());
        // Round up, as etcd reports remaining seconds.
        let secs = left.as_millis().div_ceil(1000) as i64;
        Ok((secs, lease.ttl))
    }

    /// One pass of the leader's lease clock: leases whose time ran out are revoked through the
    /// log, so every member deletes their keys at the same revision.
    pub async fn expire_leases(self: &Arc<Self>) {
        if !self.is_leader() {
            return;
        }
        let leases = match self.mvcc.leases() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read leases");
                return;
            }
        };
        let now = Instant::now();
        let mut expired = Vec::new();
        {
            let mut clock = self.lease_clock();
            let live: BTreeSet<i64> = leases.iter().map(|l| l.id).collect();
            clock.deadlines.retain(|id, _| live.contains(id));
            clock.revoking.retain(|id, _| live.contains(id));
            for lease in &leases {
                let deadline = *clock
                    .deadlines
                    .entry(lease.id)
                    .or_insert(now + Duration::from_secs(lease.ttl as u64));
                let retry = clock
                    .revoking
                    .get(&lease.id)
                    .is_none_or(|at| now.duration_since(*at) > Duration::from_secs(5));
                if deadline <= now && retry {
                    clock.revoking.insert(lease.id, now);
                    expired.push(lease.id);
                }
            }
        }
        for id in expired {
            let node = self.clone();
            tokio::spawn(async move {
                match node.propose(Command::LeaseRevoke { id }).await {
                    Ok(_) => tracing::info!(lease = format!("{id:x}"), "lease expired and revoked"),
                    Err(e) => {
                        tracing::warn!(lease = format!("{id:x}"), error = %e, "revoking expired lease failed")
                    }
                }
            });
        }
    }
}
