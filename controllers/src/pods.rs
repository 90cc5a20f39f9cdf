//! What the workload controllers ask of a Pod: whether it still counts (active), whether it is
//! Ready, and whether it has been Ready for minReadySeconds (available).

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::jiff::Timestamp;

/// The pod's phase ("" when unset).
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Neither finished (Succeeded, Failed) nor being deleted.
pub fn is_active(pod: &Pod) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed") && pod.metadata.deletion_timestamp.is_none()
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

/// Now, to the second, as the API writes times (a finer time would never equal one read back).
pub fn now() -> Timestamp {
    Timestamp::from_second(chrono::Utc::now().timestamp()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
