//! StorageClasses: which provisioner makes a class's volumes, with what parameters, and when
//! (at once, or once a pod that uses the claim is scheduled). Defaults as Kubernetes fills them
//! (reclaimPolicy Delete, volumeBindingMode Immediate); the provisioner, its parameters and the
//! reclaim policy are fixed once made, as is the binding mode.

use serde_json::{json, Value};

use crate::admission::default;
use crate::error::Cause;

use super::field::{forbidden, invalid, not_supported, required, str_of};
use super::{immutable, Strategy};

pub struct StorageClass;

/// The annotation that marks the class claims get when they name none.
pub const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
/// The beta annotation Kubernetes still honours for the same.
pub const BETA_DEFAULT_CLASS_ANNOTATION: &str = "storageclass.beta.kubernetes.io/is-default-class";

const RECLAIM_POLICIES: &[&str] = &["Delete", "Retain"];
const BINDING_MODES: &[&str] = &["Immediate", "WaitForFirstConsumer"];

/// Whether a StorageClass is marked default (either annotation says "true").
pub fn is_default(class: &Value) -> bool {
    let annotations = class.pointer("/metadata/annotations");
    [DEFAULT_CLASS_ANNOTATION, BETA_DEFAULT_CLASS_ANNOTATION]
        .iter()
        .any(|a| annotations.and_then(|m| m.get(*a)).and_then(Value::as_str) == Some("true"))
}

impl Strategy for StorageClass {
    fn defaults(&self, object: &mut Value) {
        if let Some(o) = object.as_object_mut() {
            default(o, "reclaimPolicy", json!("Delete"));
            default(o, "volumeBindingMode", json!("Immediate"));
        }
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let provisioner = str_of(Some(object), "provisioner");
        if provisioner.is_empty() {
            causes.push(required("provisioner", ""));
        } else if !rkube_core::selector::valid_label_key(provisioner) {
            causes.push(invalid(
                "provisioner",
                &json!(provisioner),
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
            ));
        }
        for (key, supported) in [
            ("reclaimPolicy", RECLAIM_POLICIES),
            ("volumeBindingMode", BINDING_MODES),
        ] {
            match object.get(key) {
                None => causes.push(required(key, "")),
                Some(v) if !v.as_str().is_some_and(|s| supported.contains(&s)) => {
                    causes.push(not_supported(key, v, supported))
                }
                Some(_) => {}
            }
        }
        if let Some(params) = object.get("parameters").and_then(Value::as_object) {
            let size: usize = params
                .iter()
                .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
                .sum();
            if size > 256 * 1024 {
                causes.push(Cause {
                    reason: "FieldValueTooLong",
                    field: "parameters".into(),
                    message: format!("Too long: may not be more than {} bytes", 256 * 1024),
                });
            }
            if params.keys().any(String::is_empty) {
                causes.push(invalid_params());
            }
        }
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        let changed = |key: &str| current.get(key) != new.get(key);
        for key in ["parameters", "provisioner", "reclaimPolicy"] {
            if changed(key) {
                causes.push(forbidden(key, &format!("updates to {key} are forbidden.")));
            }
        }
        immutable("/volumeBindingMode", current, new, causes);
    }
}

fn invalid_params() -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: "parameters".into(),
        message: "Invalid value: \"\": field can not be empty.".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(extra: Value) -> Value {
        let mut c = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                           "metadata": {"name": "fast"}, "provisioner": "example.com/disk"});
        if let (Some(o), Some(e)) = (c.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        c
    }

    #[test]
    fn defaults_are_delete_and_immediate() {
        let mut c = class(json!({}));
        StorageClass.defaults(&mut c);
        assert_eq!(c["reclaimPolicy"], "Delete");
        assert_eq!(c["volumeBindingMode"], "Immediate");
        let mut c = class(json!({"reclaimPolicy": "Retain"}));
        StorageClass.defaults(&mut c);
        assert_eq!(c["reclaimPolicy"], "Retain");
    }

    #[test]
    fn validation_words_kubernetes_errors() {
        let cases = [
            (
                json!({"provisioner": ""}),
                vec!["provisioner: Required value"],
            ),
            (
                json!({"reclaimPolicy": "Recycle"}),
                vec![
                    r#"reclaimPolicy: Unsupported value: "Recycle": supported values: "Delete", "Retain""#,
                ],
            ),
            (
                json!({"volumeBindingMode": "Later"}),
                vec![
                    r#"volumeBindingMode: Unsupported value: "Later": supported values: "Immediate", "WaitForFirstConsumer""#,
                ],
            ),
            (json!({}), vec![]),
        ];
        for (extra, want) in cases {
            let mut c = class(extra);
            StorageClass.defaults(&mut c);
            let mut causes = Vec::new();
            StorageClass.validate(&c, &mut causes);
            let got: Vec<String> = causes
                .iter()
                .map(|c| format!("{}: {}", c.field, c.message))
                .collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn provisioner_parameters_and_policy_are_fixed() {
        let mut old = class(json!({"parameters": {"a": "1"}}));
        StorageClass.defaults(&mut old);
        let mut new = old.clone();
        new["provisioner"] = json!("other.io/x");
        new["parameters"] = json!({"a": "2"});
        new["reclaimPolicy"] = json!("Retain");
        new["volumeBindingMode"] = json!("WaitForFirstConsumer");
        let mut causes = Vec::new();
        StorageClass.validate_update(&old, &new, &mut causes);
        let got: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        assert_eq!(
            got,
            vec![
                "parameters: Forbidden: updates to parameters are forbidden.",
                "provisioner: Forbidden: updates to provisioner are forbidden.",
                "reclaimPolicy: Forbidden: updates to reclaimPolicy are forbidden.",
                r#"volumeBindingMode: Invalid value: "WaitForFirstConsumer": field is immutable"#,
            ]
        );
        // Annotations (the default mark) may change.
        let mut marked = old.clone();
        marked["metadata"]["annotations"] = json!({DEFAULT_CLASS_ANNOTATION: "true"});
        let mut causes = Vec::new();
        StorageClass.validate_update(&old, &marked, &mut causes);
        assert!(causes.is_empty());
        assert!(is_default(&marked));
        assert!(!is_default(&old));
    }
}
