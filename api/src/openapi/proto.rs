//! The Swagger 2.0 document in the protocol-buffer form kubectl asks for
//! (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`): gnostic's `openapi.v2`
//! messages, written field by field from the JSON document. client-go decodes /openapi/v2 as
//! that form whatever the content type says, so JSON alone fails there.
//!
//! Only what the JSON document holds is written: the info, paths with their operations,
//! parameters and responses, the definitions, and the security settings. Vendor extensions
//! (`x-kubernetes-*`) and free values (`default`, `enum`) travel as YAML text, which JSON is.

use serde_json::{Map, Value};

/// A message being written: fields appended in any order, as protobuf allows.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn tag(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.tag(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn str(&mut self, field: u32, s: &str) {
        if !s.is_empty() {
            self.bytes(field, s.as_bytes());
        }
    }

    fn msg(&mut self, field: u32, m: Msg) {
        self.bytes(field, &m.0);
    }

    fn bool(&mut self, field: u32, b: bool) {
        if b {
            self.tag(field, 0);
            self.varint(1);
        }
    }

    fn int(&mut self, field: u32, i: i64) {
        if i != 0 {
            self.tag(field, 0);
            self.varint(i as u64);
        }
    }

    fn double(&mut self, field: u32, d: f64) {
        if d != 0.0 {
            self.tag(field, 1);
            self.0.extend_from_slice(&d.to_le_bytes());
        }
    }

    /// A string field from a JSON value, if it is a string.
    fn str_of(&mut self, field: u32, v: Option<&Value>) {
        if let Some(s) = v.and_then(Value::as_str) {
            self.str(field, s);
        }
    }

    fn strs_of(&mut self, field: u32, v: Option<&Value>) {
        for s in v.and_then(Value::as_array).into_iter().flatten() {
            if let Some(s) = s.as_str() {
                self.bytes(field, s.as_bytes());
            }
        }
    }
}

/// `Any { yaml = 2 }`: a free value as YAML (its JSON text).
fn any(v: &Value) -> Msg {
    let mut m = Msg::default();
    m.str(2, &v.to_string());
    m
}

/// `NamedAny { name = 1; value = 2 }` for each `x-` key of an object.
fn vendor_extensions(m: &mut Msg, field: u32, o: &Map<String, Value>) {
    for (k, v) in o.iter().filter(|(k, _)| k.starts_with("x-")) {
        let mut named = Msg::default();
        named.str(1, k);
        named.msg(2, any(v));
        m.msg(field, named);
    }
}

fn schema(v: &Value) -> Msg {
    let mut m = Msg::default();
    let Some(o) = v.as_object() else {
        return m;
    };
    m.str_of(1, o.get("$ref"));
    m.str_of(2, o.get("format"));
    m.str_of(3, o.get("title"));
    m.str_of(4, o.get("description"));
    if let Some(d) = o.get("default") {
        m.msg(5, any(d));
    }
    m.double(7, o.get("maximum").and_then(Value::as_f64).unwrap_or(0.0));
    m.double(9, o.get("minimum").and_then(Value::as_f64).unwrap_or(0.0));
    m.int(11, o.get("maxLength").and_then(Value::as_i64).unwrap_or(0));
    m.int(12, o.get("minLength").and_then(Value::as_i64).unwrap_or(0));
    m.str_of(13, o.get("pattern"));
    m.int(14, o.get("maxItems").and_then(Value::as_i64).unwrap_or(0));
    m.int(15, o.get("minItems").and_then(Value::as_i64).unwrap_or(0));
    m.bool(16, o.get("uniqueItems") == Some(&Value::Bool(true)));
    m.strs_of(19, o.get("required"));
    for e in o
        .get("enum")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.msg(20, any(e));
    }
    match o.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut ap = Msg::default();
            // A oneof: the boolean is written even when false.
            ap.tag(2, 0);
            ap.varint(u64::from(*b));
            m.msg(21, ap);
        }
        Some(s @ Value::Object(_)) => {
            let mut ap = Msg::default();
            ap.msg(1, schema(s));
            m.msg(21, ap);
        }
        _ => {}
    }
    match o.get("type") {
        Some(Value::String(t)) => {
            let mut ty = Msg::default();
            ty.str(1, t);
            m.msg(22, ty);
        }
        Some(t @ Value::Array(_)) => {
            let mut ty = Msg::default();
            ty.strs_of(1, Some(t));
            m.msg(22, ty);
        }
        _ => {}
    }
    match o.get("items") {
        Some(Value::Array(items)) => {
            let mut it = Msg::default();
            for i in items {
                it.msg(1, schema(i));
            }
            m.msg(23, it);
        }
        Some(i @ Value::Object(_)) => {
            let mut it = Msg::default();
            it.msg(1, schema(i));
            m.msg(23, it);
        }
        _ => {}
    }
    for s in o
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.msg(24, schema(s));
    }
    if let Some(props) = o.get("properties").and_then(Value::as_object) {
        m.msg(25, named_schemas(props));
    }
    m.bool(27, o.get("readOnly") == Some(&Value::Bool(true)));
    vendor_extensions(&mut m, 31, o);
    m
}

/// `{ repeated NamedSchema additional_properties = 1 }` (Properties, Definitions).
fn named_schemas(o: &Map<String, Value>) -> Msg {
    let mut m = Msg::default();
    for (name, s) in o {
        let mut named = Msg::default();
        named.str(1, name);
        named.msg(2, schema(s));
        m.msg(1, named);
    }
    m
}

/// `ParametersItem { Parameter parameter = 1 }`.
fn parameter(p: &Value) -> Msg {
    let mut param = Msg::default();
    let loc = p.get("in").and_then(Value::as_str).unwrap_or("");
    let required = p.get("required") == Some(&Value::Bool(true));
    if loc == "body" {
        let mut body = Msg::default();
        body.str_of(1, p.get("description"));
        body.str_of(2, p.get("name"));
        body.str(3, loc);
        body.bool(4, required);
        if let Some(s) = p.get("schema") {
            body.msg(5, schema(s));
        }
        param.msg(1, body);
    } else {
        // Query and path parameters share their first fields; the type and uniqueItems sit one
        // field later in a query parameter (after allow_empty_value).
        let query = loc != "path";
        let mut sub = Msg::default();
        sub.bool(1, required);
        sub.str(2, loc);
        sub.str_of(3, p.get("description"));
        sub.str_of(4, p.get("name"));
        let (ty, unique) = if query { (6, 20) } else { (5, 19) };
        sub.str_of(ty, p.get("type"));
        sub.bool(unique, p.get("uniqueItems") == Some(&Value::Bool(true)));
        let mut non_body = Msg::default();
        non_body.msg(if query { 3 } else { 4 }, sub);
        param.msg(2, non_body);
    }
    let mut item = Msg::default();
    item.msg(1, param);
    item
}

fn operation(op: &Value) -> Msg {
    let mut m = Msg::default();
    m.strs_of(1, op.get("tags"));
    m.str_of(2, op.get("summary"));
    m.str_of(3, op.get("description"));
    m.str_of(5, op.get("operationId"));
    m.strs_of(6, op.get("produces"));
    m.strs_of(7, op.get("consumes"));
    for p in op
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.msg(8, parameter(p));
    }
    if let Some(rs) = op.get("responses").and_then(Value::as_object) {
        let mut responses = Msg::default();
        for (code, r) in rs {
            let mut resp = Msg::default();
            resp.str_of(1, r.get("description"));
            if let Some(s) = r.get("schema") {
                let mut item = Msg::default();
                item.msg(1, schema(s));
                resp.msg(2, item);
            }
            let mut value = Msg::default();
            value.msg(1, resp);
            let mut named = Msg::default();
            named.str(1, code);
            named.msg(2, value);
            responses.msg(1, named);
        }
        m.msg(9, responses);
    }
    m.strs_of(10, op.get("schemes"));
    if let Some(o) = op.as_object() {
        vendor_extensions(&mut m, 13, o);
    }
    m
}

fn path_item(item: &Value) -> Msg {
    let mut m = Msg::default();
    for (field, method) in [
        (2, "get"),
        (3, "put"),
        (4, "post"),
        (5, "delete"),
        (8, "patch"),
    ] {
        if let Some(op) = item.get(method) {
            m.msg(field, operation(op));
        }
    }
    for p in item
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.msg(9, parameter(p));
    }
    m
}

/// The `openapi.v2.Document` of a Swagger 2.0 JSON document.
pub fn document(doc: &Value) -> Vec<u8> {
    let mut m = Msg::default();
    m.str_of(1, doc.get("swagger"));
    if let Some(info) = doc.get("info") {
        let mut i = Msg::default();
        i.str_of(1, info.get("title"));
        i.str_of(2, info.get("version"));
        m.msg(2, i);
    }
    if let Some(paths) = doc.get("paths").and_then(Value::as_object) {
        let mut ps = Msg::default();
        for (path, item) in paths {
            let mut named = Msg::default();
            named.str(1, path);
            named.msg(2, path_item(item));
            ps.msg(2, named);
        }
        m.msg(8, ps);
    }
    if let Some(defs) = doc.get("definitions").and_then(Value::as_object) {
        m.msg(9, named_schemas(defs));
    }
    for req in doc
        .get("security")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mut r = Msg::default();
        for (name, scopes) in req.as_object().into_iter().flatten() {
            let mut arr = Msg::default();
            arr.strs_of(1, Some(scopes));
            let mut named = Msg::default();
            named.str(1, name);
            named.msg(2, arr);
            r.msg(1, named);
        }
        m.msg(12, r);
    }
    if let Some(defs) = doc.get("securityDefinitions").and_then(Value::as_object) {
        let mut sd = Msg::default();
        for (name, d) in defs {
            let mut key = Msg::default();
            key.str_of(1, d.get("type"));
            key.str_of(2, d.get("name"));
            key.str_of(3, d.get("in"));
            key.str_of(4, d.get("description"));
            let mut item = Msg::default();
            item.msg(2, key);
            let mut named = Msg::default();
            named.str(1, name);
            named.msg(2, item);
            sd.msg(1, named);
        }
        m.msg(13, sd);
    }
    m.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn varints_and_nested_messages() {
        let mut m = Msg::default();
        m.varint(300);
        assert_eq!(m.0, vec![0xac, 0x02]);
        let bytes = document(&json!({"swagger": "2.0", "info": {"title": "K", "version": "v"}}));
        // swagger = 1 ("2.0"), info = 2 { title = 1 "K", version = 2 "v" }
        assert_eq!(
            bytes,
            vec![0x0a, 3, b'2', b'.', b'0', 0x12, 6, 0x0a, 1, b'K', 0x12, 1, b'v']
        );
    }

    #[test]
    fn schemas_keep_types_refs_and_extensions() {
        let s = schema(&json!({"type": "object", "$ref": "#/definitions/a.B",
                                "x-kubernetes-list-type": "map"}));
        let text = String::from_utf8_lossy(&s.0);
        assert!(text.contains("#/definitions/a.B"));
        assert!(text.contains("x-kubernetes-list-type"));
        assert!(text.contains("\"map\""));
        assert!(text.contains("object"));
    }
}
