//! RuntimeClasses: the container runtime handler a class of pods runs with (a DNS label,
//! fixed once set), what it costs besides the containers, and where it runs; and the
//! RuntimeClass admission of pods that name one (its overhead and scheduling copied in).

use serde_json::{json, Map, Value};

use crate::error::{ApiError, Cause};
use crate::handler::{meta_str, Api};
use crate::resources;
use crate::storage::Freshness;

use super::field::{dns_label, str_of};
use super::{immutable, Strategy};

pub struct RuntimeClass;

impl Strategy for RuntimeClass {
    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        dns_label("handler", str_of(Some(object), "handler"), causes);
        if let Some(tolerations) = object.pointer("/scheduling/tolerations") {
            for (i, t) in tolerations.as_array().into_iter().flatten().enumerate() {
                let op = str_of(Some(t), "operator");
                if op == "Exists" && !str_of(Some(t), "value").is_empty() {
                    causes.push(super::field::invalid(
                        &format!("scheduling.tolerations[{i}].operator"),
                        &Value::String(op.into()),
                        "value must be empty when `operator` is 'Exists'",
                    ));
                }
            }
        }
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        immutable("/handler", current, new, causes);
    }
}

/// RuntimeClass admission: a pod naming a RuntimeClass that does not exist is refused; one
/// naming a class gets its overhead, node selector and tolerations.
pub(crate) async fn admit_pod(api: &Api, pod: &mut Value) -> Result<(), ApiError> {
    let Some(name) = pod
        .pointer("/spec/runtimeClassName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
    else {
        return Ok(());
    };
    let res = resources::find("node.k8s.io", "v1", "runtimeclasses")
        .ok_or_else(|| ApiError::internal("runtimeclasses are served"))?;
    let key = res.key(None, &name);
    let class = match api.store.get(&key, Freshness::Latest).await? {
        Some(stored) => stored.object,
        None => {
            return Err(rejected(
                pod,
                &format!("pod rejected: RuntimeClass {name:?} not found"),
            ))
        }
    };
    apply_class(pod, &class)
}

fn rejected(pod: &Value, why: &str) -> ApiError {
    ApiError::forbidden(format!(
        "pods {:?} is forbidden: {why}",
        meta_str(pod, "name").unwrap_or("")
    ))
}

/// Copies a RuntimeClass's overhead and scheduling into a pod that names it.
fn apply_class(pod: &mut Value, class: &Value) -> Result<(), ApiError> {
    if let Some(fixed) = class.pointer("/overhead/podFixed") {
        match pod.pointer("/spec/overhead") {
            Some(set) if set != fixed => {
                return Err(rejected(
                    pod,
                    "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead",
                ))
            }
            _ => crate::value::set(pod, &["spec", "overhead"], fixed.clone()),
        }
    }
    let Some(scheduling) = class.get("scheduling") else {
        return Ok(());
    };
    let mut selector: Map<String, Value> = pod
        .pointer("/spec/nodeSelector")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (k, v) in scheduling
        .get("nodeSelector")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        match selector.get(k) {
            Some(mine) if mine != v => {
                return Err(rejected(
                    pod,
                    &format!(
                        "conflict: runtimeClass.scheduling.nodeSelector[{k}] = {}; pod.spec.nodeSelector[{k}] = {}",
                        v.as_str().unwrap_or(""),
                        mine.as_str().unwrap_or("")
                    ),
                ))
            }
            _ => {
                selector.insert(k.clone(), v.clone());
            }
        }
    }
    if !selector.is_empty() {
        crate::value::set(pod, &["spec", "nodeSelector"], Value::Object(selector));
    }
    let mut tolerations: Vec<Value> = pod
        .pointer("/spec/tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for t in scheduling
        .get("tolerations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if !tolerations.contains(t) {
            tolerations.push(t.clone());
        }
    }
    if !tolerations.is_empty() {
        crate::value::set(pod, &["spec", "tolerations"], json!(tolerations));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_handler_is_a_dns_label_and_fixed() {
        // (handler, refused)
        let cases = [
            ("runc", false),
            ("gvisor-2", false),
            ("", true),
            ("Kata", true),
            ("a.b", true),
        ];
        for (handler, refused) in cases {
            let mut causes = Vec::new();
            RuntimeClass.validate(
                &json!({"metadata": {"name": "rc"}, "handler": handler}),
                &mut causes,
            );
            assert_eq!(!causes.is_empty(), refused, "{handler}: {causes:?}");
            if refused {
                assert_eq!(causes[0].field, "handler");
                assert!(causes[0].message.contains("a lowercase RFC 1123 label"));
            }
        }
        let mut causes = Vec::new();
        RuntimeClass.validate_update(
            &json!({"handler": "runc"}),
            &json!({"handler": "crun"}),
            &mut causes,
        );
        assert_eq!(
            causes[0].message,
            "Invalid value: \"crun\": field is immutable"
        );
    }

    #[test]
    fn a_pod_gets_its_class_s_overhead_and_scheduling() {
        let class = json!({"handler": "runsc", "overhead": {"podFixed": {"memory": "120Mi"}},
            "scheduling": {"nodeSelector": {"sandbox": "gvisor"},
                           "tolerations": [{"key": "sandbox", "operator": "Exists"}]}});
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"runtimeClassName": "gvisor",
            "nodeSelector": {"disk": "ssd"}}});
        apply_class(&mut pod, &class).unwrap();
        assert_eq!(pod["spec"]["overhead"], json!({"memory": "120Mi"}));
        assert_eq!(
            pod["spec"]["nodeSelector"],
            json!({"disk": "ssd", "sandbox": "gvisor"})
        );
        assert_eq!(pod["spec"]["tolerations"][0]["key"], "sandbox");
        // (pod spec, the refusal)
        let cases = [
            (json!({"nodeSelector": {"sandbox": "kata"}}), "pods \"p\" is forbidden: conflict: runtimeClass.scheduling.nodeSelector[sandbox] = gvisor; pod.spec.nodeSelector[sandbox] = kata"),
            (json!({"overhead": {"memory": "1Mi"}}), "pods \"p\" is forbidden: pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"),
        ];
        for (spec, want) in cases {
            let mut pod = json!({"metadata": {"name": "p"}, "spec": spec});
            let e = apply_class(&mut pod, &class).unwrap_err();
            assert_eq!((e.code, e.message.as_str()), (403, want));
        }
    }
}
