//! Ingresses: rules of hosts and paths to backends, checked as kube-apiserver checks them
//! (every path says how it matches, every backend is one Service port or one resource), and
//! the class a new Ingress gets when it names none (the DefaultIngressClass admission).
//! Nothing here routes traffic: an ingress controller reads them.

use serde_json::{json, Value};

use crate::admission::{child, default};
use crate::error::{ApiError, Cause};
use crate::handler::{meta_str, Api, Target};
use crate::resources;
use crate::storage::{decode, Freshness};

use super::field::{
    dns_subdomain, invalid, items, not_supported, port_name, port_number, required, str_of,
};
use super::{Hook, Strategy};

pub struct Ingress;

/// The annotation that marks the IngressClass new Ingresses get by default.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
/// The class annotation older Ingresses use instead of `spec.ingressClassName`.
const CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

const PATH_TYPES: &[&str] = &["Exact", "ImplementationSpecific", "Prefix"];

impl Strategy for Ingress {
    fn defaults(&self, object: &mut Value) {
        if let Some(o) = object.as_object_mut() {
            default(child(o, "status"), "loadBalancer", json!({}));
        }
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let spec = object.get("spec");
        let rules = items(spec, "rules");
        let default_backend = spec.and_then(|s| s.get("defaultBackend"));
        if rules.is_empty() && default_backend.is_none() {
            causes.push(Cause {
                reason: "FieldValueInvalid",
                field: "spec".into(),
                message: "Invalid value: []networking.IngressRule(nil): either `defaultBackend` or `rules` must be specified".into(),
            });
        }
        if let Some(b) = default_backend {
            backend(b, "spec.defaultBackend", causes);
        }
        for (i, rule) in rules.iter().enumerate() {
            let at = format!("spec.rules[{i}]");
            host(&format!("{at}.host"), str_of(Some(rule), "host"), causes);
            if let Some(http) = rule.get("http") {
                let paths = items(Some(http), "paths");
                if paths.is_empty() {
                    causes.push(required(&format!("{at}.http.paths"), ""));
                }
                for (j, p) in paths.iter().enumerate() {
                    path(p, &format!("{at}.http.paths[{j}]"), causes);
                }
            }
        }
        for (i, tls) in items(spec, "tls").iter().enumerate() {
            for (j, h) in items(Some(tls), "hosts").iter().enumerate() {
                let h = h.as_str().unwrap_or("");
                let at = format!("spec.tls[{i}].hosts[{j}]");
                if h.contains('*') {
                    wildcard(&at, h, causes);
                } else {
                    dns_subdomain(&at, h, causes);
                }
            }
            let secret = str_of(Some(tls), "secretName");
            if !secret.is_empty() {
                dns_subdomain(&format!("spec.tls[{i}].secretName"), secret, causes);
            }
        }
        if let Some(class) = spec
            .and_then(|s| s.get("ingressClassName"))
            .and_then(Value::as_str)
        {
            dns_subdomain("spec.ingressClassName", class, causes);
        }
    }

    /// DefaultIngressClass: an Ingress that names no class (neither `ingressClassName` nor
    /// the older annotation) gets the class marked default.
    /// A new Ingress that names its class both ways names the same one.
    fn admit_create<'a>(&'a self, api: &'a Api, _t: &'a Target, ing: &'a mut Value) -> Hook<'a> {
        Box::pin(async move {
            let class_name = ing.pointer("/spec/ingressClassName");
            let annotation = ing
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(CLASS_ANNOTATION));
            if let Some(cause) = class_mismatch(annotation, class_name) {
                let name = meta_str(ing, "name").unwrap_or("");
                return Err(ApiError::invalid(
                    "networking.k8s.io",
                    "Ingress",
                    name,
                    vec![cause],
                ));
            }
            if class_name.is_some() || annotation.is_some() {
                return Ok(());
            }
            let marked = default_classes(api).await?;
            let name = meta_str(ing, "name").unwrap_or("").to_string();
            if let Some(class) = pick_default(&name, &marked)? {
                crate::value::set(ing, &["spec", "ingressClassName"], json!(class));
            }
            Ok(())
        })
    }
}

/// The annotation and `ingressClassName` name different classes (refused on create).
fn class_mismatch(annotation: Option<&Value>, class_name: Option<&Value>) -> Option<Cause> {
    match (annotation, class_name) {
        (Some(a), Some(c)) if a != c => Some(invalid(
            &format!("annotations.{CLASS_ANNOTATION}"),
            a,
            "must match `ingressClassName` when both are specified",
        )),
        _ => None,
    }
}

/// The IngressClasses marked default.
async fn default_classes(api: &Api) -> Result<Vec<String>, ApiError> {
    let res = resources::find("networking.k8s.io", "v1", "ingressclasses")
        .ok_or_else(|| ApiError::internal("ingressclasses are served"))?;
    let prefix = res.prefix(None);
    let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
    let (kvs, _, _) = api.store.range(&prefix, &end, 0, Freshness::Any).await?;
    let mut names = Vec::new();
    for kv in &kvs {
        let class = decode(kv)?.object;
        let marked = class
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
            .and_then(Value::as_str)
            == Some("true");
        if marked {
            names.push(meta_str(&class, "name").unwrap_or("").to_string());
        }
    }
    Ok(names)
}

/// The class a new Ingress that names none gets: the one marked default; none when no class
/// is, and a 403 in kube-apiserver's words when several are.
fn pick_default(ingress: &str, marked: &[String]) -> Result<Option<String>, ApiError> {
    match marked {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        several => Err(ApiError::forbidden(format!(
            "ingresses.networking.k8s.io \"{ingress}\" is forbidden: Internal error occurred: {} default IngressClasses were found, only 1 allowed",
            several.len()
        ))),
    }
}

/// A rule's host: a DNS name (a wildcard's first label may be `*`), never an IP address.
fn host(at: &str, h: &str, causes: &mut Vec<Cause>) {
    if h.is_empty() {
        return;
    }
    if h.parse::<std::net::IpAddr>().is_ok() {
        causes.push(invalid(
            at,
            &json!(h),
            "must be a DNS name, not an IP address",
        ));
    }
    if h.contains('*') {
        wildcard(at, h, causes);
    } else {
        dns_subdomain(at, h, causes);
    }
}

fn wildcard(at: &str, h: &str, causes: &mut Vec<Cause>) {
    let ok = h
        .strip_prefix("*.")
        .is_some_and(|rest| crate::admission::check_subdomain(rest).is_none());
    if !ok {
        causes.push(invalid(at, &json!(h), "a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character (e.g. '*.example.com', regex used for validation is '\\*\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"));
    }
}

/// One HTTP path: how it matches (required), the path itself, and its backend.
fn path(p: &Value, at: &str, causes: &mut Vec<Cause>) {
    let Some(ty) = p.get("pathType") else {
        causes.push(required(
            &format!("{at}.pathType"),
            "pathType must be specified",
        ));
        return;
    };
    let value = str_of(Some(p), "path");
    let path_at = format!("{at}.path");
    match ty.as_str().unwrap_or("") {
        "Exact" | "Prefix" => {
            if !value.starts_with('/') {
                causes.push(invalid(&path_at, &json!(value), "must be an absolute path"));
            }
            for seq in ["//", "/./", "/../", "%2f", "%2F"] {
                if value.contains(seq) {
                    causes.push(invalid(
                        &path_at,
                        &json!(value),
                        &format!("must not contain '{seq}'"),
                    ));
                }
            }
            for suffix in ["/..", "/."] {
                if value.ends_with(suffix) {
                    causes.push(invalid(
                        &path_at,
                        &json!(value),
                        &format!("cannot end with '{suffix}'"),
                    ));
                }
            }
        }
        "ImplementationSpecific" => {
            if !value.is_empty() && !value.starts_with('/') {
                causes.push(invalid(&path_at, &json!(value), "must be an absolute path"));
            }
        }
        _ => causes.push(not_supported(&format!("{at}.pathType"), ty, PATH_TYPES)),
    }
    backend(
        p.get("backend").unwrap_or(&Value::Null),
        &format!("{at}.backend"),
        causes,
    );
}

/// A backend: exactly one of a Service port and a resource.
fn backend(b: &Value, at: &str, causes: &mut Vec<Cause>) {
    let service = b.get("service");
    let resource = b.get("resource");
    match (service, resource) {
        (Some(_), Some(_)) => causes.push(invalid(
            at,
            &json!(""),
            "cannot set both resource and service backends",
        )),
        (None, Some(r)) => {
            for key in ["kind", "name"] {
                if str_of(Some(r), key).is_empty() {
                    causes.push(required(&format!("{at}.resource.{key}"), ""));
                }
            }
        }
        (Some(s), None) => {
            let name = str_of(Some(s), "name");
            if name.is_empty() {
                causes.push(required(&format!("{at}.service.name"), ""));
            } else if !is_dns1035_label(name) {
                causes.push(invalid(&format!("{at}.service.name"), &json!(name), "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"));
            }
            let port = s.get("port");
            let port_name_set = !str_of(port, "name").is_empty();
            let number = port.and_then(|p| p.get("number"));
            let number_set = number.is_some_and(|n| n.as_i64() != Some(0));
            match (port_name_set, number) {
                (true, _) if number_set => causes.push(invalid(
                    at,
                    &json!(""),
                    "cannot set both port name & port number",
                )),
                (true, _) => port_name(
                    &format!("{at}.service.port.name"),
                    str_of(port, "name"),
                    causes,
                ),
                (false, Some(n)) if number_set => {
                    port_number(&format!("{at}.service.port.number"), n, causes)
                }
                _ => causes.push(required(at, "port name or number is required")),
            }
        }
        (None, None) => causes.push(invalid(
            at,
            &json!(""),
            "resource or service backend is required",
        )),
    }
}

/// A Service's name as a backend names it (DNS-1035: starts with a letter).
fn is_dns1035_label(s: &str) -> bool {
    crate::admission::check_label(s).is_none() && s.starts_with(|c: char| c.is_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ingress(paths: Value) -> Value {
        json!({"metadata": {"name": "web"}, "spec": {"rules": [
            {"host": "example.com", "http": {"paths": paths}}]}})
    }

    fn svc(name: &str, port: Value) -> Value {
        json!({"service": {"name": name, "port": port}})
    }

    #[test]
    fn rules_paths_and_backends() {
        let ok = json!({"path": "/", "pathType": "Prefix", "backend": svc("web", json!({"number": 80}))});
        // (ingress, the (field, message) pairs refused)
        let cases: Vec<(Value, Vec<(&str, &str)>)> = vec![
            (ingress(json!([ok])), vec![]),
            (
                json!({"spec": {}}),
                vec![("spec", "Invalid value: []networking.IngressRule(nil): either `defaultBackend` or `rules` must be specified")],
            ),
            (
                ingress(json!([{"path": "/", "backend": svc("web", json!({"number": 80}))}])),
                vec![(
                    "spec.rules[0].http.paths[0].pathType",
                    "Required value: pathType must be specified",
                )],
            ),
            (
                ingress(json!([{"path": "api", "pathType": "Exact", "backend": svc("web", json!({"name": "http"}))}])),
                vec![(
                    "spec.rules[0].http.paths[0].path",
                    "Invalid value: \"api\": must be an absolute path",
                )],
            ),
            (
                ingress(json!([{"path": "/", "pathType": "Glob", "backend": svc("web", json!({"number": 80}))}])),
                vec![(
                    "spec.rules[0].http.paths[0].pathType",
                    "Unsupported value: \"Glob\": supported values: \"Exact\", \"ImplementationSpecific\", \"Prefix\"",
                )],
            ),
            (
                ingress(json!([{"path": "/", "pathType": "Prefix", "backend": {
                    "service": {"name": "web", "port": {"number": 80}},
                    "resource": {"kind": "Bucket", "name": "b"}}}])),
                vec![(
                    "spec.rules[0].http.paths[0].backend",
                    "Invalid value: \"\": cannot set both resource and service backends",
                )],
            ),
            (
                ingress(json!([{"path": "/", "pathType": "Prefix", "backend": svc("web", json!({}))}])),
                vec![(
                    "spec.rules[0].http.paths[0].backend",
                    "Required value: port name or number is required",
                )],
            ),
            (
                ingress(json!([{"path": "/", "pathType": "Prefix", "backend": svc("web", json!({"number": 70000}))}])),
                vec![(
                    "spec.rules[0].http.paths[0].backend.service.port.number",
                    "Invalid value: 70000: must be between 1 and 65535, inclusive",
                )],
            ),
            (
                json!({"spec": {"rules": [{"host": "10.0.0.1"}], "defaultBackend": svc("1web", json!({"number": 80}))}}),
                vec![
                    ("spec.defaultBackend.service.name", "Invalid value: \"1web\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"),
                    ("spec.rules[0].host", "Invalid value: \"10.0.0.1\": must be a DNS name, not an IP address"),
                ],
            ),
        ];
        for (object, want) in cases {
            let mut causes = Vec::new();
            Ingress.validate(&object, &mut causes);
            let got: Vec<(&str, &str)> = causes
                .iter()
                .map(|c| (c.field.as_str(), c.message.as_str()))
                .collect();
            assert_eq!(got, want, "{object}");
        }
    }

    #[test]
    fn wildcard_hosts() {
        let mut causes = Vec::new();
        host("h", "*.example.com", &mut causes);
        assert!(causes.is_empty(), "{causes:?}");
        host("h", "a.*.example.com", &mut causes);
        assert_eq!(causes.len(), 1);
    }

    #[test]
    fn the_class_annotation_matches_the_class_name() {
        assert!(class_mismatch(Some(&json!("nginx")), Some(&json!("nginx"))).is_none());
        assert!(class_mismatch(Some(&json!("nginx")), None).is_none());
        let c = class_mismatch(Some(&json!("nginx")), Some(&json!("traefik"))).unwrap();
        assert_eq!(
            (c.field.as_str(), c.message.as_str()),
            (
                "annotations.kubernetes.io/ingress.class",
                "Invalid value: \"nginx\": must match `ingressClassName` when both are specified"
            )
        );
    }

    #[test]
    fn at_most_one_default_class() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(pick_default("web", &[]).unwrap(), None);
        assert_eq!(
            pick_default("web", &names(&["nginx"])).unwrap(),
            Some("nginx".to_string())
        );
        let e = pick_default("web", &names(&["a", "b"])).unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(e.message, "ingresses.networking.k8s.io \"web\" is forbidden: Internal error occurred: 2 default IngressClasses were found, only 1 allowed");
    }

    #[test]
    fn status_starts_with_an_empty_load_balancer() {
        let mut ing = ingress(json!([]));
        Ingress.defaults(&mut ing);
        assert_eq!(ing["status"], json!({"loadBalancer": {}}));
    }
}
