//! The pods bound to a node: a list and watch with `fieldSelector=spec.nodeName=<node>`, and a
//! worker per pod that drives it to its spec through the runtime and writes the status the
//! way the kubelet reports it. A pod being deleted has its containers stopped (a `Killing`
//! event each) and is then removed for good with a zero grace period.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
    Event, EventSource, HostIP, ObjectReference, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use rkube_core::meta;
use serde_json::json;
use tokio::sync::mpsc;

use crate::join::Clients;
use crate::podspec::{pod_containers, spec_str};
use crate::NodeConfig;

/// Now, to the second, as the kubelet's status times are.
pub(crate) fn now() -> Time {
    let t = Timestamp::now();
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// The pod's phase ("" before one is reported).
pub(crate) fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// A status patch of the pod (`{"status": ...}`).
pub(crate) fn status_patch(status: &PodStatus) -> serde_json::Value {
    json!({ "status": status })
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
    let mut workers: HashMap<String, (Arc<Shared>, mpsc::UnboundedSender<Pod>)> = HashMap::new();
    let forget = |workers: &mut HashMap<String, (Arc<Shared>, mpsc::UnboundedSender<Pod>)>,
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
            present.insert(meta::uid(&pod.metadata).to_string());
            dispatch(&by_name, &mut workers, pod);
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
                        dispatch(&by_name, &mut workers, p);
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
    workers: &mut HashMap<String, (Arc<Shared>, mpsc::UnboundedSender<Pod>)>,
    pod: Pod,
) {
    let uid = meta::uid(&pod.metadata).to_string();
    if let Some((_, tx)) = workers.get(&uid) {
        if tx.send(pod.clone()).is_ok() {
            return;
        }
    }
    let Some(shared) = by_name.get(spec_str(&pod, |s| s.node_name.as_ref())) else {
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
async fn worker(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Pod>) {
    let mut started = false;
    while let Some(mut pod) = rx.recv().await {
        // Only the newest state matters.
        while let Ok(newer) = rx.try_recv() {
            pod = newer;
        }
        let phase = phase(&pod);
        let pod_ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .unwrap_or("");
        if pod.metadata.deletion_timestamp.is_some() {
            terminate(&shared, &pod).await;
            continue;
        }
        if phase == "Succeeded" || phase == "Failed" {
            shared.sim.forget(meta::uid(&pod.metadata));
            continue;
        }
        if phase == "Running" && !pod_ip.is_empty() {
            // Already running (this agent wrote it, before a restart maybe): adopt it.
            if let Some(ipam) = &shared.ipam {
                ipam.adopt(meta::uid(&pod.metadata), pod_ip);
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
                if pod.metadata.deletion_timestamp.is_some() {
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
                    tracing::warn!(pod = meta::name(&pod.metadata), error = %e, "reporting the pod running failed; retrying");
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
async fn start(shared: &Shared, pod: &Pod) -> anyhow::Result<()> {
    let ns = meta::namespace(&pod.metadata);
    let name = meta::name(&pod.metadata);
    let uid = meta::uid(&pod.metadata);
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(shared.clients.get(), ns);
    for claim in rkube_core::volume::pod_claims(pod) {
        if claim.is_empty() {
            continue;
        }
        let pvc = claims.get(&claim).await?;
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
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .find(|c| c.type_ == "PodScheduled")
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| t.clone());
    let statuses = |init: bool| -> Vec<ContainerStatus> {
        pod_containers(pod, init)
            .map(|c| {
                let state = if init {
                    ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: 0,
                            reason: Some("Completed".into()),
                            started_at: Some(t.clone()),
                            finished_at: Some(t.clone()),
                            container_id: Some(sim_container_id(uid, c)),
                            ..ContainerStateTerminated::default()
                        }),
                        ..ContainerState::default()
                    }
                } else {
                    ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: Some(t.clone()),
                        }),
                        ..ContainerState::default()
                    }
                };
                sim_container_status(uid, c, !init, state)
            })
            .collect()
    };
    let cond = |type_: &str, at: &Time| PodCondition {
        type_: type_.into(),
        status: "True".into(),
        last_transition_time: Some(at.clone()),
        ..PodCondition::default()
    };
    let init = statuses(true);
    let status = PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![
            cond("PodReadyToStartContainers", &t),
            cond("Initialized", &t),
            cond("Ready", &t),
            cond("ContainersReady", &t),
            cond("PodScheduled", &scheduled_at),
        ]),
        host_ip: Some(shared.cfg.node_ip.clone()),
        host_ips: Some(vec![HostIP {
            ip: shared.cfg.node_ip.clone(),
        }]),
        pod_ip: Some(pod_ip.clone()),
        pod_ips: Some(vec![PodIP { ip: pod_ip }]),
        start_time: Some(t.clone()),
        container_statuses: Some(statuses(false)),
        init_container_statuses: (!init.is_empty()).then_some(init),
        ..PodStatus::default()
    };
    let api: Api<Pod> = Api::namespaced(shared.clients.get(), ns);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&status_patch(&status)),
    )
    .await?;
    Ok(())
}

/// A simulated container's id.
fn sim_container_id(uid: &str, c: &Container) -> String {
    format!("sim://{uid}/{}", c.name)
}

/// A simulated container's status in `state` (`running`: ready and started).
fn sim_container_status(
    uid: &str,
    c: &Container,
    running: bool,
    state: ContainerState,
) -> ContainerStatus {
    let image = c.image.clone().unwrap_or_default();
    ContainerStatus {
        name: c.name.clone(),
        image_id: format!("sim://{image}"),
        image,
        container_id: Some(sim_container_id(uid, c)),
        ready: running,
        started: Some(running),
        restart_count: 0,
        state: Some(state),
        last_state: Some(ContainerState::default()),
        ..ContainerStatus::default()
    }
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
fn simulated_end(pod: &Pod) -> Option<(u64, i32)> {
    let annotation = |k: &str| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .map(String::as_str)
    };
    let policy = spec_str(pod, |s| s.restart_policy.as_ref());
    let of_job = meta::controller_of(&pod.metadata).is_some_and(|r| r.kind == "Job");
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
async fn finish(shared: Arc<Shared>, pod: Pod, (secs, code): (u64, i32)) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (ns, name, uid) = (
        meta::namespace(&pod.metadata),
        meta::name(&pod.metadata),
        meta::uid(&pod.metadata),
    );
    shared.sim.forget(uid);
    let t = now();
    let reason = if code == 0 { "Completed" } else { "Error" };
    let statuses: Vec<ContainerStatus> = pod_containers(&pod, false)
        .map(|c| {
            let state = ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    reason: Some(reason.into()),
                    started_at: Some(t.clone()),
                    finished_at: Some(t.clone()),
                    container_id: Some(sim_container_id(uid, c)),
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            };
            sim_container_status(uid, c, false, state)
        })
        .collect();
    let status = PodStatus {
        phase: Some(if code == 0 { "Succeeded" } else { "Failed" }.into()),
        conditions: Some(completed_conditions(&t)),
        container_statuses: Some(statuses),
        ..PodStatus::default()
    };
    let api: Api<Pod> = Api::namespaced(shared.clients.get(), ns);
    // Conditions merge by type (strategic merge), as the kubelet's status patch does.
    let patch = Patch::Strategic(status_patch(&status));
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

/// The Ready and ContainersReady conditions of a pod whose containers all stopped at `t`.
fn completed_conditions(t: &Time) -> Vec<PodCondition> {
    let not_ready = |type_: &str| PodCondition {
        type_: type_.into(),
        status: "False".into(),
        reason: Some("PodCompleted".into()),
        last_transition_time: Some(t.clone()),
        ..PodCondition::default()
    };
    vec![not_ready("Ready"), not_ready("ContainersReady")]
}

/// A pod being deleted: stop its containers (a `Killing` event each), report them
/// terminated, then delete the pod for good.
async fn terminate(shared: &Shared, pod: &Pod) {
    shared.sim.forget(meta::uid(&pod.metadata));
    finish_deletion(&shared.clients, &shared.cfg, pod).await;
    if let Some(ipam) = &shared.ipam {
        ipam.release(meta::uid(&pod.metadata));
    }
}

/// After a pod's containers stopped: a `Killing` event each (recorded as the kubelet does when
/// it stops them), then the pod deleted for good.
pub(crate) async fn finish_deletion(clients: &Clients, cfg: &NodeConfig, pod: &Pod) {
    let ns = meta::namespace(&pod.metadata);
    let name = meta::name(&pod.metadata);
    let uid = meta::uid(&pod.metadata);
    let client = clients.get();
    for c in pod_containers(pod, false) {
        record(
            &client,
            pod,
            "Killing",
            &format!("Stopping container {}", c.name),
            "Normal",
            &cfg.name,
        )
        .await;
    }
    let api: Api<Pod> = Api::namespaced(client, ns);
    // Its containers stopped, the pod is terminal before it goes, as the kubelet reports it:
    // a pod held by a finalizer (a Job's tracking) shows that it failed, which is what a
    // Job with podReplacementPolicy Failed waits for before replacing it.
    let phase = pod.status.as_ref().and_then(|st| st.phase.as_deref());
    if !matches!(phase, Some("Succeeded" | "Failed")) {
        let status = PodStatus {
            phase: Some("Failed".into()),
            conditions: Some(completed_conditions(&now())),
            ..PodStatus::default()
        };
        let patch = Patch::Strategic(status_patch(&status));
        match api
            .patch_status(name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(e) => tracing::warn!(pod = name, error = %e, "reporting the stopped pod failed"),
        }
    }
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
    pod: &Pod,
    reason: &str,
    message: &str,
    kind: &str,
    node: &str,
) {
    let m = &pod.metadata;
    let ns = meta::namespace(m);
    let t = now();
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", meta::name(m))),
            namespace: Some(ns.to_string()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(ns.to_string()),
            name: Some(meta::name(m).to_string()),
            uid: Some(meta::uid(m).to_string()),
            resource_version: Some(m.resource_version.clone().unwrap_or_default()),
            ..ObjectReference::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(kind.into()),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node.into()),
        }),
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node.into()),
        first_timestamp: Some(t.clone()),
        last_timestamp: Some(t),
        event_time: Some(MicroTime(Timestamp::now())),
        count: Some(1),
        ..Event::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        tracing::debug!(error = %e, "recording an event failed");
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
