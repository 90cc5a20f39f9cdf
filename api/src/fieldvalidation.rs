//! Server-side field validation (`?fieldValidation=Strict|Warn|Ignore`): unknown and duplicate
//! fields in a request body, found by walking the body against the kind's schema from
//! [`crate::openapi::schemas`].
//!
//! Kubernetes decodes bodies into typed structs and reports what did not fit, in document order:
//! `unknown field "spec.foo"` for a field the kind does not have, `json: duplicate field "a"`
//! for a field given twice (a JSON parser keeps only the last one, so the walk reads the raw
//! body). Strict rejects the request with a BadRequest listing them all after
//! `strict decoding error: `; Warn, the default, accepts it and answers one `Warning` header
//! each; Ignore says nothing. Maps (`additionalProperties`), free-form objects (schemas without
//! properties, such as RawExtension and FieldsV1) and `x-kubernetes-preserve-unknown-fields`
//! take any field.

use std::collections::HashSet;
use std::fmt;

use axum::body::Body;
use hyper::Response;
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::error::ApiError;
use crate::openapi::schemas::{schemas, Schemas};
use crate::query::Query;
use crate::resources::Resource;

/// What the client asked the server to do with unknown and duplicate fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Directive {
    Ignore,
    Warn,
    Strict,
}

impl Directive {
    /// `fieldValidation` from the query; Warn when it is absent, as in Kubernetes.
    pub fn from_query(q: &Query) -> Result<Directive, ApiError> {
        match q.get("fieldValidation") {
            None | Some("") | Some("Warn") => Ok(Directive::Warn),
            Some("Ignore") => Ok(Directive::Ignore),
            Some("Strict") => Ok(Directive::Strict),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }
}

/// One field that did not fit the kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    Unknown(String),
    Duplicate(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Unknown(p) => write!(f, "unknown field {p:?}"),
            Problem::Duplicate(p) => write!(f, "json: duplicate field {p:?}"),
        }
    }
}

/// How an object schema treats the fields of a value.
enum Shape<'a> {
    /// Only these fields.
    Fields(&'a serde_json::Map<String, Value>),
    /// Any field, each value with this schema (a map).
    MapOf(Option<&'a Value>),
    /// Any field, anything in it.
    Free,
}

/// Walks one value with its schema, collecting problems in document order.
struct Walk<'a> {
    schemas: &'a Schemas,
    schema: Option<&'a Value>,
    path: String,
    out: &'a mut Vec<Problem>,
}

impl<'a> Walk<'a> {
    fn shape(&self) -> Shape<'a> {
        let Some(s) = self.schema.and_then(|s| self.schemas.resolve(s)) else {
            return Shape::Free;
        };
        if s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
            return Shape::Free;
        }
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            return Shape::Fields(props);
        }
        match s.get("additionalProperties") {
            Some(ap @ Value::Object(_)) => Shape::MapOf(Some(ap)),
            _ => Shape::Free,
        }
    }

    fn items(&self) -> Option<&'a Value> {
        self.schema
            .and_then(|s| self.schemas.resolve(s))
            .and_then(|s| s.get("items"))
    }

    fn child(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_bytes<E>(self, _: &[u8]) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let items = self.items();
        let mut i = 0usize;
        loop {
            let walk = Walk {
                schemas: self.schemas,
                schema: items,
                path: format!("{}[{i}]", self.path),
                out: &mut *self.out,
            };
            if seq.next_element_seed(walk)?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let shape = self.shape();
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = self.child(&key);
            let first = seen.insert(key.clone());
            let child = match &shape {
                Shape::Fields(props) => match props.get(&key) {
                    Some(s) => Some(s),
                    None => {
                        if first {
                            self.out.push(Problem::Unknown(path.clone()));
                        }
                        None
                    }
                },
                Shape::MapOf(s) => *s,
                Shape::Free => None,
            };
            if !first {
                self.out.push(Problem::Duplicate(path.clone()));
            }
            map.next_value_seed(Walk {
                schemas: self.schemas,
                schema: child,
                path,
                out: &mut *self.out,
            })?;
        }
        Ok(())
    }
}

/// The definition a body for `res` (or its subresource `sub`) is decoded into.
fn body_kind(res: &Resource, sub: Option<&str>) -> (&'static str, &'static str, &'static str) {
    match sub {
        Some("scale") => ("autoscaling", "v1", "Scale"),
        Some("binding") => ("", "v1", "Binding"),
        Some("eviction") => ("policy", "v1", "Eviction"),
        _ => (res.group, res.version, res.kind),
    }
}

/// The problems of a raw JSON or YAML body, decoded into the definition `def` (none: only
/// duplicates). A body that does not parse has none: decoding it reports why.
pub fn problems(def: Option<&str>, body: &[u8], yaml: bool) -> Vec<Problem> {
    let s = schemas();
    let root = def.map(|d| serde_json::json!({ "$ref": format!("#/definitions/{d}") }));
    let mut out = Vec::new();
    let walk = Walk {
        schemas: s,
        schema: root.as_ref(),
        path: String::new(),
        out: &mut out,
    };
    let parsed = if yaml {
        walk.deserialize(serde_yaml::Deserializer::from_slice(body))
            .map_err(|_| ())
    } else {
        let mut d = serde_json::Deserializer::from_slice(body);
        walk.deserialize(&mut d).map_err(|_| ())
    };
    if parsed.is_err() {
        return Vec::new();
    }
    out
}

/// The unknown fields of a decoded object.
fn unknown_in(def: &str, object: &Value) -> Vec<Problem> {
    let s = schemas();
    let root = serde_json::json!({ "$ref": format!("#/definitions/{def}") });
    let mut out = Vec::new();
    let walk = Walk {
        schemas: s,
        schema: Some(&root),
        path: String::new(),
        out: &mut out,
    };
    if walk.deserialize(object).is_err() {
        return Vec::new();
    }
    out
}

fn decide(
    directive: Directive,
    problems: Vec<Problem>,
    wrap: impl FnOnce(String) -> String,
) -> Result<Vec<String>, ApiError> {
    if problems.is_empty() || directive == Directive::Ignore {
        return Ok(Vec::new());
    }
    let texts: Vec<String> = problems.iter().map(Problem::to_string).collect();
    match directive {
        Directive::Strict => Err(ApiError::bad_request(wrap(format!(
            "strict decoding error: {}",
            texts.join(", ")
        )))),
        _ => Ok(texts),
    }
}

/// Checks a create or update body for `res` (or its subresource `sub`). Returns the warnings
/// to answer with, or the BadRequest that Strict asks for.
pub fn check(
    res: &Resource,
    sub: Option<&str>,
    body: &[u8],
    content_type: &str,
    q: &Query,
) -> Result<Vec<String>, ApiError> {
    let directive = Directive::from_query(q)?;
    if directive == Directive::Ignore {
        return Ok(Vec::new());
    }
    let (group, version, kind) = body_kind(res, sub);
    let def = schemas().kind_def(group, version, kind);
    let yaml = content_type.split(';').next().map(str::trim) == Some("application/yaml");
    let found = problems(def, body, yaml);
    decide(directive, found, |m| {
        format!("{kind} in version {version:?} cannot be handled as a {kind}: {m}")
    })
}

/// Checks a decoded create or update body for `res` (or its subresource `sub`), as [`check`]
/// does its bytes: a decoded object has no duplicate fields, only unknown ones.
pub fn check_object(
    res: &Resource,
    sub: Option<&str>,
    object: &Value,
    q: &Query,
) -> Result<Vec<String>, ApiError> {
    let directive = Directive::from_query(q)?;
    if directive == Directive::Ignore {
        return Ok(Vec::new());
    }
    let (group, version, kind) = body_kind(res, sub);
    let found = match schemas().kind_def(group, version, kind) {
        Some(def) => unknown_in(def, object),
        None => Vec::new(),
    };
    decide(directive, found, |m| {
        format!("{kind} in version {version:?} cannot be handled as a {kind}: {m}")
    })
}

/// Checks a patch: duplicate fields in the patch itself (given its bytes), and fields of the
/// patched object that the kind does not have and the object did not have before the patch.
/// Strategic merge patch directives (`$patch`, `$setElementOrder/...`) are not fields.
pub fn check_patch(
    res: &Resource,
    sub: Option<&str>,
    patch: Option<&[u8]>,
    before: &Value,
    after: &Value,
    q: &Query,
) -> Result<Vec<String>, ApiError> {
    let directive = Directive::from_query(q)?;
    if directive == Directive::Ignore {
        return Ok(Vec::new());
    }
    let mut found = patch
        .map(|raw| problems(None, raw, false))
        .unwrap_or_default();
    let (group, version, kind) = body_kind(res, sub);
    if let Some(def) = schemas().kind_def(group, version, kind) {
        let old = unknown_in(def, before);
        found.extend(unknown_in(def, after).into_iter().filter(|p| {
            let Problem::Unknown(path) = p else {
                return true;
            };
            let last = path.rsplit('.').next().unwrap_or(path);
            !old.contains(p) && !last.starts_with('$')
        }));
    }
    decide(directive, found, |m| m)
}

/// Adds a `Warning: 299 - "..."` header for each warning.
pub fn with_warnings(mut resp: Response<Body>, warnings: &[String]) -> Response<Body> {
    for w in warnings {
        let quoted = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = format!("299 - \"{quoted}\"").parse() {
            resp.headers_mut().append("warning", v);
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::find;

    fn q(v: &str) -> Query {
        Query::parse(Some(&format!("fieldValidation={v}")))
    }

    fn deployment(extra_spec: &str, extra_container: &str) -> String {
        format!(
            r#"{{"apiVersion":"apps/v1","kind":"Deployment",
               "metadata":{{"name":"web","labels":{{"app":"web"}},"annotations":{{"a/b":"c"}}}},
               "spec":{{"replicas":2{extra_spec},"selector":{{"matchLabels":{{"app":"web"}}}},
                 "template":{{"metadata":{{"labels":{{"app":"web"}}}},
                   "spec":{{"containers":[{{"name":"c","image":"nginx"{extra_container},
                     "resources":{{"limits":{{"cpu":"1"}}}},"ports":[{{"containerPort":80}}]}}],
                     "nodeSelector":{{"disk":"ssd"}}}}}}}},
               "status":{{"replicas":0}}}}"#
        )
    }

    #[test]
    fn a_valid_object_has_no_problems() {
        let d = find("apps", "v1", "deployments").unwrap();
        let body = deployment("", "");
        assert_eq!(
            check(d, None, body.as_bytes(), "application/json", &q("Strict")).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn strict_names_every_unknown_field_in_order() {
        let d = find("apps", "v1", "deployments").unwrap();
        let body = deployment(r#","foo":1"#, r#","imagex":"x""#);
        let e = check(d, None, body.as_bytes(), "application/json", &q("Strict")).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(e.reason, "BadRequest");
        assert_eq!(
            e.message,
            "Deployment in version \"v1\" cannot be handled as a Deployment: strict decoding error: unknown field \"spec.foo\", unknown field \"spec.template.spec.containers[0].imagex\""
        );
    }

    #[test]
    fn warn_and_ignore() {
        let d = find("apps", "v1", "deployments").unwrap();
        let body = deployment(r#","foo":1"#, "");
        assert_eq!(
            check(d, None, body.as_bytes(), "", &q("Warn")).unwrap(),
            vec!["unknown field \"spec.foo\"".to_string()]
        );
        assert_eq!(
            check(d, None, body.as_bytes(), "", &Query::default()).unwrap(),
            vec!["unknown field \"spec.foo\"".to_string()]
        );
        assert!(check(d, None, body.as_bytes(), "", &q("Ignore"))
            .unwrap()
            .is_empty());
        assert_eq!(
            check(d, None, body.as_bytes(), "", &q("Loud"))
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn duplicates_are_found_in_the_raw_body() {
        let cm = find("", "v1", "configmaps").unwrap();
        let body = br#"{"a":1,"a":2,"metadata":{"name":"x","name":"y"},"data":{"k":"1","k":"2"}}"#;
        let e = check(cm, None, body, "application/json", &q("Strict")).unwrap_err();
        assert_eq!(
            e.message,
            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"a\", json: duplicate field \"a\", json: duplicate field \"metadata.name\", json: duplicate field \"data.k\""
        );
    }

    #[test]
    fn maps_and_free_form_objects_take_any_field() {
        let cr = find("apps", "v1", "controllerrevisions").unwrap();
        let body = br#"{"metadata":{"name":"r","managedFields":[{"fieldsV1":{"f:spec":{}}}]},"data":{"anything":{"goes":1}},"revision":1}"#;
        assert!(check(cr, None, body, "", &q("Strict")).unwrap().is_empty());
        let unknown_meta = br#"{"metadata":{"name":"r","nope":1},"revision":1}"#;
        assert_eq!(
            check(cr, None, unknown_meta, "", &q("Warn")).unwrap(),
            vec!["unknown field \"metadata.nope\"".to_string()]
        );
    }

    #[test]
    fn subresources_use_their_own_kind() {
        let d = find("apps", "v1", "deployments").unwrap();
        let scale = br#"{"kind":"Scale","apiVersion":"autoscaling/v1","metadata":{"name":"web"},"spec":{"replicas":3,"x":1}}"#;
        let e = check(d, Some("scale"), scale, "", &q("Strict")).unwrap_err();
        assert!(
            e.message
                .ends_with("strict decoding error: unknown field \"spec.x\""),
            "{}",
            e.message
        );
        let status = br#"{"metadata":{"name":"web"},"status":{"readyReplicas":1}}"#;
        assert!(check(d, Some("status"), status, "", &q("Strict"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn yaml_bodies_are_walked_too() {
        let pod = find("", "v1", "pods").unwrap();
        let body = b"metadata:\n  name: p\nspec:\n  containers:\n  - name: c\n    image: nginx\n    imagex: y\n";
        assert_eq!(
            check(pod, None, body, "application/yaml", &q("Warn")).unwrap(),
            vec!["unknown field \"spec.containers[0].imagex\"".to_string()]
        );
    }

    #[test]
    fn patches_report_only_what_they_add() {
        let d = find("apps", "v1", "deployments").unwrap();
        let before = serde_json::json!({"metadata": {"name": "web"}, "spec": {"old": 1}});
        let after = serde_json::json!({"metadata": {"name": "web"}, "spec": {"old": 1, "new": 2, "$setElementOrder/containers": []}});
        let patch = br#"{"spec":{"new":2,"new":2}}"#;
        let e = check_patch(d, None, Some(patch), &before, &after, &q("Strict")).unwrap_err();
        assert_eq!(
            e.message,
            "strict decoding error: json: duplicate field \"spec.new\", unknown field \"spec.new\""
        );
    }

    #[test]
    fn warnings_become_headers() {
        let r = with_warnings(
            Response::new(Body::empty()),
            &["unknown field \"spec.foo\"".into()],
        );
        assert_eq!(
            r.headers().get("warning").unwrap(),
            "299 - \"unknown field \\\"spec.foo\\\"\""
        );
    }
}
