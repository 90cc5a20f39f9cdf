//! The Roles, ClusterRoles and bindings as the authorizer keeps them in memory, and what they
//! grant a user in a namespace.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::follow::Kind;
use super::Rule;
use crate::auth::User;

#[derive(Debug, Clone)]
pub(super) struct Role {
    pub(super) labels: Option<Value>,
    pub(super) rules: Vec<Rule>,
    /// `aggregationRule.clusterRoleSelectors` (ClusterRoles only).
    pub(super) aggregation: Option<Vec<Value>>,
}

impl Role {
    fn from_json(v: &Value) -> Role {
        Role {
            labels: v.pointer("/metadata/labels").cloned(),
            rules: v
                .get("rules")
                .and_then(Value::as_array)
                .map(|rs| rs.iter().map(Rule::from_json).collect())
                .unwrap_or_default(),
            aggregation: v
                .pointer("/aggregationRule/clusterRoleSelectors")
                .and_then(Value::as_array)
                .cloned(),
        }
    }
}

#[derive(Debug, Clone)]
struct Subject {
    kind: String,
    name: String,
    namespace: String,
}

#[derive(Debug, Clone)]
struct Binding {
    /// `Role` or `ClusterRole`.
    role_kind: String,
    role_name: String,
    subjects: Vec<Subject>,
}

impl Binding {
    fn from_json(v: &Value) -> Binding {
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        Binding {
            role_kind: v.get("roleRef").map(|r| s(r, "kind")).unwrap_or_default(),
            role_name: v.get("roleRef").map(|r| s(r, "name")).unwrap_or_default(),
            subjects: v
                .get("subjects")
                .and_then(Value::as_array)
                .map(|ss| {
                    ss.iter()
                        .map(|x| Subject {
                            kind: s(x, "kind"),
                            name: s(x, "name"),
                            namespace: s(x, "namespace"),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// The first subject that names the user (a RoleBinding's ServiceAccount subjects default
    /// to the binding's namespace).
    fn subject_for(&self, user: &User, binding_ns: &str) -> Option<&Subject> {
        self.subjects.iter().find(|s| match s.kind.as_str() {
            "User" => s.name == user.name,
            "Group" => user.groups.contains(&s.name),
            "ServiceAccount" => {
                let ns = if s.namespace.is_empty() {
                    binding_ns
                } else {
                    &s.namespace
                };
                user.name == format!("system:serviceaccount:{ns}:{}", s.name)
            }
            _ => false,
        })
    }
}

#[derive(Debug, Default)]
pub(super) struct Policy {
    pub(super) cluster_roles: BTreeMap<String, Role>,
    /// (namespace, name)
    roles: HashMap<(String, String), Role>,
    cluster_bindings: BTreeMap<String, Binding>,
    /// namespace -> name -> binding
    bindings: HashMap<String, BTreeMap<String, Binding>>,
}

impl Policy {
    pub(super) fn clear(&mut self, kind: Kind) {
        match kind {
            Kind::ClusterRole => self.cluster_roles.clear(),
            Kind::Role => self.roles.clear(),
            Kind::ClusterRoleBinding => self.cluster_bindings.clear(),
            Kind::RoleBinding => self.bindings.clear(),
        }
    }

    /// Records the object at `rest` (the key after the folder: `name` or `ns/name`), or forgets
    /// it when `object` is None.
    pub(super) fn set(&mut self, kind: Kind, rest: &str, object: Option<&Value>) {
        let (ns, name) = match rest.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => (String::new(), rest.to_string()),
        };
        match (kind, object) {
            (Kind::ClusterRole, Some(o)) => {
                self.cluster_roles.insert(name, Role::from_json(o));
            }
            (Kind::ClusterRole, None) => {
                self.cluster_roles.remove(&name);
            }
            (Kind::Role, Some(o)) => {
                self.roles.insert((ns, name), Role::from_json(o));
            }
            (Kind::Role, None) => {
                self.roles.remove(&(ns, name));
            }
            (Kind::ClusterRoleBinding, Some(o)) => {
                self.cluster_bindings.insert(name, Binding::from_json(o));
            }
            (Kind::ClusterRoleBinding, None) => {
                self.cluster_bindings.remove(&name);
            }
            (Kind::RoleBinding, Some(o)) => {
                self.bindings
                    .entry(ns)
                    .or_default()
                    .insert(name, Binding::from_json(o));
            }
            (Kind::RoleBinding, None) => {
                if let Some(m) = self.bindings.get_mut(&ns) {
                    m.remove(&name);
                    if m.is_empty() {
                        self.bindings.remove(&ns);
                    }
                }
            }
        }
    }

    fn role_rules(&self, binding: &Binding, ns: &str) -> &[Rule] {
        let role = match binding.role_kind.as_str() {
            "ClusterRole" => self.cluster_roles.get(&binding.role_name),
            "Role" => self.roles.get(&(ns.to_string(), binding.role_name.clone())),
            _ => None,
        };
        role.map(|r| r.rules.as_slice()).unwrap_or(&[])
    }

    /// Every binding that applies to the user where `namespace` is (cluster-wide bindings
    /// first), with the rules it grants and how to name it in a reason.
    pub(super) fn grants<'a>(
        &'a self,
        user: &'a User,
        namespace: &'a str,
    ) -> Vec<(String, &'a [Rule])> {
        let mut out = Vec::new();
        for (name, b) in &self.cluster_bindings {
            if let Some(s) = b.subject_for(user, "") {
                out.push((
                    format!(
                        "ClusterRoleBinding {name:?} of ClusterRole {:?} to {} {:?}",
                        b.role_name, s.kind, s.name
                    ),
                    self.role_rules(b, ""),
                ));
            }
        }
        if !namespace.is_empty() {
            for (name, b) in self.bindings.get(namespace).into_iter().flatten() {
                if let Some(s) = b.subject_for(user, namespace) {
                    out.push((
                        format!(
                            "RoleBinding \"{name}/{namespace}\" of {} {:?} to {} {:?}",
                            b.role_kind, b.role_name, s.kind, s.name
                        ),
                        self.role_rules(b, namespace),
                    ));
                }
            }
        }
        out
    }
}
