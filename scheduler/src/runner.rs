//! The scheduling loop on the leader: every pod without a node (and for the default scheduler)
//! is placed by the [`crate::framework`] and bound through `pods/binding`, with a Scheduled
//! event; a pod that fits nowhere gets PodScheduled=False (Unschedulable) and a FailedScheduling
//! event with the reasons, and is tried again when nodes or pods change (and after a backoff).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use rand::SeedableRng;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_api::patch::PatchType;
use rkube_core::meta::key;
use rkube_core::path;
use rkube_runtime::controller::{Action, Controller};
use rkube_runtime::events::{Recorder, NORMAL, WARNING};
use rkube_runtime::manager::Term;
use rkube_runtime::queue::WorkQueue;
use rkube_runtime::store::Store;
use serde_json::json;

use crate::cache::Cache;
use crate::framework::{schedule_from, Profile};
use crate::plugins::volume_binding::VolumeBinding;
use crate::snapshot::{name, namespace};

pub const SCHEDULER_NAME: &str = "default-scheduler";
/// How soon an unschedulable pod is tried again without any change in the cluster.
const RETRY: Duration = Duration::from_secs(10);

fn node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("")
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn wants_scheduling(pod: &Pod) -> bool {
    let scheduler = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
    node_name(pod).is_empty()
        && pod.metadata.deletion_timestamp.is_none()
        && matches!(scheduler, None | Some("" | SCHEDULER_NAME))
        && !finished(pod)
}

pub struct Scheduler {
    pods: Arc<Store<Pod>>,
    nodes: Arc<Store<Node>>,
    client: LocalClient,
    queue: Arc<WorkQueue>,
    recorder: Recorder,
    profile: Profile,
    rng: Mutex<rand::rngs::StdRng>,
    /// Nodes and the pods counted on them, assumed bindings included.
    cache: Mutex<Cache>,
    /// Pods that fit nowhere last time, retried when something changes.
    unschedulable: Mutex<HashSet<String>>,
    /// The VolumeBinding plugin, whose PreBind runs in the binding cycle.
    volumes: VolumeBinding,
}

/// Starts the scheduler for one term (a [`rkube_runtime::manager::TermHook`]).
///
/// The runtime's [`Controller`] queues the pods without a node and retries the pods that fit
/// nowhere when something that may let them in changes (a pod ends or goes, a node, a claim,
/// a volume or a class changes); the scheduler's own handlers keep its [`Cache`] of nodes and
/// placed pods.
pub fn start(term: &mut Term) {
    let (inf, client, stop) = (&mut term.informers, term.client, term.stop.clone());
    let volumes = VolumeBinding {
        claims: inf
            .of("/registry/persistentvolumeclaims/")
            .typed::<PersistentVolumeClaim>(),
        volumes: inf
            .of("/registry/persistentvolumes/")
            .typed::<PersistentVolume>(),
        classes: inf.of("/registry/storageclasses/").typed::<StorageClass>(),
    };
    let mut profile = crate::plugins::default_profile();
    profile.pre_filters.push(Box::new(volumes.clone()));
    profile.filters.push(Box::new(volumes.clone()));
    let pods = inf.of("/registry/pods/").typed::<Pod>();
    let nodes = inf.of("/registry/minions/").typed::<Node>();
    let controller = Controller::selecting(SCHEDULER_NAME, pods.clone(), wants_scheduling);
    let s = Arc::new(Scheduler {
        pods,
        nodes,
        recorder: Recorder::new(client.clone(), SCHEDULER_NAME),
        client: client.clone(),
        queue: controller.queue().clone(),
        profile,
        volumes: volumes.clone(),
        rng: Mutex::new(rand::rngs::StdRng::from_entropy()),
        cache: Mutex::new(Cache::default()),
        unschedulable: Mutex::new(HashSet::new()),
    });
    // # Correctness
    // The cache follows a change before the mappers below retry the waiting pods (handlers
    // run in the order they were added): a retried pod must see the room that was made.
    let weak = Arc::downgrade(&s);
    s.pods.on_change(Box::new(move |old, new| {
        let Some(s) = weak.upgrade() else { return };
        let (key, node) = match (old, new) {
            (_, Some(p)) if wants_scheduling(p) => return,
            (_, Some(p)) if finished(p) => (key(&p.metadata), ""),
            (_, Some(p)) => (key(&p.metadata), node_name(p)),
            (Some(o), None) => (key(&o.metadata), ""),
            (None, None) => return,
        };
        {
            let mut cache = s.cache.lock().unwrap_or_else(|e| e.into_inner());
            match (node, new) {
                (node, Some(p)) if !node.is_empty() => cache.place(&key, node, p.clone()),
                _ => cache.unplace(&key),
            }
        }
        s.unschedulable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
    }));
    let weak = Arc::downgrade(&s);
    s.nodes.on_change(Box::new(move |old, new| {
        let Some(s) = weak.upgrade() else { return };
        let mut cache = s.cache.lock().unwrap_or_else(|e| e.into_inner());
        match (old, new) {
            (_, Some(n)) => cache.set_node(n.clone()),
            // A node's key is its name.
            (Some(o), None) => cache.remove_node(&key(&o.metadata)),
            (None, None) => {}
        }
    }));
    let w = Arc::downgrade(&s);
    // A pod that ended or went frees room.
    let room = move |_: Option<&Arc<Pod>>, new: Option<&Arc<Pod>>| match new {
        Some(p) if !finished(p) => Vec::new(),
        _ => waiting(&w),
    };
    // One worker: each decision sees the ones before it.
    controller
        .watches(&s.pods, room)
        .watches(&s.nodes, retry_waiting(&s))
        .watches(&volumes.claims, retry_waiting(&s))
        .watches(&volumes.volumes, retry_waiting(&s))
        .watches(&volumes.classes, retry_waiting(&s))
        .run(1, stop, s, |pod: Arc<Pod>, s: Arc<Scheduler>| async move {
            s.schedule_one(pod).await
        });
}

/// The pods that fit nowhere last time, to try again.
fn waiting(s: &Weak<Scheduler>) -> Vec<String> {
    let Some(s) = s.upgrade() else {
        return Vec::new();
    };
    let waiting = s.unschedulable.lock().unwrap_or_else(|e| e.into_inner());
    waiting.iter().cloned().collect()
}

/// A mapper that tries the waiting pods again on any change of an `O`: a node, a claim, a
/// volume or a class that changed may let one in.
fn retry_waiting<O>(
    s: &Arc<Scheduler>,
) -> impl Fn(Option<&Arc<O>>, Option<&Arc<O>>) -> Vec<String> + Send + Sync + 'static {
    let w = Arc::downgrade(s);
    move |_, _| waiting(&w)
}

impl Scheduler {
    /// Evicts the victims on the chosen node and nominates it for the pod, which is placed
    /// once they are gone.
    async fn preempt(
        &self,
        key: &str,
        pod: &Pod,
        c: crate::preemption::Candidate,
    ) -> Result<Action, ApiError> {
        let (ns, pod_name) = (namespace(pod), name(&pod.metadata));
        for v in &c.victims {
            let path = path::object::<Pod>(namespace(v), name(&v.metadata));
            match self.client.delete(&path, None).await {
                Ok(_) => {
                    let msg = format!(
                        "Preempted by pod {} on node {}",
                        pod.metadata.uid.as_deref().unwrap_or(""),
                        c.node
                    );
                    self.recorder
                        .event_for(&**v, NORMAL, "Preempted", &msg)
                        .await;
                }
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let patch = json!({"status": {"nominatedNodeName": c.node}});
        let path = format!("{}/status", path::object::<Pod>(ns, pod_name));
        match self.client.merge_patch(&path, &patch).await {
            Ok(_) => {}
            Err(e) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e),
        }
        self.unschedulable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string());
        Ok(Action::requeue(Duration::from_millis(200)))
    }

    /// Writes the binding of an assumed placement; on failure the placement is forgotten and
    /// the pod comes back to the queue.
    async fn bind(self: Arc<Self>, key: &str, pod: &Pod, node: &str) {
        let (ns, name) = (namespace(pod), name(&pod.metadata));
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "uid": pod.metadata.uid.as_deref().unwrap_or("")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        if let Some(n) = self.nodes.get(node) {
            let pending = || {
                self.pods
                    .get(key)
                    .is_some_and(|p| p.metadata.uid == pod.metadata.uid && wants_scheduling(&p))
            };
            if let Err(why) = self
                .volumes
                .bind_volumes(&self.client, pod, &n, pending)
                .await
            {
                self.cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .unplace(key);
                let msg = format!("running PreBind plugin \"VolumeBinding\": {why}");
                self.recorder
                    .event_for(pod, WARNING, "FailedScheduling", &msg)
                    .await;
                self.unschedulable
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key.to_string());
                self.queue.retry(key);
                return;
            }
        }
        let path = format!("{}/binding", path::object::<Pod>(ns, name));
        match self.client.create(&path, &binding).await {
            Ok(_) => {
                self.unschedulable
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(key);
                let msg = format!("Successfully assigned {ns}/{name} to {node}");
                self.recorder
                    .event_for(pod, NORMAL, "Scheduled", &msg)
                    .await;
            }
            // Gone, or bound by someone else meanwhile: the informer tells where.
            Err(e) if e.code == 404 || e.code == 409 => {
                self.cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .unplace(key);
            }
            Err(e) => {
                tracing::debug!(pod = key, error = %e, "binding failed; retrying");
                self.cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .unplace(key);
                self.queue.retry(key);
            }
        }
    }

    async fn schedule_one(self: &Arc<Self>, pod: Arc<Pod>) -> Result<Action, ApiError> {
        if !wants_scheduling(&pod) {
            return Ok(Action::await_change());
        }
        let key = &key(&pod.metadata);
        let (decision, candidate) = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if cache.is_placed(key) {
                return Ok(Action::await_change());
            }
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            let mut start = cache.next_start;
            let decision = schedule_from(&self.profile, &pod, &cache.nodes, &mut *rng, &mut start);
            cache.next_start = start;
            let candidate = match &decision {
                // Assumed at once, so the next decision counts it.
                Ok(node) => {
                    cache.place(key, node, pod.clone());
                    None
                }
                Err(fit) => crate::preemption::find(&self.profile, &pod, &cache.nodes, fit),
            };
            (decision, candidate)
        };
        let (ns, name) = (namespace(&pod), name(&pod.metadata));
        match decision {
            Ok(node) => {
                // The binding cycle runs on its own, as in kube-scheduler: the next decision
                // does not wait for this write (the assumed placement already counts), and
                // bindings in flight share the store's group commits.
                let this = self.clone();
                let key = key.to_string();
                tokio::spawn(async move { this.bind(&key, &pod, &node).await });
                Ok(Action::await_change())
            }
            Err(fit) => {
                if let Some(c) = candidate {
                    return self.preempt(key, &pod, c).await;
                }
                let message = fit.to_string();
                self.unschedulable
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key.to_string());
                let already = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c.type_ == "PodScheduled"
                                && c.message.as_deref().unwrap_or("") == message
                        })
                    });
                if !already {
                    let patch = json!({"status": {"conditions": [{
                        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": message,
                        "lastTransitionTime": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        "lastProbeTime": null,
                    }]}});
                    let path = format!("{}/status", path::object::<Pod>(ns, name));
                    match self
                        .client
                        .patch(&path, PatchType::StrategicMerge, &patch)
                        .await
                    {
                        Ok(_) => {}
                        Err(e) if e.code == 404 || e.code == 409 => {}
                        Err(e) => return Err(e),
                    }
                }
                self.recorder
                    .event_for(&*pod, WARNING, "FailedScheduling", &message)
                    .await;
                Ok(Action::requeue(RETRY))
            }
        }
    }
}
