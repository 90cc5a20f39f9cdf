//! A member's core: the Raft handle and the MVCC store, and the operations every client API
//! needs from them — proposing a command (forwarded to the leader from a follower), a
//! linearizable read barrier, lease keep-alive and time-to-live (decided by the leader), and
//! membership changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{ChangeMembers, ServerState};
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use super::batcher::Batcher;
use super::metrics::Metrics;
use super::read_rounds::ReadRounds;
use crate::error::{MvccError, StoreError};
use crate::mvcc::{AlarmKind, Applied, Command, MvccStore};
use crate::proto::peer::peer_client::PeerClient;
use crate::proto::peer::Payload;
use crate::raft::network::PeerNetwork;
use crate::raft::wal::Wal;
use crate::raft::{LogId, Member, NodeId, Raft};

/// A request a follower hands to the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Forward {
    Propose(Command),
    ReadIndex,
    LeaseKeepAlive(i64),
    LeaseTimeToLive(i64),
    Membership(MembershipChange),
    /// Hand the leadership to this voter (etcd's MoveLeader).
    MoveLeader(NodeId),
    /// To any member, from the leader: hold off elections of its own while the leadership
    /// moves to `to`, for at most `millis`.
    HoldElections {
        to: NodeId,
        millis: u64,
    },
    /// To the transferee, from the leader: campaign now.
    Campaign,
    /// To any voter, from a member about to campaign: would you vote for me with my log
    /// ending here (PreVote)?
    PreVote {
        last_log: Option<LogId>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum ForwardReply {
    Applied(Applied),
    ReadIndex(u64),
    KeepAlive { ttl: i64 },
    TimeToLive { ttl: i64, granted: i64 },
    Membership,
    Done,
    PreVote { granted: bool },
}

/// Errors as they travel between members.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ForwardError {
    NotLeader,
    Mvcc(MvccError),
    Unavailable(String),
    Timeout,
    NotFound(String),
    FailedPrecondition(String),
    InvalidArgument(String),
}

impl From<StoreError> for ForwardError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Mvcc(m) => ForwardError::Mvcc(m),
            StoreError::Unavailable(m) => ForwardError::Unavailable(m),
            StoreError::Timeout => ForwardError::Timeout,
            StoreError::NotFound(m) => ForwardError::NotFound(m),
            StoreError::FailedPrecondition(m) => ForwardError::FailedPrecondition(m),
            StoreError::InvalidArgument(m) => ForwardError::InvalidArgument(m),
            StoreError::Storage(e) => ForwardError::Unavailable(e.to_string()),
            StoreError::Stopped => ForwardError::Unavailable("server stopped".into()),
        }
    }
}

impl From<ForwardError> for StoreError {
    fn from(e: ForwardError) -> Self {
        match e {
            ForwardError::NotLeader => StoreError::Unavailable("leader changed".into()),
            ForwardError::Mvcc(m) => StoreError::Mvcc(m),
            ForwardError::Unavailable(m) => StoreError::Unavailable(m),
            ForwardError::Timeout => StoreError::Timeout,
            ForwardError::NotFound(m) => StoreError::NotFound(m),
            ForwardError::FailedPrecondition(m) => StoreError::FailedPrecondition(m),
            ForwardError::InvalidArgument(m) => StoreError::InvalidArgument(m),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MembershipChange {
    AddLearner { id: NodeId, member: Member },
    AddVoter { id: NodeId, member: Member },
    Promote { id: NodeId },
    Remove { id: NodeId },
    Update { id: NodeId, member: Member },
}

/// Timing of a member, from its flags.
#[derive(Debug, Clone)]
pub struct Timing {
    pub election_timeout: Duration,
    /// How long a client request may wait for a leader, a quorum or the apply.
    pub request_timeout: Duration,
}

/// Who a member is.
#[derive(Debug, Clone)]
pub struct Identity {
    pub id: NodeId,
    pub name: String,
    pub cluster_token: String,
    pub cluster_id: u64,
    /// Client URLs this member publishes.
    pub client_urls: Vec<String>,
}

pub struct Node {
    pub id: NodeId,
    pub name: String,
    pub cluster_id: u64,
    pub identity: Identity,
    pub raft: Raft,
    pub mvcc: Arc<MvccStore>,
    pub db: sled::Db,
    pub metrics: Arc<Metrics>,
    pub committed: Arc<AtomicU64>,
    pub timing: Timing,
    network: PeerNetwork,
    /// The Raft log (openraft owns it; the member reads its last log id for PreVote).
    pub(super) wal: Arc<Wal>,
    leases: LeaseClock,
    /// The database size that raises a NOSPACE alarm (etcd's --quota-backend-bytes).
    pub quota_bytes: u64,
    /// The database's size on disk, refreshed by the member's background loop (reading it
    /// walks files, too slow for every write).
    pub db_size: AtomicU64,
    /// Set on the leader while it hands its leadership over: it takes no new work meanwhile, so
    /// that the transferee catches up and nothing refreshes the followers' leader lease.
    transferring: AtomicBool,
    /// Whether this member may campaign (off while a leader transfer holds elections).
    pub(super) elections: Arc<AtomicBool>,
    /// Group commit of this member's proposals while it leads.
    batcher: Batcher,
    /// Read-index rounds shared by concurrent linearizable reads on this member.
    read_rounds: ReadRounds,
}

/// The leader's view of when each lease expires. Kept in memory only: a new leader starts every
/// lease's clock afresh at its full TTL, so a leadership change never expires a lease early.
#[derive(Default)]
struct LeaseClock {
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
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        identity: Identity,
        raft: Raft,
        mvcc: Arc<MvccStore>,
        db: sled::Db,
        metrics: Arc<Metrics>,
        committed: Arc<AtomicU64>,
        timing: Timing,
        network: PeerNetwork,
        wal: Arc<Wal>,
        quota_bytes: u64,
    ) -> Self {
        let db_size = AtomicU64::new(db_size_on_disk(&db));
        let batcher = Batcher::start(raft.clone(), timing.request_timeout);
        Self {
            id: identity.id,
            name: identity.name.clone(),
            cluster_id: identity.cluster_id,
            identity,
            raft,
            mvcc,
            db,
            metrics,
            committed,
            timing,
            network,
            wal,
            leases: LeaseClock::default(),
            quota_bytes,
            db_size,
            transferring: AtomicBool::new(false),
            elections: Arc::new(AtomicBool::new(true)),
            batcher,
            read_rounds: ReadRounds::default(),
        }
    }

    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// Waits (bounded by the request timeout) until some member is leader.
    async fn wait_for_leader(&self, deadline: Instant) -> Result<NodeId, StoreError> {
        let mut rx = self.raft.metrics();
        loop {
            if let Some(leader) = rx.borrow().current_leader {
                return Ok(leader);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
                return Err(StoreError::Unavailable("no leader".into()));
            }
        }
    }

    /// A leader that has not heard from a quorum for longer than an election timeout is cut
    /// off; it refuses work at once instead of letting clients wait for a commit that cannot come.
    fn check_quorum_contact(&self) -> Result<(), StoreError> {
        let m = self.raft.metrics();
        let m = m.borrow();
        if m.state == ServerState::Leader {
            if let Some(ms) = m.millis_since_quorum_ack {
                if ms > 2 * self.timing.election_timeout.as_millis() as u64 {
                    return Err(StoreError::Unavailable(
                        "no leader (this member lost contact with a quorum of the cluster)".into(),
                    ));
                }
            }
        }
        Ok(())
    }

    pub(super) fn peer(&self, id: NodeId) -> Result<PeerClient<Channel>, StoreError> {
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let addr = membership
            .nodes()
            .find(|(nid, _)| **nid == id)
            .map(|(_, n)| n.peer_addr.clone());
        let addr = addr.ok_or_else(|| {
            StoreError::Unavailable(format!("leader {id:x} is not in the membership"))
        })?;
        let channel = self
            .network
            .channel(&addr)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        Ok(PeerClient::new(channel).max_decoding_message_size(usize::MAX))
    }

    /// Sends a request to the current leader (possibly this member), retrying while the
    /// leadership moves, within the request timeout.
    async fn to_leader(&self, req: Forward) -> Result<ForwardReply, StoreError> {
        let deadline = Instant::now() + self.timing.request_timeout;
        loop {
            let leader = self.wait_for_leader(deadline).await?;
            let result = if leader == self.id {
                self.serve_forward(req.clone()).await
            } else {
                self.send_forward(leader, &req, deadline).await
            };
            match result {
                Err(ForwardError::NotLeader) if Instant::now() < deadline => {
                    // Leadership moved under us; wait for metrics to catch up and retry.
                    let mut rx = self.raft.metrics();
                    let left = deadline
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(200));
                    let _ = tokio::time::timeout(left, rx.changed()).await;
                }
                Err(ForwardError::NotLeader) => {
                    return Err(StoreError::Unavailable("no leader".into()))
                }
                Err(e) => return Err(e.into()),
                Ok(r) => return Ok(r),
            }
        }
    }

    async fn send_forward(
        &self,
        leader: NodeId,
        req: &Forward,
        deadline: Instant,
    ) -> Result<ForwardReply, ForwardError> {
        let mut client = self.peer(leader).map_err(ForwardError::from)?;
        let data = bincode::serialize(req).map_err(|e| ForwardError::Unavailable(e.to_string()))?;
        let mut request = tonic::Request::new(Payload { data });
        request.set_timeout(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(50)),
        );
        let propose = matches!(req, Forward::Propose(_) | Forward::Membership(_));
        match client.forward(request).await {
            Ok(reply) => {
                bincode::deserialize::<Result<ForwardReply, ForwardError>>(&reply.into_inner().data)
                    .map_err(|e| ForwardError::Unavailable(e.to_string()))?
            }
            Err(status) => {
                let error = forward_failed(&status, propose, Instant::now() >= deadline);
                if matches!(error, ForwardError::Unavailable(_)) {
                    tracing::debug!(leader = format!("{leader:x}"), %status, "forwarded write lost");
                }
                Err(error)
            }
        }
    }

    /// Serves a request on this member as leader; `NotLeader` when it is not.
    pub async fn serve_forward(&self, req: Forward) -> Result<ForwardReply, ForwardError> {
        match req {
            Forward::HoldElections { to, millis } => {
                self.hold_elections(to, Duration::from_millis(millis));
                return Ok(ForwardReply::Done);
            }
            Forward::PreVote { last_log } => {
                let granted = self.grants_pre_vote(last_log).await;
                return Ok(ForwardReply::PreVote { granted });
            }
            Forward::Campaign => {
                self.raft
                    .trigger()
                    .elect()
                    .await
                    .map_err(|e| ForwardError::Unavailable(e.to_string()))?;
                return Ok(ForwardReply::Done);
            }
            _ => {}
        }
        if !self.is_leader() || self.transferring.load(Ordering::Acquire) {
            return Err(ForwardError::NotLeader);
        }
        self.check_quorum_contact()?;
        match req {
            Forward::Propose(cmd) => self.propose_local(cmd).await.map(ForwardReply::Applied),
            Forward::ReadIndex => self.read_index().await.map(ForwardReply::ReadIndex),
            Forward::LeaseKeepAlive(id) => self
                .keep_alive_local(id)
                .map(|ttl| ForwardReply::KeepAlive { ttl }),
            Forward::LeaseTimeToLive(id) => self
                .ttl_local(id)
                .map(|(ttl, granted)| ForwardReply::TimeToLive { ttl, granted }),
            Forward::Membership(change) => self
                .change_membership_local(change)
                .await
                .map(|_| ForwardReply::Membership),
            Forward::MoveLeader(to) => self.move_leader_local(to).await.map(|_| ForwardReply::Done),
            Forward::HoldElections { .. } | Forward::Campaign | Forward::PreVote { .. } => {
                Ok(ForwardReply::Done)
            }
        }
    }

    /// The read index: the commit index once a quorum has confirmed this leadership. One round
    /// of confirmation may miss a quorum that is only slow (it waits one heartbeat interval), so
    /// rounds repeat until the request timeout; a leader cut off from its quorum fails earlier
    /// through `check_quorum_contact`.
    async fn read_index(&self) -> Result<u64, ForwardError> {
        let deadline = Instant::now() + self.timing.request_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.raft.get_read_log_id()).await {
                Err(_) => return Err(ForwardError::Timeout),
                Ok(Ok((read, _))) => return Ok(read.map_or(0, |l| l.index)),
                Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_)))) => {
                    return Err(ForwardError::NotLeader)
                }
                Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)))) => {
                    if Instant::now() >= deadline {
                        return Err(ForwardError::Unavailable(
                            "no leader (quorum not reachable)".into(),
                        ));
                    }
                    self.check_quorum_contact()?;
                    // Peers that refuse connections fail a round at once: back off a little.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(Err(RaftError::Fatal(f))) => {
                    return Err(ForwardError::Unavailable(f.to_string()))
                }
            }
        }
    }

    async fn propose_local(&self, cmd: Command) -> Result<Applied, ForwardError> {
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

    /// Reads the database size on disk again.
    pub fn refresh_db_size(&self) -> u64 {
        let size = db_size_on_disk(&self.db);
        self.db_size.store(size, Ordering::Relaxed);
        size
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

    /// Returns once this member has applied everything committed before the call: the
    /// read-index protocol (the leader confirms its leadership with a quorum), in rounds that
    /// concurrent reads share (`ReadRounds`).
    pub async fn linearizable_barrier(&self) -> Result<(), StoreError> {
        let index = self
            .read_rounds
            .index(|| async {
                match self.to_leader(Forward::ReadIndex).await? {
                    ForwardReply::ReadIndex(i) => Ok(i),
                    other => Err(StoreError::Unavailable(format!(
                        "unexpected reply from leader: {other:?}"
                    ))),
                }
            })
            .await?;
        self.raft
            .wait(Some(self.timing.request_timeout))
            .applied_index_at_least(Some(index), "linearizable read")
            .await
            .map(|_| ())
            .map_err(|_| StoreError::Timeout)
    }

    // ---- leases ----

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

    fn keep_alive_local(&self, id: i64) -> Result<i64, ForwardError> {
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

    fn ttl_local(&self, id: i64) -> Result<(i64, i64), ForwardError> {
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
                    .map_or(true, |at| now.duration_since(*at) > Duration::from_secs(5));
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

    // ---- membership ----

    pub async fn change_membership(&self, change: MembershipChange) -> Result<(), StoreError> {
        self.to_leader(Forward::Membership(change))
            .await
            .map(|_| ())
    }

    async fn change_membership_local(&self, change: MembershipChange) -> Result<(), ForwardError> {
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let known = |id: &NodeId| membership.nodes().any(|(n, _)| n == id);
        let result = match change {
            MembershipChange::AddLearner { id, member }
            | MembershipChange::AddVoter { id, member }
                if known(&id) =>
            {
                let _ = member;
                return Err(ForwardError::FailedPrecondition(
                    "member ID already exist".into(),
                ));
            }
            MembershipChange::AddLearner { id, member } => {
                self.raft.add_learner(id, member, false).await
            }
            MembershipChange::AddVoter { id, member } => {
                let nodes = BTreeMap::from([(id, member)]);
                self.raft
                    .change_membership(ChangeMembers::AddVoters(nodes), false)
                    .await
            }
            MembershipChange::Promote { id } => {
                if !known(&id) {
                    return Err(ForwardError::NotFound("member not found".into()));
                }
                if voters.contains(&id) {
                    return Err(ForwardError::FailedPrecondition(
                        "can only promote a learner member".into(),
                    ));
                }
                if !self.learner_in_sync(id) {
                    return Err(ForwardError::FailedPrecondition(
                        "can only promote a learner member which is in sync with leader".into(),
                    ));
                }
                self.raft
                    .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
                    .await
            }
            MembershipChange::Remove { id } => {
                if !known(&id) {
                    return Err(ForwardError::NotFound("member not found".into()));
                }
                if voters.contains(&id) {
                    if voters.len() == 1 {
                        return Err(ForwardError::FailedPrecondition(
                            "re-configuration failed due to not enough started members".into(),
                        ));
                    }
                    self.raft
                        .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                        .await
                } else {
                    self.raft
                        .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                        .await
                }
            }
            MembershipChange::Update { id, member } => {
                if !known(&id) {
                    return Err(ForwardError::NotFound("member not found".into()));
                }
                self.raft
                    .change_membership(
                        ChangeMembers::SetNodes(BTreeMap::from([(id, member)])),
                        false,
                    )
                    .await
            }
        };
        match result {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                Err(ForwardError::NotLeader)
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(ForwardError::FailedPrecondition(e.to_string()))
            }
            Err(RaftError::Fatal(f)) => Err(ForwardError::Unavailable(f.to_string())),
        }
    }

    // ---- leadership transfer ----

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
            }
            if self.is_leader() && !self.transferring.load(Ordering::Acquire) {
                if self.raft.trigger().heartbeat().await.is_err() {
                    return;
                }
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
    async fn move_leader_local(&self, to: NodeId) -> Result<(), ForwardError> {
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
    fn hold_elections(&self, to: NodeId, window: Duration) {
        self.allow_elections(false);
        let (raft, elections) = (self.raft.clone(), self.elections.clone());
        tokio::spawn(async move {
            let mut rx = raft.metrics();
            let _ =
                tokio::time::timeout(window, rx.wait_for(|m| m.current_leader == Some(to))).await;
            elections.store(true, Ordering::Release);
        });
    }

    /// A learner is in sync when it has matched the leader's log to within a small lag.
    fn learner_in_sync(&self, id: NodeId) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        let last = m.last_log_index.unwrap_or(0);
        // A learner that never acknowledged anything (not started yet) is not in sync.
        let Some(matched) = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&id).cloned().flatten())
        else {
            return false;
        };
        last.saturating_sub(matched.index) <= 100
    }
}

/// True when the call failed before any byte reached the peer (so it was never served).
/// What a forwarded request whose RPC to the leader failed with `status` comes to.
///
/// The request may or may not have reached the leader's log: only a read can be retried
/// safely; a write reports the ambiguity as etcd does. The leader's gRPC server ends a request
/// at the deadline sent with it as Cancelled ("Timeout expired"), which is a timeout, not a
/// lost connection.
fn forward_failed(status: &tonic::Status, propose: bool, deadline_passed: bool) -> ForwardError {
    match status.code() {
        tonic::Code::DeadlineExceeded => ForwardError::Timeout,
        tonic::Code::Cancelled if deadline_passed => ForwardError::Timeout,
        _ if !propose => ForwardError::NotLeader,
        tonic::Code::Unavailable if is_connect_error(status) => ForwardError::NotLeader,
        // The connection to the leader broke with the write in flight: it may have been
        // committed or not. etcd's wording for that, which clients know to check.
        _ => ForwardError::Unavailable("request timed out, possibly due to connection lost".into()),
    }
}

fn is_connect_error(status: &tonic::Status) -> bool {
    let text = format!("{status:?}").to_lowercase();
    text.contains("connection refused")
        || text.contains("tcp connect error")
        || text.contains("error trying to connect")
}

/// A member's Raft id: derived from the cluster token and its advertised peer address, so
/// that `member add` (which knows only the address) and the member itself agree on it.
pub fn member_id(cluster_token: &str, peer_addr: &str) -> NodeId {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{cluster_token}\n{peer_addr}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    // Non-zero and positive as an i64, which keeps etcd clients that print it signed happy.
    (u64::from_be_bytes(bytes) >> 1).max(1)
}

pub fn cluster_id(cluster_token: &str) -> u64 {
    member_id(cluster_token, "")
}

/// Keeps the committed index that openraft reports to the log store.
/// The sled database's size on disk; 0 when it cannot be read.
pub fn db_size_on_disk(db: &sled::Db) -> u64 {
    db.size_on_disk().unwrap_or(0)
}

pub fn committed_index(committed: &AtomicU64) -> u64 {
    committed.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    #[test]
    fn a_failed_forward_is_a_timeout_a_retry_elsewhere_or_a_lost_write() {
        let timed_out = "etcdserver: request timed out";
        let lost = "etcdserver: request timed out, possibly due to connection lost";
        let retry = "etcdserver: leader changed";
        // (case, status, a write, the deadline passed, what the client is told)
        let cases = [
            (
                "the leader's server ended a write at the deadline sent with it",
                Status::cancelled("Timeout expired"),
                true,
                true,
                timed_out,
            ),
            (
                "the deadline passed on the way",
                Status::deadline_exceeded("deadline has elapsed"),
                true,
                false,
                timed_out,
            ),
            (
                "a write cancelled before its deadline",
                Status::cancelled("operation was canceled"),
                true,
                false,
                lost,
            ),
            (
                "a write whose connection broke",
                Status::unknown("transport error"),
                true,
                false,
                lost,
            ),
            (
                "a write to a leader that is not listening",
                Status::unavailable("tcp connect error: Connection refused"),
                true,
                false,
                retry,
            ),
            (
                "a read whose connection broke",
                Status::unknown("transport error"),
                false,
                false,
                retry,
            ),
        ];
        for (case, status, propose, passed, want) in cases {
            let got = StoreError::from(forward_failed(&status, propose, passed)).to_string();
            assert_eq!(got, want, "{case}");
        }
    }
}
