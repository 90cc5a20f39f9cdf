//! `rkube server`: a control-plane member's flags, and the member started with them: its PKI
//! and membership first (`--init`, `--join`), then the store, the API, the controllers and
//! the scheduler, until a signal stops it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use rkube_store::server::snapshot_schedule::{SnapshotSchedule, DEFAULT_RETAIN};
use rkube_store::server::{parse_initial_cluster, ClusterState, ServerConfig};

use crate::{flags, init};

#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// Member name, unique in the cluster.
    #[arg(long)]
    name: String,
    #[arg(long)]
    data_dir: PathBuf,
    /// Address for Raft traffic from other members.
    #[arg(long)]
    listen_peer: SocketAddr,
    /// Address for clients (etcd v3 gRPC API).
    #[arg(long)]
    listen_client: SocketAddr,
    /// Threads that run this member's work (default: one per CPU). Members that share a
    /// machine do better with its CPUs divided between them, as `rkube up` does: fewer threads
    /// than CPUs means fewer wake-ups across threads for each request.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    worker_threads: Option<u16>,
    /// Address for /metrics, /livez and /readyz (plain HTTP).
    #[arg(long)]
    listen_metrics: Option<SocketAddr>,
    /// Address for the Kubernetes API (HTTPS, with this member's certificate).
    #[arg(long)]
    listen_api: Option<SocketAddr>,
    /// With the Kubernetes API: serve cluster DNS (UDP and TCP) on this address; the member
    /// publishes it as an endpoint of the kube-system/kube-dns Service.
    #[arg(long)]
    listen_dns: Option<SocketAddr>,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// Resolvers for names outside the cluster domain (comma-separated IP[:port]; default:
    /// the nameservers of /etc/resolv.conf).
    #[arg(long, value_delimiter = ',')]
    dns_upstream: Vec<String>,
    /// The range Service ClusterIPs are allocated from; its first address is the
    /// `kubernetes` Service's.
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: rkube_api::services::ServiceNet,
    /// How often the node controller checks nodes' heartbeats.
    #[arg(long, default_value = "5s", value_parser = flags::parse_duration)]
    node_monitor_period: Duration,
    /// How long a node may go without a heartbeat before it is marked Unknown and tainted.
    #[arg(long, default_value = "40s", value_parser = flags::parse_duration)]
    node_monitor_grace_period: Duration,
    /// NoExecute taints (and so evictions) started per second.
    #[arg(long, default_value_t = 0.1)]
    node_eviction_rate: f64,
    /// With the Kubernetes API: how often the leader compacts the store's history, keeping one
    /// interval of it for watch resumes (0: never).
    #[arg(long, default_value = "5m", value_parser = flags::parse_duration)]
    compaction_interval: Duration,
    /// With the Kubernetes API: how often this server scrapes the node agents' resource usage
    /// for metrics.k8s.io (metrics-server's --metric-resolution).
    #[arg(long, default_value = "15s", value_parser = flags::parse_duration)]
    metric_resolution: Duration,
    /// How often the HorizontalPodAutoscaler controller looks at each autoscaler.
    #[arg(long, default_value = "15s", value_parser = flags::parse_duration)]
    horizontal_pod_autoscaler_sync_period: Duration,
    /// How far from 1 the ratio of a metric to its target must be before an autoscaler scales.
    #[arg(long, default_value_t = 0.1)]
    horizontal_pod_autoscaler_tolerance: f64,
    /// How many terminated pods (Succeeded or Failed) may stay before the pod garbage
    /// collector deletes the oldest (kube-controller-manager's flag; 0 keeps them all).
    #[arg(long, default_value_t = rkube_controllers::podgc::TERMINATED_POD_THRESHOLD)]
    terminated_pod_gc_threshold: usize,
    /// Addresses the leader gives LoadBalancer Services (A-B, or a CIDR), which the node agents
    /// answer for; unset, LoadBalancer Services stay <pending> (they still get a NodePort).
    #[arg(long)]
    load_balancer_ip_range: Option<rkube_controllers::loadbalancer::Pool>,
    /// How long the certificates the cluster CA signs for nodes last (kube-controller-manager's
    /// --cluster-signing-duration; at least 10m); agents renew theirs when 80% of it has passed.
    #[arg(long, default_value = "8760h", value_parser = flags::parse_duration)]
    cluster_signing_duration: Duration,
    /// The API address written into kube-public/cluster-info for joining nodes (default:
    /// https://<--listen-api>).
    #[arg(long)]
    advertise_api_url: Option<String>,
    /// Start a new cluster on this host: make the CA, keys and certificates in --pki, then
    /// print the commands that join control-plane members and workers.
    #[arg(long, conflicts_with = "join")]
    init: bool,
    /// With --init: also write what joining needs (API URL, token, CA pin, certificate key) to
    /// this file (mode 0600), for members and agents that start unattended (--join-from).
    #[arg(long, requires = "init")]
    join_file: Option<PathBuf>,
    /// Join with what the first member's --join-file holds, waiting (up to 5 minutes) for it
    /// to appear; the same as --join with its --token, --discovery-token-ca-cert-hash and
    /// --certificate-key.
    #[arg(long, conflicts_with_all = ["init", "join"])]
    join_from: Option<PathBuf>,
    /// Join the control plane whose API is at this URL (with --token,
    /// --discovery-token-ca-cert-hash and --certificate-key, as `--init` printed them).
    #[arg(long, requires_all = ["token", "discovery_token_ca_cert_hash", "certificate_key"])]
    join: Option<String>,
    /// Bootstrap token for --join.
    #[arg(long, env = "RKUBE_JOIN_TOKEN")]
    token: Option<String>,
    /// sha256:<hex> pin of the cluster CA for --join.
    #[arg(long)]
    discovery_token_ca_cert_hash: Option<String>,
    /// The key that decrypts the control-plane keys `--init` uploaded (64 hex digits).
    #[arg(long)]
    certificate_key: Option<String>,
    /// More names and addresses for this member's certificate (with --init or --join).
    #[arg(long, value_delimiter = ',')]
    cert_sans: Vec<String>,
    /// The ECDSA key that signs and verifies service account tokens; every control-plane
    /// member needs the same one (default: sa.key in the --pki directory).
    #[arg(long)]
    service_account_key_file: Option<PathBuf>,
    /// Client URLs to publish (default: derived from --listen-client).
    #[arg(long, value_delimiter = ',')]
    advertise_client_urls: Vec<String>,
    /// Every initial member as NAME=PEER_ADDRESS, comma-separated, this one included.
    #[arg(long, required_unless_present_any = ["init", "join", "join_from"])]
    initial_cluster: Option<String>,
    /// `new` bootstraps; `existing` joins a cluster that already added this member.
    #[arg(long, default_value = "new")]
    initial_cluster_state: String,
    /// Distinguishes clusters: members of one cluster share it; a data dir of another is refused.
    #[arg(long, default_value = "rkube-cluster")]
    initial_cluster_token: String,
    /// Directory with ca.crt, NAME.crt and NAME.key.
    #[arg(long)]
    pki: PathBuf,
    /// Serve clients over plain TCP instead of mutual TLS.
    #[arg(long)]
    insecure_client: bool,
    /// Raft heartbeat interval, milliseconds.
    #[arg(long, default_value_t = 100)]
    heartbeat_interval: u64,
    /// Raft election timeout, milliseconds: a follower that hears no leader for 1.0-1.2 times
    /// this campaigns (each member draws its factor once, at start).
    #[arg(long, default_value_t = 1000)]
    election_timeout: u64,
    /// Take a Raft snapshot after this many applied entries (etcd 3.4's default). A snapshot
    /// dumps the whole store; the log keeps up to this many entries plus the catch-up ones.
    #[arg(long, default_value_t = 100_000)]
    snapshot_count: u64,
    /// Entries kept in the log behind a snapshot for slow followers.
    #[arg(long, default_value_t = 5_000)]
    snapshot_catchup_entries: u64,
    /// Longest a client request waits for a leader, a quorum or the apply, milliseconds
    /// (default: etcd's, 5 s plus two election timeouts).
    #[arg(long)]
    request_timeout: Option<u64>,
    /// Interval of watch progress notifications, seconds.
    #[arg(long, default_value_t = 600)]
    watch_progress_notify_interval: u64,
    /// Database size in bytes past which the member raises a NOSPACE alarm and the cluster
    /// refuses writes (deletes and compaction still work) until the alarm is disarmed.
    #[arg(long, default_value_t = 2 * 1024 * 1024 * 1024)]
    quota_backend_bytes: u64,
    /// Quorum-loss recovery: start as the only member of the cluster, keeping this member's
    /// data (its IDs and revisions too); then add the other members back. Use it on one
    /// surviving member, once, with every other member stopped.
    #[arg(long)]
    force_new_cluster: bool,
    /// Acknowledge writes without syncing the write-ahead log (etcd's flag of the same name).
    /// A power cut then loses acknowledged writes: for tests that must show it, never for data
    /// anyone wants back.
    #[arg(long)]
    unsafe_no_fsync: bool,
    /// While leader, write a backup file this often, e.g. 30m, 1h, 10s (0: never).
    #[arg(long, default_value = "0", value_parser = flags::parse_snapshot_interval)]
    snapshot_interval: Duration,
    /// Scheduled snapshots to keep; older ones are deleted after each new one.
    #[arg(long, default_value_t = DEFAULT_RETAIN, value_parser = flags::parse_retain)]
    snapshot_retain: usize,
    /// Directory of the scheduled snapshots (default: DATA_DIR/snapshots).
    #[arg(long)]
    snapshot_dir: Option<PathBuf>,
    /// Zip the scheduled snapshots (FILE.snap.zip, as k3s's --etcd-snapshot-compress).
    #[arg(long)]
    snapshot_compress: bool,
    /// The control-plane endpoint's Kubernetes API (ADDRESS:PORT): while this member leads
    /// with a quorum, it serves the API there too. Give every member the same one; it becomes
    /// the default --advertise-api-url and is added to the certificates --init and --join issue.
    #[arg(long, requires = "listen_api")]
    vip_api: Option<SocketAddr>,
    /// The control-plane endpoint's etcd API (same ADDRESS as --vip-api, its own PORT).
    #[arg(long)]
    vip_client: Option<SocketAddr>,
    /// Put the endpoint's address on this interface while holding it (and announce it with
    /// gratuitous ARP), as kube-vip does; needs CAP_NET_ADMIN and CAP_NET_RAW. Without it the
    /// address must already be one of this host's.
    #[arg(long)]
    vip_interface: Option<String>,
}

fn server_config(a: ServerArgs) -> Result<ServerConfig> {
    let state = match a.initial_cluster_state.as_str() {
        "new" => ClusterState::New,
        "existing" => ClusterState::Existing,
        other => anyhow::bail!("--initial-cluster-state must be new or existing, not {other:?}"),
    };
    let snapshot_schedule = (!a.snapshot_interval.is_zero()).then(|| SnapshotSchedule {
        interval: a.snapshot_interval,
        retain: a.snapshot_retain,
        dir: a
            .snapshot_dir
            .clone()
            .unwrap_or_else(|| a.data_dir.join("snapshots")),
        compress: a.snapshot_compress,
    });
    Ok(ServerConfig {
        name: a.name,
        data_dir: a.data_dir,
        listen_peer: a.listen_peer,
        listen_client: a.listen_client,
        listen_metrics: a.listen_metrics,
        advertise_client: a.advertise_client_urls,
        initial_cluster: parse_initial_cluster(a.initial_cluster.as_deref().unwrap_or(""))
            .map_err(|e| anyhow::anyhow!("--initial-cluster: {e}"))?,
        initial_cluster_state: state,
        cluster_token: a.initial_cluster_token,
        pki_dir: a.pki,
        insecure_client: a.insecure_client,
        heartbeat: Duration::from_millis(a.heartbeat_interval),
        election_timeout: Duration::from_millis(a.election_timeout),
        snapshot_count: a.snapshot_count,
        snapshot_catchup_entries: a.snapshot_catchup_entries,
        request_timeout: Duration::from_millis(
            a.request_timeout.unwrap_or(5_000 + 2 * a.election_timeout),
        ),
        progress_interval: Duration::from_secs(a.watch_progress_notify_interval.max(1)),
        quota_backend_bytes: a.quota_backend_bytes,
        force_new_cluster: a.force_new_cluster,
        unsafe_no_fsync: a.unsafe_no_fsync,
        snapshot_schedule,
        endpoint: rkube_store::server::endpoint::EndpointConfig {
            api: a.vip_api,
            client: a.vip_client,
            interface: a.vip_interface,
        },
    })
}

/// The CSR and bootstrap signers' settings, when this member has the cluster CA's key.
fn certificate_settings(
    args: &ServerArgs,
) -> Result<Option<rkube_controllers::certificates::Settings>> {
    let key = args.pki.join(rkube_pki::CA_KEY_FILE);
    let (Some(listen), true) = (args.listen_api, key.exists()) else {
        return Ok(None);
    };
    let ca_pem = std::fs::read_to_string(args.pki.join(rkube_pki::CA_CERT_FILE))
        .context("reading the cluster CA certificate")?;
    let server_url = args
        .advertise_api_url
        .clone()
        .unwrap_or_else(|| format!("https://{listen}"));
    Ok(Some(rkube_controllers::certificates::Settings {
        signer: std::sync::Arc::new(rkube_pki::CsrSigner::load(&args.pki)?),
        ca_pem,
        server_url,
        // Kubernetes' shortest: 10 minutes (certificates are backdated 5 minutes for clock skew).
        signing_duration: args.cluster_signing_duration.max(Duration::from_secs(600)),
    }))
}

impl ServerArgs {
    /// `--worker-threads`, for the runtime built before the member starts.
    pub fn worker_threads(&self) -> Option<usize> {
        self.worker_threads.map(usize::from)
    }
}

pub async fn run(mut args: ServerArgs) -> Result<()> {
    // --init / --join: PKI and membership first, as kubeadm does them.
    let mut init_plan = None;
    let mut join_plan = None;
    let pki = args.pki.clone();
    // The control-plane endpoint is where joiners, nodes and the admin kubeconfig go, and the
    // certificates must name it.
    if let Some(vip) = args.vip_api.or(args.vip_client) {
        if let Some(api) = args.vip_api {
            args.advertise_api_url
                .get_or_insert_with(|| format!("https://{api}"));
        }
        args.cert_sans.push(vip.ip().to_string());
    }
    let in_cluster = args.service_cluster_ip_range.api_sans(&args.cluster_domain);
    args.cert_sans.extend(in_cluster);
    let advertise = args.advertise_api_url.clone();
    let sans = args.cert_sans.clone();
    let member = init::Member {
        name: &args.name.clone(),
        pki: &pki,
        listen_peer: args.listen_peer,
        listen_client: args.listen_client,
        listen_api: args.listen_api,
        advertise_api: advertise.as_deref(),
        extra_sans: &sans,
    };
    if args.init && !args.data_dir.join("member.json").exists() {
        let (mut plan, initial) = init::prepare_init(&member)?;
        plan.join_file = args.join_file.clone();
        args.initial_cluster.get_or_insert(initial);
        init_plan = Some(plan);
    } else if args.init {
        // Restarted after its first start: the data dir holds the membership.
        args.initial_cluster
            .get_or_insert(format!("{}=https://{}", args.name, args.listen_peer));
    }
    // A member that joined before restarts from its data dir, without joining again.
    if args.join_from.is_some() && args.data_dir.join("member.json").exists() {
        args.initial_cluster
            .get_or_insert(format!("{}=https://{}", args.name, args.listen_peer));
    }
    if let (Some(path), false) = (&args.join_from, args.data_dir.join("member.json").exists()) {
        let file = init::JoinFile::wait_read(path, Duration::from_secs(300)).await?;
        args.join = Some(file.server);
        args.token = Some(file.token);
        args.discovery_token_ca_cert_hash = Some(file.discovery_token_ca_cert_hash);
        args.certificate_key = Some(file.certificate_key);
    }
    if let Some(url) = args.join.clone() {
        let plan = init::prepare_join(
            &url,
            args.token.as_deref().unwrap_or(""),
            args.discovery_token_ca_cert_hash.as_deref().unwrap_or(""),
            args.certificate_key.as_deref().unwrap_or(""),
            &member,
        )
        .await?;
        args.initial_cluster = Some(plan.initial_cluster.clone());
        args.initial_cluster_state = "existing".into();
        join_plan = Some(plan);
    }
    let listen_api = args.listen_api;
    let metric_resolution = args.metric_resolution;
    let service_net = args.service_cluster_ip_range;
    let (listen_dns, cluster_domain, dns_upstream) = (
        args.listen_dns,
        args.cluster_domain.clone(),
        args.dns_upstream.clone(),
    );
    let member_name = args.name.clone();
    if listen_dns.is_some() && args.listen_api.is_none() {
        anyhow::bail!(
            "--listen-dns answers from the Kubernetes API's objects: it needs --listen-api"
        );
    }
    let sa_key_file = args
        .service_account_key_file
        .clone()
        .unwrap_or_else(|| args.pki.join(rkube_pki::SA_KEY_FILE));
    let controller_settings = rkube_controllers::Settings {
        node_lifecycle: rkube_controllers::nodelifecycle::Settings {
            monitor_period: args.node_monitor_period.max(Duration::from_millis(100)),
            grace_period: args.node_monitor_grace_period,
            eviction_rate: args.node_eviction_rate.max(0.0),
        },
        compaction_interval: args.compaction_interval,
        pod_gc: rkube_controllers::podgc::Settings {
            terminated_threshold: args.terminated_pod_gc_threshold,
            ..Default::default()
        },
        autoscaling: rkube_controllers::podautoscaler::Settings {
            sync_period: args
                .horizontal_pod_autoscaler_sync_period
                .max(Duration::from_millis(100)),
            tolerance: args.horizontal_pod_autoscaler_tolerance.max(0.0),
            ..Default::default()
        },
        certificates: certificate_settings(&args)?,
        load_balancer_pool: args.load_balancer_ip_range.clone(),
        root_ca: match args.listen_api {
            Some(_) => Some(
                std::fs::read_to_string(args.pki.join(rkube_pki::CA_CERT_FILE))
                    .context("reading the cluster CA certificate")?,
            ),
            None => None,
        },
    };
    let cfg = server_config(args)?;
    let kubelet_client_dir = cfg.pki_dir.clone();
    let tls_files = rkube_pki::TlsFiles::for_member(&cfg.pki_dir, &cfg.name);
    let mut server = rkube_store::server::start(cfg).await?;
    let api =
        match listen_api {
            Some(listen) => {
                let tls = tls_files.load()?;
                let (sa_private, sa_public) = rkube_pki::load_service_account_key(&sa_key_file)
                .with_context(|| {
                    "the API server signs service account tokens with it; `rkube up` creates it, \
                     and every control-plane member needs a copy of the same file"
                })?;
                let api = rkube_api::start(
                    server.node.clone(),
                    rkube_api::ApiConfig {
                        listen,
                        endpoint: server.endpoint_api.take(),
                        tls,
                        service_net,
                        service_account_key: rkube_api::token::SigningKey::from_pem(
                            &sa_private,
                            &sa_public,
                        )?,
                        kubelet_client: {
                            let stem = kubelet_client_dir.join(rkube_pki::KUBELET_CLIENT);
                            match (
                                std::fs::read(stem.with_extension("crt")),
                                std::fs::read(stem.with_extension("key")),
                            ) {
                                (Ok(c), Ok(k)) => Some((c, k)),
                                _ => None,
                            }
                        },
                        metric_resolution,
                    },
                )
                .await?;
                tracing::info!(addr = %api.addr, "serving the Kubernetes API");
                server.status_page.show_nodes(std::sync::Arc::new(
                    rkube_api::status_page::Nodes::new(server.node.clone()),
                ));
                let dns_client = || {
                    api.client(rkube_api::auth::User {
                        name: "system:kube-dns".into(),
                        groups: vec!["system:masters".into(), "system:authenticated".into()],
                        ..Default::default()
                    })
                };
                if let Some(listen) = listen_dns {
                    let upstream = if dns_upstream.is_empty() {
                        rkube_api::dns::resolv_conf_servers(
                            &std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
                        )
                    } else {
                        dns_upstream
                            .iter()
                            .map(|u| {
                                u.parse::<SocketAddr>().or_else(|_| {
                                    u.parse::<std::net::IpAddr>()
                                        .map(|ip| SocketAddr::new(ip, 53))
                                })
                            })
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|e| anyhow::anyhow!("--dns-upstream: {e}"))?
                    };
                    let cfg = rkube_api::dns::DnsConfig {
                        listen,
                        domain: cluster_domain.clone(),
                        upstream,
                    };
                    let client = dns_client();
                    tokio::spawn(async move {
                        if let Err(e) = rkube_api::dns::serve(cfg, client).await {
                            tracing::error!(%listen, error = %e, "cluster DNS is not served");
                        }
                    });
                    tracing::info!(addr = %listen, "serving cluster DNS");
                }
                tokio::spawn(rkube_api::dns::publish_member(
                    dns_client(),
                    member_name.clone(),
                    api.addr,
                    listen_dns,
                ));
                // The controllers and the scheduler run while this member leads, writing through
                // the API as a trusted in-process client.
                let controllers = rkube_controllers::start(
                    server.node.clone(),
                    api.client(rkube_api::auth::User {
                        name: "system:kube-controller-manager".into(),
                        groups: vec!["system:masters".into(), "system:authenticated".into()],
                        ..Default::default()
                    }),
                    controller_settings,
                    vec![std::sync::Arc::new(rkube_scheduler::runner::start)],
                );
                if let Some(plan) = init_plan {
                    let admin = api.client(rkube_api::auth::User {
                        name: "kubernetes-admin".into(),
                        groups: vec!["system:masters".into(), "system:authenticated".into()],
                        ..Default::default()
                    });
                    tokio::spawn(async move {
                        if let Err(e) = init::finish_init(admin, plan).await {
                            eprintln!("Error: {e:#}");
                        }
                    });
                }
                Some((api, controllers))
            }
            None => None,
        };
    if let Some(plan) = join_plan {
        tokio::spawn(init::promote_when_ready(plan));
    }
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = sigint.recv() => {}
        _ = sigterm.recv() => {}
    }
    tracing::info!("shutting down");
    if let Some((api, controllers)) = api {
        controllers.shutdown().await;
        api.shutdown().await;
    }
    server.shutdown().await;
    Ok(())
}
