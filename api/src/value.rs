//! Writing into JSON objects that came from clients: `v["a"]["b"] = x` panics when `a` is not an
//! object, so fields the server sets go through [`set`], which makes the path into objects.
//! [`strip_type_meta`] takes an object's `kind` and `apiVersion` off, as a list's items go out.

use serde_json::{Map, Value};

/// Sets `path` in `v` to `value`, turning `v` and every value on the way into objects first.
pub fn set(v: &mut Value, path: &[&str], value: Value) {
    let mut cur = v;
    for key in path {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(map) = cur else { return };
        cur = map.entry(key.to_string()).or_insert(Value::Null);
    }
    *cur = value;
}

/// Takes `kind` and `apiVersion` off an object, keeping the order of its other keys: a typed
/// list's items go out without their type meta, which the list names once.
pub fn strip_type_meta(v: &mut Value) {
    if let Some(o) = v.as_object_mut() {
        o.shift_remove("kind");
        o.shift_remove("apiVersion");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn set_makes_objects_on_the_way() {
        let mut v = json!({"spec": true, "keep": 1});
        set(&mut v, &["spec", "replicas"], json!(3));
        assert_eq!(v, json!({"spec": {"replicas": 3}, "keep": 1}));
        let mut s = json!("x");
        set(&mut s, &["status", "phase"], json!("Pending"));
        assert_eq!(s, json!({"status": {"phase": "Pending"}}));
    }
}
