//! Deployments: rollout defaults, a selector that matches the template and never changes.

use serde_json::{json, Value};

use crate::admission::{
    child, default, default_template, validate_label_selector, validate_replicas, validate_template,
};
use crate::error::Cause;

use super::{immutable, Strategy};

pub struct Deployment;

impl Strategy for Deployment {
    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        let spec = child(o, "spec");
        default(spec, "replicas", json!(1));
        default(spec, "revisionHistoryLimit", json!(10));
        default(spec, "progressDeadlineSeconds", json!(600));
        let strategy = child(spec, "strategy");
        default(strategy, "type", json!("RollingUpdate"));
        if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
            let ru = child(strategy, "rollingUpdate");
            default(ru, "maxUnavailable", json!("25%"));
            default(ru, "maxSurge", json!("25%"));
        }
        default_template(spec);
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        validate_replicas(object, causes);
        validate_label_selector(object, "Deployment", causes);
        validate_template(object, causes);
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        immutable("/spec/selector", current, new, causes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_is_immutable() {
        let old = json!({"spec": {"selector": {"matchLabels": {"app": "a"}}}});
        let new = json!({"spec": {"selector": {"matchLabels": {"app": "b"}}}});
        let mut causes = Vec::new();
        Deployment.validate_update(&old, &old, &mut causes);
        assert!(causes.is_empty());
        Deployment.validate_update(&old, &new, &mut causes);
        assert_eq!(causes[0].field, "spec.selector");
        assert!(causes[0].message.ends_with("field is immutable"));
    }
}
