//! Strategic merge patch (`application/strategic-merge-patch+json`), Kubernetes' patch of
//! choice for kubectl: lists Kubernetes merges by a key (containers by name, ports by
//! containerPort, ...) are merged item by item instead of replaced, with the `$patch`,
//! `$retainKeys`, `$setElementOrder/` and `$deleteFromPrimitiveList/` directives.
//!
//! [`PATCH_META`] is the one table of which lists merge and by which key; the OpenAPI documents
//! carry it (`x-kubernetes-patch-merge-key`, `x-kubernetes-patch-strategy`) so that kubectl
//! computes its patches with the same rules, and the patch walks those schemas.

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::openapi::schemas::{schemas, Schemas};

/// (definition, property, merge key ("" for a list of scalars), strategy).
pub static PATCH_META: &[(&str, &str, &str, &str)] = &[
    ("io.k8s.api.core.v1.PodSpec", "containers", "name", "merge"),
    (
        "io.k8s.api.core.v1.PodSpec",
        "initContainers",
        "name",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "ephemeralContainers",
        "name",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "volumes",
        "name",
        "merge,retainKeys",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "imagePullSecrets",
        "name",
        "merge",
    ),
    ("io.k8s.api.core.v1.PodSpec", "hostAliases", "ip", "merge"),
    (
        "io.k8s.api.core.v1.PodSpec",
        "topologySpreadConstraints",
        "topologyKey",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "resourceClaims",
        "name",
        "merge,retainKeys",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "schedulingGates",
        "name",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.Container",
        "ports",
        "containerPort",
        "merge",
    ),
    ("io.k8s.api.core.v1.Container", "env", "name", "merge"),
    (
        "io.k8s.api.core.v1.Container",
        "volumeMounts",
        "mountPath",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.Container",
        "volumeDevices",
        "devicePath",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "ports",
        "containerPort",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "env",
        "name",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "volumeMounts",
        "mountPath",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "volumeDevices",
        "devicePath",
        "merge",
    ),
    ("io.k8s.api.core.v1.ServiceSpec", "ports", "port", "merge"),
    (
        "io.k8s.api.core.v1.ServiceAccount",
        "secrets",
        "name",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.PodStatus",
        "conditions",
        "type",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.NodeStatus",
        "conditions",
        "type",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.NodeStatus",
        "addresses",
        "type",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.NamespaceStatus",
        "conditions",
        "type",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.ReplicationControllerStatus",
        "conditions",
        "type",
        "merge",
    ),
    (
        "io.k8s.api.apps.v1.DeploymentSpec",
        "strategy",
        "",
        "retainKeys",
    ),
    (
        "io.k8s.api.apps.v1.DeploymentStatus",
        "conditions",
        "type",
        "merge",
    ),
    (
        "io.k8s.api.apps.v1.DaemonSetStatus",
        "conditions",
        "type",
        "merge",
    ),
    (
        "io.k8s.api.apps.v1.StatefulSetStatus",
        "conditions",
        "type",
        "merge",
    ),
    (
        "io.k8s.api.policy.v1.PodDisruptionBudgetStatus",
        "conditions",
        "type",
        "merge",
    ),
    (
        "io.k8s.api.apps.v1.ReplicaSetStatus",
        "conditions",
        "type",
        "merge",
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "ownerReferences",
        "uid",
        "merge",
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "finalizers",
        "",
        "merge",
    ),
];

/// A list-map key: a field, and the default of it that an element may leave out.
type MapKey = (&'static str, Option<&'static str>);

/// A port's keys: its number and its protocol, which Kubernetes defaults to TCP.
const PORT_KEYS: &[MapKey] = &[("containerPort", None), ("protocol", Some("TCP"))];

/// Lists whose elements server-side apply tells apart by more fields than the strategic merge
/// key (Kubernetes' `+listMapKey` markers): (definition, property, keys). A
/// Service may serve port 53 over both UDP and TCP, two elements where the merge key (`port`)
/// sees one.
pub static LIST_MAP_KEYS: &[(&str, &str, &[MapKey])] = &[
    ("io.k8s.api.core.v1.Container", "ports", PORT_KEYS),
    ("io.k8s.api.core.v1.EphemeralContainer", "ports", PORT_KEYS),
    (
        "io.k8s.api.core.v1.ServiceSpec",
        "ports",
        &[("port", None), ("protocol", Some("TCP"))],
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "topologySpreadConstraints",
        &[("topologyKey", None), ("whenUnsatisfiable", None)],
    ),
];

/// The default of a list-map key an element may leave out (a port's protocol).
pub(crate) fn key_default(field: &str) -> Option<Value> {
    LIST_MAP_KEYS
        .iter()
        .flat_map(|(_, _, keys)| keys.iter())
        .find(|(f, _)| *f == field)
        .and_then(|(_, d)| d.map(Value::from))
}

/// Whether list element `x` is the one a field-set key (`k:{...}`) names, defaults counted.
pub(crate) fn has_key(x: &Value, want: &Map<String, Value>) -> bool {
    want.iter()
        .all(|(k, v)| x.get(k).cloned().or_else(|| key_default(k)).as_ref() == Some(v))
}

/// How the elements of a merged list are told apart.
pub(crate) enum ListKey {
    /// A list of scalars, merged as a set.
    Set,
    /// By these fields, in name order: the strategic merge key, or server-side apply's
    /// list-map keys.
    Fields(Vec<String>),
}

impl ListKey {
    /// An element's identity: its key fields (defaults filled in) as an object, or None when
    /// it lacks one.
    pub(crate) fn id(&self, x: &Value) -> Option<Value> {
        match self {
            ListKey::Set => Some(x.clone()),
            ListKey::Fields(fields) => {
                let mut m = Map::new();
                for f in fields {
                    m.insert(f.clone(), x.get(f).cloned().or_else(|| key_default(f))?);
                }
                Some(Value::Object(m))
            }
        }
    }
}

/// Adds the patch extensions of [`PATCH_META`] and the list-map keys of [`LIST_MAP_KEYS`] to
/// the definitions.
pub fn annotate(defs: &mut std::collections::BTreeMap<String, Value>) {
    for (def, prop, keys) in LIST_MAP_KEYS {
        if let Some(p) = defs
            .get_mut(*def)
            .and_then(|d| d.get_mut("properties"))
            .and_then(|p| p.get_mut(*prop))
            .and_then(Value::as_object_mut)
        {
            p.insert("x-kubernetes-list-type".into(), Value::from("map"));
            let names: Vec<Value> = keys.iter().map(|(k, _)| Value::from(*k)).collect();
            p.insert("x-kubernetes-list-map-keys".into(), Value::Array(names));
        }
    }
    for (def, prop, key, strategy) in PATCH_META {
        let Some(p) = defs
            .get_mut(*def)
            .and_then(|d| d.get_mut("properties"))
            .and_then(|p| p.get_mut(*prop))
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        if !key.is_empty() {
            p.insert(
                "x-kubernetes-patch-merge-key".into(),
                Value::String(key.to_string()),
            );
        }
        p.insert(
            "x-kubernetes-patch-strategy".into(),
            Value::String(strategy.to_string()),
        );
    }
}

fn invalid(message: String) -> ApiError {
    ApiError::bad_request(format!("invalid strategic merge patch: {message}"))
}

pub(crate) struct Walker<'a> {
    pub(crate) schemas: &'a Schemas,
    /// Server-side apply: list elements are told apart by their list-map keys where a list
    /// has them (a strategic merge patch uses the merge key alone, as Kubernetes' does).
    pub(crate) list_map_keys: bool,
}

impl<'a> Walker<'a> {
    /// The schema of property `key` of an object with schema `schema`, unresolved (it carries
    /// the property's extensions).
    pub(crate) fn property(&self, schema: Option<&'a Value>, key: &str) -> Option<&'a Value> {
        let s = self.schemas.resolve(schema?)?;
        if let Some(p) = s.get("properties").and_then(|p| p.get(key)) {
            return Some(p);
        }
        s.get("additionalProperties").filter(|a| a.is_object())
    }

    pub(crate) fn items(&self, schema: Option<&'a Value>) -> Option<&'a Value> {
        self.schemas.resolve(schema?)?.get("items")
    }

    fn merge_object(
        &self,
        schema: Option<&'a Value>,
        target: &mut Value,
        patch: &Map<String, Value>,
    ) -> Result<(), ApiError> {
        match patch.get("$patch").and_then(Value::as_str) {
            Some("replace") => {
                let mut clean = patch.clone();
                clean.shift_remove("$patch");
                *target = Value::Object(clean);
                return Ok(());
            }
            Some("delete") => {
                *target = Value::Null;
                return Ok(());
            }
            Some("merge") | None => {}
            Some(other) => return Err(invalid(format!("unknown $patch directive {other:?}"))),
        }
        if !target.is_object() {
            *target = Value::Object(Map::new());
        }
        let t = target.as_object_mut().expect("made an object above");
        for (k, v) in patch {
            if k == "$patch"
                || k == "$retainKeys"
                || k.starts_with("$setElementOrder/")
                || k.starts_with("$deleteFromPrimitiveList/")
            {
                continue;
            }
            if k.starts_with('$') {
                return Err(invalid(format!("unknown directive {k:?}")));
            }
            let ps = self.property(schema, k);
            match v {
                Value::Null => {
                    t.shift_remove(k);
                }
                Value::Object(po) => {
                    let slot = t.entry(k.clone()).or_insert(Value::Null);
                    self.merge_object(ps, slot, po)?;
                    if slot.is_null() {
                        t.shift_remove(k);
                    }
                }
                Value::Array(pl) => {
                    let slot = t.entry(k.clone()).or_insert(Value::Array(vec![]));
                    self.merge_list(ps, slot, pl)?;
                }
                other => {
                    t.insert(k.clone(), other.clone());
                }
            }
        }
        for (k, v) in patch {
            if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
                let remove = v
                    .as_array()
                    .ok_or_else(|| invalid(format!("{k} must be a list")))?;
                if let Some(list) = t.get_mut(field).and_then(Value::as_array_mut) {
                    list.retain(|x| !remove.contains(x));
                }
            }
        }
        for (k, v) in patch {
            if let Some(field) = k.strip_prefix("$setElementOrder/") {
                let order = v
                    .as_array()
                    .ok_or_else(|| invalid(format!("{k} must be a list")))?;
                let key = self.merge_key(self.property(schema, field));
                if let Some(list) = t.get_mut(field).and_then(Value::as_array_mut) {
                    reorder(list, order, key.as_deref());
                }
            }
        }
        if let Some(keep) = patch.get("$retainKeys") {
            let keep: Vec<&str> = keep
                .as_array()
                .ok_or_else(|| invalid("$retainKeys must be a list".into()))?
                .iter()
                .filter_map(Value::as_str)
                .collect();
            t.retain(|k, _| keep.contains(&k.as_str()));
        }
        Ok(())
    }

    /// The merge key of a list property, Some("") for a merged list of scalars, None when the
    /// list is replaced whole.
    pub(crate) fn merge_key(&self, prop: Option<&Value>) -> Option<String> {
        let p = prop?;
        let strategy = p
            .get("x-kubernetes-patch-strategy")
            .and_then(Value::as_str)?;
        if !strategy.split(',').any(|s| s == "merge") {
            return None;
        }
        Some(
            p.get("x-kubernetes-patch-merge-key")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        )
    }

    /// How the elements of a list property are told apart, None when the list is replaced
    /// whole.
    pub(crate) fn list_key(&self, prop: Option<&Value>) -> Option<ListKey> {
        let key = self.merge_key(prop)?;
        let map_keys = prop
            .and_then(|p| p.get("x-kubernetes-list-map-keys"))
            .and_then(Value::as_array)
            .filter(|_| self.list_map_keys);
        if let Some(keys) = map_keys {
            let mut fields: Vec<String> = keys
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            fields.sort();
            return Some(ListKey::Fields(fields));
        }
        Some(match key.is_empty() {
            true => ListKey::Set,
            false => ListKey::Fields(vec![key]),
        })
    }

    fn merge_list(
        &self,
        prop: Option<&'a Value>,
        target: &mut Value,
        patch: &[Value],
    ) -> Result<(), ApiError> {
        let key = self.list_key(prop);
        // A {"$patch": "replace"} element replaces the list with the other elements.
        let replace = patch
            .iter()
            .any(|x| x.get("$patch").and_then(Value::as_str) == Some("replace"));
        let Some(key) = key.filter(|_| !replace) else {
            *target = Value::Array(
                patch
                    .iter()
                    .filter(|x| x.get("$patch").is_none())
                    .cloned()
                    .collect(),
            );
            return Ok(());
        };
        if !target.is_array() {
            *target = Value::Array(vec![]);
        }
        let list = target.as_array_mut().expect("made a list above");
        let ListKey::Fields(fields) = &key else {
            for x in patch {
                if !list.contains(x) {
                    list.push(x.clone());
                }
            }
            return Ok(());
        };
        let named = fields.join(", ");
        let item_schema = self.items(prop);
        let server_order: Vec<Value> = list.iter().filter_map(|x| key.id(x)).collect();
        for item in patch {
            let Some(obj) = item.as_object() else {
                return Err(invalid(format!(
                    "an element of a list merged by {named:?} is not an object: {item}"
                )));
            };
            let id = key.id(item).ok_or_else(|| {
                invalid(format!(
                    "an element of a list merged by {named:?} has no {named:?}: {item}"
                ))
            })?;
            let pos = list.iter().position(|x| key.id(x).as_ref() == Some(&id));
            match (obj.get("$patch").and_then(Value::as_str), pos) {
                (Some("delete"), Some(i)) => {
                    list.remove(i);
                }
                (Some("delete"), None) => {}
                (_, Some(i)) => {
                    self.merge_object(item_schema, &mut list[i], obj)?;
                }
                (_, None) => {
                    let mut fresh = Value::Object(Map::new());
                    self.merge_object(item_schema, &mut fresh, obj)?;
                    list.push(fresh);
                }
            }
        }
        normalize_order(list, patch, &server_order, &key);
        Ok(())
    }
}

/// Kubernetes' element order after a merge by key: the patch's elements in patch order and
/// the others in their old order, interleaved so that two elements that both existed keep
/// their old relative order, and a new element comes before an old one it meets.
fn normalize_order(list: &mut Vec<Value>, patch: &[Value], server_order: &[Value], key: &ListKey) {
    let patch_ids: Vec<Value> = patch
        .iter()
        .filter(|x| x.get("$patch").is_none())
        .filter_map(|x| key.id(x))
        .collect();
    let id = |x: &Value| key.id(x).unwrap_or(Value::Null);
    let mut patched = Vec::new();
    for pid in &patch_ids {
        if let Some(i) = list.iter().position(|x| id(x) == *pid) {
            patched.push(list.remove(i));
        }
    }
    let server_only = std::mem::take(list);
    let index = |x: &Value| server_order.iter().position(|s| *s == id(x));
    let (mut i, mut j) = (0, 0);
    while i < server_only.len() || j < patched.len() {
        let take_left = if i >= server_only.len() {
            false
        } else if j >= patched.len() {
            true
        } else {
            matches!((index(&server_only[i]), index(&patched[j])), (Some(l), Some(r)) if l < r)
        };
        if take_left {
            list.push(server_only[i].clone());
            i += 1;
        } else {
            list.push(patched[j].clone());
            j += 1;
        }
    }
}

/// Puts the elements named in `order` first, in that order; the others keep their places after.
fn reorder(list: &mut Vec<Value>, order: &[Value], key: Option<&str>) {
    let id = |x: &Value| -> Value {
        match key {
            Some(k) if !k.is_empty() => x.get(k).cloned().unwrap_or(Value::Null),
            _ => x.clone(),
        }
    };
    let wanted: Vec<Value> = order
        .iter()
        .map(|o| match key {
            Some(k) if !k.is_empty() => o.get(k).cloned().unwrap_or(Value::Null),
            _ => o.clone(),
        })
        .collect();
    let mut head = Vec::new();
    for w in &wanted {
        if let Some(i) = list.iter().position(|x| id(x) == *w) {
            head.push(list.remove(i));
        }
    }
    head.append(list);
    *list = head;
}

/// Applies a strategic merge patch to an object of definition `def`.
pub fn apply(def: Option<&str>, target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    merge(def, target, patch, false)
}

/// Merges a server-side apply configuration into the live object of definition `def`: as a
/// strategic merge patch, but with list elements told apart by their list-map keys.
pub(crate) fn merge_applied(
    def: Option<&str>,
    target: &mut Value,
    config: &Value,
) -> Result<(), ApiError> {
    merge(def, target, config, true)
}

fn merge(
    def: Option<&str>,
    target: &mut Value,
    patch: &Value,
    list_map_keys: bool,
) -> Result<(), ApiError> {
    let schemas = schemas();
    let root = def.map(|d| serde_json::json!({"$ref": format!("#/definitions/{d}")}));
    let patch = patch
        .as_object()
        .ok_or_else(|| invalid("the patch must be a JSON object".into()))?;
    let walker = Walker {
        schemas,
        list_map_keys,
    };
    walker.merge_object(root.as_ref(), target, patch)?;
    if target.is_null() {
        return Err(invalid("the patch deletes the whole object".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DEPLOYMENT: &str = "io.k8s.api.apps.v1.Deployment";

    /// A strategic merge patch merges a Service's ports by their number alone, as Kubernetes'
    /// does (its merge key); only server-side apply tells UDP and TCP apart. The OpenAPI
    /// document carries both.
    #[test]
    fn a_patch_merges_ports_by_number_and_the_schema_names_the_list_map_keys() {
        let mut live = json!({"spec": {"ports": [{"port": 53, "protocol": "UDP", "name": "dns"}]}});
        let patch = json!({"spec": {"ports": [{"port": 53, "protocol": "TCP"}]}});
        apply(Some("io.k8s.api.core.v1.Service"), &mut live, &patch).unwrap();
        assert_eq!(
            live["spec"]["ports"],
            json!([{"port": 53, "protocol": "TCP", "name": "dns"}])
        );
        let ports = schemas()
            .resolve(&json!({"$ref": "#/definitions/io.k8s.api.core.v1.ServiceSpec"}))
            .and_then(|s| s.pointer("/properties/ports"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(ports["x-kubernetes-patch-merge-key"], "port");
        assert_eq!(
            ports["x-kubernetes-list-map-keys"],
            json!(["port", "protocol"])
        );
        assert_eq!(ports["x-kubernetes-list-type"], "map");
    }

    fn deployment() -> Value {
        json!({"metadata": {"name": "web", "labels": {"app": "web"}, "finalizers": ["a"]},
               "spec": {"replicas": 1, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}},
                        "template": {"spec": {"containers": [
            {"name": "nginx", "image": "nginx:1", "ports": [{"containerPort": 80}], "env": [{"name": "A", "value": "1"}]},
            {"name": "log", "image": "busybox"}]}}}})
    }

    #[test]
    fn containers_merge_by_name() {
        let mut d = deployment();
        apply(
            Some(DEPLOYMENT),
            &mut d,
            &json!({"spec": {"template": {"spec": {"containers": [
            {"name": "nginx", "image": "nginx:2", "env": [{"name": "B", "value": "2"}]},
            {"name": "sidecar", "image": "envoy"}]}}}}),
        )
        .unwrap();
        let cs = d["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        let names: Vec<&str> = cs.iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["nginx", "sidecar", "log"]);
        assert_eq!(cs[0]["image"], "nginx:2");
        let mut one = deployment();
        apply(
            Some(DEPLOYMENT),
            &mut one,
            &json!({"spec": {"template": {"spec": {"containers": [
            {"name": "first", "image": "x"}]}}}}),
        )
        .unwrap();
        let names: Vec<&str> = one["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["first", "nginx", "log"]);
        assert_eq!(cs[0]["ports"][0]["containerPort"], 80);
        assert_eq!(cs[0]["env"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn directives() {
        let mut d = deployment();
        apply(Some(DEPLOYMENT), &mut d, &json!({
            "metadata": {"labels": {"app": null}, "finalizers": ["b"], "$deleteFromPrimitiveList/finalizers": ["a"]},
            "spec": {"strategy": {"type": "Recreate", "rollingUpdate": null, "$retainKeys": ["type"]},
                     "template": {"spec": {
                "$setElementOrder/containers": [{"name": "log"}, {"name": "nginx"}],
                "containers": [{"name": "nginx", "$patch": "delete"}]}}}})).unwrap();
        assert!(d["metadata"]["labels"].get("app").is_none());
        assert_eq!(d["metadata"]["finalizers"], json!(["b"]));
        assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
        let names: Vec<&str> = d["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["log"]);
        // A list element {"$patch": "replace"} replaces the list.
        apply(
            Some(DEPLOYMENT),
            &mut d,
            &json!({"spec": {"template": {"spec": {"containers": [
            {"$patch": "replace"}, {"name": "only", "image": "x"}]}}}}),
        )
        .unwrap();
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"],
            json!([{"name": "only", "image": "x"}])
        );
        // Lists without a strategy are replaced, and unknown directives refused.
        let mut svc =
            json!({"spec": {"externalIPs": ["1.1.1.1"], "ports": [{"port": 80, "name": "http"}]}});
        apply(Some("io.k8s.api.core.v1.Service"), &mut svc, &json!({"spec": {"externalIPs": ["2.2.2.2"], "ports": [{"port": 443, "name": "https"}]}})).unwrap();
        assert_eq!(svc["spec"]["externalIPs"], json!(["2.2.2.2"]));
        assert_eq!(svc["spec"]["ports"].as_array().unwrap().len(), 2);
        assert!(apply(Some(DEPLOYMENT), &mut d, &json!({"$bogus": 1})).is_err());
        assert!(apply(
            Some(DEPLOYMENT),
            &mut d,
            &json!({"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}})
        )
        .is_err());
    }

    #[test]
    fn the_openapi_documents_carry_the_table() {
        let s = schemas();
        let p = &s.defs["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
        assert_eq!(p["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(p["x-kubernetes-patch-strategy"], "merge");
    }
}
