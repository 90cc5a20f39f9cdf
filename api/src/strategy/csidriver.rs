//! CSIDrivers: how Kubernetes talks to a CSI volume driver (whether volumes attach, what pod
//! information a mount gets). Defaults as Kubernetes fills them; attachment and lifecycle
//! modes are fixed once set.

use serde_json::{json, Value};

use crate::admission::{child, default};
use crate::error::Cause;

use super::field::{duplicate, invalid, items, not_supported, required};
use super::{immutable, Strategy};

pub struct CsiDriver;

const FS_GROUP_POLICIES: &[&str] = &["File", "None", "ReadWriteOnceWithFSType"];

impl Strategy for CsiDriver {
    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        let spec = child(o, "spec");
        default(spec, "attachRequired", json!(true));
        default(spec, "podInfoOnMount", json!(false));
        default(spec, "storageCapacity", json!(false));
        default(spec, "fsGroupPolicy", json!("ReadWriteOnceWithFSType"));
        default(spec, "requiresRepublish", json!(false));
        default(spec, "seLinuxMount", json!(false));
        if spec
            .get("volumeLifecycleModes")
            .and_then(Value::as_array)
            .is_none_or(|m| m.is_empty())
        {
            spec.insert("volumeLifecycleModes".into(), json!(["Persistent"]));
        }
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let spec = object.get("spec");
        // Kubernetes' field path says attachedRequired.
        for (key, at) in [
            ("attachRequired", "spec.attachedRequired"),
            ("podInfoOnMount", "spec.podInfoOnMount"),
            ("storageCapacity", "spec.storageCapacity"),
            ("seLinuxMount", "spec.seLinuxMount"),
        ] {
            if spec.and_then(|s| s.get(key)).is_none() {
                causes.push(required(at, ""));
            }
        }
        if let Some(p) = spec.and_then(|s| s.get("fsGroupPolicy")) {
            if !p.as_str().is_some_and(|p| FS_GROUP_POLICIES.contains(&p)) {
                causes.push(not_supported("spec.fsGroupPolicy", p, FS_GROUP_POLICIES));
            }
        }
        for m in items(spec, "volumeLifecycleModes") {
            if !matches!(m.as_str(), Some("Persistent" | "Ephemeral")) {
                causes.push(not_supported(
                    "spec.volumeLifecycleModes",
                    m,
                    &["Persistent", "Ephemeral"],
                ));
            }
        }
        let mut audiences = Vec::new();
        for (i, t) in items(spec, "tokenRequests").iter().enumerate() {
            let at = format!("spec.tokenRequests[{i}]");
            let audience = t.get("audience").cloned().unwrap_or(json!(""));
            if audiences.contains(&audience) {
                causes.push(duplicate(&format!("{at}.audience"), &audience));
                continue;
            }
            audiences.push(audience);
            if let Some(secs) = t.get("expirationSeconds") {
                let n = secs.as_i64().unwrap_or(0);
                if n < 600 {
                    causes.push(invalid(
                        &format!("{at}.expirationSeconds"),
                        secs,
                        "may not specify a duration less than 10 minutes",
                    ));
                }
                if n > 1 << 32 {
                    causes.push(invalid(
                        &format!("{at}.expirationSeconds"),
                        secs,
                        "may not specify a duration larger than 2^32 seconds",
                    ));
                }
            }
        }
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        let before = causes.len();
        immutable("/spec/attachRequired", current, new, causes);
        for c in &mut causes[before..] {
            c.field = "spec.attachedRequired".into();
        }
        immutable("/spec/volumeLifecycleModes", current, new, causes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_then_checks() {
        let mut d = json!({"metadata": {"name": "hostpath.csi.k8s.io"}});
        CsiDriver.defaults(&mut d);
        assert_eq!(
            d["spec"],
            json!({"attachRequired": true, "podInfoOnMount": false, "storageCapacity": false,
                   "fsGroupPolicy": "ReadWriteOnceWithFSType", "requiresRepublish": false,
                   "seLinuxMount": false, "volumeLifecycleModes": ["Persistent"]})
        );
        // (spec changes, the fields refused)
        let cases: Vec<(Value, Vec<&str>)> = vec![
            (json!({}), vec![]),
            (json!({"fsGroupPolicy": "Any"}), vec!["spec.fsGroupPolicy"]),
            (
                json!({"volumeLifecycleModes": ["Forever"]}),
                vec!["spec.volumeLifecycleModes"],
            ),
            (
                json!({"tokenRequests": [{"audience": "a", "expirationSeconds": 60}, {"audience": "a"}]}),
                vec![
                    "spec.tokenRequests[0].expirationSeconds",
                    "spec.tokenRequests[1].audience",
                ],
            ),
        ];
        for (change, want) in cases {
            let mut o = d.clone();
            for (k, v) in change.as_object().unwrap() {
                o["spec"][k] = v.clone();
            }
            let mut causes = Vec::new();
            CsiDriver.validate(&o, &mut causes);
            let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
            assert_eq!(fields, want, "{o}");
        }
        let mut changed = d.clone();
        changed["spec"]["attachRequired"] = json!(false);
        let mut causes = Vec::new();
        CsiDriver.validate_update(&d, &changed, &mut causes);
        assert_eq!(causes[0].field, "spec.attachedRequired");
        assert_eq!(
            causes[0].message,
            "Invalid value: false: field is immutable"
        );
    }
}
