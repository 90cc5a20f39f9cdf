//! Node lifecycle: a node whose agent stops heartbeating (its Lease in kube-node-lease and its
//! Ready condition's lastHeartbeatTime) for longer than the grace period gets every condition
//! Unknown and the `node.kubernetes.io/unreachable` taints; one whose agent reports Ready=False
//! gets `node.kubernetes.io/not-ready`; the taints go when it is Ready again. Pods on a node
//! with a NoExecute taint they do not tolerate are deleted at once, and those that tolerate it
//! for tolerationSeconds (300 s by default, from admission) when that runs out, so their owners
//! recreate them elsewhere; each is first marked with the DisruptionTarget condition (reason
//! DeletionByTaintManager), as Kubernetes' taint eviction controller marks it. New NoExecute
//! taints are rate-limited (`--node-eviction-rate`).
//!
//! Heartbeats are timed by when this controller saw them change, not by the agent's clock, and
//! a new leader starts every node's grace period afresh, so a failover never marks live nodes
//! Unknown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, PodCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{name, namespace};
use rkube_core::taints::tolerates_taint;
use serde_json::json;

use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::events::{Recorder, NORMAL, WARNING};
use rkube_runtime::store::{Index, Store};

pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";

/// Kubernetes' node lifecycle settings (kube-controller-manager's flags of the same names).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How often nodes are checked (`--node-monitor-period`, 5 s).
    pub monitor_period: Duration,
    /// How long a node may go without a heartbeat (`--node-monitor-grace-period`, 40 s).
    pub grace_period: Duration,
    /// NoExecute taints added per second (`--node-eviction-rate`, 0.1).
    pub eviction_rate: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            monitor_period: Duration::from_secs(5),
            grace_period: Duration::from_secs(40),
            eviction_rate: 0.1,
        }
    }
}

fn now() -> Time {
    Time(crate::pods::now())
}

fn ready_condition(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
}

/// The node's Ready status; empty when its agent never reported one (a node just registered
/// is given the grace period, then marked Unknown).
pub(crate) fn ready_status(node: &Node) -> &str {
    ready_condition(node).map_or("", |c| c.status.as_str())
}

fn taints_of(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// The taints a node should carry for its Ready condition: (key, effect).
fn wanted_taints(ready: &str) -> Vec<(&'static str, &'static str)> {
    match ready {
        "True" | "" => vec![],
        "False" => vec![(NOT_READY, "NoExecute"), (NOT_READY, "NoSchedule")],
        _ => vec![(UNREACHABLE, "NoExecute"), (UNREACHABLE, "NoSchedule")],
    }
}

/// When a pod on a node with these taints must go (a time that may have passed), or None when
/// it tolerates their NoExecute ones forever.
fn eviction_deadline(pod: &Pod, taints: &[Taint]) -> Option<Timestamp> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let mut deadline: Option<Timestamp> = None;
    for taint in taints.iter().filter(|t| t.effect == "NoExecute") {
        let added = taint
            .time_added
            .as_ref()
            .map_or_else(Timestamp::now, |t| t.0);
        let mut matching = tolerations
            .iter()
            .filter(|t| tolerates_taint(t, taint))
            .peekable();
        let at = if matching.peek().is_none() {
            Some(added)
        } else {
            // The shortest tolerationSeconds among the matching tolerations; none means forever.
            matching
                .filter_map(|t| t.toleration_seconds)
                .min()
                .map(|secs| added + SignedDuration::from_secs(secs.max(0)))
        };
        if let Some(at) = at {
            deadline = Some(deadline.map_or(at, |d| d.min(at)));
        }
    }
    deadline
}

pub struct Controller {
    nodes: Arc<Store<Node>>,
    leases: Arc<Store<Lease>>,
    pods: Arc<Store<Pod>>,
    /// The pods bound to each node, so a pass over the nodes reads each pod once.
    pods_by_node: Arc<Index<Pod>>,
    client: LocalClient,
    settings: Settings,
    /// node -> (last heartbeat seen, when it was seen to change)
    seen: Mutex<HashMap<String, (String, Instant)>>,
    /// Token bucket for new NoExecute taints.
    tokens: Mutex<(f64, Instant)>,
    recorder: Recorder,
}

impl Controller {
    pub fn new(
        nodes: Arc<Store<Node>>,
        leases: Arc<Store<Lease>>,
        pods: Arc<Store<Pod>>,
        client: LocalClient,
        settings: Settings,
    ) -> Arc<Controller> {
        Arc::new(Controller {
            nodes,
            leases,
            pods_by_node: pods.index(|p: &Pod| p.spec.as_ref()?.node_name.clone()),
            pods,
            recorder: Recorder::new(client.clone(), "node-controller"),
            client,
            settings,
            seen: Mutex::new(HashMap::new()),
            tokens: Mutex::new((1.0, Instant::now())),
        })
    }

    pub fn run(self: &Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let c = self.clone();
        tokio::spawn(async move {
            for mut synced in [c.nodes.synced(), c.leases.synced(), c.pods.synced()] {
                let _ = synced.wait_for(|s| *s).await;
            }
            loop {
                if let Err(e) = c.monitor().await {
                    tracing::debug!(error = %e, "node monitoring failed; retrying");
                }
                tokio::select! {
                    _ = tokio::time::sleep(c.settings.monitor_period) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
    }

    fn take_token(&self) -> bool {
        let mut b = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        let refill = b.1.elapsed().as_secs_f64() * self.settings.eviction_rate;
        b.0 = (b.0 + refill).min(1.0);
        b.1 = Instant::now();
        if b.0 >= 1.0 - 1e-9 {
            b.0 -= 1.0;
            true
        } else {
            false
        }
    }

    /// The node's heartbeat as last written: its Lease's renewTime and its Ready condition's
    /// lastHeartbeatTime.
    fn heartbeat(&self, node: &Node) -> String {
        let lease = self
            .leases
            .get(&format!("kube-node-lease/{}", name(&node.metadata)))
            .and_then(|l| {
                l.spec
                    .as_ref()?
                    .renew_time
                    .as_ref()
                    .map(|t| t.0.to_string())
            })
            .unwrap_or_default();
        let ready = ready_condition(node)
            .and_then(|c| c.last_heartbeat_time.as_ref())
            .map(|t| t.0.to_string())
            .unwrap_or_default();
        format!("{lease}|{ready}")
    }

    async fn monitor(&self) -> Result<(), ApiError> {
        for node in self.nodes.list("") {
            let node_name = name(&node.metadata).to_string();
            let beat = self.heartbeat(&node);
            let silent_for = {
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                let entry = seen
                    .entry(node_name.clone())
                    .or_insert_with(|| (beat.clone(), Instant::now()));
                if entry.0 != beat {
                    *entry = (beat.clone(), Instant::now());
                }
                entry.1.elapsed()
            };
            let mut node = node;
            if silent_for > self.settings.grace_period && ready_status(&node) != "Unknown" {
                match self.mark_unknown(&node).await? {
                    Some(written) => node = Arc::new(written),
                    None => continue,
                }
            }
            self.reconcile_taints(&node).await?;
            self.evict(&node).await?;
        }
        // Forget nodes that are gone.
        let names: Vec<String> = self
            .nodes
            .list("")
            .iter()
            .map(|n| name(&n.metadata).to_string())
            .collect();
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| names.contains(k));
        Ok(())
    }

    /// Every condition Unknown; None when the node changed or went meanwhile.
    async fn mark_unknown(&self, node: &Node) -> Result<Option<Node>, ApiError> {
        let node_name = name(&node.metadata);
        let stamp = now();
        let mut updated = node.clone();
        let status = updated.status.get_or_insert_with(Default::default);
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        let (reason, message) = if conditions.iter().any(|c| c.type_ == "Ready") {
            ("NodeStatusUnknown", "Kubelet stopped posting node status.")
        } else {
            conditions.push(NodeCondition {
                type_: "Ready".into(),
                ..Default::default()
            });
            (
                "NodeStatusNeverUpdated",
                "Kubelet never posted node status.",
            )
        };
        for c in conditions.iter_mut() {
            c.status = "Unknown".into();
            c.reason = Some(reason.into());
            c.message = Some(message.into());
            c.last_transition_time = Some(stamp.clone());
        }
        let written = ignore_gone(
            Objects::<Node>::namespaced(&self.client, "")
                .replace_status(node_name, &updated)
                .await,
        )?;
        if written.is_none() {
            return Ok(None);
        }
        self.recorder
            .event_for(
                node,
                NORMAL,
                "NodeNotReady",
                &format!("Node {node_name} status is now: NodeNotReady"),
            )
            .await;
        // Each pod on the node hears of it too, as in Kubernetes.
        for pod in self.pods_on(node_name) {
            self.recorder
                .event_for(pod.as_ref(), WARNING, "NodeNotReady", "Node is not ready")
                .await;
        }
        Ok(written)
    }

    fn pods_on(&self, node: &str) -> Vec<Arc<Pod>> {
        self.pods_by_node.get(node)
    }

    async fn reconcile_taints(&self, node: &Node) -> Result<(), ApiError> {
        let wanted = wanted_taints(ready_status(node));
        let current = taints_of(node);
        let ours = |t: &Taint| [UNREACHABLE, NOT_READY].contains(&t.key.as_str());
        let mut taints: Vec<Taint> = current
            .iter()
            .filter(|t| !ours(t) || wanted.iter().any(|(k, e)| t.key == *k && t.effect == *e))
            .cloned()
            .collect();
        for (key, effect) in &wanted {
            if taints.iter().any(|t| t.key == *key && t.effect == *effect) {
                continue;
            }
            if *effect == "NoExecute" && !self.take_token() {
                // Rate-limited: the next monitor pass adds it.
                continue;
            }
            taints.push(Taint {
                key: key.to_string(),
                effect: effect.to_string(),
                time_added: (*effect == "NoExecute").then(now),
                value: None,
            });
        }
        if taints == current {
            return Ok(());
        }
        let patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version},
                           "spec": {"taints": if taints.is_empty() { None } else { Some(taints) }}});
        let nodes = Objects::<Node>::namespaced(&self.client, "");
        ignore_gone(nodes.merge_patch(name(&node.metadata), &patch).await).map(|_| ())
    }

    /// Deletes the node's pods whose toleration of its NoExecute taints has run out.
    async fn evict(&self, node: &Node) -> Result<(), ApiError> {
        let taints = taints_of(node);
        if !taints.iter().any(|t| t.effect == "NoExecute") {
            return Ok(());
        }
        let now = Timestamp::now();
        for pod in self.pods_on(name(&node.metadata)) {
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            if eviction_deadline(&pod, taints).is_none_or(|at| at > now) {
                continue;
            }
            let (ns, pod_name) = (namespace(&pod.metadata), name(&pod.metadata));
            let pods = Objects::<Pod>::namespaced(&self.client, ns);
            let mut marked = (*pod).clone();
            let condition = PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some("DeletionByTaintManager".into()),
                message: Some("Taint manager: deleting due to NoExecute taint".into()),
                ..Default::default()
            };
            if crate::pods::set_condition(
                marked.status.get_or_insert_with(Default::default),
                condition,
            ) {
                // The cached resourceVersion is the precondition: a pod changed meanwhile is
                // looked at again at the next pass.
                match pods.replace_status(pod_name, &marked).await {
                    Ok(_) => {}
                    Err(e) if e.code == 404 || e.code == 409 => continue,
                    Err(e) => return Err(e),
                }
            }
            match pods.delete(pod_name).await {
                Ok(()) => {
                    self.recorder
                        .event_for(
                            pod.as_ref(),
                            NORMAL,
                            "TaintManagerEviction",
                            &format!("Marking for deletion Pod {ns}/{pod_name}"),
                        )
                        .await;
                }
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({"spec": spec})).expect("pod")
    }

    #[test]
    fn pods_go_when_their_toleration_runs_out() {
        let added = "2026-01-01T00:00:00Z";
        let taints: Vec<Taint> = serde_json::from_value(
            json!([{"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": added},
                   {"key": "other", "effect": "NoSchedule"}]),
        )
        .expect("taints");
        let t0: Timestamp = added.parse().unwrap();
        let none = pod(json!({"containers": []}));
        assert_eq!(eviction_deadline(&none, &taints), Some(t0));
        let for_300 = pod(json!({"containers": [], "tolerations": [
            {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": UNREACHABLE, "operator": "Exists", "tolerationSeconds": 600}]}));
        assert_eq!(
            eviction_deadline(&for_300, &taints),
            Some(t0 + SignedDuration::from_secs(300))
        );
        let forever = pod(json!({"containers": [], "tolerations": [{"operator": "Exists"}]}));
        assert_eq!(eviction_deadline(&forever, &taints), None);
        let other = pod(
            json!({"containers": [], "tolerations": [{"key": NOT_READY, "operator": "Exists"}]}),
        );
        assert_eq!(eviction_deadline(&other, &taints), Some(t0));
    }

    #[test]
    fn taints_follow_the_ready_condition() {
        assert!(wanted_taints("True").is_empty());
        assert!(
            wanted_taints("").is_empty(),
            "never reported: the grace period first"
        );
        assert!(wanted_taints("False").contains(&(NOT_READY, "NoExecute")));
        assert!(wanted_taints("Unknown").contains(&(UNREACHABLE, "NoExecute")));
    }
}
