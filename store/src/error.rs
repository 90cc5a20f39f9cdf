//! Errors of the store. The variants carry their retry meaning (compacted, unavailable, not
//! found) so that the client API can map them to etcd's gRPC codes and messages.

use serde::{Deserialize, Serialize};

/// A command or read that the MVCC rules refuse. These are deterministic: every member refuses
/// the same command the same way, so they travel through the Raft log as results.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MvccError {
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted { compact_revision: i64 },
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRevision,
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    #[error("etcdserver: lease already exists")]
    LeaseExists,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: lease TTL is too large")]
    LeaseTtlTooLarge,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    /// A NOSPACE alarm is active: only deletes, revokes and compaction are accepted until it
    /// is disarmed.
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
}

/// Failures of the sled-backed storage itself (disk, corruption).
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage: {0}")]
    Sled(#[from] sled::Error),
    #[error("storage: corrupt record: {0}")]
    Corrupt(String),
    /// Data in a format this build does not read (a snapshot of a newer build).
    #[error("storage: {0}")]
    Unsupported(String),
    #[error("storage: {0}")]
    Io(#[from] std::io::Error),
}

impl From<bincode::Error> for StorageError {
    fn from(e: bincode::Error) -> Self {
        StorageError::Corrupt(e.to_string())
    }
}

impl From<sled::transaction::TransactionError<StorageError>> for StorageError {
    fn from(e: sled::transaction::TransactionError<StorageError>) -> Self {
        match e {
            sled::transaction::TransactionError::Abort(e) => e,
            sled::transaction::TransactionError::Storage(e) => StorageError::Sled(e),
        }
    }
}

/// What a client request through a member can run into.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Mvcc(#[from] MvccError),
    /// No leader, no quorum, or the leader could not be reached: retry later or elsewhere.
    #[error("etcdserver: {0}")]
    Unavailable(String),
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: {0}")]
    InvalidArgument(String),
    #[error("etcdserver: {0}")]
    FailedPrecondition(String),
    #[error("etcdserver: {0}")]
    NotFound(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("etcdserver: server stopped")]
    Stopped,
}
