//! events.k8s.io/v1 Events are core/v1 Events seen another way, as in Kubernetes: one store
//! folder (/registry/events) holds them in the core form, and requests to events.k8s.io are
//! converted on the way in (bodies, patches, field selectors) and on the way out (objects, lists,
//! watch events). The two forms differ only in the names of top-level fields.

use axum::body::Body;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;

use crate::error::ApiError;
use crate::query::Query;

/// (events.k8s.io/v1 name, core/v1 name) of every field whose name differs.
const RENAMES: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

const EVENTS_API_VERSION: &str = "events.k8s.io/v1";

fn rename(o: &mut serde_json::Map<String, Value>, to_core: bool) {
    for (new, core) in RENAMES {
        let (from, to) = if to_core { (new, core) } else { (core, new) };
        if let Some(v) = o.remove(*from) {
            o.insert(to.to_string(), v);
        }
    }
}

/// An events.k8s.io/v1 Event (or a merge patch of one) in the core form.
pub fn to_core(v: &mut Value) {
    if let Some(o) = v.as_object_mut() {
        rename(o, true);
        if o.contains_key("apiVersion") {
            o.insert("apiVersion".into(), Value::from("v1"));
        }
    }
}

/// A stored core Event in the events.k8s.io/v1 form.
pub fn from_core(v: &mut Value) {
    if let Some(o) = v.as_object_mut() {
        rename(o, false);
        o.insert("apiVersion".into(), Value::from(EVENTS_API_VERSION));
    }
}

/// A JSON patch's paths in the core form.
fn json_patch_to_core(ops: &mut Value) {
    let Some(ops) = ops.as_array_mut() else {
        return;
    };
    for op in ops {
        for field in ["path", "from"] {
            let Some(p) = op.get(field).and_then(Value::as_str) else {
                continue;
            };
            let first = p.trim_start_matches('/').split('/').next().unwrap_or("");
            if let Some((_, core)) = RENAMES.iter().find(|(new, _)| *new == first) {
                let rest = &p[1 + first.len()..];
                op[field] = Value::from(format!("/{core}{rest}"));
            }
        }
    }
}

/// A decoded patch of an events.k8s.io Event in the core form: a JSON patch by its paths,
/// the others by their field names.
pub(crate) fn patch_to_core(kind: crate::patch::PatchType, patch: &mut Value) {
    match kind {
        crate::patch::PatchType::Json => json_patch_to_core(patch),
        _ => to_core(patch),
    }
}

/// A decoded answer of the core resource (an Event or an EventList) in the events.k8s.io/v1
/// form; anything else (a Status) stays as it is.
pub(crate) fn answer_from_core(v: &mut Value) {
    convert_answer(v);
}

/// A request body for events.k8s.io turned into the core form: objects and merge-style patches
/// by their field names, JSON patches by their paths. Returns the body as JSON (the content
/// type of an object body becomes application/json).
pub fn body_to_core(body: &Bytes, content_type: &str) -> Result<(Bytes, String), ApiError> {
    if body.is_empty() {
        return Ok((body.clone(), content_type.to_string()));
    }
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let mut v: Value = match media.as_str() {
        "application/json-patch+json"
        | "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/json"
        | "" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
        })?,
        "application/yaml" | "application/apply-patch+yaml" => serde_yaml::from_slice(body)
            .map_err(|e| {
                ApiError::bad_request(format!("the request body is not valid YAML: {e}"))
            })?,
        _ => return Err(ApiError::unsupported_media_type(content_type)),
    };
    let out_type = match media.as_str() {
        "application/json-patch+json" => {
            json_patch_to_core(&mut v);
            media.clone()
        }
        "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/apply-patch+yaml" => {
            to_core(&mut v);
            media.clone()
        }
        _ => {
            to_core(&mut v);
            "application/json".to_string()
        }
    };
    let bytes = serde_json::to_vec(&v).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok((Bytes::from(bytes), out_type))
}

/// Field selectors name events.k8s.io fields (`regarding.name`, `reportingController`); the
/// store's objects have the core names.
pub fn query_to_core(q: &Query) -> Query {
    q.map_value("fieldSelector", |sel| {
        sel.split(',')
            .map(|term| {
                let first = term.split(['.', '=', '!']).next().unwrap_or("");
                match RENAMES.iter().find(|(new, _)| *new == first) {
                    Some((_, core)) => format!("{core}{}", &term[first.len()..]),
                    None => term.to_string(),
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// Converts an answer holding core Events; false when it holds none (a Status, a Table).
fn convert_answer(v: &mut Value) -> bool {
    match v.get("kind").and_then(Value::as_str) {
        Some("Event") => from_core(v),
        Some("EventList") => {
            v["apiVersion"] = Value::from(EVENTS_API_VERSION);
            if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
                items.iter_mut().for_each(from_core);
            }
        }
        // Watch events: {"type": ..., "object": {...}}.
        None if v.get("type").is_some() => match v.get_mut("object") {
            Some(o) if o.get("kind").and_then(Value::as_str) == Some("Event") => from_core(o),
            _ => return false,
        },
        _ => return false,
    }
    true
}

fn convert_bytes(b: &[u8]) -> Bytes {
    // A chunk of a watch is one JSON line; anything else passes through as it is.
    let trimmed = b.strip_suffix(b"\n").unwrap_or(b);
    let Ok(mut v) = serde_json::from_slice::<Value>(trimmed) else {
        return Bytes::copy_from_slice(b);
    };
    if !convert_answer(&mut v) {
        return Bytes::copy_from_slice(b);
    }
    let mut out = serde_json::to_vec(&v).unwrap_or_else(|_| trimmed.to_vec());
    if trimmed.len() != b.len() {
        out.push(b'\n');
    }
    Bytes::from(out)
}

/// A response of the core resource in the events.k8s.io/v1 form.
pub async fn response_from_core(
    resp: axum::response::Response,
    watch: bool,
) -> axum::response::Response {
    let is_json = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json"));
    if !is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    if watch {
        let stream = tokio_stream::StreamExt::map(body.into_data_stream(), |chunk| {
            chunk.map(|c| convert_bytes(&c))
        });
        return axum::response::Response::from_parts(parts, Body::from_stream(stream));
    }
    match body.collect().await {
        Ok(c) => {
            let converted = convert_bytes(&c.to_bytes());
            parts.headers.remove("content-length");
            axum::response::Response::from_parts(parts, Body::from(converted))
        }
        Err(e) => {
            tracing::debug!(error = %e, "reading a response to convert failed");
            axum::response::Response::from_parts(parts, Body::empty())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_two_forms_convert_both_ways() {
        let new = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                         "metadata": {"name": "e1", "namespace": "default"},
                         "regarding": {"kind": "Pod", "name": "web"}, "note": "pulled",
                         "reason": "Pulled", "type": "Normal",
                         "reportingController": "kubelet", "reportingInstance": "n1",
                         "eventTime": "2026-12-03T00:00:00.000000Z", "action": "Pull"});
        let mut core = new.clone();
        to_core(&mut core);
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "web");
        assert_eq!(core["message"], "pulled");
        assert_eq!(core["reportingComponent"], "kubelet");
        assert!(core.get("note").is_none() && core.get("regarding").is_none());
        let mut back = core.clone();
        from_core(&mut back);
        assert_eq!(back, new);
    }

    #[test]
    fn patches_and_selectors_are_renamed() {
        let (b, ct) = body_to_core(
            &Bytes::from(r#"[{"op":"replace","path":"/note","value":"x"},{"op":"add","path":"/regarding/name","value":"y"}]"#),
            "application/json-patch+json",
        )
        .unwrap();
        assert_eq!(ct, "application/json-patch+json");
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v[0]["path"], "/message");
        assert_eq!(v[1]["path"], "/involvedObject/name");
        assert!(
            body_to_core(&Bytes::from("note: hi\n"), "application/merge-patch+json").is_err(),
            "YAML is not a merge patch"
        );
        let q = query_to_core(&Query::parse(Some(
            "fieldSelector=regarding.name%3Dweb,reportingController%3Dkubelet,type%3DNormal",
        )));
        assert_eq!(
            q.get("fieldSelector"),
            Some("involvedObject.name=web,reportingComponent=kubelet,type=Normal")
        );
    }

    #[test]
    fn answers_are_converted_line_by_line() {
        let line = br#"{"type":"ADDED","object":{"kind":"Event","apiVersion":"v1","message":"m"}}
"#;
        let out = convert_bytes(line);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["object"]["note"], "m");
        assert_eq!(v["object"]["apiVersion"], "events.k8s.io/v1");
        assert!(out.ends_with(b"\n"));
        let list =
            br#"{"kind":"EventList","apiVersion":"v1","items":[{"kind":"Event","message":"a"}]}"#;
        let v: Value = serde_json::from_slice(&convert_bytes(list)).unwrap();
        assert_eq!(v["apiVersion"], "events.k8s.io/v1");
        assert_eq!(v["items"][0]["note"], "a");
        let status = br#"{"kind":"Status","code":404}"#;
        assert_eq!(&convert_bytes(status)[..], &status[..]);
    }
}
