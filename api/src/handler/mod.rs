//! Request routing and the REST verbs over [`crate::storage`].
//! The verbs live in the child modules: `node_stream` (pods/log, exec, attach and portforward
//! through the node agent), `reads`, `create`, `update`, `delete`, `binding`, `watch` and `body`.

mod binding;
mod body;
mod create;
mod delete;
mod node_stream;
mod reads;
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
use crate::query::Query;
use crate::rbac::Attributes;
use crate::resources::{self, Resource};
use crate::services::ServiceNet;
use crate::storage::ObjectStore;

use body::{decode_body, read_body};
use update::scale_of;

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
}

pub const MAX_READS_INFLIGHT: usize = 400;
pub const MAX_WRITES_INFLIGHT: usize = 200;

fn is_service(res: &Resource) -> bool {
    res.group.is_empty() && res.kind == "Service"
}

fn is_quota(res: &Resource) -> bool {
    res.group.is_empty() && res.kind == "ResourceQuota"
}

fn json_response(code: u16, body: &Value) -> Resp {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(bytes))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn error_response(e: &ApiError) -> Resp {
    let mut r = json_response(e.code, &e.status());
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

fn meta_str<'a>(o: &'a Value, field: &str) -> Option<&'a str> {
    meta(o).and_then(|m| m.get(field)).and_then(Value::as_str)
}

/// What a URL names: a resource, maybe a namespace, an object and a subresource.
pub struct Target {
    pub(crate) res: &'static Resource,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl Target {
    pub fn new(res: &'static Resource, ns: Option<String>, name: Option<String>) -> Target {
        Target {
            res,
            ns,
            name,
            sub: None,
        }
    }

    fn key(&self) -> String {
        self.res
            .key(self.ns.as_deref(), self.name.as_deref().unwrap_or(""))
    }
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
    pub(crate) fn object_name(&self) -> &str {
        self.name()
    }
    pub(crate) fn namespace(&self) -> Option<&str> {
        self.ns.as_deref()
    }

    /// What the request asks to do, for authorization (Kubernetes' RequestInfo): the verb
    /// follows the method, and a list or watch of one name by field selector names it.
    fn attributes(&self, method: &Method, q: &Query) -> Attributes {
        let verb = match *method {
            Method::GET | Method::HEAD if self.name.is_some() => "get",
            Method::GET | Method::HEAD if q.flag("watch") => "watch",
            Method::GET | Method::HEAD => "list",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if self.name.is_some() => "delete",
            Method::DELETE => "deletecollection",
            _ => "unknown",
        };
        let name = match &self.name {
            Some(n) => n.clone(),
            None => q
                .get("fieldSelector")
                .and_then(|f| {
                    f.split(',').find_map(|term| {
                        let (k, v) = term.split_once('=')?;
                        (k == "metadata.name").then(|| v.trim_start_matches('=').to_string())
                    })
                })
                .unwrap_or_default(),
        };
        Attributes::resource(
            verb,
            self.res.group,
            self.res.plural,
            self.sub.as_deref().unwrap_or(""),
            if self.res.namespaced {
                self.ns.as_deref().unwrap_or("")
            } else {
                ""
            },
            &name,
        )
    }
}

fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn parse_target(group: &str, version: &str, rest: &[&str]) -> Result<Target, ApiError> {
    let find = |plural: &str| resources::find(group, version, plural).ok_or_else(not_found_path);
    let (res, ns, tail): (&Resource, Option<String>, &[&str]) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if !(group.is_empty() && (*plural == "status" || *plural == "finalize")) =>
        {
            let res = find(plural)?;
            if !res.namespaced {
                return Err(not_found_path());
            }
            (res, Some(ns.to_string()), tail)
        }
        [plural, tail @ ..] => (find(plural)?, None, tail),
        [] => return Err(not_found_path()),
    };
    let (name, sub) = match tail {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, sub] => {
            if !res.subresources.contains(sub) {
                return Err(not_found_path());
            }
            (Some(name.to_string()), Some(sub.to_string()))
        }
        _ => return Err(not_found_path()),
    };
    // A namespaced object is only addressed inside its namespace.
    if res.namespaced && ns.is_none() && name.is_some() {
        return Err(not_found_path());
    }
    Ok(Target { res, ns, name, sub })
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
        }
    }

    pub async fn handle(&self, user: &User, req: Request<Body>) -> Resp {
        let started = std::time::Instant::now();
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let watch = Query::parse(req.uri().query()).flag("watch");
        let limit = match method {
            _ if watch => None,
            Method::GET | Method::HEAD => Some(&self.reads),
            _ => Some(&self.writes),
        };
        let _permit = match limit.map(|l| l.try_acquire()) {
            Some(Err(_)) => {
                let mut e = ApiError::new(
                    429,
                    "TooManyRequests",
                    "Too many requests, please try again later.",
                );
                e.retry_after = Some(1);
                return error_response(&e);
            }
            Some(Ok(p)) => Some(p),
            None => None,
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
        // events.k8s.io/v1 Events are core Events in the store, converted at this boundary.
        let events_view = t.res.group == "events.k8s.io" && t.res.kind == "Event";
        let (t, body, content_type, q) = if events_view {
            let core = resources::find("", "v1", "events")
                .ok_or_else(|| ApiError::internal("core events are served"))?;
            let (body, content_type) = crate::events::body_to_core(&body, &content_type)?;
            let q = crate::events::query_to_core(&q);
            decoded = decoded.map(|_| decode_body(&body, &content_type));
            (Target { res: core, ..t }, body, content_type, q)
        } else {
            (t, body, content_type, q)
        };
        let watching = q.flag("watch");
        let verb_allowed = |verb: &str| {
            if t.res.serves(verb) {
                Ok(())
            } else {
                Err(ApiError::method_not_allowed(format!(
                    "the server does not allow this method on the requested resource ({} {})",
                    verb,
                    t.res.qualified()
                )))
            }
        };
        // Unknown and duplicate fields of a create or update body (patches check their result).
        let warnings = match method {
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
        let resp = match (method, t.name.is_some(), t.sub.as_deref()) {
            (Method::GET, false, None) => {
                if q.flag("watch") {
                    verb_allowed("watch")?;
                    self.watch(&t, &q, accept).await
                } else {
                    verb_allowed("list")?;
                    self.list(&t, &q, accept).await
                }
            }
            (Method::GET, true, sub) => {
                verb_allowed("get")?;
                let stored = self.get(&t, &q).await?;
                match sub {
                    Some("scale") => Ok(json_response(200, &scale_of(t.res, &stored.object))),
                    _ => Ok(self.render_one(&t, stored.object, accept, &q)),
                }
            }
            (Method::POST, false, None) if t.res.is_virtual() => {
                let object = object()?;
                let answer = self.review(user, &t, object).await?;
                Ok(json_response(201, &answer))
            }
            (Method::POST, true, Some("token")) => {
                let object = object()?;
                let answer = self.token_request(&t, object).await?;
                Ok(json_response(201, &answer))
            }
            (Method::POST, false, None) => {
                verb_allowed("create")?;
                let mut object = object()?;
                if t.res.group == "certificates.k8s.io" {
                    crate::certificates::stamp(user, &mut object);
                    crate::certificates::validate(&object)?;
                }
                self.create(&t, &q, object).await
            }
            (Method::POST, true, Some("binding")) => {
                let object = object()?;
                self.bind(&t, &q, object).await
            }
            (Method::POST, true, Some("eviction")) => {
                let object = object()?;
                let opts = object.get("deleteOptions").cloned();
                self.delete(&t, &q, opts.as_ref()).await?;
                Ok(json_response(201, &success_status()))
            }
            (Method::PUT, true, sub) => {
                verb_allowed("update")?;
                let object = object()?;
                self.update(&t, &q, object, sub).await
            }
            (Method::PATCH, true, sub) => {
                verb_allowed("patch")?;
                self.patch(&t, &q, &body, &content_type, sub).await
            }
            (Method::DELETE, true, None) => {
                verb_allowed("delete")?;
                let opts = if body.is_empty() {
                    None
                } else {
                    Some(object()?)
                };
                let deleted = self.delete(&t, &q, opts.as_ref()).await?;
                Ok(json_response(200, &deleted))
            }
            (Method::DELETE, false, None) => {
                verb_allowed("deletecollection")?;
                self.delete_collection(&t, &q).await
            }
            _ => Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            )),
        }?;
        let resp = fieldvalidation::with_warnings(resp, &warnings);
        Ok(if events_view {
            crate::events::response_from_core(resp, watching).await
        } else {
            resp
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
