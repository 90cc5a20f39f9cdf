//! Server-side apply (`application/apply-patch+yaml`): the applied configuration is merged into
//! the live object, and `metadata.managedFields` records which fields each field manager set
//! (FieldsV1: `f:<field>`, `k:<key>` for list elements merged by key, `v:<value>` for sets,
//! `.` for an element itself). A field another manager set to a different value is a conflict
//! (409) unless the apply is forced, which takes it over; a field this manager applied before
//! and no longer sends is removed, unless another manager also set it.

use std::cmp::Ordering;

use serde_json::{json, Map, Value};

use crate::error::{ApiError, Cause};
use crate::openapi::schemas::schemas;
use crate::strategic::{has_key, ListKey, Walker};

/// The parts of a configuration that are not fields anybody manages.
fn strip_identity(config: &Value) -> Value {
    let mut c = config.clone();
    if let Some(o) = c.as_object_mut() {
        o.shift_remove("apiVersion");
        o.shift_remove("kind");
        o.shift_remove("status");
        if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            for f in [
                "name",
                "namespace",
                "resourceVersion",
                "managedFields",
                "uid",
                "creationTimestamp",
                "generation",
            ] {
                m.shift_remove(f);
            }
            if m.is_empty() {
                o.shift_remove("metadata");
            }
        }
    }
    c
}

/// The field set (FieldsV1) of a configuration.
fn field_set(w: &Walker<'_>, schema: Option<&Value>, v: &Value) -> Value {
    let mut out = Map::new();
    let Some(o) = v.as_object() else {
        return json!({});
    };
    for (k, x) in o {
        let ps = w.property(schema, k);
        let child = match x {
            Value::Object(_) => field_set(w, ps, x),
            Value::Array(items) => match w.list_key(ps) {
                Some(key @ ListKey::Fields(_)) => {
                    let item_schema = w.items(ps);
                    let mut m = Map::new();
                    for item in items {
                        if let Some(id) = key.id(item) {
                            let mut inner = field_set(w, item_schema, item);
                            if let Some(io) = inner.as_object_mut() {
                                io.insert(".".into(), json!({}));
                            }
                            m.insert(format!("k:{id}"), inner);
                        }
                    }
                    Value::Object(m)
                }
                Some(ListKey::Set) => Value::Object(
                    items
                        .iter()
                        .map(|i| (format!("v:{i}"), json!({})))
                        .collect(),
                ),
                None => json!({}),
            },
            _ => json!({}),
        };
        out.insert(format!("f:{k}"), child);
    }
    Value::Object(out)
}

/// Where a path element of a field set goes among its siblings, as structured-merge-diff
/// writes FieldsV1: `.` (the element itself) first, then fields by name, list elements by key,
/// set elements by value, and list elements by index.
fn element_order(a: &str, b: &str) -> Ordering {
    fn class(token: &str) -> (u8, &str) {
        match token.split_once(':') {
            _ if token == "." => (0, ""),
            Some(("f", rest)) => (1, rest),
            Some(("k", rest)) => (2, rest),
            Some(("v", rest)) => (3, rest),
            Some(("i", rest)) => (4, rest),
            _ => (5, token),
        }
    }
    let ((ca, ra), (cb, rb)) = (class(a), class(b));
    let parsed = |r: &str| serde_json::from_str::<Value>(r).ok();
    ca.cmp(&cb).then_with(|| {
        if !(2..=4).contains(&ca) {
            return ra.cmp(rb);
        }
        match (parsed(ra), parsed(rb)) {
            (Some(x), Some(y)) => value_order(&x, &y),
            _ => ra.cmp(rb),
        }
    })
}

/// structured-merge-diff's total order of values: numbers, strings, booleans, lists, maps
/// (a key's fields by name), null; a list or map compared element by element.
fn value_order(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Number(_) => 0,
            Value::String(_) => 1,
            Value::Bool(_) => 2,
            Value::Array(_) => 3,
            Value::Object(_) => 4,
            Value::Null => 5,
        }
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => {
                let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
                x.total_cmp(&y)
            }
        },
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => x
            .iter()
            .zip(y)
            .map(|(x, y)| value_order(x, y))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        (Value::Object(x), Value::Object(y)) => {
            fn sorted(m: &Map<String, Value>) -> Vec<(&String, &Value)> {
                let mut e: Vec<(&String, &Value)> = m.iter().collect();
                e.sort_by(|a, b| a.0.cmp(b.0));
                e
            }
            let (x, y) = (sorted(x), sorted(y));
            x.iter()
                .zip(&y)
                .map(|((kx, vx), (ky, vy))| kx.cmp(ky).then_with(|| value_order(vx, vy)))
                .find(|o| o.is_ne())
                .unwrap_or_else(|| x.len().cmp(&y.len()))
        }
        _ => rank(a).cmp(&rank(b)),
    }
}

/// Puts a field set in the order Kubernetes writes FieldsV1 in ([`element_order`]), at every
/// level.
fn sort_field_set(fs: &mut Value) {
    if let Value::Object(map) = fs {
        let mut entries: Vec<(String, Value)> = std::mem::take(map).into_iter().collect();
        entries.sort_by(|(a, _), (b, _)| element_order(a, b));
        for (k, mut v) in entries {
            sort_field_set(&mut v);
            map.insert(k, v);
        }
    }
}

/// Leaf paths of a field set (each a list of tokens).
fn leaves(fs: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let Some(o) = fs.as_object() else { return };
    let children: Vec<(&String, &Value)> = o.iter().filter(|(k, _)| *k != ".").collect();
    if children.is_empty() {
        if !prefix.is_empty() {
            out.push(prefix.clone());
        }
        return;
    }
    for (k, v) in children {
        prefix.push(k.clone());
        leaves(v, prefix, out);
        prefix.pop();
    }
}

fn value_at<'v>(v: &'v Value, path: &[String]) -> Option<&'v Value> {
    let mut cur = v;
    let mut i = 0;
    while i < path.len() {
        let t = &path[i];
        if let Some(name) = t.strip_prefix("f:") {
            cur = cur.get(name)?;
        } else if let Some(key) = t.strip_prefix("k:") {
            let want: Map<String, Value> = serde_json::from_str(key).ok()?;
            cur = cur.as_array()?.iter().find(|x| has_key(x, &want))?;
        } else if let Some(val) = t.strip_prefix("v:") {
            let want: Value = serde_json::from_str(val).ok()?;
            cur = cur.as_array()?.iter().find(|x| **x == want)?;
        } else {
            return None;
        }
        i += 1;
    }
    Some(cur)
}

fn remove_at(v: &mut Value, path: &[String]) {
    let Some((last, head)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for t in head {
        let next = if let Some(name) = t.strip_prefix("f:") {
            cur.get_mut(name)
        } else if let Some(key) = t.strip_prefix("k:") {
            let Ok(want) = serde_json::from_str::<Map<String, Value>>(key) else {
                return;
            };
            cur.as_array_mut()
                .and_then(|a| a.iter_mut().find(|x| has_key(x, &want)))
        } else {
            None
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(name) = last.strip_prefix("f:") {
        if let Some(o) = cur.as_object_mut() {
            o.shift_remove(name);
        }
    } else if let Some(key) = last.strip_prefix("k:") {
        if let (Ok(want), Some(a)) = (
            serde_json::from_str::<Map<String, Value>>(key),
            cur.as_array_mut(),
        ) {
            a.retain(|x| !has_key(x, &want));
        }
    } else if let Some(val) = last.strip_prefix("v:") {
        if let (Ok(want), Some(a)) = (serde_json::from_str::<Value>(val), cur.as_array_mut()) {
            a.retain(|x| *x != want);
        }
    }
}

/// `.spec.containers[name="c"].image`, as Kubernetes prints a managed field.
fn display(path: &[String]) -> String {
    let mut s = String::new();
    for t in path {
        if let Some(n) = t.strip_prefix("f:") {
            s.push('.');
            s.push_str(n);
        } else if let Some(k) = t.strip_prefix("k:") {
            let m: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let inner: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!("[{}]", inner.join(",")));
        } else if let Some(v) = t.strip_prefix("v:") {
            s.push_str(&format!("[{v}]"));
        }
    }
    s
}

fn set_of(entry: &Value) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    leaves(
        entry.get("fieldsV1").unwrap_or(&json!({})),
        &mut Vec::new(),
        &mut out,
    );
    out
}

/// A field set holding exactly these leaves.
fn from_leaves(paths: &[Vec<String>]) -> Value {
    let mut root = json!({});
    for p in paths {
        let mut cur = &mut root;
        for t in p {
            let Some(o) = cur.as_object_mut() else { break };
            cur = o.entry(t.clone()).or_insert_with(|| json!({}));
        }
    }
    root
}

/// The live object after applying `config` as `manager` (None: the object is new).
pub fn apply(
    def: Option<&str>,
    live: Option<&Value>,
    config: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    now: &str,
) -> Result<Value, ApiError> {
    let s = schemas();
    let w = Walker {
        schemas: s,
        list_map_keys: true,
    };
    let root = def.map(|d| json!({"$ref": format!("#/definitions/{d}")}));
    let applied = strip_identity(config);
    let ours = field_set(&w, root.as_ref(), &applied);
    let mut our_leaves = Vec::new();
    leaves(&ours, &mut Vec::new(), &mut our_leaves);
    // The entry's fields in the order of Go's ManagedFieldsEntry; its field set as
    // structured-merge-diff writes it.
    let entry = |mut fields: Value| {
        sort_field_set(&mut fields);
        json!({"manager": manager, "operation": "Apply", "apiVersion": api_version, "time": now,
               "fieldsType": "FieldsV1", "fieldsV1": fields})
    };
    let Some(live) = live else {
        let mut object = config.clone();
        crate::value::set(
            &mut object,
            &["metadata", "managedFields"],
            json!([entry(ours)]),
        );
        return Ok(object);
    };
    let mut managed: Vec<Value> = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let is_ours = |e: &Value| e["manager"] == manager && e["operation"] == "Apply";
    let previous: Vec<Vec<String>> = managed
        .iter()
        .filter(|e| is_ours(e))
        .flat_map(set_of)
        .collect();
    // Conflicts: a field another manager set that this apply gives another value.
    let mut causes = Vec::new();
    for e in managed.iter_mut().filter(|e| !is_ours(e)) {
        let theirs = set_of(e);
        let contested: Vec<&Vec<String>> = theirs
            .iter()
            .filter(|p| our_leaves.contains(p) && value_at(&applied, p) != value_at(live, p))
            .collect();
        if contested.is_empty() {
            continue;
        }
        if force {
            let kept: Vec<Vec<String>> = theirs
                .iter()
                .filter(|p| !contested.contains(p))
                .cloned()
                .collect();
            let mut kept = from_leaves(&kept);
            sort_field_set(&mut kept);
            e["fieldsV1"] = kept;
        } else {
            let who = e["manager"].as_str().unwrap_or("").to_string();
            let av = e["apiVersion"].as_str().unwrap_or("").to_string();
            for p in contested {
                causes.push(Cause {
                    reason: "FieldManagerConflict",
                    field: display(p),
                    message: format!("conflict with \"{who}\" using {av}"),
                });
            }
        }
    }
    if !causes.is_empty() {
        let list: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.message, c.field))
            .collect();
        let n = causes.len();
        let mut e = ApiError::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {n} conflict{}: {}",
                if n == 1 { "" } else { "s" },
                list.join(", ")
            ),
        );
        e.causes = causes;
        return Err(e);
    }
    // Fields this manager applied before and dropped now go, unless someone else holds them.
    let others: Vec<Vec<String>> = managed
        .iter()
        .filter(|e| !is_ours(e))
        .flat_map(set_of)
        .collect();
    let mut object = live.clone();
    let kept = || our_leaves.iter().chain(&others);
    for p in previous
        .iter()
        .filter(|p| !our_leaves.contains(p) && !others.contains(p))
    {
        // A list element that no kept field lies in goes whole (removing its key fields one
        // by one would leave the rest of it behind, no longer found by its key).
        let cut = p
            .iter()
            .enumerate()
            .position(|(i, t)| {
                t.starts_with("k:") && !kept().any(|q| q.len() > i && q[..=i] == p[..=i])
            })
            .map_or(p.len(), |i| i + 1);
        remove_at(&mut object, &p[..cut]);
    }
    crate::strategic::merge_applied(def, &mut object, &applied)?;
    managed.retain(|e| !is_ours(e));
    managed.retain(|e| {
        e.get("fieldsV1")
            .and_then(Value::as_object)
            .is_some_and(|o| !o.is_empty())
    });
    managed.push(entry(ours));
    crate::value::set(
        &mut object,
        &["metadata", "managedFields"],
        Value::Array(managed),
    );
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CM: &str = "io.k8s.api.core.v1.ConfigMap";

    #[test]
    fn conflicts_force_and_removal() {
        let first = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"owner": "first", "a": "1"}});
        let live = apply(Some(CM), None, &first, "one", false, "v1", "t").unwrap();
        assert_eq!(
            live["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:data": {"f:a": {}, "f:owner": {}}})
        );
        let second = json!({"metadata": {"name": "c"}, "data": {"owner": "second"}});
        let e = apply(Some(CM), Some(&live), &second, "two", false, "v1", "t").unwrap_err();
        assert_eq!(e.code, 409);
        assert_eq!(
            e.message,
            "Apply failed with 1 conflict: conflict with \"one\" using v1: .data.owner"
        );
        let forced = apply(Some(CM), Some(&live), &second, "two", true, "v1", "t").unwrap();
        assert_eq!(forced["data"]["owner"], "second");
        assert_eq!(forced["data"]["a"], "1");
        // "one" drops `a` from its config: it goes; it no longer owns `owner`.
        let again = apply(
            Some(CM),
            Some(&forced),
            &json!({"data": {}}),
            "one",
            false,
            "v1",
            "t",
        )
        .unwrap();
        assert!(again["data"].get("a").is_none(), "{again}");
        assert_eq!(again["data"]["owner"], "second");
        // The same value is no conflict.
        let same = json!({"data": {"owner": "second"}});
        apply(Some(CM), Some(&again), &same, "three", false, "v1", "t").unwrap();
    }

    #[test]
    fn containers_are_keyed() {
        let d =
            json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}});
        let w = Walker {
            schemas: schemas(),
            list_map_keys: true,
        };
        let fs = field_set(
            &w,
            Some(&json!({"$ref": "#/definitions/io.k8s.api.apps.v1.Deployment"})),
            &d,
        );
        assert!(
            fs["f:spec"]["f:template"]["f:spec"]["f:containers"]
                .get("k:{\"name\":\"c\"}")
                .is_some(),
            "{fs}"
        );
    }

    const SVC: &str = "io.k8s.api.core.v1.Service";

    /// A Service serving port 53 over UDP and TCP has two ports, keyed by port and protocol as
    /// Kubernetes keys them (a port without a protocol is TCP's); dropping one from the
    /// configuration removes that one only.
    #[test]
    fn ports_are_told_apart_by_number_and_protocol() {
        let config = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dns"},
            "spec": {"ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53}]}});
        let live = apply(Some(SVC), None, &config, "kubectl", false, "v1", "t").unwrap();
        let ports = &live["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:ports"];
        assert_eq!(
            keys(ports),
            [
                r#"k:{"port":53,"protocol":"TCP"}"#,
                r#"k:{"port":53,"protocol":"UDP"}"#
            ]
        );
        // Applied again over what the server stored (protocols defaulted), then without UDP.
        let mut stored = live.clone();
        stored["spec"]["ports"][1]["protocol"] = json!("TCP");
        let again = apply(
            Some(SVC),
            Some(&stored),
            &config,
            "kubectl",
            false,
            "v1",
            "t",
        )
        .unwrap();
        assert_eq!(again["spec"]["ports"], stored["spec"]["ports"], "{again}");
        let tcp_only = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dns"},
            "spec": {"ports": [{"name": "dns-tcp", "port": 53}]}});
        let after = apply(
            Some(SVC),
            Some(&again),
            &tcp_only,
            "kubectl",
            false,
            "v1",
            "t",
        )
        .unwrap();
        assert_eq!(
            after["spec"]["ports"],
            json!([{"name": "dns-tcp", "port": 53, "protocol": "TCP"}]),
            "{after}"
        );
        // A container's ports likewise.
        let w = Walker {
            schemas: schemas(),
            list_map_keys: true,
        };
        let pod = json!({"spec": {"containers": [{"name": "c",
            "ports": [{"containerPort": 53, "protocol": "UDP"}, {"containerPort": 53}]}]}});
        let fs = field_set(
            &w,
            Some(&json!({"$ref": "#/definitions/io.k8s.api.core.v1.Pod"})),
            &pod,
        );
        let mut ports = keys(&fs["f:spec"]["f:containers"][r#"k:{"name":"c"}"#]["f:ports"]);
        ports.sort();
        assert_eq!(
            ports,
            [
                r#"k:{"containerPort":53,"protocol":"TCP"}"#,
                r#"k:{"containerPort":53,"protocol":"UDP"}"#
            ]
        );
    }

    fn keys(v: &Value) -> Vec<&str> {
        v.as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// A managedFields entry is written in the order of Go's ManagedFieldsEntry, and its field
    /// set as structured-merge-diff writes it: `.` first, then fields by name, list elements
    /// by key (numbers by value, not by text) and set elements by value.
    #[test]
    fn managed_fields_are_written_in_kubernetes_order() {
        let config = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "labels": {"z": "1", "a": "2"}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "web", "ports": [{"containerPort": 10}, {"containerPort": 9}],
                 "image": "x"},
                {"name": "side", "image": "y"}]}},
                "replicas": 1}});
        let live = apply(
            Some("io.k8s.api.apps.v1.Deployment"),
            None,
            &config,
            "kubectl",
            false,
            "apps/v1",
            "t",
        )
        .unwrap();
        let entry = &live["metadata"]["managedFields"][0];
        assert_eq!(
            keys(entry),
            [
                "manager",
                "operation",
                "apiVersion",
                "time",
                "fieldsType",
                "fieldsV1"
            ]
        );
        let fs = &entry["fieldsV1"];
        assert_eq!(keys(fs), ["f:metadata", "f:spec"]);
        assert_eq!(keys(&fs["f:metadata"]["f:labels"]), ["f:a", "f:z"]);
        assert_eq!(keys(&fs["f:spec"]), ["f:replicas", "f:template"]);
        let containers = &fs["f:spec"]["f:template"]["f:spec"]["f:containers"];
        assert_eq!(
            keys(containers),
            [r#"k:{"name":"side"}"#, r#"k:{"name":"web"}"#]
        );
        let web = &containers[r#"k:{"name":"web"}"#];
        assert_eq!(keys(web), [".", "f:image", "f:name", "f:ports"]);
        assert_eq!(
            keys(&web["f:ports"]),
            [
                r#"k:{"containerPort":9,"protocol":"TCP"}"#,
                r#"k:{"containerPort":10,"protocol":"TCP"}"#
            ]
        );
    }

    #[test]
    fn values_order_as_structured_merge_diff_orders_them() {
        let ordered = [
            json!(-1),
            json!(2.5),
            json!(10),
            json!("a"),
            json!("b"),
            json!(false),
            json!(true),
            json!([1]),
            json!([1, 2]),
            json!({"a": 1}),
            Value::Null,
        ];
        for pair in ordered.windows(2) {
            assert_eq!(
                value_order(&pair[0], &pair[1]),
                Ordering::Less,
                "{} < {}",
                pair[0],
                pair[1]
            );
        }
        assert_eq!(element_order(".", "f:a"), Ordering::Less);
        assert_eq!(element_order("f:z", r#"k:{"a":1}"#), Ordering::Less);
        assert_eq!(element_order(r#"k:{"a":1}"#, "v:1"), Ordering::Less);
    }
}
