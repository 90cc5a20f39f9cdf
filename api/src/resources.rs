//! The table of served resources: what discovery lists, how a URL maps to a resource, and where
//! its objects live in the store (Kubernetes' own registry layout), and each kind's
//! [`Strategy`].

use crate::strategy::{self, Strategy};

/// One served resource (a REST collection).
#[derive(Debug)]
pub struct Resource {
    /// API group; empty for the core ("legacy") group served under /api.
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// Plural, lower-case name used in URLs (`pods`).
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Subresources served besides the main resource.
    pub subresources: &'static [&'static str],
    /// The store folder under /registry (Kubernetes' names: `minions` for nodes...).
    pub storage: &'static str,
    /// Verbs served; `create`-only kinds (reviews) serve nothing else.
    pub verbs: &'static [&'static str],
    /// Whether `metadata.generation` counts spec changes (kinds with a spec).
    pub has_spec: bool,
    /// What is special about the kind on create, update and delete.
    pub strategy: &'static dyn Strategy,
}

pub const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const CREATE_ONLY: &[&str] = &["create"];
const READ_ONLY: &[&str] = &["get", "list"];

impl Resource {
    /// `apps/v1`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `deployments.apps`, or `pods` for the core group (the name RBAC and errors use).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn serves(&self, verb: &str) -> bool {
        self.verbs.contains(&verb)
    }

    /// Whether the objects are answered, never stored (reviews, bindings, component
    /// statuses): the resource has no store folder.
    pub fn is_virtual(&self) -> bool {
        self.storage.is_empty()
    }

    /// The store key of one object.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("/registry/{}/{}/{}", self.storage, ns, name),
            _ => format!("/registry/{}/{}", self.storage, name),
        }
    }

    /// The API path of one object (`namespace` is ignored for a cluster-scoped resource).
    pub fn path(&self, namespace: &str, name: &str) -> String {
        let ns = if self.namespaced { namespace } else { "" };
        let collection =
            rkube_core::path::collection_of(self.group, &self.api_version(), self.plural, ns);
        format!("{collection}/{name}")
    }

    /// The store prefix of a collection: one namespace's, or all of them.
    pub fn prefix(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("/registry/{}/{}/", self.storage, ns),
            _ => format!("/registry/{}/", self.storage),
        }
    }
}

macro_rules! res {
    ($group:expr, $version:expr, $kind:expr, $plural:expr, $singular:expr, $ns:expr,
     short: [$($short:expr),*], cat: [$($cat:expr),*], sub: [$($sub:expr),*],
     storage: $storage:expr, verbs: $verbs:expr, spec: $spec:expr) => {
        res!($group, $version, $kind, $plural, $singular, $ns, short: [$($short),*],
             cat: [$($cat),*], sub: [$($sub),*], storage: $storage, verbs: $verbs, spec: $spec,
             strategy: &strategy::Generic)
    };
    ($group:expr, $version:expr, $kind:expr, $plural:expr, $singular:expr, $ns:expr,
     short: [$($short:expr),*], cat: [$($cat:expr),*], sub: [$($sub:expr),*],
     storage: $storage:expr, verbs: $verbs:expr, spec: $spec:expr,
     strategy: $strategy:expr) => {
        Resource {
            group: $group,
            version: $version,
            kind: $kind,
            plural: $plural,
            singular: $singular,
            namespaced: $ns,
            short_names: &[$($short),*],
            categories: &[$($cat),*],
            subresources: &[$($sub),*],
            storage: $storage,
            verbs: $verbs,
            has_spec: $spec,
            strategy: $strategy,
        }
    };
}

/// Every served resource, in discovery order.
pub static RESOURCES: &[Resource] = &[
    // core/v1
    res!("", "v1", "Namespace", "namespaces", "namespace", false, short: ["ns"], cat: [],
         sub: ["status", "finalize"], storage: "namespaces", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::namespace::Namespace),
    res!("", "v1", "Pod", "pods", "pod", true, short: ["po"], cat: ["all"],
         sub: ["status", "binding", "eviction", "log", "exec", "attach", "portforward"],
         storage: "pods", verbs: ALL_VERBS, spec: false, strategy: &strategy::pod::Pod),
    res!("", "v1", "Node", "nodes", "node", false, short: ["no"], cat: [],
         sub: ["status"], storage: "minions", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::node::Node),
    res!("", "v1", "Service", "services", "service", true, short: ["svc"], cat: ["all"],
         sub: ["status"], storage: "services/specs", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::service::Service),
    res!("", "v1", "Endpoints", "endpoints", "endpoints", true, short: ["ep"], cat: [],
         sub: [], storage: "services/endpoints", verbs: ALL_VERBS, spec: false),
    res!("", "v1", "ConfigMap", "configmaps", "configmap", true, short: ["cm"], cat: [],
         sub: [], storage: "configmaps", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::configmap::ConfigMap),
    res!("", "v1", "Secret", "secrets", "secret", true, short: [], cat: [],
         sub: [], storage: "secrets", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::secret::Secret),
    res!("", "v1", "Event", "events", "event", true, short: ["ev"], cat: [],
         sub: [], storage: "events", verbs: ALL_VERBS, spec: false),
    res!("", "v1", "ServiceAccount", "serviceaccounts", "serviceaccount", true, short: ["sa"],
         cat: [], sub: ["token"], storage: "serviceaccounts", verbs: ALL_VERBS, spec: false),
    res!("", "v1", "ReplicationController", "replicationcontrollers", "replicationcontroller",
         true, short: ["rc"], cat: ["all"], sub: ["scale", "status"], storage: "controllers",
         verbs: ALL_VERBS, spec: true, strategy: &strategy::replicationcontroller::ReplicationController),
    res!("", "v1", "ResourceQuota", "resourcequotas", "resourcequota", true, short: ["quota"],
         cat: [], sub: ["status"], storage: "resourcequotas", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::resourcequota::ResourceQuota),
    res!("", "v1", "LimitRange", "limitranges", "limitrange", true, short: ["limits"], cat: [],
         sub: [], storage: "limitranges", verbs: ALL_VERBS, spec: false),
    res!("", "v1", "PodTemplate", "podtemplates", "podtemplate", true, short: [], cat: [],
         sub: [], storage: "podtemplates", verbs: ALL_VERBS, spec: true,
         strategy: &strategy::podtemplate::PodTemplate),
    // Storage: volumes, and claims bound to them by the PV binder.
    res!("", "v1", "PersistentVolume", "persistentvolumes", "persistentvolume", false,
         short: ["pv"], cat: [], sub: ["status"], storage: "persistentvolumes",
         verbs: ALL_VERBS, spec: false, strategy: &strategy::persistentvolume::PersistentVolume),
    res!("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", "persistentvolumeclaim",
         true, short: ["pvc"], cat: [], sub: ["status"], storage: "persistentvolumeclaims",
         verbs: ALL_VERBS, spec: false,
         strategy: &strategy::persistentvolumeclaim::PersistentVolumeClaim),
    // A Binding assigns the pod it names to a node (pods/binding by another path); answered.
    res!("", "v1", "Binding", "bindings", "binding", true, short: [], cat: [], sub: [],
         storage: "", verbs: CREATE_ONLY, spec: false),
    // The health of the control plane's parts, worked out on each read; never stored.
    res!("", "v1", "ComponentStatus", "componentstatuses", "componentstatus", false,
         short: ["cs"], cat: [], sub: [], storage: "", verbs: READ_ONLY, spec: false),
    // apps/v1
    res!("apps", "v1", "Deployment", "deployments", "deployment", true, short: ["deploy"],
         cat: ["all"], sub: ["scale", "status"], storage: "deployments", verbs: ALL_VERBS,
         spec: true, strategy: &strategy::deployment::Deployment),
    res!("apps", "v1", "ReplicaSet", "replicasets", "replicaset", true, short: ["rs"],
         cat: ["all"], sub: ["scale", "status"], storage: "replicasets", verbs: ALL_VERBS,
         spec: true, strategy: &strategy::replicaset::ReplicaSet),
    res!("apps", "v1", "DaemonSet", "daemonsets", "daemonset", true, short: ["ds"],
         cat: ["all"], sub: ["status"], storage: "daemonsets", verbs: ALL_VERBS, spec: true,
         strategy: &strategy::daemonset::DaemonSet),
    res!("apps", "v1", "StatefulSet", "statefulsets", "statefulset", true, short: ["sts"],
         cat: ["all"], sub: ["scale", "status"], storage: "statefulsets", verbs: ALL_VERBS,
         spec: true, strategy: &strategy::statefulset::StatefulSet),
    res!("apps", "v1", "ControllerRevision", "controllerrevisions", "controllerrevision", true,
         short: [], cat: [], sub: [], storage: "controllerrevisions", verbs: ALL_VERBS,
         spec: false, strategy: &strategy::controllerrevision::ControllerRevision),
    // batch/v1
    res!("batch", "v1", "Job", "jobs", "job", true, short: [], cat: ["all"], sub: ["status"],
         storage: "jobs", verbs: ALL_VERBS, spec: true, strategy: &strategy::job::Job),
    res!("batch", "v1", "CronJob", "cronjobs", "cronjob", true, short: ["cj"], cat: ["all"],
         sub: ["status"], storage: "cronjobs", verbs: ALL_VERBS, spec: true,
         strategy: &strategy::cronjob::CronJob),
    // autoscaling/v2: kept by the HorizontalPodAutoscaler controller.
    res!("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers",
         "horizontalpodautoscaler", true, short: ["hpa"], cat: ["all"], sub: ["status"],
         storage: "horizontalpodautoscalers", verbs: ALL_VERBS, spec: true,
         strategy: &strategy::horizontalpodautoscaler::HorizontalPodAutoscaler),
    // autoscaling/v1: the same objects, converted (targetCPUUtilizationPercentage).
    res!("autoscaling", "v1", "HorizontalPodAutoscaler", "horizontalpodautoscalers",
         "horizontalpodautoscaler", true, short: ["hpa"], cat: ["all"], sub: ["status"],
         storage: "horizontalpodautoscalers", verbs: ALL_VERBS, spec: true,
         strategy: &strategy::horizontalpodautoscaler::HorizontalPodAutoscaler),
    // coordination.k8s.io/v1
    res!("coordination.k8s.io", "v1", "Lease", "leases", "lease", true, short: [], cat: [],
         sub: [], storage: "leases", verbs: ALL_VERBS, spec: false),
    // discovery.k8s.io/v1
    res!("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", "endpointslice", true,
         short: [], cat: [], sub: [], storage: "endpointslices", verbs: ALL_VERBS, spec: false),
    // events.k8s.io/v1 shares the store with core events, as in Kubernetes.
    res!("events.k8s.io", "v1", "Event", "events", "event", true, short: ["ev"], cat: [],
         sub: [], storage: "events", verbs: ALL_VERBS, spec: false),
    // rbac.authorization.k8s.io/v1
    res!("rbac.authorization.k8s.io", "v1", "Role", "roles", "role", true, short: [], cat: [],
         sub: [], storage: "roles", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::rbac::Rbac),
    res!("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", "clusterrole", false,
         short: [], cat: [], sub: [], storage: "clusterroles", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::rbac::Rbac),
    res!("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", "rolebinding", true,
         short: [], cat: [], sub: [], storage: "rolebindings", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::rbac::Rbac),
    res!("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings",
         "clusterrolebinding", false, short: [], cat: [], sub: [],
         storage: "clusterrolebindings", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::rbac::Rbac),
    // certificates.k8s.io/v1
    res!("certificates.k8s.io", "v1", "CertificateSigningRequest", "certificatesigningrequests",
         "certificatesigningrequest", false, short: ["csr"], cat: [], sub: ["approval", "status"],
         storage: "certificatesigningrequests", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::certificatesigningrequest::CertificateSigningRequest),
    // authorization.k8s.io/v1: answered, never stored.
    res!("authorization.k8s.io", "v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews",
         "selfsubjectaccessreview", false, short: [], cat: [], sub: [], storage: "",
         verbs: CREATE_ONLY, spec: false),
    res!("authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews",
         "subjectaccessreview", false, short: [], cat: [], sub: [], storage: "",
         verbs: CREATE_ONLY, spec: false),
    res!("authorization.k8s.io", "v1", "LocalSubjectAccessReview", "localsubjectaccessreviews",
         "localsubjectaccessreview", true, short: [], cat: [], sub: [], storage: "",
         verbs: CREATE_ONLY, spec: false),
    res!("authorization.k8s.io", "v1", "SelfSubjectRulesReview", "selfsubjectrulesreviews",
         "selfsubjectrulesreview", false, short: [], cat: [], sub: [], storage: "",
         verbs: CREATE_ONLY, spec: false),
    // authentication.k8s.io/v1: answered, never stored.
    res!("authentication.k8s.io", "v1", "TokenReview", "tokenreviews", "tokenreview", false,
         short: [], cat: [], sub: [], storage: "", verbs: CREATE_ONLY, spec: false),
    res!("authentication.k8s.io", "v1", "SelfSubjectReview", "selfsubjectreviews",
         "selfsubjectreview", false, short: [], cat: [], sub: [], storage: "",
         verbs: CREATE_ONLY, spec: false),
    // networking.k8s.io/v1: stored; no controller here acts on them.
    res!("networking.k8s.io", "v1", "Ingress", "ingresses", "ingress", true, short: ["ing"],
         cat: [], sub: ["status"], storage: "ingress", verbs: ALL_VERBS, spec: true,
         strategy: &strategy::ingress::Ingress),
    res!("networking.k8s.io", "v1", "IngressClass", "ingressclasses", "ingressclass", false,
         short: [], cat: [], sub: [], storage: "ingressclasses", verbs: ALL_VERBS, spec: true,
         strategy: &strategy::ingressclass::IngressClass),
    res!("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", "networkpolicy", true,
         short: ["netpol"], cat: [], sub: [], storage: "networkpolicies", verbs: ALL_VERBS,
         spec: true, strategy: &strategy::networkpolicy::NetworkPolicy),
    // policy/v1: kept by the disruption controller, read by pods/eviction.
    res!("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", "poddisruptionbudget",
         true, short: ["pdb"], cat: [], sub: ["status"], storage: "poddisruptionbudgets",
         verbs: ALL_VERBS, spec: true,
         strategy: &strategy::poddisruptionbudget::PodDisruptionBudget),
    // node.k8s.io/v1
    res!("node.k8s.io", "v1", "RuntimeClass", "runtimeclasses", "runtimeclass", false,
         short: [], cat: [], sub: [], storage: "runtimeclasses", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::runtimeclass::RuntimeClass),
    // storage.k8s.io/v1: StorageClasses (the built-in local-path provisioner acts on its
    // own), and the CSI kinds, stored for CSI drivers and their sidecars.
    res!("storage.k8s.io", "v1", "StorageClass", "storageclasses", "storageclass", false,
         short: ["sc"], cat: [], sub: [], storage: "storageclasses", verbs: ALL_VERBS,
         spec: false, strategy: &strategy::storageclass::StorageClass),
    res!("storage.k8s.io", "v1", "CSIDriver", "csidrivers", "csidriver", false, short: [],
         cat: [], sub: [], storage: "csidrivers", verbs: ALL_VERBS, spec: true,
         strategy: &strategy::csidriver::CsiDriver),
    res!("storage.k8s.io", "v1", "CSINode", "csinodes", "csinode", false, short: [], cat: [],
         sub: [], storage: "csinodes", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::csinode::CsiNode),
    res!("storage.k8s.io", "v1", "CSIStorageCapacity", "csistoragecapacities",
         "csistoragecapacity", true, short: [], cat: [], sub: [],
         storage: "csistoragecapacities", verbs: ALL_VERBS, spec: false,
         strategy: &strategy::csistoragecapacity::CsiStorageCapacity),
    res!("storage.k8s.io", "v1", "VolumeAttachment", "volumeattachments", "volumeattachment",
         false, short: [], cat: [], sub: ["status"], storage: "volumeattachments",
         verbs: ALL_VERBS, spec: false, strategy: &strategy::volumeattachment::VolumeAttachment),
    // metrics.k8s.io/v1beta1: resource usage scraped from the agents, as metrics-server
    // serves it; never stored.
    res!("metrics.k8s.io", "v1beta1", "NodeMetrics", "nodes", "", false, short: [], cat: [],
         sub: [], storage: "", verbs: READ_ONLY, spec: false),
    res!("metrics.k8s.io", "v1beta1", "PodMetrics", "pods", "", true, short: [], cat: [],
         sub: [], storage: "", verbs: READ_ONLY, spec: false),
    // scheduling.k8s.io/v1
    res!("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", "priorityclass", false,
         short: ["pc"], cat: [], sub: [], storage: "priorityclasses", verbs: ALL_VERBS,
         spec: false, strategy: &strategy::priorityclass::PriorityClass),
];

/// The served group versions, in discovery order (a group's preferred version first).
pub fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !out.iter().any(|(g, v)| *g == r.group && *v == r.version) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// The resource served at `group/version/plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The served groups, each with its versions, the preferred one first.
pub fn group_versions() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&str, Vec<&str>)> = Vec::new();
    for (g, v) in groups() {
        match out.iter_mut().find(|(x, _)| *x == g) {
            Some((_, versions)) => versions.push(v),
            None => out.push((g, vec![v])),
        }
    }
    out
}

/// The resource of a kind in a group (for `kind` fields and owner references).
pub fn by_kind(group: &str, kind: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_registry_layout() {
        let pods = find("", "v1", "pods").unwrap();
        assert_eq!(
            pods.key(Some("default"), "nginx"),
            "/registry/pods/default/nginx"
        );
        assert_eq!(pods.prefix(None), "/registry/pods/");
        let nodes = find("", "v1", "nodes").unwrap();
        assert_eq!(nodes.key(None, "n1"), "/registry/minions/n1");
        assert_eq!(nodes.path("ignored", "n1"), "/api/v1/nodes/n1");
        let jobs = find("batch", "v1", "jobs").unwrap();
        assert_eq!(
            jobs.path("ns", "pi"),
            "/apis/batch/v1/namespaces/ns/jobs/pi"
        );
        let svc = find("", "v1", "services").unwrap();
        assert_eq!(
            svc.key(Some("default"), "web"),
            "/registry/services/specs/default/web"
        );
        assert_eq!(
            find("apps", "v1", "deployments").unwrap().qualified(),
            "deployments.apps"
        );
    }

    #[test]
    fn every_resource_is_unique_in_its_group() {
        for (i, a) in RESOURCES.iter().enumerate() {
            for b in &RESOURCES[i + 1..] {
                assert!(
                    !(a.group == b.group && a.version == b.version && a.plural == b.plural),
                    "{} served twice",
                    a.qualified()
                );
            }
        }
    }
}
