//! Taints and tolerations: Kubernetes' matching, for the scheduler's filters and the node
//! lifecycle controller's evictions.

use serde_json::Value;

use crate::json::str_at as s;

/// Whether a toleration tolerates a taint (Kubernetes' matching: key, or empty key with
/// Exists; operator Equal compares values; an empty effect matches every effect).
pub fn tolerates(t: &Value, taint: &Value) -> bool {
    let effect_ok = s(t, "/effect").is_empty() || s(t, "/effect") == s(taint, "/effect");
    let key_ok = s(t, "/key").is_empty() || s(t, "/key") == s(taint, "/key");
    let value_ok = match s(t, "/operator") {
        "Exists" => true,
        _ => s(t, "/value") == s(taint, "/value"),
    };
    let empty_key_needs_exists = !s(t, "/key").is_empty() || s(t, "/operator") == "Exists";
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
            assert_eq!(tolerates(&t, &taint), want, "{t}");
        }
    }
}
