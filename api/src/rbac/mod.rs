//! Authorization: who may do what, decided as Kubernetes' RBAC authorizer decides it.
//!
//! Every request becomes [`Attributes`] (a verb on a resource, or on a URL path) and
//! [`Authorizer::authorize`] answers it: members of `system:masters` may do everything (as
//! kube-apiserver's privileged-group authorizer); everyone else gets what the ClusterRoleBindings
//! naming them grant cluster-wide, plus what the RoleBindings of the request's namespace grant
//! there. The Roles, ClusterRoles and bindings are read from the member's store and kept current
//! by a watch per kind, so a decision never waits on the store.
//!
//! [`policy`] holds the default roles and bindings that bootstrap writes; ClusterRoles with an
//! `aggregationRule` get their rules from the ClusterRoles their selectors match
//! ([`Authorizer::aggregations`], written back by the leader as Kubernetes' aggregation
//! controller does).

pub mod policy;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rkube_core::selector::LabelSelector;
use rkube_store::mvcc::types::{EventKind, KeyRange};
use rkube_store::mvcc::watch::{self as store_watch, WatchMessage, WatchSpec};
use rkube_store::server::node::Node;
use serde_json::{json, Value};

use crate::auth::User;
use crate::error::ApiError;
use crate::storage::{decode, Freshness, ObjectStore};

/// What a request asks to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`... for resources; the lower-case HTTP method for paths.
    pub verb: String,
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Resource {
        group: String,
        resource: String,
        subresource: String,
        namespace: String,
        name: String,
    },
    NonResource {
        path: String,
    },
}

impl Attributes {
    pub fn resource(
        verb: &str,
        group: &str,
        resource: &str,
        subresource: &str,
        namespace: &str,
        name: &str,
    ) -> Attributes {
        Attributes {
            verb: verb.to_string(),
            target: Target::Resource {
                group: group.to_string(),
                resource: resource.to_string(),
                subresource: subresource.to_string(),
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
        }
    }

    pub fn path(verb: &str, path: &str) -> Attributes {
        Attributes {
            verb: verb.to_string(),
            target: Target::NonResource {
                path: path.to_string(),
            },
        }
    }

    fn namespace(&self) -> &str {
        match &self.target {
            Target::Resource { namespace, .. } => namespace,
            Target::NonResource { .. } => "",
        }
    }

    /// The 403 a denied request gets, worded as kube-apiserver words it.
    pub fn forbidden(&self, user: &User) -> ApiError {
        let who = &user.name;
        let verb = &self.verb;
        match &self.target {
            Target::NonResource { path } => ApiError::forbidden(format!(
                "forbidden: User {who:?} cannot {verb} path {path:?}"
            )),
            Target::Resource {
                group,
                resource,
                subresource,
                namespace,
                name,
            } => {
                let combined = if subresource.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}/{subresource}")
                };
                let scope = if namespace.is_empty() {
                    "at the cluster scope".to_string()
                } else {
                    format!("in the namespace {namespace:?}")
                };
                let qualified = if group.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}.{group}")
                };
                let subject = if name.is_empty() {
                    qualified
                } else {
                    format!("{qualified} {name:?}")
                };
                let mut e = ApiError::forbidden(format!(
                    "{subject} is forbidden: User {who:?} cannot {verb} resource {combined:?} in API group {group:?} {scope}"
                ));
                e.group = (!group.is_empty()).then(|| group.clone());
                e.kind = Some(resource.clone());
                e.name = Some(name.clone());
                e
            }
        }
    }
}

/// An answer: allowed or not, and why (the binding that allowed it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

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

#[derive(Debug, Clone)]
struct Role {
    labels: Option<Value>,
    rules: Vec<Rule>,
    /// `aggregationRule.clusterRoleSelectors` (ClusterRoles only).
    aggregation: Option<Vec<Value>>,
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

/// The store folders the authorizer follows, and what each holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ClusterRole,
    Role,
    ClusterRoleBinding,
    RoleBinding,
}

const FOLLOWED: &[(Kind, &str)] = &[
    (Kind::ClusterRole, "/registry/clusterroles/"),
    (Kind::Role, "/registry/roles/"),
    (Kind::ClusterRoleBinding, "/registry/clusterrolebindings/"),
    (Kind::RoleBinding, "/registry/rolebindings/"),
];

#[derive(Debug, Default)]
struct Policy {
    cluster_roles: BTreeMap<String, Role>,
    /// (namespace, name)
    roles: HashMap<(String, String), Role>,
    cluster_bindings: BTreeMap<String, Binding>,
    /// namespace -> name -> binding
    bindings: HashMap<String, BTreeMap<String, Binding>>,
}

impl Policy {
    fn clear(&mut self, kind: Kind) {
        match kind {
            Kind::ClusterRole => self.cluster_roles.clear(),
            Kind::Role => self.roles.clear(),
            Kind::ClusterRoleBinding => self.cluster_bindings.clear(),
            Kind::RoleBinding => self.bindings.clear(),
        }
    }

    /// Records the object at `rest` (the key after the folder: `name` or `ns/name`), or forgets
    /// it when `object` is None.
    fn set(&mut self, kind: Kind, rest: &str, object: Option<&Value>) {
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
    fn grants<'a>(&'a self, user: &'a User, namespace: &'a str) -> Vec<(String, &'a [Rule])> {
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

/// The group whose members may do everything, whatever RBAC says.
pub const MASTERS: &str = "system:masters";

pub struct Authorizer {
    policy: RwLock<Policy>,
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

    /// Loads the policy from the member's store and follows it with a watch per kind.
    pub fn start(self: &Arc<Self>, node: Arc<Node>) {
        for &(kind, prefix) in FOLLOWED {
            let this = self.clone();
            let node = node.clone();
            tokio::spawn(async move {
                loop {
                    if let Err(e) = this.follow(&node, kind, prefix).await {
                        tracing::warn!(error = %e, prefix, "following RBAC objects failed; reloading");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
        }
    }

    /// Lists one folder at a revision, then applies its changes from the next revision on,
    /// until the watch ends (compaction), which the caller answers by listing again.
    async fn follow(&self, node: &Arc<Node>, kind: Kind, prefix: &str) -> Result<(), ApiError> {
        let store = ObjectStore::new(node.clone());
        let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
        let (kvs, rev, _) = store.range(prefix, &end, 0, Freshness::Any).await?;
        {
            let mut p = self.policy.write().unwrap_or_else(|e| e.into_inner());
            p.clear(kind);
            for kv in &kvs {
                let key = String::from_utf8_lossy(&kv.key);
                if let (Some(rest), Ok(s)) = (key.strip_prefix(prefix), decode(kv)) {
                    p.set(kind, rest, Some(&s.object));
                }
            }
        }
        let spec = WatchSpec {
            range: KeyRange::prefix(prefix.as_bytes().to_vec()),
            start_revision: rev + 1,
            ..Default::default()
        };
        let mut events = store_watch::start(node.mvcc.clone(), spec, 256);
        while let Some(msg) = events.recv().await {
            match msg {
                WatchMessage::Events { events, .. } => {
                    let mut p = self.policy.write().unwrap_or_else(|e| e.into_inner());
                    for ev in events {
                        let key = String::from_utf8_lossy(&ev.kv.key).to_string();
                        let Some(rest) = key.strip_prefix(prefix) else {
                            continue;
                        };
                        match ev.kind {
                            EventKind::Put => {
                                if let Ok(s) = decode(&ev.kv) {
                                    p.set(kind, rest, Some(&s.object));
                                }
                            }
                            EventKind::Delete => p.set(kind, rest, None),
                        }
                    }
                }
                WatchMessage::Progress { .. } => {}
                WatchMessage::Compacted { .. } => return Ok(()),
            }
        }
        Ok(())
    }

    /// Records an object as the watch of `folder` (a /registry/... prefix) would.
    #[cfg(test)]
    pub(crate) fn load_at(&self, folder: &str, rest: &str, object: &Value) {
        if let Some((kind, _)) = FOLLOWED.iter().find(|(_, p)| *p == folder) {
            let mut p = self.policy.write().unwrap();
            p.set(*kind, rest, Some(object));
        }
    }

    #[cfg(test)]
    fn load(&self, objects: &[(Kind, &str, Value)]) {
        let mut p = self.policy.write().unwrap();
        for (kind, rest, o) in objects {
            p.set(*kind, rest, Some(o));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, groups: &[&str]) -> User {
        User {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..User::default()
        }
    }

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
    fn forbidden_messages_use_kubernetes_wording() {
        let jane = user("jane", &[]);
        let e = Attributes::resource("create", "", "pods", "", "default", "").forbidden(&jane);
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "pods is forbidden: User \"jane\" cannot create resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        let e = Attributes::resource("get", "apps", "deployments", "scale", "dev", "web")
            .forbidden(&jane);
        assert_eq!(
            e.message,
            "deployments.apps \"web\" is forbidden: User \"jane\" cannot get resource \"deployments/scale\" in API group \"apps\" in the namespace \"dev\""
        );
        let e = Attributes::resource("list", "", "nodes", "", "", "").forbidden(&jane);
        assert!(e.message.ends_with("at the cluster scope"), "{}", e.message);
        let e = Attributes::path("get", "/metrics").forbidden(&jane);
        assert_eq!(
            e.message,
            "forbidden: User \"jane\" cannot get path \"/metrics\""
        );
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
