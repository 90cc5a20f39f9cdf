//! Query parameters of a request and the label and field selectors of lists and watches.

use serde_json::Value;

use crate::error::ApiError;
pub use rkube_core::selector::LabelSelector;

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
