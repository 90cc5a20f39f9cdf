//! Proposing commands: through the leader, or only as the leader of a given term (fenced),
//! after etcd's space-quota check. A leader's proposals go through its batcher to Raft; a
//! follower's through its forwarder, which sends the commands proposed at the same time to the
//! leader in one message.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Forward, ForwardError, ForwardReply, Node};
use crate::error::{MvccError, StoreError};
use crate::mvcc::{AlarmKind, Applied, Command};
use crate::server::batcher;

impl Node {
    pub(super) async fn propose_local(&self, cmd: Command) -> Result<Applied, ForwardError> {
        let mut applied = self.propose_local_many(vec![cmd]).await?;
        applied
            .pop()
            .ok_or_else(|| ForwardError::Unavailable("a proposal produced no result".into()))
    }

    /// Proposes commands as the leader, in one log entry with those proposed at the same time.
    pub(super) async fn propose_local_many(
        &self,
        cmds: Vec<Command>,
    ) -> Result<Vec<Applied>, ForwardError> {
        let started = Instant::now();
        let n = cmds.len();
        let send = batcher::to_raft(self.raft.clone(), self.timing.request_timeout);
        let result = self.batcher.propose(cmds, send).await;
        // Per command, as etcd counts proposals, however many came in one message.
        let took = started.elapsed().as_secs_f64();
        for _ in 0..n {
            self.metrics.proposal_seconds.observe(took);
        }
        if matches!(result, Err(ForwardError::Timeout)) {
            self.metrics.proposals_failed.inc_by(n as u64);
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
            .alarms()
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
        if self.is_leader() {
            return match self.to_leader(Forward::Propose(cmd)).await? {
                ForwardReply::Applied(a) => Ok(a),
                other => Err(unexpected(&other)),
            };
        }
        // A follower: with the commands proposed here at the same time, in one message.
        let me = self.me.clone();
        let send = move |cmds: Vec<Command>| {
            let me = me.clone();
            async move {
                let node = me
                    .upgrade()
                    .ok_or_else(|| ForwardError::Unavailable("server stopped".into()))?;
                node.forward_many(cmds).await.map_err(ForwardError::from)
            }
        };
        let mut applied = self.forwarder.propose(vec![cmd], send).await?;
        applied
            .pop()
            .ok_or_else(|| StoreError::Unavailable("a proposal produced no result".into()))
    }

    /// Sends commands to the leader (this member, if it leads by now) as one request.
    async fn forward_many(&self, mut cmds: Vec<Command>) -> Result<Vec<Applied>, StoreError> {
        let req = match cmds.len() {
            1 => Forward::Propose(cmds.remove(0)),
            _ => Forward::ProposeMany(cmds),
        };
        match self.to_leader(req).await? {
            ForwardReply::Applied(a) => Ok(vec![a]),
            ForwardReply::AppliedMany(a) => Ok(a),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(reply: &ForwardReply) -> StoreError {
    StoreError::Unavailable(format!("unexpected reply from leader: {reply:?}"))
}
