//! LimitRange admission for pods: containers without requests or limits get the namespace's
//! `defaultRequest` and `default`, and values outside `min`/`max` are refused with Kubernetes'
//! wording (403 Forbidden).

use serde_json::{json, Value};

use crate::error::ApiError;
use rkube_core::quantity::parse_quantity;

fn container_items(range: &Value) -> impl Iterator<Item = &Value> {
    range
        .pointer("/spec/limits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|l| l.get("type").and_then(Value::as_str) == Some("Container"))
}

/// Applies the defaults of every LimitRange in the pod's namespace, then checks min and max.
pub fn admit(pod: &mut Value, ranges: &[Value]) -> Result<(), ApiError> {
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    for range in ranges {
        for item in container_items(range) {
            for list in ["containers", "initContainers"] {
                let Some(cs) = pod
                    .pointer_mut(&format!("/spec/{list}"))
                    .and_then(Value::as_array_mut)
                else {
                    continue;
                };
                for c in cs.iter_mut() {
                    let Some(c) = c.as_object_mut() else { continue };
                    let resources = c.entry("resources").or_insert_with(|| json!({}));
                    for (field, what) in [("default", "limits"), ("defaultRequest", "requests")] {
                        let Some(defaults) = item.get(field).and_then(Value::as_object) else {
                            continue;
                        };
                        for (r, v) in defaults {
                            if resources.pointer(&format!("/{what}/{r}")).is_none() {
                                crate::value::set(resources, &[what, r], v.clone());
                            }
                        }
                    }
                    // A container with a limit but no request requests its limit.
                    if let Some(limits) =
                        resources.get("limits").and_then(Value::as_object).cloned()
                    {
                        for (r, v) in limits {
                            if resources.pointer(&format!("/requests/{r}")).is_none() {
                                crate::value::set(resources, &["requests", &r], v);
                            }
                        }
                    }
                }
            }
        }
    }
    let mut problems = Vec::new();
    for range in ranges {
        for item in container_items(range) {
            for c in pod
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                for (bound, what, word) in
                    [("max", "limits", "maximum"), ("min", "requests", "minimum")]
                {
                    for (r, b) in item
                        .get(bound)
                        .and_then(Value::as_object)
                        .into_iter()
                        .flatten()
                    {
                        let Some(bq) = b.as_str().and_then(parse_quantity) else {
                            continue;
                        };
                        let got = c
                            .pointer(&format!("/resources/{what}/{r}"))
                            .and_then(Value::as_str);
                        let kind = if what == "limits" { "limit" } else { "request" };
                        match got.and_then(parse_quantity) {
                            None => problems.push(format!(
                                "{word} {r} usage per Container is {}.  No {kind} is specified",
                                b.as_str().unwrap_or("")
                            )),
                            Some(v) if (bound == "max" && v > bq) || (bound == "min" && v < bq) => {
                                problems.push(format!(
                                    "{word} {r} usage per Container is {}, but {kind} is {}",
                                    b.as_str().unwrap_or(""),
                                    got.unwrap_or("")
                                ))
                            }
                            Some(_) => {}
                        }
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "pods \"{name}\" is forbidden: {}",
            problems.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bounds() {
        let range = json!({"spec": {"limits": [{"type": "Container",
            "default": {"cpu": "500m", "memory": "256Mi"},
            "defaultRequest": {"cpu": "100m"},
            "max": {"cpu": "1"}}]}});
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "x"},
            {"name": "b", "image": "x", "resources": {"limits": {"cpu": "800m"}}}]}});
        admit(&mut pod, std::slice::from_ref(&range)).unwrap();
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["limits"]["cpu"],
            "500m"
        );
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "100m"
        );
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["requests"]["memory"],
            "256Mi"
        );
        assert_eq!(
            pod["spec"]["containers"][1]["resources"]["limits"]["cpu"],
            "800m"
        );
        let mut big = json!({"metadata": {"name": "big"}, "spec": {"containers": [
            {"name": "a", "image": "x", "resources": {"limits": {"cpu": "2"}}}]}});
        let e = admit(&mut big, &[range]).unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "pods \"big\" is forbidden: maximum cpu usage per Container is 1, but limit is 2"
        );
    }
}
