//! Quantities as Kubernetes stores them. kube-apiserver decodes a body into Go types, where a
//! `resource.Quantity` keeps only its value and format, and encodes it back in canonical form:
//! a pod created with `cpu: 1000m` reads back `cpu: "1"`, `memory: 1024Mi` as `1Gi`, a number
//! (`cpu: 2`) as a string. The kind's schema says where its quantities are.

use std::collections::HashSet;
use std::sync::OnceLock;

use serde_json::Value;

use rkube_core::quantity::{canonical_quantity, parse_quantity, quantity_error};

use crate::error::ApiError;
use crate::openapi::schemas::{ref_name, schemas, Schemas};
use crate::resources::Resource;

const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";

/// The definitions that hold a quantity somewhere inside; the walk skips the others.
fn holding_quantities(s: &Schemas) -> &'static HashSet<String> {
    static HOLDING: OnceLock<HashSet<String>> = OnceLock::new();
    HOLDING.get_or_init(|| {
        s.defs
            .keys()
            .filter(|d| s.closure([d.as_str()]).contains(QUANTITY))
            .cloned()
            .collect()
    })
}

/// Writes every quantity of `object`, a `res`, in canonical form. A string that is not a
/// quantity is left for [`check`] to refuse.
pub fn canonicalize(res: &Resource, object: &mut Value) {
    let s = schemas();
    if let Some(def) = s.kind_def(res.group, res.version, res.kind) {
        walk_def(s, def, object, &mut canonical);
    }
}

/// Writes every quantity of `v`, a value of the named definition (such as
/// `io.k8s.api.core.v1.PodTemplateSpec`), in canonical form.
pub fn canonicalize_as(def: &str, v: &mut Value) {
    walk_def(schemas(), def, v, &mut canonical);
}

/// A quantity of `object` that is not one refuses the body, as kube-apiserver's decoding
/// does: `Pod in version "v1" cannot be handled as a Pod: quantities must match the regular
/// expression ...`.
pub fn check(res: &Resource, object: &Value) -> Result<(), ApiError> {
    let s = schemas();
    let Some(def) = s
        .kind_def(res.group, res.version, res.kind)
        .filter(|d| holding_quantities(s).contains(*d))
    else {
        return Ok(());
    };
    let mut object = object.clone();
    let mut bad = None;
    walk_def(s, def, &mut object, &mut |v| {
        if let Value::String(t) = v {
            if bad.is_none() && parse_quantity(t).is_none() {
                bad = Some(quantity_error(t));
            }
        }
    });
    match bad {
        None => Ok(()),
        Some(why) => Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: {why}",
            kind = res.kind,
            version = res.version
        ))),
    }
}

fn canonical(v: &mut Value) {
    let text = match v {
        Value::String(t) => t.clone(),
        Value::Number(n) => n.to_string(),
        _ => return,
    };
    if let Some(c) = canonical_quantity(&text) {
        *v = Value::String(c);
    }
}

fn walk_def(s: &Schemas, def: &str, v: &mut Value, visit: &mut dyn FnMut(&mut Value)) {
    if def == QUANTITY {
        return visit(v);
    }
    if !holding_quantities(s).contains(def) {
        return;
    }
    if let Some(schema) = s.defs.get(def) {
        walk(s, schema, v, visit);
    }
}

fn walk(s: &Schemas, schema: &Value, v: &mut Value, visit: &mut dyn FnMut(&mut Value)) {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        return walk_def(s, ref_name(r), v, visit);
    }
    if let Some([only]) = schema
        .get("allOf")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    {
        return walk(s, only, v, visit);
    }
    match v {
        Value::Object(fields) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let values = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, child) in fields.iter_mut() {
                if let Some(p) = props.and_then(|p| p.get(k)).or(values) {
                    walk(s, p, child, visit);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                items.iter_mut().for_each(|i| walk(s, item, i, visit));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resource(group: &str, plural: &str) -> &'static Resource {
        crate::resources::RESOURCES
            .iter()
            .find(|r| r.group == group && r.plural == plural)
            .expect("served")
    }

    #[test]
    fn typed_kinds_store_canonical_quantities() {
        let cases = [
            (
                resource("", "pods"),
                json!({"spec": {"containers": [{"name": "c", "resources": {
                    "requests": {"cpu": "1000m", "memory": "1024Mi"},
                    "limits": {"cpu": 2, "memory": "1.5Gi", "example.com/gpu": "1"}}}],
                  "overhead": {"cpu": "0.25"},
                  "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "2048Ki"}}]},
                  "status": {"phase": "Running"}}),
                json!({"spec": {"containers": [{"name": "c", "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    "limits": {"cpu": "2", "memory": "1536Mi", "example.com/gpu": "1"}}}],
                  "overhead": {"cpu": "250m"},
                  "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "2Mi"}}]},
                  "status": {"phase": "Running"}}),
            ),
            (
                resource("apps", "deployments"),
                json!({"spec": {"template": {"spec": {"containers": [{"name": "c",
                    "resources": {"requests": {"cpu": "0.5"}}}]}}}}),
                json!({"spec": {"template": {"spec": {"containers": [{"name": "c",
                    "resources": {"requests": {"cpu": "500m"}}}]}}}}),
            ),
            (
                resource("", "resourcequotas"),
                json!({"spec": {"hard": {"requests.memory": "1000M", "pods": "10"}}}),
                json!({"spec": {"hard": {"requests.memory": "1G", "pods": "10"}}}),
            ),
            (
                // Not a quantity: left for validation.
                resource("", "persistentvolumeclaims"),
                json!({"spec": {"resources": {"requests": {"storage": "lots"}}}}),
                json!({"spec": {"resources": {"requests": {"storage": "lots"}}}}),
            ),
            (
                // A ConfigMap's data looks like quantities but is not.
                resource("", "configmaps"),
                json!({"data": {"cpu": "1000m"}}),
                json!({"data": {"cpu": "1000m"}}),
            ),
        ];
        for (res, mut object, want) in cases {
            canonicalize(res, &mut object);
            assert_eq!(object, want, "{}", res.plural);
        }
    }

    #[test]
    fn a_string_that_is_no_quantity_refuses_the_body() {
        let pods = resource("", "pods");
        let pod = |cpu: &str| {
            json!({"spec": {"containers": [{"name": "c",
                "resources": {"requests": {"cpu": cpu}}}]}})
        };
        assert!(check(pods, &pod("250m")).is_ok());
        let e = check(pods, &pod("lots")).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "Pod in version \"v1\" cannot be handled as a Pod: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        );
        let e = check(pods, &pod("1mi")).unwrap_err();
        assert!(
            e.message.ends_with(": unable to parse quantity's suffix"),
            "{}",
            e.message
        );
        // A ConfigMap holds strings, not quantities.
        let cm = resource("", "configmaps");
        assert!(check(cm, &json!({"data": {"cpu": "lots"}})).is_ok());
    }
}
