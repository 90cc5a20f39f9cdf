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

mod nodes;
mod placement;
mod rolling;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
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

use nodes::{by_age, deleting, hash_of, plan, slots, status, ByNode, Note};
pub use placement::HASH_LABEL;
use placement::{daemon_spec, placement, pod_for_node, target_node, Placement};

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
    use super::nodes::tests::pod;
    use super::*;
    use serde_json::json;

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
}
