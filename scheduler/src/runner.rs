//! The scheduling loop on the leader: every pod without a node (and for the default scheduler)
//! is placed by the [`crate::framework`] and bound through `pods/binding`, with a Scheduled
//! event; a pod that fits nowhere gets PodScheduled=False (Unschedulable) and a FailedScheduling
//! event with the reasons, and is tried again when nodes or pods change (and after a backoff).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::Method;
use rand::SeedableRng;
use rkube_api::client::LocalClient;
use rkube_controllers::events::{Recorder, NORMAL, WARNING};
use rkube_controllers::informer::{key_of, Informer};
use rkube_controllers::manager::Informers;
use rkube_controllers::queue::{Outcome, WorkQueue};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::framework::{schedule, Profile};
use crate::snapshot;

pub const SCHEDULER_NAME: &str = "default-scheduler";
/// How soon an unschedulable pod is tried again without any change in the cluster.
const RETRY: Duration = Duration::from_secs(10);

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn wants_scheduling(pod: &Value) -> bool {
    s(pod, "/spec/nodeName").is_empty()
        && pod.pointer("/metadata/deletionTimestamp").is_none()
        && matches!(s(pod, "/spec/schedulerName"), "" | SCHEDULER_NAME)
        && !matches!(s(pod, "/status/phase"), "Succeeded" | "Failed")
}

pub struct Scheduler {
    pods: Arc<Informer>,
    nodes: Arc<Informer>,
    client: LocalClient,
    queue: Arc<WorkQueue>,
    recorder: Recorder,
    profile: Profile,
    rng: Mutex<rand::rngs::StdRng>,
    /// Pods bound but not yet seen bound by the informer: pod key -> node.
    assumed: Mutex<HashMap<String, (String, Arc<Value>)>>,
    /// Pods that fit nowhere last time, retried when something changes.
    unschedulable: Mutex<HashSet<String>>,
}

/// Starts the scheduler for one term (a [`rkube_controllers::manager::TermHook`]).
pub fn start(inf: &mut Informers, client: &LocalClient, stop: watch::Receiver<bool>) {
    let s = Arc::new(Scheduler {
        pods: inf.of("/registry/pods/"),
        nodes: inf.of("/registry/minions/"),
        recorder: Recorder::new(client.clone(), SCHEDULER_NAME),
        client: client.clone(),
        queue: Arc::new(WorkQueue::new()),
        profile: crate::plugins::default_profile(),
        rng: Mutex::new(rand::rngs::StdRng::from_entropy()),
        assumed: Mutex::new(HashMap::new()),
        unschedulable: Mutex::new(HashSet::new()),
    });
    let weak = Arc::downgrade(&s);
    s.pods.on_change(Box::new(move |old, new| {
        let Some(s) = weak.upgrade() else { return };
        match new {
            Some(p) if wants_scheduling(p) => s.queue.add(&key_of(p)),
            Some(p) => {
                let key = key_of(p);
                s.assumed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&key);
                if old.is_some_and(wants_scheduling) {
                    // Bound: what it takes is now visible.
                    s.unschedulable
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&key);
                }
            }
            None => {
                // A pod gone frees room: try the waiting ones again.
                if let Some(o) = old {
                    let key = key_of(o);
                    s.assumed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&key);
                    s.unschedulable
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&key);
                }
                s.retry_unschedulable();
            }
        }
    }));
    let weak = Arc::downgrade(&s);
    s.nodes.on_change(Box::new(move |_, _| {
        if let Some(s) = weak.upgrade() {
            s.retry_unschedulable();
        }
    }));
    let c = s.clone();
    // One worker: each decision sees the ones before it.
    rkube_controllers::queue::run_workers(
        SCHEDULER_NAME,
        s.queue.clone(),
        1,
        vec![s.pods.clone(), s.nodes.clone()],
        stop,
        move |key| {
            let c = c.clone();
            async move { c.schedule_one(&key).await }
        },
    );
}

impl Scheduler {
    /// Evicts the victims on the chosen node and nominates it for the pod, which is placed
    /// once they are gone.
    async fn preempt(&self, pod: &Value, c: crate::preemption::Candidate) -> Outcome {
        let (ns, name) = (s(pod, "/metadata/namespace"), s(pod, "/metadata/name"));
        for v in &c.victims {
            let path = format!(
                "/api/v1/namespaces/{}/pods/{}",
                s(v, "/metadata/namespace"),
                s(v, "/metadata/name")
            );
            match self.client.delete(&path, None).await {
                Ok(_) => {
                    let msg = format!(
                        "Preempted by pod {} on node {}",
                        s(pod, "/metadata/uid"),
                        c.node
                    );
                    self.recorder
                        .event(v, "Pod", NORMAL, "Preempted", &msg)
                        .await;
                }
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let patch = json!({"status": {"nominatedNodeName": c.node}});
        let path = format!("/api/v1/namespaces/{ns}/pods/{name}/status");
        match self.client.merge_patch(&path, &patch).await {
            Ok(_) => {}
            Err(e) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e),
        }
        self.unschedulable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key_of(pod));
        Ok(Some(Duration::from_millis(200)))
    }

    fn retry_unschedulable(&self) {
        let keys: Vec<String> = self
            .unschedulable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        for k in keys {
            self.queue.add(&k);
        }
    }

    async fn schedule_one(&self, key: &str) -> Outcome {
        let Some(pod) = self.pods.get(key) else {
            return Ok(None);
        };
        if !wants_scheduling(&pod)
            || self
                .assumed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(key)
        {
            return Ok(None);
        }
        let mut pods = self.pods.list("");
        // Bindings this scheduler made that the cache does not show yet still take room.
        for (node, p) in self
            .assumed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            let mut bound = p.as_ref().clone();
            bound["spec"]["nodeName"] = json!(node);
            pods.push(Arc::new(bound));
        }
        let nodes = snapshot::build(&self.nodes.list(""), &pods);
        let decision = {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            schedule(&self.profile, &pod, &nodes, &mut *rng)
        };
        let (ns, name) = (s(&pod, "/metadata/namespace"), s(&pod, "/metadata/name"));
        match decision {
            Ok(node) => {
                let binding = json!({
                    "apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": name, "namespace": ns, "uid": s(&pod, "/metadata/uid")},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                });
                let path = format!("/api/v1/namespaces/{ns}/pods/{name}/binding");
                match self.client.create(&path, &binding).await {
                    Ok(_) => {
                        self.assumed
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(key.to_string(), (node.clone(), pod.clone()));
                        self.unschedulable
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(key);
                        let msg = format!("Successfully assigned {ns}/{name} to {node}");
                        self.recorder
                            .event(&pod, "Pod", NORMAL, "Scheduled", &msg)
                            .await;
                        Ok(None)
                    }
                    // Gone, or bound by someone else meanwhile.
                    Err(e) if e.code == 404 || e.code == 409 => Ok(None),
                    Err(e) => Err(e),
                }
            }
            Err(fit) => {
                if let Some(c) = crate::preemption::find(&self.profile, &pod, &nodes, &fit) {
                    return self.preempt(&pod, c).await;
                }
                let message = fit.to_string();
                self.unschedulable
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key.to_string());
                let already = pod
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| s(c, "/type") == "PodScheduled" && s(c, "/message") == message)
                    });
                if !already {
                    let patch = json!({"status": {"conditions": [{
                        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": message,
                        "lastTransitionTime": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        "lastProbeTime": null,
                    }]}});
                    let path = format!("/api/v1/namespaces/{ns}/pods/{name}/status");
                    match self
                        .client
                        .request(
                            Method::PATCH,
                            &path,
                            Some(&patch),
                            "application/strategic-merge-patch+json",
                        )
                        .await
                    {
                        Ok(_) => {}
                        Err(e) if e.code == 404 || e.code == 409 => {}
                        Err(e) => return Err(e),
                    }
                }
                self.recorder
                    .event(&pod, "Pod", WARNING, "FailedScheduling", &message)
                    .await;
                Ok(Some(RETRY))
            }
        }
    }
}
