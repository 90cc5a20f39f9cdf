//! What the workload controllers ask of a Pod: whether it still counts (active), whether it is
//! Ready, and whether it has been Ready for minReadySeconds (available); and how a controller
//! claims the pods it selects ([`claim`]).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector as LabelSelectorSpec, OwnerReference, Time,
};
use k8s_openapi::jiff::Timestamp;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{controller_of, controller_ref, name, namespace};
use rkube_core::selector::LabelSelector;
use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::store::{Object, Store};
use serde_json::json;

/// The selector a controller claims pods with; None for an empty one, which would claim every
/// pod of the namespace and so claims none.
pub fn claiming_selector(sel: &LabelSelectorSpec) -> Option<LabelSelector> {
    let empty = sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty());
    (!empty).then(|| LabelSelector::from_selector(sel))
}

/// Writes the pod's owner references (None: none left), if the pod has not changed since it
/// was read; None when it is gone or changed.
pub async fn set_owners(
    client: &LocalClient,
    pod: &Pod,
    refs: Option<Vec<OwnerReference>>,
) -> Result<Option<Pod>, ApiError> {
    let m = &pod.metadata;
    let patch =
        json!({"metadata": {"ownerReferences": refs, "resourceVersion": m.resource_version}});
    let pods = Objects::<Pod>::namespaced(client, namespace(m));
    ignore_gone(pods.merge_patch(name(m), &patch).await)
}

/// Makes `owner` the pod's controller.
pub async fn adopt<K: Object>(
    client: &LocalClient,
    owner: &K,
    pod: &Pod,
) -> Result<Option<Pod>, ApiError> {
    adopt_holding(client, owner, pod, None).await
}

/// Makes `owner` the pod's controller and, with `finalizer`, adds that finalizer in the same
/// write (the Job controller's tracking finalizer), if the pod has not changed since it was read.
async fn adopt_holding<K: Object>(
    client: &LocalClient,
    owner: &K,
    pod: &Pod,
    finalizer: Option<&str>,
) -> Result<Option<Pod>, ApiError> {
    let m = &pod.metadata;
    let mut refs = m.owner_references.clone().unwrap_or_default();
    refs.push(controller_ref(owner));
    let mut patch = json!({"metadata": {"ownerReferences": refs,
        "resourceVersion": m.resource_version}});
    if let Some(f) = finalizer {
        let mut finalizers = m.finalizers.clone().unwrap_or_default();
        if !finalizers.iter().any(|x| x == f) {
            finalizers.push(f.to_string());
        }
        patch["metadata"]["finalizers"] = json!(finalizers);
    }
    let pods = Objects::<Pod>::namespaced(client, namespace(m));
    ignore_gone(pods.merge_patch(name(m), &patch).await)
}

/// Takes the owner of `uid` off the pod.
pub async fn release(client: &LocalClient, pod: &Pod, uid: &str) -> Result<(), ApiError> {
    let refs: Vec<_> = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.uid != uid)
        .cloned()
        .collect();
    let refs = (!refs.is_empty()).then_some(refs);
    set_owners(client, pod, refs).await.map(|_| ())
}

/// The pod of a change that a controller may have to adopt or release: a pod without a
/// controller, or one whose labels changed.
pub fn to_claim<'a>(old: Option<&Arc<Pod>>, new: Option<&'a Arc<Pod>>) -> Option<&'a Arc<Pod>> {
    let pod = new?;
    let orphan = controller_of(&pod.metadata).is_none();
    let relabelled = old.is_some_and(|o| o.metadata.labels != pod.metadata.labels);
    (orphan || relabelled).then_some(pod)
}

/// A pod mapper for `Controller::watches`: on a pod change that may need a claim
/// ([`to_claim`]), the owners of its namespace in `owners` that `selects` says would take it.
pub fn claimers<K: Object>(
    owners: Arc<Store<K>>,
    selects: impl Fn(&K, &Pod) -> bool + Send + Sync + 'static,
) -> impl Fn(Option<&Arc<Pod>>, Option<&Arc<Pod>>) -> Vec<String> + Send + Sync + 'static {
    move |old, new| {
        let Some(pod) = to_claim(old, new) else {
            return Vec::new();
        };
        owners
            .in_namespace(namespace(&pod.metadata))
            .iter()
            .filter(|owner| selects(owner, pod))
            .map(|owner| rkube_core::meta::key(owner.metadata()))
            .collect()
    }
}

/// The pods of `owner`'s namespace it controls, after adopting the orphans `matches` accepts
/// (not being deleted, nor while the owner is) and releasing owned pods it no longer accepts
/// (Kubernetes' ClaimPods).
pub async fn claim<K: Object>(
    client: &LocalClient,
    pods: &Store<Pod>,
    owner: &K,
    matches: impl Fn(&Pod) -> bool,
) -> Result<Vec<Arc<Pod>>, ApiError> {
    claim_holding(client, pods, owner, matches, None).await
}

/// [`claim`], adding `finalizer` to the pods it adopts.
pub async fn claim_holding<K: Object>(
    client: &LocalClient,
    pods: &Store<Pod>,
    owner: &K,
    matches: impl Fn(&Pod) -> bool,
    finalizer: Option<&str>,
) -> Result<Vec<Arc<Pod>>, ApiError> {
    let meta = owner.metadata();
    let uid = meta.uid.as_deref().unwrap_or("");
    let mut owned = Vec::new();
    for pod in pods.in_namespace(namespace(meta)) {
        let matching = matches(&pod);
        match controller_of(&pod.metadata) {
            Some(r) if r.uid == uid && matching => owned.push(pod),
            Some(r) if r.uid == uid => release(client, &pod, uid).await?,
            None if matching
                && pod.metadata.deletion_timestamp.is_none()
                && meta.deletion_timestamp.is_none() =>
            {
                if let Some(adopted) = adopt_holding(client, owner, &pod, finalizer).await? {
                    owned.push(Arc::new(adopted));
                }
            }
            _ => {}
        }
    }
    Ok(owned)
}

/// The pod's phase ("" when unset).
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Neither finished (Succeeded, Failed) nor being deleted.
/// Succeeded or Failed: its containers will not run again.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

pub fn is_active(pod: &Pod) -> bool {
    !is_finished(pod) && pod.metadata.deletion_timestamp.is_none()
}

fn ready_condition(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

pub fn is_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|c| c.status == "True")
}

/// Ready for at least `min_ready` seconds at `now`.
pub fn is_available(pod: &Pod, min_ready: i64, now: Timestamp) -> bool {
    if !is_ready(pod) {
        return false;
    }
    if min_ready <= 0 {
        return true;
    }
    ready_condition(pod)
        .and_then(|c| c.last_transition_time.as_ref())
        .is_some_and(|t| now.as_second() - t.0.as_second() >= min_ready)
}

/// Sets `condition` in `status` as Kubernetes' `UpdatePodCondition` does: a condition of its
/// type is replaced, keeping its transition time while its status holds (a new one, or a new
/// status, is stamped now). Answers whether the status changed.
pub fn set_condition(status: &mut PodStatus, mut condition: PodCondition) -> bool {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    match conditions.iter_mut().find(|o| o.type_ == condition.type_) {
        Some(old) => {
            condition.last_transition_time = if old.status == condition.status {
                old.last_transition_time.clone()
            } else {
                Some(Time(now()))
            };
            let changed = *old != condition;
            *old = condition;
            changed
        }
        None => {
            condition.last_transition_time = Some(Time(now()));
            conditions.push(condition);
            true
        }
    }
}

/// Now, to the second, as the API writes times (a finer time would never equal one read back).
pub fn now() -> Timestamp {
    Timestamp::from_second(chrono::Utc::now().timestamp()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conditions_are_set_as_update_pod_condition_sets_them() {
        let disruption = |reason: &str| PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some(reason.into()),
            ..Default::default()
        };
        let mut status = PodStatus::default();
        assert!(
            set_condition(&mut status, disruption("A")),
            "a new condition"
        );
        let conditions = status.conditions.clone().expect("conditions");
        assert_eq!(conditions.len(), 1);
        let stamped = conditions[0].last_transition_time.clone();
        assert!(stamped.is_some(), "a new condition is stamped");
        assert!(
            !set_condition(&mut status, disruption("A")),
            "the same condition again changes nothing"
        );
        assert!(set_condition(&mut status, disruption("B")), "a new reason");
        let conditions = status.conditions.clone().expect("conditions");
        assert_eq!(conditions.len(), 1, "replaced, not appended");
        assert_eq!(conditions[0].reason.as_deref(), Some("B"));
        assert_eq!(
            conditions[0].last_transition_time, stamped,
            "the transition time holds while the status does"
        );
        let ready = PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            ..Default::default()
        };
        assert!(set_condition(&mut status, ready));
        assert_eq!(status.conditions.map(|c| c.len()), Some(2));
    }

    #[test]
    fn active_ready_and_available() {
        let pod = |phase: &str, ready: &str, since: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p"}, "status": {"phase": phase,
                "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": since}]}}))
            .unwrap()
        };
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let p = pod("Running", "True", "2026-01-01T00:00:00Z");
        assert!(is_active(&p) && is_ready(&p));
        assert!(is_available(&p, 60, now));
        assert!(!is_available(&p, 61, now));
        assert!(!is_ready(&pod("Running", "False", "2026-01-01T00:00:00Z")));
        assert!(!is_active(&pod(
            "Succeeded",
            "False",
            "2026-01-01T00:00:00Z"
        )));
    }
}
