//! A member's core: the Raft handle and the MVCC store, and the operations every client API
//! needs from them — proposing a command (forwarded to the leader from a follower), a
//! linearizable read barrier, lease keep-alive and time-to-live (decided by the leader), and
//! membership changes.
//!
//! `forward.rs` carries a request to the leader and serves it there; `propose.rs` is the write
//! path, `read_index.rs` the linearizable read barrier, `leases.rs` the leader's lease clock,
//! `membership.rs` membership changes and `leadership.rs` the leader's heartbeats and
//! leadership transfer. This file holds the member itself and its ids.

mod forward;
mod leadership;
mod leases;
mod membership;
mod propose;
mod read_index;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use openraft::ServerState;

use super::batcher::Batcher;
use super::metrics::Metrics;
use super::read_rounds::ReadRounds;
use crate::error::StoreError;
use crate::mvcc::MvccStore;
use crate::raft::network::PeerNetwork;
use crate::raft::wal::Wal;
use crate::raft::{NodeId, Raft};
use leases::LeaseClock;

/// Group-commit batches out at once, on both ends: a leader's proposals not yet applied, and a
/// follower's forwards to the leader not yet answered. One: proposals that arrive while a
/// batch is out wait for it and go together, in a larger batch. Against two, put with 16
/// clients did 8% more with 8% less CPU per write, 256 clients 2% more, one client and check
/// perf the same; four did worse than two (BENCHMARKS.md).
const BATCHES_IN_FLIGHT: usize = 1;

pub use forward::{Forward, ForwardError, ForwardReply};
pub use membership::MembershipChange;

/// Timing of a member, from its flags.
#[derive(Debug, Clone)]
pub struct Timing {
    pub election_timeout: Duration,
    /// How long a client request may wait for a leader, a quorum or the apply.
    pub request_timeout: Duration,
}

/// Who a member is.
#[derive(Debug, Clone)]
pub struct Identity {
    pub id: NodeId,
    pub name: String,
    pub cluster_token: String,
    pub cluster_id: u64,
    /// Client URLs this member publishes.
    pub client_urls: Vec<String>,
}

pub struct Node {
    pub id: NodeId,
    pub name: String,
    pub cluster_id: u64,
    pub identity: Identity,
    pub raft: Raft,
    pub mvcc: Arc<MvccStore>,
    pub db: sled::Db,
    pub metrics: Arc<Metrics>,
    pub committed: Arc<AtomicU64>,
    pub timing: Timing,
    network: PeerNetwork,
    /// The Raft log (openraft owns it; the member reads its last log id for PreVote).
    pub(super) wal: Arc<Wal>,
    leases: LeaseClock,
    /// The database size that raises a NOSPACE alarm (etcd's --quota-backend-bytes).
    pub quota_bytes: u64,
    /// The database's size on disk, refreshed by the member's background loop (reading it
    /// walks files, too slow for every write).
    pub db_size: AtomicU64,
    /// Set on the leader while it hands its leadership over: it takes no new work meanwhile, so
    /// that the transferee catches up and nothing refreshes the followers' leader lease.
    transferring: AtomicBool,
    /// Whether this member may campaign (off while a leader transfer holds elections).
    pub(super) elections: Arc<AtomicBool>,
    /// Group commit of this member's proposals while it leads.
    batcher: Batcher,
    /// This member's proposals while it follows, sent to the leader together.
    forwarder: Batcher,
    /// This member, for the forwarder's task (which outlives no member).
    me: Weak<Node>,
    /// Read-index rounds shared by concurrent linearizable reads on this member.
    read_rounds: ReadRounds,
}

impl Node {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        identity: Identity,
        raft: Raft,
        mvcc: Arc<MvccStore>,
        db: sled::Db,
        metrics: Arc<Metrics>,
        committed: Arc<AtomicU64>,
        timing: Timing,
        network: PeerNetwork,
        wal: Arc<Wal>,
        quota_bytes: u64,
        me: Weak<Node>,
    ) -> Self {
        let db_size = AtomicU64::new(db_size_on_disk(&db));
        Self {
            id: identity.id,
            name: identity.name.clone(),
            cluster_id: identity.cluster_id,
            identity,
            raft,
            mvcc,
            db,
            metrics,
            committed,
            timing,
            network,
            wal,
            leases: LeaseClock::default(),
            quota_bytes,
            db_size,
            transferring: AtomicBool::new(false),
            elections: Arc::new(AtomicBool::new(true)),
            batcher: Batcher::new(BATCHES_IN_FLIGHT),
            forwarder: Batcher::new(BATCHES_IN_FLIGHT),
            me,
            read_rounds: ReadRounds::default(),
        }
    }

    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// A leader that has not heard from a quorum for longer than an election timeout is cut
    /// off; it refuses work at once instead of letting clients wait for a commit that cannot come.
    fn check_quorum_contact(&self) -> Result<(), StoreError> {
        let m = self.raft.metrics();
        let m = m.borrow();
        if m.state == ServerState::Leader {
            if let Some(ms) = m.millis_since_quorum_ack {
                if ms > 2 * self.timing.election_timeout.as_millis() as u64 {
                    return Err(StoreError::Unavailable(
                        "no leader (this member lost contact with a quorum of the cluster)".into(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Reads the database size on disk again.
    pub fn refresh_db_size(&self) -> u64 {
        let size = db_size_on_disk(&self.db);
        self.db_size.store(size, Ordering::Relaxed);
        size
    }
}

/// A member's Raft id: derived from the cluster token and its advertised peer address, so
/// that `member add` (which knows only the address) and the member itself agree on it.
pub fn member_id(cluster_token: &str, peer_addr: &str) -> NodeId {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{cluster_token}\n{peer_addr}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    // Non-zero and positive as an i64, which keeps etcd clients that print it signed happy.
    (u64::from_be_bytes(bytes) >> 1).max(1)
}

pub fn cluster_id(cluster_token: &str) -> u64 {
    member_id(cluster_token, "")
}

/// The sled database's size on disk; 0 when it cannot be read.
pub fn db_size_on_disk(db: &sled::Db) -> u64 {
    db.size_on_disk().unwrap_or(0)
}

/// Keeps the committed index that openraft reports to the log store.
pub fn committed_index(committed: &AtomicU64) -> u64 {
    committed.load(Ordering::Relaxed)
}
