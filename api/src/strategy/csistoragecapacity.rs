//! CSIStorageCapacities: how much a storage class can still provision in a topology segment,
//! published by CSI drivers for the scheduler. The class and the segment are fixed once set.

use serde_json::Value;

use crate::error::Cause;

use super::field::{dns_subdomain, label_selector, str_of};
use super::{immutable, Strategy};

pub struct CsiStorageCapacity;

impl Strategy for CsiStorageCapacity {
    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        label_selector("nodeTopology", object.get("nodeTopology"), causes);
        dns_subdomain(
            "storageClassName",
            str_of(Some(object), "storageClassName"),
            causes,
        );
        for key in ["capacity", "maximumVolumeSize"] {
            if let Some(q) = object.get(key).and_then(Value::as_str) {
                if q.starts_with('-') {
                    causes.push(super::field::invalid(
                        key,
                        &Value::String(q.into()),
                        "must be greater than or equal to 0",
                    ));
                }
            }
        }
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        immutable("/nodeTopology", current, new, causes);
        immutable("/storageClassName", current, new, causes);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn class_and_segment() {
        // (object, the fields refused)
        let cases: Vec<(Value, Vec<&str>)> = vec![
            (
                json!({"storageClassName": "local-path", "capacity": "10Gi"}),
                vec![],
            ),
            (json!({}), vec!["storageClassName"]),
            (
                json!({"storageClassName": "fast", "capacity": "-1Gi"}),
                vec!["capacity"],
            ),
        ];
        for (object, want) in cases {
            let mut causes = Vec::new();
            CsiStorageCapacity.validate(&object, &mut causes);
            let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
            assert_eq!(fields, want, "{object}");
        }
        let mut causes = Vec::new();
        CsiStorageCapacity.validate_update(
            &json!({"storageClassName": "a"}),
            &json!({"storageClassName": "b"}),
            &mut causes,
        );
        assert_eq!(causes[0].field, "storageClassName");
    }
}
