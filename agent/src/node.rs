//! The Node and its heartbeat: the agent registers its Node (capacity, allocatable, labels,
//! addresses, nodeInfo), renews its Lease in kube-node-lease every lease interval, and writes
//! the Node's conditions when they change and at least every status report interval. A Node
//! deleted under a running agent is registered again.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use crate::join::Clients;
use crate::NodeConfig;

/// How long a Lease says it lasts (the kubelet's 40 s).
const LEASE_DURATION_SECONDS: i32 = 40;

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The Node object an agent registers.
pub fn node_object(cfg: &NodeConfig) -> Value {
    let mut labels = serde_json::Map::new();
    labels.insert("kubernetes.io/hostname".into(), json!(cfg.name));
    labels.insert("kubernetes.io/os".into(), json!("linux"));
    labels.insert("kubernetes.io/arch".into(), json!(arch()));
    labels.insert("beta.kubernetes.io/os".into(), json!("linux"));
    labels.insert("beta.kubernetes.io/arch".into(), json!(arch()));
    let mut spec = json!({});
    if cfg.control_plane {
        labels.insert("node-role.kubernetes.io/control-plane".into(), json!(""));
        spec["taints"] = json!([{"key": "node-role.kubernetes.io/control-plane",
                                  "effect": "NoSchedule"}]);
    }
    if let Some(cidr) = &cfg.pod_cidr {
        spec["podCIDR"] = json!(cidr);
        spec["podCIDRs"] = json!([cidr]);
    }
    let mut annotations = json!({"node.alpha.kubernetes.io/ttl": "0"});
    if let Some(dir) = &cfg.volumes_dir {
        annotations[rkube_core::volume::LOCAL_PATH_DIR] = json!(dir.display().to_string());
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": cfg.name, "labels": labels, "annotations": annotations},
        "spec": spec,
    })
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
fn node_status(cfg: &NodeConfig, observed: &Observed, previous: &[NodeCondition]) -> Value {
    let resources = json!({"cpu": cfg.cpu, "memory": cfg.memory,
                           "pods": cfg.max_pods.to_string(),
                           "ephemeral-storage": cfg.ephemeral_storage});
    let allocatable = json!({"cpu": cfg.cpu, "memory": cfg.allocatable_memory,
                             "pods": cfg.max_pods.to_string(),
                             "ephemeral-storage": cfg.allocatable_ephemeral_storage});
    let heartbeat = now();
    let cond = |t: &str, status: &str, reason: &str, message: &str| {
        let since = previous
            .iter()
            .find(|c| c.type_ == t && c.status == status)
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_else(now);
        json!({"type": t, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": heartbeat, "lastTransitionTime": since})
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
    json!({
        "capacity": resources, "allocatable": allocatable,
        "addresses": [{"type": "InternalIP", "address": cfg.node_ip},
                      {"type": "Hostname", "address": cfg.name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": cfg.kubelet_port}},
        "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "",
                     "kernelVersion": kernel_version(), "osImage": "rkube agent",
                     "containerRuntimeVersion": cfg.runtime_version,
                     "kubeletVersion": crate::KUBELET_VERSION,
                     "kubeProxyVersion": crate::KUBELET_VERSION,
                     "operatingSystem": "linux", "architecture": arch()},
        "conditions": conditions,
    })
}

fn kernel_version() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Creates the Node (or finds it there) and posts its status; returns the Node's uid.
async fn register(clients: &Clients, cfg: &NodeConfig, observed: &Observed) -> Result<String> {
    let api: Api<Node> = Api::all(clients.get());
    let node: Node = serde_json::from_value(node_object(cfg))?;
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
    let patch = json!({"status": node_status(cfg, observed, &previous)});
    api.patch_status(&cfg.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(current.metadata.uid)
}

/// Renews the Lease with one write; Ok(false) when it does not exist.
async fn renew_lease(clients: &Clients, cfg: &NodeConfig) -> Result<bool> {
    let api: Api<Lease> = Api::namespaced(clients.get(), "kube-node-lease");
    let micro = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let patch = json!({"spec": {"holderIdentity": cfg.name, "renewTime": micro,
                                "leaseDurationSeconds": LEASE_DURATION_SECONDS}});
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
    let micro = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": cfg.name, "namespace": "kube-node-lease",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                 "name": cfg.name, "uid": node_uid}]},
        "spec": {"holderIdentity": cfg.name, "renewTime": micro,
                 "leaseDurationSeconds": LEASE_DURATION_SECONDS}}))?;
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
