//! Commit notices: the AppendEntries without entries that openraft 0.9 sends a follower after
//! every commit, only to tell it the new commit index. It is answered at once when the
//! follower's last answer vouches for it, and its commit index goes to the follower a moment
//! later, unless an append carries it first.
//!
//! Why: openraft keeps one AppendEntries in flight per follower, and it sends this notice to
//! each follower right after each commit. A lone client's next write reaches the leader while
//! the notice is out, and its entries wait for the notice's round trip before they leave; each
//! notice also costs both sides a message to encrypt, decode and answer. etcd streams its
//! messages to a follower and never waits for such an answer. Measured (BENCHMARKS.md, "Commit
//! notices"): with this, put with 1 client +11% and the members' CPU per write -17%; with 16
//! clients +15% and -16%.
//!
//! Why answering it at once is safe: the answer openraft waits for says "the follower holds the
//! log up to `prev_log_id` and accepts this leader's vote". A notice is answered at once only
//! when a request of this same replication session, sent within the last `vouch` (the
//! heartbeat interval), was answered Success by the follower for the same vote and the same log
//! id. openraft takes such an answer as a match at `prev_log_id`, which it already holds, so no
//! commit is decided on it; the only other thing it updates is the time of the last quorum
//! acknowledgement, which rkube reads at the granularity of an election timeout (endpoint and
//! quorum-contact checks), and which is at most `vouch` early. A follower that has moved to a
//! higher vote answers the notice when it is sent, and that answer is returned to the next call,
//! which makes the leader step down. Heartbeats that carry no new commit index (the periodic
//! ones, the leadership checks of linearizable reads, which also use connections of their
//! own) always go to the follower and wait for its answer.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use openraft::error::{Infallible, RPCError, RaftError};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};

use super::{LogId, Member, NodeId, TypeConfig, Vote};

/// How long an answered notice's commit index waits for an append that carries it before it is
/// sent on its own. A lone client's next write reaches the leader well within it (a round trip
/// on the client connection and the leader's apply), so in steady traffic no notice is sent at
/// all; a follower that serves a read after a write learns the commit at most this much later.
pub const NOTICE_DELAY: Duration = Duration::from_millis(2);

type Request = AppendEntriesRequest<TypeConfig>;
type Response = AppendEntriesResponse<NodeId>;
/// The follower's answer to an AppendEntries, as openraft's network returns it.
pub type Answer = Result<Response, RPCError<NodeId, Member, RaftError<NodeId, Infallible>>>;

/// The follower's last Success.
#[derive(Clone)]
struct Confirmed {
    vote: Vote,
    /// The log id it confirmed it holds: the last entry of the request, or its `prev_log_id`.
    matching: Option<LogId>,
    /// When that request was sent.
    sent: Instant,
}

#[derive(Default)]
struct State {
    confirmed: Option<Confirmed>,
    /// The highest commit index a request sent to the follower carried.
    told: Option<LogId>,
    /// The newest answered notice whose commit index has not been sent yet.
    pending: Option<Request>,
    /// A task is waiting to send `pending`.
    armed: bool,
    /// The follower answered a notice sent on its own with a higher vote: the next call
    /// returns it.
    higher: Option<Vote>,
}

/// Commit notices of one replication session (one openraft network client).
#[derive(Clone)]
pub struct CommitNotices {
    vouch: Duration,
    state: Arc<Mutex<State>>,
}

/// What to do with an AppendEntries.
#[derive(Debug, PartialEq, Eq)]
pub enum Early {
    /// Send it and wait for the follower's answer.
    Send,
    /// Answer it with this at once. With `arm`, start [`CommitNotices::send_later`].
    Answer { response: Response, arm: bool },
}

impl CommitNotices {
    /// Notices answered at once when the follower's last Success came for a request sent within
    /// `vouch`; a zero `vouch` answers none.
    pub fn new(vouch: Duration) -> Self {
        CommitNotices {
            vouch,
            state: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `rpc` can be answered without the follower, and with what.
    pub fn early(&self, rpc: &Request, now: Instant) -> Early {
        let mut st = self.lock();
        if let Some(vote) = st.higher.take() {
            return Early::Answer {
                response: AppendEntriesResponse::HigherVote(vote),
                arm: false,
            };
        }
        let vouched = st.confirmed.as_ref().is_some_and(|c| {
            c.vote == rpc.vote
                && c.matching == rpc.prev_log_id
                && now.saturating_duration_since(c.sent) < self.vouch
        });
        if !(rpc.entries.is_empty() && rpc.leader_commit > st.told && vouched) {
            return Early::Send;
        }
        st.pending = Some(rpc.clone());
        let arm = !st.armed;
        st.armed = true;
        Early::Answer {
            response: AppendEntriesResponse::Success,
            arm,
        }
    }

    /// Sends `rpc` to the follower with `send`, and keeps what the answer vouches for.
    pub async fn exchange(&self, rpc: &Request, send: impl Future<Output = Answer>) -> Answer {
        self.sending(rpc);
        let sent = Instant::now();
        let answer = send.await;
        self.answered(rpc, sent, answer.as_ref().ok());
        answer
    }

    /// `rpc` is about to be sent.
    fn sending(&self, rpc: &Request) {
        let mut st = self.lock();
        if rpc.leader_commit > st.told {
            st.told = rpc.leader_commit;
        }
    }

    /// The follower's answer to `rpc`, sent at `sent` (`None`: no answer came).
    fn answered(&self, rpc: &Request, sent: Instant, answer: Option<&Response>) {
        let mut st = self.lock();
        let matching = match answer {
            Some(AppendEntriesResponse::Success) => {
                rpc.entries.last().map(|e| e.log_id).or(rpc.prev_log_id)
            }
            Some(AppendEntriesResponse::PartialSuccess(m)) => *m,
            Some(AppendEntriesResponse::HigherVote(v)) => {
                st.higher = Some(*v);
                st.confirmed = None;
                return;
            }
            Some(AppendEntriesResponse::Conflict) | None => {
                st.confirmed = None;
                return;
            }
        };
        // An answer to an older request (a notice sent on its own) does not replace a newer one.
        if st.confirmed.as_ref().is_some_and(|c| c.sent > sent) {
            return;
        }
        st.confirmed = Some(Confirmed {
            vote: rpc.vote,
            matching,
            sent,
        });
    }

    /// Waits [`NOTICE_DELAY`], then sends the newest answered notice with `send` unless a
    /// request sent since carried its commit index.
    pub async fn send_later<F, Fut>(self, send: F)
    where
        F: FnOnce(Request) -> Fut,
        Fut: Future<Output = Answer>,
    {
        tokio::time::sleep(NOTICE_DELAY).await;
        let rpc = {
            let mut st = self.lock();
            st.armed = false;
            match st.pending.take() {
                Some(rpc) if rpc.leader_commit > st.told => rpc,
                _ => return,
            }
        };
        let _ = self.exchange(&rpc, send(rpc.clone())).await;
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::raft::Entry;

    const VOUCH: Duration = Duration::from_millis(100);

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn vote(term: u64) -> Vote {
        Vote::new_committed(term, 1)
    }

    fn append(term: u64, prev: u64, upto: u64, commit: u64) -> Request {
        Request {
            vote: vote(term),
            prev_log_id: Some(log_id(term, prev)),
            entries: (prev + 1..=upto)
                .map(|i| Entry {
                    log_id: log_id(term, i),
                    payload: EntryPayload::Blank,
                })
                .collect(),
            leader_commit: Some(log_id(term, commit)),
        }
    }

    fn answer(arm: bool) -> Early {
        Early::Answer {
            response: AppendEntriesResponse::Success,
            arm,
        }
    }

    /// An append of entries 1..=5 sent at `t` and answered Success, committing up to 4.
    fn confirmed_at(t: Instant) -> CommitNotices {
        let n = CommitNotices::new(VOUCH);
        let a = append(1, 0, 5, 4);
        n.sending(&a);
        n.answered(&a, t, Some(&AppendEntriesResponse::Success));
        n
    }

    #[test]
    fn a_notice_of_a_new_commit_at_the_confirmed_log_is_answered_at_once_once_armed() {
        let t = Instant::now();
        let n = confirmed_at(t);
        assert_eq!(n.early(&append(1, 5, 5, 5), t), answer(true));
        // A second before the first is sent: answered, no second task.
        assert_eq!(n.early(&append(1, 5, 5, 5), t), answer(false));
    }

    #[test]
    fn what_the_follower_has_not_vouched_for_goes_to_the_follower() {
        let t = Instant::now();
        // Entries.
        assert_eq!(confirmed_at(t).early(&append(1, 5, 6, 5), t), Early::Send);
        // No new commit index (a periodic heartbeat): 4 was sent already.
        assert_eq!(confirmed_at(t).early(&append(1, 5, 5, 4), t), Early::Send);
        // Another log id than the confirmed one.
        assert_eq!(confirmed_at(t).early(&append(1, 4, 4, 5), t), Early::Send);
        // Another vote.
        assert_eq!(confirmed_at(t).early(&append(2, 5, 5, 5), t), Early::Send);
        // The confirmation is as old as the vouch.
        assert_eq!(
            confirmed_at(t).early(&append(1, 5, 5, 5), t + VOUCH),
            Early::Send
        );
        // Nothing confirmed, or a zero vouch.
        assert_eq!(
            CommitNotices::new(VOUCH).early(&append(1, 5, 5, 5), t),
            Early::Send
        );
        let zero = CommitNotices::new(Duration::ZERO);
        let a = append(1, 0, 5, 4);
        zero.answered(&a, t, Some(&AppendEntriesResponse::Success));
        assert_eq!(zero.early(&append(1, 5, 5, 5), t), Early::Send);
    }

    #[test]
    fn a_refusal_or_a_lost_answer_ends_the_vouching_and_a_higher_vote_is_returned_next() {
        let t = Instant::now();
        let hb = append(1, 5, 5, 5);
        for refusal in [None, Some(AppendEntriesResponse::Conflict)] {
            let n = confirmed_at(t);
            n.answered(&append(1, 5, 5, 4), t, refusal.as_ref());
            assert_eq!(n.early(&hb, t), Early::Send);
        }
        let n = confirmed_at(t);
        n.answered(&hb, t, Some(&AppendEntriesResponse::HigherVote(vote(3))));
        let higher = Early::Answer {
            response: AppendEntriesResponse::HigherVote(vote(3)),
            arm: false,
        };
        assert_eq!(n.early(&append(1, 5, 9, 5), t), higher);
        assert_eq!(n.early(&hb, t), Early::Send, "returned once");
    }

    #[test]
    fn an_older_answer_does_not_replace_a_newer_confirmation() {
        let t = Instant::now();
        let n = confirmed_at(t);
        let later = append(1, 5, 8, 5);
        n.sending(&later);
        n.answered(
            &later,
            t + Duration::from_millis(1),
            Some(&AppendEntriesResponse::Success),
        );
        // The notice sent before the append answers after it.
        n.answered(
            &append(1, 5, 5, 5),
            t,
            Some(&AppendEntriesResponse::Success),
        );
        assert_eq!(
            n.early(&append(1, 8, 8, 6), t + Duration::from_millis(2)),
            answer(true)
        );
    }

    #[tokio::test]
    async fn the_commit_index_is_sent_later_unless_a_request_carried_it() {
        let t = Instant::now();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let send = |rpc: Request| {
            let sent = sent.clone();
            async move {
                sent.lock().unwrap().push(rpc.leader_commit);
                Ok(AppendEntriesResponse::Success)
            }
        };
        // Two notices, one task: it sends the newer.
        let n = confirmed_at(t);
        assert_eq!(n.early(&append(1, 5, 5, 5), t), answer(true));
        assert_eq!(n.early(&append(1, 5, 5, 6), t), answer(false));
        n.clone().send_later(send).await;
        assert_eq!(*sent.lock().unwrap(), vec![Some(log_id(1, 6))]);
        // Its answer vouches again: the next notice is answered at once.
        assert_eq!(n.early(&append(1, 5, 5, 7), Instant::now()), answer(true));

        // An append that carried the commit index first: nothing is sent.
        sent.lock().unwrap().clear();
        let n = confirmed_at(t);
        assert_eq!(n.early(&append(1, 5, 5, 5), t), answer(true));
        n.sending(&append(1, 5, 6, 5));
        n.clone().send_later(send).await;
        assert!(sent.lock().unwrap().is_empty());
    }
}
