//! Group commit: commands proposed at the same time travel together, so that one message (and,
//! on the leader, one log entry, [`Command::Batch`], with one fsync and one replication round)
//! serves them all. The leader batches what it proposes to Raft; a follower batches what it
//! forwards to the leader, so that one frame each way on the Raft stream carries many writes.
//!
//! No task of its own while a member is idle: a caller that finds fewer than `in_flight`
//! batches out sends its own commands itself, without a thread hop. Callers that find them all
//! out queue; when a batch comes back, the next one takes everything queued (up to a size bound)
//! and is sent by a spawned task, so that no caller's cancellation (a client that hung up) can
//! drop the answers of the others in its batch.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::oneshot;

use super::node::ForwardError;
use crate::mvcc::{Applied, Command, Output};
use crate::raft::Raft;

/// Most commands in one batch (one caller's commands may exceed it alone).
const MAX_COMMANDS: usize = 512;
/// Most encoded bytes in one batch (one caller's commands may exceed it alone).
const MAX_BYTES: u64 = 4 * 1024 * 1024;

/// What a batch's commands produced, in order; or why none of them has an answer.
pub type Results = Result<Vec<Applied>, ForwardError>;
type Reply = oneshot::Sender<Results>;

#[derive(Default)]
struct State {
    /// Callers waiting for a batch to take their commands.
    queue: Vec<(Vec<Command>, Reply)>,
    /// Batches out.
    sending: usize,
}

pub struct Batcher {
    state: Arc<Mutex<State>>,
    in_flight: usize,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

fn stopped() -> ForwardError {
    ForwardError::Unavailable("server stopped".into())
}

impl Batcher {
    /// A batcher with at most `in_flight` batches out at once.
    pub fn new(in_flight: usize) -> Self {
        Self {
            state: Arc::default(),
            in_flight: in_flight.max(1),
        }
    }

    /// Sends `cmds` with `send` (together with the commands of callers that queue meanwhile)
    /// and returns what they produced, one result per command.
    pub async fn propose<S, F>(&self, cmds: Vec<Command>, send: S) -> Results
    where
        S: Fn(Vec<Command>) -> F + Send + Sync + 'static,
        F: Future<Output = Results> + Send + 'static,
    {
        let turn = {
            let mut s = lock(&self.state);
            if s.sending >= self.in_flight {
                let (tx, rx) = oneshot::channel();
                s.queue.push((cmds, tx));
                Turn::Queued(rx)
            } else {
                // Nothing is queued while fewer batches than allowed are out: a batch that
                // comes back takes the queue before it gives up its place.
                s.sending += 1;
                Turn::Send(cmds)
            }
        };
        let cmds = match turn {
            Turn::Queued(rx) => return rx.await.unwrap_or_else(|_| Err(stopped())),
            Turn::Send(cmds) => cmds,
        };
        let n = cmds.len();
        let sent = send(cmds);
        let place = Place {
            state: self.state.clone(),
            send: Some(send),
            sends: PhantomData,
        };
        let results = sent.await;
        drop(place);
        counted(results, n)
    }
}

/// `results`, or an error when they are not one per command of the `n` sent.
fn counted(results: Results, n: usize) -> Results {
    match results {
        Ok(r) if r.len() != n => Err(ForwardError::Unavailable(format!(
            "{} results for {n} commands",
            r.len()
        ))),
        other => other,
    }
}

enum Turn {
    /// Queued: a batch sent for others takes these commands; this is its answer.
    Queued(oneshot::Receiver<Results>),
    /// A place among the batches out: the caller sends its own commands.
    Send(Vec<Command>),
}

type Batch = Vec<(Vec<Command>, Reply)>;

/// A batch's place among those out. Given up when dropped (its batch came back, or its caller
/// went away): if callers queued meanwhile, a task of its own sends their batch in this place,
/// and those queued after it; it keeps going whoever stops waiting.
struct Place<S, F>
where
    S: Fn(Vec<Command>) -> F + Send + Sync + 'static,
    F: Future<Output = Results> + Send + 'static,
{
    state: Arc<Mutex<State>>,
    send: Option<S>,
    sends: PhantomData<fn() -> F>,
}

impl<S, F> Drop for Place<S, F>
where
    S: Fn(Vec<Command>) -> F + Send + Sync + 'static,
    F: Future<Output = Results> + Send + 'static,
{
    fn drop(&mut self) {
        let Some(batch) = next_batch(&mut lock(&self.state)) else {
            return;
        };
        match (self.send.take(), tokio::runtime::Handle::try_current()) {
            (Some(send), Ok(rt)) => drop(rt.spawn(send_queued(self.state.clone(), send, batch))),
            // No runtime to send on (shutting down): the queued callers are told so.
            _ => {
                lock(&self.state).sending -= 1;
                for (_, reply) in batch {
                    let _ = reply.send(Err(stopped()));
                }
            }
        }
    }
}

/// The queued callers' commands, up to the size bounds, or None (and one place fewer out)
/// when nobody is queued.
fn next_batch(s: &mut State) -> Option<Batch> {
    if s.queue.is_empty() {
        s.sending -= 1;
        return None;
    }
    let (mut commands, mut bytes, mut taken) = (0usize, 0u64, 0usize);
    for (cmds, _) in &s.queue {
        let size: u64 = cmds
            .iter()
            .map(|c| bincode::serialized_size(c).unwrap_or(0))
            .sum();
        if taken > 0 && (commands + cmds.len() > MAX_COMMANDS || bytes + size > MAX_BYTES) {
            break;
        }
        commands += cmds.len();
        bytes += size;
        taken += 1;
    }
    let rest = s.queue.split_off(taken);
    Some(std::mem::replace(&mut s.queue, rest))
}

/// Sends queued batches until nobody is queued.
async fn send_queued<S, F>(state: Arc<Mutex<State>>, send: S, mut batch: Batch)
where
    S: Fn(Vec<Command>) -> F + Send + Sync + 'static,
    F: Future<Output = Results> + Send + 'static,
{
    loop {
        let mut sizes = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        let mut cmds = Vec::new();
        for (c, reply) in batch {
            sizes.push(c.len());
            cmds.extend(c);
            replies.push(reply);
        }
        let n = cmds.len();
        match counted(send(cmds).await, n) {
            Ok(results) => {
                let mut results = results.into_iter();
                for (size, reply) in sizes.into_iter().zip(replies) {
                    let _ = reply.send(Ok(results.by_ref().take(size).collect()));
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
        match next_batch(&mut lock(&state)) {
            Some(next) => batch = next,
            None => return,
        }
    }
}

/// The leader's send: one Raft proposal of the commands (as one [`Command::Batch`] entry when
/// there are several), bounded by the request timeout.
pub fn to_raft(
    raft: Raft,
    timeout: std::time::Duration,
) -> impl Fn(Vec<Command>) -> std::pin::Pin<Box<dyn Future<Output = Results> + Send>>
       + Send
       + Sync
       + 'static {
    move |mut cmds: Vec<Command>| {
        let raft = raft.clone();
        Box::pin(async move {
            if cmds.len() == 1 {
                if let Some(cmd) = cmds.pop() {
                    return write(&raft, timeout, cmd).await.map(|a| vec![a]);
                }
            }
            let n = cmds.len();
            match write(&raft, timeout, Command::Batch(cmds)).await? {
                Applied {
                    output: Ok(Output::Batch(results)),
                    ..
                } if results.len() == n => Ok(results),
                other => Err(ForwardError::Unavailable(format!(
                    "unexpected result of a batch: {other:?}"
                ))),
            }
        })
    }
}

/// One Raft proposal, bounded by the request timeout.
async fn write(
    raft: &Raft,
    timeout: std::time::Duration,
    cmd: Command,
) -> Result<Applied, ForwardError> {
    match tokio::time::timeout(timeout, raft.client_write(cmd)).await {
        Err(_) => Err(ForwardError::Timeout),
        Ok(Ok(resp)) => Ok(resp.data),
        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))) => {
            Err(ForwardError::NotLeader)
        }
        Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
            Err(ForwardError::FailedPrecondition(e.to_string()))
        }
        Ok(Err(RaftError::Fatal(f))) => Err(ForwardError::Unavailable(f.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::sync::Semaphore;

    use super::*;

    fn grant(id: i64) -> Command {
        Command::LeaseGrant { id, ttl: 60 }
    }

    /// A send that answers each grant with its own id, once `gate` lets it, and records how
    /// many commands each call carried.
    fn gated(
        gate: Arc<Semaphore>,
        calls: Arc<Mutex<Vec<usize>>>,
    ) -> impl Fn(Vec<Command>) -> std::pin::Pin<Box<dyn Future<Output = Results> + Send>>
           + Send
           + Sync
           + 'static {
        move |cmds: Vec<Command>| {
            let (gate, calls) = (gate.clone(), calls.clone());
            Box::pin(async move {
                calls.lock().unwrap().push(cmds.len());
                gate.acquire().await.expect("gate").forget();
                Ok(cmds
                    .iter()
                    .map(|c| match c {
                        Command::LeaseGrant { id, ttl } => Applied {
                            revision: *id,
                            output: Ok(Output::LeaseGranted { id: *id, ttl: *ttl }),
                        },
                        _ => Applied {
                            revision: 0,
                            output: Ok(Output::None),
                        },
                    })
                    .collect())
            })
        }
    }

    async fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn queued(b: &Batcher) -> usize {
        lock(&b.state).queue.iter().map(|(c, _)| c.len()).sum()
    }

    #[tokio::test]
    async fn callers_that_find_every_place_taken_go_in_the_next_batch_together() {
        let b = Arc::new(Batcher::new(1));
        let gate = Arc::new(Semaphore::new(0));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let send = || gated(gate.clone(), calls.clone());
        let first = tokio::spawn({
            let (b, send) = (b.clone(), send());
            async move { b.propose(vec![grant(1)], send).await }
        });
        until("the first batch is out", || {
            calls.lock().unwrap().len() == 1
        })
        .await;
        // Five callers (one of them with two commands) while the only place is taken.
        let mut rest = Vec::new();
        for ids in [vec![2], vec![3, 4], vec![5], vec![6], vec![7]] {
            let (b, send) = (b.clone(), send());
            rest.push(tokio::spawn(async move {
                b.propose(ids.into_iter().map(grant).collect(), send).await
            }));
        }
        until("all six commands are queued", || queued(&b) == 6).await;
        gate.add_permits(2);
        let first = first.await.expect("join").expect("first");
        assert_eq!(first.iter().map(|a| a.revision).collect::<Vec<_>>(), [1]);
        let mut got = Vec::new();
        for r in rest {
            got.push(
                r.await
                    .expect("join")
                    .expect("answered")
                    .iter()
                    .map(|a| a.revision)
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(got, [vec![2], vec![3, 4], vec![5], vec![6], vec![7]]);
        assert_eq!(
            *calls.lock().unwrap(),
            [1, 6],
            "one send for everything queued"
        );
        assert_eq!(lock(&b.state).sending, 0, "every place given back");
    }

    #[tokio::test]
    async fn queued_callers_are_sent_when_the_caller_holding_the_place_goes_away() {
        let b = Arc::new(Batcher::new(1));
        let gate = Arc::new(Semaphore::new(0));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let first = tokio::spawn({
            let (b, send) = (b.clone(), gated(gate.clone(), calls.clone()));
            async move { b.propose(vec![grant(1)], send).await }
        });
        until("the first batch is out", || {
            calls.lock().unwrap().len() == 1
        })
        .await;
        let second = tokio::spawn({
            let (b, send) = (b.clone(), gated(gate.clone(), calls.clone()));
            async move { b.propose(vec![grant(2)], send).await }
        });
        until("the second caller is queued", || queued(&b) == 1).await;
        // The first caller's client hangs up: its send is dropped with it.
        first.abort();
        assert!(first.await.expect_err("aborted").is_cancelled());
        gate.add_permits(1);
        let second = tokio::time::timeout(Duration::from_secs(10), second)
            .await
            .expect("the queued caller is sent without the caller that held the place")
            .expect("join")
            .expect("answered");
        assert_eq!(second[0].revision, 2);
        assert_eq!(lock(&b.state).sending, 0);
    }

    #[tokio::test]
    async fn a_failed_batch_fails_every_caller_in_it() {
        let b = Arc::new(Batcher::new(1));
        let gate = Arc::new(Semaphore::new(0));
        let sends = Arc::new(AtomicUsize::new(0));
        let send = || {
            let (gate, sends) = (gate.clone(), sends.clone());
            move |_: Vec<Command>| {
                let (gate, sends) = (gate.clone(), sends.clone());
                async move {
                    sends.fetch_add(1, Ordering::SeqCst);
                    gate.acquire().await.expect("gate").forget();
                    Err::<Vec<Applied>, _>(ForwardError::Timeout)
                }
            }
        };
        let first = tokio::spawn({
            let (b, send) = (b.clone(), send());
            async move { b.propose(vec![grant(1)], send).await }
        });
        until("the first batch is out", || {
            sends.load(Ordering::SeqCst) == 1
        })
        .await;
        let mut rest = Vec::new();
        for id in 2..5 {
            let (b, send) = (b.clone(), send());
            rest.push(tokio::spawn(async move {
                b.propose(vec![grant(id)], send).await
            }));
        }
        until("three callers are queued", || queued(&b) == 3).await;
        gate.add_permits(2);
        assert!(matches!(
            first.await.expect("join"),
            Err(ForwardError::Timeout)
        ));
        for r in rest {
            assert!(matches!(r.await.expect("join"), Err(ForwardError::Timeout)));
        }
        assert_eq!(sends.load(Ordering::SeqCst), 2);
    }
}
