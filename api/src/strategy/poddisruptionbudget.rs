//! PodDisruptionBudgets: how many of the selected pods a voluntary disruption (an eviction)
//! must leave running. Checked as kube-apiserver checks them: `minAvailable` or
//! `maxUnavailable` (not both), each a non-negative count or a percentage of at most 100%, a
//! valid selector, and a known unhealthy-pod eviction policy. The disruption controller keeps
//! the status; the eviction subresource reads it.

use serde_json::{json, Value};

use crate::auth::User;
use crate::error::{ApiError, Cause};

use super::daemonset::int_or_percent;
use super::field::{invalid, label_selector, not_supported};
use super::Strategy;

pub struct PodDisruptionBudget;

impl Strategy for PodDisruptionBudget {
    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let spec = object.get("spec");
        let min = spec.and_then(|s| s.get("minAvailable"));
        let max = spec.and_then(|s| s.get("maxUnavailable"));
        if min.is_some() && max.is_some() {
            causes.push(invalid(
                "spec",
                spec.unwrap_or(&Value::Null),
                "minAvailable and maxUnavailable cannot be both set",
            ));
        }
        for (name, v) in [("minAvailable", min), ("maxUnavailable", max)] {
            if let Some(v) = v {
                int_or_percent(&format!("spec.{name}"), v, causes);
            }
        }
        label_selector(
            "spec.selector",
            spec.and_then(|s| s.get("selector")),
            causes,
        );
        if let Some(p) = spec.and_then(|s| s.get("unhealthyPodEvictionPolicy")) {
            if !matches!(p.as_str(), Some("IfHealthyBudget" | "AlwaysAllow")) {
                causes.push(not_supported(
                    "spec.unhealthyPodEvictionPolicy",
                    p,
                    &["AlwaysAllow", "IfHealthyBudget"],
                ));
            }
        }
    }

    fn prepare_for_user(&self, _user: &User, object: &mut Value) -> Result<(), ApiError> {
        // A new budget's status is the controller's to compute, whatever the client sent
        // (Kubernetes' PrepareForCreate clears it).
        if let Some(o) = object.as_object_mut() {
            o.shift_remove("status");
        }
        self.defaults(object);
        Ok(())
    }

    fn defaults(&self, object: &mut Value) {
        // A budget not computed yet allows no disruption until the controller says so.
        if let Some(o) = object.as_object_mut() {
            let status = o.entry("status").or_insert_with(|| json!({}));
            if let Some(s) = status.as_object_mut() {
                s.entry("disruptionsAllowed").or_insert(json!(0));
                s.entry("currentHealthy").or_insert(json!(0));
                s.entry("desiredHealthy").or_insert(json!(0));
                s.entry("expectedPods").or_insert(json!(0));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (field, message) of each cause.
    fn causes(spec: Value) -> Vec<(String, String)> {
        let pdb = json!({"metadata": {"name": "web"}, "spec": spec});
        let mut c = Vec::new();
        PodDisruptionBudget.validate(&pdb, &mut c);
        c.into_iter().map(|c| (c.field, c.message)).collect()
    }

    #[test]
    fn a_new_budget_allows_no_disruption_until_computed() {
        let mut pdb = json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 1},
                             "status": {"disruptionsAllowed": 5, "expectedPods": 9}});
        let user = User::default();
        PodDisruptionBudget
            .prepare_for_user(&user, &mut pdb)
            .expect("prepared");
        assert_eq!(
            pdb["status"],
            json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0,
                   "expectedPods": 0})
        );
    }

    #[test]
    fn validation_is_kubernetes_one() {
        let sel = json!({"matchLabels": {"app": "web"}});
        let cases: &[(Value, &[(&str, &str)])] = &[
            (json!({"minAvailable": 1, "selector": sel}), &[]),
            (json!({"maxUnavailable": "50%", "selector": sel}), &[]),
            (json!({"minAvailable": "100%"}), &[]),
            (
                json!({"minAvailable": 1, "maxUnavailable": 1}),
                &[("spec", "minAvailable and maxUnavailable cannot be both set")],
            ),
            (
                json!({"minAvailable": -1}),
                &[("spec.minAvailable", "must be greater than or equal to 0")],
            ),
            (
                json!({"maxUnavailable": "120%"}),
                &[("spec.maxUnavailable", "must not be greater than 100%")],
            ),
            (
                json!({"minAvailable": "half"}),
                &[("spec.minAvailable", "a valid percent string")],
            ),
            (
                json!({"unhealthyPodEvictionPolicy": "Never"}),
                &[("spec.unhealthyPodEvictionPolicy", "Unsupported value")],
            ),
            (json!({"unhealthyPodEvictionPolicy": "AlwaysAllow"}), &[]),
            (
                json!({"selector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}),
                &[(
                    "spec.selector.matchExpressions[0].operator",
                    "not a valid selector operator",
                )],
            ),
        ];
        for (spec, want) in cases {
            let got = causes(spec.clone());
            assert_eq!(got.len(), want.len(), "{spec}: {got:?}");
            for ((field, message), (f, m)) in got.iter().zip(want.iter()) {
                assert_eq!(field, f, "{spec}");
                assert!(
                    message.contains(m),
                    "{spec}: {message} does not contain {m}"
                );
            }
        }
    }
}
