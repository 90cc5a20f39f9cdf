//! Operations signals of a member: Prometheus `/metrics`, `/livez` and `/readyz` over HTTP
//! (the status page, `status_page/`, is served beside them).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::node::Node;

pub struct Metrics {
    registry: std::sync::Mutex<Registry>,
    pub term: Gauge,
    pub is_leader: Gauge,
    pub has_leader: Gauge,
    pub leader_changes: Counter,
    pub commit_index: Gauge,
    pub applied_index: Gauge,
    pub revision: Gauge,
    pub compact_revision: Gauge,
    pub db_size: Gauge,
    pub watchers: Gauge,
    pub proposal_seconds: Histogram,
    pub proposals_failed: Counter,
    pub fsync_seconds: Histogram,
    /// Set by the state machine: snapshots installed from a leader.
    pub snapshot_installs: Arc<AtomicU64>,
    snapshot_installs_gauge: Gauge,
    pub scheduled_snapshots: Counter,
    pub scheduled_snapshot_failures: Counter,
    pub scheduled_snapshot_seconds: Histogram,
    pub scheduled_snapshot_last_success: Gauge,
    /// The write-ahead log's counters, mirrored into the two gauges below at each scrape.
    pub wal: Arc<crate::raft::wal::WalStats>,
    wal_fsyncs: Gauge,
    wal_appends: Gauge,
    /// 1 while this member holds the control-plane endpoint (`endpoint.rs`).
    pub endpoint_held: Gauge,
    /// Recent events and samples of these metrics, for the status page.
    pub history: Arc<super::history::History>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("rkube");
        let m = Self {
            registry: std::sync::Mutex::new(Registry::default()),
            term: Gauge::default(),
            is_leader: Gauge::default(),
            has_leader: Gauge::default(),
            leader_changes: Counter::default(),
            commit_index: Gauge::default(),
            applied_index: Gauge::default(),
            revision: Gauge::default(),
            compact_revision: Gauge::default(),
            db_size: Gauge::default(),
            watchers: Gauge::default(),
            proposal_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            proposals_failed: Counter::default(),
            fsync_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            snapshot_installs: Arc::new(AtomicU64::new(0)),
            snapshot_installs_gauge: Gauge::default(),
            scheduled_snapshots: Counter::default(),
            scheduled_snapshot_failures: Counter::default(),
            scheduled_snapshot_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            scheduled_snapshot_last_success: Gauge::default(),
            wal: Arc::default(),
            wal_fsyncs: Gauge::default(),
            wal_appends: Gauge::default(),
            endpoint_held: Gauge::default(),
            history: Arc::default(),
        };
        r.register(
            "endpoint_held",
            "1 while this member holds the control-plane endpoint (listens on its address)",
            m.endpoint_held.clone(),
        );
        r.register(
            "wal_fsyncs",
            "fdatasync calls on the write-ahead log since start (group commits, votes, truncations, purges, new segments)",
            m.wal_fsyncs.clone(),
        );
        r.register(
            "wal_appends",
            "Batches of Raft entries appended to the write-ahead log since start",
            m.wal_appends.clone(),
        );
        r.register(
            "raft_snapshot_installs",
            "Snapshots installed from a leader since start",
            m.snapshot_installs_gauge.clone(),
        );
        r.register("raft_term", "Current Raft term", m.term.clone());
        r.register(
            "raft_is_leader",
            "1 when this member is the Raft leader",
            m.is_leader.clone(),
        );
        r.register(
            "raft_has_leader",
            "1 when this member knows a leader",
            m.has_leader.clone(),
        );
        r.register(
            "raft_leader_changes",
            "Leader changes seen by this member",
            m.leader_changes.clone(),
        );
        r.register(
            "raft_commit_index",
            "Highest log index known committed",
            m.commit_index.clone(),
        );
        r.register(
            "raft_applied_index",
            "Highest log index applied to the state machine",
            m.applied_index.clone(),
        );
        r.register(
            "mvcc_revision",
            "Current store revision",
            m.revision.clone(),
        );
        r.register(
            "mvcc_compact_revision",
            "Revision history is compacted to",
            m.compact_revision.clone(),
        );
        r.register(
            "db_size_bytes",
            "Size of the data dir's database on disk",
            m.db_size.clone(),
        );
        r.register(
            "watchers",
            "Active watchers on this member",
            m.watchers.clone(),
        );
        r.register(
            "proposal_duration_seconds",
            "Time from proposal to apply on the leader",
            m.proposal_seconds.clone(),
        );
        r.register(
            "proposals_failed",
            "Proposals that timed out or were refused",
            m.proposals_failed.clone(),
        );
        r.register(
            "disk_fsync_duration_seconds",
            "Time of the log's fsync",
            m.fsync_seconds.clone(),
        );
        r.register(
            "scheduled_snapshots",
            "Scheduled snapshots this member wrote as leader",
            m.scheduled_snapshots.clone(),
        );
        r.register(
            "scheduled_snapshot_failures",
            "Scheduled snapshots that could not be written, or whose old files could not be deleted",
            m.scheduled_snapshot_failures.clone(),
        );
        r.register(
            "scheduled_snapshot_duration_seconds",
            "Time to encode, write and fsync a scheduled snapshot",
            m.scheduled_snapshot_seconds.clone(),
        );
        r.register(
            "scheduled_snapshot_last_success_timestamp_seconds",
            "Unix time of this member's last scheduled snapshot (0: none since start)",
            m.scheduled_snapshot_last_success.clone(),
        );
        *m.registry.lock().unwrap_or_else(|e| e.into_inner()) = r;
        m
    }

    fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}

/// Refreshes the gauges that mirror state (called before every scrape and periodically).
pub fn refresh(node: &Node, committed: &AtomicU64) {
    let m = &node.metrics;
    let rm = node.raft.metrics().borrow().clone();
    m.term.set(rm.current_term as i64);
    m.is_leader
        .set(i64::from(rm.current_leader == Some(node.id)));
    m.has_leader.set(i64::from(rm.current_leader.is_some()));
    m.commit_index
        .set(super::node::committed_index(committed) as i64);
    m.applied_index
        .set(rm.last_applied.map_or(0, |l| l.index) as i64);
    m.revision.set(node.mvcc.revision());
    m.compact_revision.set(node.mvcc.compact_revision());
    m.db_size
        .set(node.db_size.load(std::sync::atomic::Ordering::Relaxed) as i64);
    m.watchers.set(node.mvcc.watcher_count() as i64);
    m.wal_fsyncs
        .set(m.wal.syncs.load(std::sync::atomic::Ordering::Relaxed) as i64);
    m.wal_appends
        .set(m.wal.appends.load(std::sync::atomic::Ordering::Relaxed) as i64);
    m.snapshot_installs_gauge.set(
        m.snapshot_installs
            .load(std::sync::atomic::Ordering::Relaxed) as i64,
    );
}

pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(node)
}

async fn metrics(State(node): State<Arc<Node>>) -> impl IntoResponse {
    refresh(&node, &node.committed);
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        node.metrics.render(),
    )
}

/// Ready when the member knows a leader and has applied everything it knows is committed.
async fn readyz(State(node): State<Arc<Node>>) -> impl IntoResponse {
    let rm = node.raft.metrics().borrow().clone();
    if rm.current_leader.is_none() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no leader\n".to_string(),
        );
    }
    let applied = rm.last_applied.map_or(0, |l| l.index);
    let committed = super::node::committed_index(&node.committed);
    if applied + 1000 < committed {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: applied {applied} of {committed} committed entries\n"),
        );
    }
    (StatusCode::OK, "ok\n".to_string())
}
