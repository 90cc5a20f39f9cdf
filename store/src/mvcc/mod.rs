//! The MVCC key-value store with etcd's data model: a revision per write transaction, per-key
//! create/mod revisions and versions, reads at past revisions, compaction, leases, and a watch
//! hub that replays history and then follows live changes.

mod index;
pub mod keys;
pub mod store;
pub mod types;
pub mod watch;

#[cfg(test)]
pub(crate) mod test_ops;
#[cfg(test)]
mod tests;

pub use store::{
    validate_txn, Changes, HistoryRecord, MemberAttrs, MvccStore, RevisionBatch, MAX_LEASE_TTL,
};
pub use types::*;
