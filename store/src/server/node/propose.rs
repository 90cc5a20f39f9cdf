//! Proposing commands: through the leader, or only as the leader of a given term (fenced),
//! after etcd's space-quota check; a leader's proposals go through its batcher.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Forward, ForwardError, ForwardReply, Node};
use crate::error::{MvccError, StoreError};
use crate::mvcc::{AlarmKind, Applied, Command};

impl Node {
    pub(super) async fn propose_local(&self, cmd: Command) -> Result<Applied, ForwardError> {
        let started = Instant::now();
        let result = self.batcher.propose(cmd).await;
        self.metrics
            .proposal_seconds
            .observe(started.elapsed().as_secs_f64());
        if matches!(result, Err(ForwardError::Timeout)) {
            self.metrics.proposals_failed.inc();
        }
        result
    }

    /// etcd's space quota: a write that would grow a database already past its quota raises
    /// this member's NOSPACE alarm (through the log, so every member refuses such writes from
    /// then on) and is refused.
    async fn check_quota(&self, cmd: &Command) -> Result<(), StoreError> {
        if !cmd.takes_space() {
            return Ok(());
        }
        let cost = bincode::serialized_size(cmd).unwrap_or(0);
        if self.db_size.load(Ordering::Relaxed) + cost <= self.quota_bytes {
            return Ok(());
        }
        let raised = self
            .mvcc
            .alarms()?
            .iter()
            .any(|a| a.member == self.id && a.kind == AlarmKind::NoSpace);
        if !raised {
            tracing::warn!(
                db_size = self.db_size.load(Ordering::Relaxed),
                quota = self.quota_bytes,
                "database space exceeded: raising the NOSPACE alarm"
            );
            self.propose_unchecked(Command::Alarm {
                activate: true,
                member: self.id,
                alarm: AlarmKind::NoSpace,
            })
            .await?;
        }
        Err(MvccError::NoSpace.into())
    }

    /// Proposes a command through the leader and returns what the state machine made of it.
    pub async fn propose(&self, cmd: Command) -> Result<Applied, StoreError> {
        self.check_quota(&cmd).await?;
        self.propose_unchecked(cmd).await
    }

    /// Proposes a command only as the leader of Raft term `term`, never through another
    /// member: the write path of the controllers and the scheduler a leader runs, so work
    /// started in a term it no longer leads commits nothing (a forwarded write would).
    pub async fn propose_fenced(&self, cmd: Command, term: u64) -> Result<Applied, StoreError> {
        self.check_quota(&cmd).await?;
        let deposed = || {
            StoreError::Unavailable(format!(
                "this member no longer leads term {term}; its controllers' writes are refused"
            ))
        };
        if !self.is_leader() || self.term() != term {
            return Err(deposed());
        }
        match self.serve_forward(Forward::Propose(cmd)).await {
            Ok(ForwardReply::Applied(a)) => Ok(a),
            Ok(other) => Err(StoreError::Unavailable(format!(
                "unexpected reply to a proposal: {other:?}"
            ))),
            Err(ForwardError::NotLeader) => Err(deposed()),
            Err(e) => Err(e.into()),
        }
    }

    async fn propose_unchecked(&self, cmd: Command) -> Result<Applied, StoreError> {
        match self.to_leader(Forward::Propose(cmd)).await? {
            ForwardReply::Applied(a) => Ok(a),
            other => Err(StoreError::Unavailable(format!(
                "unexpected reply from leader: {other:?}"
            ))),
        }
    }
}
