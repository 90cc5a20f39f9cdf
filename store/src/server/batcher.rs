//! Group commit on the leader: commands proposed at the same time travel as one log entry
//! ([`Command::Batch`]), so that one fsync and one replication message serve them all.
//!
//! A few batches are in flight at once; while they are, new commands queue, and the next
//! batch takes everything queued (up to a size bound). A lone command is proposed as it is, so
//! an idle cluster pays nothing for batching.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::node::ForwardError;
use crate::mvcc::{Applied, Command, Output};
use crate::raft::Raft;

/// Most commands in one entry.
const MAX_COMMANDS: usize = 512;
/// Most encoded bytes in one entry (one command may exceed it alone).
const MAX_BYTES: u64 = 4 * 1024 * 1024;
/// Batches proposed and not yet applied at once.
const IN_FLIGHT: usize = 2;

type Reply = oneshot::Sender<Result<Applied, ForwardError>>;

#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::UnboundedSender<(Command, Reply)>,
}

impl Batcher {
    /// Starts the batching task; it ends when every `Batcher` clone is dropped.
    pub fn start(raft: Raft, timeout: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, timeout, rx));
        Self { tx }
    }

    /// Proposes `cmd` (with others queued at the same time) and returns what it produced.
    pub async fn propose(&self, cmd: Command) -> Result<Applied, ForwardError> {
        let (reply, result) = oneshot::channel();
        self.tx
            .send((cmd, reply))
            .map_err(|_| ForwardError::Unavailable("server stopped".into()))?;
        result
            .await
            .unwrap_or_else(|_| Err(ForwardError::Unavailable("server stopped".into())))
    }
}

async fn run(raft: Raft, timeout: Duration, mut rx: mpsc::UnboundedReceiver<(Command, Reply)>) {
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut carried: Option<(Command, Reply)> = None;
    loop {
        let first = match carried.take() {
            Some(item) => item,
            None => match rx.recv().await {
                Some(item) => item,
                None => return,
            },
        };
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let mut bytes = bincode::serialized_size(&first.0).unwrap_or(0);
        let mut batch = vec![first];
        while batch.len() < MAX_COMMANDS {
            let Ok(item) = rx.try_recv() else { break };
            let size = bincode::serialized_size(&item.0).unwrap_or(0);
            if bytes + size > MAX_BYTES {
                carried = Some(item);
                break;
            }
            bytes += size;
            batch.push(item);
        }
        let raft = raft.clone();
        tokio::spawn(async move {
            let _permit = permit;
            propose(&raft, timeout, batch).await;
        });
    }
}

async fn propose(raft: &Raft, timeout: Duration, mut batch: Vec<(Command, Reply)>) {
    if batch.len() == 1 {
        if let Some((cmd, reply)) = batch.pop() {
            let _ = reply.send(write(raft, timeout, cmd).await);
        }
        return;
    }
    let (cmds, replies): (Vec<Command>, Vec<Reply>) = batch.into_iter().unzip();
    let n = replies.len();
    match write(raft, timeout, Command::Batch(cmds)).await {
        Ok(Applied {
            output: Ok(Output::Batch(results)),
            ..
        }) if results.len() == n => {
            for (reply, applied) in replies.into_iter().zip(results) {
                let _ = reply.send(Ok(applied));
            }
        }
        Ok(other) => {
            let e = ForwardError::Unavailable(format!("unexpected result of a batch: {other:?}"));
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// One Raft proposal, bounded by the request timeout.
async fn write(raft: &Raft, timeout: Duration, cmd: Command) -> Result<Applied, ForwardError> {
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
