//! JSON merge patch (RFC 7386) and JSON patch (RFC 6902) on JSON values.

use serde_json::Value;

use crate::error::ApiError;

/// The kinds of patch Kubernetes takes, named by a PATCH request's content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/strategic-merge-patch+json`.
    StrategicMerge,
    /// `application/apply-patch+yaml`: server-side apply.
    Apply,
}

impl PatchType {
    /// The patch type a content type names; UnsupportedMediaType for any other.
    pub fn from_content_type(content_type: &str) -> Result<PatchType, ApiError> {
        match content_type.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchType::StrategicMerge),
            "application/apply-patch+yaml" => Ok(PatchType::Apply),
            other => Err(ApiError::unsupported_media_type(other)),
        }
    }
}

/// RFC 7386: objects merge recursively, `null` removes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Default::default());
            }
            let t = target.as_object_mut().expect("made an object above");
            for (k, v) in p {
                if v.is_null() {
                    t.shift_remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn tokens(path: &str) -> Result<Vec<String>, ApiError> {
    if path.is_empty() {
        return Ok(vec![]);
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| ApiError::bad_request(format!("invalid JSON pointer {path:?}")))?;
    Ok(rest.split('/').map(unescape).collect())
}

fn parent<'a>(doc: &'a mut Value, toks: &[String], path: &str) -> Result<&'a mut Value, ApiError> {
    let mut v = doc;
    for t in toks {
        v = match v {
            Value::Object(m) => m.get_mut(t),
            Value::Array(a) => t.parse::<usize>().ok().and_then(move |i| a.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| missing(path))?;
    }
    Ok(v)
}

fn missing(path: &str) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("the server rejected our request due to an error in our request: doc is missing path: {path:?}"),
    )
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), ApiError> {
    let toks = tokens(path)?;
    let Some((last, head)) = toks.split_last() else {
        *doc = value;
        return Ok(());
    };
    match parent(doc, head, path)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>().map_err(|_| missing(path))?
            };
            if i > a.len() {
                return Err(missing(path));
            }
            a.insert(i, value);
        }
        _ => return Err(missing(path)),
    }
    Ok(())
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, ApiError> {
    let toks = tokens(path)?;
    let Some((last, head)) = toks.split_last() else {
        return Err(ApiError::bad_request("cannot remove the whole document"));
    };
    match parent(doc, head, path)? {
        Value::Object(m) => m.shift_remove(last).ok_or_else(|| missing(path)),
        Value::Array(a) => {
            let i = last.parse::<usize>().map_err(|_| missing(path))?;
            if i >= a.len() {
                return Err(missing(path));
            }
            Ok(a.remove(i))
        }
        _ => Err(missing(path)),
    }
}

fn get(doc: &Value, path: &str) -> Result<Value, ApiError> {
    doc.pointer(path).cloned().ok_or_else(|| missing(path))
}

/// RFC 6902: applies the operations in order; the document is unchanged if any fails.
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let ops = patch
        .as_array()
        .ok_or_else(|| ApiError::bad_request("a JSON patch must be an array of operations"))?;
    let mut work = doc.clone();
    for op in ops {
        let field = |name: &str| {
            op.get(name).and_then(Value::as_str).ok_or_else(|| {
                ApiError::bad_request(format!("JSON patch operation without {name:?}: {op}"))
            })
        };
        let path = field("path")?;
        let value = || {
            op.get("value").cloned().ok_or_else(|| {
                ApiError::bad_request(format!("JSON patch operation without \"value\": {op}"))
            })
        };
        match field("op")? {
            "add" => add(&mut work, path, value()?)?,
            "remove" => {
                remove(&mut work, path)?;
            }
            "replace" => {
                remove(&mut work, path)?;
                add(&mut work, path, value()?)?;
            }
            "move" => {
                let v = remove(&mut work, field("from")?)?;
                add(&mut work, path, v)?;
            }
            "copy" => {
                let v = get(&work, field("from")?)?;
                add(&mut work, path, v)?;
            }
            "test" => {
                if get(&work, path)? != value()? {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        format!("the server rejected our request due to an error in our request: testing value {path} failed"),
                    ));
                }
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unexpected JSON patch operation {other:?}"
                )))
            }
        }
    }
    *doc = work;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut doc, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn json_patch_rfc6902() {
        let mut doc = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"list": [1, 2]}});
        json_patch(
            &mut doc,
            &json!([
                {"op": "add", "path": "/metadata/labels/b~1c", "value": "2"},
                {"op": "remove", "path": "/metadata/labels/a"},
                {"op": "replace", "path": "/spec/list/0", "value": 9},
                {"op": "add", "path": "/spec/list/-", "value": 3},
                {"op": "test", "path": "/spec/list/1", "value": 2},
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"labels": {"b/c": "2"}}, "spec": {"list": [9, 2, 3]}})
        );
        let before = doc.clone();
        assert!(json_patch(
            &mut doc,
            &json!([{"op": "add", "path": "/x", "value": 1},
                                             {"op": "remove", "path": "/nope"}])
        )
        .is_err());
        assert_eq!(doc, before, "a failed patch changes nothing");
    }
}
