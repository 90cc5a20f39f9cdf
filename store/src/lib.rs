//! rkube's built-in store: an etcd-compatible MVCC key-value store replicated with Raft.
//!
//! - [`mvcc`]: the data model (revisions, versions, leases, compaction) on sled, and watchers.
//! - [`raft`]: openraft's log storage, state machine and peer network.
//! - [`server`]: a member (`rkube server`): the Raft node, the peer service, the etcd v3 client
//!   API, lease expiry and scheduled snapshots on the leader, metrics and health.
//! - [`backup`]: the snapshot files that `rkube snapshot save`, `Maintenance.Snapshot` and
//!   scheduled snapshots write (etcd's format) and that restores read.
//! - [`bolt`]: bbolt's file format, the database etcd's snapshots are.
//! - TLS: every connection is mutual TLS with the cluster CA's certificates (crate `rkube-pki`).
//! - [`failpoints`]: crash points in the write path for chaos tests (`RKUBE_FAILPOINTS`).
//! - [`segment_buffers`]: the `rkube` process's allocator, which keeps sled's log buffers.

pub mod backup;
pub mod bolt;
pub mod durable_file;
pub mod error;
pub mod failpoints;
pub mod mvcc;
pub mod raft;
pub mod segment_buffers;
pub mod server;

/// Generated gRPC code: etcd's v3 API (wire-compatible) and the peer protocol.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    pub mod authpb {
        tonic::include_proto!("authpb");
    }
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
    pub mod peer {
        tonic::include_proto!("rkubepeer");
    }
}

/// Opens the sled database at `path` for a test that reopens one it just dropped: sled's
/// background IO threads may still hold the old handle's file lock for a moment, so a lock
/// conflict is retried for up to ten seconds.
#[cfg(test)]
pub(crate) fn reopen_sled(path: &std::path::Path) -> sled::Result<sled::Db> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match sled::Config::new().path(path).open() {
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}
