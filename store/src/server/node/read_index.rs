//! Linearizable reads: the read index (the commit index once a quorum has confirmed this
//! leadership), and the barrier a read waits at until this member has applied up to it.
//!
//! A follower's read vouches for the leadership it is sent to. The follower reads its own vote
//! in its Raft core after the read arrived and sends it with the request. If the leader's vote
//! is the same, the follower had accepted no later term at a moment after the read began.
//! When the leader and that follower make a majority of the voters (a cluster of two or three),
//! no other leader can have committed anything before the read began: its quorum would need one
//! of the two, and terms only grow. The leader's commit index is then the read index, with no
//! heartbeat round; it must be of the leader's own term, so that it covers every entry that
//! earlier leaders committed. In any other case the leader confirms with a heartbeat round, as
//! it does for reads that arrive at the leader. etcd 3.4 always takes the round (`ReadOnlySafe`).

use std::time::{Duration, Instant};

use openraft::error::{CheckIsLeaderError, RaftError};
use openraft::ServerState;

use super::{Forward, ForwardError, ForwardReply, Node};
use crate::error::StoreError;
use crate::raft::{LogId, NodeId, Vote};

impl Node {
    /// The read index: the commit index once a quorum has confirmed this leadership. One round
    /// of confirmation may miss a quorum that is only slow (it waits one heartbeat interval), so
    /// rounds repeat until the request timeout; a leader cut off from its quorum fails earlier
    /// through `check_quorum_contact`.
    pub(super) async fn read_index(&self) -> Result<u64, ForwardError> {
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

    /// The read index for a read that voter `member` vouched for with `vote` (see the module's
    /// header): the commit index at once when that is enough, a heartbeat round otherwise.
    pub(super) async fn read_index_vouched(
        &self,
        member: NodeId,
        vote: Vote,
    ) -> Result<u64, ForwardError> {
        let me = self.id;
        let vouched = self
            .raft
            .with_raft_state(move |st| {
                let membership = st.membership_state.effective().membership();
                vouched_read_index(&Leadership {
                    me,
                    is_leader: st.server_state == ServerState::Leader,
                    vote: st.vote_ref(),
                    committed: st.committed.as_ref(),
                    voters: membership.get_joint_config(),
                    member,
                    member_vote: &vote,
                })
            })
            .await
            .ok()
            .flatten();
        match vouched {
            Some(index) => Ok(index),
            None => self.read_index().await,
        }
    }

    /// This member's request for a read index: on a follower, vouched for by its own vote,
    /// read in its Raft core now (a vote in the metrics may lag a term behind). A leader serves
    /// its own request with the heartbeat round, so it reads no vote.
    async fn read_index_request(&self) -> Forward {
        if self.is_leader() {
            return Forward::ReadIndex;
        }
        match self.raft.with_raft_state(|st| *st.vote_ref()).await {
            Ok(vote) => Forward::ReadIndexVouched {
                member: self.id,
                vote,
            },
            Err(_) => Forward::ReadIndex,
        }
    }

    /// Returns once this member has applied everything committed before the call: the
    /// read-index protocol (the leader confirms its leadership with a quorum), in rounds that
    /// concurrent reads share (`ReadRounds`).
    pub async fn linearizable_barrier(&self) -> Result<(), StoreError> {
        let index = self
            .read_rounds
            .index(|| async {
                let request = self.read_index_request().await;
                match self.to_leader(request).await? {
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
}

/// What the leader knows when a voter's vouched read index arrives.
struct Leadership<'a> {
    me: NodeId,
    is_leader: bool,
    vote: &'a Vote,
    committed: Option<&'a LogId>,
    /// The voters of each configuration in force (two during a joint change).
    voters: &'a [std::collections::BTreeSet<NodeId>],
    member: NodeId,
    member_vote: &'a Vote,
}

/// The read index without a heartbeat round, when the vouching member's vote is this
/// leadership's and the two of them are a majority of the voters (the module's header says why
/// that is enough); `None` when a heartbeat round must confirm the leadership.
fn vouched_read_index(l: &Leadership<'_>) -> Option<u64> {
    let own = l.is_leader
        && l.vote.is_committed()
        && l.vote.leader_id().voted_for() == Some(l.me)
        && l.member_vote == l.vote
        && l.member != l.me;
    // The commit index covers what earlier leaders committed only once an entry of this term
    // is committed.
    let committed = l.committed.filter(|c| c.leader_id == *l.vote.leader_id())?;
    let majority = match l.voters {
        [voters] => voters.contains(&l.me) && voters.contains(&l.member) && 2 * 2 > voters.len(),
        _ => false,
    };
    (own && majority).then_some(committed.index)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use openraft::CommittedLeaderId;

    use super::*;

    fn committed_vote(term: u64, leader: NodeId) -> Vote {
        Vote::new_committed(term, leader)
    }

    fn log_id(term: u64, leader: NodeId, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, leader), index)
    }

    struct Case {
        is_leader: bool,
        vote: Vote,
        committed: Option<LogId>,
        voters: Vec<BTreeSet<NodeId>>,
        member: NodeId,
        member_vote: Vote,
    }

    impl Case {
        /// Member 1 leads term 5 of {1, 2, 3} with index 40 committed in its term; member 2
        /// vouches with the same vote.
        fn vouched() -> Case {
            Case {
                is_leader: true,
                vote: committed_vote(5, 1),
                committed: Some(log_id(5, 1, 40)),
                voters: vec![BTreeSet::from([1, 2, 3])],
                member: 2,
                member_vote: committed_vote(5, 1),
            }
        }

        fn index(&self) -> Option<u64> {
            vouched_read_index(&Leadership {
                me: 1,
                is_leader: self.is_leader,
                vote: &self.vote,
                committed: self.committed.as_ref(),
                voters: &self.voters,
                member: self.member,
                member_vote: &self.member_vote,
            })
        }
    }

    #[test]
    fn a_voter_with_the_leaders_vote_in_a_cluster_of_three_needs_no_heartbeat_round() {
        assert_eq!(Case::vouched().index(), Some(40));
        let two = Case {
            voters: vec![BTreeSet::from([1, 2])],
            ..Case::vouched()
        };
        assert_eq!(two.index(), Some(40));
    }

    #[test]
    fn anything_short_of_a_majority_sharing_this_leadership_takes_the_heartbeat_round() {
        let cases = [
            (
                "not leader",
                Case {
                    is_leader: false,
                    ..Case::vouched()
                },
            ),
            (
                "the member is in a later term",
                Case {
                    member_vote: committed_vote(6, 3),
                    ..Case::vouched()
                },
            ),
            (
                "the member follows an earlier leadership",
                Case {
                    member_vote: committed_vote(4, 3),
                    ..Case::vouched()
                },
            ),
            (
                "the member only voted, not yet accepted the leader",
                Case {
                    member_vote: Vote::new(5, 1),
                    ..Case::vouched()
                },
            ),
            (
                "this member's vote is not committed",
                Case {
                    vote: Vote::new(5, 1),
                    member_vote: Vote::new(5, 1),
                    ..Case::vouched()
                },
            ),
            (
                "the vote is another member's",
                Case {
                    vote: committed_vote(5, 3),
                    member_vote: committed_vote(5, 3),
                    ..Case::vouched()
                },
            ),
            (
                "the member is the leader itself",
                Case {
                    member: 1,
                    ..Case::vouched()
                },
            ),
            (
                "nothing of this term committed yet",
                Case {
                    committed: Some(log_id(4, 3, 39)),
                    ..Case::vouched()
                },
            ),
            (
                "nothing committed at all",
                Case {
                    committed: None,
                    ..Case::vouched()
                },
            ),
            (
                "five voters: two are no majority",
                Case {
                    voters: vec![BTreeSet::from([1, 2, 3, 4, 5])],
                    ..Case::vouched()
                },
            ),
            (
                "four voters: two are no majority",
                Case {
                    voters: vec![BTreeSet::from([1, 2, 3, 4])],
                    ..Case::vouched()
                },
            ),
            (
                "the member is a learner",
                Case {
                    member: 4,
                    member_vote: committed_vote(5, 1),
                    ..Case::vouched()
                },
            ),
            (
                "a joint configuration",
                Case {
                    voters: vec![BTreeSet::from([1, 2, 3]), BTreeSet::from([1, 2, 4])],
                    ..Case::vouched()
                },
            ),
        ];
        for (case, c) in cases {
            assert_eq!(c.index(), None, "{case}");
        }
    }
}
