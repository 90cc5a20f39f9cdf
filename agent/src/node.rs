//! The Node and its heartbeat: the agent registers its Node (capacity, allocatable, labels,
//! addresses, nodeInfo), renews its Lease in kube-node-lease every lease interval, and writes
//! the Node's conditions when they change and at least every status report interval. A Node
//! deleted under a running agent is registered again.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::join::Clients;
use crate::pods::now;
use crate::NodeConfig;

/// How long a Lease says it lasts (the kubelet's 40 s).
const LEASE_DURATION_SECONDS: i32 = 40;

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The Node object an agent registers.
pub fn node_object(cfg: &NodeConfig) -> Node {
    let mut labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", cfg.name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", arch()),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", arch()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut spec = NodeSpec::default();
    if cfg.control_plane {
        labels.insert(
            "node-role.kubernetes.io/control-plane".into(),
            String::new(),
        );
        spec.taints = Some(vec![Taint {
            key: "node-role.kubernetes.io/control-plane".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }]);
    }
    if let Some(cidr) = &cfg.pod_cidr {
        spec.pod_cidr = Some(cidr.clone());
        spec.pod_cidrs = Some(vec![cidr.clone()]);
    }
    let mut annotations =
        BTreeMap::from([("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string())]);
    if let Some(dir) = &cfg.volumes_dir {
        annotations.insert(
            rkube_core::volume::LOCAL_PATH_DIR.into(),
            dir.display().to_string(),
        );
    }
    Node {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// What the node observed of itself at one heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Ready, or why not (the container runtime's own status on containerd nodes).
    pub ready: Result<(), String>,
    /// Measured against the kubelet's default hard eviction thresholds; None where nothing is
    /// measured (simulated nodes share their host with the others).
    pub memory_pressure: Option<bool>,
    pub disk_pressure: Option<bool>,
}

/// The kubelet's default hard eviction threshold for memory.available.
const MEMORY_AVAILABLE_MIN: u64 = 100 * 1024 * 1024;
/// ... and for nodefs.available, in percent of the filesystem.
const NODEFS_AVAILABLE_MIN_PERCENT: u64 = 10;

/// Observes the node: the runtime's readiness and, on containerd nodes, memory and disk
/// against the kubelet's eviction thresholds (`dir`: the agent's data dir, on the node's
/// filesystem).
pub async fn observe(runtime: Option<&crate::cri::Cri>, dir: &std::path::Path) -> Observed {
    match runtime {
        None => Observed {
            ready: Ok(()),
            memory_pressure: None,
            disk_pressure: None,
        },
        Some(cri) => Observed {
            ready: cri.readiness().await,
            memory_pressure: meminfo("MemAvailable").map(|a| a < MEMORY_AVAILABLE_MIN),
            disk_pressure: filesystem(dir)
                .map(|(total, avail)| avail * 100 < total * NODEFS_AVAILABLE_MIN_PERCENT),
        },
    }
}

/// A /proc/meminfo field, in bytes.
pub fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib * 1024)
    })
}

/// The size and the space available to unprivileged users of the filesystem holding `dir`,
/// in bytes.
pub fn filesystem(dir: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `st` a statvfs the call fills in.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize))
}

/// The Node's status: resources, addresses, what runs it, and the observed conditions; a
/// condition keeps its transition time from `previous` (the Node's current conditions) while
/// its status stays.
fn node_status(cfg: &NodeConfig, observed: &Observed, previous: &[NodeCondition]) -> NodeStatus {
    let resources = |memory: &str, storage: &str| -> BTreeMap<String, Quantity> {
        [
            ("cpu", cfg.cpu.clone()),
            ("memory", memory.to_string()),
            ("pods", cfg.max_pods.to_string()),
            ("ephemeral-storage", storage.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), Quantity(v)))
        .collect()
    };
    let heartbeat = now();
    let cond = |t: &str, status: &str, reason: &str, message: &str| {
        let since = previous
            .iter()
            .find(|c| c.type_ == t && c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or_else(now);
        NodeCondition {
            type_: t.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_heartbeat_time: Some(heartbeat.clone()),
            last_transition_time: Some(since),
        }
    };
    // (type, observed, reason and message without pressure, with pressure)
    let pressures = [
        (
            "MemoryPressure",
            observed.memory_pressure,
            (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
        ),
        (
            "DiskPressure",
            observed.disk_pressure,
            ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("KubeletHasDiskPressure", "kubelet has disk pressure"),
        ),
    ];
    let mut conditions = Vec::new();
    for (kind, seen, fine, pressed) in pressures {
        match seen {
            Some(false) => conditions.push(cond(kind, "False", fine.0, fine.1)),
            Some(true) => conditions.push(cond(kind, "True", pressed.0, pressed.1)),
            None => {}
        }
    }
    conditions.push(match &observed.ready {
        Ok(()) => cond(
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status",
        ),
        Err(why) => cond("Ready", "False", "KubeletNotReady", why),
    });
    NodeStatus {
        capacity: Some(resources(&cfg.memory, &cfg.ephemeral_storage)),
        allocatable: Some(resources(
            &cfg.allocatable_memory,
            &cfg.allocatable_ephemeral_storage,
        )),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: cfg.node_ip.clone(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: cfg.name.clone(),
            },
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(cfg.kubelet_port),
            }),
        }),
        node_info: Some(NodeSystemInfo {
            kernel_version: kernel_version(),
            os_image: "rkube agent".into(),
            container_runtime_version: cfg.runtime_version.clone(),
            kubelet_version: crate::KUBELET_VERSION.into(),
            kube_proxy_version: crate::KUBELET_VERSION.into(),
            operating_system: "linux".into(),
            architecture: arch().into(),
            ..NodeSystemInfo::default()
        }),
        conditions: Some(conditions),
        ..NodeStatus::default()
    }
}

fn kernel_version() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Creates the Node (or finds it there) and posts its status; returns the Node's uid.
async fn register(clients: &Clients, cfg: &NodeConfig, observed: &Observed) -> Result<String> {
    let api: Api<Node> = Api::all(clients.get());
    let node = node_object(cfg);
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => tracing::info!(node = %cfg.name, "registered the node"),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    post_status(clients, cfg, observed)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the node was deleted while registering"))
}

/// Posts the Node's status; None when the Node is gone. Returns its uid.
async fn post_status(
    clients: &Clients,
    cfg: &NodeConfig,
    observed: &Observed,
) -> Result<Option<String>> {
    let api: Api<Node> = Api::all(clients.get());
    let Some(current) = api.get_opt(&cfg.name).await? else {
        return Ok(None);
    };
    let previous = current
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let patch = json!({ "status": node_status(cfg, observed, &previous) });
    api.patch_status(&cfg.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(current.metadata.uid)
}

/// The node's Lease held by it, renewed now.
fn lease_spec(cfg: &NodeConfig) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(cfg.name.clone()),
        renew_time: Some(MicroTime(Timestamp::now())),
        lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
        ..LeaseSpec::default()
    }
}

/// Renews the Lease with one write; Ok(false) when it does not exist.
async fn renew_lease(clients: &Clients, cfg: &NodeConfig) -> Result<bool> {
    let api: Api<Lease> = Api::namespaced(clients.get(), "kube-node-lease");
    let patch = json!({ "spec": lease_spec(cfg) });
    match api
        .patch(&cfg.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

async fn create_lease(clients: &Clients, cfg: &NodeConfig, node_uid: &str) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(clients.get(), "kube-node-lease");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            namespace: Some("kube-node-lease".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: cfg.name.clone(),
                uid: node_uid.to_string(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(lease_spec(cfg)),
    };
    match api.create(&PostParams::default(), &lease).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Registers the node, then heartbeats until the process ends: one Lease write per interval;
/// the Node's status when the report interval has passed or after the heartbeat failed (the
/// node controller may have marked the node meanwhile). A Node deleted meanwhile (its Lease
/// goes with it) is registered again.
pub async fn run(
    clients: Arc<Clients>,
    cfg: Arc<NodeConfig>,
    runtime: Option<crate::cri::Cri>,
    dir: std::path::PathBuf,
) {
    let mut registered: Option<String> = None;
    let mut last_status = tokio::time::Instant::now();
    let mut stale = false;
    let mut posted: Option<Observed> = None;
    loop {
        let observed = observe(runtime.as_ref(), &dir).await;
        if posted.as_ref().is_some_and(|p| *p != observed) {
            tracing::info!(node = %cfg.name, ?observed, "the node's conditions changed");
            stale = true;
        }
        let uid = match &registered {
            Some(uid) => uid.clone(),
            None => match register(&clients, &cfg, &observed).await {
                Ok(uid) => {
                    last_status = tokio::time::Instant::now();
                    stale = false;
                    posted = Some(observed.clone());
                    registered = Some(uid.clone());
                    uid
                }
                Err(e) => {
                    tracing::warn!(node = %cfg.name, error = %e, "registering the node failed; retrying");
                    clients.fail_over().await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
        };
        match renew_lease(&clients, &cfg).await {
            Ok(true) => {}
            Ok(false) => {
                // No Lease: a new node, or the Node (and with it its Lease) was deleted.
                match Api::<Node>::all(clients.get()).get_opt(&cfg.name).await {
                    Ok(Some(n)) if n.metadata.uid.as_deref() == Some(uid.as_str()) => {
                        if let Err(e) = create_lease(&clients, &cfg, &uid).await {
                            tracing::warn!(node = %cfg.name, error = %e, "creating the lease failed");
                        }
                    }
                    Ok(_) => {
                        tracing::info!(node = %cfg.name, "the node was deleted; registering it again");
                        registered = None;
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(node = %cfg.name, error = %e, "reading the node failed");
                        stale = true;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(node = %cfg.name, error = %e, "renewing the lease failed");
                clients.fail_over().await;
                stale = true;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        }
        if stale || last_status.elapsed() >= cfg.status_report_interval {
            match post_status(&clients, &cfg, &observed).await {
                Ok(Some(_)) => {
                    last_status = tokio::time::Instant::now();
                    stale = false;
                    posted = Some(observed.clone());
                }
                Ok(None) => {
                    registered = None;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(node = %cfg.name, error = %e, "posting the node status failed")
                }
            }
        }
        tokio::time::sleep(cfg.lease_interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn config() -> NodeConfig {
        NodeConfig {
            name: "n1".into(),
            node_ip: "10.0.0.5".into(),
            pod_cidr: Some("10.244.1.0/24".into()),
            cpu: "4".into(),
            memory: "8Gi".into(),
            ephemeral_storage: "100Gi".into(),
            allocatable_memory: "8092Mi".into(),
            allocatable_ephemeral_storage: "90Gi".into(),
            max_pods: 110,
            control_plane: true,
            runtime_version: "containerd://2.0".into(),
            lease_interval: Duration::from_secs(10),
            status_report_interval: Duration::from_secs(60),
            sim_start_delay: Duration::ZERO,
            kubelet_port: 10250,
            volumes_dir: None,
        }
    }

    #[test]
    fn the_node_registers_with_its_role_cidr_and_resources() {
        let cfg = config();
        let node = serde_json::to_value(node_object(&cfg)).unwrap();
        assert_eq!(node["kind"], "Node");
        assert_eq!(
            node["metadata"]["labels"]["node-role.kubernetes.io/control-plane"],
            ""
        );
        assert_eq!(node["spec"]["taints"][0]["effect"], "NoSchedule");
        assert_eq!(node["spec"]["podCIDRs"][0], "10.244.1.0/24");
        let observed = Observed {
            ready: Err("runtime down".into()),
            memory_pressure: Some(false),
            disk_pressure: None,
        };
        let since = Time(Timestamp::from_second(1_000_000).unwrap());
        let previous = [NodeCondition {
            type_: "MemoryPressure".into(),
            status: "False".into(),
            last_transition_time: Some(since.clone()),
            ..NodeCondition::default()
        }];
        let status = node_status(&cfg, &observed, &previous);
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
        assert_eq!(json["allocatable"]["memory"], "8092Mi");
        assert_eq!(json["capacity"]["pods"], "110");
        let conditions = status.conditions.unwrap();
        let kinds: Vec<(&str, &str)> = conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(kinds, vec![("MemoryPressure", "False"), ("Ready", "False")]);
        assert_eq!(
            conditions[0].last_transition_time,
            Some(since),
            "kept while it stays"
        );
        assert_eq!(conditions[1].message.as_deref(), Some("runtime down"));
    }
}
