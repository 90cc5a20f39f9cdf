//! Label selectors, one implementation for every component: Kubernetes' string form
//! (`app=web,tier!=db,env in (a,b),!legacy`, as `?labelSelector=` carries it) and the
//! `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`) that workloads, services'
//! consumers, affinity terms and RBAC aggregation use.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelectorRequirement;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    /// A node selector's `Gt`/`Lt`: the label's value read as an integer, compared.
    Gt(String, i64),
    Lt(String, i64),
    /// A `matchExpressions` operator Kubernetes does not know: matches nothing.
    Never,
}

impl Requirement {
    /// The label key the requirement reads (none for [`Requirement::Never`]).
    fn key(&self) -> Option<&str> {
        match self {
            Requirement::Equals(k, _)
            | Requirement::NotEquals(k, _)
            | Requirement::In(k, _)
            | Requirement::NotIn(k, _)
            | Requirement::Exists(k)
            | Requirement::NotExists(k)
            | Requirement::Gt(k, _)
            | Requirement::Lt(k, _) => Some(k),
            Requirement::Never => None,
        }
    }
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
    /// Parses the string form; the error is Kubernetes' sentence for a bad selector
    /// (`unable to parse requirement: ...`).
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        let bad = |part: &str, why: &str| format!("unable to parse requirement: {part:?}: {why}");
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
            if !req.key().is_some_and(valid_label_key) {
                return Err(bad(part, "invalid label key"));
            }
            reqs.push(req);
        }
        Ok(LabelSelector { reqs })
    }

    /// A `metav1.LabelSelector`: `matchLabels` and `matchExpressions` (In, NotIn, Exists,
    /// DoesNotExist), all of which must hold. An unknown operator matches nothing.
    pub fn from_selector(selector: &metav1::LabelSelector) -> LabelSelector {
        let mut reqs = Vec::new();
        for (k, v) in selector.match_labels.iter().flatten() {
            reqs.push(Requirement::Equals(k.clone(), v.clone()));
        }
        for e in selector.match_expressions.iter().flatten() {
            let key = e.key.clone();
            let values = e.values.clone().unwrap_or_default();
            reqs.push(match e.operator.as_str() {
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::NotExists(key),
                _ => Requirement::Never,
            });
        }
        LabelSelector { reqs }
    }

    /// The requirements of a core/v1 NodeSelectorTerm (its `matchExpressions`, or its
    /// `matchFields`), all of which must hold: In, NotIn, Exists, DoesNotExist, and Gt/Lt,
    /// which compare the value as an integer with the one value given. An unknown operator,
    /// or a Gt/Lt value that is not an integer, matches nothing.
    pub fn from_node_selector_requirements(reqs: &[NodeSelectorRequirement]) -> LabelSelector {
        let reqs = reqs
            .iter()
            .map(|r| {
                let key = r.key.clone();
                let values = r.values.as_deref().unwrap_or(&[]);
                let number = || values.first().and_then(|v| v.parse::<i64>().ok());
                match r.operator.as_str() {
                    "In" => Requirement::In(key, values.to_vec()),
                    "NotIn" => Requirement::NotIn(key, values.to_vec()),
                    "Exists" => Requirement::Exists(key),
                    "DoesNotExist" => Requirement::NotExists(key),
                    "Gt" => number().map_or(Requirement::Never, |n| Requirement::Gt(key, n)),
                    "Lt" => number().map_or(Requirement::Never, |n| Requirement::Lt(key, n)),
                    _ => Requirement::Never,
                }
            })
            .collect();
        LabelSelector { reqs }
    }

    /// A `metav1.LabelSelector` still held as JSON, read as [`LabelSelector::from_selector`]
    /// reads the typed one. Anything but an object (absent, null) is the empty selector; an
    /// object that is not a LabelSelector (a label value that is not a string, say) matches
    /// nothing.
    pub fn from_json(selector: &Value) -> LabelSelector {
        if !selector.is_object() {
            return LabelSelector::default();
        }
        match metav1::LabelSelector::deserialize(selector) {
            Ok(typed) => LabelSelector::from_selector(&typed),
            Err(_) => LabelSelector {
                reqs: vec![Requirement::Never],
            },
        }
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, labels: Option<&serde_json::Map<String, Value>>) -> bool {
        self.matches_with(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }

    /// Matches labels as typed objects hold them (`metadata.labels`).
    pub fn matches_labels(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.matches_with(|k| labels.and_then(|l| l.get(k)).map(String::as_str))
    }

    /// Matches labels looked up by `get` (labels kept in another shape than JSON).
    pub fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.reqs.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
            Requirement::Gt(k, v) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *v),
            Requirement::Lt(k, v) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *v),
            Requirement::Never => false,
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
    fn objects_match_labels_and_expressions() {
        let labels = json!({"app": "web", "tier": "front"});
        let labels = labels.as_object();
        for (sel, want) in [
            (json!({}), true),
            (json!({"matchLabels": {"app": "web"}}), true),
            (json!({"matchLabels": {"app": "db"}}), false),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "db"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "gone", "operator": "DoesNotExist"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}),
                false,
            ),
            (
                json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["back"]}]}),
                false,
            ),
        ] {
            assert_eq!(
                LabelSelector::from_json(&sel).matches(labels),
                want,
                "{sel}"
            );
        }
        assert!(!LabelSelector::from_json(&json!({"matchLabels": {"app": "web"}})).matches(None));
        assert!(LabelSelector::from_json(&Value::Null).matches(None));
        assert!(!LabelSelector::from_json(&json!({"matchLabels": {"app": 1}})).matches(labels));
    }

    #[test]
    fn node_selector_requirements_compare_integers() {
        let labels: BTreeMap<String, String> = [("gen", "5"), ("disk", "ssd")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let req = |key: &str, op: &str, values: &[&str]| NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        };
        for (r, want) in [
            (req("disk", "In", &["ssd", "nvme"]), true),
            (req("disk", "NotIn", &["ssd"]), false),
            (req("gen", "Exists", &[]), true),
            (req("gen", "DoesNotExist", &[]), false),
            (req("gen", "Gt", &["4"]), true),
            (req("gen", "Lt", &["4"]), false),
            (req("gen", "Gt", &["four"]), false),
            (req("disk", "Gt", &["1"]), false),
            (req("missing", "Lt", &["9"]), false),
            (req("gen", "Near", &["5"]), false),
        ] {
            let sel = LabelSelector::from_node_selector_requirements(std::slice::from_ref(&r));
            assert_eq!(sel.matches_labels(Some(&labels)), want, "{r:?}");
        }
    }

    #[test]
    fn typed_selectors_match_typed_labels() {
        let labels: BTreeMap<String, String> = [("app", "web"), ("tier", "front")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let selector = |v: Value| {
            LabelSelector::from_selector(
                &serde_json::from_value::<metav1::LabelSelector>(v).unwrap(),
            )
        };
        for (sel, want) in [
            (json!({}), true),
            (json!({"matchLabels": {"app": "web"}}), true),
            (
                json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}),
                false,
            ),
        ] {
            assert_eq!(
                selector(sel.clone()).matches_labels(Some(&labels)),
                want,
                "{sel}"
            );
            assert_eq!(
                LabelSelector::from_json(&sel),
                selector(sel.clone()),
                "{sel}"
            );
        }
        assert!(!selector(json!({"matchLabels": {"app": "web"}})).matches_labels(None));
    }
}
