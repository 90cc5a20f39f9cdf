//! The rows of HorizontalPodAutoscalers, as kubectl's printer writes them
//! (`printHorizontalPodAutoscaler`): the target, each metric's current and target value
//! (`cpu: 40%/50%`), the replica bounds and the current count.

use rkube_core::json::str_at as s;
use serde_json::{json, Value};

use super::format::arr;

pub(super) const COLUMNS: super::columns::Columns = &[
    ("Name", "string", 0),
    ("Reference", "string", 0),
    ("Targets", "string", 0),
    ("MinPods", "string", 0),
    ("MaxPods", "string", 0),
    ("Replicas", "string", 0),
    ("Age", "string", 0),
];

fn quantity(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(q) => Some(q.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// One metric's `name: current/target`, with `<unknown>` for a current value not observed.
fn metric(spec: &Value, status: Option<&Value>) -> String {
    let ty = s(spec, "/type");
    let source = match ty {
        "Resource" => "resource",
        "ContainerResource" => "containerResource",
        "Pods" => "pods",
        "Object" => "object",
        _ => "external",
    };
    let src = spec.get(source).cloned().unwrap_or(Value::Null);
    let cur = status
        .and_then(|st| st.get(source))
        .and_then(|c| c.get("current"));
    let unknown = || "<unknown>".to_string();
    let name = match ty {
        "Resource" | "ContainerResource" => s(&src, "/name").to_string(),
        _ => s(&src, "/metric/name").to_string(),
    };
    let target = src.get("target").cloned().unwrap_or(Value::Null);
    let (current, wanted) =
        if let Some(u) = target.get("averageUtilization").and_then(Value::as_i64) {
            let c = cur
                .and_then(|c| c.get("averageUtilization"))
                .and_then(Value::as_i64)
                .map_or_else(unknown, |c| format!("{c}%"));
            (c, format!("{u}%"))
        } else if let Some(v) = quantity(target.get("averageValue")) {
            (
                quantity(cur.and_then(|c| c.get("averageValue"))).unwrap_or_else(unknown),
                v,
            )
        } else if let Some(v) = quantity(target.get("value")) {
            (
                quantity(cur.and_then(|c| c.get("value"))).unwrap_or_else(unknown),
                v,
            )
        } else {
            (unknown(), "<auto>".to_string())
        };
    match ty {
        "ContainerResource" => format!(
            "{name}: {current}/{wanted} (container {})",
            s(&src, "/container")
        ),
        _ => format!("{name}: {current}/{wanted}"),
    }
}

/// The cells after the name (Age left null for the caller).
pub(super) fn row(o: &Value) -> Vec<Value> {
    let reference = format!(
        "{}/{}",
        s(o, "/spec/scaleTargetRef/kind"),
        s(o, "/spec/scaleTargetRef/name")
    );
    let specs = arr(o, "/spec/metrics");
    let statuses = arr(o, "/status/currentMetrics");
    let targets = if specs.is_empty() {
        "<none>".to_string()
    } else {
        let shown: Vec<String> = specs
            .iter()
            .take(2)
            .enumerate()
            .map(|(i, m)| metric(m, statuses.get(i)))
            .collect();
        let mut t = shown.join(", ");
        if specs.len() > 2 {
            t = format!("{t} + {} more...", specs.len() - 2);
        }
        t
    };
    let min = o
        .pointer("/spec/minReplicas")
        .and_then(Value::as_i64)
        .map_or_else(|| "<unset>".to_string(), |m| m.to_string());
    vec![
        json!(reference),
        json!(targets),
        json!(min),
        json!(o
            .pointer("/spec/maxReplicas")
            .and_then(Value::as_i64)
            .unwrap_or(0)),
        json!(o
            .pointer("/status/currentReplicas")
            .and_then(Value::as_i64)
            .unwrap_or(0)),
        Value::Null,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_show_current_over_target() {
        let o = json!({
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"},
                     "minReplicas": 1, "maxReplicas": 5,
                     "metrics": [
                        {"type": "Resource", "resource": {"name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 50}}},
                        {"type": "Resource", "resource": {"name": "memory",
                            "target": {"type": "AverageValue", "averageValue": "100Mi"}}}]},
            "status": {"currentReplicas": 2, "currentMetrics": [
                {"type": "Resource", "resource": {"name": "cpu",
                    "current": {"averageUtilization": 40, "averageValue": "40m"}}}]},
        });
        let r = row(&o);
        assert_eq!(r[0], "Deployment/web");
        assert_eq!(r[1], "cpu: 40%/50%, memory: <unknown>/100Mi");
        assert_eq!(r[2], "1");
        assert_eq!(r[3], 5);
        assert_eq!(r[4], 2);
    }
}
