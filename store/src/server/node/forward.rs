//! Forwarding to the leader: the requests a member hands to the leader, their replies and
//! errors; finding the leader and sending to it on the Raft stream (or serving it here, as
//! leader); and what a request whose call to the leader failed comes to.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use super::{MembershipChange, Node};
use crate::error::{MvccError, StoreError};
use crate::mvcc::{Applied, Command};
use crate::proto::peer::peer_client::PeerClient;
use crate::raft::stream::{self, CallError, Kind};
use crate::raft::{LogId, NodeId, Vote};

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
    /// Commands proposed on a follower at the same time, in one message
    /// ([`crate::server::batcher`]); answered with one result each, in order.
    ProposeMany(Vec<Command>),
    /// A read index asked by voter `member`, whose vote, read in its Raft core after the read
    /// arrived, was `vote`: that member's ack of this leadership (`read_index.rs`).
    ReadIndexVouched {
        member: NodeId,
        vote: Vote,
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
    AppliedMany(Vec<Applied>),
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

impl Node {
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

    /// The peer address of member `id`, from the membership.
    fn peer_addr(&self, id: NodeId) -> Result<String, StoreError> {
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let addr = membership
            .nodes()
            .find(|(nid, _)| **nid == id)
            .map(|(_, n)| n.peer_addr.clone());
        addr.ok_or_else(|| {
            StoreError::Unavailable(format!("leader {id:x} is not in the membership"))
        })
    }

    pub(in crate::server) fn peer(&self, id: NodeId) -> Result<PeerClient<Channel>, StoreError> {
        let addr = self.peer_addr(id)?;
        let channel = self
            .network
            .channel(&addr)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        Ok(PeerClient::new(channel).max_decoding_message_size(usize::MAX))
    }

    /// Sends a request to the current leader (possibly this member), retrying while the
    /// leadership moves, within the request timeout.
    pub(super) async fn to_leader(&self, req: Forward) -> Result<ForwardReply, StoreError> {
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

    /// Sends a request to the leader on the Raft stream to it (the connection AppendEntries
    /// use), so a follower's write or read index crosses no gRPC stack.
    pub(super) async fn send_forward(
        &self,
        leader: NodeId,
        req: &Forward,
        deadline: Instant,
    ) -> Result<ForwardReply, ForwardError> {
        let addr = self.peer_addr(leader).map_err(ForwardError::from)?;
        let data = bincode::serialize(req).map_err(|e| ForwardError::Unavailable(e.to_string()))?;
        let ttl = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(50));
        let propose = matches!(
            req,
            Forward::Propose(_) | Forward::ProposeMany(_) | Forward::Membership(_)
        );
        match self
            .network
            .link(&addr)
            .call(Kind::Forward, &data, ttl)
            .await
        {
            Ok((stream::ANSWERED, reply)) => {
                bincode::deserialize::<Result<ForwardReply, ForwardError>>(&reply)
                    .map_err(|e| ForwardError::Unavailable(e.to_string()))?
            }
            // The leader could not read the request (another rkube version): it was not served.
            Ok((_, why)) => Err(ForwardError::Unavailable(
                String::from_utf8_lossy(&why).into_owned(),
            )),
            Err(error) => {
                let failed = call_failed(&error, propose);
                if matches!(failed, ForwardError::Unavailable(_)) {
                    tracing::debug!(leader = format!("{leader:x}"), %error, "forwarded write lost");
                }
                Err(failed)
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
            Forward::ProposeMany(cmds) => self
                .propose_local_many(cmds)
                .await
                .map(ForwardReply::AppliedMany),
            Forward::ReadIndex => self.read_index().await.map(ForwardReply::ReadIndex),
            Forward::ReadIndexVouched { member, vote } => self
                .read_index_vouched(member, vote)
                .await
                .map(ForwardReply::ReadIndex),
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
}

/// What a forwarded request whose call to the leader failed comes to.
///
/// A request that never left can be sent again (to whoever leads by then). One whose
/// connection broke after it was written may or may not have reached the leader's log: only
/// a read can be retried safely; a write reports the ambiguity as etcd does.
fn call_failed(error: &CallError, propose: bool) -> ForwardError {
    match error {
        CallError::TimedOut { .. } => ForwardError::Timeout,
        CallError::Unreachable { .. } => ForwardError::NotLeader,
        CallError::Lost { .. } if !propose => ForwardError::NotLeader,
        // etcd's wording for a write that may or may not have been committed, which clients
        // know to check.
        CallError::Lost { .. } => {
            ForwardError::Unavailable("request timed out, possibly due to connection lost".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_forward_is_a_timeout_a_retry_elsewhere_or_a_lost_write() {
        let timed_out = "etcdserver: request timed out";
        let lost = "etcdserver: request timed out, possibly due to connection lost";
        let retry = "etcdserver: leader changed";
        let addr = || "127.0.0.1:1".to_string();
        let io = || std::io::Error::other("broken");
        // (case, error, a write, what the client is told)
        let cases = [
            (
                "no answer within the request's time",
                CallError::TimedOut {
                    addr: addr(),
                    ttl: Duration::from_secs(1),
                },
                true,
                timed_out,
            ),
            (
                "a write to a leader that is not listening",
                CallError::Unreachable {
                    addr: addr(),
                    source: io(),
                },
                true,
                retry,
            ),
            (
                "a write whose connection broke after it was sent",
                CallError::Lost {
                    addr: addr(),
                    source: io(),
                },
                true,
                lost,
            ),
            (
                "a read whose connection broke",
                CallError::Lost {
                    addr: addr(),
                    source: io(),
                },
                false,
                retry,
            ),
        ];
        for (case, error, propose, want) in cases {
            let got = StoreError::from(call_failed(&error, propose)).to_string();
            assert_eq!(got, want, "{case}");
        }
    }
}
