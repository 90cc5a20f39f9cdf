//! Linearizable reads: the read index (the commit index once a quorum has confirmed this
//! leadership), and the barrier a read waits at until this member has applied up to it.

use std::time::{Duration, Instant};

use openraft::error::{CheckIsLeaderError, RaftError};

use super::{Forward, ForwardError, ForwardReply, Node};
use crate::error::StoreError;

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
}
