//! One PolicyRule, and whether it allows a request.

use serde_json::{json, Value};

use super::{Attributes, Target};

/// One PolicyRule.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

pub(crate) fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

impl Rule {
    pub fn from_json(v: &Value) -> Rule {
        Rule {
            verbs: strings(v.get("verbs")),
            api_groups: strings(v.get("apiGroups")),
            resources: strings(v.get("resources")),
            resource_names: strings(v.get("resourceNames")),
            non_resource_urls: strings(v.get("nonResourceURLs")),
        }
    }

    pub fn to_json(&self) -> Value {
        let mut o = serde_json::Map::new();
        o.insert("verbs".into(), json!(self.verbs));
        for (k, v) in [
            ("apiGroups", &self.api_groups),
            ("resources", &self.resources),
            ("resourceNames", &self.resource_names),
            ("nonResourceURLs", &self.non_resource_urls),
        ] {
            if !v.is_empty() {
                o.insert(k.into(), json!(v));
            }
        }
        Value::Object(o)
    }

    fn verb_matches(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == "*" || v == verb)
    }

    /// Whether the rule allows the request, by Kubernetes' matching rules: `*` matches any
    /// verb, group or resource; `*/sub` any resource's subresource `sub`; resourceNames, when
    /// present, only the named objects; a nonResourceURL ending in `*` every path it prefixes.
    pub fn allows(&self, a: &Attributes) -> bool {
        if !self.verb_matches(&a.verb) {
            return false;
        }
        match &a.target {
            Target::NonResource { path } => self.non_resource_urls.iter().any(|u| {
                u == "*" || u == path || u.strip_suffix('*').is_some_and(|p| path.starts_with(p))
            }),
            Target::Resource {
                group,
                resource,
                subresource,
                name,
                ..
            } => {
                let group_ok = self.api_groups.iter().any(|g| g == "*" || g == group);
                let combined = if subresource.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}/{subresource}")
                };
                let resource_ok = self.resources.iter().any(|r| {
                    r == "*"
                        || *r == combined
                        || (!subresource.is_empty()
                            && r.strip_prefix("*/") == Some(subresource.as_str()))
                });
                let name_ok =
                    self.resource_names.is_empty() || self.resource_names.iter().any(|n| n == name);
                group_ok && resource_ok && name_ok
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(v: Value) -> Rule {
        Rule::from_json(&v)
    }

    #[test]
    fn rules_match_as_kubernetes_matches_them() {
        let pods = Attributes::resource("get", "", "pods", "", "dev", "web");
        let log = Attributes::resource("get", "", "pods", "log", "dev", "web");
        let deploy_scale =
            Attributes::resource("update", "apps", "deployments", "scale", "dev", "d");
        let cases: &[(Value, &Attributes, bool)] = &[
            (
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}),
                &pods,
                true,
            ),
            (
                json!({"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}),
                &pods,
                false,
            ),
            (
                json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}),
                &pods,
                true,
            ),
            (
                json!({"verbs": ["get"], "apiGroups": ["apps"], "resources": ["pods"]}),
                &pods,
                false,
            ),
            (
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}),
                &log,
                false,
            ),
            (
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}),
                &log,
                true,
            ),
            (
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["*/log"]}),
                &log,
                true,
            ),
            (
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["*/log"]}),
                &pods,
                false,
            ),
            (
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"],
                    "resourceNames": ["db"]}),
                &pods,
                false,
            ),
            (
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"],
                    "resourceNames": ["web"]}),
                &pods,
                true,
            ),
            (
                json!({"verbs": ["update"], "apiGroups": ["apps"],
                    "resources": ["deployments/scale"]}),
                &deploy_scale,
                true,
            ),
        ];
        for (r, a, want) in cases {
            assert_eq!(rule(r.clone()).allows(a), *want, "{r} on {a:?}");
        }
        let api = Attributes::path("get", "/apis/apps");
        for (urls, want) in [
            (json!(["/apis/*"]), true),
            (json!(["/apis"]), false),
            (json!(["*"]), true),
            (json!(["/api/*"]), false),
        ] {
            let r = rule(json!({"verbs": ["get"], "nonResourceURLs": urls}));
            assert_eq!(r.allows(&api), want, "{urls}");
        }
        // A resource rule never grants a path, nor a path rule a resource.
        let r = rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
        assert!(!r.allows(&api));
    }
}
