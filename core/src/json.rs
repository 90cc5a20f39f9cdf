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
}
