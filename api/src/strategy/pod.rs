//! Pods: spec defaults and the admission of a new pod (LimitRange, ServiceAccount and its token
//! volume, priority, default tolerations, QoS class), a spec that is fixed once created, and graceful deletion.

use serde_json::{json, Value};

use crate::admission::{child, default, default_pod_spec, validate_pod_spec};
use crate::error::{ApiError, Cause};
use crate::handler::{meta_str, Api, Target};
use crate::resources;
use crate::storage::{decode, Freshness};

use super::{Hook, Strategy};

pub struct Pod;

impl Strategy for Pod {
    fn defaults(&self, object: &mut Value) {
        let qos = qos_class(object);
        let Some(o) = object.as_object_mut() else {
            return;
        };
        let spec = child(o, "spec");
        default_pod_spec(spec);
        default(spec, "serviceAccountName", json!("default"));
        if let Some(sa) = spec.get("serviceAccountName").cloned() {
            default(spec, "serviceAccount", sa);
        }
        let status = child(o, "status");
        default(status, "phase", json!("Pending"));
        default(status, "qosClass", json!(qos));
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        validate_pod_spec(object.get("spec"), "spec", causes)
    }

    fn admit_create<'a>(&'a self, api: &'a Api, t: &'a Target, pod: &'a mut Value) -> Hook<'a> {
        Box::pin(async move {
            let ranges = api
                .namespace_objects("limitranges", t.namespace().unwrap_or(""))
                .await?;
            crate::limitrange::admit(pod, &ranges)?;
            crate::serviceaccount::admit_pod(api, t, pod).await?;
            super::runtimeclass::admit_pod(api, pod).await?;
            admit_priority(api, pod).await?;
            default_tolerations(pod);
            // The QoS class follows the resources LimitRange filled in.
            let qos = qos_class(pod);
            crate::value::set(pod, &["status", "qosClass"], json!(qos));
            Ok(())
        })
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        // A pod's spec is fixed once created, except container images and a few others.
        let strip = |v: Option<&Value>| {
            let mut v = v.cloned().unwrap_or(json!({}));
            for list in ["containers", "initContainers"] {
                if let Some(cs) = v.get_mut(list).and_then(Value::as_array_mut) {
                    for c in cs {
                        if let Some(c) = c.as_object_mut() {
                            c.shift_remove("image");
                        }
                    }
                }
            }
            if let Some(o) = v.as_object_mut() {
                for f in [
                    "activeDeadlineSeconds",
                    "tolerations",
                    "terminationGracePeriodSeconds",
                    "nodeName",
                ] {
                    o.shift_remove(f);
                }
            }
            v
        };
        if strip(current.get("spec")) != strip(new.get("spec")) {
            causes.push(Cause {
                reason: "FieldValueForbidden",
                field: "spec".into(),
                message: "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".into(),
            });
        }
    }

    /// A pod on a node ends gracefully: marked with a deadline, its agent stops the
    /// containers and then deletes it for good (with a zero grace period). 0 (deleted at once)
    /// for a pod no node runs (unscheduled, or finished), else the request's grace period or
    /// the pod's `terminationGracePeriodSeconds` (30 by default).
    fn grace_period(&self, pod: &Value, requested: Option<i64>) -> i64 {
        let bound = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        let phase = pod.pointer("/status/phase").and_then(Value::as_str);
        if !bound || matches!(phase, Some("Succeeded" | "Failed")) {
            return 0;
        }
        match requested {
            Some(g) if g >= 0 => g,
            _ => pod
                .pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
                .filter(|g| *g >= 0)
                .unwrap_or(30),
        }
    }

    /// A pod marked with a grace period may still be deleted sooner (its agent deletes it
    /// with a zero grace period); one marked with zero is done.
    fn deletion_marked(&self, pod: &Value) -> bool {
        pod.pointer("/metadata/deletionTimestamp").is_some()
            && pod.pointer("/metadata/deletionGracePeriodSeconds") == Some(&json!(0))
    }
}

/// Priority admission: a pod's priority is its PriorityClass's value (the built-in
/// system-cluster-critical and system-node-critical too), or the global default class's
/// when it names none.
async fn admit_priority(api: &Api, pod: &mut Value) -> Result<(), ApiError> {
    const BUILT_IN: &[(&str, i64)] = &[
        ("system-cluster-critical", 2_000_000_000),
        ("system-node-critical", 2_000_001_000),
    ];
    let res = resources::find("scheduling.k8s.io", "v1", "priorityclasses")
        .ok_or_else(|| ApiError::internal("priorityclasses are served"))?;
    let prefix = res.prefix(None);
    let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
    let (kvs, _, _) = api.store.range(&prefix, &end, 0, Freshness::Any).await?;
    let classes: Vec<Value> = kvs
        .iter()
        .map(|kv| decode(kv).map(|s| s.object))
        .collect::<Result<_, _>>()?;
    let named = pod
        .pointer("/spec/priorityClassName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    let (name, value, policy) = match named {
        Some(name) => match classes.iter().find(|c| meta_str(c, "name") == Some(&name)) {
            Some(c) => (
                name,
                c.get("value").and_then(Value::as_i64).unwrap_or(0),
                c.get("preemptionPolicy").cloned(),
            ),
            None => match BUILT_IN.iter().find(|(n, _)| *n == name) {
                Some((_, v)) => (name, *v, None),
                None => {
                    return Err(ApiError::forbidden(format!(
                        "pods \"{}\" is forbidden: no PriorityClass with name {name} was found",
                        meta_str(pod, "name").unwrap_or("")
                    )))
                }
            },
        },
        None => match classes
            .iter()
            .find(|c| c.get("globalDefault").and_then(Value::as_bool) == Some(true))
        {
            Some(c) => (
                meta_str(c, "name").unwrap_or("").to_string(),
                c.get("value").and_then(Value::as_i64).unwrap_or(0),
                c.get("preemptionPolicy").cloned(),
            ),
            None => return Ok(()),
        },
    };
    crate::value::set(pod, &["spec", "priorityClassName"], json!(name));
    crate::value::set(pod, &["spec", "priority"], json!(value));
    if let Some(p) = policy {
        crate::value::set(pod, &["spec", "preemptionPolicy"], p);
    }
    Ok(())
}

/// DefaultTolerationSeconds: a new pod tolerates its node being not-ready or unreachable for
/// 300 s before the node lifecycle evicts it, unless it says otherwise.
pub fn default_tolerations(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if !spec.get("tolerations").is_some_and(Value::is_array) {
        spec.insert("tolerations".into(), json!([]));
    }
    let Some(list) = spec.get_mut("tolerations").and_then(Value::as_array_mut) else {
        return;
    };
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let covered = list.iter().any(|t| {
            let k = t.get("key").and_then(Value::as_str);
            let effect = t.get("effect").and_then(Value::as_str);
            (k == Some(key)
                || (k.is_none() && t.get("operator").and_then(Value::as_str) == Some("Exists")))
                && matches!(effect, None | Some("") | Some("NoExecute"))
        });
        if !covered {
            list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
}

/// A pod's quality-of-service class from its containers' requests and limits.
pub fn qos_class(pod: &Value) -> &'static str {
    let containers = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut any = false;
    let mut guaranteed = true;
    for c in &containers {
        let req = c.pointer("/resources/requests").and_then(Value::as_object);
        let lim = c.pointer("/resources/limits").and_then(Value::as_object);
        if req.is_some_and(|r| !r.is_empty()) || lim.is_some_and(|l| !l.is_empty()) {
            any = true;
        }
        for r in ["cpu", "memory"] {
            let l = lim.and_then(|l| l.get(r));
            let q = req.and_then(|q| q.get(r)).or(l);
            if l.is_none() || q != l {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qos() {
        let g = json!({"spec": {"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}});
        assert_eq!(qos_class(&g), "Guaranteed");
        let b = json!({"spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}});
        assert_eq!(qos_class(&b), "Burstable");
    }

    #[test]
    fn grace_period_follows_the_node_and_the_phase() {
        let running = json!({"spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 10},
            "status": {"phase": "Running"}});
        // (pod, requested, expected)
        let cases = [
            (json!({"spec": {}}), Some(5), 0),
            (running.clone(), None, 10),
            (running.clone(), Some(3), 3),
            (running.clone(), Some(-1), 10),
            (json!({"spec": {"nodeName": "n1"}}), None, 30),
            (
                json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Failed"}}),
                Some(7),
                0,
            ),
        ];
        for (pod, requested, want) in cases {
            assert_eq!(
                Pod.grace_period(&pod, requested),
                want,
                "{pod} {requested:?}"
            );
        }
    }

    #[test]
    fn only_a_zero_grace_mark_is_final() {
        let marked = |g: i64| json!({"metadata": {"deletionTimestamp": "t", "deletionGracePeriodSeconds": g}});
        assert!(!Pod.deletion_marked(&marked(30)));
        assert!(Pod.deletion_marked(&marked(0)));
        assert!(!Pod.deletion_marked(&json!({"metadata": {}})));
    }

    #[test]
    fn spec_is_fixed_but_images_may_change() {
        let old = json!({"spec": {"containers": [{"name": "c", "image": "a"}]}});
        let mut causes = Vec::new();
        let image = json!({"spec": {"containers": [{"name": "c", "image": "b"}], "nodeName": "n"}});
        Pod.validate_update(&old, &image, &mut causes);
        assert!(causes.is_empty(), "{causes:?}");
        let renamed = json!({"spec": {"containers": [{"name": "d", "image": "a"}]}});
        Pod.validate_update(&old, &renamed, &mut causes);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].reason, "FieldValueForbidden");
    }

    #[test]
    fn default_tolerations_are_added_once() {
        let mut pod = json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}]}});
        default_tolerations(&mut pod);
        default_tolerations(&mut pod);
        let list = pod["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[1]["key"], "node.kubernetes.io/unreachable");
        assert_eq!(list[1]["tolerationSeconds"], 300);
    }
}
