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
//! Go order). Map fields (labels, data) are written with sorted keys, as Go writes maps; fields
//! the table does not know keep their place after the known ones.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::{Map, Value};

/// How a field's value is put in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// A scalar, or a value kept as it is (a Quantity, a RawExtension).
    Leaf,
    /// An object of a message (or a list of them).
    Message(usize),
    /// A map: its keys sorted, and its values put in order when they are messages.
    Map(Option<usize>),
    /// A message whose fields Go writes in the enclosing object (`json:",inline"`).
    Inline(usize),
}

struct Field {
    name: &'static str,
    shape: Shape,
}

struct Table {
    messages: Vec<Vec<Field>>,
    /// (apiVersion, kind) to the kind's message.
    kinds: HashMap<(&'static str, &'static str), usize>,
    status: usize,
    list_meta: usize,
}

static FIELDS: &str = include_str!("fields.txt");

static TABLE: LazyLock<Table> = LazyLock::new(|| Table::parse(FIELDS));

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
        let mut messages = Vec::with_capacity(index.len());
        let mut kinds = HashMap::new();
        for w in &lines {
            match w.first() {
                Some(&"K") => {
                    kinds.insert((w[1], w[2]), message(w[3]));
                }
                Some(&"M") => messages.push(
                    w[2..]
                        .iter()
                        .map(|f| {
                            let (name, ty) = f.split_once(':').unwrap_or((f, "-"));
                            let shape = match ty.split_at(ty.len().min(1)) {
                                ("=", m) => Shape::Message(message(m)),
                                ("^", m) => Shape::Inline(message(m)),
                                ("%", "") => Shape::Map(None),
                                ("%", m) => Shape::Map(Some(message(m))),
                                _ => Shape::Leaf,
                            };
                            Field { name, shape }
                        })
                        .collect(),
                ),
                _ => {}
            }
        }
        Table {
            messages,
            kinds,
            status: message("k8s.io.apimachinery.pkg.apis.meta.v1.Status"),
            list_meta: message("k8s.io.apimachinery.pkg.apis.meta.v1.ListMeta"),
        }
    }

    /// Moves the fields of message `m` from `from` to `to` in the message's order, each put in
    /// order itself.
    fn take_fields(&self, m: usize, from: &mut Map<String, Value>, to: &mut Map<String, Value>) {
        for field in &self.messages[m] {
            if from.is_empty() {
                return;
            }
            if let Shape::Inline(inner) = field.shape {
                self.take_fields(inner, from, to);
                continue;
            }
            if let Some((name, mut value)) = from.shift_remove_entry(field.name) {
                self.order_value(field.shape, &mut value);
                to.insert(name, value);
            }
        }
    }

    fn order_value(&self, shape: Shape, value: &mut Value) {
        match (shape, value) {
            (Shape::Message(m), Value::Array(items)) => {
                for item in items {
                    self.order_message(m, item);
                }
            }
            (Shape::Message(m), value) => self.order_message(m, value),
            (Shape::Map(values), Value::Object(map)) => {
                map.sort_keys();
                if let Some(m) = values {
                    for v in map.values_mut() {
                        self.order_message(m, v);
                    }
                }
            }
            _ => {}
        }
    }

    fn order_message(&self, m: usize, value: &mut Value) {
        let Value::Object(map) = value else { return };
        let mut from = std::mem::take(map);
        self.take_fields(m, &mut from, map);
        // Fields the table does not know keep their order, after the known ones.
        map.extend(from);
    }

    /// `kind` and `apiVersion` first (Go's inline TypeMeta), then the fields of message `m`.
    fn order_top(&self, m: usize, map: &mut Map<String, Value>) {
        let mut from = std::mem::take(map);
        for key in ["kind", "apiVersion"] {
            if let Some((k, v)) = from.shift_remove_entry(key) {
                map.insert(k, v);
            }
        }
        self.take_fields(m, &mut from, map);
        map.extend(from);
    }
}

/// Puts an object of a built-in kind in Kubernetes' field order, by its own `apiVersion` and
/// `kind`; a Status and a List (and its items) too. Anything else is left as it is.
pub fn normalise(object: &mut Value) {
    let table = &*TABLE;
    let Value::Object(map) = object else { return };
    let (Some(api_version), Some(kind)) = (
        map.get("apiVersion").and_then(Value::as_str),
        map.get("kind").and_then(Value::as_str),
    ) else {
        return;
    };
    if let Some(&m) = table.kinds.get(&(api_version, kind)) {
        table.order_top(m, map);
    } else if kind == "Status" && api_version == "v1" {
        table.order_top(table.status, map);
    } else if let Some(item_kind) = kind.strip_suffix("List") {
        let item = table.kinds.get(&(api_version, item_kind)).copied();
        let mut from = std::mem::take(map);
        for key in ["kind", "apiVersion", "metadata", "items"] {
            if let Some((k, v)) = from.shift_remove_entry(key) {
                map.insert(k, v);
            }
        }
        map.extend(from);
        if let Some(meta) = map.get_mut("metadata") {
            table.order_message(table.list_meta, meta);
        }
        if let (Some(m), Some(Value::Array(items))) = (item, map.get_mut("items")) {
            for item in items {
                match item.as_object_mut() {
                    Some(o) if o.contains_key("kind") => table.order_top(m, o),
                    _ => table.order_message(m, item),
                }
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

    #[test]
    fn unknown_kinds_are_left_as_they_are() {
        let mut object = json!({"spec": {"b": 1, "a": 2}, "kind": "Widget",
            "apiVersion": "example.com/v1"});
        let before = serde_json::to_string(&object).unwrap_or_default();
        normalise(&mut object);
        assert_eq!(serde_json::to_string(&object).unwrap_or_default(), before);
    }
}
