//! The pods bound to a node: a list and watch with `fieldSelector=spec.nodeName=<node>`, and a
//! worker per pod that drives it to its spec through the runtime and writes the status the
//! way the kubelet reports it. A pod being deleted has its containers stopped (a `Killing`
//! event each) and is then removed for good with a zero grace period.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use rkube_core::json::str_at as s;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::join::Clients;
use crate::NodeConfig;

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Pod addresses from the node's pod CIDR (an IPv4 /24 or larger): .1 is the node's bridge,
/// pods get .2 upwards, and an address comes back when its pod goes.
pub struct Ipam {
    base: u32,
    size: u32,
    used: Mutex<BTreeMap<u32, String>>,
}

impl Ipam {
    pub fn new(cidr: &str) -> Option<Ipam> {
        let (addr, len) = cidr.split_once('/')?;
        let addr: Ipv4Addr = addr.parse().ok()?;
        let len: u32 = len.parse().ok()?;
        if !(8..=30).contains(&len) {
            return None;
        }
        let size = 1u32 << (32 - len);
        Some(Ipam {
            base: u32::from(addr) & !(size - 1),
            size,
            used: Mutex::new(BTreeMap::new()),
        })
    }

    /// The address of `owner` (the same one again if it already has one).
    pub fn allocate(&self, owner: &str) -> Option<Ipv4Addr> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((ip, _)) = used.iter().find(|(_, o)| *o == owner) {
            return Some(Ipv4Addr::from(self.base + ip));
        }
        let free = (2..self.size - 1).find(|i| !used.contains_key(i))?;
        used.insert(free, owner.to_string());
        Some(Ipv4Addr::from(self.base + free))
    }

    /// Records an address a pod already reports (after an agent restart).
    pub fn adopt(&self, owner: &str, ip: &str) {
        if let Ok(ip) = ip.parse::<Ipv4Addr>() {
            let i = u32::from(ip).wrapping_sub(self.base);
            if i < self.size {
                self.used
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(i, owner.to_string());
            }
        }
    }

    pub fn release(&self, owner: &str) {
        self.used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, o| o != owner);
    }
}

/// What one node's pod workers share.
struct Shared {
    clients: Arc<Clients>,
    cfg: Arc<NodeConfig>,
    ipam: Option<Ipam>,
    /// The container runtime; None: the simulated one.
    cri: Option<crate::cri::Cri>,
    /// The modelled usage of simulated pods.
    sim: Arc<crate::stats::SimUsage>,
}

/// Watches the pods of this process's nodes and keeps a worker per pod, until the process
/// ends. One node watches `spec.nodeName=<node>`, as the kubelet does; a process simulating
/// many nodes watches all pods once (a node may read every pod) and hands each to its node,
/// whose own client writes its status.
pub async fn run(
    nodes: Vec<(Arc<Clients>, Arc<NodeConfig>)>,
    cri: Option<crate::cri::Cri>,
    sim: Arc<crate::stats::SimUsage>,
) {
    let Some(watcher) = nodes.first().map(|(c, _)| c.clone()) else {
        return;
    };
    let by_name: HashMap<String, Arc<Shared>> = nodes
        .into_iter()
        .map(|(clients, cfg)| {
            let ipam = cfg.pod_cidr.as_deref().and_then(Ipam::new);
            let cri = cri.clone();
            (
                cfg.name.clone(),
                Arc::new(Shared {
                    clients,
                    cfg,
                    ipam,
                    cri,
                    sim: sim.clone(),
                }),
            )
        })
        .collect();
    let selector = if by_name.len() == 1 {
        by_name
            .keys()
            .next()
            .map(|n| format!("spec.nodeName={n}"))
            .unwrap_or_default()
    } else {
        String::new()
    };
    // uid -> (the pod's node, its worker)
    let mut workers: HashMap<String, (Arc<Shared>, mpsc::UnboundedSender<Value>)> = HashMap::new();
    let forget = |workers: &mut HashMap<String, (Arc<Shared>, mpsc::UnboundedSender<Value>)>,
                  uid: &str| {
        if let Some((shared, _)) = workers.remove(uid) {
            if let Some(ipam) = &shared.ipam {
                ipam.release(uid);
            }
        }
    };
    loop {
        let api: Api<Pod> = Api::all(watcher.get());
        let mut lp = ListParams::default();
        if !selector.is_empty() {
            lp = lp.fields(&selector);
        }
        let list = match api.list(&lp).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "listing the node's pods failed");
                watcher.fail_over().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut rv = list.metadata.resource_version.unwrap_or_default();
        let mut present = std::collections::HashSet::new();
        for pod in list.items {
            let v = serde_json::to_value(&pod).unwrap_or_default();
            present.insert(s(&v, "/metadata/uid").to_string());
            dispatch(&by_name, &mut workers, v);
        }
        // Pods that went while the watch was down.
        let gone: Vec<String> = workers
            .keys()
            .filter(|uid| !present.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            forget(&mut workers, &uid);
        }
        let mut params = WatchParams::default().timeout(290);
        if !selector.is_empty() {
            params = params.fields(&selector);
        }
        loop {
            let stream = match api.watch(&params, &rv).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "watching pods failed; listing again");
                    break;
                }
            };
            let mut stream = Box::pin(stream);
            let mut relist = false;
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(WatchEvent::Added(p)) | Ok(WatchEvent::Modified(p)) => {
                        rv = p.metadata.resource_version.clone().unwrap_or(rv);
                        dispatch(
                            &by_name,
                            &mut workers,
                            serde_json::to_value(&p).unwrap_or_default(),
                        );
                    }
                    Ok(WatchEvent::Deleted(p)) => {
                        rv = p.metadata.resource_version.clone().unwrap_or(rv);
                        forget(&mut workers, &p.metadata.uid.unwrap_or_default());
                    }
                    Ok(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                    Ok(WatchEvent::Error(e)) => {
                        tracing::debug!(error = %e.message, "pod watch ended; listing again");
                        relist = true;
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "pod watch broke");
                        break;
                    }
                }
            }
            if relist {
                break;
            }
        }
    }
}

/// Hands a pod's new state to its worker, starting one for a pod of one of this process's
/// nodes not seen before.
fn dispatch(
    by_name: &HashMap<String, Arc<Shared>>,
    workers: &mut HashMap<String, (Arc<Shared>, mpsc::UnboundedSender<Value>)>,
    pod: Value,
) {
    let uid = s(&pod, "/metadata/uid").to_string();
    if let Some((_, tx)) = workers.get(&uid) {
        if tx.send(pod.clone()).is_ok() {
            return;
        }
    }
    let Some(shared) = by_name.get(s(&pod, "/spec/nodeName")) else {
        return;
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = tx.send(pod);
    workers.insert(uid, (shared.clone(), tx));
    match &shared.cri {
        Some(cri) => {
            tokio::spawn(crate::cri_pods::worker(
                shared.clients.clone(),
                shared.cfg.clone(),
                cri.clone(),
                rx,
            ));
        }
        None => {
            tokio::spawn(worker(shared.clone(), rx));
        }
    }
}

/// One pod's worker: takes the newest state of the pod and acts on it.
async fn worker(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Value>) {
    let mut started = false;
    while let Some(mut pod) = rx.recv().await {
        // Only the newest state matters.
        while let Ok(newer) = rx.try_recv() {
            pod = newer;
        }
        let phase = s(&pod, "/status/phase");
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            terminate(&shared, &pod).await;
            continue;
        }
        if phase == "Succeeded" || phase == "Failed" {
            shared.sim.forget(s(&pod, "/metadata/uid"));
            continue;
        }
        if phase == "Running" && !s(&pod, "/status/podIP").is_empty() {
            // Already running (this agent wrote it, before a restart maybe): adopt it.
            if let Some(ipam) = &shared.ipam {
                ipam.adopt(s(&pod, "/metadata/uid"), s(&pod, "/status/podIP"));
            }
            started = true;
            shared.sim.observe(&pod);
            continue;
        }
        if started {
            shared.sim.observe(&pod);
            continue;
        }
        if !shared.cfg.sim_start_delay.is_zero() {
            tokio::time::sleep(shared.cfg.sim_start_delay).await;
            if let Ok(newer) = rx.try_recv() {
                pod = newer;
                while let Ok(n) = rx.try_recv() {
                    pod = n;
                }
                if pod.pointer("/metadata/deletionTimestamp").is_some() {
                    terminate(&shared, &pod).await;
                    continue;
                }
            }
        }
        // Until it is reported, or a newer state of the pod arrives.
        loop {
            match start(&shared, &pod).await {
                Ok(()) => {
                    started = true;
                    shared.sim.observe(&pod);
                    if let Some(end) = simulated_end(&pod) {
                        tokio::spawn(finish(shared.clone(), pod.clone(), end));
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(pod = s(&pod, "/metadata/name"), error = %e, "reporting the pod running failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if !rx.is_empty() {
                        break;
                    }
                }
            }
        }
    }
}

/// The simulated runtime's start: every container runs at once; the status says so. A pod's
/// claims are resolved first (each must be bound), though nothing is mounted.
async fn start(shared: &Shared, pod: &Value) -> anyhow::Result<()> {
    let ns = s(pod, "/metadata/namespace");
    let name = s(pod, "/metadata/name");
    let uid = s(pod, "/metadata/uid");
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(shared.clients.get(), ns);
    for v in pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let claim = s(v, "/persistentVolumeClaim/claimName");
        if claim.is_empty() {
            continue;
        }
        let pvc = claims.get(claim).await?;
        if pvc
            .spec
            .and_then(|s| s.volume_name)
            .is_none_or(|v| v.is_empty())
        {
            anyhow::bail!("PVC {ns}/{claim} is not bound");
        }
    }
    let pod_ip = match &shared.ipam {
        Some(ipam) => ipam
            .allocate(uid)
            .map(|ip| ip.to_string())
            .ok_or_else(|| anyhow::anyhow!("the node's pod CIDR has no free address"))?,
        None => shared.cfg.node_ip.clone(),
    };
    let t = now();
    let scheduled_at = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| s(c, "/type") == "PodScheduled"))
        .map(|c| s(c, "/lastTransitionTime").to_string())
        .filter(|x| !x.is_empty())
        .unwrap_or_else(|| t.clone());
    let container_status = |c: &Value, init: bool| {
        let image = s(c, "/image");
        let state = if init {
            json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": t,
                                  "finishedAt": t, "containerID": format!("sim://{uid}/{}", s(c, "/name"))}})
        } else {
            json!({"running": {"startedAt": t}})
        };
        json!({"name": s(c, "/name"), "image": image,
               "imageID": format!("sim://{image}"),
               "containerID": format!("sim://{uid}/{}", s(c, "/name")),
               "ready": !init, "started": !init, "restartCount": 0,
               "state": state, "lastState": {}})
    };
    let list = |key: &str, init: bool| -> Vec<Value> {
        pod.pointer(&format!("/spec/{key}"))
            .and_then(Value::as_array)
            .map(|cs| cs.iter().map(|c| container_status(c, init)).collect())
            .unwrap_or_default()
    };
    let cond = |t_: &str, at: &str| json!({"type": t_, "status": "True", "lastProbeTime": null, "lastTransitionTime": at});
    let mut status = json!({
        "phase": "Running",
        "conditions": [cond("PodReadyToStartContainers", &t), cond("Initialized", &t),
                       cond("Ready", &t), cond("ContainersReady", &t),
                       cond("PodScheduled", &scheduled_at)],
        "hostIP": shared.cfg.node_ip, "hostIPs": [{"ip": shared.cfg.node_ip}],
        "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
        "startTime": t,
        "containerStatuses": list("containers", false),
    });
    let init = list("initContainers", true);
    if !init.is_empty() {
        status["initContainerStatuses"] = json!(init);
    }
    let api: Api<Pod> = Api::namespaced(shared.clients.get(), ns);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": status})),
    )
    .await?;
    Ok(())
}

/// The annotation that gives a simulated pod's containers their exit code (default 0).
pub const SIM_EXIT_CODE: &str = "sim.rkube.io/exit-code";
/// The annotation that gives how long a simulated pod's containers run before they exit
/// (seconds; default 0).
pub const SIM_RUN_SECONDS: &str = "sim.rkube.io/run-seconds";

/// How a simulated pod ends: (seconds it runs, exit code), for pods that run to completion
/// (restartPolicy Never or OnFailure) and are a Job's or carry [`SIM_EXIT_CODE`], as kwok's
/// pod-complete stage finishes them. Other pods run until deleted; so does a pod that
/// fails under OnFailure (its container would be restarted for ever).
fn simulated_end(pod: &Value) -> Option<(u64, i32)> {
    let annotation = |k: &str| {
        pod.pointer("/metadata/annotations")
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
    };
    let policy = s(pod, "/spec/restartPolicy");
    let of_job = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| s(r, "/kind") == "Job" && r.get("controller") == Some(&json!(true)));
    let code = annotation(SIM_EXIT_CODE);
    if !matches!(policy, "Never" | "OnFailure") || !(of_job || code.is_some()) {
        return None;
    }
    let code: i32 = code.and_then(|c| c.parse().ok()).unwrap_or(0);
    if code != 0 && policy == "OnFailure" {
        return None;
    }
    let secs = annotation(SIM_RUN_SECONDS)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Some((secs, code))
}

/// After `secs`, the simulated pod's containers exit with `code`: the pod is Succeeded or
/// Failed, as the kubelet reports it.
async fn finish(shared: Arc<Shared>, pod: Value, (secs, code): (u64, i32)) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
    shared.sim.forget(s(&pod, "/metadata/uid"));
    let (ns, name, uid) = (
        s(&pod, "/metadata/namespace"),
        s(&pod, "/metadata/name"),
        s(&pod, "/metadata/uid"),
    );
    let t = now();
    let reason = if code == 0 { "Completed" } else { "Error" };
    let statuses: Vec<Value> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let image = s(c, "/image");
            json!({"name": s(c, "/name"), "image": image, "imageID": format!("sim://{image}"),
                   "containerID": format!("sim://{uid}/{}", s(c, "/name")),
                   "ready": false, "started": false, "restartCount": 0, "lastState": {},
                   "state": {"terminated": {"exitCode": code, "reason": reason,
                       "startedAt": t, "finishedAt": t,
                       "containerID": format!("sim://{uid}/{}", s(c, "/name"))}}})
        })
        .collect();
    let not_ready = |ty: &str| {
        json!({"type": ty, "status": "False", "reason": "PodCompleted",
        "lastProbeTime": null, "lastTransitionTime": t})
    };
    let status = json!({
        "phase": if code == 0 { "Succeeded" } else { "Failed" },
        "conditions": [not_ready("Ready"), not_ready("ContainersReady")],
        "containerStatuses": statuses,
    });
    let api: Api<Pod> = Api::namespaced(shared.clients.get(), ns);
    // Conditions merge by type (strategic merge), as the kubelet's status patch does.
    let patch = Patch::Strategic(json!({"status": status}));
    for _ in 0..5 {
        match api
            .patch_status(name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(e) => {
                tracing::warn!(pod = name, error = %e, "reporting the pod finished failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// A pod being deleted: stop its containers (a `Killing` event each), report them
/// terminated, then delete the pod for good.
async fn terminate(shared: &Shared, pod: &Value) {
    shared.sim.forget(s(pod, "/metadata/uid"));
    finish_deletion(&shared.clients, &shared.cfg, pod).await;
    if let Some(ipam) = &shared.ipam {
        ipam.release(s(pod, "/metadata/uid"));
    }
}

/// After a pod's containers stopped: a `Killing` event each (recorded as the kubelet does when
/// it stops them), then the pod deleted for good.
pub(crate) async fn finish_deletion(clients: &Clients, cfg: &NodeConfig, pod: &Value) {
    let ns = s(pod, "/metadata/namespace");
    let name = s(pod, "/metadata/name");
    let uid = s(pod, "/metadata/uid");
    let client = clients.get();
    for c in pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        record(
            &client,
            pod,
            "Killing",
            &format!("Stopping container {}", s(c, "/name")),
            "Normal",
            &cfg.name,
        )
        .await;
    }
    let api: Api<Pod> = Api::namespaced(client, ns);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => tracing::warn!(pod = name, error = %e, "deleting the terminated pod failed"),
    }
}

/// Records an event about a pod, from this node's kubelet.
pub async fn record(
    client: &kube::Client,
    pod: &Value,
    reason: &str,
    message: &str,
    kind: &str,
    node: &str,
) {
    let ns = s(pod, "/metadata/namespace");
    let t = now();
    let micro = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let event: Result<Event, _> = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": format!("{}.", s(pod, "/metadata/name")), "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns,
                           "name": s(pod, "/metadata/name"), "uid": s(pod, "/metadata/uid"),
                           "resourceVersion": s(pod, "/metadata/resourceVersion")},
        "reason": reason, "message": message, "type": kind,
        "source": {"component": "kubelet", "host": node},
        "reportingComponent": "kubelet", "reportingInstance": node,
        "firstTimestamp": t, "lastTimestamp": t, "eventTime": micro, "count": 1}));
    if let Ok(event) = event {
        let api: Api<Event> = Api::namespaced(client.clone(), ns);
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            tracing::debug!(error = %e, "recording an event failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_come_from_the_cidr_and_come_back() {
        let ipam = Ipam::new("10.244.1.0/24").unwrap();
        assert_eq!(ipam.allocate("a"), Some("10.244.1.2".parse().unwrap()));
        assert_eq!(ipam.allocate("b"), Some("10.244.1.3".parse().unwrap()));
        assert_eq!(ipam.allocate("a"), Some("10.244.1.2".parse().unwrap()));
        ipam.release("a");
        assert_eq!(ipam.allocate("c"), Some("10.244.1.2".parse().unwrap()));
        ipam.adopt("d", "10.244.1.9");
        assert_eq!(ipam.allocate("d"), Some("10.244.1.9".parse().unwrap()));
        let small = Ipam::new("10.0.0.0/30").unwrap();
        assert!(small.allocate("x").is_some());
        assert!(small.allocate("y").is_none());
        assert!(Ipam::new("nonsense").is_none());
    }
}
