//! ReplicaSets: one replica by default, a selector that matches the template and never changes.

use serde_json::{json, Value};

use crate::admission::{
    child, default, default_template, validate_label_selector, validate_replicas, validate_template,
};
use crate::error::Cause;

use super::{immutable, Strategy};

pub struct ReplicaSet;

impl Strategy for ReplicaSet {
    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        let spec = child(o, "spec");
        default(spec, "replicas", json!(1));
        default_template(spec);
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        validate_replicas(object, causes);
        validate_label_selector(object, "ReplicaSet", causes);
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
    fn empty_selector_names_the_kind() {
        let rs = json!({"spec": {"selector": {}, "template": {"spec": {
            "containers": [{"name": "c", "image": "i"}]}}}});
        let mut causes = Vec::new();
        ReplicaSet.validate(&rs, &mut causes);
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(
            causes[0].message,
            "Invalid value: {}: empty selector is invalid for replicaset"
        );
    }
}
