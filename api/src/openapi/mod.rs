//! The OpenAPI documents: `/openapi/v2` (Swagger 2.0, every type at once) and `/openapi/v3`
//! (an index of one document per group version), as Kubernetes serves them.
//!
//! They are built once, on first use, from k8s-openapi's types ([`schemas`]) and the table of
//! served resources ([`paths`]). kubectl reads them to decide whether the server validates
//! fields (`fieldValidation` on the PATCH operations), for `kubectl explain`, and to compute
//! strategic merge patches in `kubectl apply`. [`crate::fieldvalidation`] walks the same
//! schemas.

pub mod paths;
pub mod proto;
pub mod schemas;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use axum::body::Body;
use hyper::Response;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::resources::{groups, RESOURCES};
pub use schemas::schemas;

/// One serialized document and the hash clients cache it under.
struct Doc {
    hash: String,
    bytes: Vec<u8>,
}

impl Doc {
    fn new(v: &Value) -> Doc {
        let bytes = serde_json::to_vec(v).unwrap_or_default();
        let hash = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect();
        Doc { hash, bytes }
    }
}

struct Documents {
    v2: Doc,
    /// The same document as gnostic's protocol buffer, which client-go decodes.
    v2_proto: Vec<u8>,
    /// By group-version path: `api/v1`, `apis/apps/v1`.
    v3: BTreeMap<String, Doc>,
    index: Doc,
}

fn info() -> Value {
    json!({"title": "Kubernetes", "version": "v1.32.0"})
}

fn build() -> Documents {
    let s = schemas();
    let mut all_paths = Map::new();
    let mut all_refs: Vec<String> = Vec::new();
    let mut v3 = BTreeMap::new();
    for (group, version) in groups() {
        let mut items = vec![paths::discovery_path(group, version)];
        for r in RESOURCES
            .iter()
            .filter(|r| r.group == group && r.version == version)
        {
            items.extend(paths::resource_paths(r, s));
        }
        let mut gv_paths = Map::new();
        let mut refs: Vec<String> = Vec::new();
        for item in &items {
            gv_paths.insert(item.path.clone(), item.v3());
            all_paths.insert(item.path.clone(), item.v2());
            refs.extend(item.refs().into_iter().map(str::to_string));
        }
        let components: Map<String, Value> = s
            .closure(refs.iter().map(String::as_str))
            .into_iter()
            .filter_map(|name| {
                let d = s.defs.get(&name)?;
                Some((name, schemas::to_v3(d)))
            })
            .collect();
        all_refs.extend(refs);
        let doc = json!({
            "openapi": "3.0.0",
            "info": info(),
            "paths": gv_paths,
            "components": {
                "schemas": components,
                "securitySchemes": {"BearerToken": {"type": "apiKey", "description": "Bearer Token authentication", "name": "authorization", "in": "header"}},
            },
            "security": [{"BearerToken": []}],
        });
        let key = paths::prefix(group, version)
            .trim_start_matches('/')
            .to_string();
        v3.insert(key, Doc::new(&doc));
    }
    let definitions: Map<String, Value> = s
        .closure(all_refs.iter().map(String::as_str))
        .into_iter()
        .filter_map(|name| Some((name.clone(), s.defs.get(&name)?.clone())))
        .collect();
    let v2 = json!({
        "swagger": "2.0",
        "info": info(),
        "paths": all_paths,
        "definitions": definitions,
        "securityDefinitions": {"BearerToken": {"type": "apiKey", "description": "Bearer Token authentication", "name": "authorization", "in": "header"}},
        "security": [{"BearerToken": []}],
    });
    let index: Map<String, Value> = v3
        .iter()
        .map(|(k, d)| {
            (
                k.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{k}?hash={}", d.hash)}),
            )
        })
        .collect();
    Documents {
        v2_proto: proto::document(&v2),
        v2: Doc::new(&v2),
        index: Doc::new(&json!({"paths": index})),
        v3,
    }
}

fn documents() -> &'static Documents {
    static DOCS: OnceLock<Documents> = OnceLock::new();
    DOCS.get_or_init(build)
}

/// Builds the documents (and the schemas field validation walks) now rather than on first use.
pub fn warm() {
    documents();
}

fn not_found() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn respond(status: u16, doc: &Doc, cache: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("etag", format!("\"{}\"", doc.hash))
        .header("cache-control", cache)
        .body(Body::from(doc.bytes.clone()))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// The media type of the v2 document as a protocol buffer, as answered: clients ask with an `@`
/// before the version, which a content type cannot carry (Go's media type parser rejects it).
pub const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// Answers `/openapi/<rest>`. The v3 documents are JSON (what kubectl's OpenAPI v3 client asks
/// for); the v2 document is JSON unless the client asks for protobuf, as client-go does.
pub fn serve(rest: &[&str], query: Option<&str>, accept: &str) -> Result<Response<Body>, ApiError> {
    let docs = documents();
    match rest {
        ["v2"] if accept.contains("protobuf") && accept.contains("proto-openapi.spec.v2") => {
            Response::builder()
                .status(200)
                .header("content-type", V2_PROTOBUF)
                .header("etag", format!("\"{}\"", docs.v2.hash))
                .header("cache-control", "no-cache, private")
                .body(Body::from(docs.v2_proto.clone()))
                .map_err(|e| ApiError::internal(e.to_string()))
        }
        ["v2"] => Ok(respond(200, &docs.v2, "no-cache, private")),
        ["v3"] => Ok(respond(200, &docs.index, "no-cache, private")),
        ["v3", gv @ ..] => {
            let key = gv.join("/");
            let doc = docs.v3.get(&key).ok_or_else(not_found)?;
            let asked = query.and_then(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == "hash")
                    .map(|(_, v)| v.into_owned())
            });
            match asked {
                // The hash names this document's content: it never changes under that URL.
                Some(h) if h == doc.hash => {
                    Ok(respond(200, doc, "public, immutable, max-age=31536000"))
                }
                // An old hash: send the client to the current one.
                Some(_) => Response::builder()
                    .status(301)
                    .header("location", format!("/openapi/v3/{key}?hash={}", doc.hash))
                    .header("cache-control", "no-cache, private")
                    .body(Body::empty())
                    .map_err(|e| ApiError::internal(e.to_string())),
                None => Ok(respond(200, doc, "no-cache, private")),
            }
        }
        _ => Err(not_found()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v3(key: &str) -> Value {
        let d = documents().v3.get(key).expect("document served");
        serde_json::from_slice(&d.bytes).expect("valid JSON")
    }

    #[test]
    fn index_names_every_group_version() {
        let index: Value = serde_json::from_slice(&documents().index.bytes).unwrap();
        for (g, v) in groups() {
            let key = paths::prefix(g, v).trim_start_matches('/').to_string();
            let url = index["paths"][&key]["serverRelativeURL"].as_str().unwrap();
            assert!(
                url.starts_with(&format!("/openapi/v3/{key}?hash=")),
                "{url}"
            );
        }
    }

    #[test]
    fn patch_operations_list_field_validation_with_their_kind() {
        let doc = v3("apis/apps/v1");
        let op = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(
            op["x-kubernetes-group-version-kind"],
            json!({"group": "apps", "version": "v1", "kind": "Deployment"})
        );
        let params: Vec<&str> = op["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["name"].as_str())
            .collect();
        assert!(params.contains(&"fieldValidation"), "{params:?}");
        assert!(op["requestBody"]["content"]
            .get("application/strategic-merge-patch+json")
            .is_some());
        let deploy = &doc["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"];
        assert_eq!(
            deploy["x-kubernetes-group-version-kind"][0]["kind"],
            "Deployment"
        );
        // Everything the document refers to is in it.
        let text = serde_json::to_string(&doc).unwrap();
        for piece in text.split("\"#/components/schemas/").skip(1) {
            let name = piece.split('"').next().unwrap();
            assert!(
                doc["components"]["schemas"].get(name).is_some(),
                "{name} missing"
            );
        }
    }

    #[test]
    fn v2_has_every_kind() {
        let v2: Value = serde_json::from_slice(&documents().v2.bytes).unwrap();
        for name in [
            "io.k8s.api.core.v1.Pod",
            "io.k8s.api.core.v1.PodList",
            "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
            "io.k8s.api.autoscaling.v1.Scale",
        ] {
            assert!(v2["definitions"].get(name).is_some(), "{name}");
        }
        let post = &v2["paths"]["/api/v1/namespaces/{namespace}/pods"]["post"];
        assert_eq!(post["operationId"], "createCoreV1NamespacedPod");
    }

    #[test]
    fn a_stale_hash_redirects() {
        let r = serve(&["v3", "api", "v1"], Some("hash=OLD"), "").unwrap();
        assert_eq!(r.status(), 301);
        assert!(serve(&["v3", "apis", "nope", "v1"], None, "").is_err());
        let asked = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
        let r = serve(&["v2"], None, asked).unwrap();
        assert_eq!(r.headers()["content-type"], V2_PROTOBUF);
    }
}
