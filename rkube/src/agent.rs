//! `rkube agent`: the node agent's flags, and the agent started with them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::{flags, init};

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// API server URL(s), comma-separated (https://host:port); the agent fails over between
    /// them.
    #[arg(long, value_delimiter = ',', required_unless_present = "join_from")]
    server: Vec<String>,
    /// Join with what the first control-plane member's --join-file holds (its API URL, token
    /// and CA pin), waiting up to 5 minutes for the file.
    #[arg(long)]
    join_from: Option<PathBuf>,
    /// Bootstrap token to join with (not needed once the node has its certificate).
    #[arg(long, env = "RKUBE_JOIN_TOKEN")]
    token: Option<String>,
    /// sha256:<hex> of the cluster CA's public key, as `rkube server --init` and
    /// `rkube token create --print-join-command` print it.
    #[arg(long)]
    discovery_token_ca_cert_hash: Option<String>,
    /// Where the agent keeps its certificate and state.
    #[arg(long)]
    dir: PathBuf,
    /// The node's name (default: the host name); with --nodes N, the prefix of <name>-<i>.
    #[arg(long)]
    name: Option<String>,
    /// Simulated runtime: no processes; containers run after --sim-start-delay and stay so.
    #[arg(long)]
    sim: bool,
    /// Without --sim: the CRI socket of the container runtime (containerd's).
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    container_runtime_endpoint: PathBuf,
    /// Without --sim: write the node's CNI network (bridge + host-local over --pod-cidr) into
    /// this directory, the runtime's CNI configuration directory.
    #[arg(long)]
    cni_conf_dir: Option<PathBuf>,
    /// The bridge of the node's CNI network.
    #[arg(long, default_value = "cni0")]
    cni_bridge: String,
    /// The service proxy: iptables (program the node's nat and filter tables so that Services
    /// carry traffic, as kube-proxy) or none (an agent sharing a host whose rules are not its
    /// own). The simulated runtime programs nothing.
    #[arg(long, default_value = "iptables", value_parser = ["iptables", "none"])]
    proxy_mode: String,
    /// The HTTPS port the API server reaches for container logs (the kubelet's 10250); 0: none.
    #[arg(long, default_value_t = 10250)]
    port: u16,
    /// Simulated nodes this process runs (with --sim).
    #[arg(long, default_value_t = 1)]
    nodes: u32,
    /// The node's address, reported as its InternalIP and used as pods' hostIP.
    #[arg(long, default_value = "127.0.0.1")]
    node_ip: String,
    /// The node's pod CIDR (with --nodes N, split into one /24 per node).
    #[arg(long)]
    pod_cidr: Option<String>,
    /// The cluster DNS server(s) pods resolve with (the kube-dns Service's address, the tenth
    /// of the service range: 10.96.0.10 by default); none: pods use the node's resolv.conf.
    #[arg(long, value_delimiter = ',')]
    cluster_dns: Vec<String>,
    /// The cluster's DNS domain, for pods' search path.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// Serve the agent's metrics (the service proxy's rules, programmed or, on simulated nodes,
    /// only worked out) as Prometheus text on http://ADDR/metrics.
    #[arg(long)]
    listen_metrics: Option<std::net::SocketAddr>,
    /// The node's CPU capacity (default: the host's CPUs on a containerd node, 4 on simulated
    /// nodes).
    #[arg(long)]
    cpu: Option<String>,
    /// The node's memory capacity (default: the host's memory on a containerd node, 8Gi on
    /// simulated nodes).
    #[arg(long)]
    memory: Option<String>,
    /// The node's ephemeral-storage capacity (default: the size of the filesystem of --dir on a
    /// containerd node, 100Gi on simulated nodes).
    #[arg(long)]
    ephemeral_storage: Option<String>,
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// Label the node control-plane and taint it NoSchedule (an agent beside a server).
    #[arg(long)]
    control_plane: bool,
    /// How often the node's Lease is renewed.
    #[arg(long, default_value = "10s", value_parser = flags::parse_duration)]
    lease_interval: Duration,
    /// The Node's status is written when it changes and at least this often.
    #[arg(long, default_value = "5m", value_parser = flags::parse_duration)]
    status_report_interval: Duration,
    /// How long joining keeps trying while the servers are not ready or the token is not
    /// (yet) known to them.
    #[arg(long, default_value = "5m", value_parser = flags::parse_duration)]
    discovery_timeout: Duration,
    /// With --sim: how long a pod takes to start.
    #[arg(long, default_value = "0s", value_parser = flags::parse_duration)]
    sim_start_delay: Duration,
}

pub async fn run(mut a: AgentArgs) -> Result<()> {
    if let Some(path) = &a.join_from {
        let file = init::JoinFile::wait_read(path, Duration::from_secs(300)).await?;
        if a.server.is_empty() {
            a.server = vec![file.server];
        }
        a.token.get_or_insert(file.token);
        a.discovery_token_ca_cert_hash
            .get_or_insert(file.discovery_token_ca_cert_hash);
    }
    let name = match a.name {
        Some(n) => n,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_lowercase())
            .unwrap_or_else(|_| "node".into()),
    };
    rkube_agent::run(rkube_agent::AgentConfig {
        servers: a.server,
        token: a.token,
        ca_cert_hash: a.discovery_token_ca_cert_hash,
        dir: a.dir,
        name: name.clone(),
        nodes: a.nodes,
        discovery_timeout: a.discovery_timeout,
        cri_socket: (!a.sim).then(|| a.container_runtime_endpoint.clone()),
        cni_conf_dir: a.cni_conf_dir.clone(),
        cni_bridge: a.cni_bridge.clone(),
        program_services: a.proxy_mode == "iptables",
        cluster_dns: a.cluster_dns.clone(),
        cluster_domain: a.cluster_domain.clone(),
        listen_metrics: a.listen_metrics,
        node: rkube_agent::NodeConfig {
            name,
            node_ip: a.node_ip,
            pod_cidr: a.pod_cidr,
            cpu: a.cpu.unwrap_or_default(),
            memory: a.memory.unwrap_or_default(),
            ephemeral_storage: a.ephemeral_storage.unwrap_or_default(),
            allocatable_memory: String::new(),
            allocatable_ephemeral_storage: String::new(),
            max_pods: a.max_pods,
            control_plane: a.control_plane,
            runtime_version: if a.sim {
                "sim://0.1.0".into()
            } else {
                String::new()
            },
            lease_interval: a.lease_interval.max(Duration::from_millis(100)),
            status_report_interval: a.status_report_interval,
            sim_start_delay: a.sim_start_delay,
            kubelet_port: a.port,
            volumes_dir: None,
        },
    })
    .await
}
