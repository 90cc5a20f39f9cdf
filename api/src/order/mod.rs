//! Kubernetes' field order: objects of the built-in kinds are written with their fields in the
//! order of the Go structs (`kind`, `apiVersion`, `metadata`, `spec`, `status`; `name`,
//! `namespace`, `uid`, `resourceVersion`, `creationTimestamp` in metadata), whatever order a
//! client sent them in, as kube-apiserver writes them. Clients that compare bytes (the Python
//! client's tests compare a Status) see what they would see from Kubernetes.
//!
//! An object is put in order once, when it is written to the store ([`crate::storage`]); reads and
//! watches then copy the stored order (serde_json keeps the order of a map's keys). The order of
//! every struct comes from `fields.txt`, which `generate.py` writes from the protobuf
//! descriptors a kubectl binary embeds (Kubernetes' generated.proto lists each struct's fields in
//! Go order; k8s-openapi's types write their fields alphabetically, so they cannot give it).
//! Map fields (labels, data) are written with sorted keys, as Go writes maps; fields
//! the table does not know keep their place after the known ones. A custom resource has no Go
//! struct: kube-apiserver holds it as a map (`Unstructured`) and writes it with Go's
//! encoding/json, every map's keys sorted, at every level; so does rkube.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use serde_json::Value;

/// How a field's value is put in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// A scalar, or a value kept as it is (a Quantity, a RawExtension).
    Leaf,
    /// An object of a message (or a list of them).
    Message(usize),
    /// A map: its keys sorted, and its values put in order when they are messages.
    Map(Option<usize>),
}

/// A message's fields by name (sorted, for a binary search), each with its place in the
/// message; the fields of a message Go writes inline (`json:",inline"`, a Volume's source) are
/// the enclosing message's, in the inline field's place.
struct Message {
    by_name: Vec<(&'static str, u32, Shape)>,
}

impl Message {
    /// The place and shape of a key; keys the message does not know go last.
    fn field(&self, key: &str) -> (u32, Shape) {
        self.by_name
            .binary_search_by(|(name, _, _)| (*name).cmp(key))
            .map(|i| (self.by_name[i].1, self.by_name[i].2))
            .unwrap_or((u32::MAX, Shape::Leaf))
    }
}

struct Table {
    messages: Vec<Message>,
    /// (apiVersion, kind) to the kind's message.
    kinds: HashMap<(&'static str, &'static str), usize>,
    /// The API groups of those kinds (`""` for the core group).
    groups: HashSet<&'static str>,
    status: usize,
    list_meta: usize,
}

static FIELDS: &str = include_str!("fields.txt");

static TABLE: LazyLock<Table> = LazyLock::new(|| Table::parse(FIELDS));

/// A field of fields.txt: a shape, or a message to put inline.
enum Parsed {
    Field(&'static str, Shape),
    Inline(usize),
}

impl Table {
    fn parse(text: &'static str) -> Table {
        let lines: Vec<Vec<&'static str>> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split_whitespace().collect())
            .collect();
        let index: HashMap<&str, usize> = lines
            .iter()
            .filter(|w| w.first() == Some(&"M"))
            .enumerate()
            .map(|(i, w)| (w[1], i))
            .collect();
        let message = |name: &str| -> usize {
            *index
                .get(name)
                .unwrap_or_else(|| panic!("fields.txt names message {name} but has no line for it"))
        };
        let mut parsed: Vec<Vec<Parsed>> = Vec::with_capacity(index.len());
        let mut kinds = HashMap::new();
        for w in &lines {
            match w.first() {
                Some(&"K") => {
                    kinds.insert((w[1], w[2]), message(w[3]));
                }
                Some(&"M") => parsed.push(
                    w[2..]
                        .iter()
                        .map(|f| {
                            let (name, ty) = f.split_once(':').unwrap_or((f, "-"));
                            match ty.split_at(ty.len().min(1)) {
                                ("^", m) => Parsed::Inline(message(m)),
                                ("=", m) => Parsed::Field(name, Shape::Message(message(m))),
                                ("%", "") => Parsed::Field(name, Shape::Map(None)),
                                ("%", m) => Parsed::Field(name, Shape::Map(Some(message(m)))),
                                _ => Parsed::Field(name, Shape::Leaf),
                            }
                        })
                        .collect(),
                ),
                _ => {}
            }
        }
        fn flatten(parsed: &[Vec<Parsed>], m: usize, out: &mut Vec<(&'static str, u32, Shape)>) {
            for f in &parsed[m] {
                match f {
                    Parsed::Field(name, shape) => out.push((name, out.len() as u32, *shape)),
                    Parsed::Inline(inner) => flatten(parsed, *inner, out),
                }
            }
        }
        let messages = (0..parsed.len())
            .map(|m| {
                let mut by_name = Vec::new();
                flatten(&parsed, m, &mut by_name);
                by_name.sort_unstable_by_key(|f| f.0);
                Message { by_name }
            })
            .collect();
        let groups = kinds
            .keys()
            .map(|(api_version, _)| api_version.rsplit_once('/').map_or("", |(g, _)| g))
            .collect();
        Table {
            messages,
            kinds,
            groups,
            status: message("k8s.io.apimachinery.pkg.apis.meta.v1.Status"),
            list_meta: message("k8s.io.apimachinery.pkg.apis.meta.v1.ListMeta"),
        }
    }

    fn order_value(&self, shape: Shape, value: &mut Value) {
        match (shape, value) {
            (Shape::Message(m), Value::Array(items)) => {
                for item in items {
                    self.order_message(m, item, false);
                }
            }
            (Shape::Message(m), value) => self.order_message(m, value, false),
            (Shape::Map(values), Value::Object(map)) => {
                map.sort_keys();
                if let Some(m) = values {
                    for v in map.values_mut() {
                        self.order_message(m, v, false);
                    }
                }
            }
            _ => {}
        }
    }

    /// Puts the fields of an object of message `m` in the message's order, each in order
    /// itself; with `typed`, `kind` and `apiVersion` first (Go's inline TypeMeta). Fields the
    /// table does not know keep their order, after the known ones.
    fn order_message(&self, m: usize, value: &mut Value, typed: bool) {
        let Value::Object(map) = value else { return };
        let message = &self.messages[m];
        let place = |key: &str| match (typed, key) {
            (true, "kind") => (0, Shape::Leaf),
            (true, "apiVersion") => (1, Shape::Leaf),
            _ => {
                let (rank, shape) = message.field(key);
                (rank.saturating_add(2), shape)
            }
        };
        let mut sorted = true;
        let mut last = 0;
        for (key, v) in map.iter_mut() {
            let (rank, shape) = place(key);
            self.order_value(shape, v);
            sorted &= rank >= last;
            last = rank;
        }
        if sorted {
            return;
        }
        let mut entries: Vec<(u32, String, Value)> = std::mem::take(map)
            .into_iter()
            .map(|(k, v)| (place(&k).0, k, v))
            .collect();
        // Stable: fields the table does not know keep their order.
        entries.sort_by_key(|e| e.0);
        map.extend(entries.into_iter().map(|(_, k, v)| (k, v)));
    }
}

/// Groups whose kinds kube-apiserver holds as Go structs: those of the kinds the table knows,
/// and the ones of the API's own documents. An object of another group is a custom resource.
const SERVER_GROUPS: [&str; 2] = ["meta.k8s.io", "apidiscovery.k8s.io"];

/// Whether kube-apiserver would hold `object` as an unstructured map (a custom resource, or a
/// list of them): its kind is of a group no built-in kind is in.
pub fn is_unstructured(object: &Value) -> bool {
    let Some(api_version) = object.get("apiVersion").and_then(Value::as_str) else {
        return false;
    };
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    object.get("kind").and_then(Value::as_str).is_some()
        && !SERVER_GROUPS.contains(&group)
        && !TABLE.groups.contains(group)
}

/// Puts every map in `value` in the order of its keys, as Go's encoding/json writes a map:
/// kube-apiserver encodes a custom resource (`Unstructured`, `UnstructuredList`) that way.
fn sort_deep(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(sort_deep);
        }
        Value::Array(items) => items.iter_mut().for_each(sort_deep),
        _ => {}
    }
}

/// Puts an object of a built-in kind in Kubernetes' field order, by its own `apiVersion` and
/// `kind`; a Status and a List (and its items) too. A custom resource ([`is_unstructured`]) and
/// a list of them get their keys sorted at every level. Anything else is left as it is.
pub fn normalise(object: &mut Value) {
    let table = &*TABLE;
    if is_unstructured(object) {
        sort_deep(object);
        return;
    }
    let (Some(api_version), Some(kind)) = (
        object.get("apiVersion").and_then(Value::as_str),
        object.get("kind").and_then(Value::as_str),
    ) else {
        return;
    };
    if let Some(&m) = table.kinds.get(&(api_version, kind)) {
        table.order_message(m, object, true);
    } else if kind == "Status" && api_version == "v1" {
        table.order_message(table.status, object, true);
    } else if let Some(item_kind) = kind.strip_suffix("List") {
        let item = table.kinds.get(&(api_version, item_kind)).copied();
        let Value::Object(map) = object else { return };
        let mut from = std::mem::take(map);
        for key in ["kind", "apiVersion", "metadata", "items"] {
            if let Some((k, v)) = from.shift_remove_entry(key) {
                map.insert(k, v);
            }
        }
        map.extend(from);
        if let Some(meta) = map.get_mut("metadata") {
            table.order_message(table.list_meta, meta, false);
        }
        if let (Some(m), Some(Value::Array(items))) = (item, map.get_mut("items")) {
            for item in items {
                table.order_message(m, item, true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn keys(v: &Value) -> Vec<&str> {
        v.as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    #[test]
    fn the_table_parses_and_knows_every_served_kind() {
        for r in crate::resources::RESOURCES {
            assert!(
                TABLE
                    .kinds
                    .contains_key(&(r.api_version().as_str(), r.kind)),
                "fields.txt has no message for {} {}",
                r.api_version(),
                r.kind
            );
        }
    }

    #[test]
    fn a_pod_sent_in_reverse_order_comes_out_in_go_order() {
        let mut pod = json!({
            "status": {"phase": "Pending"},
            "spec": {
                "schedulerName": "default-scheduler",
                "restartPolicy": "Always",
                "containers": [{"imagePullPolicy": "Always", "image": "nginx", "name": "c"}],
                "volumes": [{"configMap": {"name": "cm", "defaultMode": 420}, "name": "v"}],
            },
            "metadata": {
                "labels": {"z": "1", "a": "2"},
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "uid": "u",
                "namespace": "default",
                "name": "p",
                "x-unknown": true,
            },
            "apiVersion": "v1",
            "kind": "Pod",
        });
        normalise(&mut pod);
        assert_eq!(
            keys(&pod),
            ["kind", "apiVersion", "metadata", "spec", "status"]
        );
        assert_eq!(
            keys(&pod["metadata"]),
            [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "labels",
                "x-unknown"
            ]
        );
        assert_eq!(keys(&pod["metadata"]["labels"]), ["a", "z"]);
        assert_eq!(
            keys(&pod["spec"]),
            ["volumes", "containers", "restartPolicy", "schedulerName"]
        );
        assert_eq!(
            keys(&pod["spec"]["containers"][0]),
            ["name", "image", "imagePullPolicy"]
        );
        // A Volume's source is inline in Go, and so is a ConfigMap source's reference.
        assert_eq!(keys(&pod["spec"]["volumes"][0]), ["name", "configMap"]);
        assert_eq!(
            keys(&pod["spec"]["volumes"][0]["configMap"]),
            ["name", "defaultMode"]
        );
    }

    /// A TokenRequest answer, and fields whose generated.proto name differs from their JSON
    /// name (`uID`, `aPIGroup`), which the generator maps back.
    #[test]
    fn token_requests_and_renamed_fields_come_out_in_go_order() {
        let mut token = json!({"status": {"expirationTimestamp": "t", "token": "x"},
            "spec": {"boundObjectRef": {"uid": "u", "name": "p", "kind": "Pod", "apiVersion": "v1"},
                     "expirationSeconds": 3600, "audiences": ["a"]},
            "metadata": {"namespace": "default", "name": "default"},
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"});
        normalise(&mut token);
        assert_eq!(
            keys(&token),
            ["kind", "apiVersion", "metadata", "spec", "status"]
        );
        assert_eq!(
            keys(&token["spec"]),
            ["audiences", "expirationSeconds", "boundObjectRef"]
        );
        assert_eq!(
            keys(&token["spec"]["boundObjectRef"]),
            ["kind", "apiVersion", "name", "uid"]
        );
        assert_eq!(keys(&token["status"]), ["token", "expirationTimestamp"]);
        let mut class = json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": "c"}, "spec": {"parameters": {"name": "n", "kind": "K",
            "apiGroup": "g", "scope": "Cluster"}, "controller": "x"}});
        normalise(&mut class);
        assert_eq!(
            keys(&class["spec"]["parameters"]),
            ["apiGroup", "kind", "name", "scope"]
        );
    }

    #[test]
    fn statuses_and_lists_come_out_in_go_order() {
        let mut status = json!({"code": 404, "details": {"kind": "pods", "name": "x"},
            "reason": "NotFound", "message": "m", "status": "Failure", "metadata": {},
            "apiVersion": "v1", "kind": "Status"});
        normalise(&mut status);
        assert_eq!(
            keys(&status),
            [
                "kind",
                "apiVersion",
                "metadata",
                "status",
                "message",
                "reason",
                "details",
                "code"
            ]
        );
        assert_eq!(keys(&status["details"]), ["name", "kind"]);
        let mut list = json!({"items": [{"spec": {}, "metadata": {"uid": "u", "name": "a"}}],
            "metadata": {"resourceVersion": "5"}, "apiVersion": "v1", "kind": "PodList"});
        normalise(&mut list);
        assert_eq!(keys(&list), ["kind", "apiVersion", "metadata", "items"]);
        assert_eq!(keys(&list["items"][0]), ["metadata", "spec"]);
        assert_eq!(keys(&list["items"][0]["metadata"]), ["name", "uid"]);
    }

    /// The verbs compare objects as values (a spec changed, an update changed nothing): with
    /// serde_json's preserve_order, equality and hashing must still ignore the order of keys.
    #[test]
    fn values_in_another_order_are_equal_and_hash_alike() {
        use std::hash::{BuildHasher, RandomState};
        let a = json!({"a": 1, "b": {"c": 2, "d": 3}});
        let b = json!({"b": {"d": 3, "c": 2}, "a": 1});
        assert_eq!(a, b);
        let hasher = RandomState::new();
        assert_eq!(hasher.hash_one(&a), hasher.hash_one(&b));
    }

    #[test]
    fn unknown_kinds_of_built_in_groups_are_left_as_they_are() {
        let mut object = json!({"spec": {"b": 1, "a": 2}, "kind": "Widget",
            "apiVersion": "apps/v1"});
        let before = serde_json::to_string(&object).unwrap_or_default();
        normalise(&mut object);
        assert_eq!(serde_json::to_string(&object).unwrap_or_default(), before);
        assert!(!is_unstructured(&object));
        let mut table = json!({"rows": [], "kind": "Table", "apiVersion": "meta.k8s.io/v1"});
        normalise(&mut table);
        assert_eq!(keys(&table), ["rows", "kind", "apiVersion"]);
    }

    /// kube-apiserver holds a custom resource as a map and Go writes a map's keys sorted: at
    /// every level, metadata and lists' items included; a list of them too.
    #[test]
    fn custom_resources_have_their_keys_sorted_at_every_level() {
        let mut object = json!({"spec": {"zeta": [{"b": 1, "a": {"y": 1, "x": 2}}], "alpha": 2},
            "metadata": {"uid": "u", "name": "w", "managedFields": [{"manager": "m",
                "operation": "Apply", "apiVersion": "example.com/v1", "time": "t",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
            "kind": "Widget", "apiVersion": "example.com/v1"});
        assert!(is_unstructured(&object));
        normalise(&mut object);
        assert_eq!(keys(&object), ["apiVersion", "kind", "metadata", "spec"]);
        assert_eq!(keys(&object["metadata"]), ["managedFields", "name", "uid"]);
        assert_eq!(
            keys(&object["metadata"]["managedFields"][0]),
            [
                "apiVersion",
                "fieldsType",
                "fieldsV1",
                "manager",
                "operation",
                "time"
            ]
        );
        assert_eq!(keys(&object["spec"]), ["alpha", "zeta"]);
        assert_eq!(keys(&object["spec"]["zeta"][0]), ["a", "b"]);
        assert_eq!(keys(&object["spec"]["zeta"][0]["a"]), ["x", "y"]);
        let mut list = json!({"kind": "WidgetList", "apiVersion": "example.com/v1",
            "metadata": {"resourceVersion": "5", "continue": "c"}, "items": [object]});
        normalise(&mut list);
        assert_eq!(keys(&list), ["apiVersion", "items", "kind", "metadata"]);
        assert_eq!(keys(&list["metadata"]), ["continue", "resourceVersion"]);
    }
}
