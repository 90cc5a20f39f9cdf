//! The default RBAC policy, as Kubernetes 1.32 bootstraps it: the user-facing roles
//! (`cluster-admin`, and `admin`, `edit`, `view`, which aggregate the `system:aggregate-to-*`
//! roles and any ClusterRole labelled like them), and the `system:` roles every user needs to find
//! the API and ask what they may do, with their bindings.
//!
//! Roles for node agents come with the agent; controllers and the scheduler run inside the
//! server and need none.

use serde_json::{json, Value};

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];
const READ_WRITE: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

const AGGREGATE: &str = "rbac.authorization.k8s.io/aggregate-to-";

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn urls(paths: &[&str], verbs: &[&str]) -> Value {
    json!({"nonResourceURLs": paths, "verbs": verbs})
}

fn meta(name: &str, labels: &[(&str, &str)]) -> Value {
    let mut l = serde_json::Map::new();
    l.insert("kubernetes.io/bootstrapping".into(), json!("rbac-defaults"));
    for (k, v) in labels {
        l.insert(k.to_string(), json!(v));
    }
    json!({"name": name, "labels": l,
           "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}})
}

fn cluster_role(name: &str, labels: &[(&str, &str)], rules: Vec<Value>) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
           "metadata": meta(name, labels), "rules": rules})
}

/// A ClusterRole whose rules are those of the roles labelled `aggregate-to-<to>`, which are
/// passed (sorted by name, as the aggregation writes them) to fill them in.
fn aggregated(name: &str, to: &str, labels: &[(&str, &str)], from: &[&Value]) -> Value {
    let mut rules: Vec<Value> = Vec::new();
    for role in from {
        for r in role["rules"].as_array().into_iter().flatten() {
            if !rules.contains(r) {
                rules.push(r.clone());
            }
        }
    }
    let mut role = cluster_role(name, labels, rules);
    role["aggregationRule"] = json!({"clusterRoleSelectors": [
        {"matchLabels": {format!("{AGGREGATE}{to}"): "true"}}
    ]});
    role
}

fn aggregate_to_view() -> Value {
    cluster_role(
        "system:aggregate-to-view",
        &[("rbac.authorization.k8s.io/aggregate-to-view", "true")],
        vec![
            rule(
                &[""],
                &[
                    "configmaps",
                    "endpoints",
                    "persistentvolumeclaims",
                    "persistentvolumeclaims/status",
                    "pods",
                    "replicationcontrollers",
                    "replicationcontrollers/scale",
                    "serviceaccounts",
                    "services",
                    "services/status",
                ],
                READ,
            ),
            rule(
                &[""],
                &[
                    "bindings",
                    "events",
                    "limitranges",
                    "namespaces/status",
                    "pods/log",
                    "pods/status",
                    "replicationcontrollers/status",
                    "resourcequotas",
                    "resourcequotas/status",
                ],
                READ,
            ),
            rule(&[""], &["namespaces"], READ),
            rule(&["discovery.k8s.io"], &["endpointslices"], READ),
            rule(
                &["apps"],
                &[
                    "controllerrevisions",
                    "daemonsets",
                    "daemonsets/status",
                    "deployments",
                    "deployments/scale",
                    "deployments/status",
                    "replicasets",
                    "replicasets/scale",
                    "replicasets/status",
                    "statefulsets",
                    "statefulsets/scale",
                    "statefulsets/status",
                ],
                READ,
            ),
            rule(
                &["autoscaling"],
                &[
                    "horizontalpodautoscalers",
                    "horizontalpodautoscalers/status",
                ],
                READ,
            ),
            rule(
                &["batch"],
                &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
                READ,
            ),
            rule(
                &["extensions"],
                &[
                    "daemonsets",
                    "daemonsets/status",
                    "deployments",
                    "deployments/scale",
                    "deployments/status",
                    "ingresses",
                    "ingresses/status",
                    "networkpolicies",
                    "replicasets",
                    "replicasets/scale",
                    "replicasets/status",
                    "replicationcontrollers/scale",
                ],
                READ,
            ),
            rule(
                &["policy"],
                &["poddisruptionbudgets", "poddisruptionbudgets/status"],
                READ,
            ),
            rule(
                &["networking.k8s.io"],
                &["ingresses", "ingresses/status", "networkpolicies"],
                READ,
            ),
        ],
    )
}

fn aggregate_to_edit() -> Value {
    cluster_role(
        "system:aggregate-to-edit",
        &[("rbac.authorization.k8s.io/aggregate-to-edit", "true")],
        vec![
            // Read on the resources that can escalate (exec, secrets).
            rule(
                &[""],
                &[
                    "pods/attach",
                    "pods/exec",
                    "pods/portforward",
                    "pods/proxy",
                    "secrets",
                    "services/proxy",
                ],
                READ,
            ),
            rule(&[""], &["serviceaccounts"], &["impersonate"]),
            rule(
                &[""],
                &[
                    "pods",
                    "pods/attach",
                    "pods/exec",
                    "pods/portforward",
                    "pods/proxy",
                ],
                WRITE,
            ),
            rule(&[""], &["pods/eviction"], &["create"]),
            rule(
                &[""],
                &[
                    "configmaps",
                    "events",
                    "persistentvolumeclaims",
                    "replicationcontrollers",
                    "replicationcontrollers/scale",
                    "secrets",
                    "serviceaccounts",
                    "services",
                    "services/proxy",
                ],
                WRITE,
            ),
            rule(&[""], &["serviceaccounts/token"], &["create"]),
            rule(
                &["apps"],
                &[
                    "daemonsets",
                    "deployments",
                    "deployments/rollback",
                    "deployments/scale",
                    "replicasets",
                    "replicasets/scale",
                    "statefulsets",
                    "statefulsets/scale",
                ],
                WRITE,
            ),
            rule(&["autoscaling"], &["horizontalpodautoscalers"], WRITE),
            rule(&["batch"], &["cronjobs", "jobs"], WRITE),
            rule(
                &["extensions"],
                &[
                    "daemonsets",
                    "deployments",
                    "deployments/rollback",
                    "deployments/scale",
                    "ingresses",
                    "networkpolicies",
                    "replicasets",
                    "replicasets/scale",
                    "replicationcontrollers/scale",
                ],
                WRITE,
            ),
            rule(&["policy"], &["poddisruptionbudgets"], WRITE),
            rule(
                &["networking.k8s.io"],
                &["ingresses", "networkpolicies"],
                WRITE,
            ),
        ],
    )
}

fn aggregate_to_admin() -> Value {
    cluster_role(
        "system:aggregate-to-admin",
        &[("rbac.authorization.k8s.io/aggregate-to-admin", "true")],
        vec![
            rule(
                &["authorization.k8s.io"],
                &["localsubjectaccessreviews"],
                &["create"],
            ),
            rule(
                &["rbac.authorization.k8s.io"],
                &["rolebindings", "roles"],
                READ_WRITE,
            ),
        ],
    )
}

/// The default ClusterRoles, each a complete rbac.authorization.k8s.io/v1 object.
pub fn cluster_roles() -> Vec<Value> {
    let to_view = aggregate_to_view();
    let to_edit = aggregate_to_edit();
    let to_admin = aggregate_to_admin();
    // What metrics-server's manifest adds: reading resource metrics, aggregated into view,
    // edit and admin.
    let metrics_reader = cluster_role(
        "system:aggregated-metrics-reader",
        &[
            ("rbac.authorization.k8s.io/aggregate-to-admin", "true"),
            ("rbac.authorization.k8s.io/aggregate-to-edit", "true"),
            ("rbac.authorization.k8s.io/aggregate-to-view", "true"),
        ],
        vec![rule(&["metrics.k8s.io"], &["nodes", "pods"], READ)],
    );
    // view carries the edit label and edit the admin label, so each includes the one below.
    let view = aggregated(
        "view",
        "view",
        &[("rbac.authorization.k8s.io/aggregate-to-edit", "true")],
        &[&to_view, &metrics_reader],
    );
    let edit = aggregated(
        "edit",
        "edit",
        &[("rbac.authorization.k8s.io/aggregate-to-admin", "true")],
        &[&to_edit, &metrics_reader, &view],
    );
    let admin = aggregated("admin", "admin", &[], &[&edit, &to_admin]);
    vec![
        cluster_role(
            "cluster-admin",
            &[],
            vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])],
        ),
        admin,
        edit,
        view,
        to_admin,
        to_edit,
        to_view,
        metrics_reader,
        cluster_role(
            "system:discovery",
            &[],
            vec![urls(
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
                &["get"],
            )],
        ),
        cluster_role(
            "system:basic-user",
            &[],
            vec![
                rule(
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    &["create"],
                ),
                rule(
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                    &["create"],
                ),
            ],
        ),
        cluster_role(
            "system:public-info-viewer",
            &[],
            vec![urls(
                &["/healthz", "/livez", "/readyz", "/version", "/version/"],
                &["get"],
            )],
        ),
        cluster_role(
            "system:monitoring",
            &[],
            vec![urls(
                &[
                    "/healthz",
                    "/healthz/*",
                    "/livez",
                    "/livez/*",
                    "/metrics",
                    "/metrics/slis",
                    "/readyz",
                    "/readyz/*",
                ],
                &["get"],
            )],
        ),
        cluster_role(
            "system:node-bootstrapper",
            &[],
            vec![rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests"],
                &["create", "get", "list", "watch"],
            )],
        ),
        cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            &[],
            vec![rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests/nodeclient"],
                &["create"],
            )],
        ),
        cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            &[],
            vec![rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests/selfnodeclient"],
                &["create"],
            )],
        ),
        cluster_role(
            "system:auth-delegator",
            &[],
            vec![
                rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
                rule(
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                    &["create"],
                ),
            ],
        ),
    ]
}

fn binding(name: &str, role: &str, subjects: &[(&str, &str)]) -> Value {
    let subjects: Vec<Value> = subjects
        .iter()
        .map(|(kind, who)| {
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": who})
        })
        .collect();
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
           "metadata": meta(name, &[]),
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
           "subjects": subjects})
}

/// The default ClusterRoleBindings.
pub fn cluster_role_bindings() -> Vec<Value> {
    vec![
        binding(
            "cluster-admin",
            "cluster-admin",
            &[("Group", "system:masters")],
        ),
        binding(
            "system:discovery",
            "system:discovery",
            &[("Group", "system:authenticated")],
        ),
        binding(
            "system:basic-user",
            "system:basic-user",
            &[("Group", "system:authenticated")],
        ),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &[
                ("Group", "system:authenticated"),
                ("Group", "system:unauthenticated"),
            ],
        ),
        binding(
            "system:monitoring",
            "system:monitoring",
            &[("Group", "system:monitoring")],
        ),
        // What kubeadm binds so that bootstrap tokens join nodes and nodes renew their
        // certificates.
        binding(
            "kubeadm:kubelet-bootstrap",
            "system:node-bootstrapper",
            &[("Group", "system:bootstrappers")],
        ),
        binding(
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            &[("Group", "system:bootstrappers")],
        ),
        binding(
            "kubeadm:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            &[("Group", "system:nodes")],
        ),
    ]
}

/// The default namespaced roles and their bindings: anonymous users may read
/// `kube-public/cluster-info`, the CA a joining node checks against its pin.
pub fn namespaced() -> Vec<(&'static str, Value)> {
    vec![
        (
            "roles",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": "kubeadm:bootstrap-signer-clusterinfo",
                                "namespace": "kube-public"},
                   "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["cluster-info"], "verbs": ["get"]}]}),
        ),
        // Joining control-plane members read the uploaded (encrypted) keys with their token.
        (
            "roles",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                   "metadata": {"name": "kubeadm:kubeadm-certs", "namespace": "kube-system"},
                   "rules": [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": ["rkube-certs"], "verbs": ["get"]}]}),
        ),
        (
            "rolebindings",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": "kubeadm:kubeadm-certs", "namespace": "kube-system"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                               "name": "kubeadm:kubeadm-certs"},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                 "name": "system:bootstrappers:kubeadm:default-node-token"}]}),
        ),
        (
            "rolebindings",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": "kubeadm:bootstrap-signer-clusterinfo",
                                "namespace": "kube-public"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                               "name": "kubeadm:bootstrap-signer-clusterinfo"},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                 "name": "system:anonymous"}]}),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn name(v: &Value) -> &str {
        v["metadata"]["name"].as_str().unwrap()
    }

    /// (group, resource, verb) triples a role grants.
    fn grants(role: &Value) -> BTreeSet<(String, String, String)> {
        let mut out = BTreeSet::new();
        for r in role["rules"].as_array().unwrap() {
            for g in r["apiGroups"].as_array().into_iter().flatten() {
                for res in r["resources"].as_array().into_iter().flatten() {
                    for v in r["verbs"].as_array().unwrap() {
                        out.insert((
                            g.as_str().unwrap().to_string(),
                            res.as_str().unwrap().to_string(),
                            v.as_str().unwrap().to_string(),
                        ));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn names_are_unique_and_bindings_name_real_roles() {
        let roles = cluster_roles();
        let names: BTreeSet<&str> = roles.iter().map(name).collect();
        assert_eq!(names.len(), roles.len());
        for b in cluster_role_bindings() {
            let role = b["roleRef"]["name"].as_str().unwrap();
            assert!(names.contains(role), "{} binds missing {role}", name(&b));
        }
        for r in &roles {
            for rule in r["rules"].as_array().unwrap() {
                assert!(!rule["verbs"].as_array().unwrap().is_empty(), "{}", name(r));
            }
        }
    }

    #[test]
    fn admin_contains_edit_contains_view() {
        let roles = cluster_roles();
        let find = |n: &str| roles.iter().find(|r| name(r) == n).unwrap();
        let (admin, edit, view) = (
            grants(find("admin")),
            grants(find("edit")),
            grants(find("view")),
        );
        assert!(view.is_subset(&edit));
        assert!(edit.is_subset(&admin));
        assert!(view.contains(&("".into(), "pods".into(), "list".into())));
        assert!(!view.contains(&("".into(), "secrets".into(), "get".into())));
        assert!(edit.contains(&("apps".into(), "deployments".into(), "create".into())));
        assert!(!edit.contains(&(
            "rbac.authorization.k8s.io".into(),
            "roles".into(),
            "create".into()
        )));
        assert!(admin.contains(&(
            "rbac.authorization.k8s.io".into(),
            "roles".into(),
            "create".into()
        )));
    }
}
