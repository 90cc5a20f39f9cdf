//! The Node authorizer and the NodeRestriction admission plugin: what a node's agent (user
//! `system:node:<name>` in group `system:nodes`) may do. A node reads what every node reads
//! (nodes, pods, services, endpoints), writes events, its certificate requests and its Lease;
//! it may read a Secret, ConfigMap or PersistentVolumeClaim only when a pod bound to it uses
//! that object; it reads PersistentVolumes; it may change only its own Node, the pods bound to
//! it and the local-path volumes provisioned on it (to finish their deletion once it removed
//! their directory); and it gets service
//! account tokens only bound to a pod it runs as that service account.

use serde_json::Value;

use crate::auth::User;
use crate::error::ApiError;
use crate::rbac::{Attributes, Target};
use crate::storage::Freshness;

pub const NODES_GROUP: &str = "system:nodes";
pub const NODE_USER_PREFIX: &str = "system:node:";
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// The node a user is the agent of.
pub fn node_of(user: &User) -> Option<&str> {
    let name = user.name.strip_prefix(NODE_USER_PREFIX)?;
    (!name.is_empty() && user.groups.iter().any(|g| g == NODES_GROUP)).then_some(name)
}

const READ: &[&str] = &["get", "list", "watch"];

/// The Node authorizer's rules that need no object graph.
pub fn static_allows(a: &Attributes) -> bool {
    let Target::Resource {
        group,
        resource,
        subresource,
        namespace,
        ..
    } = &a.target
    else {
        return false;
    };
    let verb = a.verb.as_str();
    let is = |g: &str, r: &str, s: &str| group == g && resource == r && subresource == s;
    let read = READ.contains(&verb);
    (read
        && (is("", "nodes", "")
            || is("", "pods", "")
            || is("", "services", "")
            || is("", "endpoints", "")
            || is("discovery.k8s.io", "endpointslices", "")
            || is("", "persistentvolumes", "")
            || is("node.k8s.io", "runtimeclasses", "")))
        || (is("", "nodes", "") && matches!(verb, "create" | "update" | "patch" | "delete"))
        || (is("", "nodes", "status") && matches!(verb, "update" | "patch"))
        || ((is("", "events", "") || is("events.k8s.io", "events", ""))
            && matches!(verb, "create" | "update" | "patch"))
        || (is("", "pods", "") && verb == "delete")
        || (is("", "persistentvolumes", "") && matches!(verb, "update" | "patch"))
        || (is("", "pods", "status") && matches!(verb, "update" | "patch"))
        || (is("", "pods", "eviction") && verb == "create")
        || (is("authentication.k8s.io", "tokenreviews", "") && verb == "create")
        || ((is("authorization.k8s.io", "subjectaccessreviews", "")
            || is("authorization.k8s.io", "localsubjectaccessreviews", ""))
            && verb == "create")
        || (is("certificates.k8s.io", "certificatesigningrequests", "")
            && matches!(verb, "create" | "get" | "list" | "watch"))
        || (is(
            "certificates.k8s.io",
            "certificatesigningrequests",
            "selfnodeclient",
        ) && verb == "create")
        || (is("coordination.k8s.io", "leases", "")
            && namespace == LEASE_NAMESPACE
            && matches!(verb, "get" | "create" | "update" | "patch" | "delete"))
}

/// Whether a pod refers to the named object of `kind` (secrets, configmaps,
/// persistentvolumeclaims, serviceaccounts).
pub fn pod_uses(pod: &Value, kind: &str, name: &str) -> bool {
    let spec = match pod.get("spec") {
        Some(s) => s,
        None => return false,
    };
    let arr = |v: Option<&Value>| v.and_then(Value::as_array).cloned().unwrap_or_default();
    let str_at = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
    if kind == "serviceaccounts" {
        return spec
            .get("serviceAccountName")
            .and_then(Value::as_str)
            .unwrap_or("default")
            == name;
    }
    for vol in arr(spec.get("volumes")) {
        let hit = match kind {
            "secrets" => {
                str_at(&vol, "/secret/secretName").as_deref() == Some(name)
                    || arr(vol.pointer("/projected/sources"))
                        .iter()
                        .any(|s| str_at(s, "/secret/name").as_deref() == Some(name))
            }
            "configmaps" => {
                str_at(&vol, "/configMap/name").as_deref() == Some(name)
                    || arr(vol.pointer("/projected/sources"))
                        .iter()
                        .any(|s| str_at(s, "/configMap/name").as_deref() == Some(name))
            }
            "persistentvolumeclaims" => {
                str_at(&vol, "/persistentVolumeClaim/claimName").as_deref() == Some(name)
            }
            _ => false,
        };
        if hit {
            return true;
        }
    }
    if kind == "secrets"
        && arr(spec.get("imagePullSecrets"))
            .iter()
            .any(|s| str_at(s, "/name").as_deref() == Some(name))
    {
        return true;
    }
    let (env_ref, from_ref) = match kind {
        "secrets" => ("/valueFrom/secretKeyRef/name", "/secretRef/name"),
        "configmaps" => ("/valueFrom/configMapKeyRef/name", "/configMapRef/name"),
        _ => return false,
    };
    ["containers", "initContainers", "ephemeralContainers"]
        .iter()
        .flat_map(|c| arr(spec.get(*c)))
        .any(|c| {
            arr(c.get("env"))
                .iter()
                .any(|e| str_at(e, env_ref).as_deref() == Some(name))
                || arr(c.get("envFrom"))
                    .iter()
                    .any(|e| str_at(e, from_ref).as_deref() == Some(name))
        })
}

impl crate::handler::Api {
    /// The Node authorizer's graph rule: `get` of a Secret, ConfigMap or
    /// PersistentVolumeClaim used by a pod bound to `node`, and `create` of a token for the
    /// service account of such a pod.
    pub(crate) async fn node_graph_allows(
        &self,
        node: &str,
        a: &Attributes,
    ) -> Result<bool, ApiError> {
        let Target::Resource {
            group,
            resource,
            subresource,
            namespace,
            name,
        } = &a.target
        else {
            return Ok(false);
        };
        let wanted = match (
            a.verb.as_str(),
            group.as_str(),
            resource.as_str(),
            subresource.as_str(),
        ) {
            ("get", "", "secrets" | "configmaps" | "persistentvolumeclaims", "") => {
                resource.as_str()
            }
            ("create", "", "serviceaccounts", "token") => "serviceaccounts",
            _ => return Ok(false),
        };
        if name.is_empty() || namespace.is_empty() {
            return Ok(false);
        }
        let pods = self.namespace_objects("pods", namespace).await?;
        Ok(pods.iter().any(|p| {
            p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node)
                && pod_uses(p, wanted, name)
        }))
    }

    /// NodeRestriction: a node changes only its own Node and Lease, and only the pods bound
    /// to it. `name` is the object the request names (empty for a create: the body's name).
    pub(crate) async fn node_restriction(
        &self,
        node: &str,
        a: &Attributes,
        body_name: Option<&str>,
    ) -> Result<(), ApiError> {
        let Target::Resource {
            group,
            resource,
            namespace,
            name,
            ..
        } = &a.target
        else {
            return Ok(());
        };
        if READ.contains(&a.verb.as_str()) {
            return Ok(());
        }
        let named = if name.is_empty() {
            body_name.unwrap_or("")
        } else {
            name.as_str()
        };
        let deny = |why: String| {
            Err(ApiError::forbidden(format!(
                "{resource} \"{named}\" is forbidden: node \"{node}\" {why}"
            )))
        };
        match (group.as_str(), resource.as_str()) {
            ("", "nodes") if named != node => {
                deny(format!("is not allowed to modify node \"{named}\""))
            }
            ("coordination.k8s.io", "leases") if named != node => {
                deny("can only access its own lease".to_string())
            }
            ("", "pods") => {
                let res = crate::resources::find("", "v1", "pods")
                    .ok_or_else(|| ApiError::internal("pods are served"))?;
                let stored = self
                    .store
                    .get(&res.key(Some(namespace), named), Freshness::Latest)
                    .await?;
                let bound = stored
                    .as_ref()
                    .and_then(|s| s.object.pointer("/spec/nodeName"))
                    .and_then(Value::as_str);
                match bound {
                    // A missing pod answers 404 further on.
                    None if stored.is_none() => Ok(()),
                    Some(n) if n == node => Ok(()),
                    _ => deny(
                        "can only update pod status and delete pods bound to itself".to_string(),
                    ),
                }
            }
            ("", "persistentvolumes") => {
                let res = crate::resources::find("", "v1", "persistentvolumes")
                    .ok_or_else(|| ApiError::internal("persistentvolumes are served"))?;
                let stored = self
                    .store
                    .get(&res.key(None, named), Freshness::Latest)
                    .await?;
                let on = stored
                    .as_ref()
                    .and_then(|s| s.object.pointer("/metadata/annotations"))
                    .and_then(|a| a.get(rkube_core::volume::LOCAL_PATH_NODE))
                    .and_then(Value::as_str);
                match on {
                    None if stored.is_none() => Ok(()),
                    Some(n) if n == node => Ok(()),
                    _ => deny("can only update local-path volumes on itself".to_string()),
                }
            }
            _ => Ok(()),
        }
    }
}

/// NodeRestriction of a TokenRequest (`serviceaccounts/<name>/token`) from a node: the token
/// must be bound to a pod (by uid) that runs on that node as that ServiceAccount, so a node
/// can get tokens only for what it runs. Kubernetes' messages.
pub(crate) fn token_restriction(
    node: &str,
    namespace: &str,
    service_account: &str,
    request: &Value,
    pod: Option<&Value>,
) -> Result<(), ApiError> {
    let deny = |why: String| {
        Err(ApiError::forbidden(format!(
            "serviceaccounts \"{service_account}\" is forbidden: {why}"
        )))
    };
    let Some(bound) = request
        .pointer("/spec/boundObjectRef")
        .filter(|b| !b.is_null())
    else {
        return deny("node requested token not bound to a pod".into());
    };
    let kind = bound.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "Pod" {
        return deny(format!("node requested token bound to a {kind}"));
    }
    let uid = bound.get("uid").and_then(Value::as_str).unwrap_or("");
    if uid.is_empty() {
        return deny("node requested token with a pod binding without a uid".into());
    }
    let name = bound.get("name").and_then(Value::as_str).unwrap_or("");
    let Some(pod) = pod else {
        return Err(ApiError::not_found("", "pods", name));
    };
    let s = |p: &str| pod.pointer(p).and_then(Value::as_str).unwrap_or("");
    if s("/metadata/uid") != uid {
        return deny(format!("the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"));
    }
    if s("/spec/nodeName") != node {
        return deny("node requested token bound to a pod scheduled on a different node".into());
    }
    let pod_sa = match s("/spec/serviceAccountName") {
        "" => "default",
        sa => sa,
    };
    if pod_sa != service_account || s("/metadata/namespace") != namespace {
        return deny(format!(
            "node requested token bound to a pod that does not run as service account {namespace}/{service_account}"
        ));
    }
    Ok(())
}

impl crate::handler::Api {
    /// [`token_restriction`] with the pod the request names, read from the store.
    pub(crate) async fn node_token_restriction(
        &self,
        node: &str,
        t: &crate::handler::Target,
        request: &Value,
    ) -> Result<(), ApiError> {
        let ns = t.namespace().unwrap_or("");
        let pod = match request
            .pointer("/spec/boundObjectRef/name")
            .and_then(Value::as_str)
        {
            Some(name) if !name.is_empty() => {
                let res = crate::resources::find("", "v1", "pods")
                    .ok_or_else(|| ApiError::internal("pods are served"))?;
                self.store
                    .get(&res.key(Some(ns), name), Freshness::Latest)
                    .await?
                    .map(|s| s.object)
            }
            _ => None,
        };
        token_restriction(node, ns, t.object_name(), request, pod.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node_user(n: &str) -> User {
        User {
            name: format!("system:node:{n}"),
            groups: vec![NODES_GROUP.into(), "system:authenticated".into()],
            ..User::default()
        }
    }

    #[test]
    fn only_node_users_in_the_nodes_group_are_nodes() {
        assert_eq!(node_of(&node_user("n1")), Some("n1"));
        let mut u = node_user("n1");
        u.groups.clear();
        assert_eq!(node_of(&u), None);
    }

    #[test]
    fn nodes_read_pods_and_write_their_status_but_not_secrets_lists() {
        let a = |verb: &str, g: &str, r: &str, s: &str, ns: &str| {
            Attributes::resource(verb, g, r, s, ns, "")
        };
        assert!(static_allows(&a("watch", "", "pods", "", "")));
        assert!(static_allows(&a("patch", "", "pods", "status", "default")));
        assert!(static_allows(&a(
            "update",
            "coordination.k8s.io",
            "leases",
            "",
            "kube-node-lease"
        )));
        assert!(!static_allows(&a(
            "update",
            "coordination.k8s.io",
            "leases",
            "",
            "default"
        )));
        assert!(!static_allows(&a("list", "", "secrets", "", "default")));
        assert!(!static_allows(&a("update", "", "pods", "", "default")));
        // Volumes: read, and updated (NodeRestriction then limits which); never made or
        // deleted by a node.
        assert!(static_allows(&a("watch", "", "persistentvolumes", "", "")));
        assert!(static_allows(&a("patch", "", "persistentvolumes", "", "")));
        assert!(!static_allows(&a(
            "delete",
            "",
            "persistentvolumes",
            "",
            ""
        )));
        assert!(!static_allows(&a(
            "create",
            "",
            "persistentvolumes",
            "",
            ""
        )));
        assert!(!static_allows(&a(
            "list",
            "",
            "persistentvolumeclaims",
            "",
            "default"
        )));
        assert!(!static_allows(&a(
            "create",
            "apps",
            "deployments",
            "",
            "default"
        )));
    }

    #[test]
    fn a_node_gets_tokens_only_for_its_own_pods() {
        let pod = json!({"metadata": {"name": "web", "namespace": "dev", "uid": "u1"},
                         "spec": {"nodeName": "n1", "serviceAccountName": "ci"}});
        let request = |bound: Value| json!({"spec": {"boundObjectRef": bound}});
        let web = json!({"kind": "Pod", "apiVersion": "v1", "name": "web", "uid": "u1"});
        // (node, service account, request, pod found, the refusal's end or None)
        let cases = [
            ("n1", "ci", request(web.clone()), true, None),
            (
                "n2",
                "ci",
                request(web.clone()),
                true,
                Some("bound to a pod scheduled on a different node"),
            ),
            (
                "n1",
                "default",
                request(web.clone()),
                true,
                Some("does not run as service account dev/default"),
            ),
            (
                "n1",
                "ci",
                json!({"spec": {}}),
                true,
                Some("node requested token not bound to a pod"),
            ),
            (
                "n1",
                "ci",
                request(json!({"kind": "Pod", "name": "web"})),
                true,
                Some("a pod binding without a uid"),
            ),
            (
                "n1",
                "ci",
                request(json!({"kind": "Secret", "name": "s", "uid": "x"})),
                true,
                Some("node requested token bound to a Secret"),
            ),
            (
                "n1",
                "ci",
                request(json!({"kind": "Pod", "name": "web", "uid": "old"})),
                true,
                Some("might have been deleted and then recreated"),
            ),
        ];
        for (node, sa, req, found, want) in cases {
            let got = token_restriction(node, "dev", sa, &req, found.then_some(&pod));
            match want {
                None => assert!(got.is_ok(), "{req}: {got:?}"),
                Some(end) => {
                    let e = got.unwrap_err();
                    assert_eq!(e.code, 403);
                    assert!(
                        e.message
                            .starts_with(&format!("serviceaccounts \"{sa}\" is forbidden: ")),
                        "{}",
                        e.message
                    );
                    assert!(e.message.ends_with(end), "{}", e.message);
                }
            }
        }
        let missing = token_restriction("n1", "dev", "ci", &request(web), None).unwrap_err();
        assert_eq!(missing.code, 404);
    }

    #[test]
    fn a_pod_uses_the_secrets_and_configmaps_it_names() {
        let pod = json!({"spec": {
            "volumes": [{"name": "v", "secret": {"secretName": "s1"}},
                        {"name": "c", "configMap": {"name": "c1"}}],
            "imagePullSecrets": [{"name": "pull"}],
            "containers": [{"name": "a",
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s2", "key": "k"}}}],
                "envFrom": [{"configMapRef": {"name": "c2"}}]}]}});
        for s in ["s1", "s2", "pull"] {
            assert!(pod_uses(&pod, "secrets", s), "{s}");
        }
        for c in ["c1", "c2"] {
            assert!(pod_uses(&pod, "configmaps", c), "{c}");
        }
        assert!(!pod_uses(&pod, "secrets", "c1"));
        assert!(pod_uses(&pod, "serviceaccounts", "default"));
    }
}
