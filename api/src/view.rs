//! Versions served as another version's stored form, converted at the API's boundary as
//! kube-apiserver converts between a resource's versions: events.k8s.io/v1 Events are core
//! Events in the store, autoscaling/v1 HorizontalPodAutoscalers are autoscaling/v2 ones. A
//! request's body (an object, a merge-style patch, a JSON patch's paths) and query are turned
//! into the stored form on the way in; answers (objects, lists, watch events) are turned back on
//! the way out, while Statuses and Tables pass as they are.

use axum::body::Body;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;

use crate::error::ApiError;
use crate::query::Query;

/// How one served version maps onto the stored one.
pub struct View {
    /// The stored resource: (group, version, plural).
    pub stored: (&'static str, &'static str, &'static str),
    /// The kind and the stored form's apiVersion, which mark the objects to convert back.
    pub kind: &'static str,
    pub stored_api_version: &'static str,
    /// An object or a merge-style patch in the stored form.
    pub to_stored: fn(&mut Value),
    /// A JSON patch's operations in the stored form.
    pub json_patch_to_stored: fn(&mut Value),
    /// A stored object in the served form.
    pub from_stored: fn(&mut Value),
    /// A query (field selectors) in the stored form's field names.
    pub query_to_stored: fn(&Query) -> Query,
}

impl View {
    /// A decoded patch in the stored form: a JSON patch by its paths, the others by their
    /// field names.
    pub fn patch_to_stored(&self, kind: crate::patch::PatchType, patch: &mut Value) {
        match kind {
            crate::patch::PatchType::Json => (self.json_patch_to_stored)(patch),
            _ => (self.to_stored)(patch),
        }
    }

    fn is_stored(&self, v: &Value) -> bool {
        v.get("kind").and_then(Value::as_str) == Some(self.kind)
            && v.get("apiVersion").and_then(Value::as_str) == Some(self.stored_api_version)
    }

    /// Converts an answer holding stored objects; false when it holds none (a Status, a
    /// Table).
    pub fn answer_from_stored(&self, v: &mut Value) -> bool {
        if self.is_stored(v) {
            (self.from_stored)(v);
            crate::order::normalise(v);
            return true;
        }
        let list_kind = format!("{}List", self.kind);
        if v.get("kind").and_then(Value::as_str) == Some(list_kind.as_str()) {
            if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
                for item in items.iter_mut() {
                    // Items of a list may carry no kind of their own.
                    let kind = item.get("kind").and_then(Value::as_str);
                    if kind.is_none_or(|k| k == self.kind) {
                        let typed = kind.is_some();
                        (self.from_stored)(item);
                        if !typed {
                            // The conversion names the served type; a list's items do not.
                            crate::value::strip_type_meta(item);
                        }
                    }
                }
            }
            // The served form's apiVersion, as converting any object gives it.
            let mut probe = serde_json::json!({"kind": self.kind,
                                               "apiVersion": self.stored_api_version});
            (self.from_stored)(&mut probe);
            v["apiVersion"] = probe["apiVersion"].clone();
            crate::order::normalise(v);
            return true;
        }
        // Watch events: {"type": ..., "object": {...}}.
        if v.get("type").is_some() {
            if let Some(o) = v.get_mut("object").filter(|o| self.is_stored(o)) {
                (self.from_stored)(o);
                crate::order::normalise(o);
                return true;
            }
        }
        false
    }

    /// A request body turned into the stored form: objects and merge-style patches by their
    /// fields, JSON patches by their paths. Returns the body as JSON (the content type of an
    /// object body becomes application/json).
    pub fn body_to_stored(
        &self,
        body: &Bytes,
        content_type: &str,
    ) -> Result<(Bytes, String), ApiError> {
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
            "application/vnd.kubernetes.protobuf" => crate::protobuf::decode(body)?,
            "application/yaml" | "application/apply-patch+yaml" => serde_yaml::from_slice(body)
                .map_err(|e| {
                    ApiError::bad_request(format!("the request body is not valid YAML: {e}"))
                })?,
            _ => return Err(ApiError::unsupported_media_type(content_type)),
        };
        let out_type = match media.as_str() {
            "application/json-patch+json" => {
                (self.json_patch_to_stored)(&mut v);
                media.clone()
            }
            "application/merge-patch+json"
            | "application/strategic-merge-patch+json"
            | "application/apply-patch+yaml" => {
                (self.to_stored)(&mut v);
                media.clone()
            }
            _ => {
                (self.to_stored)(&mut v);
                "application/json".to_string()
            }
        };
        let bytes = serde_json::to_vec(&v).map_err(|e| ApiError::internal(e.to_string()))?;
        Ok((Bytes::from(bytes), out_type))
    }

    pub(crate) fn convert_bytes(&self, b: &[u8]) -> Bytes {
        // A chunk of a watch is one JSON line; anything else passes through as it is.
        let trimmed = b.strip_suffix(b"\n").unwrap_or(b);
        let Ok(mut v) = serde_json::from_slice::<Value>(trimmed) else {
            return Bytes::copy_from_slice(b);
        };
        if !self.answer_from_stored(&mut v) {
            return Bytes::copy_from_slice(b);
        }
        let mut out = crate::encoding::to_vec(&v).unwrap_or_else(|_| trimmed.to_vec());
        if trimmed.len() != b.len() {
            out.push(b'\n');
        }
        Bytes::from(out)
    }

    /// A response of the stored resource in the served form.
    pub async fn response_from_stored(
        &'static self,
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
            let view: &'static View = self;
            let stream = tokio_stream::StreamExt::map(body.into_data_stream(), move |chunk| {
                chunk.map(|c| view.convert_bytes(&c))
            });
            return axum::response::Response::from_parts(parts, Body::from_stream(stream));
        }
        match body.collect().await {
            Ok(c) => {
                let converted = self.convert_bytes(&c.to_bytes());
                parts.headers.remove("content-length");
                axum::response::Response::from_parts(parts, Body::from(converted))
            }
            Err(e) => {
                tracing::debug!(error = %e, "reading a response to convert failed");
                axum::response::Response::from_parts(parts, Body::empty())
            }
        }
    }
}

/// The views, by the (group, version) they serve.
static VIEWS: &[(&str, &str, &View)] = &[
    ("events.k8s.io", "v1", &crate::events::EVENTS),
    (
        "autoscaling",
        "v1",
        &crate::strategy::horizontalpodautoscaler::V1,
    ),
];

/// The view a resource is served through, if it is served as another's stored form.
pub fn of(res: &crate::resources::Resource) -> Option<&'static View> {
    VIEWS
        .iter()
        .find(|(g, v, view)| *g == res.group && *v == res.version && view.kind == res.kind)
        .map(|(_, _, view)| *view)
}
