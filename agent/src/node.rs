//! The Node and its heartbeat: the agent registers its Node (capacity, allocatable, labels,
//! addresses, nodeInfo), renews its Lease in kube-node-lease every lease interval, and writes
//! the Node's conditions when they change and at least every status report interval. A Node
//! deleted under a running agent is registered again.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
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
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": cfg.name, "labels": labels,
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": spec,
    })
}

/// The Node's status: resources, addresses, what runs it, and conditions.
fn node_status(cfg: &NodeConfig, transitions: &str) -> Value {
    let resources = json!({"cpu": cfg.cpu, "memory": cfg.memory,
                           "pods": cfg.max_pods.to_string(), "ephemeral-storage": "100Gi"});
    let heartbeat = now();
    let cond = |t: &str, status: &str, reason: &str, message: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": heartbeat, "lastTransitionTime": transitions})
    };
    json!({
        "capacity": resources, "allocatable": resources,
        "addresses": [{"type": "InternalIP", "address": cfg.node_ip},
                      {"type": "Hostname", "address": cfg.name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": cfg.kubelet_port}},
        "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "",
                     "kernelVersion": kernel_version(), "osImage": "rkube agent",
                     "containerRuntimeVersion": cfg.runtime_version,
                     "kubeletVersion": crate::KUBELET_VERSION,
                     "kubeProxyVersion": crate::KUBELET_VERSION,
                     "operatingSystem": "linux", "architecture": arch()},
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
    })
}

fn kernel_version() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Creates the Node (or finds it there) and posts its status; returns the Node's uid.
async fn register(clients: &Clients, cfg: &NodeConfig) -> Result<String> {
    let api: Api<Node> = Api::all(clients.get());
    let node: Node = serde_json::from_value(node_object(cfg))?;
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => tracing::info!(node = %cfg.name, "registered the node"),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    post_status(clients, cfg)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the node was deleted while registering"))
}

/// Posts the Node's status; None when the Node is gone. Returns its uid.
async fn post_status(clients: &Clients, cfg: &NodeConfig) -> Result<Option<String>> {
    let api: Api<Node> = Api::all(clients.get());
    let Some(current) = api.get_opt(&cfg.name).await? else {
        return Ok(None);
    };
    // A condition's transition time stays while its status does.
    let since = current
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(now);
    let patch = json!({"status": node_status(cfg, &since)});
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
pub async fn run(clients: Arc<Clients>, cfg: Arc<NodeConfig>) {
    let mut registered: Option<String> = None;
    let mut last_status = tokio::time::Instant::now();
    let mut stale = false;
    loop {
        let uid = match &registered {
            Some(uid) => uid.clone(),
            None => match register(&clients, &cfg).await {
                Ok(uid) => {
                    last_status = tokio::time::Instant::now();
                    stale = false;
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
            match post_status(&clients, &cfg).await {
                Ok(Some(_)) => {
                    last_status = tokio::time::Instant::now();
                    stale = false;
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
