//! The disruption controller: keeps each PodDisruptionBudget's status, which the eviction
//! subresource reads, as Kubernetes' disruption controller computes it.
//!
//! For a budget it takes the pods of its namespace that its selector selects, and works out
//! how many should exist (`expectedPods`) and how many must stay healthy (`desiredHealthy`):
//! an integer `minAvailable` counts the pods themselves; a percentage, or `maxUnavailable`,
//! is resolved against the scale of the pods' controllers, found through the owner chain
//! (a ReplicaSet's Deployment, a ReplicationController, a StatefulSet). `currentHealthy`
//! counts the Ready pods not being deleted and not just evicted; `disruptionsAllowed` is the
//! difference. Pods an eviction recorded in `disruptedPods` stay there until they are seen
//! being deleted, or for two minutes at most (then a NotDeleted event says so). A failure to
//! compute allows no disruption and says why in the DisruptionAllowed condition (SyncFailed).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{controller_of, key, name, namespace};
use rkube_core::selector::LabelSelector;

use crate::pods::{is_ready, now};
use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::controller::{Action, Controller};
use rkube_runtime::events::{Recorder, NORMAL, WARNING};
use rkube_runtime::store::Store;

const COMPONENT: &str = "disruption-controller";
const WORKERS: usize = 2;
/// How long an evicted pod may take to be marked for deletion before the budget counts it
/// again (Kubernetes' DeletionTimeout).
const DELETION_TIMEOUT: i64 = 2 * 60;
const CONDITION: &str = "DisruptionAllowed";

/// The workload kinds whose scale a budget's percentages are resolved against.
pub struct Scales {
    pub deployments: Arc<Store<Deployment>>,
    pub replicasets: Arc<Store<ReplicaSet>>,
    pub controllers: Arc<Store<ReplicationController>>,
    pub statefulsets: Arc<Store<StatefulSet>>,
}

/// The reconciler's context.
pub struct Budgets {
    pods: Arc<Store<Pod>>,
    scales: Scales,
    client: LocalClient,
    recorder: Recorder,
}

fn selector_of(pdb: &PodDisruptionBudget) -> Option<LabelSelector> {
    // policy/v1: no selector selects nothing, an empty one every pod of the namespace.
    let sel = pdb.spec.as_ref()?.selector.as_ref()?;
    Some(LabelSelector::from_selector(sel))
}

fn selects(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    namespace(&pdb.metadata) == namespace(&pod.metadata)
        && selector_of(pdb).is_some_and(|s| s.matches_labels(pod.metadata.labels.as_ref()))
}

/// The selector as Kubernetes prints one (`app=web,tier in (a,b)`), for events.
fn selector_text(pdb: &PodDisruptionBudget) -> String {
    let Some(sel) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return String::new();
    };
    let mut parts: Vec<String> = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in sel.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "DoesNotExist" => format!("!{}", e.key),
            _ => e.key.clone(),
        });
    }
    parts.join(",")
}

/// Starts the disruption controller until `stop`.
pub fn start(
    budgets: Arc<Store<PodDisruptionBudget>>,
    pods: Arc<Store<Pod>>,
    scales: Scales,
    client: LocalClient,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let of_pod = {
        let budgets = budgets.clone();
        move |old: Option<&Arc<Pod>>, new: Option<&Arc<Pod>>| {
            let mut keys = HashSet::new();
            for pod in old.into_iter().chain(new) {
                for pdb in budgets.in_namespace(namespace(&pod.metadata)) {
                    if selects(&pdb, pod) {
                        keys.insert(key(&pdb.metadata));
                    }
                }
            }
            keys.into_iter().collect()
        }
    };
    // A workload's scale moves the budgets of its namespace.
    fn in_namespace_of<K: rkube_runtime::store::Object>(
        budgets: &Arc<Store<PodDisruptionBudget>>,
    ) -> impl Fn(Option<&Arc<K>>, Option<&Arc<K>>) -> Vec<String> + Send + Sync + 'static {
        let budgets = budgets.clone();
        move |old, new| {
            let Some(o) = new.or(old) else {
                return Vec::new();
            };
            budgets
                .in_namespace(namespace(o.metadata()))
                .iter()
                .map(|p| key(&p.metadata))
                .collect()
        }
    }
    let controller = Controller::new(COMPONENT, budgets.clone())
        .watches(&pods, of_pod)
        .watches(&scales.deployments, in_namespace_of(&budgets))
        .watches(&scales.replicasets, in_namespace_of(&budgets))
        .watches(&scales.controllers, in_namespace_of(&budgets))
        .watches(&scales.statefulsets, in_namespace_of(&budgets));
    let ctx = Arc::new(Budgets {
        pods,
        scales,
        recorder: Recorder::new(client.clone(), COMPONENT),
        client,
    });
    controller.run(
        WORKERS,
        stop,
        ctx,
        |pdb: Arc<PodDisruptionBudget>, ctx: Arc<Budgets>| async move { ctx.reconcile(&pdb).await },
    );
}

/// An int-or-percent resolved against `total`, percentages rounded up (Kubernetes'
/// GetScaledValueFromIntOrPercent as the disruption controller calls it).
fn resolve(v: &IntOrString, total: i64) -> Result<i64, String> {
    match v {
        IntOrString::Int(n) => Ok(i64::from(*n)),
        IntOrString::String(s) => match s.strip_suffix('%').map(str::parse::<i64>) {
            Some(Ok(p)) => Ok((total.saturating_mul(p) + 99) / 100),
            _ => Err(format!(
                "invalid value for IntOrString: invalid value {s:?}"
            )),
        },
    }
}

/// What a budget's status is computed from, besides its pods: the scale of a pod's
/// controller, as (the uid of the controller that owns the scale, its replicas).
pub trait ScaleOf {
    fn scale_of(&self, namespace: &str, owner: &OwnerReference) -> Option<(String, i64)>;
}

impl ScaleOf for Scales {
    fn scale_of(&self, ns: &str, owner: &OwnerReference) -> Option<(String, i64)> {
        let at = |n: &str| format!("{ns}/{n}");
        let same = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            meta.uid.as_deref() == Some(owner.uid.as_str())
        };
        match owner.kind.as_str() {
            "ReplicaSet" => {
                let rs = self
                    .replicasets
                    .get(&at(&owner.name))
                    .filter(|r| same(&r.metadata))?;
                // A Deployment's ReplicaSet: the Deployment's scale counts.
                if let Some(d) = controller_of(&rs.metadata).filter(|d| d.kind == "Deployment") {
                    let dep = self
                        .deployments
                        .get(&at(&d.name))
                        .filter(|x| x.metadata.uid.as_deref() == Some(d.uid.as_str()))?;
                    let replicas = dep.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                    return Some((d.uid.clone(), i64::from(replicas)));
                }
                let replicas = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                Some((owner.uid.clone(), i64::from(replicas)))
            }
            "ReplicationController" => {
                let rc = self
                    .controllers
                    .get(&at(&owner.name))
                    .filter(|r| same(&r.metadata))?;
                let replicas = rc.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                Some((owner.uid.clone(), i64::from(replicas)))
            }
            "StatefulSet" => {
                let ss = self
                    .statefulsets
                    .get(&at(&owner.name))
                    .filter(|s| same(&s.metadata))?;
                let replicas = ss.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                Some((owner.uid.clone(), i64::from(replicas)))
            }
            _ => None,
        }
    }
}

/// A budget's computed numbers.
#[derive(Debug, PartialEq)]
struct Computed {
    expected: i64,
    desired: i64,
    current: i64,
    allowed: i64,
    disrupted: BTreeMap<String, Time>,
    /// When a pod recorded as disrupted times out, if one is waiting.
    recheck: Option<Timestamp>,
    /// Pods recorded as disrupted that were never deleted.
    not_deleted: Vec<String>,
    /// Pods without a controller where a controller's scale was needed.
    unmanaged: Vec<String>,
}

/// (expectedPods, pods without a controller) from the pods' controllers' scales.
fn expected_scale(pods: &[Arc<Pod>], scales: &impl ScaleOf) -> Result<(i64, Vec<String>), String> {
    let mut seen: BTreeMap<String, i64> = BTreeMap::new();
    let mut unmanaged = Vec::new();
    for pod in pods {
        let Some(owner) = controller_of(&pod.metadata) else {
            unmanaged.push(name(&pod.metadata).to_string());
            continue;
        };
        let Some((uid, replicas)) = scales.scale_of(namespace(&pod.metadata), owner) else {
            return Err(format!(
                "found no controllers for pod {:?}",
                name(&pod.metadata)
            ));
        };
        seen.insert(uid, replicas);
    }
    Ok((seen.values().sum(), unmanaged))
}

/// Kubernetes' getExpectedPodCount, buildDisruptedPodMap and countHealthyPods for `pdb` over
/// the pods it selects, at `now`.
fn compute(
    pdb: &PodDisruptionBudget,
    pods: &[Arc<Pod>],
    scales: &impl ScaleOf,
    now: Timestamp,
) -> Result<Computed, String> {
    let spec = pdb.spec.as_ref();
    let (mut expected, mut desired, mut unmanaged) = (0, 0, Vec::new());
    if let Some(max) = spec.and_then(|s| s.max_unavailable.as_ref()) {
        (expected, unmanaged) = expected_scale(pods, scales)?;
        desired = (expected - resolve(max, expected)?).max(0);
    } else if let Some(min) = spec.and_then(|s| s.min_available.as_ref()) {
        match min {
            IntOrString::Int(n) => {
                desired = i64::from(*n);
                expected = pods.len() as i64;
            }
            IntOrString::String(_) => {
                (expected, unmanaged) = expected_scale(pods, scales)?;
                desired = resolve(min, expected)?;
            }
        }
    }
    let recorded = pdb
        .status
        .as_ref()
        .and_then(|s| s.disrupted_pods.clone())
        .unwrap_or_default();
    let (mut disrupted, mut recheck, mut not_deleted) = (BTreeMap::new(), None, Vec::new());
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(at) = recorded.get(name(&pod.metadata)) else {
            continue;
        };
        let deadline = at.0.as_second() + DELETION_TIMEOUT;
        if deadline < now.as_second() {
            not_deleted.push(name(&pod.metadata).to_string());
        } else {
            let deadline = Timestamp::from_second(deadline).unwrap_or(now);
            recheck = Some(recheck.map_or(deadline, |r: Timestamp| r.min(deadline)));
            disrupted.insert(name(&pod.metadata).to_string(), at.clone());
        }
    }
    let current = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !disrupted.contains_key(name(&p.metadata)))
        .filter(|p| is_ready(p))
        .count() as i64;
    let allowed = if expected <= 0 {
        0
    } else {
        (current - desired).max(0)
    };
    Ok(Computed {
        expected,
        desired,
        current,
        allowed,
        disrupted,
        recheck,
        not_deleted,
        unmanaged,
    })
}

/// `conditions` with the DisruptionAllowed condition set (its transition time kept when its
/// status does not change).
fn with_condition(
    conditions: Option<&Vec<Condition>>,
    allowed: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let status = if allowed { "True" } else { "False" };
    let mut out: Vec<Condition> = conditions.cloned().unwrap_or_default();
    let since = out
        .iter()
        .find(|c| c.type_ == CONDITION && c.status == status)
        .map(|c| c.last_transition_time.clone());
    out.retain(|c| c.type_ != CONDITION);
    out.push(Condition {
        type_: CONDITION.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: since.unwrap_or(Time(now)),
    });
    out
}

/// The budget's new status from what was computed (or why it could not be).
fn status_of(
    pdb: &PodDisruptionBudget,
    computed: &Result<Computed, String>,
    now: Timestamp,
) -> PodDisruptionBudgetStatus {
    let old = pdb.status.clone().unwrap_or_default();
    match computed {
        Ok(c) => {
            let generation = pdb.metadata.generation;
            let (reason, allowed) = if c.allowed > 0 {
                ("SufficientPods", true)
            } else {
                ("InsufficientPods", false)
            };
            PodDisruptionBudgetStatus {
                current_healthy: c.current as i32,
                desired_healthy: c.desired as i32,
                expected_pods: c.expected as i32,
                disruptions_allowed: c.allowed as i32,
                disrupted_pods: (!c.disrupted.is_empty()).then(|| c.disrupted.clone()),
                observed_generation: generation,
                conditions: Some(with_condition(
                    old.conditions.as_ref(),
                    allowed,
                    reason,
                    "",
                    generation,
                    now,
                )),
            }
        }
        // Fail safe: no disruption until the status can be computed again.
        Err(why) => PodDisruptionBudgetStatus {
            disruptions_allowed: 0,
            conditions: Some(with_condition(
                old.conditions.as_ref(),
                false,
                "SyncFailed",
                why,
                old.observed_generation,
                now,
            )),
            ..old
        },
    }
}

impl Budgets {
    async fn reconcile(&self, pdb: &PodDisruptionBudget) -> Result<Action, ApiError> {
        let ns = namespace(&pdb.metadata);
        let pods: Vec<Arc<Pod>> = self
            .pods
            .in_namespace(ns)
            .into_iter()
            .filter(|p| selects(pdb, p))
            .collect();
        if pods.is_empty() {
            self.recorder
                .event_for(pdb, NORMAL, "NoPods", "No matching pods found")
                .await;
        }
        let now = now();
        let computed = compute(pdb, &pods, &self.scales, now);
        match &computed {
            Ok(c) => {
                for pod in &c.not_deleted {
                    let message = format!(
                        "Pod {ns}/{pod} was expected to be deleted at {} but it wasn't, updating pdb",
                        pdb.status
                            .as_ref()
                            .and_then(|s| s.disrupted_pods.as_ref())
                            .and_then(|d| d.get(pod))
                            .and_then(|t| Timestamp::from_second(t.0.as_second() + DELETION_TIMEOUT).ok())
                            .map_or(String::new(), |t| t.to_string())
                    );
                    self.recorder
                        .event_for(pdb, WARNING, "NotDeleted", &message)
                        .await;
                }
                if !c.unmanaged.is_empty() {
                    let message = format!(
                        "Pods selected by this PodDisruptionBudget (selector: {}) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value.",
                        selector_text(pdb)
                    );
                    self.recorder
                        .event_for(pdb, WARNING, "UnmanagedPods", &message)
                        .await;
                }
            }
            Err(why) => {
                self.recorder
                    .event_for(
                        pdb,
                        WARNING,
                        "CalculateExpectedPodCountFailed",
                        &format!("Failed to calculate the number of expected pods: {why}"),
                    )
                    .await;
            }
        }
        let status = status_of(pdb, &computed, now);
        if pdb.status.as_ref() != Some(&status) {
            let mut updated = pdb.clone();
            updated.status = Some(status);
            let objects = Objects::<PodDisruptionBudget>::namespaced(&self.client, ns);
            ignore_gone(objects.replace_status(name(&pdb.metadata), &updated).await)?;
        }
        Ok(match computed {
            Ok(Computed {
                recheck: Some(at), ..
            }) => Action::requeue(Duration::from_secs(
                (at.as_second() - now.as_second()).max(1) as u64,
            )),
            // Kubernetes retries a failed computation; so does this, a while later.
            Err(_) => Action::requeue(Duration::from_secs(30)),
            Ok(_) => Action::await_change(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    struct Fixed(Vec<(&'static str, &'static str, i64)>);

    impl ScaleOf for Fixed {
        fn scale_of(&self, _ns: &str, owner: &OwnerReference) -> Option<(String, i64)> {
            self.0
                .iter()
                .find(|(kind, n, _)| *kind == owner.kind && *n == owner.name)
                .map(|(_, n, r)| (format!("uid-{n}"), *r))
        }
    }

    /// A pod: ready or not, owned by `owner` (kind/name) or by nothing.
    fn pod(n: &str, ready: bool, owner: Option<(&str, &str)>, extra: Value) -> Arc<Pod> {
        let mut p = json!({"metadata": {"name": n, "namespace": "ns", "labels": {"app": "web"}},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
        if let Some((kind, o)) = owner {
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind,
                "name": o, "uid": format!("uid-{o}"), "controller": true}]);
        }
        if let Some(e) = extra.as_object() {
            for (k, v) in e {
                p["metadata"][k] = v.clone();
            }
        }
        Arc::new(serde_json::from_value(p).expect("pod"))
    }

    fn pdb(spec: Value, disrupted: Value) -> PodDisruptionBudget {
        let mut spec = spec;
        spec["selector"] = json!({"matchLabels": {"app": "web"}});
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns",
            "generation": 3}, "spec": spec, "status": {"disruptedPods": disrupted,
            "disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0,
            "expectedPods": 0}}))
        .expect("pdb")
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("time")
    }

    #[test]
    fn status_is_computed_as_kubernetes_does() {
        let now = at("2026-01-01T00:10:00Z");
        let rs = Some(("ReplicaSet", "web-1"));
        let ready = |n| pod(n, true, rs, json!({}));
        let scales = Fixed(vec![("ReplicaSet", "web-1", 3), ("StatefulSet", "db", 2)]);
        // (case, spec, disruptedPods, pods, want (expected, desired, current, allowed)) or an error.
        type Want = Result<(i64, i64, i64, i64), &'static str>;
        type Case = (&'static str, Value, Value, Vec<Arc<Pod>>, Want);
        let cases: Vec<Case> = vec![
            (
                "integer minAvailable counts pods",
                json!({"minAvailable": 1}),
                json!({}),
                vec![ready("a"), ready("b")],
                Ok((2, 1, 2, 1)),
            ),
            (
                "unready pods are not healthy",
                json!({"minAvailable": 1}),
                json!({}),
                vec![ready("a"), pod("b", false, rs, json!({}))],
                Ok((2, 1, 1, 0)),
            ),
            (
                "percent minAvailable uses the controller's scale, rounded up",
                json!({"minAvailable": "50%"}),
                json!({}),
                vec![ready("a"), ready("b"), ready("c")],
                Ok((3, 2, 3, 1)),
            ),
            (
                "maxUnavailable uses the controller's scale",
                json!({"maxUnavailable": 1}),
                json!({}),
                vec![ready("a"), ready("b")],
                Ok((3, 2, 2, 0)),
            ),
            (
                "maxUnavailable percent rounds up",
                json!({"maxUnavailable": "34%"}),
                json!({}),
                vec![ready("a"), ready("b"), ready("c")],
                Ok((3, 1, 3, 2)),
            ),
            (
                "two controllers add up",
                json!({"maxUnavailable": 1}),
                json!({}),
                vec![
                    ready("a"),
                    pod("d", true, Some(("StatefulSet", "db")), json!({})),
                ],
                Ok((5, 4, 2, 0)),
            ),
            (
                "pods being deleted are not healthy",
                json!({"minAvailable": 1}),
                json!({}),
                vec![
                    ready("a"),
                    pod(
                        "b",
                        true,
                        rs,
                        json!({"deletionTimestamp": "2026-01-01T00:09:00Z"}),
                    ),
                ],
                Ok((2, 1, 1, 0)),
            ),
            (
                "a recently evicted pod is not healthy",
                json!({"minAvailable": 1}),
                json!({"b": "2026-01-01T00:09:00Z"}),
                vec![ready("a"), ready("b")],
                Ok((2, 1, 1, 0)),
            ),
            (
                "an eviction older than two minutes is forgotten",
                json!({"minAvailable": 1}),
                json!({"b": "2026-01-01T00:07:00Z"}),
                vec![ready("a"), ready("b")],
                Ok((2, 1, 2, 1)),
            ),
            (
                "no pods allow no disruption",
                json!({"maxUnavailable": 1}),
                json!({}),
                vec![],
                Ok((0, 0, 0, 0)),
            ),
            (
                "maxUnavailable of pods without a controller: unmanaged, nothing expected",
                json!({"maxUnavailable": 1}),
                json!({}),
                vec![pod("x", true, None, json!({}))],
                Ok((0, 0, 1, 0)),
            ),
            (
                "a controller without a scale fails",
                json!({"minAvailable": "50%"}),
                json!({}),
                vec![pod("x", true, Some(("DaemonSet", "agent")), json!({}))],
                Err("found no controllers for pod \"x\""),
            ),
        ];
        for (case, spec, disrupted, pods, want) in cases {
            let got = compute(&pdb(spec, disrupted), &pods, &scales, now)
                .map(|c| (c.expected, c.desired, c.current, c.allowed));
            match (&got, &want) {
                (Err(g), Err(w)) => assert_eq!(g, w, "{case}"),
                _ => assert_eq!(got, want.map_err(String::from), "{case}"),
            }
        }
    }

    #[test]
    fn disrupted_pods_are_kept_until_deleted_or_timed_out() {
        let now = at("2026-01-01T00:10:00Z");
        let rs = Some(("ReplicaSet", "web-1"));
        let pods = vec![
            pod("a", true, rs, json!({})),
            pod(
                "b",
                true,
                rs,
                json!({"deletionTimestamp": "2026-01-01T00:09:30Z"}),
            ),
            pod("c", true, rs, json!({})),
        ];
        let budget = pdb(
            json!({"minAvailable": 1}),
            json!({"a": "2026-01-01T00:09:00Z", "b": "2026-01-01T00:09:00Z",
                   "c": "2026-01-01T00:05:00Z", "gone": "2026-01-01T00:09:00Z"}),
        );
        let c = compute(&budget, &pods, &Fixed(vec![]), now).expect("computed");
        assert_eq!(c.disrupted.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(c.not_deleted, ["c"]);
        assert_eq!(c.recheck, Some(at("2026-01-01T00:11:00Z")));
    }

    #[test]
    fn condition_and_generation_follow_the_computation() {
        let now = at("2026-01-01T00:10:00Z");
        let budget = pdb(json!({"minAvailable": 1}), json!({}));
        let rs = Some(("ReplicaSet", "web-1"));
        let pods = vec![pod("a", true, rs, json!({})), pod("b", true, rs, json!({}))];
        let s = status_of(&budget, &compute(&budget, &pods, &Fixed(vec![]), now), now);
        assert_eq!((s.disruptions_allowed, s.observed_generation), (1, Some(3)));
        let c = &s.conditions.as_ref().expect("conditions")[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("DisruptionAllowed", "True", "SufficientPods")
        );
        let one = vec![pods[0].clone()];
        let s = status_of(&budget, &compute(&budget, &one, &Fixed(vec![]), now), now);
        let c = &s.conditions.as_ref().expect("conditions")[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "InsufficientPods")
        );
        let failed = status_of(&budget, &Err("found no controllers".into()), now);
        let c = &failed.conditions.as_ref().expect("conditions")[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", "SyncFailed", "found no controllers")
        );
        assert_eq!(failed.disruptions_allowed, 0);
    }
}
