//! Node lifecycle: a node whose agent stops heartbeating (its Lease in kube-node-lease and its
//! Ready condition's lastHeartbeatTime) for longer than the grace period gets every condition
//! Unknown and the `node.kubernetes.io/unreachable` taints; one whose agent reports Ready=False
//! gets `node.kubernetes.io/not-ready`; the taints go when it is Ready again. Pods on a node
//! with a NoExecute taint they do not tolerate are deleted at once, and those that tolerate it
//! for tolerationSeconds (300 s by default, from admission) when that runs out, so their owners
//! recreate them elsewhere. New NoExecute taints are rate-limited (`--node-eviction-rate`).
//!
//! Heartbeats are timed by when this controller saw them change, not by the agent's clock, and
//! a new leader starts every node's grace period afresh, so a failover never marks live nodes
//! Unknown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::json::str_at as s;
use rkube_core::taints::tolerates;
use serde_json::{json, Value};

use rkube_runtime::events::{Recorder, NORMAL, WARNING};
use rkube_runtime::informer::Informer;

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

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The node's Ready status; empty when its agent never reported one (a node just registered
/// is given the grace period, then marked Unknown).
fn ready_status(node: &Value) -> String {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| s(c, "/type") == "Ready"))
        .map(|c| s(c, "/status").to_string())
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

/// When a pod on a node with these NoExecute taints must go (a time that may have passed), or
/// None when it tolerates them all forever.
pub fn eviction_deadline(pod: &Value, taints: &[Value]) -> Option<chrono::DateTime<chrono::Utc>> {
    let tolerations: Vec<Value> = pod
        .pointer("/spec/tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut deadline: Option<chrono::DateTime<chrono::Utc>> = None;
    for taint in taints.iter().filter(|t| s(t, "/effect") == "NoExecute") {
        let added = chrono::DateTime::parse_from_rfc3339(s(taint, "/timeAdded"))
            .map(|t| t.with_timezone(&chrono::Utc))
            .unwrap_or_else(|_| chrono::Utc::now());
        let matching: Vec<&Value> = tolerations.iter().filter(|t| tolerates(t, taint)).collect();
        let at = if matching.is_empty() {
            Some(added)
        } else {
            // The shortest tolerationSeconds among the matching tolerations; none means forever.
            matching
                .iter()
                .filter_map(|t| t.get("tolerationSeconds").and_then(Value::as_i64))
                .min()
                .map(|secs| added + chrono::Duration::seconds(secs.max(0)))
        };
        if let Some(at) = at {
            deadline = Some(deadline.map_or(at, |d| d.min(at)));
        }
    }
    deadline
}

pub struct Controller {
    nodes: Arc<Informer>,
    leases: Arc<Informer>,
    pods: Arc<Informer>,
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
        nodes: Arc<Informer>,
        leases: Arc<Informer>,
        pods: Arc<Informer>,
        client: LocalClient,
        settings: Settings,
    ) -> Arc<Controller> {
        Arc::new(Controller {
            nodes,
            leases,
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
            for i in [&c.nodes, &c.leases, &c.pods] {
                i.wait_synced().await;
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
    fn heartbeat(&self, node: &Value) -> String {
        let name = s(node, "/metadata/name");
        let lease = self
            .leases
            .get(&format!("kube-node-lease/{name}"))
            .map(|l| s(&l, "/spec/renewTime").to_string())
            .unwrap_or_default();
        let ready = node
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| s(c, "/type") == "Ready"))
            .map(|c| s(c, "/lastHeartbeatTime").to_string())
            .unwrap_or_default();
        format!("{lease}|{ready}")
    }

    async fn monitor(&self) -> Result<(), ApiError> {
        for node in self.nodes.list("") {
            let name = s(&node, "/metadata/name").to_string();
            let beat = self.heartbeat(&node);
            let silent_for = {
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                let entry = seen
                    .entry(name.clone())
                    .or_insert_with(|| (beat.clone(), Instant::now()));
                if entry.0 != beat {
                    *entry = (beat.clone(), Instant::now());
                }
                entry.1.elapsed()
            };
            let mut node = node.as_ref().clone();
            if silent_for > self.settings.grace_period && ready_status(&node) != "Unknown" {
                node = self.mark_unknown(&node).await?;
            }
            self.reconcile_taints(&node).await?;
            self.evict(&node).await?;
        }
        // Forget nodes that are gone.
        let names: Vec<String> = self
            .nodes
            .list("")
            .iter()
            .map(|n| s(n, "/metadata/name").to_string())
            .collect();
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| names.contains(k));
        Ok(())
    }

    async fn mark_unknown(&self, node: &Value) -> Result<Value, ApiError> {
        let name = s(node, "/metadata/name");
        let stamp = now();
        let mut updated = node.clone();
        let mut conditions: Vec<Value> = node
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let (reason, message) = if conditions.iter().any(|c| s(c, "/type") == "Ready") {
            ("NodeStatusUnknown", "Kubelet stopped posting node status.")
        } else {
            conditions.push(json!({"type": "Ready"}));
            (
                "NodeStatusNeverUpdated",
                "Kubelet never posted node status.",
            )
        };
        for c in conditions.iter_mut() {
            c["status"] = json!("Unknown");
            c["reason"] = json!(reason);
            c["message"] = json!(message);
            c["lastTransitionTime"] = json!(stamp);
        }
        rkube_api::value::set(&mut updated, &["status", "conditions"], json!(conditions));
        let path = format!("/api/v1/nodes/{name}/status");
        let written = self.client.update(&path, &updated).await?;
        self.recorder
            .event(
                node,
                "Node",
                NORMAL,
                "NodeNotReady",
                &format!("Node {name} status is now: NodeNotReady"),
            )
            .await;
        // Each pod on the node hears of it too, as in Kubernetes.
        for pod in self.pods.list("") {
            if s(&pod, "/spec/nodeName") == name {
                self.recorder
                    .event(&pod, "Pod", WARNING, "NodeNotReady", "Node is not ready")
                    .await;
            }
        }
        Ok(written)
    }

    async fn reconcile_taints(&self, node: &Value) -> Result<(), ApiError> {
        let name = s(node, "/metadata/name");
        let wanted = wanted_taints(&ready_status(node));
        let current: Vec<Value> = node
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let ours = |t: &Value| [UNREACHABLE, NOT_READY].contains(&s(t, "/key"));
        let mut taints: Vec<Value> = current
            .iter()
            .filter(|t| {
                !ours(t)
                    || wanted
                        .iter()
                        .any(|(k, e)| s(t, "/key") == *k && s(t, "/effect") == *e)
            })
            .cloned()
            .collect();
        for (key, effect) in &wanted {
            if taints
                .iter()
                .any(|t| s(t, "/key") == *key && s(t, "/effect") == *effect)
            {
                continue;
            }
            if *effect == "NoExecute" && !self.take_token() {
                // Rate-limited: the next monitor pass adds it.
                continue;
            }
            let mut t = json!({"key": key, "effect": effect});
            if *effect == "NoExecute" {
                t["timeAdded"] = json!(now());
            }
            taints.push(t);
        }
        if taints == current {
            return Ok(());
        }
        let patch = json!({"metadata": {"resourceVersion": s(node, "/metadata/resourceVersion")},
                           "spec": {"taints": if taints.is_empty() { Value::Null } else { json!(taints) }}});
        match self
            .client
            .merge_patch(&format!("/api/v1/nodes/{name}"), &patch)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 || e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Deletes the node's pods whose toleration of its NoExecute taints has run out.
    async fn evict(&self, node: &Value) -> Result<(), ApiError> {
        let name = s(node, "/metadata/name");
        let taints: Vec<Value> = node
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .map(|ts| {
                ts.iter()
                    .filter(|t| s(t, "/effect") == "NoExecute")
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if taints.is_empty() {
            return Ok(());
        }
        let now = chrono::Utc::now();
        for pod in self.pods.list("") {
            if s(&pod, "/spec/nodeName") != name
                || pod.pointer("/metadata/deletionTimestamp").is_some()
            {
                continue;
            }
            let Some(at) = eviction_deadline(&pod, &taints) else {
                continue;
            };
            if at > now {
                continue;
            }
            let (ns, pname) = (s(&pod, "/metadata/namespace"), s(&pod, "/metadata/name"));
            let path = format!("/api/v1/namespaces/{ns}/pods/{pname}");
            match self.client.delete(&path, None).await {
                Ok(_) => {
                    self.recorder
                        .event(
                            &pod,
                            "Pod",
                            NORMAL,
                            "TaintManagerEviction",
                            &format!("Marking for deletion Pod {ns}/{pname}"),
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

    #[test]
    fn tolerations_match_as_kubernetes_matches_them() {
        let taint = json!({"key": UNREACHABLE, "effect": "NoExecute"});
        for (t, want) in [
            (
                json!({"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}),
                true,
            ),
            (json!({"key": UNREACHABLE, "operator": "Exists"}), true),
            (json!({"operator": "Exists"}), true),
            (json!({"key": NOT_READY, "operator": "Exists"}), false),
            (
                json!({"key": UNREACHABLE, "operator": "Exists", "effect": "NoSchedule"}),
                false,
            ),
            (
                json!({"key": UNREACHABLE, "operator": "Equal", "value": "x"}),
                false,
            ),
            (
                json!({"key": UNREACHABLE, "operator": "Equal", "value": ""}),
                true,
            ),
        ] {
            assert_eq!(tolerates(&t, &taint), want, "{t}");
        }
    }

    #[test]
    fn pods_go_when_their_toleration_runs_out() {
        let added = "2026-01-01T00:00:00Z";
        let taints = vec![json!({"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": added})];
        let t0 = chrono::DateTime::parse_from_rfc3339(added)
            .unwrap()
            .with_timezone(&chrono::Utc);
        let none = json!({"spec": {}});
        assert_eq!(eviction_deadline(&none, &taints), Some(t0));
        let for_300 = json!({"spec": {"tolerations": [
            {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]}});
        assert_eq!(
            eviction_deadline(&for_300, &taints),
            Some(t0 + chrono::Duration::seconds(300))
        );
        let forever = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        assert_eq!(eviction_deadline(&forever, &taints), None);
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
