//! The schemas of the served types, generated from k8s-openapi's Kubernetes 1.32 types.
//!
//! schemars gives each type's JSON Schema under Kubernetes' own definition name
//! (`io.k8s.api.core.v1.Pod`); the documents turn those into Swagger 2.0 definitions and
//! OpenAPI v3 component schemas, and field validation walks them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::{
    apps::v1 as apps, authentication::v1 as authentication, authorization::v1 as authorization,
    autoscaling::v1 as autoscaling, batch::v1 as batch, certificates::v1 as certificates,
    coordination::v1 as coordination, core::v1 as core, discovery::v1 as discovery,
    events::v1 as events, networking::v1 as networking, node::v1 as node, policy::v1 as policy,
    rbac::v1 as rbac, scheduling::v1 as scheduling, storage::v1 as storage,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::schemars::generate::{SchemaGenerator, SchemaSettings};
use k8s_openapi::schemars::JsonSchema;
use serde_json::{json, Map, Value};

use crate::resources::{Resource, RESOURCES};

/// Where the generator points its references; rewritten per document format.
const REF_PREFIX: &str = "#/definitions/";

/// Every definition, by Kubernetes' name, with references as `#/definitions/<name>`.
pub struct Schemas {
    pub defs: BTreeMap<String, Value>,
}

/// The definition names of the meta/v1 types every group's documents use.
pub const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
pub const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
pub const WATCH_EVENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent";
pub const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
pub const RESOURCE_LIST: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";

/// Adds the schema of a served kind (or of a subresource's kind) to the generator and returns
/// its definition name.
fn add(gen: &mut SchemaGenerator, group: &str, version: &str, kind: &str) -> Option<String> {
    fn named<T: JsonSchema>(gen: &mut SchemaGenerator) -> Option<String> {
        gen.subschema_for::<T>();
        Some(T::schema_name().into_owned())
    }
    match (group, version, kind) {
        ("autoscaling", "v1", "HorizontalPodAutoscaler") => {
            return named::<autoscaling::HorizontalPodAutoscaler>(gen)
        }
        ("autoscaling", "v2", "HorizontalPodAutoscaler") => {
            return named::<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>(gen)
        }
        _ => {}
    }
    match (group, kind) {
        ("", "Namespace") => named::<core::Namespace>(gen),
        ("", "Pod") => named::<core::Pod>(gen),
        ("", "Node") => named::<core::Node>(gen),
        ("", "Service") => named::<core::Service>(gen),
        ("", "Endpoints") => named::<core::Endpoints>(gen),
        ("", "ConfigMap") => named::<core::ConfigMap>(gen),
        ("", "Secret") => named::<core::Secret>(gen),
        ("", "Event") => named::<core::Event>(gen),
        ("", "ServiceAccount") => named::<core::ServiceAccount>(gen),
        ("", "ReplicationController") => named::<core::ReplicationController>(gen),
        ("", "ResourceQuota") => named::<core::ResourceQuota>(gen),
        ("", "LimitRange") => named::<core::LimitRange>(gen),
        ("", "Binding") => named::<core::Binding>(gen),
        ("", "PodTemplate") => named::<core::PodTemplate>(gen),
        ("", "PersistentVolume") => named::<core::PersistentVolume>(gen),
        ("", "PersistentVolumeClaim") => named::<core::PersistentVolumeClaim>(gen),
        ("", "ComponentStatus") => named::<core::ComponentStatus>(gen),
        ("apps", "Deployment") => named::<apps::Deployment>(gen),
        ("apps", "ReplicaSet") => named::<apps::ReplicaSet>(gen),
        ("apps", "ControllerRevision") => named::<apps::ControllerRevision>(gen),
        ("apps", "DaemonSet") => named::<apps::DaemonSet>(gen),
        ("apps", "StatefulSet") => named::<apps::StatefulSet>(gen),
        ("autoscaling", "Scale") => named::<autoscaling::Scale>(gen),
        ("policy", "Eviction") => named::<policy::Eviction>(gen),
        ("batch", "Job") => named::<batch::Job>(gen),
        ("batch", "CronJob") => named::<batch::CronJob>(gen),
        ("coordination.k8s.io", "Lease") => named::<coordination::Lease>(gen),
        ("discovery.k8s.io", "EndpointSlice") => named::<discovery::EndpointSlice>(gen),
        ("events.k8s.io", "Event") => named::<events::Event>(gen),
        ("rbac.authorization.k8s.io", "Role") => named::<rbac::Role>(gen),
        ("rbac.authorization.k8s.io", "ClusterRole") => named::<rbac::ClusterRole>(gen),
        ("rbac.authorization.k8s.io", "RoleBinding") => named::<rbac::RoleBinding>(gen),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            named::<rbac::ClusterRoleBinding>(gen)
        }
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            named::<certificates::CertificateSigningRequest>(gen)
        }
        ("authorization.k8s.io", "SelfSubjectAccessReview") => {
            named::<authorization::SelfSubjectAccessReview>(gen)
        }
        ("authorization.k8s.io", "SubjectAccessReview") => {
            named::<authorization::SubjectAccessReview>(gen)
        }
        ("authorization.k8s.io", "LocalSubjectAccessReview") => {
            named::<authorization::LocalSubjectAccessReview>(gen)
        }
        ("authorization.k8s.io", "SelfSubjectRulesReview") => {
            named::<authorization::SelfSubjectRulesReview>(gen)
        }
        ("authentication.k8s.io", "TokenReview") => named::<authentication::TokenReview>(gen),
        ("authentication.k8s.io", "SelfSubjectReview") => {
            named::<authentication::SelfSubjectReview>(gen)
        }
        ("authentication.k8s.io", "TokenRequest") => named::<authentication::TokenRequest>(gen),
        ("scheduling.k8s.io", "PriorityClass") => named::<scheduling::PriorityClass>(gen),
        ("networking.k8s.io", "Ingress") => named::<networking::Ingress>(gen),
        ("networking.k8s.io", "IngressClass") => named::<networking::IngressClass>(gen),
        ("networking.k8s.io", "NetworkPolicy") => named::<networking::NetworkPolicy>(gen),
        ("policy", "PodDisruptionBudget") => named::<policy::PodDisruptionBudget>(gen),
        ("node.k8s.io", "RuntimeClass") => named::<node::RuntimeClass>(gen),
        ("storage.k8s.io", "StorageClass") => named::<storage::StorageClass>(gen),
        ("storage.k8s.io", "CSIDriver") => named::<storage::CSIDriver>(gen),
        ("storage.k8s.io", "CSINode") => named::<storage::CSINode>(gen),
        ("storage.k8s.io", "CSIStorageCapacity") => named::<storage::CSIStorageCapacity>(gen),
        ("storage.k8s.io", "VolumeAttachment") => named::<storage::VolumeAttachment>(gen),
        _ => None,
    }
}

/// The definition of NodeMetrics or PodMetrics (metrics.k8s.io/v1beta1).
fn metrics_schema(kind: &str) -> Value {
    let meta =
        |t: &str| json!({"$ref": format!("{REF_PREFIX}io.k8s.apimachinery.pkg.apis.meta.v1.{t}")});
    let usage = json!({"type": "object", "description": "The memory and CPU usage.",
        "additionalProperties": {"$ref": format!("{REF_PREFIX}io.k8s.apimachinery.pkg.api.resource.Quantity")}});
    let mut props = json!({
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": meta("ObjectMeta"),
        "timestamp": meta("Time"),
        "window": {"type": "string"},
    });
    if kind == "NodeMetrics" {
        props["usage"] = usage;
        json!({"description": "NodeMetrics sets resource usage metrics of a node.",
               "type": "object", "properties": props,
               "required": ["timestamp", "window", "usage"]})
    } else {
        props["containers"] = json!({"type": "array", "items": {
            "type": "object", "description": "ContainerMetrics sets resource usage metrics of a container.",
            "properties": {"name": {"type": "string"}, "usage": usage},
            "required": ["name", "usage"]}});
        json!({"description": "PodMetrics sets resource usage metrics of a pod.",
               "type": "object", "properties": props,
               "required": ["timestamp", "window", "containers"]})
    }
}

/// The kinds that subresources answer with, besides the served resources' own.
const SUBRESOURCE_KINDS: &[(&str, &str, &str)] = &[
    ("autoscaling", "v1", "Scale"),
    ("", "v1", "Binding"),
    ("policy", "v1", "Eviction"),
    ("authentication.k8s.io", "v1", "TokenRequest"),
];

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({"group": group, "version": version, "kind": kind})
}

/// The definition name of a resource's list kind: `io.k8s.api.core.v1.PodList`.
pub fn list_name(def: &str) -> String {
    format!("{def}List")
}

impl Schemas {
    fn build() -> Schemas {
        let settings = SchemaSettings::draft07().with(|s| {
            s.definitions_path = "/definitions".into();
            s.meta_schema = None;
            s.transforms = Vec::new();
        });
        let mut gen = SchemaGenerator::new(settings);
        gen.subschema_for::<meta::Status>();
        gen.subschema_for::<meta::DeleteOptions>();
        gen.subschema_for::<meta::WatchEvent<core::Pod>>();
        gen.subschema_for::<meta::Patch>();
        gen.subschema_for::<meta::APIResourceList>();
        gen.subschema_for::<meta::ListMeta>();
        let mut kinds: Vec<(String, &Resource)> = Vec::new();
        for r in RESOURCES {
            if let Some(name) = add(&mut gen, r.group, r.version, r.kind) {
                kinds.push((name, r));
            }
        }
        let mut extra = Vec::new();
        for (g, v, k) in SUBRESOURCE_KINDS {
            if let Some(name) = add(&mut gen, g, v, k) {
                extra.push((name, *g, *v, *k));
            }
        }
        let mut defs: BTreeMap<String, Value> = gen.take_definitions(false).into_iter().collect();
        // metrics.k8s.io's kinds have no k8s-openapi type: their definitions as metrics-server
        // publishes them.
        for r in RESOURCES.iter().filter(|r| r.group == "metrics.k8s.io") {
            let name = format!("io.k8s.metrics.pkg.apis.metrics.v1beta1.{}", r.kind);
            defs.insert(name.clone(), metrics_schema(r.kind));
            kinds.push((name, r));
        }
        let tag = |defs: &mut BTreeMap<String, Value>, name: &str, gvks: Vec<Value>| {
            if let Some(Value::Object(o)) = defs.get_mut(name) {
                o.insert("x-kubernetes-group-version-kind".into(), Value::Array(gvks));
            }
        };
        for (name, r) in &kinds {
            tag(&mut defs, name, vec![gvk(r.group, r.version, r.kind)]);
            let list = list_name(name);
            if !defs.contains_key(&list) {
                defs.insert(list.clone(), list_schema(name, r.kind));
                tag(
                    &mut defs,
                    &list,
                    vec![gvk(r.group, r.version, &format!("{}List", r.kind))],
                );
            }
        }
        for (name, g, v, k) in &extra {
            tag(&mut defs, name, vec![gvk(g, v, k)]);
        }
        // The meta/v1 types answer in every group version, as Kubernetes lists them.
        let every_gv: Vec<(&str, &str)> = {
            let mut gvs = crate::resources::groups();
            for (g, v, _) in SUBRESOURCE_KINDS {
                if !gvs.contains(&(*g, *v)) {
                    gvs.push((g, v));
                }
            }
            gvs
        };
        for kind in ["DeleteOptions", "WatchEvent"] {
            let name = format!("io.k8s.apimachinery.pkg.apis.meta.v1.{kind}");
            tag(
                &mut defs,
                &name,
                every_gv.iter().map(|(g, v)| gvk(g, v, kind)).collect(),
            );
        }
        tag(&mut defs, STATUS, vec![gvk("", "v1", "Status")]);
        crate::strategic::annotate(&mut defs);
        Schemas { defs }
    }

    /// The definition name of a resource's kind.
    pub fn kind_def(&self, group: &str, version: &str, kind: &str) -> Option<&str> {
        self.defs.iter().find_map(|(name, d)| {
            let tagged = d
                .get("x-kubernetes-group-version-kind")?
                .as_array()?
                .iter()
                .any(|g| g["group"] == group && g["version"] == version && g["kind"] == kind);
            tagged.then_some(name.as_str())
        })
    }

    /// The definition a `$ref` names.
    pub fn resolve<'a>(&'a self, schema: &'a Value) -> Option<&'a Value> {
        let mut s = schema;
        for _ in 0..16 {
            if let Some(r) = s.get("$ref").and_then(Value::as_str) {
                s = self.defs.get(ref_name(r))?;
                continue;
            }
            match s.get("allOf").and_then(Value::as_array).map(Vec::as_slice) {
                Some([only]) => s = only,
                _ => return Some(s),
            }
        }
        None
    }

    /// The definitions `roots` refer to, directly or not, and the roots themselves.
    pub fn closure<'a>(&self, roots: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<String> = roots.into_iter().map(str::to_string).collect();
        while let Some(name) = todo.pop() {
            if !seen.insert(name.clone()) {
                continue;
            }
            if let Some(d) = self.defs.get(&name) {
                collect_refs(d, &mut todo);
            }
        }
        seen.retain(|n| self.defs.contains_key(n));
        seen
    }
}

/// The name in a `#/definitions/<name>` or `#/components/schemas/<name>` reference.
pub fn ref_name(r: &str) -> &str {
    r.rsplit('/').next().unwrap_or(r)
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                match (k.as_str(), x) {
                    ("$ref", Value::String(r)) => out.push(ref_name(r).to_string()),
                    _ => collect_refs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_refs(x, out)),
        _ => {}
    }
}

fn list_schema(item: &str, kind: &str) -> Value {
    json!({
        "description": format!("{kind}List is a list of {kind} objects."),
        "type": "object",
        "properties": {
            "apiVersion": {
                "description": "APIVersion defines the versioned schema of this representation of an object.",
                "type": "string",
            },
            "items": {
                "description": format!("List of {kind} objects."),
                "type": "array",
                "items": {"$ref": format!("{REF_PREFIX}{item}")},
            },
            "kind": {
                "description": "Kind is a string value representing the REST resource this object represents.",
                "type": "string",
            },
            "metadata": {
                "$ref": format!("{REF_PREFIX}{LIST_META}"),
                "description": "Standard list metadata.",
            },
        },
        "required": ["items"],
    })
}

/// A schema as OpenAPI v3.0 has it: references into `#/components/schemas/`; a reference with
/// siblings (a description) is wrapped in `allOf`, since v3.0 ignores a `$ref`'s siblings.
pub fn to_v3(v: &Value) -> Value {
    match v {
        Value::Object(o) => {
            let mut out = Map::new();
            for (k, x) in o {
                match (k.as_str(), x) {
                    ("$ref", Value::String(r)) => {
                        out.insert(
                            k.clone(),
                            json!(format!("#/components/schemas/{}", ref_name(r))),
                        );
                    }
                    // Names of properties, not schemas: walk their values only.
                    ("properties", Value::Object(props)) => {
                        out.insert(
                            k.clone(),
                            Value::Object(
                                props.iter().map(|(p, s)| (p.clone(), to_v3(s))).collect(),
                            ),
                        );
                    }
                    ("x-kubernetes-group-version-kind", _) => {
                        out.insert(k.clone(), x.clone());
                    }
                    _ => {
                        out.insert(k.clone(), to_v3(x));
                    }
                }
            }
            if out.len() > 1 {
                if let Some(r) = out.shift_remove("$ref") {
                    out.insert("allOf".into(), json!([{"$ref": r}]));
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(to_v3).collect()),
        other => other.clone(),
    }
}

/// The schemas, built once.
pub fn schemas() -> &'static Schemas {
    static SCHEMAS: std::sync::OnceLock<Schemas> = std::sync::OnceLock::new();
    SCHEMAS.get_or_init(Schemas::build)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_kind_has_a_schema_and_a_list() {
        let s = schemas();
        for r in RESOURCES {
            let def = s
                .kind_def(r.group, r.version, r.kind)
                .unwrap_or_else(|| panic!("no schema for {}", r.qualified()));
            let list = format!("{}List", r.kind);
            assert!(
                s.kind_def(r.group, r.version, &list).is_some(),
                "no list schema for {def}"
            );
        }
        assert_eq!(s.kind_def("", "v1", "Pod"), Some("io.k8s.api.core.v1.Pod"));
        assert_eq!(
            s.kind_def("events.k8s.io", "v1", "Event"),
            Some("io.k8s.api.events.v1.Event")
        );
    }

    #[test]
    fn references_resolve() {
        let s = schemas();
        let closure = s.closure(["io.k8s.api.apps.v1.Deployment"]);
        assert!(closure.contains("io.k8s.api.core.v1.PodSpec"));
        assert!(closure.contains("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"));
        let mut refs = Vec::new();
        for d in s.defs.values() {
            collect_refs(d, &mut refs);
        }
        for r in refs {
            assert!(s.defs.contains_key(&r), "{r} is referenced but not defined");
        }
    }

    #[test]
    fn v3_wraps_references_with_siblings() {
        let v = json!({"properties": {"metadata": {"$ref": "#/definitions/x.Meta", "description": "d"},
                                       "spec": {"$ref": "#/definitions/x.Spec"}}});
        let out = to_v3(&v);
        assert_eq!(
            out["properties"]["metadata"],
            json!({"allOf": [{"$ref": "#/components/schemas/x.Meta"}], "description": "d"})
        );
        assert_eq!(
            out["properties"]["spec"],
            json!({"$ref": "#/components/schemas/x.Spec"})
        );
    }
}
