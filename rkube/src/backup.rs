//! `rkube backup export|import`: the cluster's desired state as YAML — what people and tools
//! declared, not what the cluster derived from it (seed article 001: a backup keeps the
//! desired state; the running pods come back through the controllers).
//!
//! Export lists every resource the API serves (discovery), keeps the objects nobody derived,
//! strips what the server set, and writes them in the order that `kubectl apply -f OUT` needs
//! (namespaces first, then definitions, RBAC, identities and configuration, storage, workloads,
//! Services, the rest, and admission policy — quotas, limit ranges — last). Import server-side applies each document in file order.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{verbs, ApiCapabilities, ApiResource, Discovery, Scope};
use serde::Deserialize;
use serde_json::Value;

use crate::token::{admin_client, TokenArgs};

#[derive(Debug, Subcommand)]
pub enum BackupCommand {
    /// Write the desired state to OUT ("-" for standard output) as YAML documents.
    Export {
        out: String,
        /// Keep the Services' ClusterIPs (by default the new cluster allocates its own).
        #[arg(long)]
        keep_cluster_ips: bool,
    },
    /// Apply (server-side, field manager rkube-backup) every document of FILE, in order.
    Import { file: String },
}

pub async fn run(args: TokenArgs, command: BackupCommand) -> Result<()> {
    let (client, _) = admin_client(&args).await?;
    match command {
        BackupCommand::Export {
            out,
            keep_cluster_ips,
        } => {
            let (docs, summary) = export(&client, keep_cluster_ips).await?;
            let yaml = to_yaml(&docs)?;
            if out == "-" {
                print!("{yaml}");
            } else {
                std::fs::write(&out, yaml).with_context(|| format!("writing {out}"))?;
            }
            eprintln!("exported {} objects: {summary}", docs.len());
            Ok(())
        }
        BackupCommand::Import { file } => {
            let text = if file == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(&file).with_context(|| format!("reading {file}"))?
            };
            let docs = parse_yaml(&text).with_context(|| format!("parsing {file}"))?;
            let n = import(&client, docs).await?;
            eprintln!("applied {n} objects");
            Ok(())
        }
    }
}

/// Resources whose objects the cluster makes itself, from other objects or from what it
/// observes: never desired state.
const DERIVED_RESOURCES: &[(&str, &str)] = &[
    ("", "events"),
    ("events.k8s.io", "events"),
    ("", "endpoints"),
    ("discovery.k8s.io", "endpointslices"),
    ("", "nodes"),
    ("coordination.k8s.io", "leases"),
    ("certificates.k8s.io", "certificatesigningrequests"),
    ("apps", "controllerrevisions"),
    ("", "componentstatuses"),
    // Made by node agents, attachers and CSI provisioners from what they find.
    ("storage.k8s.io", "csinodes"),
    ("storage.k8s.io", "volumeattachments"),
    ("storage.k8s.io", "csistoragecapacities"),
];

/// Objects a new cluster makes for itself at its first start (so a fresh cluster has them
/// already): (group, resource, namespace, name).
const BUILT_IN: &[(&str, &str, &str, &str)] = &[
    ("", "namespaces", "", "default"),
    ("", "namespaces", "", "kube-system"),
    ("", "namespaces", "", "kube-public"),
    ("", "namespaces", "", "kube-node-lease"),
    ("", "services", "default", "kubernetes"),
    ("", "services", "kube-system", "kube-dns"),
    ("", "configmaps", "kube-public", "cluster-info"),
    ("", "configmaps", "*", "kube-root-ca.crt"),
    ("", "serviceaccounts", "*", "default"),
    // The built-in local-path provisioner's default class (the leader makes it when missing).
    ("storage.k8s.io", "storageclasses", "", "local-path"),
];

/// Secret types that controllers or the join process manage.
const DERIVED_SECRET_TYPES: &[&str] = &[
    "kubernetes.io/service-account-token",
    "bootstrap.kubernetes.io/token",
];

/// The export order: (group, resource) ranks; anything else comes before the admission policy
/// at the end, in discovery order.
const ORDER: &[(&str, &str)] = &[
    ("", "namespaces"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("scheduling.k8s.io", "priorityclasses"),
    ("rbac.authorization.k8s.io", "clusterroles"),
    ("rbac.authorization.k8s.io", "clusterrolebindings"),
    ("rbac.authorization.k8s.io", "roles"),
    ("rbac.authorization.k8s.io", "rolebindings"),
    ("", "serviceaccounts"),
    ("", "configmaps"),
    ("", "secrets"),
    ("storage.k8s.io", "storageclasses"),
    ("", "persistentvolumes"),
    ("", "persistentvolumeclaims"),
    ("apps", "deployments"),
    ("apps", "statefulsets"),
    ("apps", "daemonsets"),
    ("apps", "replicasets"),
    ("", "replicationcontrollers"),
    ("batch", "cronjobs"),
    ("batch", "jobs"),
    ("", "pods"),
    ("", "services"),
    // Admission policy last: the objects exported exist already, whether or not they would
    // pass a quota or get a LimitRange's defaults if made now (a pod made before its
    // namespace's quota has no limits), and the restore must not refuse or change them.
    ("", "limitranges"),
    ("", "resourcequotas"),
];

fn rank(ar: &ApiResource) -> usize {
    let policy = ORDER.len() - 2;
    match ORDER
        .iter()
        .position(|(g, r)| *g == ar.group && *r == ar.plural)
    {
        Some(i) if i >= policy => i + 1,
        Some(i) => i,
        None => policy,
    }
}

/// The served resources that can be listed and created, without derived ones, in export order.
fn exportable(discovery: &Discovery) -> Vec<(ApiResource, ApiCapabilities)> {
    let mut out: Vec<(ApiResource, ApiCapabilities)> = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .filter(|(ar, caps)| {
            caps.supports_operation(verbs::LIST)
                && caps.supports_operation(verbs::CREATE)
                && !DERIVED_RESOURCES.contains(&(ar.group.as_str(), ar.plural.as_str()))
        })
        .collect();
    // Stable: within a rank, discovery's order.
    out.sort_by_key(|(ar, _)| rank(ar));
    out
}

/// Why an object is not desired state, or `None` when it is.
fn derived(ar: &ApiResource, obj: &Value) -> Option<&'static str> {
    let meta = &obj["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    let namespace = meta["namespace"].as_str().unwrap_or_default();
    let controlled = meta["ownerReferences"]
        .as_array()
        .is_some_and(|refs| refs.iter().any(|r| r["controller"] == Value::Bool(true)));
    if controlled {
        return Some("made by its controller");
    }
    if meta["deletionTimestamp"].is_string() {
        return Some("being deleted");
    }
    if BUILT_IN.iter().any(|(g, r, ns, n)| {
        *g == ar.group && *r == ar.plural && (*ns == "*" || *ns == namespace) && *n == name
    }) {
        return Some("made by every cluster at its start");
    }
    if meta["labels"]["kubernetes.io/bootstrapping"] == "rbac-defaults" {
        return Some("a default RBAC object");
    }
    // The roles `--init` makes for joining (kubeadm's names).
    if ar.group == "rbac.authorization.k8s.io"
        && name.starts_with("kubeadm:")
        && matches!(namespace, "kube-system" | "kube-public")
    {
        return Some("made by --init for joining");
    }
    if ar.group.is_empty()
        && ar.plural == "secrets"
        && DERIVED_SECRET_TYPES.contains(&obj["type"].as_str().unwrap_or_default())
    {
        return Some("a token the cluster manages");
    }
    None
}

/// Annotations the server or a controller sets.
const SERVER_ANNOTATIONS: &[&str] = &[
    "deployment.kubernetes.io/revision",
    "deployment.kubernetes.io/desired-replicas",
    "deployment.kubernetes.io/max-replicas",
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    "pv.kubernetes.io/provisioned-by",
    "volume.kubernetes.io/selected-node",
];

/// `obj` without what the server set: identity and bookkeeping in metadata, status, the
/// allocated ClusterIPs (unless kept), bindings a controller made.
fn strip(ar: &ApiResource, mut obj: Value, keep_cluster_ips: bool) -> Value {
    if let Some(meta) = obj["metadata"].as_object_mut() {
        for field in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
            "generation",
            "selfLink",
            "ownerReferences",
            "deletionGracePeriodSeconds",
        ] {
            meta.shift_remove(field);
        }
        if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.retain(|k, _| !SERVER_ANNOTATIONS.contains(&k.as_str()));
            if annotations.is_empty() {
                meta.shift_remove("annotations");
            }
        }
        // Finalizers of Kubernetes' own controllers come back with them.
        if let Some(finalizers) = meta.get_mut("finalizers").and_then(Value::as_array_mut) {
            finalizers.retain(|f| !f.as_str().unwrap_or_default().contains("kubernetes.io/"));
            if finalizers.is_empty() {
                meta.shift_remove("finalizers");
            }
        }
    }
    if let Some(o) = obj.as_object_mut() {
        o.shift_remove("status");
    }
    let spec = obj.get_mut("spec").and_then(Value::as_object_mut);
    match (ar.group.as_str(), ar.plural.as_str(), spec) {
        // The namespace controller's finalizer is all a Namespace's spec holds.
        ("", "namespaces", _) => {
            if let Some(o) = obj.as_object_mut() {
                o.shift_remove("spec");
            }
        }
        ("", "services", Some(spec)) => {
            let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
            if !keep_cluster_ips && !headless {
                spec.shift_remove("clusterIP");
                spec.shift_remove("clusterIPs");
            }
        }
        // The binder's choice; the claim binds again in the new cluster.
        ("", "persistentvolumeclaims", Some(spec)) => {
            spec.shift_remove("volumeName");
        }
        ("", "persistentvolumes", Some(spec)) => {
            spec.shift_remove("claimRef");
        }
        // The scheduler's choice; the pod is placed again on the new cluster's nodes.
        ("", "pods", Some(spec)) => {
            spec.shift_remove("nodeName");
        }
        ("", "serviceaccounts", _) => {
            if let Some(o) = obj.as_object_mut() {
                o.shift_remove("secrets");
            }
        }
        _ => {}
    }
    obj
}

/// The desired state, in export order, and a count per resource.
async fn export(client: &kube::Client, keep_cluster_ips: bool) -> Result<(Vec<Value>, String)> {
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .context("discovering the API's resources")?;
    let mut docs = Vec::new();
    let mut counts: Vec<(String, usize)> = Vec::new();
    for (ar, _caps) in exportable(&discovery) {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let list = api
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing {}", ar.plural))?;
        let mut n = 0;
        let mut objects: Vec<Value> = list
            .items
            .into_iter()
            .map(|o| serde_json::to_value(o).map_err(anyhow::Error::from))
            .collect::<Result<_>>()?;
        // Lists carry no kind on their items in some servers: set it from discovery.
        for obj in &mut objects {
            obj["apiVersion"] = Value::String(ar.api_version.clone());
            obj["kind"] = Value::String(ar.kind.clone());
        }
        objects.sort_by(|a, b| {
            let key = |o: &Value| {
                (
                    o["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    o["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            };
            key(a).cmp(&key(b))
        });
        for obj in objects {
            if derived(&ar, &obj).is_some() {
                continue;
            }
            docs.push(strip(&ar, obj, keep_cluster_ips));
            n += 1;
        }
        if n > 0 {
            counts.push((ar.plural.clone(), n));
        }
    }
    let summary = counts
        .iter()
        .map(|(r, n)| format!("{n} {r}"))
        .collect::<Vec<_>>()
        .join(", ");
    Ok((docs, summary))
}

fn to_yaml(docs: &[Value]) -> Result<String> {
    let mut out = String::from(
        "# rkube backup export: the cluster's desired state (what was declared, not what the\n\
         # cluster derived). Restore with `kubectl apply -f FILE` or `rkube backup import FILE`.\n",
    );
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(doc)?);
    }
    Ok(out)
}

fn parse_yaml(text: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc).with_context(|| format!("document {}", i + 1))?;
        if value.is_null() {
            continue;
        }
        if value["kind"].as_str().unwrap_or_default().is_empty()
            || value["apiVersion"].as_str().unwrap_or_default().is_empty()
            || value["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
        {
            bail!(
                "document {} is not a Kubernetes object (it needs apiVersion, kind and metadata.name)",
                i + 1
            );
        }
        docs.push(value);
    }
    Ok(docs)
}

/// Server-side applies every document in order; returns how many.
async fn import(client: &kube::Client, docs: Vec<Value>) -> Result<usize> {
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .context("discovering the API's resources")?;
    let params = PatchParams::apply("rkube-backup").force();
    let mut resolved: BTreeMap<(String, String), (ApiResource, ApiCapabilities)> = BTreeMap::new();
    for (i, doc) in docs.iter().enumerate() {
        let api_version = doc["apiVersion"].as_str().unwrap_or_default().to_string();
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let key = (api_version.clone(), kind.clone());
        if !resolved.contains_key(&key) {
            let (group, version) = match api_version.split_once('/') {
                Some((g, v)) => (g.to_string(), v.to_string()),
                None => (String::new(), api_version.clone()),
            };
            let gvk = GroupVersionKind::gvk(&group, &version, &kind);
            let found = discovery.resolve_gvk(&gvk).ok_or_else(|| {
                anyhow!(
                    "document {}: the cluster does not serve {kind} in {api_version}",
                    i + 1
                )
            })?;
            resolved.insert(key.clone(), found);
        }
        let (ar, caps) = &resolved[&key];
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                doc["metadata"]["namespace"].as_str().unwrap_or("default"),
                ar,
            ),
            Scope::Cluster => Api::all_with(client.clone(), ar),
        };
        api.patch(name, &params, &Patch::Apply(doc))
            .await
            .with_context(|| format!("applying {kind} {name} (document {})", i + 1))?;
    }
    Ok(docs.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: if group.is_empty() {
                version.into()
            } else {
                format!("{group}/{version}")
            },
            kind: kind.into(),
            plural: plural.into(),
        }
    }

    #[test]
    fn what_a_controller_or_the_cluster_made_is_not_desired_state() {
        let pods = ar("", "v1", "Pod", "pods");
        let owned = json!({"metadata": {"name": "web-1", "namespace": "default",
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web", "controller": true}]}});
        assert_eq!(derived(&pods, &owned), Some("made by its controller"));
        let bare = json!({"metadata": {"name": "debug", "namespace": "default"}});
        assert_eq!(derived(&pods, &bare), None);
        let sa = ar("", "v1", "ServiceAccount", "serviceaccounts");
        let default = json!({"metadata": {"name": "default", "namespace": "dev"}});
        assert!(derived(&sa, &default).is_some());
        let ci = json!({"metadata": {"name": "ci", "namespace": "dev"}});
        assert_eq!(derived(&sa, &ci), None);
        let secrets = ar("", "v1", "Secret", "secrets");
        let token = json!({"type": "bootstrap.kubernetes.io/token",
            "metadata": {"name": "bootstrap-token-abcdef", "namespace": "kube-system"}});
        assert!(derived(&secrets, &token).is_some());
        let opaque =
            json!({"type": "Opaque", "metadata": {"name": "db", "namespace": "kube-system"}});
        assert_eq!(derived(&secrets, &opaque), None);
        let roles = ar(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
        );
        let view = json!({"metadata": {"name": "view",
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}});
        assert!(derived(&roles, &view).is_some());
    }

    #[test]
    fn stripping_leaves_what_was_declared() {
        let services = ar("", "v1", "Service", "services");
        let svc = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default", "uid": "u", "resourceVersion": "7",
                "creationTimestamp": "2026-01-01T00:00:00Z", "managedFields": [],
                "ownerReferences": [{"kind": "X", "name": "y"}],
                "annotations": {"team": "a"}},
            "spec": {"clusterIP": "10.96.0.7", "clusterIPs": ["10.96.0.7"], "ports": [{"port": 80}]},
            "status": {"loadBalancer": {}}});
        assert_eq!(
            strip(&services, svc.clone(), false),
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "default", "annotations": {"team": "a"}},
                "spec": {"ports": [{"port": 80}]}})
        );
        assert_eq!(
            strip(&services, svc, true)["spec"]["clusterIP"],
            json!("10.96.0.7")
        );
        let headless = json!({"metadata": {"name": "db"}, "spec": {"clusterIP": "None"}});
        assert_eq!(
            strip(&services, headless, false)["spec"]["clusterIP"],
            json!("None")
        );
        let deployments = ar("apps", "v1", "Deployment", "deployments");
        let d = json!({"metadata": {"name": "web", "generation": 3,
            "annotations": {"deployment.kubernetes.io/revision": "2"}}, "spec": {"replicas": 3}});
        assert_eq!(
            strip(&deployments, d, false),
            json!({"metadata": {"name": "web"}, "spec": {"replicas": 3}})
        );
    }

    #[test]
    fn namespaces_come_first_and_services_after_workloads() {
        let ns = ar("", "v1", "Namespace", "namespaces");
        let rb = ar(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
        );
        let dep = ar("apps", "v1", "Deployment", "deployments");
        let svc = ar("", "v1", "Service", "services");
        let other = ar("example.com", "v1", "Widget", "widgets");
        let quota = ar("", "v1", "ResourceQuota", "resourcequotas");
        assert!(rank(&ns) < rank(&rb));
        assert!(rank(&rb) < rank(&dep));
        assert!(rank(&dep) < rank(&svc));
        assert!(rank(&svc) < rank(&other));
        assert!(rank(&other) < rank(&quota));
    }

    #[test]
    fn import_refuses_what_is_not_an_object() {
        let err = parse_yaml("---\nkind: Pod\napiVersion: v1\n").unwrap_err();
        assert!(err.to_string().contains("document 1"), "{err}");
        let docs =
            parse_yaml("# c\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: dev\n---\n")
                .unwrap();
        assert_eq!(docs.len(), 1);
    }
}
