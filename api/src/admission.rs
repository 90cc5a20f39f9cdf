//! Admission: the defaults Kubernetes fills in (mutating), then the checks it makes before an
//! object is stored (validating). What every object gets (no nulls, a valid name, valid labels)
//! is here with the helpers kinds share (pod spec defaults and checks); what one kind adds is
//! its [`crate::strategy`].

use serde_json::{json, Map, Value};

use rkube_core::selector::LabelSelector;

use crate::error::{ApiError, Cause};
use crate::resources::Resource;

/// Sets `key` to `value` unless it is already set (and not null).
pub(crate) fn default(map: &mut Map<String, Value>, key: &str, value: Value) {
    match map.get(key) {
        Some(v) if !v.is_null() => {}
        _ => {
            map.insert(key.to_string(), value);
        }
    }
}

/// A child object, created empty when missing.
pub(crate) fn child<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    if !map.get(key).is_some_and(Value::is_object) {
        map.insert(key.to_string(), json!({}));
    }
    map.get_mut(key)
        .and_then(Value::as_object_mut)
        .expect("just inserted an object")
}

pub(crate) fn each_in<'a>(
    map: &'a mut Map<String, Value>,
    key: &str,
) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    map.get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

fn image_pull_policy(image: &str) -> &'static str {
    // The tag is after the last ':' of the last path segment; a digest pins the image.
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        return "IfNotPresent";
    }
    match last.rsplit_once(':') {
        None => "Always",
        Some((_, "latest")) => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn default_container(c: &mut Map<String, Value>) {
    let policy = image_pull_policy(c.get("image").and_then(Value::as_str).unwrap_or(""));
    default(c, "imagePullPolicy", json!(policy));
    default(c, "terminationMessagePath", json!("/dev/termination-log"));
    default(c, "terminationMessagePolicy", json!("File"));
    default(c, "resources", json!({}));
    for p in each_in(c, "ports") {
        default(p, "protocol", json!("TCP"));
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = c.get_mut(probe).and_then(Value::as_object_mut) {
            default(p, "timeoutSeconds", json!(1));
            default(p, "periodSeconds", json!(10));
            default(p, "successThreshold", json!(1));
            default(p, "failureThreshold", json!(3));
        }
    }
}

/// Defaults of a pod spec (pods and the templates of workloads).
pub fn default_pod_spec(spec: &mut Map<String, Value>) {
    default(spec, "restartPolicy", json!("Always"));
    default(spec, "terminationGracePeriodSeconds", json!(30));
    default(spec, "dnsPolicy", json!("ClusterFirst"));
    default(spec, "securityContext", json!({}));
    default(spec, "schedulerName", json!("default-scheduler"));
    default(spec, "enableServiceLinks", json!(true));
    default(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    default(spec, "priority", json!(0));
    for key in ["containers", "initContainers"] {
        for c in each_in(spec, key) {
            default_container(c);
        }
    }
    for v in each_in(spec, "volumes") {
        for kind in ["secret", "configMap", "downwardAPI"] {
            if let Some(src) = v.get_mut(kind).and_then(Value::as_object_mut) {
                default(src, "defaultMode", json!(420));
            }
        }
        crate::serviceaccount::default_projected(v);
    }
}

/// Defaults of a workload's pod template.
pub(crate) fn default_template(spec: &mut Map<String, Value>) {
    let template = child(spec, "template");
    child(template, "metadata");
    default_pod_spec(child(template, "spec"));
}

/// Applies the kind's defaults to a new or updated object.
pub fn defaults(res: &Resource, object: &mut Value) {
    let raw: Vec<(&str, Value)> = match object.as_object_mut() {
        Some(o) => res
            .strategy
            .raw_fields()
            .iter()
            .filter_map(|f| o.remove(*f).map(|v| (*f, v)))
            .collect(),
        None => Vec::new(),
    };
    strip_nulls(object);
    crate::quantities::canonicalize(res, object);
    if let Some(o) = object.as_object_mut() {
        o.extend(raw.into_iter().map(|(f, v)| (f.to_string(), v)));
    }
    res.strategy.defaults(object);
}

fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// Kubernetes' message when `name` is not a valid name for the kind, or None.
pub fn check_name(res: &Resource, name: &str) -> Option<String> {
    res.strategy.check_name(name)
}

/// The message when `name` is not a DNS label (names that become host names or DNS labels).
pub(crate) fn check_label(name: &str) -> Option<String> {
    (!is_dns1123_label(name)).then(|| format!(
        "Invalid value: {name:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
    ))
}

/// The message when `name` is not a DNS subdomain (what most kinds' names are).
pub(crate) fn check_subdomain(name: &str) -> Option<String> {
    (!is_dns1123_subdomain(name)).then(|| format!(
        "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    ))
}

pub(crate) fn required(field: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired",
        field: field.into(),
        message: "Required value".into(),
    }
}

pub(crate) fn invalid(field: &str, message: String) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: field.into(),
        message,
    }
}

fn validate_labels(object: &Value, causes: &mut Vec<Cause>) {
    for (what, path) in [
        ("labels", "/metadata/labels"),
        ("annotations", "/metadata/annotations"),
    ] {
        let Some(map) = object.pointer(path) else {
            continue;
        };
        let Some(map) = map.as_object() else {
            causes.push(invalid(
                &format!("metadata.{what}"),
                "must be a map of strings".into(),
            ));
            continue;
        };
        for (k, v) in map {
            if !rkube_core::selector::valid_label_key(k) {
                causes.push(invalid(
                    &format!("metadata.{what}"),
                    format!("Invalid value: {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
                ));
            }
            match v.as_str() {
                Some(s) if what == "labels" => {
                    let ok = s.is_empty()
                        || (s.len() <= 63
                            && s.chars()
                                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
                            && s.ends_with(|c: char| c.is_ascii_alphanumeric()));
                    if !ok {
                        causes.push(invalid(
                            "metadata.labels",
                            format!("Invalid value: {s:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
                        ));
                    }
                }
                Some(_) => {}
                None => causes.push(invalid(
                    &format!("metadata.{what}"),
                    format!("Invalid value: {k:?}: values must be strings"),
                )),
            }
        }
    }
}

pub(crate) fn validate_pod_spec(spec: Option<&Value>, at: &str, causes: &mut Vec<Cause>) {
    let containers = spec
        .and_then(|s| s.get("containers"))
        .and_then(Value::as_array);
    match containers {
        None => causes.push(required(&format!("{at}.containers"))),
        Some(cs) if cs.is_empty() => causes.push(required(&format!("{at}.containers"))),
        Some(cs) => {
            let mut seen = std::collections::HashSet::new();
            for (i, c) in cs.iter().enumerate() {
                let f = format!("{at}.containers[{i}]");
                match c.get("name").and_then(Value::as_str) {
                    None | Some("") => causes.push(required(&format!("{f}.name"))),
                    Some(n) => {
                        if !is_dns1123_label(n) {
                            causes.push(invalid(&format!("{f}.name"), format!("Invalid value: {n:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character")));
                        }
                        if !seen.insert(n.to_string()) {
                            causes.push(Cause {
                                reason: "FieldValueDuplicate",
                                field: format!("{f}.name"),
                                message: format!("Duplicate value: {n:?}"),
                            });
                        }
                    }
                }
                if c.get("image")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    causes.push(required(&format!("{f}.image")));
                }
            }
        }
    }
    if let Some(policy) = spec
        .and_then(|s| s.get("restartPolicy"))
        .and_then(Value::as_str)
    {
        if !["Always", "OnFailure", "Never"].contains(&policy) {
            causes.push(Cause {
                reason: "FieldValueNotSupported",
                field: format!("{at}.restartPolicy"),
                message: format!("Unsupported value: {policy:?}: supported values: \"Always\", \"OnFailure\", \"Never\""),
            });
        }
    }
}

/// Kubernetes decodes bodies into typed objects, where a JSON null is an absent field
/// (`creationTimestamp: null` in the templates kubectl sends); stored objects never keep one.
fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// A workload's replica count is not negative.
pub(crate) fn validate_replicas(object: &Value, causes: &mut Vec<Cause>) {
    if let Some(r) = object.get("spec").and_then(|s| s.get("replicas")) {
        if r.as_i64().is_none_or(|r| r < 0) {
            causes.push(invalid(
                "spec.replicas",
                format!("Invalid value: {r}: must be greater than or equal to 0"),
            ));
        }
    }
}

/// A workload's label selector is set, not empty, and selects its template (`kind` names it
/// in the message).
pub(crate) fn validate_label_selector(object: &Value, kind: &str, causes: &mut Vec<Cause>) {
    let template_labels = object.pointer("/spec/template/metadata/labels");
    match object.get("spec").and_then(|s| s.get("selector")) {
        None => causes.push(required("spec.selector")),
        Some(sel) => {
            let empty = sel
                .get("matchLabels")
                .and_then(Value::as_object)
                .is_none_or(|m| m.is_empty())
                && sel
                    .get("matchExpressions")
                    .and_then(Value::as_array)
                    .is_none_or(|m| m.is_empty());
            if empty {
                causes.push(invalid(
                    "spec.selector",
                    "Invalid value: {}: empty selector is invalid for deployment"
                        .replace("deployment", &kind.to_lowercase()),
                ));
            } else if !LabelSelector::from_json(sel)
                .matches(template_labels.and_then(Value::as_object))
            {
                causes.push(invalid(
                    "spec.template.metadata.labels",
                    format!(
                        "Invalid value: {}: `selector` does not match template `labels`",
                        template_labels.cloned().unwrap_or(json!({}))
                    ),
                ));
            }
        }
    }
}

/// A workload's pod template is a valid pod spec.
pub(crate) fn validate_template(object: &Value, causes: &mut Vec<Cause>) {
    validate_pod_spec(
        object.pointer("/spec/template/spec"),
        "spec.template.spec",
        causes,
    );
}

/// The keys of `data`, `binaryData` and `stringData` are config keys (ConfigMaps, Secrets).
pub(crate) fn validate_data_keys(object: &Value, causes: &mut Vec<Cause>) {
    for field in ["data", "binaryData", "stringData"] {
        for k in object
            .get(field)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
        {
            let ok = !k.is_empty()
                && k.len() <= 253
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !ok {
                causes.push(invalid(&format!("{field}[{k}]"), format!("Invalid value: {k:?}: a valid config key must consist of alphanumeric characters, '-', '_' or '.'")));
            }
        }
    }
}

/// Validates an object about to be stored; a non-empty list of causes is a 422.
pub fn validate(res: &Resource, object: &Value) -> Result<(), ApiError> {
    crate::quantities::check(res, object)?;
    let mut causes = Vec::new();
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if name.is_empty() {
        causes.push(Cause {
            reason: "FieldValueRequired",
            field: "metadata.name".into(),
            message: "Required value: name or generateName is required".into(),
        });
    } else if let Some(message) = check_name(res, name) {
        causes.push(invalid("metadata.name", message));
    }
    validate_labels(object, &mut causes);
    res.strategy.validate(object, &mut causes);
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(res.group, res.kind, name, causes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::find;

    #[test]
    fn nulls_are_dropped_except_in_raw_fields() {
        let template = json!({"$patch": "replace", "metadata": {"creationTimestamp": null}});
        let mut revision = json!({"metadata": {"name": "r", "labels": null},
            "data": {"spec": {"template": template.clone()}}, "revision": 1});
        defaults(
            find("apps", "v1", "controllerrevisions").unwrap(),
            &mut revision,
        );
        assert_eq!(revision["data"]["spec"]["template"], template);
        assert!(revision["metadata"].get("labels").is_none());
        let mut pod = json!({"metadata": {"name": "p", "creationTimestamp": null},
            "spec": {"containers": [{"name": "a", "image": "nginx"}]}});
        defaults(find("", "v1", "pods").unwrap(), &mut pod);
        assert!(pod["metadata"].get("creationTimestamp").is_none());
    }

    #[test]
    fn pod_defaults() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "nginx", "ports": [{"containerPort": 80}]},
            {"name": "b", "image": "busybox:1.36"}]}});
        defaults(find("", "v1", "pods").unwrap(), &mut pod);
        assert_eq!(pod["spec"]["restartPolicy"], "Always");
        assert_eq!(pod["spec"]["dnsPolicy"], "ClusterFirst");
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 30);
        assert_eq!(pod["spec"]["serviceAccountName"], "default");
        assert_eq!(pod["spec"]["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(
            pod["spec"]["containers"][1]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert_eq!(pod["spec"]["containers"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(pod["status"]["phase"], "Pending");
        assert_eq!(pod["status"]["qosClass"], "BestEffort");
    }

    #[test]
    fn nulls_are_absent_fields() {
        let res = find("apps", "v1", "deployments").unwrap();
        let mut d = json!({"metadata": {"name": "d", "labels": null}, "spec": {"replicas": null,
            "template": {"metadata": {"creationTimestamp": null, "labels": {"app": "a"}}}}});
        defaults(res, &mut d);
        assert!(d["metadata"].get("labels").is_none());
        assert_eq!(d["spec"]["replicas"], 1);
        assert!(d["spec"]["template"]["metadata"]
            .get("creationTimestamp")
            .is_none());
    }

    #[test]
    fn deployment_defaults_and_selector_check() {
        let res = find("apps", "v1", "deployments").unwrap();
        let mut d = json!({"metadata": {"name": "web"}, "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "c", "image": "nginx:1.25"}]}}}});
        defaults(res, &mut d);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
        assert_eq!(d["spec"]["progressDeadlineSeconds"], 600);
        validate(res, &d).unwrap();
        d["spec"]["selector"]["matchLabels"]["app"] = json!("other");
        let e = validate(res, &d).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message
                .contains("`selector` does not match template `labels`"),
            "{}",
            e.message
        );
    }

    #[test]
    fn names_and_missing_fields_are_422() {
        let res = find("", "v1", "pods").unwrap();
        let e = validate(res, &json!({"metadata": {"name": "Bad_Name"}, "spec": {}})).unwrap_err();
        assert_eq!(e.causes.len(), 2, "{:?}", e.causes);
        assert_eq!(e.causes[1].field, "spec.containers");
        let ns = find("", "v1", "namespaces").unwrap();
        assert!(check_name(ns, "a.b").is_some());
        assert!(check_name(res, "a.b").is_none());
    }
}
