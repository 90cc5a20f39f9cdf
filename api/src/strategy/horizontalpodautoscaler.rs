//! HorizontalPodAutoscalers (autoscaling/v2): Kubernetes' defaults (`minReplicas` 1, a CPU
//! target of 80% utilization when no metric is given, and, when `behavior` is given, the
//! scale-up and scale-down rules it leaves out) and validation (the target reference, the
//! replica bounds, each metric's target, the scaling policies). The HPA controller keeps the
//! status.

use serde_json::{json, Value};

use crate::auth::User;
use crate::error::{ApiError, Cause};

use super::field::{invalid, not_supported, required};
use super::Strategy;

pub struct HorizontalPodAutoscaler;

/// The CPU utilization an autoscaler without metrics aims at (Kubernetes'
/// DefaultCPUUtilization).
pub const DEFAULT_CPU_UTILIZATION: i64 = 80;

/// Kubernetes' scale-up rules where `behavior.scaleUp` leaves them out: no stabilization, at
/// most 4 pods or 100% more every 15 s, whichever is more.
fn default_scale_up() -> Value {
    json!({
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 15},
            {"type": "Percent", "value": 100, "periodSeconds": 15},
        ],
    })
}

/// Kubernetes' scale-down rules: all of it every 15 s; the stabilization window stays unset
/// (the controller's `--horizontal-pod-autoscaler-downscale-stabilization`, 5 minutes).
fn default_scale_down() -> Value {
    json!({
        "selectPolicy": "Max",
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
    })
}

/// Fills the rules a user left out of `rules` from `defaults` (Kubernetes'
/// copyHPAScalingRules: the policies as a whole).
fn fill_rules(rules: &mut Value, defaults: Value) {
    let Some(given) = rules.as_object().cloned() else {
        *rules = defaults;
        return;
    };
    let mut out = defaults;
    for key in ["selectPolicy", "stabilizationWindowSeconds", "policies"] {
        if let Some(v) = given.get(key).filter(|v| !v.is_null()) {
            out[key] = v.clone();
        }
    }
    *rules = out;
}

fn validate_target(field: &str, target: Option<&Value>, causes: &mut Vec<Cause>) {
    let Some(target) = target else {
        causes.push(required(field, "must specify a metric target"));
        return;
    };
    let ty = target.get("type").cloned().unwrap_or(Value::Null);
    match ty.as_str() {
        Some("Utilization" | "Value" | "AverageValue") => {}
        None => causes.push(required(
            &format!("{field}.type"),
            "must specify a metric target type",
        )),
        Some(_) => causes.push(not_supported(
            &format!("{field}.type"),
            &ty,
            &["AverageValue", "Utilization", "Value"],
        )),
    }
    let utilization = target.get("averageUtilization");
    if let Some(u) = utilization {
        if u.as_i64().is_none_or(|u| u <= 0) {
            causes.push(invalid(
                &format!("{field}.averageUtilization"),
                u,
                "must be greater than 0",
            ));
        }
    }
    let set = |k: &str| target.get(k).is_some_and(|v| !v.is_null());
    match ty.as_str() {
        Some("Utilization") if !set("averageUtilization") => causes.push(required(
            &format!("{field}.averageUtilization"),
            "must set either a target raw value or a target utilization",
        )),
        Some("AverageValue") if !set("averageValue") => causes.push(required(
            &format!("{field}.averageValue"),
            "must set either a target raw value or a target utilization",
        )),
        Some("Value") if !set("value") => causes.push(required(
            &format!("{field}.value"),
            "must set either a target raw value or a target utilization",
        )),
        _ => {}
    }
}

fn validate_metric(field: &str, metric: &Value, causes: &mut Vec<Cause>) {
    let ty = metric.get("type").cloned().unwrap_or(Value::Null);
    let kinds = [
        ("Object", "object"),
        ("Pods", "pods"),
        ("Resource", "resource"),
        ("ContainerResource", "containerResource"),
        ("External", "external"),
    ];
    let Some((_, source)) = kinds.iter().find(|(k, _)| Some(*k) == ty.as_str()) else {
        if ty.is_null() {
            causes.push(required(
                &format!("{field}.type"),
                "must specify a metric source type",
            ));
        } else {
            causes.push(not_supported(
                &format!("{field}.type"),
                &ty,
                &[
                    "ContainerResource",
                    "External",
                    "Object",
                    "Pods",
                    "Resource",
                ],
            ));
        }
        return;
    };
    let Some(src) = metric.get(*source).filter(|s| s.is_object()) else {
        causes.push(required(
            &format!("{field}.{source}"),
            &format!(
                "must populate information for the given metric source (type {})",
                ty.as_str().unwrap_or("")
            ),
        ));
        return;
    };
    let sf = format!("{field}.{source}");
    if matches!(*source, "resource" | "containerResource") {
        if src
            .get("name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            causes.push(required(
                &format!("{sf}.name"),
                "must specify a resource name",
            ));
        }
        if *source == "containerResource"
            && src
                .get("container")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
        {
            causes.push(required(
                &format!("{sf}.container"),
                "must specify a container",
            ));
        }
        if let Some(t) = src.pointer("/target/type").and_then(Value::as_str) {
            if t == "Value" {
                causes.push(not_supported(
                    &format!("{sf}.target.type"),
                    &json!(t),
                    &["AverageValue", "Utilization"],
                ));
            }
        }
    } else if src
        .pointer("/metric/name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        causes.push(required(
            &format!("{sf}.metric.name"),
            "must specify a metric name",
        ));
    }
    validate_target(&format!("{sf}.target"), src.get("target"), causes);
}

fn validate_rules(field: &str, rules: &Value, causes: &mut Vec<Cause>) {
    if let Some(w) = rules
        .get("stabilizationWindowSeconds")
        .filter(|v| !v.is_null())
    {
        match w.as_i64() {
            Some(w) if w < 0 => causes.push(invalid(
                &format!("{field}.stabilizationWindowSeconds"),
                &json!(w),
                "must be greater than or equal to zero",
            )),
            Some(w) if w > 3600 => causes.push(invalid(
                &format!("{field}.stabilizationWindowSeconds"),
                &json!(w),
                "must be less than or equal to 3600",
            )),
            _ => {}
        }
    }
    if let Some(p) = rules.get("selectPolicy").filter(|v| !v.is_null()) {
        if !matches!(p.as_str(), Some("Max" | "Min" | "Disabled")) {
            causes.push(not_supported(
                &format!("{field}.selectPolicy"),
                p,
                &["Disabled", "Max", "Min"],
            ));
        }
    }
    let policies = rules.get("policies").and_then(Value::as_array);
    if policies.is_none_or(|p| p.is_empty()) {
        causes.push(required(
            &format!("{field}.policies"),
            "must specify at least one Policy",
        ));
    }
    for (i, p) in policies.into_iter().flatten().enumerate() {
        let pf = format!("{field}.policies[{i}]");
        let ty = p.get("type").cloned().unwrap_or(Value::Null);
        if !matches!(ty.as_str(), Some("Pods" | "Percent")) {
            causes.push(not_supported(
                &format!("{pf}.type"),
                &ty,
                &["Percent", "Pods"],
            ));
        }
        let period = p.get("periodSeconds").and_then(Value::as_i64).unwrap_or(0);
        if period <= 0 {
            causes.push(invalid(
                &format!("{pf}.periodSeconds"),
                &json!(period),
                "must be greater than zero",
            ));
        } else if period > 1800 {
            causes.push(invalid(
                &format!("{pf}.periodSeconds"),
                &json!(period),
                "must be less than or equal to 1800",
            ));
        }
        let value = p.get("value").and_then(Value::as_i64).unwrap_or(0);
        if value <= 0 {
            causes.push(invalid(
                &format!("{pf}.value"),
                &json!(value),
                "must be greater than zero",
            ));
        }
    }
}

impl Strategy for HorizontalPodAutoscaler {
    fn defaults(&self, object: &mut Value) {
        let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
            return;
        };
        spec.entry("minReplicas").or_insert(json!(1));
        if spec
            .get("metrics")
            .and_then(Value::as_array)
            .is_none_or(|m| m.is_empty())
        {
            spec.insert(
                "metrics".into(),
                json!([{"type": "Resource", "resource": {"name": "cpu",
                    "target": {"type": "Utilization",
                               "averageUtilization": DEFAULT_CPU_UTILIZATION}}}]),
            );
        }
        if let Some(behavior) = spec.get_mut("behavior").filter(|b| b.is_object()) {
            fill_rules(
                behavior
                    .as_object_mut()
                    .map(|b| b.entry("scaleUp").or_insert(Value::Null))
                    .unwrap_or(&mut Value::Null),
                default_scale_up(),
            );
            fill_rules(
                behavior
                    .as_object_mut()
                    .map(|b| b.entry("scaleDown").or_insert(Value::Null))
                    .unwrap_or(&mut Value::Null),
                default_scale_down(),
            );
        }
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let spec = object.get("spec").cloned().unwrap_or(Value::Null);
        let target = spec.get("scaleTargetRef");
        for key in ["kind", "name"] {
            if target
                .and_then(|t| t.get(key))
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                causes.push(required(&format!("spec.scaleTargetRef.{key}"), ""));
            }
        }
        let min = spec.get("minReplicas").and_then(Value::as_i64);
        if let Some(m) = min.filter(|m| *m < 1) {
            causes.push(invalid(
                "spec.minReplicas",
                &json!(m),
                "must be greater than or equal to 1",
            ));
        }
        let max = spec.get("maxReplicas").and_then(Value::as_i64).unwrap_or(0);
        if max < 1 {
            causes.push(invalid(
                "spec.maxReplicas",
                &json!(max),
                "must be greater than 0",
            ));
        } else if min.is_some_and(|m| max < m) {
            causes.push(invalid(
                "spec.maxReplicas",
                &json!(max),
                "must be greater than or equal to `minReplicas`",
            ));
        }
        for (i, m) in spec
            .get("metrics")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            validate_metric(&format!("spec.metrics[{i}]"), m, causes);
        }
        for dir in ["scaleUp", "scaleDown"] {
            if let Some(r) = spec
                .pointer(&format!("/behavior/{dir}"))
                .filter(|r| r.is_object())
            {
                validate_rules(&format!("spec.behavior.{dir}"), r, causes);
            }
        }
    }

    fn prepare_for_user(&self, _user: &User, object: &mut Value) -> Result<(), ApiError> {
        // The status is the controller's (Kubernetes' PrepareForCreate clears it).
        if let Some(o) = object.as_object_mut() {
            o.shift_remove("status");
        }
        Ok(())
    }
}

/// The annotations autoscaling/v1 keeps what it has no field for in (Kubernetes' names).
const CONDITIONS_ANNOTATION: &str = "autoscaling.alpha.kubernetes.io/conditions";
const BEHAVIOR_ANNOTATION: &str = "autoscaling.alpha.kubernetes.io/behavior";

fn cpu_utilization_metric(percent: Value) -> Value {
    json!([{"type": "Resource", "resource": {"name": "cpu",
        "target": {"type": "Utilization", "averageUtilization": percent}}}])
}

/// The CPU utilization (target or current) among v2 metrics.
fn cpu_utilization(metrics: Option<&Value>, ptr: &str) -> Option<Value> {
    metrics?
        .as_array()?
        .iter()
        .find(|m| {
            m.get("type").and_then(Value::as_str) == Some("Resource")
                && m.pointer("/resource/name").and_then(Value::as_str) == Some("cpu")
        })?
        .pointer(ptr)
        .cloned()
}

/// An autoscaling/v1 object, or a merge-style patch of one, in the stored autoscaling/v2 form:
/// `targetCPUUtilizationPercentage` becomes a CPU Utilization metric, the behavior and
/// conditions v1 keeps in annotations come back as fields.
pub fn v1_to_v2(v: &mut Value) {
    let Some(o) = v.as_object_mut() else {
        return;
    };
    if o.contains_key("apiVersion") {
        o.insert("apiVersion".into(), json!("autoscaling/v2"));
    }
    let mut annotations = |key: &str| -> Option<Value> {
        let a = o
            .get_mut("metadata")?
            .get_mut("annotations")?
            .as_object_mut()?;
        let raw = a.shift_remove(key)?;
        serde_json::from_str(raw.as_str()?).ok()
    };
    let behavior = annotations(BEHAVIOR_ANNOTATION);
    let conditions = annotations(CONDITIONS_ANNOTATION);
    if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
        if let Some(target) = spec.shift_remove("targetCPUUtilizationPercentage") {
            let metrics = if target.is_null() {
                Value::Null
            } else {
                cpu_utilization_metric(target)
            };
            spec.insert("metrics".into(), metrics);
        }
        if let Some(b) = behavior {
            spec.insert("behavior".into(), b);
        }
    }
    if let Some(status) = o.get_mut("status").and_then(Value::as_object_mut) {
        if let Some(current) = status.shift_remove("currentCPUUtilizationPercentage") {
            status.insert(
                "currentMetrics".into(),
                json!([{"type": "Resource", "resource": {"name": "cpu",
                    "current": {"averageUtilization": current}}}]),
            );
        }
        if let Some(c) = conditions {
            status.insert("conditions".into(), c);
        }
    }
}

/// A JSON patch of an autoscaling/v1 object in the v2 form: the CPU target's path becomes the
/// metrics'.
fn v1_json_patch_to_v2(ops: &mut Value) {
    for op in ops.as_array_mut().into_iter().flatten() {
        if op.get("path").and_then(Value::as_str) == Some("/spec/targetCPUUtilizationPercentage") {
            op["path"] = json!("/spec/metrics");
            if let Some(v) = op.get("value").cloned() {
                op["value"] = cpu_utilization_metric(v);
            }
        }
    }
}

/// A stored autoscaling/v2 object in the autoscaling/v1 form.
pub fn v2_to_v1(v: &mut Value) {
    let Some(o) = v.as_object_mut() else {
        return;
    };
    o.insert("apiVersion".into(), json!("autoscaling/v1"));
    let mut annotations: Vec<(&str, String)> = Vec::new();
    if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
        let metrics = spec.shift_remove("metrics");
        if let Some(t) = cpu_utilization(metrics.as_ref(), "/resource/target/averageUtilization") {
            spec.insert("targetCPUUtilizationPercentage".into(), t);
        }
        if let Some(b) = spec.shift_remove("behavior") {
            annotations.push((BEHAVIOR_ANNOTATION, b.to_string()));
        }
    }
    if let Some(status) = o.get_mut("status").and_then(Value::as_object_mut) {
        let current = status.shift_remove("currentMetrics");
        if let Some(c) = cpu_utilization(current.as_ref(), "/resource/current/averageUtilization") {
            status.insert("currentCPUUtilizationPercentage".into(), c);
        }
        if let Some(c) = status.shift_remove("conditions") {
            annotations.push((CONDITIONS_ANNOTATION, c.to_string()));
        }
        status.entry("currentReplicas").or_insert(json!(0));
        status.entry("desiredReplicas").or_insert(json!(0));
    }
    if !annotations.is_empty() {
        let meta = o.entry("metadata").or_insert_with(|| json!({}));
        if let Some(m) = meta.as_object_mut() {
            let a = m.entry("annotations").or_insert_with(|| json!({}));
            for (k, v) in annotations {
                a[k] = json!(v);
            }
        }
    }
}

/// autoscaling/v1 HorizontalPodAutoscalers, served as the stored autoscaling/v2 ones.
pub static V1: crate::view::View = crate::view::View {
    stored: ("autoscaling", "v2", "horizontalpodautoscalers"),
    kind: "HorizontalPodAutoscaler",
    stored_api_version: "autoscaling/v2",
    to_stored: v1_to_v2,
    json_patch_to_stored: v1_json_patch_to_v2,
    from_stored: v2_to_v1,
    query_to_stored: Clone::clone,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn hpa(spec: Value) -> Value {
        json!({"metadata": {"name": "web"}, "spec": spec})
    }

    fn causes(spec: Value) -> Vec<(String, String)> {
        let mut o = hpa(spec);
        HorizontalPodAutoscaler.defaults(&mut o);
        let mut out = Vec::new();
        HorizontalPodAutoscaler.validate(&o, &mut out);
        out.into_iter().map(|c| (c.field, c.message)).collect()
    }

    #[test]
    fn defaults_are_kubernetes() {
        let mut o = hpa(
            json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"},
                                "maxReplicas": 5}),
        );
        HorizontalPodAutoscaler.defaults(&mut o);
        assert_eq!(o["spec"]["minReplicas"], 1);
        assert_eq!(o["spec"]["metrics"][0]["resource"]["name"], "cpu");
        assert_eq!(
            o["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            80
        );
        assert!(
            o["spec"].get("behavior").is_none(),
            "no behavior stays none"
        );

        let mut o = hpa(json!({"behavior": {"scaleDown": {"stabilizationWindowSeconds": 5}}}));
        HorizontalPodAutoscaler.defaults(&mut o);
        let b = &o["spec"]["behavior"];
        assert_eq!(b["scaleUp"], default_scale_up());
        assert_eq!(b["scaleDown"]["stabilizationWindowSeconds"], 5);
        assert_eq!(b["scaleDown"]["selectPolicy"], "Max");
        assert_eq!(b["scaleDown"]["policies"][0]["type"], "Percent");
    }

    #[test]
    fn v1_converts_both_ways() {
        let v1 = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                         "name": "web"},
                     "minReplicas": 1, "maxReplicas": 5, "targetCPUUtilizationPercentage": 50}});
        let mut v2 = v1.clone();
        v1_to_v2(&mut v2);
        assert_eq!(v2["apiVersion"], "autoscaling/v2");
        assert_eq!(
            v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            50
        );
        assert!(v2["spec"].get("targetCPUUtilizationPercentage").is_none());
        v2["spec"]["behavior"] = json!({"scaleDown": {"stabilizationWindowSeconds": 5}});
        v2["status"] = json!({"currentReplicas": 2, "desiredReplicas": 3,
            "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu",
                "current": {"averageUtilization": 40, "averageValue": "40m"}}}],
            "conditions": [{"type": "AbleToScale", "status": "True"}]});
        let mut back = v2.clone();
        v2_to_v1(&mut back);
        assert_eq!(back["apiVersion"], "autoscaling/v1");
        assert_eq!(back["spec"]["targetCPUUtilizationPercentage"], 50);
        assert_eq!(back["status"]["currentCPUUtilizationPercentage"], 40);
        assert!(back["metadata"]["annotations"][CONDITIONS_ANNOTATION].is_string());
        // Through v1 and back, nothing v2 holds is lost but the current average value.
        let mut again = back.clone();
        v1_to_v2(&mut again);
        assert_eq!(again["spec"], v2["spec"]);
        assert_eq!(again["status"]["conditions"], v2["status"]["conditions"]);
        let mut ops = json!([{"op": "replace", "path": "/spec/targetCPUUtilizationPercentage",
                              "value": 70}]);
        v1_json_patch_to_v2(&mut ops);
        assert_eq!(ops[0]["path"], "/spec/metrics");
        assert_eq!(
            ops[0]["value"][0]["resource"]["target"]["averageUtilization"],
            70
        );
    }

    #[test]
    fn validation() {
        let ok = json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"},
                        "minReplicas": 1, "maxReplicas": 5});
        assert_eq!(causes(ok), vec![]);
        let table: Vec<(Value, &str, &str)> = vec![
            (
                json!({"scaleTargetRef": {"kind": "Deployment"}, "maxReplicas": 1}),
                "spec.scaleTargetRef.name",
                "Required value",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "w"}, "minReplicas": 0,
                    "maxReplicas": 1}),
                "spec.minReplicas",
                "Invalid value: 0: must be greater than or equal to 1",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "w"}, "minReplicas": 3,
                    "maxReplicas": 2}),
                "spec.maxReplicas",
                "Invalid value: 2: must be greater than or equal to `minReplicas`",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "w"}, "maxReplicas": 2,
                    "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 0}}}]}),
                "spec.metrics[0].resource.target.averageUtilization",
                "Invalid value: 0: must be greater than 0",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "w"}, "maxReplicas": 2,
                    "behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 1,
                                                           "periodSeconds": 1801}]}}}),
                "spec.behavior.scaleUp.policies[0].periodSeconds",
                "Invalid value: 1801: must be less than or equal to 1800",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment", "name": "w"}, "maxReplicas": 2,
                    "behavior": {"scaleDown": {"selectPolicy": "Most"}}}),
                "spec.behavior.scaleDown.selectPolicy",
                "Unsupported value: \"Most\"",
            ),
        ];
        for (spec, field, message) in table {
            let got = causes(spec.clone());
            assert!(
                got.iter()
                    .any(|(f, m)| f == field && m.starts_with(message)),
                "{spec}: {got:?}"
            );
        }
    }
}
