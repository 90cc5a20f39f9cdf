//! Taints and tolerations: Kubernetes' matching, for the scheduler's filters and the node
//! lifecycle controller's evictions.

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// Whether a toleration tolerates a taint (Kubernetes' matching: key, or empty key with
/// Exists; operator Equal compares values; an empty effect matches every effect).
pub fn tolerates_taint(t: &Toleration, taint: &Taint) -> bool {
    fn or_empty(o: &Option<String>) -> &str {
        o.as_deref().unwrap_or("")
    }
    let (key, operator, effect) = (or_empty(&t.key), or_empty(&t.operator), or_empty(&t.effect));
    let effect_ok = effect.is_empty() || effect == taint.effect;
    let key_ok = key.is_empty() || key == taint.key;
    let value_ok = match operator {
        "Exists" => true,
        _ => or_empty(&t.value) == or_empty(&taint.value),
    };
    let empty_key_needs_exists = !key.is_empty() || operator == "Exists";
    effect_ok && key_ok && value_ok && empty_key_needs_exists
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubernetes_matching() {
        let taint = json!({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"});
        for (t, want) in [
            (
                json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists"}),
                true,
            ),
            (json!({"operator": "Exists"}), true),
            (
                json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoSchedule"}),
                false,
            ),
            (json!({"key": "other", "operator": "Exists"}), false),
            (
                json!({"key": "node.kubernetes.io/unreachable", "value": "x"}),
                false,
            ),
            (
                json!({"key": "node.kubernetes.io/unreachable", "value": ""}),
                true,
            ),
            (json!({"value": ""}), false),
        ] {
            let typed: Toleration = serde_json::from_value(t.clone()).unwrap();
            let typed_taint: Taint = serde_json::from_value(taint.clone()).unwrap();
            assert_eq!(tolerates_taint(&typed, &typed_taint), want, "{t}");
        }
    }
}
