//! Which pods go first when a set scales down (Kubernetes' ranking of active pods): unscheduled
//! before scheduled, Pending before Unknown before Running, not ready before ready, more
//! restarts before fewer, and the newest first.

use std::sync::Arc;

use serde_json::Value;

fn phase_rank(p: &Value) -> u8 {
    match p.pointer("/status/phase").and_then(Value::as_str) {
        Some("Pending") | None => 0,
        Some("Unknown") => 1,
        _ => 2,
    }
}

fn restarts(p: &Value) -> i64 {
    p.pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
                .sum()
        })
        .unwrap_or(0)
}

/// The `n` pods to delete first.
pub fn victims(active: &[Arc<Value>], n: usize) -> Vec<Arc<Value>> {
    let mut ranked: Vec<Arc<Value>> = active.to_vec();
    ranked.sort_by(|a, b| {
        let scheduled = |p: &Value| {
            p.pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty())
        };
        let created = |p: &Value| {
            p.pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        scheduled(a)
            .cmp(&scheduled(b))
            .then(phase_rank(a).cmp(&phase_rank(b)))
            .then(super::is_ready(a).cmp(&super::is_ready(b)))
            .then(restarts(b).cmp(&restarts(a)))
            .then(created(b).cmp(&created(a)))
    });
    ranked.truncate(n);
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: &str, phase: &str, ready: bool, created: &str) -> Arc<Value> {
        Arc::new(json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"nodeName": node},
            "status": {"phase": phase, "conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
    }

    #[test]
    fn the_least_useful_pods_go_first() {
        let pods = vec![
            pod("running-old", "n1", "Running", true, "2026-01-01T00:00:00Z"),
            pod("running-new", "n1", "Running", true, "2026-01-02T00:00:00Z"),
            pod("not-ready", "n1", "Running", false, "2026-01-01T00:00:00Z"),
            pod("pending", "n1", "Pending", false, "2026-01-01T00:00:00Z"),
            pod("unscheduled", "", "Pending", false, "2026-01-01T00:00:00Z"),
        ];
        let order: Vec<String> = victims(&pods, 5)
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            order,
            [
                "unscheduled",
                "pending",
                "not-ready",
                "running-new",
                "running-old"
            ]
        );
    }
}
