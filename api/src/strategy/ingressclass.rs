//! IngressClasses: which controller implements a class of Ingresses (a domain-prefixed path,
//! fixed once set) and the parameters it reads.

use serde_json::{json, Value};

use crate::admission::{check_label, default};
use crate::error::Cause;

use super::field::{
    dns_subdomain, domain_prefixed_path, forbidden, not_supported, required, str_of, too_long,
};
use super::{immutable, Strategy};

pub struct IngressClass;

const MAX_CONTROLLER: usize = 250;

impl Strategy for IngressClass {
    fn defaults(&self, object: &mut Value) {
        // Parameters without a scope are the cluster's.
        if let Some(p) = object
            .pointer_mut("/spec/parameters")
            .and_then(Value::as_object_mut)
        {
            default(p, "scope", json!("Cluster"));
        }
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let spec = object.get("spec");
        let controller = str_of(spec, "controller");
        if controller.is_empty() {
            causes.push(required("spec.controller", ""));
        } else {
            if controller.len() > MAX_CONTROLLER {
                causes.push(too_long("spec.controller", MAX_CONTROLLER));
            }
            domain_prefixed_path("spec.controller", controller, causes);
        }
        if let Some(p) = spec.and_then(|s| s.get("parameters")) {
            parameters(p, causes);
        }
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        immutable("/spec/controller", current, new, causes);
    }
}

fn parameters(p: &Value, causes: &mut Vec<Cause>) {
    let at = "spec.parameters";
    if let Some(group) = p.get("apiGroup").and_then(Value::as_str) {
        dns_subdomain(&format!("{at}.apiGroup"), group, causes);
    }
    for key in ["kind", "name"] {
        if str_of(Some(p), key).is_empty() {
            causes.push(required(&format!("{at}.{key}"), ""));
        }
    }
    let namespace = p.get("namespace").and_then(Value::as_str);
    match p.get("scope") {
        None => causes.push(required(&format!("{at}.scope"), "")),
        Some(scope) => match scope.as_str() {
            Some("Namespace") => match namespace {
                None => causes.push(required(
                    &format!("{at}.namespace"),
                    "`parameters.scope` is set to 'Namespace'",
                )),
                Some(ns) => {
                    if let Some(message) = check_label(ns) {
                        causes.push(Cause {
                            reason: "FieldValueInvalid",
                            field: format!("{at}.namespace"),
                            message,
                        });
                    }
                }
            },
            Some("Cluster") => {
                if namespace.is_some() {
                    causes.push(forbidden(
                        &format!("{at}.namespace"),
                        "`parameters.scope` is set to 'Cluster'",
                    ));
                }
            }
            _ => causes.push(not_supported(
                &format!("{at}.scope"),
                scope,
                &["Cluster", "Namespace"],
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_and_parameters() {
        // (spec, the fields refused)
        let cases: Vec<(Value, Vec<&str>)> = vec![
            (json!({"controller": "k8s.io/ingress-nginx"}), vec![]),
            (json!({}), vec!["spec.controller"]),
            (json!({"controller": "nginx"}), vec!["spec.controller"]),
            (
                json!({"controller": "example.com/c", "parameters": {"kind": "Cfg", "name": "x"}}),
                vec![],
            ),
            (
                json!({"controller": "example.com/c", "parameters": {"kind": "Cfg", "name": "x", "scope": "Namespace"}}),
                vec!["spec.parameters.namespace"],
            ),
            (
                json!({"controller": "example.com/c", "parameters": {"kind": "Cfg", "name": "x", "namespace": "a"}}),
                vec!["spec.parameters.namespace"],
            ),
        ];
        for (spec, want) in cases {
            let mut ic = json!({"metadata": {"name": "c"}, "spec": spec});
            IngressClass.defaults(&mut ic);
            let mut causes = Vec::new();
            IngressClass.validate(&ic, &mut causes);
            let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
            assert_eq!(fields, want, "{ic}");
        }
    }

    #[test]
    fn the_controller_is_fixed() {
        let old = json!({"spec": {"controller": "example.com/a"}});
        let mut causes = Vec::new();
        IngressClass.validate_update(
            &old,
            &json!({"spec": {"controller": "example.com/b"}}),
            &mut causes,
        );
        assert_eq!(causes[0].field, "spec.controller");
        assert_eq!(
            causes[0].message,
            "Invalid value: \"example.com/b\": field is immutable"
        );
    }
}
