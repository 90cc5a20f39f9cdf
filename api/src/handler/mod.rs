//! Request routing and the REST verbs over [`crate::storage`].
//! `target` parses what a URL names; `serve` holds the verbs' dispatch, whether a request came
//! over HTTP (routed here) or from the in-process client (`in_process`). The verbs live in the
//! child modules: `node_stream` (pods/log, exec, attach and portforward through the node
//! agent), `reads`, `create`, `update`, `delete`, `binding`, `eviction`, `watch` and `body`;
//! `answered` serves the kinds worked out on each request rather than stored (bindings posted
//! to their collection, component statuses), `metrics` the resource metrics API.

mod answered;
mod binding;
mod body;
mod create;
mod delete;
mod eviction;
mod in_process;
mod metrics;
mod node_stream;
mod reads;
mod serve;
mod target;
mod update;
mod watch;

use std::sync::Arc;

use axum::body::Body;
use hyper::{Method, Request, Response, StatusCode};
use rand::Rng;
use rkube_store::server::node::Node;
use serde_json::{json, Value};

use crate::auth::User;
use crate::discovery;
use crate::error::ApiError;
use crate::fieldvalidation;
use crate::openapi;
use crate::patch::PatchType;
use crate::query::Query;
use crate::rbac::Attributes;
use crate::services::ServiceNet;
use crate::storage::{Fence, ObjectStore};

use body::{decode_body, read_body};
use reads::render_list;

use serve::verb_allowed;
pub(crate) use serve::{Answer, Patch, Verb};
pub use target::Target;
use target::{not_found_path, parse_target, stored_target};

/// Largest request body accepted (Kubernetes' limit).
pub const MAX_BODY: usize = 3 * 1024 * 1024;
/// How many times a write retries when the object moved under it and the client did not pin a
/// resourceVersion.
const UPDATE_RETRIES: usize = 16;

pub type Resp = Response<Body>;

pub struct Api {
    pub store: ObjectStore,
    pub node: Arc<Node>,
    pub net: ServiceNet,
    /// The port this member serves the API on (the `kubernetes` Service's target port).
    pub port: u16,
    /// Requests in flight, as kube-apiserver's --max-requests-inflight (400 reads) and
    /// --max-mutating-requests-inflight (200 writes); watches are long-running and not counted.
    reads: tokio::sync::Semaphore,
    writes: tokio::sync::Semaphore,
    pub(crate) authz: Arc<crate::rbac::Authorizer>,
    pub(crate) tokens: crate::token::SigningKey,
    /// How this server reaches node agents (its kubelet client certificate), when it has one.
    pub(crate) kubelet_tls: Option<Arc<rustls::ClientConfig>>,
    /// The resource usage scraped from the node agents (metrics.k8s.io).
    pub(crate) metrics: crate::resource_metrics::MetricsCache,
}

pub const MAX_READS_INFLIGHT: usize = 400;
pub const MAX_WRITES_INFLIGHT: usize = 200;

/// A JSON answer as kube-apiserver writes it: Go's json.Encoder, which ends with a newline.
fn json_response(code: u16, body: &impl serde::Serialize) -> Resp {
    let mut bytes = crate::encoding::to_vec(body).unwrap_or_default();
    bytes.push(b'\n');
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(bytes))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn error_response(e: &ApiError) -> Resp {
    let mut r = json_response(e.code, &e.status_body());
    if let Some(s) = e.retry_after {
        if let Ok(v) = s.to_string().parse() {
            r.headers_mut().insert("retry-after", v);
        }
    }
    r
}

pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub(crate) fn new_uid() -> String {
    let b: [u8; 16] = rand::thread_rng().gen();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-4{}-{}{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        ["8", "9", "a", "b"][(b[8] & 3) as usize],
        &h[17..20],
        &h[20..32]
    )
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::thread_rng();
    (0..5)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

fn meta(o: &Value) -> Option<&serde_json::Map<String, Value>> {
    o.get("metadata").and_then(Value::as_object)
}

fn meta_mut(o: &mut Value) -> Result<&mut serde_json::Map<String, Value>, ApiError> {
    let map = o
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body is not a JSON object"))?;
    if !map.get("metadata").is_some_and(Value::is_object) {
        map.insert("metadata".into(), json!({}));
    }
    Ok(map
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .expect("just made metadata an object"))
}

pub(crate) fn meta_str<'a>(o: &'a Value, field: &str) -> Option<&'a str> {
    meta(o).and_then(|m| m.get(field)).and_then(Value::as_str)
}

impl Api {
    pub fn new(
        node: Arc<Node>,
        net: ServiceNet,
        port: u16,
        tokens: crate::token::SigningKey,
    ) -> Self {
        Api {
            authz: Arc::new(crate::rbac::Authorizer::new()),
            tokens,
            store: ObjectStore::new(node.clone()),
            node,
            net,
            port,
            reads: tokio::sync::Semaphore::new(MAX_READS_INFLIGHT),
            writes: tokio::sync::Semaphore::new(MAX_WRITES_INFLIGHT),
            kubelet_tls: None,
            metrics: Default::default(),
        }
    }

    pub async fn handle(&self, user: &User, req: Request<Body>) -> Resp {
        let started = std::time::Instant::now();
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let watch = Query::parse(req.uri().query()).flag("watch");
        let _permit = if watch {
            None
        } else {
            match self.inflight(!matches!(method, Method::GET | Method::HEAD)) {
                Ok(p) => Some(p),
                Err(e) => return error_response(&e),
            }
        };
        let result = self.route(user, req).await;
        let resp = match result {
            Ok(r) => r,
            Err(e) => error_response(&e),
        };
        tracing::debug!(%method, %path, status = resp.status().as_u16(), user = %user.name,
                        elapsed_ms = started.elapsed().as_millis() as u64, "api request");
        resp
    }

    async fn route(&self, user: &User, req: Request<Body>) -> Result<Resp, ApiError> {
        let path = req.uri().path().to_string();
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let accept = req
            .headers()
            .get("accept")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_string();
        match segs.as_slice() {
            ["healthz" | "livez"] => return Ok(text(200, "ok")),
            ["readyz"] => {
                return Ok(if self.node.leader().is_some() {
                    text(200, "ok")
                } else {
                    text(
                        503,
                        "[-]etcd failed: the store has no leader\nreadyz check failed",
                    )
                })
            }
            ["version"] => return Ok(json_response(200, &version())),
            _ => {}
        }
        // An anonymous request goes on to authorization, as in Kubernetes: RBAC lets
        // system:unauthenticated reach the public paths and the cluster-info ConfigMap only.
        let user = self.authenticate(user, req.headers()).await?;
        let user = &self.impersonate(user, req.headers())?;
        let q = Query::parse(req.uri().query());
        match segs.as_slice() {
            ["api", "v1", rest @ ..] | ["apis", _, _, rest @ ..] if !rest.is_empty() => {}
            _ => {
                let verb = req.method().as_str().to_ascii_lowercase();
                self.check(user, &Attributes::path(&verb, &path))?;
            }
        }
        let get_only = |m: &Method| {
            if *m == Method::GET {
                Ok(())
            } else {
                Err(ApiError::method_not_allowed(
                    "the server does not allow this method on the requested resource".to_string(),
                ))
            }
        };
        match segs.as_slice() {
            ["api"] => {
                get_only(req.method())?;
                Ok(match discovery::wants_aggregated(&accept) {
                    Some(v) => aggregated_response(discovery::aggregated(true, v), v),
                    None => json_response(200, &discovery::api_versions(&self.server_address())),
                })
            }
            ["apis"] => {
                get_only(req.method())?;
                Ok(match discovery::wants_aggregated(&accept) {
                    Some(v) => aggregated_response(discovery::aggregated(false, v), v),
                    None => json_response(200, &discovery::api_group_list()),
                })
            }
            ["api", "v1"] => {
                get_only(req.method())?;
                discovery::resource_list("", "v1")
                    .map(|d| json_response(200, &d))
                    .ok_or_else(not_found_path)
            }
            ["apis", g] => {
                get_only(req.method())?;
                discovery::group(g)
                    .map(|d| json_response(200, &d))
                    .ok_or_else(not_found_path)
            }
            ["apis", g, v] => {
                get_only(req.method())?;
                discovery::resource_list(g, v)
                    .map(|d| json_response(200, &d))
                    .ok_or_else(not_found_path)
            }
            ["openapi", rest @ ..] => {
                get_only(req.method())?;
                openapi::serve(rest, req.uri().query(), &accept)
            }
            ["api", "v1", rest @ ..] => {
                let t = parse_target("", "v1", rest)?;
                self.authorize_resource(user, &t.attributes(req.method(), &q))
                    .await?;
                self.resource(user, t, req, &accept).await
            }
            ["apis", g, v, rest @ ..] => {
                let t = parse_target(g, v, rest)?;
                self.authorize_resource(user, &t.attributes(req.method(), &q))
                    .await?;
                self.resource(user, t, req, &accept).await
            }
            _ => Err(not_found_path()),
        }
    }

    /// Authorization of a resource request: RBAC, then, for a node's agent, the Node
    /// authorizer (its fixed rules, then the objects its pods use).
    async fn authorize_resource(&self, user: &User, a: &Attributes) -> Result<(), ApiError> {
        if self.authz.authorize(user, a).allowed {
            return Ok(());
        }
        if let Some(node) = crate::node_authz::node_of(user) {
            if crate::node_authz::static_allows(a) || self.node_graph_allows(node, a).await? {
                return Ok(());
            }
            let mut e = a.forbidden(user);
            e.message = format!(
                "{}: no relationship found between node '{node}' and this object",
                e.message
            );
            return Err(e);
        }
        Err(a.forbidden(user))
    }

    /// Authorization: a 403 in Kubernetes' words unless RBAC allows the request.
    fn check(&self, user: &User, a: &Attributes) -> Result<(), ApiError> {
        if self.authz.authorize(user, a).allowed {
            Ok(())
        } else {
            Err(a.forbidden(user))
        }
    }

    fn server_address(&self) -> String {
        // Clients reach the API at whatever address they dialled; this is informational.
        self.node.identity.name.clone()
    }

    async fn resource(
        &self,
        user: &User,
        t: Target,
        req: Request<Body>,
        accept: &str,
    ) -> Result<Resp, ApiError> {
        let q = Query::parse(req.uri().query());
        let method = req.method().clone();
        let content_type = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if let Some(sub @ ("log" | "exec" | "attach" | "portforward")) = t.sub.as_deref() {
            return self.node_stream(&t, sub, req).await;
        }
        let body = read_body(req).await?;
        // The object a create, an update or a delete carries, decoded once for everything below
        // (a node's restriction, field validation, the verb); a patch reads its bytes itself.
        let carries_object = matches!(method, Method::POST | Method::PUT)
            || (method == Method::DELETE && !body.is_empty());
        let mut decoded = carries_object.then(|| decode_body(&body, &content_type));
        if let Some(node) = crate::node_authz::node_of(user) {
            let body_name = (method == Method::POST)
                .then_some(decoded.as_ref())
                .flatten()
                .and_then(|d| d.as_ref().ok())
                .and_then(|o| meta_str(o, "name").map(str::to_string));
            self.node_restriction(node, &t.attributes(&method, &q), body_name.as_deref())
                .await?;
        }
        // Versions served as another's stored form (events.k8s.io/v1 Events are core Events,
        // autoscaling/v1 autoscalers are autoscaling/v2 ones), converted at this boundary.
        let view = crate::view::of(t.res);
        let (t, body, content_type, q) = match view {
            Some(view) => {
                let (body, content_type) = view.body_to_stored(&body, &content_type)?;
                decoded = decoded.map(|_| decode_body(&body, &content_type));
                let (t, q) = stored_target(view, t, &q)?;
                (t, body, content_type, q)
            }
            None => (t, body, content_type, q),
        };
        let watching = q.flag("watch");
        // Unknown and duplicate fields of a create or update body (patches check their result).
        let mut warnings = match method {
            Method::POST | Method::PUT if matches!(decoded, Some(Ok(_))) => {
                fieldvalidation::check(t.res, t.sub.as_deref(), &body, &content_type, &q)?
            }
            _ => Vec::new(),
        };
        let mut object = || {
            decoded
                .take()
                .unwrap_or_else(|| decode_body(&body, &content_type))
        };
        let verb = match (&method, t.name.is_some()) {
            (&Method::GET, false) if watching => {
                verb_allowed(&t, "watch")?;
                let resp = self.watch(&t, &q, accept).await?;
                return Ok(match view {
                    Some(view) => view.response_from_stored(resp, true).await,
                    None => resp,
                });
            }
            (&Method::GET, true) => Verb::Get,
            (&Method::GET, false) => Verb::List,
            (&Method::POST, _) => Verb::Create(object()?),
            (&Method::PUT, _) => Verb::Update(object()?),
            (&Method::PATCH, _) => Verb::Patch(Patch::decode(
                PatchType::from_content_type(&content_type)?,
                &body,
            )?),
            (&Method::DELETE, true) => Verb::Delete(if body.is_empty() {
                None
            } else {
                Some(object()?)
            }),
            (&Method::DELETE, false) => Verb::DeleteCollection,
            _ => {
                return Err(ApiError::method_not_allowed(
                    "the server does not allow this method on the requested resource",
                ))
            }
        };
        let (answer, patch_warnings) = self.serve(user, &t, &q, verb, Fence::Any).await?;
        let resp = match answer {
            Answer::Object(o) => self.render_one(&t, o, accept, &q),
            Answer::List(l) => render_list(&t, l, accept, &q),
            Answer::Json(code, v) => json_response(code, &v),
        };
        warnings.splice(0..0, patch_warnings);
        let resp = fieldvalidation::with_warnings(resp, &warnings);
        Ok(match view {
            Some(view) => view.response_from_stored(resp, watching).await,
            None => resp,
        })
    }

    /// A place among the requests in flight (kube-apiserver's --max-requests-inflight and
    /// --max-mutating-requests-inflight), or 429 when they are all taken.
    fn inflight(&self, write: bool) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
        let limit = if write { &self.writes } else { &self.reads };
        limit.try_acquire().map_err(|_| {
            let mut e = ApiError::new(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            );
            e.retry_after = Some(1);
            e
        })
    }
}

fn aggregated_response(doc: Value, version: &str) -> Resp {
    let mut r = json_response(200, &doc);
    if let Ok(v) =
        format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
            .parse()
    {
        r.headers_mut().insert("content-type", v);
    }
    r
}

fn text(code: u16, body: &'static str) -> Resp {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::OK))
        .header("content-type", "text/plain; charset=utf-8")
        .body(Body::from(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn success_status() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": concat!("v1.32.0-rkube.", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

/// Bad input never panics the server: random and mutated bodies, patches, selectors, paths,
/// query strings and continue tokens go through the same functions requests do, and each
/// either works or is an error with a status code.
#[cfg(test)]
mod robustness;
