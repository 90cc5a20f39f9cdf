//! CSINodes: the CSI drivers installed on a node (named as the node), each with its node ID,
//! volume limit and topology keys. A driver's entry is fixed once registered.

use serde_json::{json, Value};

use crate::error::Cause;

use super::field::{duplicate, invalid, items, required, str_of};
use super::Strategy;

pub struct CsiNode;

/// The longest node ID a CSINode driver entry takes.
const NODE_ID_MAX: usize = 192;

/// ValidateCSIDriverName: a driver's name is a DNS subdomain of at most 63 characters.
pub(crate) fn csi_driver_name(at: &str, name: &str, causes: &mut Vec<Cause>) {
    if name.is_empty() {
        causes.push(required(at, ""));
    }
    if name.len() > 63 {
        causes.push(Cause {
            reason: "FieldValueTooLong",
            field: at.into(),
            message: "Too long: may not be more than 63 bytes".into(),
        });
    }
    if let Some(message) = crate::admission::check_subdomain(&name.to_lowercase()) {
        causes.push(Cause {
            reason: "FieldValueInvalid",
            field: at.into(),
            message: message.replacen(
                &format!("{:?}", name.to_lowercase()),
                &format!("{name:?}"),
                1,
            ),
        });
    }
}

impl Strategy for CsiNode {
    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let mut names: Vec<&str> = Vec::new();
        for (i, d) in items(object.get("spec"), "drivers").iter().enumerate() {
            let at = format!("spec.drivers[{i}]");
            let name = str_of(Some(d), "name");
            csi_driver_name(&format!("{at}.name"), name, causes);
            let node_id = str_of(Some(d), "nodeID");
            if node_id.is_empty() {
                causes.push(required(&format!("{at}.nodeID"), ""));
            }
            if node_id.len() > NODE_ID_MAX {
                causes.push(invalid(
                    &format!("{at}.nodeID"),
                    &json!(node_id),
                    &format!("must be {NODE_ID_MAX} characters or less"),
                ));
            }
            if let Some(count) = d.pointer("/allocatable/count") {
                if count.as_i64().is_none_or(|c| c < 0) {
                    causes.push(invalid(
                        &format!("{at}.allocatable.count"),
                        count,
                        "must be greater than or equal to 0",
                    ));
                }
            }
            if names.contains(&name) {
                causes.push(duplicate(&format!("{at}.name"), &json!(name)));
            }
            names.push(name);
            let mut keys: Vec<&str> = Vec::new();
            for k in items(Some(d), "topologyKeys") {
                let key = k.as_str().unwrap_or("");
                if key.is_empty() {
                    causes.push(required(&at, ""));
                }
                if keys.contains(&key) {
                    causes.push(duplicate(&at, k));
                }
                keys.push(key);
            }
        }
    }

    /// A registered driver's entry may not change (drivers may come and go).
    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        let old = items(current.get("spec"), "drivers");
        for d in items(new.get("spec"), "drivers") {
            let name = str_of(Some(d), "name");
            if let Some(o) = old.iter().find(|o| str_of(Some(o), "name") == name) {
                if o != d {
                    causes.push(invalid("spec.drivers", d, "field is immutable"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(drivers: Value) -> Value {
        json!({"metadata": {"name": "n1"}, "spec": {"drivers": drivers}})
    }

    #[test]
    fn drivers_are_named_once_with_their_node_id() {
        // (drivers, the fields refused)
        let cases: Vec<(Value, Vec<&str>)> = vec![
            (
                json!([{"name": "hostpath.csi.k8s.io", "nodeID": "n1", "topologyKeys": ["topology.kubernetes.io/zone"]}]),
                vec![],
            ),
            (
                json!([{"name": "", "nodeID": "n1"}]),
                vec!["spec.drivers[0].name", "spec.drivers[0].name"],
            ),
            (json!([{"name": "d.io"}]), vec!["spec.drivers[0].nodeID"]),
            (
                json!([{"name": "d.io", "nodeID": "a"}, {"name": "d.io", "nodeID": "b"}]),
                vec!["spec.drivers[1].name"],
            ),
            (
                json!([{"name": "d.io", "nodeID": "a", "allocatable": {"count": -1}}]),
                vec!["spec.drivers[0].allocatable.count"],
            ),
        ];
        for (drivers, want) in cases {
            let mut causes = Vec::new();
            CsiNode.validate(&node(drivers), &mut causes);
            let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
            assert_eq!(fields, want, "{causes:?}");
        }
    }

    #[test]
    fn a_registered_driver_is_fixed() {
        let old = node(json!([{"name": "d.io", "nodeID": "a"}]));
        let mut causes = Vec::new();
        CsiNode.validate_update(
            &old,
            &node(json!([{"name": "d.io", "nodeID": "a"}, {"name": "e.io", "nodeID": "a"}])),
            &mut causes,
        );
        assert!(causes.is_empty());
        CsiNode.validate_update(
            &old,
            &node(json!([{"name": "d.io", "nodeID": "b"}])),
            &mut causes,
        );
        assert_eq!(causes[0].field, "spec.drivers");
    }
}
