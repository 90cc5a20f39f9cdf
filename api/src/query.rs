//! Query parameters of a request and the label and field selectors of lists and watches.

use serde_json::Value;

use crate::error::ApiError;

/// Decoded `?a=b&c=d` pairs.
#[derive(Debug, Default, Clone)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    pub fn parse(raw: Option<&str>) -> Query {
        Query {
            pairs: raw
                .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
                .unwrap_or_default(),
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a repeated parameter (`dryRun=All&dryRun=All`).
    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.pairs
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The same query with `key`'s values passed through `f`.
    pub fn map_value(&self, key: &str, f: impl Fn(&str) -> String) -> Query {
        Query {
            pairs: self
                .pairs
                .iter()
                .map(|(k, v)| (k.clone(), if k == key { f(v) } else { v.clone() }))
                .collect(),
        }
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | "True"))
    }

    pub fn int(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None | Some("") => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                ApiError::bad_request(format!("invalid value {v:?} for {key}: not an integer"))
            }),
        }
    }

    /// `dryRun=All` (the only value Kubernetes accepts).
    pub fn dry_run(&self) -> Result<bool, ApiError> {
        let mut dry = false;
        for v in self.all("dryRun") {
            if v != "All" {
                return Err(ApiError::bad_request(format!(
                    "Invalid dry run value: {v:?}; supported values: \"All\""
                )));
            }
            dry = true;
        }
        Ok(dry)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A label selector in Kubernetes' string form: `app=web,tier!=db,env in (a,b),!legacy`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    reqs: Vec<Requirement>,
}

pub fn valid_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-".contains(c))
    });
    name_ok && prefix_ok
}

/// Splits at commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn set_values(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, ApiError> {
        let bad = |part: &str, why: &str| {
            ApiError::bad_request(format!("unable to parse requirement: {part:?}: {why}"))
        };
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector { reqs });
        }
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                return Err(bad(part, "found '', expected: identifier"));
            }
            let req = if let Some(k) = part.strip_prefix('!') {
                Requirement::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Requirement::NotIn(
                    k.trim().into(),
                    set_values(rest).ok_or_else(|| bad(part, "expected a (value,...) set"))?,
                )
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Requirement::In(
                    k.trim().into(),
                    set_values(rest).ok_or_else(|| bad(part, "expected a (value,...) set"))?,
                )
            } else {
                Requirement::Exists(part.to_string())
            };
            let key = match &req {
                Requirement::Equals(k, _)
                | Requirement::NotEquals(k, _)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::NotExists(k) => k,
            };
            if !valid_label_key(key) {
                return Err(bad(part, "invalid label key"));
            }
            reqs.push(req);
        }
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, labels: Option<&serde_json::Map<String, Value>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }

    /// Matches an object by its `metadata.labels`.
    pub fn matches_object(&self, object: &Value) -> bool {
        self.matches(
            object
                .pointer("/metadata/labels")
                .and_then(Value::as_object),
        )
    }
}

/// A field selector: `metadata.name=x,spec.nodeName!=,status.phase=Running`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses a selector and checks each field is one the kind supports (as Kubernetes does:
    /// an unknown field is a 400).
    pub fn parse(s: &str, kind: &str) -> Result<FieldSelector, ApiError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector { reqs });
        }
        for part in s.split(',') {
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            if !field_supported(kind, field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches_object(&self, object: &Value) -> bool {
        self.reqs.iter().all(|(field, eq, want)| {
            let got = field_value(object, field);
            (got == *want) == *eq
        })
    }
}

/// The fields each kind can be selected by (Kubernetes' field label conversions).
fn field_supported(kind: &str, field: &str) -> bool {
    if matches!(field, "metadata.name" | "metadata.namespace") {
        return true;
    }
    match kind {
        "Pod" => matches!(
            field,
            "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "spec.hostNetwork"
                | "status.phase"
                | "status.podIP"
                | "status.nominatedNodeName"
        ),
        "Event" => {
            field.starts_with("involvedObject.")
                || matches!(
                    field,
                    "reason"
                        | "reportingComponent"
                        | "source"
                        | "type"
                        | "regarding.kind"
                        | "regarding.name"
                        | "regarding.namespace"
                        | "regarding.uid"
                )
        }
        "Node" => field == "spec.unschedulable",
        "Namespace" => field == "status.phase",
        "Secret" => field == "type",
        "ReplicaSet" | "ReplicationController" => field == "status.replicas",
        "CertificateSigningRequest" => field == "spec.signerName",
        _ => false,
    }
}

fn field_value(object: &Value, field: &str) -> String {
    let mut v = object;
    for part in field.split('.') {
        match v.get(part) {
            Some(next) => v = next,
            None => {
                // Unset booleans select as "false" (spec.hostNetwork, spec.unschedulable).
                return if matches!(field, "spec.hostNetwork" | "spec.unschedulable") {
                    "false".into()
                } else {
                    String::new()
                };
            }
        }
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let obj = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("app=web,tier=back", false),
            ("missing!=x", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches_object(&obj),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("a b c=d").is_err());
        assert!(LabelSelector::parse("x in a").is_err());
    }

    #[test]
    fn field_selectors() {
        let pod = json!({"metadata": {"name": "p", "namespace": "dev"},
                         "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let sel = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed", "Pod").unwrap();
        assert!(sel.matches_object(&pod));
        let unbound = FieldSelector::parse("spec.nodeName=", "Pod").unwrap();
        assert!(!unbound.matches_object(&pod));
        assert!(unbound.matches_object(&json!({"spec": {}})));
        assert!(FieldSelector::parse("spec.bogus=1", "Pod").is_err());
        assert!(FieldSelector::parse("metadata.name=x", "ConfigMap").is_ok());
    }
}
