//! PriorityClasses: pods of a class preempt lower ones unless it says Never.

use serde_json::{json, Value};

use crate::admission::default;

use super::Strategy;

pub struct PriorityClass;

impl Strategy for PriorityClass {
    fn defaults(&self, object: &mut Value) {
        if let Some(o) = object.as_object_mut() {
            default(o, "preemptionPolicy", json!("PreemptLowerPriority"));
        }
    }
}
