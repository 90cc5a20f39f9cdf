//! Read-index rounds shared by concurrent linearizable reads, as etcd's read loop shares them:
//! one round to the leader (which confirms its leadership with a quorum) answers every read that
//! arrived before the round was sent. A read that arrives while a round is in flight waits for
//! the next one, whose index is then at least the commit index at its arrival — what
//! linearizability needs. Without it every read costs the leader one heartbeat round to all
//! followers.
//!
//! No task of its own: the first caller drives rounds while others wait, and hands the turn to
//! a waiter when its own round is done. A turn dropped while held — its driver's caller went
//! away (a client that hung up), or it was handed to a waiter whose caller went away before it
//! looked — drops the waiters' answers, and they ask again, so no read waits on a driver that is
//! gone.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::error::StoreError;

enum Answer {
    Index(Result<u64, Shared>),
    /// The previous driver finished its own round: this waiter drives the next one.
    Drive(Driving),
}

#[derive(Default)]
struct State {
    waiting: Vec<oneshot::Sender<Answer>>,
    driving: bool,
}

#[derive(Default)]
pub struct ReadRounds {
    state: Arc<Mutex<State>>,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The turn to drive rounds. Dropped while still held — its driver's caller went away, or it
/// was handed to a waiter whose caller went away before it looked — it ends the turn and tells
/// the waiters to ask again, so that one of them drives; no read waits on a driver that is gone.
struct Driving {
    state: Arc<Mutex<State>>,
    held: bool,
}

impl Driving {
    /// Ends the turn with nobody waiting.
    fn finish(mut self, s: &mut State) {
        s.driving = false;
        self.held = false;
    }
}

impl Drop for Driving {
    fn drop(&mut self) {
        if self.held {
            let mut s = lock(&self.state);
            s.driving = false;
            s.waiting.clear();
        }
    }
}

impl ReadRounds {
    /// The read index for a read that arrives now, from `round` (one read-index request to the
    /// leader) shared with the reads that arrive while the last round is still out.
    pub async fn index<F, Fut>(&self, round: F) -> Result<u64, StoreError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<u64, StoreError>>,
    {
        loop {
            let (tx, rx) = oneshot::channel();
            let turn = {
                let mut s = lock(&self.state);
                if s.driving {
                    s.waiting.push(tx);
                    None
                } else {
                    s.driving = true;
                    Some(Driving {
                        state: self.state.clone(),
                        held: true,
                    })
                }
            };
            let mut driving = match turn {
                Some(d) => d,
                None => match rx.await {
                    Ok(Answer::Index(r)) => return r.map_err(Shared::into_error),
                    Ok(Answer::Drive(d)) => d,
                    // The driver's caller went away: ask again.
                    Err(_) => continue,
                },
            };
            // Everyone waiting now arrived before this round is sent.
            let batch = std::mem::take(&mut lock(&self.state).waiting);
            let result = round().await;
            let shared = result.as_ref().map(|i| *i).map_err(Shared::from_error);
            for tx in batch {
                let _ = tx.send(Answer::Index(shared.clone()));
            }
            // Hand the next round to a waiter, if any; the first one still listening drives it.
            let mut s = lock(&self.state);
            while let Some(next) = s.waiting.pop() {
                match next.send(Answer::Drive(driving)) {
                    Ok(()) => return result,
                    Err(Answer::Drive(back)) => driving = back,
                    // Not what was sent; the turn it carried was dropped, which ends it.
                    Err(Answer::Index(_)) => return result,
                }
            }
            driving.finish(&mut s);
            return result;
        }
    }
}

/// The driver's error as the other readers of its round get it.
#[derive(Clone)]
enum Shared {
    Timeout,
    Stopped,
    Unavailable(String),
}

impl Shared {
    fn from_error(e: &StoreError) -> Self {
        match e {
            StoreError::Timeout => Shared::Timeout,
            StoreError::Stopped => Shared::Stopped,
            StoreError::Unavailable(s) => Shared::Unavailable(s.clone()),
            other => Shared::Unavailable(
                other
                    .to_string()
                    .trim_start_matches("etcdserver: ")
                    .to_string(),
            ),
        }
    }

    fn into_error(self) -> StoreError {
        match self {
            Shared::Timeout => StoreError::Timeout,
            Shared::Stopped => StoreError::Stopped,
            Shared::Unavailable(s) => StoreError::Unavailable(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// Reads that arrive while a round is out share the next round; none shares a round that
    /// was sent before it arrived.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_reads_share_rounds_sent_after_they_arrive() {
        let rounds = Arc::new(ReadRounds::default());
        let sent = Arc::new(AtomicU64::new(0));
        let commit = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let (rounds, sent, commit) = (rounds.clone(), sent.clone(), commit.clone());
            tasks.push(tokio::spawn(async move {
                // The commit index when this read arrived: its answer must not be older.
                let arrived = commit.fetch_add(1, Ordering::SeqCst) + 1;
                let index = rounds
                    .index(|| async {
                        sent.fetch_add(1, Ordering::SeqCst);
                        let at = commit.load(Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok(at)
                    })
                    .await
                    .unwrap();
                assert!(
                    index >= arrived,
                    "index {index} older than arrival {arrived}"
                );
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let sent = sent.load(Ordering::SeqCst);
        assert!(sent < 64, "64 concurrent reads took {sent} rounds");
    }

    /// A driver whose caller goes away mid-round leaves nobody waiting forever.
    #[tokio::test]
    async fn a_driver_that_goes_away_hands_its_waiters_a_new_round() {
        let rounds = Arc::new(ReadRounds::default());
        let stuck = {
            let rounds = rounds.clone();
            tokio::spawn(async move {
                rounds
                    .index(std::future::pending::<Result<u64, StoreError>>)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let waiter = {
            let rounds = rounds.clone();
            tokio::spawn(async move { rounds.index(|| async { Ok(7) }).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        stuck.abort();
        let got = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter is answered")
            .unwrap();
        assert_eq!(got.unwrap(), 7);
    }

    /// A waiter handed the next round whose caller goes away before it looks does not leave the
    /// rounds without a driver (seen in a chaos campaign: a member's linearizable reads hung for
    /// good after clients gave up on it during a pause).
    #[tokio::test]
    async fn a_turn_handed_to_a_waiter_that_went_away_is_not_lost() {
        let rounds = Arc::new(ReadRounds::default());
        let release = Arc::new(tokio::sync::Notify::new());
        let driver = {
            let (rounds, release) = (rounds.clone(), release.clone());
            tokio::spawn(async move {
                rounds
                    .index(|| async {
                        release.notified().await;
                        Ok(1)
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut waiter = Box::pin(rounds.index(|| async { Ok(2) }));
        assert!(futures::poll!(&mut waiter).is_pending(), "the waiter waits");
        release.notify_one();
        assert_eq!(driver.await.unwrap().unwrap(), 1);
        // The driver handed its turn to the waiter, which goes away without looking.
        drop(waiter);
        let next = tokio::time::timeout(Duration::from_secs(10), rounds.index(|| async { Ok(3) }))
            .await
            .expect("a later read is answered");
        assert_eq!(next.unwrap(), 3);
    }

    /// An error reaches every reader of the round.
    #[tokio::test]
    async fn every_reader_of_a_failed_round_gets_the_error() {
        let rounds = ReadRounds::default();
        let (a, b) = tokio::join!(
            rounds.index(|| async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Err(StoreError::Unavailable("no leader".into()))
            }),
            rounds.index(|| async { Err(StoreError::Unavailable("no leader".into())) }),
        );
        assert!(a.unwrap_err().to_string().contains("no leader"));
        assert!(b.unwrap_err().to_string().contains("no leader"));
    }
}
