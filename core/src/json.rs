//! Reading fields of objects that are still untyped JSON (`serde_json::Value`): one place for
//! the accessors that every component needs while objects move to k8s-openapi's types.

use serde_json::Value;

/// The string at a JSON pointer (`/metadata/name`), or "" when it is absent or not a string.
pub fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// The integer at a JSON pointer, or 0 when it is absent or not an integer.
pub fn int_at(v: &Value, pointer: &str) -> i64 {
    v.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

/// The string field `name` of an object, or "" when it is absent or not a string.
pub fn str_field<'a>(v: &'a Value, name: &str) -> &'a str {
    v.get(name).and_then(Value::as_str).unwrap_or("")
}

/// Orders every object's keys, at any depth, as Go's encoding/json writes a map. serde_json
/// keeps insertion order in this workspace (Kubernetes' field order), so text that must not
/// depend on field order (hashes, kubectl's byte-for-byte comparisons) is sorted first.
pub fn sort_keys(v: &mut Value) {
    match v {
        Value::Object(o) => {
            let mut entries: Vec<(String, Value)> = std::mem::take(o).into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, mut child) in entries {
                sort_keys(&mut child);
                o.insert(k, child);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(sort_keys),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn absent_or_other_types_read_as_empty() {
        let v = json!({"metadata": {"name": "web", "generation": 3}});
        assert_eq!(str_at(&v, "/metadata/name"), "web");
        assert_eq!(str_at(&v, "/metadata/generation"), "");
        assert_eq!(str_at(&v, "/spec/nodeName"), "");
        assert_eq!(str_field(&v["metadata"], "name"), "web");
        assert_eq!(str_field(&v, "kind"), "");
        assert_eq!(int_at(&v, "/metadata/generation"), 3);
        assert_eq!(int_at(&v, "/metadata/name"), 0);
    }

    #[test]
    fn keys_are_sorted_at_every_depth_and_lists_keep_their_order() {
        let mut v = json!({"b": {"z": 1, "a": [{"y": 1, "x": 2}, 3]}, "a": null});
        sort_keys(&mut v);
        assert_eq!(
            v.to_string(),
            r#"{"a":null,"b":{"a":[{"x":2,"y":1},3],"z":1}}"#
        );
    }
}
