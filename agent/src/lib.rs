//! `rkube agent`: rkube's kubelet. A separate process that reaches the control plane over
//! HTTPS only: it joins with a bootstrap token ([`join`]), registers its Node and heartbeats
//! its Lease ([`node`]), and runs the pods bound to it ([`pods`]).
//!
//! Runtimes: `sim` (kwok-style: no processes; containers are Running after a delay and stay
//! so), with which one process can simulate many nodes (`--nodes N`); and `cri`, which runs
//! real containers through containerd's CRI socket (`cri.rs` speaks CRI, `cri_pods.rs` runs a
//! pod's sandbox, init and app containers, probes and restarts, and reports its status).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};

pub mod cri;
pub mod cri_pods;
pub mod exec_websocket;
pub mod join;
pub mod node;
pub mod pods;
pub mod podspec;
pub mod portforward_tunnel;
pub mod probe;
pub mod projected;
pub mod proxy;
pub mod server;
pub mod spdy;
pub mod stats;
pub mod volumes;

/// The Kubernetes version the agent reports as its kubelet's.
pub const KUBELET_VERSION: &str = "v1.32.0";

/// One node's settings.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub name: String,
    pub node_ip: String,
    pub pod_cidr: Option<String>,
    /// Capacity; on a containerd node left empty, they are detected (CPUs, memory, the size of
    /// the filesystem of the agent's data dir).
    pub cpu: String,
    pub memory: String,
    pub ephemeral_storage: String,
    /// Capacity less the kubelet's default hard eviction thresholds (memory.available 100Mi,
    /// nodefs.available 10%); filled in by [`run`].
    pub allocatable_memory: String,
    pub allocatable_ephemeral_storage: String,
    pub max_pods: u32,
    pub control_plane: bool,
    pub runtime_version: String,
    pub lease_interval: Duration,
    pub status_report_interval: Duration,
    pub sim_start_delay: Duration,
    /// The agent's HTTPS port for the API server (container logs); 0: none.
    pub kubelet_port: u16,
    /// Where the node's local-path volumes live (containerd nodes: `<dir>/storage`), announced
    /// to the provisioner on the Node; None: nowhere (simulated nodes mount nothing).
    pub volumes_dir: Option<PathBuf>,
}

/// What `rkube agent` was asked to run.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub servers: Vec<String>,
    pub token: Option<String>,
    pub ca_cert_hash: Option<String>,
    pub dir: PathBuf,
    /// The node's name; with `nodes` > 1, the prefix of `<name>-<i>`.
    pub name: String,
    pub nodes: u32,
    pub node: NodeConfig,
    /// How long discovery keeps trying a server that is not ready or has not signed the token.
    pub discovery_timeout: Duration,
    /// The CRI runtime's socket; None: the simulated runtime.
    pub cri_socket: Option<PathBuf>,
    /// With the CRI runtime: where to write the CNI network for the node's pod CIDR (a bridge
    /// and host-local addresses), and the bridge's name.
    pub cni_conf_dir: Option<PathBuf>,
    pub cni_bridge: String,
    /// Program the node's service rules (iptables), as kube-proxy; false: only work out what
    /// they would be (the simulated runtime always, or a node whose host is shared).
    pub program_services: bool,
    /// The cluster DNS servers written into pods' resolv.conf (dnsPolicy ClusterFirst), and
    /// the domain of their search path.
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    /// Where to serve Prometheus metrics over plain HTTP (`/metrics`); None: nowhere.
    pub listen_metrics: Option<std::net::SocketAddr>,
}

/// The CNI network of a node: its pods on a bridge (the bridge's address the gateway), with
/// addresses from the node's pod CIDR, recorded under `ipam_dir` (not shared with other nodes).
pub fn cni_conflist(bridge: &str, pod_cidr: &str, ipam_dir: &std::path::Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0", "name": "rkube",
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false,
             "hairpinMode": true,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_cidr}]],
                      "dataDir": ipam_dir,
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
    .to_string()
}

/// The pod CIDR of the `i`-th of `n` nodes: `cidr` itself for one node, else its `i`-th /24.
pub fn pod_cidr_of(cidr: &str, i: u32, n: u32) -> Result<String> {
    if n <= 1 {
        return Ok(cidr.to_string());
    }
    let (addr, len) = cidr
        .split_once('/')
        .ok_or_else(|| anyhow::anyhow!("--pod-cidr {cidr:?} is not a CIDR"))?;
    let addr: std::net::Ipv4Addr = addr.parse()?;
    let len: u32 = len.parse()?;
    if len > 24 || (n as u64) > (1u64 << (24 - len)) {
        bail!("--pod-cidr {cidr} cannot give {n} nodes a /24 each");
    }
    let base = u32::from(addr) & !((1u32 << (32 - len)) - 1);
    Ok(format!("{}/24", std::net::Ipv4Addr::from(base + (i << 8))))
}

/// Fills in what the flags left empty: on a containerd node (`detect_on`: its data dir) the
/// host's CPUs, memory and filesystem size; on simulated nodes 4 CPUs, 8Gi and 100Gi. The
/// allocatable amounts are those less the kubelet's default hard eviction thresholds.
fn resources(node: &mut NodeConfig, detect_on: Option<&std::path::Path>) {
    let detected = |host: Option<String>, simulated: &str| match detect_on {
        Some(_) => host.unwrap_or_else(|| simulated.to_string()),
        None => simulated.to_string(),
    };
    if node.cpu.is_empty() {
        let cpus = std::thread::available_parallelism()
            .ok()
            .map(|n| n.get().to_string());
        node.cpu = detected(cpus, "4");
    }
    if node.memory.is_empty() {
        let total = node::meminfo("MemTotal").map(|b| format!("{}Ki", b / 1024));
        node.memory = detected(total, "8Gi");
    }
    if node.ephemeral_storage.is_empty() {
        let size = detect_on
            .and_then(node::filesystem)
            .map(|(total, _)| format!("{}Ki", total / 1024));
        node.ephemeral_storage = detected(size, "100Gi");
    }
    let bytes = |q: &str| {
        rkube_core::quantity::parse_quantity(q)
            .and_then(|nanos| u64::try_from(nanos / 1_000_000_000).ok())
    };
    node.allocatable_memory = match bytes(&node.memory) {
        Some(b) => format!("{}Ki", b.saturating_sub(100 << 20) / 1024),
        None => node.memory.clone(),
    };
    node.allocatable_ephemeral_storage = match bytes(&node.ephemeral_storage) {
        Some(b) => format!("{}Ki", (b - b / 10) / 1024),
        None => node.ephemeral_storage.clone(),
    };
}

/// Joins and runs every node until the process is stopped.
pub async fn run(mut cfg: AgentConfig) -> Result<()> {
    if cfg.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let cri = match &cfg.cri_socket {
        Some(socket) => {
            if cfg.nodes > 1 {
                bail!("--nodes needs the simulated runtime: one containerd runs one node");
            }
            let c = cri::Cri::connect(socket, &cfg.dir.join("pods"))
                .await?
                .with_dns(cfg.cluster_dns.clone(), cfg.cluster_domain.clone());
            let version = c.version().await.map_err(|e| {
                anyhow::anyhow!(
                    "the container runtime at {} does not answer the CRI: {e}",
                    socket.display()
                )
            })?;
            tracing::info!(runtime = %version, "container runtime ready");
            cfg.node.runtime_version = version;
            if let (Some(dir), Some(cidr)) = (&cfg.cni_conf_dir, &cfg.node.pod_cidr) {
                std::fs::create_dir_all(dir)?;
                std::fs::write(
                    dir.join("10-rkube.conflist"),
                    cni_conflist(&cfg.cni_bridge, cidr, &cfg.dir.join("ipam")),
                )?;
            }
            Some(c)
        }
        None => None,
    };
    resources(&mut cfg.node, cri.is_some().then_some(cfg.dir.as_path()));
    let names: Vec<String> = if cfg.nodes == 1 {
        vec![cfg.name.clone()]
    } else {
        (0..cfg.nodes)
            .map(|i| format!("{}-{i}", cfg.name))
            .collect()
    };
    let mut joins = Vec::new();
    let mut joined = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut node = cfg.node.clone();
        node.name = name.clone();
        node.pod_cidr = match &cfg.node.pod_cidr {
            Some(c) => Some(pod_cidr_of(c, i as u32, cfg.nodes)?),
            None => None,
        };
        let cfg = cfg.clone();
        let runtime = cri.clone();
        joins.push(tokio::spawn(async move {
            let dir = if cfg.nodes == 1 {
                cfg.dir.clone()
            } else {
                cfg.dir.join(&node.name)
            };
            let clients = join::Clients::join(
                cfg.servers.clone(),
                cfg.token.as_deref(),
                cfg.ca_cert_hash.as_deref(),
                &dir,
                &node.name,
                cfg.discovery_timeout,
            )
            .await?;
            if runtime.is_some() {
                let storage = std::path::absolute(dir.join("storage"))?;
                node.volumes_dir = Some(storage);
            }
            let node = Arc::new(node);
            tokio::spawn(clients.clone().rotate_forever());
            tokio::spawn(node::run(
                clients.clone(),
                node.clone(),
                runtime,
                dir.clone(),
            ));
            anyhow::Ok((clients, node))
        }));
        // Many simulated nodes join a few at a time rather than all at once.
        if joins.len() % 16 == 0 {
            for j in joins.drain(..) {
                joined.push(j.await??);
            }
        }
    }
    for j in joins {
        joined.push(j.await??);
    }
    let sim = Arc::new(stats::SimUsage::default());
    // The port the API server reaches for logs: one node per process.
    if let [(clients, node)] = joined.as_slice() {
        if node.kubelet_port != 0 {
            let ip: std::net::IpAddr = node.node_ip.parse().unwrap_or([127, 0, 0, 1].into());
            let addr = std::net::SocketAddr::new(ip, node.kubelet_port);
            let ca = clients.ca_pem().to_string();
            let runtime = cri.clone().map(|c| (c, cfg.dir.join("pods")));
            let name = node.name.clone();
            let sim = sim.clone();
            tokio::spawn(async move {
                if let Err(e) = server::serve(addr, ca, name, runtime, sim).await {
                    tracing::warn!(%addr, error = %format!("{e:#}"), "the agent's HTTPS port is not served: kubectl logs cannot reach this node");
                }
            });
        }
    }
    // The service proxy: one per process (simulated nodes share the rules they would have).
    if let Some((clients, node)) = joined.first() {
        let program = cfg.program_services && cri.is_some();
        let metrics = proxy::ProxyMetrics::default();
        if let Some(addr) = cfg.listen_metrics {
            let mut registry = prometheus_client::registry::Registry::default();
            metrics.register(&mut registry);
            tokio::spawn(server::serve_metrics(addr, registry));
        }
        tokio::spawn(proxy::run(
            clients.clone(),
            node.name.clone(),
            node.node_ip.clone(),
            program,
            metrics,
        ));
    }
    tokio::spawn(volumes::clean_up(joined.clone()));
    tokio::spawn(pods::run(joined, cri, sim));
    tracing::info!(nodes = names.len(), "agent running");
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = sigint.recv() => {}
        _ = sigterm.recv() => {}
    }
    tracing::info!("agent stopping");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_nodes_get_a_slash_24_each() {
        assert_eq!(pod_cidr_of("10.244.0.0/16", 0, 1).unwrap(), "10.244.0.0/16");
        assert_eq!(pod_cidr_of("10.244.0.0/16", 0, 3).unwrap(), "10.244.0.0/24");
        assert_eq!(pod_cidr_of("10.244.0.0/16", 2, 3).unwrap(), "10.244.2.0/24");
        assert_eq!(
            pod_cidr_of("10.0.0.0/15", 300, 500).unwrap(),
            "10.1.44.0/24"
        );
        assert!(pod_cidr_of("10.244.0.0/24", 0, 2).is_err());
    }
}
