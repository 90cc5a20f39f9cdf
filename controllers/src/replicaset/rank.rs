//! Which pods go first when a set scales down (Kubernetes' ranking of active pods): unscheduled
//! before scheduled, Pending before Unknown before Running, not ready before ready, more
//! restarts before fewer, and the newest first.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::pods::is_ready;

fn phase_rank(p: &Pod) -> u8 {
    match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Pending") | None => 0,
        Some("Unknown") => 1,
        _ => 2,
    }
}

fn restarts(p: &Pod) -> i64 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| i64::from(c.restart_count)).sum())
        .unwrap_or(0)
}

fn scheduled(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// The `n` pods to delete first.
pub fn victims(active: &[Arc<Pod>], n: usize) -> Vec<Arc<Pod>> {
    let mut ranked: Vec<Arc<Pod>> = active.to_vec();
    ranked.sort_by(|a, b| {
        let created = |p: &Pod| p.metadata.creation_timestamp.clone();
        scheduled(a)
            .cmp(&scheduled(b))
            .then(phase_rank(a).cmp(&phase_rank(b)))
            .then(is_ready(a).cmp(&is_ready(b)))
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

    fn pod(name: &str, node: &str, phase: &str, ready: bool, created: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "creationTimestamp": created},
                "spec": {"nodeName": node},
                "status": {"phase": phase, "conditions": [
                    {"type": "Ready", "status": if ready { "True" } else { "False" }}]},
            }))
            .unwrap(),
        )
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
            .map(|p| p.metadata.name.clone().unwrap())
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
