//! ResourceQuota admission. A quota's `status.used` is kept exact by writing it in the same
//! store transaction as the object that changes it (compared on the quota's revision, so two
//! creates racing for the last slot cannot both win), and recomputed from the objects
//! themselves when a quota is created and by a loop on the leader.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::resources::Resource;

use rkube_core::quantity::{format_canonical, parse_quantity, Format, Nanos, NANO};

fn add(usage: &mut BTreeMap<String, Nanos>, key: &str, v: Nanos) {
    *usage.entry(key.to_string()).or_insert(0) += v;
}

fn container_sum(pod: &Value, list: &str, what: &str, resource: &str) -> Nanos {
    pod.pointer(&format!("/spec/{list}"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.pointer(&format!("/resources/{what}/{resource}")))
        .filter_map(Value::as_str)
        .filter_map(parse_quantity)
        .fold(0, |a, b| {
            if list == "initContainers" {
                a.max(b)
            } else {
                a + b
            }
        })
}

/// What an object counts against quotas.
pub fn usage(res: &Resource, obj: &Value) -> BTreeMap<String, Nanos> {
    let mut u = BTreeMap::new();
    let one = NANO;
    let count = if res.group.is_empty() {
        format!("count/{}", res.plural)
    } else {
        format!("count/{}.{}", res.plural, res.group)
    };
    add(&mut u, &count, one);
    match (res.group, res.kind) {
        ("", "Pod") => {
            let phase = obj.pointer("/status/phase").and_then(Value::as_str);
            if matches!(phase, Some("Succeeded" | "Failed")) {
                return BTreeMap::new();
            }
            add(&mut u, "pods", one);
            for what in ["requests", "limits"] {
                for r in ["cpu", "memory", "ephemeral-storage"] {
                    let v = container_sum(obj, "containers", what, r).max(container_sum(
                        obj,
                        "initContainers",
                        what,
                        r,
                    ));
                    if v != 0 {
                        add(&mut u, &format!("{what}.{r}"), v);
                        if what == "requests" {
                            add(&mut u, r, v);
                        }
                    }
                }
            }
        }
        ("", "Service") => {
            add(&mut u, "services", one);
            let ty = obj
                .pointer("/spec/type")
                .and_then(Value::as_str)
                .unwrap_or("ClusterIP");
            let ports = obj
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .map_or(0, Vec::len) as i128;
            if ty == "NodePort" || ty == "LoadBalancer" {
                add(&mut u, "services.nodeports", ports * one);
            }
            if ty == "LoadBalancer" {
                add(&mut u, "services.loadbalancers", one);
            }
        }
        (
            "",
            "ConfigMap"
            | "Secret"
            | "ReplicationController"
            | "ResourceQuota"
            | "PersistentVolumeClaim",
        ) => {
            add(&mut u, res.plural, one);
        }
        _ => {}
    }
    u
}

/// For a Pod, the `must specify` complaint of a quota that limits compute resources the pod's
/// containers leave unset.
fn missing_specs(obj: &Value, hard: &Map<String, Value>) -> Vec<String> {
    let mut out = Vec::new();
    for (key, what, r) in [
        ("limits.cpu", "limits", "cpu"),
        ("limits.memory", "limits", "memory"),
        ("requests.cpu", "requests", "cpu"),
        ("requests.memory", "requests", "memory"),
    ] {
        let constrained = hard.contains_key(key) || (what == "requests" && hard.contains_key(r));
        if !constrained {
            continue;
        }
        let missing: Vec<&str> = obj
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|c| c.pointer(&format!("/resources/{what}/{r}")).is_none())
            .filter_map(|c| c.get("name").and_then(Value::as_str))
            .collect();
        if !missing.is_empty() {
            out.push(format!("{key} for: {}", missing.join(",")));
        }
    }
    out
}

fn is_binary(hard: &Map<String, Value>, key: &str) -> bool {
    hard.get(key)
        .and_then(Value::as_str)
        .is_some_and(|s| s.ends_with('i'))
}

/// The new state of one quota after a change whose usage delta is `delta`, or the 403 that
/// refuses it. None when the quota is not concerned.
pub fn charge(
    quota: &Value,
    res: &Resource,
    name: &str,
    new: Option<&Value>,
    delta: &BTreeMap<String, Nanos>,
) -> Result<Option<Value>, ApiError> {
    let hard = quota
        .pointer("/spec/hard")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let qname = quota
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let relevant: Vec<&String> = hard
        .keys()
        .filter(|k| delta.get(*k).is_some_and(|d| *d != 0))
        .collect();
    let increases = delta.values().any(|d| *d > 0);
    if res.kind == "Pod" && res.group.is_empty() && increases {
        if let Some(pod) = new {
            let missing = missing_specs(pod, &hard);
            if !missing.is_empty() {
                return Err(ApiError::forbidden(format!(
                    "pods \"{name}\" is forbidden: failed quota: {qname}: must specify {}",
                    missing.join("; ")
                )));
            }
        }
    }
    if relevant.is_empty() {
        return Ok(None);
    }
    let used_now = quota
        .pointer("/status/used")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut used = used_now.clone();
    let (mut req, mut usd, mut lim) = (Vec::new(), Vec::new(), Vec::new());
    for key in &relevant {
        let d = delta[*key];
        let before = used_now
            .get(*key)
            .and_then(Value::as_str)
            .and_then(parse_quantity)
            .unwrap_or(0);
        let after = (before + d).max(0);
        let limit = hard
            .get(*key)
            .and_then(Value::as_str)
            .and_then(parse_quantity)
            .unwrap_or(0);
        let binary = is_binary(&hard, key);
        if d > 0 && after > limit {
            req.push(format!("{key}={}", shown(d, binary)));
            usd.push(format!("{key}={}", shown(before, binary)));
            lim.push(format!("{key}={}", shown(limit, binary)));
        }
        used.insert((*key).clone(), json!(shown(after, binary)));
    }
    if !req.is_empty() {
        return Err(ApiError::forbidden(format!(
            "{} \"{name}\" is forbidden: exceeded quota: {qname}, requested: {}, used: {}, limited: {}",
            res.qualified(),
            req.join(","),
            usd.join(","),
            lim.join(",")
        )));
    }
    let mut out = quota.clone();
    crate::value::set(&mut out, &["status", "hard"], Value::Object(hard));
    crate::value::set(&mut out, &["status", "used"], Value::Object(used));
    Ok(Some(out))
}

/// A quantity as Kubernetes prints it (`Quantity.String()`: `1000` pods are `1k`), binary
/// when the hard limit was written so.
fn shown(n: Nanos, binary: bool) -> String {
    let format = if binary {
        Format::BinarySi
    } else {
        Format::DecimalSi
    };
    format_canonical(n, format)
}

/// The usage delta of a change from `old` to `new` (either may be absent).
pub fn delta(res: &Resource, old: Option<&Value>, new: Option<&Value>) -> BTreeMap<String, Nanos> {
    let mut d = new.map(|n| usage(res, n)).unwrap_or_default();
    for (k, v) in old.map(|o| usage(res, o)).unwrap_or_default() {
        *d.entry(k).or_insert(0) -= v;
    }
    d.retain(|_, v| *v != 0);
    d
}

/// `status` of a quota given every object in its namespace (by resource).
pub fn status_from(hard: &Map<String, Value>, totals: &BTreeMap<String, Nanos>) -> Value {
    let used: Map<String, Value> = hard
        .keys()
        .map(|k| {
            (
                k.clone(),
                json!(shown(
                    totals.get(k).copied().unwrap_or(0),
                    is_binary(hard, k)
                )),
            )
        })
        .collect();
    json!({"hard": hard, "used": used})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::find;

    #[test]
    fn exceeding_a_quota_is_403_with_kubernetes_wording() {
        let pods = find("", "v1", "pods").unwrap();
        let quota = json!({"metadata": {"name": "compute-quota"},
            "spec": {"hard": {"pods": "1", "requests.cpu": "1"}},
            "status": {"used": {"pods": "1", "requests.cpu": "500m"}}});
        let pod = json!({"metadata": {"name": "p2"}, "spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": "250m"}}}]}});
        let d = delta(pods, None, Some(&pod));
        let e = charge(&quota, pods, "p2", Some(&pod), &d).unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(e.message, "pods \"p2\" is forbidden: exceeded quota: compute-quota, requested: pods=1, used: pods=1, limited: pods=1");
        // Quantities print as Kubernetes prints them.
        assert_eq!(shown(1000 * NANO, false), "1k");
        assert_eq!(shown(NANO / 2, false), "500m");
        assert_eq!(shown(1536 * 1024 * 1024 * NANO, true), "1536Mi");
        assert_eq!(shown(2 * 1024 * 1024 * 1024 * NANO, true), "2Gi");

        let roomy = json!({"metadata": {"name": "q"}, "spec": {"hard": {"pods": "10", "requests.cpu": "1"}},
                           "status": {"used": {"pods": "1", "requests.cpu": "500m"}}});
        let after = charge(&roomy, pods, "p2", Some(&pod), &d).unwrap().unwrap();
        assert_eq!(after["status"]["used"]["pods"], "2");
        assert_eq!(after["status"]["used"]["requests.cpu"], "750m");

        let bare = json!({"metadata": {"name": "p3"}, "spec": {"containers": [{"name": "c"}]}});
        let e = charge(
            &roomy,
            pods,
            "p3",
            Some(&bare),
            &delta(pods, None, Some(&bare)),
        )
        .unwrap_err();
        assert!(
            e.message
                .contains("failed quota: q: must specify requests.cpu for: c"),
            "{}",
            e.message
        );
        // Deleting releases.
        let freed = charge(&after, pods, "p2", None, &delta(pods, Some(&pod), None))
            .unwrap()
            .unwrap();
        assert_eq!(freed["status"]["used"]["pods"], "1");
    }
}
