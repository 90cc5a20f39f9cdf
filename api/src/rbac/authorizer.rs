//! The authorizer: a request's decision, the rules a user holds, and the ClusterRoles that
//! aggregation should change.

use std::sync::RwLock;

use rkube_core::selector::LabelSelector;
use serde_json::Value;

use super::cache::Policy;
use super::{Attributes, Rule};
use crate::auth::User;

/// An answer: allowed or not, and why (the binding that allowed it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// The group whose members may do everything, whatever RBAC says.
pub const MASTERS: &str = "system:masters";

pub struct Authorizer {
    pub(super) policy: RwLock<Policy>,
}

impl Default for Authorizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Authorizer {
    pub fn new() -> Authorizer {
        Authorizer {
            policy: RwLock::new(Policy::default()),
        }
    }

    pub fn authorize(&self, user: &User, a: &Attributes) -> Decision {
        if user.groups.iter().any(|g| g == MASTERS) {
            return Decision {
                allowed: true,
                reason: format!("allowed: member of the {MASTERS} group"),
            };
        }
        let policy = self.policy.read().unwrap_or_else(|e| e.into_inner());
        for (how, rules) in policy.grants(user, a.namespace()) {
            if rules.iter().any(|r| r.allows(a)) {
                return Decision {
                    allowed: true,
                    reason: format!("RBAC: allowed by {how}"),
                };
            }
        }
        Decision {
            allowed: false,
            reason: String::new(),
        }
    }

    /// Every rule the user holds in `namespace` (cluster-wide ones included), for
    /// SelfSubjectRulesReview.
    pub fn rules_for(&self, user: &User, namespace: &str) -> Vec<Rule> {
        if user.groups.iter().any(|g| g == MASTERS) {
            return vec![
                Rule {
                    verbs: vec!["*".into()],
                    api_groups: vec!["*".into()],
                    resources: vec!["*".into()],
                    ..Rule::default()
                },
                Rule {
                    verbs: vec!["*".into()],
                    non_resource_urls: vec!["*".into()],
                    ..Rule::default()
                },
            ];
        }
        let policy = self.policy.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<Rule> = Vec::new();
        for (_, rules) in policy.grants(user, namespace) {
            for r in rules {
                if !out.contains(r) {
                    out.push(r.clone());
                }
            }
        }
        out
    }

    /// The ClusterRoles whose rules should change to the union of the roles their aggregation
    /// selectors match: (name, the rules they should hold).
    pub fn aggregations(&self) -> Vec<(String, Vec<Rule>)> {
        let policy = self.policy.read().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for (name, role) in &policy.cluster_roles {
            let Some(selectors) = &role.aggregation else {
                continue;
            };
            let mut rules: Vec<Rule> = Vec::new();
            for (other, r) in &policy.cluster_roles {
                if other == name {
                    continue;
                }
                let picked = selectors.iter().any(|s| {
                    LabelSelector::from_json(s)
                        .matches(r.labels.as_ref().and_then(Value::as_object))
                });
                if picked {
                    for rule in &r.rules {
                        if !rules.contains(rule) {
                            rules.push(rule.clone());
                        }
                    }
                }
            }
            if rules != role.rules {
                out.push((name.clone(), rules));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rbac::follow::Kind;
    use crate::rbac::policy;
    use crate::rbac::testing::user;
    use serde_json::json;

    fn viewer_policy() -> Authorizer {
        let az = Authorizer::new();
        az.load(&[
            (
                Kind::ClusterRole,
                "view",
                json!({"rules": [{"verbs": ["get", "list", "watch"], "apiGroups": [""],
                                  "resources": ["pods"]}]}),
            ),
            (
                Kind::Role,
                "dev/deployer",
                json!({"rules": [{"verbs": ["create"], "apiGroups": ["apps"],
                                  "resources": ["deployments"]}]}),
            ),
            (
                Kind::ClusterRoleBinding,
                "jane-view",
                json!({"roleRef": {"kind": "ClusterRole", "name": "view"},
                       "subjects": [{"kind": "User", "name": "jane"}]}),
            ),
            (
                Kind::RoleBinding,
                "dev/ci",
                json!({"roleRef": {"kind": "Role", "name": "deployer"},
                       "subjects": [{"kind": "ServiceAccount", "name": "ci"},
                                    {"kind": "Group", "name": "devs"}]}),
            ),
        ]);
        az
    }

    #[test]
    fn bindings_grant_their_roles_to_their_subjects() {
        let az = viewer_policy();
        let jane = user("jane", &["system:authenticated"]);
        let list = Attributes::resource("list", "", "pods", "", "dev", "");
        let create = Attributes::resource("create", "", "pods", "", "dev", "");
        let d = az.authorize(&jane, &list);
        assert!(d.allowed);
        assert_eq!(
            d.reason,
            "RBAC: allowed by ClusterRoleBinding \"jane-view\" of ClusterRole \"view\" to User \"jane\""
        );
        assert!(!az.authorize(&jane, &create).allowed);

        let deploy = Attributes::resource("create", "apps", "deployments", "", "dev", "");
        let elsewhere = Attributes::resource("create", "apps", "deployments", "", "prod", "");
        let sa = user("system:serviceaccount:dev:ci", &["system:serviceaccounts"]);
        assert!(az.authorize(&sa, &deploy).allowed);
        assert!(!az.authorize(&sa, &elsewhere).allowed);
        let dev = user("bob", &["devs"]);
        assert!(az.authorize(&dev, &deploy).allowed);
        assert!(!az.authorize(&jane, &deploy).allowed);
        let other_sa = user("system:serviceaccount:prod:ci", &[]);
        assert!(!az.authorize(&other_sa, &deploy).allowed);

        let admin = user("kubernetes-admin", &[MASTERS]);
        assert!(az.authorize(&admin, &elsewhere).allowed);
    }

    #[test]
    fn aggregation_unions_the_selected_roles() {
        let az = Authorizer::new();
        az.load(&[
            (
                Kind::ClusterRole,
                "view",
                json!({"aggregationRule": {"clusterRoleSelectors": [
                    {"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}]},
                       "rules": []}),
            ),
            (
                Kind::ClusterRole,
                "widgets-view",
                json!({"metadata": {"labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
                       "rules": [{"verbs": ["get"], "apiGroups": ["example.com"],
                                  "resources": ["widgets"]}]}),
            ),
            (
                Kind::ClusterRole,
                "unrelated",
                json!({"rules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]}),
            ),
        ]);
        let agg = az.aggregations();
        assert_eq!(agg.len(), 1);
        assert_eq!(agg[0].0, "view");
        assert_eq!(agg[0].1.len(), 1);
        assert_eq!(agg[0].1[0].resources, vec!["widgets".to_string()]);
    }

    #[test]
    fn the_default_policy_is_consistent() {
        let az = Authorizer::new();
        let mut objects = Vec::new();
        for r in policy::cluster_roles() {
            let name = r["metadata"]["name"].as_str().unwrap().to_string();
            objects.push((Kind::ClusterRole, name, r));
        }
        for b in policy::cluster_role_bindings() {
            let name = b["metadata"]["name"].as_str().unwrap().to_string();
            objects.push((Kind::ClusterRoleBinding, name, b));
        }
        let refs: Vec<(Kind, &str, Value)> = objects
            .iter()
            .map(|(k, n, o)| (*k, n.as_str(), o.clone()))
            .collect();
        az.load(&refs);
        // The written admin/edit/view rules are already what aggregation computes.
        let agg = az.aggregations();
        assert!(
            agg.is_empty(),
            "default roles not aggregated: {:?}",
            agg.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
        let anyone = user("jane", &["system:authenticated"]);
        assert!(
            az.authorize(&anyone, &Attributes::path("get", "/apis/apps/v1"))
                .allowed
        );
        assert!(
            az.authorize(
                &anyone,
                &Attributes::resource(
                    "create",
                    "authorization.k8s.io",
                    "selfsubjectaccessreviews",
                    "",
                    "",
                    ""
                )
            )
            .allowed
        );
        assert!(
            !az.authorize(
                &anyone,
                &Attributes::resource("list", "", "pods", "", "default", "")
            )
            .allowed
        );
    }
}
