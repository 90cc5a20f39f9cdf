//! A job's pod failure policy: the first rule that matches a failed pod (by its containers'
//! exit codes or by its conditions) says what the failure does.

use k8s_openapi::api::batch::v1::{JobSpec, PodFailurePolicyRule};
use k8s_openapi::api::core::v1::Pod;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyAction {
    FailJob,
    FailIndex,
    Ignore,
    Count,
}

/// The action of the first rule matching the failed `pod`, with Kubernetes' message for it.
pub fn match_policy(spec: &JobSpec, pod: &Pod) -> Option<(PolicyAction, String)> {
    let rules = &spec.pod_failure_policy.as_ref()?.rules;
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    for (i, rule) in rules.iter().enumerate() {
        let action = match rule.action.as_str() {
            "FailJob" => PolicyAction::FailJob,
            "FailIndex" => PolicyAction::FailIndex,
            "Ignore" => PolicyAction::Ignore,
            "Count" => PolicyAction::Count,
            _ => continue,
        };
        if let Some((container, code)) = exit_code_match(rule, pod) {
            let message = format!(
                "Container {container} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {i}",
                rule.action
            );
            return Some((action, message));
        }
        if let Some(ty) = condition_match(rule, pod) {
            let message = format!(
                "Pod {ns}/{name} has condition {ty} matching {} rule at index {i}",
                rule.action
            );
            return Some((action, message));
        }
    }
    None
}

/// The first terminated container (init containers too) whose exit code the rule names.
fn exit_code_match(rule: &PodFailurePolicyRule, pod: &Pod) -> Option<(String, i32)> {
    let req = rule.on_exit_codes.as_ref()?;
    let status = pod.status.as_ref()?;
    let all = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for c in all {
        if req.container_name.as_ref().is_some_and(|n| *n != c.name) {
            continue;
        }
        let Some(code) = c
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code)
        else {
            continue;
        };
        if code == 0 {
            continue;
        }
        let listed = req.values.contains(&code);
        let hit = match req.operator.as_str() {
            "In" => listed,
            "NotIn" => !listed,
            _ => false,
        };
        if hit {
            return Some((c.name.clone(), code));
        }
    }
    None
}

fn condition_match(rule: &PodFailurePolicyRule, pod: &Pod) -> Option<String> {
    let patterns = rule.on_pod_conditions.as_ref()?;
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    patterns.iter().find_map(|p| {
        let want = if p.status.is_empty() {
            "True"
        } else {
            p.status.as_str()
        };
        conditions
            .iter()
            .any(|c| c.type_ == p.type_ && c.status == want)
            .then(|| p.type_.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_match_in_order() {
        let spec: JobSpec = serde_json::from_value(json!({"template": {}, "podFailurePolicy": {
            "rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "FailJob", "onExitCodes": {"containerName": "main",
                    "operator": "In", "values": [42]}},
                {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [1]}}]}}))
        .unwrap();
        let pod = |code: i32, conditions: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"},
                "status": {"phase": "Failed", "conditions": conditions,
                    "containerStatuses": [{"name": "main", "image": "i", "imageID": "",
                        "ready": false, "restartCount": 0,
                        "state": {"terminated": {"exitCode": code}}}]}}))
            .unwrap()
        };
        let (action, message) = match_policy(&spec, &pod(42, json!([]))).unwrap();
        assert_eq!(action, PolicyAction::FailJob);
        assert_eq!(
            message,
            "Container main for pod ns/p failed with exit code 42 matching FailJob rule at index 1"
        );
        let disrupted = json!([{"type": "DisruptionTarget", "status": "True"}]);
        assert_eq!(
            match_policy(&spec, &pod(42, disrupted)).unwrap().0,
            PolicyAction::Ignore
        );
        assert_eq!(
            match_policy(&spec, &pod(3, json!([]))).unwrap().0,
            PolicyAction::Count
        );
        assert!(match_policy(&spec, &pod(1, json!([]))).is_none());
    }
}
