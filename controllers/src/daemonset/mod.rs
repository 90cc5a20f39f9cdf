//! The DaemonSet controller: one pod per eligible node, as Kubernetes' daemon controller keeps
//! them.
//!
//! A reconcile first records the current template as a ControllerRevision
//! ([`crate::history`]), then
//! claims the pods that match the selector, groups them by the node they are for, and decides
//! per node ([`placement`]): a node that should run the pod and has none gets one (pinned to
//! it by node affinity on `metadata.name`, the scheduler binds it); a failed or succeeded pod
//! is deleted so that a fresh one replaces it; extra pods go, the oldest staying; pods on
//! nodes that no longer admit them go. When nothing is pending, a RollingUpdate takes its
//! next step ([`rolling`]); OnDelete leaves old pods until someone deletes them. Old revisions
//! beyond revisionHistoryLimit are pruned and the status written. Expectations, as the
//! ReplicaSet controller keeps them, stop a stale cache from creating or deleting twice.

mod placement;
mod rolling;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Node, Pod};
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{key, name, namespace};
use rkube_core::selector::LabelSelector;

use crate::history;
use crate::pods::{is_available, is_ready, phase};
use crate::replicaset::Expectations;
use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::controller::{Action, Controller};
use rkube_runtime::events::{Recorder, NORMAL, WARNING};
use rkube_runtime::store::Store;

pub use placement::HASH_LABEL;
use placement::{daemon_spec, placement, pod_for_node, target_node, Placement};
use rolling::{NodeSlot, PodState};

const COMPONENT: &str = "daemonset-controller";
/// Most pods one reconcile creates or deletes (Kubernetes' BurstReplicas for DaemonSets).
const BURST: usize = 250;
const WORKERS: usize = 2;

/// The reconciler's context.
pub struct DaemonSets {
    nodes: Arc<Store<Node>>,
    pods: Arc<Store<Pod>>,
    revisions: Arc<Store<ControllerRevision>>,
    client: LocalClient,
    expectations: Arc<Expectations>,
    failed_backoff: Backoff,
    recorder: Recorder,
}

/// How long a DaemonSet waits before it replaces a failed pod on a node again: from 1 s,
/// doubling with each failure up to 15 minutes, and forgotten after twice that without one
/// (Kubernetes' failedPodsBackoff).
#[derive(Default)]
struct Backoff {
    /// "<daemonset key>/<node>" -> (delay, when the last failed pod was replaced)
    entries: std::sync::Mutex<HashMap<String, (Duration, Instant)>>,
}

impl Backoff {
    const INITIAL: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(15 * 60);

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, (Duration, Instant)>) -> R) -> R {
        f(&mut self.entries.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// How much longer the node's next failed pod waits, if it does.
    fn waiting(&self, ds: &str, node: &str) -> Option<Duration> {
        self.with(|m| {
            let (delay, since) = m.get(&format!("{ds}/{node}"))?;
            delay.checked_sub(since.elapsed()).filter(|d| !d.is_zero())
        })
    }

    /// A failed pod on the node is replaced now: the next one waits longer.
    fn next(&self, ds: &str, node: &str) {
        self.with(|m| {
            let now = Instant::now();
            m.retain(|_, (_, since)| now.duration_since(*since) < 2 * Self::MAX);
            let entry = m
                .entry(format!("{ds}/{node}"))
                .or_insert((Duration::ZERO, now));
            entry.0 = if entry.0.is_zero() {
                Self::INITIAL
            } else {
                (entry.0 * 2).min(Self::MAX)
            };
            entry.1 = now;
        })
    }
}

fn selector_of(ds: &DaemonSet) -> Option<LabelSelector> {
    crate::pods::claiming_selector(&ds.spec.as_ref()?.selector)
}

fn selects(ds: &DaemonSet, pod: &Pod) -> bool {
    selector_of(ds).is_some_and(|s| s.matches_labels(pod.metadata.labels.as_ref()))
}

/// Whether a node change can change where daemon pods belong (its labels, taints or
/// cordon), or the node came or went.
fn placement_changed(old: Option<&Arc<Node>>, new: Option<&Arc<Node>>) -> bool {
    match (old, new) {
        (Some(o), Some(n)) => {
            o.metadata.labels != n.metadata.labels
                || o.spec.as_ref().map(|s| (&s.taints, s.unschedulable))
                    != n.spec.as_ref().map(|s| (&s.taints, s.unschedulable))
        }
        _ => true,
    }
}

/// Starts the DaemonSet controller until `stop`.
pub fn start(
    daemonsets: Arc<Store<DaemonSet>>,
    nodes: Arc<Store<Node>>,
    pods: Arc<Store<Pod>>,
    revisions: Arc<Store<ControllerRevision>>,
    client: LocalClient,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let expectations = Arc::new(Expectations::default());
    // # Correctness
    // Expectations count a pod event before the builder's handlers (added after this one)
    // queue the DaemonSet: a reconcile taking the key must see its own writes observed.
    let e = expectations.clone();
    pods.on_change(Box::new(move |old, new| {
        crate::replicaset::observe::<DaemonSet>(&e, old, new)
    }));
    let orphans = crate::pods::claimers(daemonsets.clone(), selects);
    let every_daemonset = {
        let daemonsets = daemonsets.clone();
        move |old: Option<&Arc<Node>>, new: Option<&Arc<Node>>| {
            if !placement_changed(old, new) {
                return Vec::new();
            }
            daemonsets
                .list("")
                .iter()
                .map(|ds| key(&ds.metadata))
                .collect()
        }
    };
    let gone = expectations.clone();
    let controller = Controller::new(COMPONENT, daemonsets)
        .owns(&pods)
        .owns(&revisions)
        .watches(&pods, orphans)
        .watches(&nodes, every_daemonset)
        .on_gone(move |key| gone.forget(key));
    let ctx = Arc::new(DaemonSets {
        nodes,
        pods,
        revisions,
        recorder: Recorder::new(client.clone(), COMPONENT),
        client,
        expectations,
        failed_backoff: Backoff::default(),
    });
    controller.run(
        WORKERS,
        stop,
        ctx,
        |ds: Arc<DaemonSet>, ctx: Arc<DaemonSets>| async move { ctx.reconcile(&ds).await },
    );
}

/// Pods grouped by the node they are for (oldest first on each).
type ByNode = BTreeMap<String, Vec<Arc<Pod>>>;

fn by_age(pods: &mut [Arc<Pod>]) {
    pods.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .cmp(&b.metadata.creation_timestamp)
            .then_with(|| name(&a.metadata).cmp(name(&b.metadata)))
    });
}

fn hash_of(pod: &Pod) -> &str {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HASH_LABEL))
        .map_or("", String::as_str)
}

fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn uses_surge(ds: &DaemonSet, desired: i64) -> bool {
    rolling_limits(ds, desired).is_some_and(|(surge, _)| surge > 0)
}

/// (maxSurge, maxUnavailable) of a RollingUpdate DaemonSet for `desired` nodes; None for
/// OnDelete.
fn rolling_limits(ds: &DaemonSet, desired: i64) -> Option<(i64, i64)> {
    let strategy = ds.spec.as_ref()?.update_strategy.as_ref();
    if strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete") {
        return None;
    }
    let update = strategy.and_then(|s| s.rolling_update.as_ref());
    Some(rolling::limits(
        update.and_then(|u| u.max_surge.as_ref()),
        update.and_then(|u| u.max_unavailable.as_ref()),
        desired,
    ))
}

fn min_ready(ds: &DaemonSet) -> i64 {
    i64::from(
        ds.spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .unwrap_or(0),
    )
}

/// The event that goes with a deletion: (type, reason, message).
type Note = (&'static str, &'static str, String);

/// What the placing loop does: pods to create (on these nodes) and to delete (with the
/// event that goes with each, if any).
#[derive(Debug, Default, PartialEq)]
struct Plan {
    create_on: Vec<String>,
    delete: Vec<(String, Option<Note>)>,
    /// Nodes whose failed pod is deleted now: their next failed pod waits a backoff.
    failed_on: Vec<String>,
    /// A failed pod waits out its node's backoff.
    backing_off: bool,
}

/// The placing loop over every node (Kubernetes' `podsShouldBeOnNode`): `placements` of the
/// nodes that exist, `by_node` the pods for each node, `hash` the current revision; a failed
/// pod on a node for which `backing_off` holds is left until later.
fn plan(
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
fn slots(
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
fn status(
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

impl DaemonSets {
    fn pods_in<'a>(&'a self, ns: &'a str) -> Objects<'a, Pod> {
        Objects::namespaced(&self.client, ns)
    }

    async fn reconcile(&self, ds: &DaemonSet) -> Result<Action, ApiError> {
        let meta = &ds.metadata;
        if meta.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let ds_key = key(meta);
        let Some((current, old_revisions)) =
            history::record(&self.revisions, &self.client, ds).await?
        else {
            // A name collision was counted: the next reconcile hashes anew.
            return Ok(Action::requeue(Duration::from_millis(100)));
        };
        let hash = history::hash_of(&current).to_string();
        let mut by_node = ByNode::new();
        for pod in self.claim(ds).await? {
            if let Some(node) = target_node(&pod) {
                by_node.entry(node.to_string()).or_default().push(pod);
            }
        }
        for pods in by_node.values_mut() {
            by_age(pods);
        }
        let spec = daemon_spec(ds);
        let placements: BTreeMap<String, Placement> = self
            .nodes
            .list("")
            .iter()
            .map(|n| (name(&n.metadata).to_string(), placement(&spec, n)))
            .collect();
        let desired = placements.values().filter(|p| p.should_run).count() as i64;
        let now = crate::pods::now();
        let min_ready = min_ready(ds);
        let mut retry_failed = None;
        if self.expectations.satisfied(&ds_key) {
            let backing_off = |node: &str| self.failed_backoff.waiting(&ds_key, node).is_some();
            let plan = plan(
                &placements,
                &by_node,
                &hash,
                uses_surge(ds, desired),
                min_ready,
                now,
                &backing_off,
            );
            for node in &plan.failed_on {
                self.failed_backoff.next(&ds_key, node);
            }
            if plan.backing_off {
                retry_failed = placements
                    .keys()
                    .filter_map(|n| self.failed_backoff.waiting(&ds_key, n))
                    .min();
            }
            self.sync_nodes(ds, &ds_key, plan.delete, plan.create_on, &hash)
                .await;
            if let Some((surge, unavailable)) = rolling_limits(ds, desired) {
                if self.expectations.satisfied(&ds_key) {
                    let slots = slots(&placements, &by_node, &hash, min_ready, now);
                    let step = rolling::next_step(&slots, surge, unavailable, desired);
                    let delete = step.delete.into_iter().map(|p| (p, None)).collect();
                    self.sync_nodes(ds, &ds_key, delete, step.create_on, &hash)
                        .await;
                }
            }
        }
        let live: HashSet<&str> = by_node.values().flatten().map(|p| hash_of(p)).collect();
        history::prune(&self.client, ds, &old_revisions, &live).await?;
        let status = status(ds, &placements, &by_node, &hash, now);
        if ds.status.as_ref() != Some(&status) {
            let mut updated = ds.clone();
            updated.status = Some(status);
            let objects = Objects::<DaemonSet>::namespaced(&self.client, namespace(meta));
            ignore_gone(objects.replace_status(name(meta), &updated).await)?;
        }
        let waiting = by_node
            .values()
            .flatten()
            .any(|p| is_ready(p) && !is_available(p, min_ready, now));
        Ok(match retry_failed {
            _ if min_ready > 0 && waiting => Action::requeue(Duration::from_secs(1)),
            Some(after) => Action::requeue(after),
            None => Action::await_change(),
        })
    }

    /// The DaemonSet's pods, after adopting matching orphans and releasing owned pods that
    /// stopped matching; pods that ended and are being deleted are left out.
    async fn claim(&self, ds: &DaemonSet) -> Result<Vec<Arc<Pod>>, ApiError> {
        let mut owned =
            crate::pods::claim(&self.client, &self.pods, ds, |p| selects(ds, p)).await?;
        owned.retain(|p| !(matches!(phase(p), "Failed" | "Succeeded") && deleting(p)));
        Ok(owned)
    }

    /// Deletes `delete` (recording the event given with each) and creates a pod of revision
    /// `hash` on each of `create_on`, at most a burst of each; creations go in slow-start
    /// batches (1, 2, 4...), and a failed batch stops the rest.
    async fn sync_nodes(
        &self,
        ds: &DaemonSet,
        ds_key: &str,
        mut delete: Vec<(String, Option<Note>)>,
        mut create_on: Vec<String>,
        hash: &str,
    ) {
        delete.truncate(BURST);
        create_on.truncate(BURST);
        if delete.is_empty() && create_on.is_empty() {
            return;
        }
        let ns = namespace(&ds.metadata);
        let keys = delete.iter().map(|(p, _)| format!("{ns}/{p}")).collect();
        self.expectations.expect_deletions(ds_key, keys);
        self.expectations
            .expect_creations(ds_key, create_on.len() as i64);
        let pods = self.pods_in(ns);
        let mut nodes = create_on.iter();
        let mut batch = 1;
        let mut left = create_on.len();
        while left > 0 {
            let size = batch.min(left);
            let made: Vec<Pod> = nodes
                .by_ref()
                .take(size)
                .map(|n| pod_for_node(ds, n, hash))
                .collect();
            let results = futures::future::join_all(made.iter().map(|p| pods.create(p))).await;
            left -= size;
            let mut failed = false;
            for r in results {
                match r {
                    Ok(created) => {
                        let msg = format!("Created pod: {}", name(&created.metadata));
                        self.recorder
                            .event_for(ds, NORMAL, "SuccessfulCreate", &msg)
                            .await;
                    }
                    Err(e) => {
                        failed = true;
                        self.expectations.creation_observed(ds_key);
                        let msg = format!("Error creating: {}", e.message);
                        self.recorder
                            .event_for(ds, WARNING, "FailedCreate", &msg)
                            .await;
                    }
                }
            }
            if failed {
                for _ in 0..left {
                    self.expectations.creation_observed(ds_key);
                }
                break;
            }
            batch *= 2;
        }
        for (pod, why) in delete {
            if let Some((ty, reason, msg)) = why {
                self.recorder.event_for(ds, ty, reason, &msg).await;
            }
            match pods.delete(&pod).await {
                Ok(()) => {
                    let msg = format!("Deleted pod: {pod}");
                    self.recorder
                        .event_for(ds, NORMAL, "SuccessfulDelete", &msg)
                        .await;
                }
                Err(e) => {
                    self.expectations
                        .deletion_observed(ds_key, &format!("{ns}/{pod}"));
                    if e.code != 404 {
                        let msg = format!("Error deleting: {}", e.message);
                        self.recorder
                            .event_for(ds, WARNING, "FailedDelete", &msg)
                            .await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn pod(name: &str, hash: &str, created: &str, status: Value) -> Arc<Pod> {
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
    fn a_node_that_keeps_failing_pods_waits_longer_each_time() {
        let b = Backoff::default();
        assert_eq!(b.waiting("ns/agent", "n1"), None);
        b.next("ns/agent", "n1");
        let first = b.waiting("ns/agent", "n1").expect("a first backoff");
        assert!(first <= Backoff::INITIAL);
        b.next("ns/agent", "n1");
        let second = b.waiting("ns/agent", "n1").expect("a second backoff");
        assert!(second > Backoff::INITIAL && second <= 2 * Backoff::INITIAL);
        assert_eq!(b.waiting("ns/agent", "n2"), None, "per node");
        // A failed pod on a backing-off node is left alone, and the plan says so.
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let run = Placement {
            should_run: true,
            may_stay: true,
        };
        let placements = BTreeMap::from([("n1".to_string(), run)]);
        let failed = pod("a", "h", "2026-01-01T00:00:00Z", json!({"phase": "Failed"}));
        let by_node = ByNode::from([("n1".to_string(), vec![failed])]);
        let waits = plan(&placements, &by_node, "h", false, 0, now, &|_| true);
        assert!(waits.delete.is_empty() && waits.create_on.is_empty() && waits.backing_off);
        let goes = plan(&placements, &by_node, "h", false, 0, now, &|_| false);
        assert_eq!(goes.failed_on, ["n1"]);
        let note = goes.delete[0].1.as_ref().expect("an event");
        assert_eq!(
            (note.1, note.2.as_str()),
            (
                "FailedDaemonPod",
                "Found failed daemon pod ns/a on node n1, will try to kill it"
            )
        );
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
