//! A DaemonSet's pods grouped by the node they are for, and what follows from them: the
//! placing loop's plan (which nodes get a pod, which pods go), each node's slot for the
//! rolling update, and the status counts.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::Pod;
use rkube_core::meta::{name, namespace};

use super::min_ready;
use super::placement::{Placement, HASH_LABEL};
use super::rolling::{NodeSlot, PodState};
use crate::pods::{is_available, is_ready, phase};
use rkube_runtime::events::{NORMAL, WARNING};

/// Pods grouped by the node they are for (oldest first on each).
pub(super) type ByNode = BTreeMap<String, Vec<Arc<Pod>>>;

pub(super) fn by_age(pods: &mut [Arc<Pod>]) {
    pods.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .cmp(&b.metadata.creation_timestamp)
            .then_with(|| name(&a.metadata).cmp(name(&b.metadata)))
    });
}

pub(super) fn hash_of(pod: &Pod) -> &str {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HASH_LABEL))
        .map_or("", String::as_str)
}

pub(super) fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// The event that goes with a deletion: (type, reason, message).
pub(super) type Note = (&'static str, &'static str, String);

/// What the placing loop does: pods to create (on these nodes) and to delete (with the
/// event that goes with each, if any).
#[derive(Debug, Default, PartialEq)]
pub(super) struct Plan {
    pub(super) create_on: Vec<String>,
    pub(super) delete: Vec<(String, Option<Note>)>,
    /// Nodes whose failed pod is deleted now: their next failed pod waits a backoff.
    pub(super) failed_on: Vec<String>,
    /// A failed pod waits out its node's backoff.
    pub(super) backing_off: bool,
}

/// The placing loop over every node (Kubernetes' `podsShouldBeOnNode`): `placements` of the
/// nodes that exist, `by_node` the pods for each node, `hash` the current revision; a failed
/// pod on a node for which `backing_off` holds is left until later.
pub(super) fn plan(
    placements: &BTreeMap<String, Placement>,
    by_node: &ByNode,
    hash: &str,
    surge: bool,
    min_ready: i64,
    now: k8s_openapi::jiff::Timestamp,
    backing_off: &dyn Fn(&str) -> bool,
) -> Plan {
    let mut plan = Plan::default();
    for (node, p) in placements {
        let pods = by_node.get(node).map(Vec::as_slice).unwrap_or(&[]);
        if p.should_run && pods.is_empty() {
            plan.create_on.push(node.clone());
        } else if p.may_stay {
            let mut running = Vec::new();
            for pod in pods.iter().filter(|p| !deleting(p)) {
                let ended = match phase(pod) {
                    "Failed" => Some((WARNING, "FailedDaemonPod", "kill")),
                    "Succeeded" => Some((NORMAL, "SucceededDaemonPod", "delete")),
                    _ => None,
                };
                match ended {
                    // Kubernetes' guard against a node that keeps failing the pods it is
                    // given: not every reconcile replaces them.
                    Some(_) if phase(pod) == "Failed" && backing_off(node) => {
                        plan.backing_off = true;
                    }
                    Some((ty, reason, verb)) => {
                        if phase(pod) == "Failed" {
                            plan.failed_on.push(node.clone());
                        }
                        let phase = phase(pod).to_lowercase();
                        let msg = format!(
                            "Found {phase} daemon pod {}/{} on node {node}, will try to {verb} it",
                            namespace(&pod.metadata),
                            name(&pod.metadata)
                        );
                        plan.delete
                            .push((name(&pod.metadata).to_string(), Some((ty, reason, msg))));
                    }
                    None => running.push(pod),
                }
            }
            if running.len() <= 1 {
                continue;
            }
            if !surge {
                // The oldest stays.
                for pod in &running[1..] {
                    plan.delete.push((name(&pod.metadata).to_string(), None));
                }
                continue;
            }
            // With surge a node may hold one old and one new pod: the old one while the new
            // one is not available yet.
            let (mut oldest_new, mut oldest_old) = (None, None);
            for pod in running {
                let slot = if hash_of(pod) == hash {
                    &mut oldest_new
                } else {
                    &mut oldest_old
                };
                if slot.is_none() {
                    *slot = Some(pod);
                } else {
                    plan.delete.push((name(&pod.metadata).to_string(), None));
                }
            }
            if let (Some(new), Some(old)) = (oldest_new, oldest_old) {
                if !is_ready(old) || is_available(new, min_ready, now) {
                    plan.delete.push((name(&old.metadata).to_string(), None));
                }
            }
        } else {
            for pod in pods.iter().filter(|p| !deleting(p)) {
                plan.delete.push((name(&pod.metadata).to_string(), None));
            }
        }
    }
    // Pods waiting for a node that no longer exists.
    for (node, pods) in by_node {
        if placements.contains_key(node) {
            continue;
        }
        for pod in pods.iter().filter(|p| !deleting(p)) {
            let unscheduled = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_none_or(str::is_empty);
            if unscheduled {
                plan.delete.push((name(&pod.metadata).to_string(), None));
            }
        }
    }
    plan
}

/// What each node holds for the rolling update: every node with daemon pods, and every node
/// that should run one even while it has none (its old pod deleted for good and the new one
/// not yet seen), which counts as unavailable: as Kubernetes' controller walks the nodes.
pub(super) fn slots(
    placements: &BTreeMap<String, Placement>,
    by_node: &ByNode,
    hash: &str,
    min_ready: i64,
    now: k8s_openapi::jiff::Timestamp,
) -> Vec<NodeSlot> {
    let wanted = placements
        .iter()
        .filter(|(_, p)| p.should_run)
        .map(|(node, _)| node);
    let nodes: std::collections::BTreeSet<&String> = by_node.keys().chain(wanted).collect();
    nodes
        .into_iter()
        .map(|node| {
            let pods = by_node.get(node).map(Vec::as_slice).unwrap_or(&[]);
            let (mut new, mut old, mut excess) = (None, None, false);
            for pod in pods.iter().filter(|p| !deleting(p)) {
                let state = PodState {
                    name: name(&pod.metadata).to_string(),
                    available: is_available(pod, min_ready, now),
                };
                let slot = if hash_of(pod) == hash {
                    &mut new
                } else {
                    &mut old
                };
                excess |= slot.is_some();
                *slot = Some(state);
            }
            NodeSlot {
                node: node.clone(),
                should_run: placements.get(node).is_some_and(|p| p.should_run),
                new,
                old,
                excess,
            }
        })
        .collect()
}

/// The status counts (Kubernetes' `updateDaemonSetStatus`), conditions and collision count
/// kept.
pub(super) fn status(
    ds: &DaemonSet,
    placements: &BTreeMap<String, Placement>,
    by_node: &ByNode,
    hash: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> DaemonSetStatus {
    let min_ready = min_ready(ds);
    let (mut desired, mut current, mut misscheduled) = (0, 0, 0);
    let (mut ready, mut available, mut updated) = (0, 0, 0);
    for (node, p) in placements {
        let oldest = by_node.get(node).and_then(|pods| pods.first());
        if p.should_run {
            desired += 1;
            let Some(pod) = oldest else {
                continue;
            };
            current += 1;
            if is_ready(pod) {
                ready += 1;
                if is_available(pod, min_ready, now) {
                    available += 1;
                }
            }
            if hash_of(pod) == hash {
                updated += 1;
            }
        } else if oldest.is_some() {
            misscheduled += 1;
        }
    }
    let previous = ds.status.clone().unwrap_or_default();
    let some = |n: i32| (n > 0).then_some(n);
    DaemonSetStatus {
        desired_number_scheduled: desired,
        current_number_scheduled: current,
        number_misscheduled: misscheduled,
        number_ready: ready,
        number_available: some(available),
        number_unavailable: some(desired - available),
        updated_number_scheduled: some(updated),
        observed_generation: ds.metadata.generation,
        collision_count: previous.collision_count,
        conditions: previous.conditions,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::rolling;
    use super::*;
    use serde_json::{json, Value};

    pub(crate) fn pod(name: &str, hash: &str, created: &str, status: Value) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns",
                "creationTimestamp": created, "labels": {HASH_LABEL: hash}},
                "spec": {"nodeName": "n1", "containers": []}, "status": status}))
            .unwrap(),
        )
    }

    fn ready() -> Value {
        json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    }

    #[test]
    fn the_placing_loop() {
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let run = Placement {
            should_run: true,
            may_stay: true,
        };
        let stay = Placement {
            should_run: false,
            may_stay: true,
        };
        let off = Placement {
            should_run: false,
            may_stay: false,
        };
        let (t1, t2) = ("2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z");
        // (what the case shows, placement of n1, pods on n1, surge, created on, deleted)
        type Case<'a> = (
            &'a str,
            Placement,
            Vec<Arc<Pod>>,
            bool,
            &'a [&'a str],
            &'a [&'a str],
        );
        let cases: Vec<Case> = vec![
            ("an empty node gets a pod", run, vec![], false, &["n1"], &[]),
            (
                "one pod is enough",
                run,
                vec![pod("a", "h", t1, ready())],
                false,
                &[],
                &[],
            ),
            (
                "the oldest of two stays",
                run,
                vec![pod("a", "h", t1, ready()), pod("b", "h", t2, ready())],
                false,
                &[],
                &["b"],
            ),
            (
                "a failed pod goes",
                run,
                vec![pod("a", "h", t1, json!({"phase": "Failed"}))],
                false,
                &[],
                &["a"],
            ),
            (
                "a NoSchedule taint lets it stay",
                stay,
                vec![pod("a", "h", t1, ready())],
                false,
                &[],
                &[],
            ),
            ("no empty node gets one then", stay, vec![], false, &[], &[]),
            (
                "an ineligible node loses it",
                off,
                vec![pod("a", "h", t1, ready())],
                false,
                &[],
                &["a"],
            ),
            (
                "surge: the old pod stays while the new one is not available",
                run,
                vec![
                    pod("old", "h0", t1, ready()),
                    pod("new", "h", t2, json!({})),
                ],
                true,
                &[],
                &[],
            ),
            (
                "and goes once it is",
                run,
                vec![pod("old", "h0", t1, ready()), pod("new", "h", t2, ready())],
                true,
                &[],
                &["old"],
            ),
        ];
        for (what, p, pods, surge, create_on, delete) in cases {
            let placements = BTreeMap::from([("n1".to_string(), p)]);
            let by_node = ByNode::from([("n1".to_string(), pods)]);
            let got = plan(&placements, &by_node, "h", surge, 0, now, &|_| false);
            let deleted: Vec<&str> = got.delete.iter().map(|(p, _)| p.as_str()).collect();
            assert_eq!(got.create_on, *create_on, "{what}: created on");
            assert_eq!(deleted, *delete, "{what}: deleted");
        }
    }

    /// A node that should run the pod but holds none (its old pod gone for good, the new one
    /// not in the cache yet) is unavailable: the next old pod waits (a rollout on real
    /// containers took both nodes' pods down at once without it).
    #[test]
    fn a_node_between_its_old_and_new_pod_holds_the_rollout() {
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let run = Placement {
            should_run: true,
            may_stay: true,
        };
        let placements = BTreeMap::from([("n1".to_string(), run), ("n2".to_string(), run)]);
        let by_node = ByNode::from([(
            "n2".to_string(),
            vec![pod("old", "h0", "2026-01-01T00:00:00Z", ready())],
        )]);
        let slots = slots(&placements, &by_node, "h", 0, now);
        assert_eq!(slots.len(), 2);
        assert_eq!((&slots[0].new, &slots[0].old), (&None, &None));
        let step = rolling::next_step(&slots, 0, 1, 2);
        assert!(step.delete.is_empty(), "{step:?}");
    }

    #[test]
    fn the_status_counts_nodes_as_kubernetes_does() {
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "agent", "generation": 3},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {}},
            "status": {"collisionCount": 1, "desiredNumberScheduled": 0,
                       "currentNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0}}))
        .unwrap();
        let p = |should_run| Placement {
            should_run,
            may_stay: true,
        };
        let placements = BTreeMap::from([
            ("n1".to_string(), p(true)),
            ("n2".to_string(), p(true)),
            ("n3".to_string(), p(true)),
            ("n4".to_string(), p(false)),
        ]);
        let t = "2026-01-01T00:00:00Z";
        let by_node = ByNode::from([
            ("n1".to_string(), vec![pod("a", "h", t, ready())]),
            (
                "n2".to_string(),
                vec![pod("b", "old", t, json!({"phase": "Pending"}))],
            ),
            ("n4".to_string(), vec![pod("d", "h", t, ready())]),
        ]);
        let s = status(&ds, &placements, &by_node, "h", now);
        assert_eq!(
            serde_json::to_value(s).unwrap(),
            json!({"desiredNumberScheduled": 3, "currentNumberScheduled": 2,
                   "numberMisscheduled": 1, "numberReady": 1, "numberAvailable": 1,
                   "numberUnavailable": 2, "updatedNumberScheduled": 1,
                   "observedGeneration": 3, "collisionCount": 1})
        );
    }
}
