//! One control-plane member (`rkube server`): opens the data dir, starts the Raft node over
//! sled, serves the peer port (mutual TLS), the etcd v3 client port (mutual TLS unless
//! insecure), and metrics/health and the status page over HTTP, and runs the leader's lease clock and scheduled
//! snapshots.

pub mod batcher;
pub mod datadir;
mod election;
pub mod endpoint;
pub mod etcd;
pub mod history;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod read_rounds;
pub mod recovery;
pub mod snapshot_schedule;
pub mod status_page;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{
    Certificate, ClientTlsConfig, Identity as TlsIdentity, Server, ServerTlsConfig,
};

use crate::mvcc::{Command, MemberAttrs, MvccStore};
use crate::proto::etcdserverpb::{
    auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
    lease_server::LeaseServer, maintenance_server::MaintenanceServer,
};
use crate::proto::peer::peer_server::PeerServer;
use crate::raft::log_store::LogStore;
use crate::raft::network::PeerNetwork;
use crate::raft::state_machine::StateMachine;
use crate::raft::{Member, Raft};
use datadir::{DataDir, MemberRecord};
use node::{cluster_id, member_id, Identity, Node, Timing};
use rkube_pki::TlsFiles;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    /// Bootstrap a new cluster from the initial membership.
    New,
    /// Join a cluster that already added this member (`member add`).
    Existing,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    pub data_dir: PathBuf,
    pub listen_peer: SocketAddr,
    pub listen_client: SocketAddr,
    pub listen_metrics: Option<SocketAddr>,
    /// URLs clients reach this member at, as published in the member list.
    pub advertise_client: Vec<String>,
    /// name -> peer address (`host:port`), this member included.
    pub initial_cluster: Vec<(String, String)>,
    pub initial_cluster_state: ClusterState,
    pub cluster_token: String,
    pub pki_dir: PathBuf,
    pub insecure_client: bool,
    pub heartbeat: Duration,
    pub election_timeout: Duration,
    pub snapshot_count: u64,
    pub snapshot_catchup_entries: u64,
    pub request_timeout: Duration,
    pub progress_interval: Duration,
    /// The database size that raises a NOSPACE alarm.
    pub quota_backend_bytes: u64,
    /// Start as the only member of the cluster with this member's data (quorum-loss recovery).
    pub force_new_cluster: bool,
    /// `--unsafe-no-fsync`: the write-ahead log acknowledges without fdatasync.
    pub unsafe_no_fsync: bool,
    /// Scheduled snapshots on the leader; `None` takes none.
    pub snapshot_schedule: Option<snapshot_schedule::SnapshotSchedule>,
    /// The control-plane endpoint this member holds while it leads.
    pub endpoint: endpoint::EndpointConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Failpoints(#[from] crate::failpoints::FailpointError),
    #[error(transparent)]
    DataDir(#[from] datadir::DataDirError),
    #[error(transparent)]
    Pki(#[from] rkube_pki::PkiError),
    #[error("cannot open the store in {dir}: {source}")]
    Storage {
        dir: PathBuf,
        source: crate::error::StorageError,
    },
    #[error("cannot listen on {addr} ({what}): {source}")]
    Listen {
        addr: SocketAddr,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cannot use snapshot dir {dir}: {source}; pick another --snapshot-dir")]
    SnapshotDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("raft: {0}")]
    Raft(String),
    #[error("TLS setup: {0}")]
    Tls(#[from] tonic::transport::Error),
}

impl ServerConfig {
    fn own_peer_addr(&self) -> Result<String, ServerError> {
        self.initial_cluster.iter().find(|(n, _)| *n == self.name).map(|(_, a)| a.clone()).ok_or_else(|| {
            ServerError::Config(format!(
                "--initial-cluster has no entry for this member's --name {:?}; add {}=<peer address>",
                self.name, self.name
            ))
        })
    }
}

/// Parses `n1=host:port,n2=https://host:port,...`.
pub fn parse_initial_cluster(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, url) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not NAME=ADDRESS"))?;
        let addr = etcd::cluster::peer_addr_of(url).map_err(|e| e.to_string())?;
        if out.iter().any(|(n, _)| n == name) {
            return Err(format!("member {name:?} appears twice"));
        }
        out.push((name.to_string(), addr));
    }
    if out.is_empty() {
        return Err("the initial cluster is empty".into());
    }
    Ok(out)
}

/// A running member. Dropping it does not stop it; call [`RunningServer::shutdown`].
pub struct RunningServer {
    pub node: Arc<Node>,
    /// Connections accepted at the control-plane endpoint's API address, for the Kubernetes
    /// API server (taken by it; `None` without an endpoint).
    pub endpoint_api: Option<endpoint::Connections>,
    /// The status page on the metrics port (the API layer adds its nodes to it).
    pub status_page: status_page::StatusPage,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _data_dir: DataDir,
}

impl RunningServer {
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.node.raft.shutdown().await;
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        let mvcc = self.node.mvcc.clone();
        let _ = tokio::task::spawn_blocking(move || mvcc.sync()).await;
    }
}

/// Accepted connections with Nagle's algorithm off: requests and responses are small and
/// latency-bound, and with it on a lone client waits on delayed ACKs (tens of milliseconds).
fn incoming(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<endpoint::Connection>> {
    use tokio_stream::StreamExt;
    TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        conn.set_nodelay(true)?;
        Ok(endpoint::Connection::own(conn))
    })
}

/// `conns` and the connections accepted at the control-plane endpoint (none when its sender
/// is dropped).
fn with_endpoint(
    conns: impl tokio_stream::Stream<Item = std::io::Result<endpoint::Connection>>,
    endpoint: endpoint::Connections,
) -> impl tokio_stream::Stream<Item = std::io::Result<endpoint::Connection>> {
    use tokio_stream::StreamExt;
    conns.merge(tokio_stream::wrappers::ReceiverStream::new(endpoint).map(Ok))
}

async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen { addr, what, source })
}

/// Starts a member and returns once it listens on all its ports.
pub async fn start(cfg: ServerConfig) -> Result<RunningServer, ServerError> {
    let armed = crate::failpoints::configure_from_env()?;
    if !armed.is_empty() {
        tracing::warn!(
            failpoints = armed.join(","),
            "crash failpoints armed from {}: this member will abort when one fires",
            crate::failpoints::ENV
        );
    }
    let peer_addr = cfg.own_peer_addr()?;
    let id = member_id(&cfg.cluster_token, &peer_addr);
    let cid = cluster_id(&cfg.cluster_token);
    let record = MemberRecord {
        name: cfg.name.clone(),
        member_id: id,
        cluster_id: cid,
        peer_addr: peer_addr.clone(),
    };
    let data_dir = DataDir::open(&cfg.data_dir, &record)?;
    if let Some(schedule) = &cfg.snapshot_schedule {
        // Now rather than at the first snapshot, so that a wrong dir stops the start.
        std::fs::create_dir_all(&schedule.dir).map_err(|source| ServerError::SnapshotDir {
            dir: schedule.dir.clone(),
            source,
        })?;
    }

    let tls = TlsFiles::for_member(&cfg.pki_dir, &cfg.name).load()?;
    let server_tls = ServerTlsConfig::new()
        .identity(TlsIdentity::from_pem(&tls.cert_pem, &tls.key_pem))
        .client_ca_root(Certificate::from_pem(&tls.ca_pem));
    let client_tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&tls.ca_pem))
        .identity(TlsIdentity::from_pem(&tls.cert_pem, &tls.key_pem));

    let storage_err = |source| ServerError::Storage {
        dir: cfg.data_dir.clone(),
        source,
    };
    // sled's own flusher would write and sync_file_range continuously while writes come in;
    // the state machine is synced by `sync_state` instead, once a second.
    let db = sled::Config::new()
        .path(cfg.data_dir.join("db"))
        .cache_capacity(256 * 1024 * 1024)
        .flush_every_ms(None)
        .open()
        .map_err(|e| storage_err(e.into()))?;
    let mvcc = Arc::new(MvccStore::open_dir(&db, &cfg.data_dir.join("db")).map_err(storage_err)?);
    let mut metrics = metrics::Metrics::new();
    let mut sm = StateMachine::open(mvcc.clone(), &cfg.data_dir).map_err(storage_err)?;
    sm.installs = metrics.snapshot_installs.clone();
    let committed = Arc::new(AtomicU64::new(0));
    let mut log_store = LogStore::open(&cfg.data_dir, &db, cfg.unsafe_no_fsync)
        .map_err(|e| storage_err(crate::error::StorageError::Io(e.into())))?
        .observed(committed.clone(), metrics.fsync_seconds.clone())
        .purging_behind(sm.snapshot_watermark())
        .early_for_leader(id);
    let snapshot_events = sm.snapshot_watermark();
    let mut sm = sm.applying_durable(log_store.wal()).answering_first(id);
    metrics.wal = log_store.stats();
    let metrics = Arc::new(metrics);

    let forced = if cfg.force_new_cluster {
        if data_dir.fresh {
            return Err(ServerError::Config(format!(
                "--force-new-cluster needs the data dir of a surviving member, and {} is new",
                cfg.data_dir.display()
            )));
        }
        let forced = recovery::force_new_cluster(&mut log_store, &mut sm)
            .await
            .map_err(|e| ServerError::Raft(e.to_string()))?;
        tracing::warn!(
            replayed = forced.replayed,
            revision = forced.revision,
            "forced a new cluster: this member is now its only member; add the others back with `rkube member add`"
        );
        true
    } else {
        false
    };

    // openraft starts an election after the leader's lease (election_timeout_max) plus a
    // random timeout in [min, max) without a heartbeat. These bounds make that 1.0-1.2 times
    // --election-timeout, which is what the flag means in etcd (its first election starts
    // after 1-2 times the timeout); min and max of [1x, 2x) would mean 3-4x.
    //
    // openraft 0.9 also bounds every AppendEntries by its heartbeat interval, so a peer round
    // trip (or a follower's fsync) longer than --heartbeat-interval would fail every
    // replication and commit nothing. Its heartbeat interval is therefore the longest an
    // AppendEntries may take — just under the vote RPC's budget (election_timeout_min) — and
    // the leader's heartbeats at --heartbeat-interval come from `Node::send_heartbeats`.
    let election_ms = cfg.election_timeout.as_millis() as u64;
    let heartbeat_ms = cfg.heartbeat.as_millis() as u64;
    let election_timeout_min = election_ms * 2 / 5;
    if heartbeat_ms >= election_timeout_min {
        return Err(ServerError::Config(format!(
            "--heartbeat-interval ({heartbeat_ms} ms) must be less than 2/5 of --election-timeout ({election_ms} ms); etcd recommends an election timeout of 10 heartbeats"
        )));
    }
    let raft_config = openraft::Config {
        cluster_name: cfg.cluster_token.clone(),
        heartbeat_interval: election_timeout_min - 1,
        election_timeout_min,
        election_timeout_max: election_ms * 3 / 5,
        install_snapshot_timeout: 10_000,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(cfg.snapshot_count),
        max_in_snapshot_log_to_keep: cfg.snapshot_catchup_entries,
        max_payload_entries: 64,
        // `Node::watch_leader` is the only elector: openraft's tick would campaign after
        // 2/5 of the election timeout whenever the vote is not committed, as after every
        // restart.
        enable_elect: false,
        ..Default::default()
    }
    .validate()
    .map_err(|e| ServerError::Config(e.to_string()))?;

    let network = PeerNetwork::new(
        client_tls.clone(),
        tls.rustls_client(&[crate::raft::stream::ALPN])?,
    )
    .holding_commit_to(log_store.wal())
    .answering_commit_notices(cfg.heartbeat);
    let wal = log_store.wal();
    let raft = Raft::new(id, Arc::new(raft_config), network.clone(), log_store, sm)
        .await
        .map_err(|e| ServerError::Raft(e.to_string()))?;

    let client_urls = if cfg.advertise_client.is_empty() {
        let scheme = if cfg.insecure_client { "http" } else { "https" };
        vec![format!("{scheme}://{}", cfg.listen_client)]
    } else {
        cfg.advertise_client.clone()
    };
    let identity = Identity {
        id,
        name: cfg.name.clone(),
        cluster_token: cfg.cluster_token.clone(),
        cluster_id: cid,
        client_urls,
    };
    let timing = Timing {
        election_timeout: cfg.election_timeout,
        request_timeout: cfg.request_timeout,
    };
    let node = Arc::new_cyclic(|me| {
        Node::new(
            identity,
            raft.clone(),
            mvcc,
            db,
            metrics,
            committed,
            timing,
            network,
            wal,
            cfg.quota_backend_bytes,
            me.clone(),
        )
    });

    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let stop_watch = stop_rx.clone();
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let mut tasks = Vec::new();

    // Peer port first, so that peers can reach this member as soon as it votes.
    // Each connection's TLS handshake picks its protocol: the Raft stream, or gRPC.
    let peer_listener = bind(cfg.listen_peer, "peer").await?;
    let peer_service = PeerServer::new(peer::PeerService(node.clone()))
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    let peer_server = Server::builder().add_service(peer_service);
    let (peer_grpc_tx, peer_grpc) = tokio::sync::mpsc::channel(64);
    let stop_peer = stopped();
    tasks.push(tokio::spawn(async move {
        use tokio_stream::StreamExt;
        let conns =
            tokio_stream::wrappers::ReceiverStream::new(peer_grpc).map(Ok::<_, std::io::Error>);
        if let Err(e) = peer_server
            .serve_with_incoming_shutdown(conns, stop_peer)
            .await
        {
            tracing::error!(error = %e, "peer server failed");
        }
    }));
    let peer_tls = tls.rustls_server(&[
        crate::raft::stream::ALPN,
        crate::raft::snapshot_stream::ALPN,
        b"h2",
    ])?;
    tasks.push(tokio::spawn(peer::accept(
        node.clone(),
        peer_listener,
        tokio_rustls::TlsAcceptor::from(Arc::new(peer_tls)),
        peer_grpc_tx,
        stop_watch.clone(),
    )));

    if forced {
        let me = BTreeMap::from([(
            id,
            Member {
                peer_addr: peer_addr.clone(),
            },
        )]);
        raft.initialize(me)
            .await
            .map_err(|e| ServerError::Raft(e.to_string()))?;
    } else if data_dir.fresh && cfg.initial_cluster_state == ClusterState::New {
        let members: BTreeMap<u64, Member> = cfg
            .initial_cluster
            .iter()
            .map(|(_, addr)| {
                (
                    member_id(&cfg.cluster_token, addr),
                    Member {
                        peer_addr: addr.clone(),
                    },
                )
            })
            .collect();
        // Every initial member initializes with the same membership; openraft accepts that.
        if let Err(e) = raft.initialize(members).await {
            tracing::info!(error = %e, "raft already initialized");
        }
    }

    let client_listener = bind(cfg.listen_client, "client").await?;
    cfg.endpoint.address().map_err(ServerError::Config)?;
    let channel = |on: Option<SocketAddr>| on.map(|_| tokio::sync::mpsc::channel(64)).unzip();
    let (endpoint_api_tx, endpoint_api) = channel(cfg.endpoint.api);
    let (endpoint_client_tx, endpoint_client) = match cfg.endpoint.client {
        Some(_) => {
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            (Some(tx), rx)
        }
        None => (None, tokio::sync::mpsc::channel(1).1),
    };
    let max = 2 * etcd::MAX_REQUEST_BYTES + 4096;
    let mut builder = Server::builder();
    if !cfg.insecure_client {
        builder = builder.tls_config(server_tls)?;
    }
    let client_server = builder
        .add_service(
            KvServer::new(etcd::kv::KvService(node.clone())).max_decoding_message_size(max),
        )
        .add_service(etcd::watch::WatchServer::new(etcd::watch::WatchService {
            node: node.clone(),
            progress_interval: cfg.progress_interval,
        }))
        .add_service(LeaseServer::new(etcd::lease::LeaseService {
            node: node.clone(),
            min_ttl: ((cfg.election_timeout.as_millis() as u64 * 3 / 2).div_ceil(1000) as i64)
                .max(1),
        }))
        .add_service(ClusterServer::new(etcd::cluster::ClusterService(
            node.clone(),
        )))
        .add_service(MaintenanceServer::new(
            etcd::maintenance::MaintenanceService(node.clone()),
        ))
        .add_service(AuthServer::new(etcd::auth::AuthService {
            node: node.clone(),
        }));
    let stop_client = stopped();
    tasks.push(tokio::spawn(async move {
        if let Err(e) = client_server
            .serve_with_incoming_shutdown(
                with_endpoint(incoming(client_listener), endpoint_client),
                stop_client,
            )
            .await
        {
            tracing::error!(error = %e, "client server failed");
        }
    }));

    let status_page = status_page::StatusPage::new(node.clone(), client_tls);
    if let Some(addr) = cfg.listen_metrics {
        let listener = bind(addr, "metrics").await?;
        let app = metrics::router(node.clone()).merge(status_page.router());
        tasks.push(tokio::spawn(history::record(
            node.clone(),
            snapshot_events,
            stopped(),
        )));
        tasks.push(tokio::spawn(status_page.clone().poll_members(stopped())));
        let stop_http = stopped();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(stop_http)
                .await
            {
                tracing::error!(error = %e, "metrics server failed");
            }
        }));
    }

    tasks.push(tokio::spawn(background(node.clone(), stopped())));
    tasks.push(tokio::spawn(sync_state(node.mvcc.clone(), stopped())));
    tasks.push(tokio::spawn(
        node.clone().send_heartbeats(cfg.heartbeat, stopped()),
    ));
    tasks.push(tokio::spawn(node.clone().watch_leader(
        (cfg.election_timeout / 20).max(Duration::from_millis(5)),
        stopped(),
    )));
    if node.mvcc.baseline_pending().map_err(storage_err)? {
        let (node, stop) = (node.clone(), stopped());
        tasks.push(tokio::spawn(async move {
            tokio::select! {
                _ = stop => {}
                _ = recovery::baseline_snapshot(node) => {}
            }
        }));
    }
    if let Some(schedule) = cfg.snapshot_schedule.clone() {
        tracing::info!(dir = %schedule.dir.display(), interval = ?schedule.interval, retain = schedule.retain, "scheduled snapshots on the leader");
        tasks.push(tokio::spawn(snapshot_schedule::run(
            node.clone(),
            schedule,
            stopped(),
        )));
    }
    tracing::info!(name = %cfg.name, id = format!("{id:x}"), peer = %peer_addr, client = %cfg.listen_client, "member started");
    if endpoint_api_tx.is_some() || endpoint_client_tx.is_some() {
        tasks.push(tokio::spawn(endpoint::run(
            node.clone(),
            cfg.endpoint.clone(),
            endpoint_api_tx,
            endpoint_client_tx,
            stop_watch,
        )));
    }
    Ok(RunningServer {
        node,
        endpoint_api,
        status_page,
        stop,
        tasks,
        _data_dir: data_dir,
    })
}

/// The member's periodic work: the leader's lease clock, publishing this member's attributes,
/// and counting leader changes.
async fn background(node: Arc<Node>, stopped: impl Future<Output = ()>) {
    tokio::pin!(stopped);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    // Only leader changes matter here: the server metrics change with them, not with every
    // entry as openraft's full metrics do.
    let mut metrics_rx = node.raft.server_metrics();
    // A leader known before this task subscribed counts too.
    metrics_rx.mark_changed();
    let mut leader = None;
    let mut published = false;
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tick.tick() => {
                node.refresh_db_size();
                node.expire_leases().await;
                if !published && node.leader().is_some() {
                    published = publish_attrs(&node).await;
                }
            }
            changed = metrics_rx.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = metrics_rx.borrow().current_leader;
                if now != leader {
                    if now.is_some() {
                        node.metrics.leader_changes.inc();
                        tracing::info!(leader = now.map(|l| format!("{l:x}")), "leader changed");
                    }
                    leader = now;
                }
            }
        }
    }
}

/// How often the state machine is made durable. Not for correctness (the write-ahead log is):
/// it bounds how much of the log a restart applies again.
const STATE_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// Syncs the state machine's trees every [`STATE_SYNC_INTERVAL`] when something changed.
async fn sync_state(mvcc: Arc<MvccStore>, stopped: impl Future<Output = ()>) {
    tokio::pin!(stopped);
    let mut tick = tokio::time::interval(STATE_SYNC_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut synced = mvcc.revision();
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tick.tick() => {}
        }
        let revision = mvcc.revision();
        if revision == synced {
            continue;
        }
        let m = mvcc.clone();
        match tokio::task::spawn_blocking(move || m.sync()).await {
            Ok(Ok(())) => synced = revision,
            Ok(Err(e)) => tracing::warn!(error = %e, "could not sync the state machine"),
            Err(e) => tracing::warn!(error = %e, "state machine sync task failed"),
        }
    }
}

/// Proposes this member's name and client URLs if the store does not have them yet.
async fn publish_attrs(node: &Arc<Node>) -> bool {
    let mine = MemberAttrs {
        name: node.name.clone(),
        client_urls: node.identity.client_urls.clone(),
    };
    match node.mvcc.member_attrs() {
        Ok(attrs) if attrs.get(&node.id) == Some(&mine) => return true,
        Ok(_) => {}
        Err(_) => return false,
    }
    let cmd = Command::MemberAttrs {
        id: node.id,
        name: mine.name,
        client_urls: mine.client_urls,
    };
    node.propose(cmd).await.is_ok()
}
