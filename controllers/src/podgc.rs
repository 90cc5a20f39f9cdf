//! The pod garbage collector, as kube-controller-manager's. Every check period it force-deletes
//! (grace period 0) the pods nobody else will finish:
//!
//! - terminated pods (Succeeded or Failed) beyond the threshold, evicted ones first, then the
//!   oldest;
//! - terminating pods on a node that is not Ready and carries the
//!   `node.kubernetes.io/out-of-service` taint (its agent is known to be gone);
//! - pods bound to a node that no longer exists, once it has been missing at two checks in a
//!   row (a node deleted and registered again a moment later keeps its pods);
//! - terminating pods that were never scheduled.
//!
//! A pod not yet Succeeded or Failed is first marked Failed, so that what counts failures
//! (a Job under `podReplacementPolicy: Failed`, a pod failure policy) sees one: an orphaned
//! pod also gets the DisruptionTarget condition (reason DeletionByPodGC).

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, Preconditions};
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{name, namespace};
use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::store::Store;
use tokio::sync::watch;

use crate::pods::{is_finished, phase};

/// kube-controller-manager's pod GC period of checks (gcCheckPeriod).
pub const CHECK_PERIOD: Duration = Duration::from_secs(20);

/// kube-controller-manager's `--terminated-pod-gc-threshold` default.
pub const TERMINATED_POD_THRESHOLD: usize = 12_500;

/// The taint that says a node's agent is gone for good, so its terminating pods can go.
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

#[derive(Clone, Debug)]
pub struct Settings {
    /// How often the pods are checked.
    pub period: Duration,
    /// How many terminated pods may stay; 0 keeps them all.
    pub terminated_threshold: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            period: CHECK_PERIOD,
            terminated_threshold: TERMINATED_POD_THRESHOLD,
        }
    }
}

/// Why a pod is collected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    Terminated,
    TerminatingOutOfService,
    Orphaned,
    TerminatingUnscheduled,
}

impl Reason {
    /// The condition written with the Failed phase, if any.
    fn condition(self) -> Option<PodCondition> {
        (self == Reason::Orphaned).then(|| PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("DeletionByPodGC".into()),
            message: Some("PodGC: node no longer exists".into()),
            ..Default::default()
        })
    }
}

/// One check: the pods to collect, and the nodes found missing (the next check's
/// `missing_before`).
#[derive(Debug, Default)]
struct Plan {
    collect: Vec<(Arc<Pod>, Reason)>,
    missing: BTreeSet<String>,
}

fn node_of(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("")
}

/// As the kubelet marks a pod it evicted.
fn is_evicted(pod: &Pod) -> bool {
    phase(pod) == "Failed"
        && pod.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted")
}

/// Evicted pods first (they are nobody's record of work done), then the oldest, then by name.
fn collection_order(a: &Pod, b: &Pod) -> Ordering {
    is_evicted(b)
        .cmp(&is_evicted(a))
        .then_with(|| {
            let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            created(a).cmp(&created(b))
        })
        .then_with(|| name(&a.metadata).cmp(name(&b.metadata)))
}

fn out_of_service(node: &Node) -> bool {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref());
    crate::nodelifecycle::ready_status(node) != "True"
        && taints.is_some_and(|ts| ts.iter().any(|t| t.key == OUT_OF_SERVICE))
}

fn plan(
    pods: Vec<Arc<Pod>>,
    node: impl Fn(&str) -> Option<Arc<Node>>,
    missing_before: &BTreeSet<String>,
    terminated_threshold: usize,
) -> Plan {
    let mut plan = Plan::default();
    let mut chosen: BTreeSet<String> = BTreeSet::new();
    let mut choose = |plan: &mut Plan, pod: &Arc<Pod>, reason: Reason| {
        let key = format!("{}/{}", namespace(&pod.metadata), name(&pod.metadata));
        if chosen.insert(key) {
            plan.collect.push((pod.clone(), reason));
        }
    };
    if terminated_threshold > 0 {
        let mut terminated: Vec<&Arc<Pod>> = pods.iter().filter(|p| is_finished(p)).collect();
        if terminated.len() > terminated_threshold {
            let excess = terminated.len() - terminated_threshold;
            terminated.sort_by(|a, b| collection_order(a, b));
            for pod in &terminated[..excess] {
                choose(&mut plan, pod, Reason::Terminated);
            }
        }
    }
    for pod in &pods {
        let node_name = node_of(pod);
        let terminating = pod.metadata.deletion_timestamp.is_some();
        if node_name.is_empty() {
            if terminating {
                choose(&mut plan, pod, Reason::TerminatingUnscheduled);
            }
            continue;
        }
        match node(node_name) {
            Some(n) if terminating && out_of_service(&n) => {
                choose(&mut plan, pod, Reason::TerminatingOutOfService)
            }
            Some(_) => {}
            None => {
                plan.missing.insert(node_name.to_string());
                if missing_before.contains(node_name) {
                    choose(&mut plan, pod, Reason::Orphaned);
                }
            }
        }
    }
    plan
}

/// The pod's status marked Failed, with `condition` set as Kubernetes updates a pod
/// condition (its transition time kept when its status does not change).
fn failed_status(pod: &Pod, condition: Option<PodCondition>) -> Pod {
    let mut pod = pod.clone();
    let status = pod.status.get_or_insert_with(Default::default);
    status.phase = Some("Failed".into());
    if let Some(c) = condition {
        crate::pods::set_condition(status, c);
    }
    pod
}

/// Marks the pod Failed unless it has finished, then deletes it with grace period 0.
async fn collect(client: &LocalClient, pod: &Pod, reason: Reason) -> Result<(), ApiError> {
    let (ns, pod_name) = (namespace(&pod.metadata), name(&pod.metadata));
    let pods = Objects::<Pod>::namespaced(client, ns);
    if !is_finished(pod) {
        // The cached resourceVersion is the precondition: a pod changed meanwhile is looked
        // at again at the next check.
        let marked = pods
            .replace_status(pod_name, &failed_status(pod, reason.condition()))
            .await;
        if ignore_gone(marked)?.is_none() {
            return Ok(());
        }
    }
    let options = DeleteOptions {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    ignore_gone(pods.delete_with(pod_name, &options).await).map(|_| ())
}

pub fn run(
    pods: Arc<Store<Pod>>,
    nodes: Arc<Store<Node>>,
    client: LocalClient,
    settings: Settings,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        for mut synced in [pods.synced(), nodes.synced()] {
            let _ = synced.wait_for(|s| *s).await;
        }
        // Nodes found missing at the previous check.
        let mut missing_before: BTreeSet<String> = BTreeSet::new();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(settings.period) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let plan = plan(
                pods.list(""),
                |n| nodes.get(n),
                &missing_before,
                settings.terminated_threshold,
            );
            for (pod, reason) in &plan.collect {
                let (ns, pod_name) = (namespace(&pod.metadata), name(&pod.metadata));
                match collect(&client, pod, *reason).await {
                    Ok(()) => tracing::info!(
                        namespace = ns,
                        pod = pod_name,
                        node = node_of(pod),
                        reason = ?reason,
                        "pod garbage-collected"
                    ),
                    Err(e) => {
                        tracing::debug!(namespace = ns, pod = pod_name, error = %e, "pod garbage collection failed")
                    }
                }
            }
            missing_before = plan.missing;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct PodBuilder(serde_json::Value);

    impl PodBuilder {
        fn new(name: &str) -> Self {
            PodBuilder(json!({"metadata": {"name": name, "namespace": "default",
                "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": {}, "status": {}}))
        }
        fn node(mut self, node: &str) -> Self {
            self.0["spec"]["nodeName"] = json!(node);
            self
        }
        fn phase(mut self, phase: &str) -> Self {
            self.0["status"]["phase"] = json!(phase);
            self
        }
        fn evicted(mut self) -> Self {
            self.0["status"]["reason"] = json!("Evicted");
            self.phase("Failed")
        }
        fn created(mut self, at: &str) -> Self {
            self.0["metadata"]["creationTimestamp"] = json!(at);
            self
        }
        fn terminating(mut self) -> Self {
            self.0["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:05:00Z");
            self
        }
        fn build(self) -> Arc<Pod> {
            Arc::new(serde_json::from_value(self.0).unwrap())
        }
    }

    fn node(name: &str, ready: &str, taints: &[&str]) -> Arc<Node> {
        let taints: Vec<_> = taints
            .iter()
            .map(|k| json!({"key": k, "effect": "NoExecute"}))
            .collect();
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name},
                "spec": {"taints": taints},
                "status": {"conditions": [{"type": "Ready", "status": ready}]}}))
            .unwrap(),
        )
    }

    #[test]
    fn what_each_check_collects() {
        let nodes = [
            node("up", "True", &[]),
            node("down", "False", &[]),
            node("gone-for-good", "False", &[OUT_OF_SERVICE]),
            // The taint on a Ready node (set too early) does not count.
            node("ready-tainted", "True", &[OUT_OF_SERVICE]),
        ];
        let lookup = |n: &str| nodes.iter().find(|x| name(&x.metadata) == n).cloned();
        struct Case {
            what: &'static str,
            pods: Vec<Arc<Pod>>,
            missing_before: &'static [&'static str],
            threshold: usize,
            want: Vec<(&'static str, Reason)>,
            missing: &'static [&'static str],
        }
        let cases = [
            Case {
                what: "running, pending and terminating pods on live nodes stay",
                pods: vec![
                    PodBuilder::new("a").node("up").phase("Running").build(),
                    PodBuilder::new("b").phase("Pending").build(),
                    PodBuilder::new("c").node("up").terminating().build(),
                    PodBuilder::new("d").node("down").terminating().build(),
                    PodBuilder::new("e")
                        .node("ready-tainted")
                        .terminating()
                        .build(),
                    PodBuilder::new("f").node("gone-for-good").build(),
                ],
                missing_before: &[],
                threshold: 10,
                want: vec![],
                missing: &[],
            },
            Case {
                what: "a terminating pod never scheduled goes at once",
                pods: vec![PodBuilder::new("a").terminating().build()],
                missing_before: &[],
                threshold: 10,
                want: vec![("a", Reason::TerminatingUnscheduled)],
                missing: &[],
            },
            Case {
                what: "a terminating pod on an out-of-service node that is not Ready goes",
                pods: vec![PodBuilder::new("a")
                    .node("gone-for-good")
                    .terminating()
                    .build()],
                missing_before: &[],
                threshold: 10,
                want: vec![("a", Reason::TerminatingOutOfService)],
                missing: &[],
            },
            Case {
                what: "a missing node is remembered first, its pods collected at the next check",
                pods: vec![PodBuilder::new("a").node("vanished").build()],
                missing_before: &[],
                threshold: 10,
                want: vec![],
                missing: &["vanished"],
            },
            Case {
                what: "pods of a node missing at two checks in a row go",
                pods: vec![
                    PodBuilder::new("a")
                        .node("vanished")
                        .phase("Running")
                        .build(),
                    PodBuilder::new("b").node("other").build(),
                ],
                missing_before: &["vanished"],
                threshold: 10,
                want: vec![("a", Reason::Orphaned)],
                missing: &["other", "vanished"],
            },
            Case {
                what: "terminated pods beyond the threshold: evicted first, then the oldest",
                pods: vec![
                    PodBuilder::new("new")
                        .node("up")
                        .phase("Succeeded")
                        .created("2026-01-03T00:00:00Z")
                        .build(),
                    PodBuilder::new("old-b")
                        .node("up")
                        .phase("Failed")
                        .created("2026-01-01T00:00:00Z")
                        .build(),
                    PodBuilder::new("old-a")
                        .node("up")
                        .phase("Succeeded")
                        .created("2026-01-01T00:00:00Z")
                        .build(),
                    PodBuilder::new("evicted")
                        .node("up")
                        .evicted()
                        .created("2026-01-04T00:00:00Z")
                        .build(),
                    PodBuilder::new("running")
                        .node("up")
                        .phase("Running")
                        .build(),
                ],
                missing_before: &[],
                threshold: 1,
                want: vec![
                    ("evicted", Reason::Terminated),
                    ("old-a", Reason::Terminated),
                    ("old-b", Reason::Terminated),
                ],
                missing: &[],
            },
            Case {
                what: "threshold 0 keeps every terminated pod",
                pods: vec![PodBuilder::new("a").node("up").phase("Failed").build()],
                missing_before: &[],
                threshold: 0,
                want: vec![],
                missing: &[],
            },
            Case {
                what: "a pod collected for two reasons is collected once",
                pods: vec![
                    PodBuilder::new("a")
                        .node("vanished")
                        .phase("Failed")
                        .build(),
                    PodBuilder::new("b")
                        .node("up")
                        .phase("Failed")
                        .created("2026-01-02T00:00:00Z")
                        .build(),
                ],
                missing_before: &["vanished"],
                threshold: 1,
                want: vec![("a", Reason::Terminated)],
                missing: &["vanished"],
            },
        ];
        for c in cases {
            let before = c.missing_before.iter().map(|s| s.to_string()).collect();
            let p = plan(c.pods, lookup, &before, c.threshold);
            let got: Vec<_> = p
                .collect
                .iter()
                .map(|(pod, r)| (name(&pod.metadata), *r))
                .collect();
            assert_eq!(got, c.want, "{}", c.what);
            let missing: Vec<_> = p.missing.iter().map(String::as_str).collect();
            assert_eq!(missing, c.missing, "{}", c.what);
        }
    }

    #[test]
    fn marked_failed_with_the_condition_of_its_reason() {
        let pod = PodBuilder::new("a")
            .node("vanished")
            .phase("Running")
            .build();
        let orphan = failed_status(&pod, Reason::Orphaned.condition());
        let status = orphan.status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let c = &status.conditions.unwrap()[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()),
            ("DisruptionTarget", "True", Some("DeletionByPodGC"))
        );
        assert_eq!(c.message.as_deref(), Some("PodGC: node no longer exists"));
        assert!(c.last_transition_time.is_some());
        // An unscheduled pod is only marked Failed, as Kubernetes does.
        let unscheduled = PodBuilder::new("b").terminating().build();
        let status = failed_status(&unscheduled, Reason::TerminatingUnscheduled.condition())
            .status
            .unwrap();
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert!(status.conditions.is_none());
    }
}
