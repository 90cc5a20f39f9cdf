//! Elections: when a member campaigns, and the PreVote round that comes first.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::ServerState;

use super::node::{Forward, ForwardReply, Node};
use crate::proto::peer::Payload;
use crate::raft::{LogId, NodeId};

impl Node {
    /// Campaigns when the leader has been silent too long; this is the member's only elector
    /// (openraft's own election tick is off, see `server::start`). A follower campaigns once
    /// its vote was last renewed by a leader more than the leader's lease
    /// (`election_timeout_max`) plus a random timeout in [`election_timeout_min`,
    /// `election_timeout_max`) ago: 1.0-1.2 times `--election-timeout`. Only a candidacy this
    /// process started retries after the random timeout alone.
    ///
    /// openraft would campaign after the random timeout alone whenever the vote is not
    /// committed, and a vote read from disk is not (`log_store::read_vote`): a member that
    /// started, or restarted, half a second after the others then campaigned before the
    /// leader's first AppendEntries reached it (openraft waits 500 ms after a peer refused a
    /// connection) and, with its higher term, deposed the leader. Split votes through term 11
    /// at cluster start came from that.
    ///
    /// Before it campaigns a member asks the other voters whether they would vote for it
    /// (PreVote, as etcd's `--pre-vote`): only with a majority's yes does it raise its term.
    /// A member with a shorter log, or cut off from the others, so never raises its term and
    /// never deposes a leader the majority still hears.
    pub async fn watch_leader(
        self: Arc<Self>,
        every: Duration,
        stopped: impl std::future::Future<Output = ()>,
    ) {
        use rand::Rng;
        let (min, max) = {
            let c = self.raft.config();
            (
                c.election_timeout_min,
                c.election_timeout_max.max(c.election_timeout_min + 1),
            )
        };
        let id = self.id;
        let mut renewed = None;
        let mut timeout = Duration::ZERO;
        // The term of the vote this process started with: a vote of this member's own at a
        // higher term comes from a candidacy of this process.
        let mut started_term = None;
        // After a lost PreVote, the next one waits for another random timeout.
        let mut retry_at: Option<Instant> = None;
        tokio::pin!(stopped);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                _ = tick.tick() => {}
            }
            if !self.elections.load(Ordering::Acquire) {
                continue;
            }
            let Ok((voters, leader, vote, utime)) = self
                .raft
                .with_raft_state(|st| {
                    (
                        st.membership_state
                            .effective()
                            .voter_ids()
                            .collect::<Vec<NodeId>>(),
                        st.server_state == ServerState::Leader,
                        *st.vote_ref(),
                        st.vote_last_modified(),
                    )
                })
                .await
            else {
                return;
            };
            let voter = voters.contains(&id);
            let others = voters.into_iter().filter(|v| *v != id).collect::<Vec<_>>();
            let term = vote.leader_id().get_term();
            let started_term = *started_term.get_or_insert(term);
            let Some(utime) = utime else { continue };
            if !voter || leader {
                continue;
            }
            if renewed != Some(utime) {
                renewed = Some(utime);
                timeout = Duration::from_millis(rand::thread_rng().gen_range(min..max));
                retry_at = None;
            }
            if retry_at.is_some_and(|at| Instant::now() < at) {
                continue;
            }
            let limit = campaign_after(
                id,
                others.len() + 1,
                &vote,
                started_term,
                Duration::from_millis(max),
                timeout,
            );
            if utime.elapsed() > limit {
                tracing::debug!(
                    silent_ms = utime.elapsed().as_millis() as u64,
                    "no word from a leader within the election timeout: campaigning"
                );
                if !self.pre_vote(&others, self.wal.state().1).await {
                    tracing::debug!(
                        "pre-vote lost: a majority still hears a leader or holds a longer log"
                    );
                    let wait = rand::thread_rng().gen_range(min..max);
                    retry_at = Some(Instant::now() + Duration::from_millis(wait));
                    continue;
                }
                if self.raft.trigger().elect().await.is_err() {
                    return;
                }
            }
        }
    }

    /// Asks the other voters whether they would vote for this member with its log ending at
    /// `last_log`; true with a majority's yes (this member's own included). A voter of an
    /// older rkube that cannot read the question counts as a yes: it would have voted on the
    /// real request anyway.
    async fn pre_vote(&self, others: &[NodeId], last_log: Option<LogId>) -> bool {
        if others.is_empty() {
            return true;
        }
        let budget = Duration::from_millis(self.raft.config().election_timeout_min);
        // Encoding a log id does not fail; were it to, the member campaigns as it would
        // without PreVote rather than never again.
        let Ok(data) = bincode::serialize(&Forward::PreVote { last_log }) else {
            return true;
        };
        let asks = others.iter().map(|&peer| {
            let data = data.clone();
            async move {
                let Ok(mut client) = self.peer(peer) else {
                    return false;
                };
                let mut request = tonic::Request::new(Payload { data });
                request.set_timeout(budget);
                match tokio::time::timeout(budget, client.forward(request)).await {
                    Ok(Ok(reply)) => matches!(
                        bincode::deserialize::<Result<ForwardReply, super::node::ForwardError>>(
                            &reply.into_inner().data
                        ),
                        Ok(Ok(ForwardReply::PreVote { granted: true }))
                    ),
                    Ok(Err(status)) => status.code() == tonic::Code::InvalidArgument,
                    Err(_) => false,
                }
            }
        });
        let yes = futures::future::join_all(asks)
            .await
            .into_iter()
            .filter(|granted| *granted)
            .count();
        (yes + 1) * 2 > others.len() + 1
    }

    /// Whether this member would vote for a candidate whose log ends at `last_log`: it is not
    /// the leader, no leader's word reached it within the leader's lease, and the candidate's
    /// log is at least as long as its own — openraft's own conditions for a vote.
    pub(super) async fn grants_pre_vote(&self, last_log: Option<LogId>) -> bool {
        let lease = Duration::from_millis(self.raft.config().election_timeout_max);
        let mine = self.wal.state().1;
        let Ok((leader, vote, utime)) = self
            .raft
            .with_raft_state(|st| {
                (
                    st.server_state == ServerState::Leader,
                    *st.vote_ref(),
                    st.vote_last_modified(),
                )
            })
            .await
        else {
            return false;
        };
        let hears_a_leader = vote.is_committed() && utime.is_some_and(|at| at.elapsed() <= lease);
        !leader && !hears_a_leader && last_log >= mine
    }

    pub(super) fn allow_elections(&self, on: bool) {
        self.elections.store(on, Ordering::Release);
    }
}

/// How long a voter waits without a leader's word before it campaigns, given its vote, the
/// term of the vote it started with, the leader's lease and its random timeout. A candidacy
/// this process started (its own uncommitted vote at a higher term than it started with)
/// retries after the random timeout; the only voter campaigns at once; every other member —
/// a follower, one that voted for another candidate, one that just started or restarted with
/// the vote read from disk — first lets a leader's lease run out.
fn campaign_after(
    id: NodeId,
    voters: usize,
    vote: &openraft::Vote<NodeId>,
    started_term: u64,
    lease: Duration,
    timeout: Duration,
) -> Duration {
    let own_candidacy = !vote.is_committed()
        && vote.leader_id().voted_for() == Some(id)
        && vote.leader_id().get_term() > started_term;
    if own_candidacy {
        timeout
    } else if voters == 1 {
        Duration::ZERO
    } else {
        lease + timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_candidacy_of_this_process_campaigns_before_a_lease_runs_out() {
        let (me, other) = (1, 2);
        let (lease, timeout) = (Duration::from_millis(600), Duration::from_millis(450));
        let waits = |vote: openraft::Vote<NodeId>, started_term, voters| {
            campaign_after(me, voters, &vote, started_term, lease, timeout)
        };
        // Restarted: the vote read from disk is not committed (`log_store::read_vote`), and
        // the leader's first AppendEntries may be half a second away.
        assert_eq!(waits(openraft::Vote::new(3, other), 3, 3), lease + timeout);
        assert_eq!(waits(openraft::Vote::new(3, me), 3, 3), lease + timeout);
        // Fresh: no vote yet.
        assert_eq!(waits(openraft::Vote::default(), 0, 3), lease + timeout);
        // Following a leader, or having voted for another candidate this term.
        assert_eq!(
            waits(openraft::Vote::new_committed(4, other), 3, 3),
            lease + timeout
        );
        assert_eq!(waits(openraft::Vote::new(4, other), 3, 3), lease + timeout);
        // A candidacy of this process that did not win retries after its random timeout.
        assert_eq!(waits(openraft::Vote::new(4, me), 3, 3), timeout);
        // The only voter needs nobody's vote.
        assert_eq!(waits(openraft::Vote::new(3, me), 3, 1), Duration::ZERO);
    }
}
