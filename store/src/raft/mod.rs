//! Consensus: openraft over a write-ahead log of its own (`wal`) and the MVCC store in sled.
//! One file per openraft trait: the log storage, the state machine, and the network (the Raft
//! stream per peer in `stream`, and a connection per snapshot in `snapshot_stream`); `commit_notice`
//! answers the network's commit-only heartbeats at once when the follower has vouched for them.

pub mod commit_notice;
pub mod log_store;
pub mod network;
pub mod snapshot_data;
pub mod snapshot_stream;
pub mod state_machine;
pub mod stream;
pub mod wal;

#[cfg(test)]
mod conformance;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::mvcc::{Applied, Command};

/// What the membership stores about a member: where its peers and clients reach it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Member {
    /// `host:port` of the peer (Raft) listener.
    pub peer_addr: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.peer_addr)
    }
}

openraft::declare_raft_types!(
    /// rkube's Raft types: commands and results of the MVCC store, u64 member ids.
    pub TypeConfig:
        D = Command,
        R = Applied,
        NodeId = u64,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = snapshot_data::SnapshotData,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type NodeId = u64;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;
pub type SnapshotMetadata = openraft::SnapshotMeta<NodeId, Member>;
pub type RaftStorageError = openraft::StorageError<NodeId>;

pub(crate) fn storage_err(
    subject: openraft::ErrorSubject<NodeId>,
    verb: openraft::ErrorVerb,
    e: impl std::error::Error + 'static,
) -> RaftStorageError {
    openraft::StorageIOError::new(subject, verb, openraft::AnyError::new(&e)).into()
}

macro_rules! storage_error_fns {
    ($($name:ident => $subject:expr, $verb:expr;)*) => {
        $(
            pub(crate) fn $name<E: std::error::Error + 'static>(e: E) -> RaftStorageError {
                storage_err($subject, $verb, e)
            }
        )*
    };
}

use openraft::{ErrorSubject as S, ErrorVerb as V};
storage_error_fns! {
    logs_read => S::Logs, V::Read;
    logs_write => S::Logs, V::Write;
    logs_delete => S::Logs, V::Delete;
    vote_write => S::Vote, V::Write;
    sm_read => S::StateMachine, V::Read;
    sm_write => S::StateMachine, V::Write;
    snapshot_read => S::Snapshot(None), V::Read;
    snapshot_write => S::Snapshot(None), V::Write;
}
