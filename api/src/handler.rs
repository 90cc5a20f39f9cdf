//! Request routing and the REST verbs over [`crate::storage`].

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Method, Request, Response, StatusCode};
use rand::Rng;
use rkube_store::mvcc::types::{EventKind, KeyRange};
use rkube_store::mvcc::watch::{self as store_watch, WatchMessage, WatchSpec};
use rkube_store::server::node::Node;
use serde_json::{json, Value};

use crate::admission;
use crate::auth::User;
use crate::discovery;
use crate::error::ApiError;
use crate::fieldvalidation;
use crate::openapi;
use crate::patch;
use crate::query::{FieldSelector, LabelSelector, Query};
use crate::quota;
use crate::rbac::Attributes;
use crate::resources::{self, Resource};
use crate::services::{self, ServiceNet};
use crate::storage::{decode, set_resource_version, Change, Freshness, ObjectStore, Stored, Write};
use crate::table::{self, Form};

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

/// How long a pod being deleted may take to stop, in seconds: 0 (deleted at once) for a pod
/// no node runs (unscheduled, or finished), else the request's grace period or the pod's
/// `terminationGracePeriodSeconds` (30 by default).
fn pod_grace_period(pod: &Value, requested: Option<i64>) -> i64 {
    let bound = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    if !bound || matches!(phase, Some("Succeeded" | "Failed")) {
        return 0;
    }
    match requested {
        Some(g) if g >= 0 => g,
        _ => pod
            .pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .filter(|g| *g >= 0)
            .unwrap_or(30),
    }
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

fn freshness(q: &Query) -> Result<Freshness, ApiError> {
    let rv = match q.get("resourceVersion") {
        None | Some("") => return Ok(Freshness::Latest),
        Some("0") => return Ok(Freshness::Any),
        Some(v) => v.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {v:?}: must be an integer"
            ))
        })?,
    };
    match q.get("resourceVersionMatch") {
        None | Some("") | Some("NotOlderThan") => Ok(Freshness::NotOlderThan(rv)),
        Some("Exact") => Ok(Freshness::Exact(rv)),
        Some(other) => Err(ApiError::bad_request(format!(
            "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
        ))),
    }
}

/// The continue token: where the next page starts and the revision every page is read at.
fn encode_continue(rv: i64, start_after: &str) -> String {
    use base64::Engine;
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{start_after}\u{0}")});
    base64::engine::general_purpose::URL_SAFE.encode(token.to_string())
}

fn decode_continue(token: &str) -> Result<(i64, String), ApiError> {
    use base64::Engine;
    let bad = || ApiError::bad_request("continue key is not valid: the token is malformed");
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(token)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    if v["v"] != "meta.k8s.io/v1" {
        return Err(bad());
    }
    let rv = v["rv"].as_i64().filter(|r| *r > 0).ok_or_else(bad)?;
    let start = v["start"].as_str().ok_or_else(bad)?;
    if start.contains("..") || start.starts_with('/') {
        return Err(bad());
    }
    Ok((rv, start.to_string()))
}

/// Delete options from the body (DeleteOptions) or the query.
struct DeleteOptions {
    grace: Option<i64>,
    propagation: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
}

impl DeleteOptions {
    fn from(q: &Query, body: Option<&Value>) -> Result<DeleteOptions, ApiError> {
        let b = body.cloned().unwrap_or(json!({}));
        let grace = match b.get("gracePeriodSeconds").and_then(Value::as_i64) {
            Some(g) => Some(g),
            None => q.int("gracePeriodSeconds")?,
        };
        let propagation = b
            .get("propagationPolicy")
            .and_then(Value::as_str)
            .or(q.get("propagationPolicy"))
            .map(str::to_string);
        if let Some(p) = &propagation {
            if !["Orphan", "Background", "Foreground"].contains(&p.as_str()) {
                return Err(ApiError::bad_request(format!(
                    "propagationPolicy: Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
                )));
            }
        }
        Ok(DeleteOptions {
            grace,
            propagation,
            uid: b
                .pointer("/preconditions/uid")
                .and_then(Value::as_str)
                .map(str::to_string),
            resource_version: b
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
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

    /// pods/log, exec, attach and portforward are served by the pod's node agent: its
    /// kubelet port, reached with this API server's own client certificate. A pod with no node
    /// yet, or on a node with the simulated runtime, gets an answer saying why there is none.
    async fn node_stream(
        &self,
        t: &Target,
        sub: &str,
        req: Request<Body>,
    ) -> Result<Resp, ApiError> {
        let q = Query::parse(req.uri().query());
        let pod = self.get(t, &Query::default()).await?.object;
        let node = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("");
        let res = resources::find("", "v1", "nodes").expect("nodes are served");
        let node_obj = self
            .store
            .get(&res.key(None, node), Freshness::Any)
            .await?
            .map(|n| n.object);
        let runtime = node_obj
            .as_ref()
            .and_then(|n| n.pointer("/status/nodeInfo/containerRuntimeVersion"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let (Some(tls), Some(n)) = (&self.kubelet_tls, &node_obj) else {
            return Err(Self::node_stream_unavailable(t, sub, node, runtime));
        };
        if runtime.is_empty() || runtime.starts_with("sim://") {
            return Err(Self::node_stream_unavailable(t, sub, node, runtime));
        }
        let host = n
            .pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| {
                a.iter()
                    .find(|x| x.get("type").and_then(Value::as_str) == Some("InternalIP"))
            })
            .and_then(|x| x.get("address"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let port = n
            .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
            .and_then(Value::as_u64)
            .unwrap_or(10250) as u16;
        let ns = t.ns.as_deref().unwrap_or("default");
        if sub == "log" {
            let container = Self::container_of(t, &pod, &q)?;
            let mut query = Vec::new();
            for k in ["follow", "previous", "tailLines", "timestamps"] {
                if let Some(v) = q.get(k) {
                    query.push(format!("{k}={v}"));
                }
            }
            let path = format!(
                "/containerLogs/{ns}/{}/{container}?{}",
                t.name(),
                query.join("&")
            );
            let resp = crate::nodeproxy::get(tls.clone(), &host, port, &path).await?;
            if resp.status().as_u16() >= 400 {
                return Err(Self::agent_refusal(resp).await);
            }
            return Ok(resp);
        }
        // exec, attach, portforward: a stream the client upgrades to (SPDY/3.1). kubectl tries
        // a WebSocket first and takes SPDY when the upgrade is refused.
        let upgrade = req
            .headers()
            .get(hyper::header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if upgrade.is_empty() {
            return Err(ApiError::bad_request("Upgrade request required"));
        }
        if !upgrade.eq_ignore_ascii_case("SPDY/3.1") {
            return Err(ApiError::bad_request(format!(
                "unable to upgrade to {upgrade}: pods/{sub} streams are served over SPDY/3.1"
            )));
        }
        let query = req.uri().query().unwrap_or("").to_string();
        let path = if sub == "portforward" {
            format!("/portForward/{ns}/{}?{query}", t.name())
        } else {
            let container = Self::container_of(t, &pod, &q)?;
            format!("/{sub}/{ns}/{}/{container}?{query}", t.name())
        };
        let mut req = req;
        let client = hyper::upgrade::on(&mut req);
        let resp = crate::nodeproxy::upgrade(
            tls.clone(),
            &host,
            port,
            crate::nodeproxy::UpgradeRequest {
                method: req.method(),
                path_and_query: &path,
                headers: req.headers(),
                client,
            },
        )
        .await?;
        if resp.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
            let (parts, body) = resp.into_parts();
            return Err(Self::agent_refusal(Response::from_parts(parts, Body::new(body))).await);
        }
        Ok(resp.map(Body::new))
    }

    /// The container a pods/log, exec or attach request names, or the pod's only one.
    fn container_of(t: &Target, pod: &Value, q: &Query) -> Result<String, ApiError> {
        let containers: Vec<String> = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        match q.get("container") {
            Some(c) if !c.is_empty() => {
                if !containers.iter().any(|x| x == c) {
                    return Err(ApiError::bad_request(format!(
                        "container {c} is not valid for pod {}",
                        t.name()
                    )));
                }
                Ok(c.to_string())
            }
            _ if containers.len() == 1 => Ok(containers[0].clone()),
            _ => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {}, choose one of: [{}]",
                t.name(),
                containers.join(" ")
            ))),
        }
    }

    /// An agent's refusal (its status and sentence) as the API's error.
    async fn agent_refusal(resp: Resp) -> ApiError {
        let code = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        ApiError::new(
            code,
            match code {
                404 => "NotFound",
                400 => "BadRequest",
                _ => "InternalError",
            },
            String::from_utf8_lossy(&bytes).trim().to_string(),
        )
    }

    /// Why pods/{sub} cannot be served: the pod has no node yet, its node runs the simulated
    /// runtime or has not reported one, or this API server has no client certificate for agents.
    fn node_stream_unavailable(t: &Target, sub: &str, node: &str, runtime: &str) -> ApiError {
        if node.is_empty() {
            return ApiError::bad_request(format!(
                "pod {} is not scheduled to a node yet: no {sub} until it runs",
                t.name()
            ));
        }
        if runtime.starts_with("sim://") {
            return ApiError::bad_request(format!(
                "pod {} runs on node {node:?} with the simulated runtime: its containers are not processes, so there is no {sub}",
                t.name()
            ));
        }
        ApiError::new(
            503,
            "ServiceUnavailable",
            format!(
                "pods/{sub} is not available for pod {} on node {node:?}: the node has not reported a container runtime, or this API server has no client certificate for node agents (pki/apiserver-kubelet-client.crt)",
                t.name()
            ),
        )
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
        if let Some(node) = crate::node_authz::node_of(user) {
            let body_name = (method == Method::POST)
                .then(|| decode_body(&body, &content_type).ok())
                .flatten()
                .and_then(|o| meta_str(&o, "name").map(str::to_string));
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
            Method::POST | Method::PUT if decode_body(&body, &content_type).is_ok() => {
                fieldvalidation::check(t.res, t.sub.as_deref(), &body, &content_type, &q)?
            }
            _ => Vec::new(),
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
                let object = decode_body(&body, &content_type)?;
                let answer = self.review(user, &t, object).await?;
                Ok(json_response(201, &answer))
            }
            (Method::POST, true, Some("token")) => {
                let object = decode_body(&body, &content_type)?;
                let answer = self.token_request(&t, object).await?;
                Ok(json_response(201, &answer))
            }
            (Method::POST, false, None) => {
                verb_allowed("create")?;
                let mut object = decode_body(&body, &content_type)?;
                if t.res.group == "certificates.k8s.io" {
                    crate::certificates::stamp(user, &mut object);
                    crate::certificates::validate(&object)?;
                }
                self.create(&t, &q, object).await
            }
            (Method::POST, true, Some("binding")) => {
                let object = decode_body(&body, &content_type)?;
                self.bind(&t, &q, object).await
            }
            (Method::POST, true, Some("eviction")) => {
                let object = decode_body(&body, &content_type)?;
                let opts = object.get("deleteOptions").cloned();
                self.delete(&t, &q, opts.as_ref()).await?;
                Ok(json_response(201, &success_status()))
            }
            (Method::PUT, true, sub) => {
                verb_allowed("update")?;
                let object = decode_body(&body, &content_type)?;
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
                    Some(decode_body(&body, &content_type)?)
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

    fn render_one(&self, t: &Target, object: Value, accept: &str, q: &Query) -> Resp {
        match table::form(accept) {
            Form::Object => json_response(200, &object),
            Form::Metadata => json_response(200, &table::metadata_only(&object)),
            Form::Table => {
                let rv = meta_str(&object, "resourceVersion")
                    .unwrap_or("")
                    .to_string();
                json_response(
                    200,
                    &table::table(
                        t.res,
                        &[object],
                        json!({"resourceVersion": rv}),
                        q.get("includeObject").unwrap_or("Metadata"),
                    ),
                )
            }
        }
    }

    async fn get(&self, t: &Target, q: &Query) -> Result<Stored, ApiError> {
        self.store
            .get(&t.key(), freshness(q)?)
            .await?
            .ok_or_else(|| ApiError::not_found(t.res.group, t.res.plural, t.name()))
    }

    /// The objects of a collection matching the selectors: one page of at most `limit` (0: all)
    /// from `start` (a key suffix), read at `freshness`. Returns the objects, the revision and
    /// the key suffix to continue after, if more remain.
    async fn select(
        &self,
        t: &Target,
        labels: &LabelSelector,
        fields: &FieldSelector,
        limit: i64,
        start: Option<String>,
        mut freshness: Freshness,
    ) -> Result<(Vec<Value>, i64, Option<String>), ApiError> {
        let prefix = t.res.prefix(t.ns.as_deref());
        let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
        let mut from = match start {
            Some(s) => format!("{prefix}{s}"),
            None => prefix.clone(),
        };
        let mut items = Vec::new();
        let chunk = if limit > 0 { limit.max(100) } else { 0 };
        loop {
            let (kvs, rev, more) = self.store.range(&from, &end, chunk, freshness).await?;
            // Every further chunk reads at the same revision, so pages are one snapshot.
            freshness = Freshness::Exact(rev);
            let last_key = kvs.last().map(|kv| kv.key.clone());
            for kv in &kvs {
                let s = decode(kv)?;
                if labels.matches_object(&s.object) && fields.matches_object(&s.object) {
                    items.push(s.object);
                    if limit > 0 && items.len() as i64 == limit {
                        let key = String::from_utf8_lossy(&kv.key).to_string();
                        let suffix = key.strip_prefix(&prefix).unwrap_or(&key).to_string();
                        let remaining =
                            more || kv.key != *kvs.last().map(|k| &k.key).unwrap_or(&kv.key);
                        return Ok((items, rev, remaining.then_some(suffix)));
                    }
                }
            }
            match (more, last_key) {
                (true, Some(k)) => {
                    let mut next = k;
                    next.push(0);
                    from = String::from_utf8_lossy(&next).to_string();
                }
                _ => return Ok((items, rev, None)),
            }
        }
    }

    async fn list(&self, t: &Target, q: &Query, accept: &str) -> Result<Resp, ApiError> {
        let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or(""))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or(""), t.res.kind)?;
        let limit = q.int("limit")?.unwrap_or(0).max(0);
        let (fresh, start) = match q.get("continue").filter(|c| !c.is_empty()) {
            Some(token) => {
                let (rv, start) = decode_continue(token)?;
                if rv <= self.store.compact_revision() {
                    return Err(ApiError::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list."));
                }
                (Freshness::Exact(rv), Some(start))
            }
            None => (freshness(q)?, None),
        };
        let (items, rev, next) = self
            .select(t, &labels, &fields, limit, start, fresh)
            .await?;
        let mut list_meta = json!({"resourceVersion": rev.to_string()});
        if let Some(after) = next {
            list_meta["continue"] = json!(encode_continue(rev, after.trim_end_matches('\u{0}')));
        }
        Ok(match table::form(accept) {
            Form::Table => json_response(
                200,
                &table::table(
                    t.res,
                    &items,
                    list_meta,
                    q.get("includeObject").unwrap_or("Metadata"),
                ),
            ),
            Form::Metadata => json_response(
                200,
                &json!({
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": list_meta,
                    "items": items.iter().map(table::metadata_only).collect::<Vec<_>>(),
                }),
            ),
            Form::Object => json_response(
                200,
                &json!({
                    "kind": format!("{}List", t.res.kind),
                    "apiVersion": t.res.api_version(),
                    "metadata": list_meta,
                    "items": items,
                }),
            ),
        })
    }

    /// Fills in what the server owns on a new object and checks what the client sent.
    fn prepare_create(&self, t: &Target, object: &mut Value) -> Result<(), ApiError> {
        let res = t.res;
        let api_version = res.api_version();
        if let Some(av) = object.get("apiVersion").and_then(Value::as_str) {
            if av != api_version {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({api_version})"
                )));
            }
        }
        if let Some(kind) = object.get("kind").and_then(Value::as_str) {
            if kind != res.kind {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({kind}) does not match the expected kind ({})",
                    res.kind
                )));
            }
        }
        let o = object
            .as_object_mut()
            .ok_or_else(|| ApiError::bad_request("the request body is not a JSON object"))?;
        o.insert("apiVersion".into(), json!(api_version));
        o.insert("kind".into(), json!(res.kind));
        let m = meta_mut(object)?;
        if res.namespaced {
            let url_ns = t.ns.clone().unwrap_or_default();
            match m.get("namespace").and_then(Value::as_str) {
                Some(ns) if !ns.is_empty() && ns != url_ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ))
                }
                _ => {
                    m.insert("namespace".into(), json!(url_ns));
                }
            }
        } else {
            m.remove("namespace");
        }
        let name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            if let Some(prefix) = m
                .get("generateName")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty())
            {
                let n = format!("{}{}", &prefix[..prefix.len().min(58)], random_suffix());
                m.insert("name".into(), json!(n));
            }
        }
        m.insert("uid".into(), json!(new_uid()));
        m.insert("creationTimestamp".into(), json!(now()));
        for f in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            m.remove(f);
        }
        if res.has_spec {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
        Ok(())
    }

    /// NamespaceLifecycle: new objects only go into namespaces that exist and are not
    /// terminating.
    async fn check_namespace(&self, t: &Target) -> Result<(), ApiError> {
        let Some(ns) = t.ns.as_deref().filter(|_| t.res.namespaced) else {
            return Ok(());
        };
        let nsres = resources::find("", "v1", "namespaces").expect("namespaces are served");
        let key = nsres.key(None, ns);
        // The local state first; a namespace created a moment ago elsewhere needs a fresh read.
        let found = match self.store.get(&key, Freshness::Any).await? {
            Some(s) => Some(s),
            None => self.store.get(&key, Freshness::Latest).await?,
        };
        match found {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(s) if s.object.pointer("/metadata/deletionTimestamp").is_some()
                || s.object.pointer("/status/phase") == Some(&json!("Terminating")) =>
            {
                Err(ApiError::forbidden(format!(
                    "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    t.res.qualified(),
                    meta_str(&Value::Null, "name").unwrap_or("")
                )))
            }
            Some(_) => Ok(()),
        }
    }

    /// Creates an object as a POST would (also for the server's own bootstrap objects).
    pub(crate) async fn create_object(
        &self,
        t: &Target,
        q: &Query,
        object: Value,
    ) -> Result<Resp, ApiError> {
        self.create(t, q, object).await
    }

    pub(crate) async fn delete_object(
        &self,
        t: &Target,
        q: &Query,
        body: Option<&Value>,
    ) -> Result<Value, ApiError> {
        self.delete(t, q, body).await
    }

    async fn create(&self, t: &Target, q: &Query, mut object: Value) -> Result<Resp, ApiError> {
        let dry_run = q.dry_run()?;
        if t.res.is_virtual() {
            return Err(ApiError::method_not_allowed(format!(
                "{} are answered, not stored",
                t.res.qualified()
            )));
        }
        self.prepare_create(t, &mut object)?;
        admission::defaults(t.res, &mut object);
        self.check_namespace(t).await?;
        if t.res.group.is_empty() && t.res.kind == "Pod" {
            let ranges = self
                .namespace_objects("limitranges", t.ns.as_deref().unwrap_or(""))
                .await?;
            crate::limitrange::admit(&mut object, &ranges)?;
            self.admit_priority(&mut object).await?;
            admission::default_tolerations(&mut object);
            // The QoS class follows the resources LimitRange filled in.
            let qos = admission::qos_class(&object);
            crate::value::set(&mut object, &["status", "qosClass"], json!(qos));
        }
        let generated = meta_str(&object, "generateName").is_some() && t.name.is_none();
        for _ in 0..UPDATE_RETRIES {
            admission::validate(t.res, &object)?;
            let name = meta_str(&object, "name").unwrap_or("").to_string();
            let key = t.res.key(t.ns.as_deref(), &name);
            let mut obj = object.clone();
            if is_service(t.res) {
                services::allocate(&self.net, &mut obj)?;
            }
            if is_quota(t.res) {
                let hard = obj
                    .pointer("/spec/hard")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                let status = self
                    .quota_status(t.ns.as_deref().unwrap_or(""), &hard, Freshness::Latest)
                    .await?
                    .0;
                crate::value::set(&mut obj, &["status"], status);
            }
            let changes = self.changes_for(t, &key, 0, None, Some(&obj)).await?;
            if dry_run {
                return Ok(json_response(201, &obj));
            }
            if let Some(rev) = self.store.apply(&changes).await? {
                set_resource_version(&mut obj, rev);
                return Ok(json_response(201, &obj));
            }
            if self.store.get(&key, Freshness::Latest).await?.is_some() {
                if generated {
                    // A generated name collided: draw another.
                    let prefix = meta_str(&object, "generateName").unwrap_or("").to_string();
                    meta_mut(&mut object)?
                        .insert("name".into(), json!(format!("{prefix}{}", random_suffix())));
                    continue;
                }
                return Err(ApiError::already_exists(t.res.group, t.res.plural, &name));
            }
            if is_service(t.res) {
                self.check_claims(&object, None).await?;
            }
            // A quota moved or a picked address was taken meanwhile: go again.
        }
        Err(ApiError::new(
            500,
            "ServerTimeout",
            "the object could not be stored after several attempts (concurrent changes); try again",
        ))
    }

    /// Every object of a resource in one namespace, as this member has them.
    /// Priority admission: a pod's priority is its PriorityClass's value (the built-in
    /// system-cluster-critical and system-node-critical too), or the global default class's
    /// when it names none.
    async fn admit_priority(&self, pod: &mut Value) -> Result<(), ApiError> {
        const BUILT_IN: &[(&str, i64)] = &[
            ("system-cluster-critical", 2_000_000_000),
            ("system-node-critical", 2_000_001_000),
        ];
        let res = resources::find("scheduling.k8s.io", "v1", "priorityclasses")
            .ok_or_else(|| ApiError::internal("priorityclasses are served"))?;
        let prefix = res.prefix(None);
        let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
        let (kvs, _, _) = self.store.range(&prefix, &end, 0, Freshness::Any).await?;
        let classes: Vec<Value> = kvs
            .iter()
            .map(|kv| decode(kv).map(|s| s.object))
            .collect::<Result<_, _>>()?;
        let named = pod
            .pointer("/spec/priorityClassName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_string);
        let (name, value, policy) = match named {
            Some(name) => match classes.iter().find(|c| meta_str(c, "name") == Some(&name)) {
                Some(c) => (
                    name,
                    c.get("value").and_then(Value::as_i64).unwrap_or(0),
                    c.get("preemptionPolicy").cloned(),
                ),
                None => match BUILT_IN.iter().find(|(n, _)| *n == name) {
                    Some((_, v)) => (name, *v, None),
                    None => {
                        return Err(ApiError::forbidden(format!(
                            "pods \"{}\" is forbidden: no PriorityClass with name {name} was found",
                            meta_str(pod, "name").unwrap_or("")
                        )))
                    }
                },
            },
            None => match classes
                .iter()
                .find(|c| c.get("globalDefault").and_then(Value::as_bool) == Some(true))
            {
                Some(c) => (
                    meta_str(c, "name").unwrap_or("").to_string(),
                    c.get("value").and_then(Value::as_i64).unwrap_or(0),
                    c.get("preemptionPolicy").cloned(),
                ),
                None => return Ok(()),
            },
        };
        crate::value::set(pod, &["spec", "priorityClassName"], json!(name));
        crate::value::set(pod, &["spec", "priority"], json!(value));
        if let Some(p) = policy {
            crate::value::set(pod, &["spec", "preemptionPolicy"], p);
        }
        Ok(())
    }

    pub(crate) async fn namespace_objects(
        &self,
        plural: &str,
        ns: &str,
    ) -> Result<Vec<Value>, ApiError> {
        let res = resources::find("", "v1", plural).expect("a served core resource");
        let prefix = res.prefix(Some(ns));
        let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
        let (kvs, _, _) = self.store.range(&prefix, &end, 0, Freshness::Any).await?;
        kvs.iter().map(|kv| decode(kv).map(|s| s.object)).collect()
    }

    /// A 422 when one of the addresses `svc` asks for (and `old` did not hold) is taken.
    async fn check_claims(&self, svc: &Value, old: Option<&Value>) -> Result<(), ApiError> {
        let held = old.map(services::claims).unwrap_or_default();
        for claim in services::claims(svc) {
            if held.contains(&claim) {
                continue;
            }
            if self.store.get(&claim, Freshness::Latest).await?.is_some() {
                return Err(services::taken(svc, &claim));
            }
        }
        Ok(())
    }

    /// Every store change that goes with writing `new` (None: deleting) over `old` at `key`:
    /// the object, the address claims of a Service and the usage of the namespace's quotas.
    async fn changes_for(
        &self,
        t: &Target,
        key: &str,
        expected: i64,
        old: Option<&Value>,
        new: Option<&Value>,
    ) -> Result<Vec<Change>, ApiError> {
        let mut changes = vec![Change {
            key: key.to_string(),
            expected: Some(expected),
            write: new.cloned(),
        }];
        let any = new.or(old);
        let name = any
            .and_then(|o| meta_str(o, "name"))
            .unwrap_or("")
            .to_string();
        if is_service(t.res) {
            let before = old.map(services::claims).unwrap_or_default();
            let after = new.map(services::claims).unwrap_or_default();
            let owner = json!({"service": format!("{}/{name}", t.ns.as_deref().unwrap_or(""))});
            for c in after.iter().filter(|c| !before.contains(c)) {
                changes.push(Change {
                    key: c.clone(),
                    expected: Some(0),
                    write: Some(owner.clone()),
                });
            }
            for c in before.iter().filter(|c| !after.contains(c)) {
                changes.push(Change {
                    key: c.clone(),
                    expected: None,
                    write: None,
                });
            }
        }
        if t.res.namespaced && !is_quota(t.res) {
            let delta = quota::delta(t.res, old, new);
            if !delta.is_empty() {
                let qres = resources::find("", "v1", "resourcequotas").expect("served");
                let ns =
                    t.ns.as_deref()
                        .or_else(|| any.and_then(|o| meta_str(o, "namespace")))
                        .unwrap_or("");
                let prefix = qres.prefix(Some(ns));
                let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
                let (kvs, _, _) = self
                    .store
                    .range(&prefix, &end, 0, Freshness::Latest)
                    .await?;
                for kv in kvs {
                    let q = decode(&kv)?;
                    if let Some(charged) = quota::charge(&q.object, t.res, &name, new, &delta)? {
                        changes.push(Change {
                            key: String::from_utf8_lossy(&kv.key).to_string(),
                            expected: Some(q.revision),
                            write: Some(charged),
                        });
                    }
                }
            }
        }
        Ok(changes)
    }

    /// A quota's status computed from the objects in its namespace, and the revision read at.
    pub(crate) async fn quota_status(
        &self,
        ns: &str,
        hard: &serde_json::Map<String, Value>,
        freshness: Freshness,
    ) -> Result<(Value, i64), ApiError> {
        let mut totals = std::collections::BTreeMap::new();
        let mut fresh = freshness;
        let mut revision = 0;
        let mut seen = std::collections::HashSet::new();
        for res in resources::RESOURCES
            .iter()
            .filter(|r| r.namespaced && !r.storage.is_empty())
        {
            if !seen.insert(res.storage) {
                continue;
            }
            let prefix = res.prefix(Some(ns));
            let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
            let (kvs, rev, _) = self.store.range(&prefix, &end, 0, fresh).await?;
            // Every resource is read at the same revision.
            fresh = Freshness::Exact(rev);
            revision = rev;
            for kv in kvs {
                let o = decode(&kv)?;
                for (k, v) in quota::usage(res, &o.object) {
                    *totals.entry(k).or_insert(0) += v;
                }
            }
        }
        Ok((quota::status_from(hard, &totals), revision))
    }

    /// The new state of an object from a full replacement (`PUT`), given its current state.
    fn merge_update(
        &self,
        t: &Target,
        current: &Value,
        mut new: Value,
        sub: Option<&str>,
    ) -> Result<Value, ApiError> {
        let res = t.res;
        if let Some(kind) = new.get("kind").and_then(Value::as_str) {
            let want = if sub == Some("scale") {
                "Scale"
            } else {
                res.kind
            };
            if kind != want {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({kind}) does not match the expected kind ({want})"
                )));
            }
        }
        match sub {
            Some("status") => {
                let mut out = current.clone();
                crate::value::set(
                    &mut out,
                    &["status"],
                    new.get("status").cloned().unwrap_or(json!({})),
                );
                return Ok(out);
            }
            Some("scale") => {
                let replicas = new
                    .pointer("/spec/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                if replicas < 0 {
                    return Err(ApiError::invalid(
                        "autoscaling",
                        "Scale",
                        t.name(),
                        vec![crate::error::Cause {
                            reason: "FieldValueInvalid",
                            field: "spec.replicas".into(),
                            message: format!(
                                "Invalid value: {replicas}: must be greater than or equal to 0"
                            ),
                        }],
                    ));
                }
                let mut out = current.clone();
                crate::value::set(&mut out, &["spec", "replicas"], json!(replicas));
                return Ok(bump_generation(res, current, out));
            }
            Some("finalize") => {
                let mut out = current.clone();
                let finalizers = new
                    .pointer("/spec/finalizers")
                    .cloned()
                    .unwrap_or(json!([]));
                crate::value::set(&mut out, &["spec", "finalizers"], finalizers);
                return Ok(out);
            }
            Some("approval") => {
                let mut out = current.clone();
                let conditions = new
                    .pointer("/status/conditions")
                    .cloned()
                    .unwrap_or(json!([]));
                crate::value::set(&mut out, &["status", "conditions"], conditions);
                return Ok(out);
            }
            _ => {}
        }
        let o = new
            .as_object_mut()
            .ok_or_else(|| ApiError::bad_request("the request body is not a JSON object"))?;
        o.insert("apiVersion".into(), json!(res.api_version()));
        o.insert("kind".into(), json!(res.kind));
        if res.subresources.contains(&"status") {
            match current.get("status") {
                Some(s) => {
                    o.insert("status".into(), s.clone());
                }
                None => {
                    o.remove("status");
                }
            }
        }
        let cur_meta = meta(current).cloned().unwrap_or_default();
        let m = meta_mut(&mut new)?;
        if let Some(n) = m.get("name").and_then(Value::as_str) {
            if n != t.name() {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({})",
                    t.name()
                )));
            }
        }
        m.insert("name".into(), json!(t.name()));
        if res.namespaced {
            m.insert("namespace".into(), json!(t.ns.clone().unwrap_or_default()));
        }
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "generateName",
        ] {
            match cur_meta.get(f) {
                Some(v) => {
                    m.insert(f.into(), v.clone());
                }
                None => {
                    m.remove(f);
                }
            }
        }
        if is_service(res) {
            services::keep_allocated(current, &mut new);
        }
        admission::defaults(res, &mut new);
        Ok(bump_generation(res, current, new))
    }

    /// Stores the new state of an object whose current state was read at `current.revision`.
    /// An object being deleted whose last finalizer is gone is deleted instead.
    async fn commit(
        &self,
        t: &Target,
        current: &Stored,
        new: Value,
        dry_run: bool,
    ) -> Result<Option<Stored>, ApiError> {
        admission::validate(t.res, &new)?;
        check_immutable(t.res, &current.object, &new)?;
        let finalizers_done = new.pointer("/metadata/deletionTimestamp").is_some()
            && new
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(|f| f.is_empty());
        let mut new = new;
        if is_service(t.res) && !finalizers_done {
            services::allocate(&self.net, &mut new)?;
        }
        let write = (!finalizers_done).then(|| new.clone());
        let changes = self
            .changes_for(
                t,
                &t.key(),
                current.revision,
                Some(&current.object),
                write.as_ref(),
            )
            .await?;
        if dry_run {
            return Ok(Some(Stored {
                object: new,
                revision: current.revision,
            }));
        }
        match self.store.apply(&changes).await? {
            Some(revision) => {
                let mut object = write.unwrap_or_else(|| current.object.clone());
                set_resource_version(&mut object, revision);
                Ok(Some(Stored { object, revision }))
            }
            None => {
                if is_service(t.res) {
                    self.check_claims(&new, Some(&current.object)).await?;
                }
                Ok(None)
            }
        }
    }

    async fn update(
        &self,
        t: &Target,
        q: &Query,
        body: Value,
        sub: Option<&str>,
    ) -> Result<Resp, ApiError> {
        let dry_run = q.dry_run()?;
        let pinned = body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<i64>().map_err(|_| {
                    ApiError::bad_request(format!("metadata.resourceVersion: Invalid value: {s:?}"))
                })
            })
            .transpose()?;
        for _ in 0..UPDATE_RETRIES {
            let current = self.get(t, &Query::default()).await?;
            if let Some(rv) = pinned {
                if rv != current.revision {
                    return Err(ApiError::stale(t.res.group, t.res.plural, t.name()));
                }
            }
            let new = self.merge_update(t, &current.object, body.clone(), sub)?;
            if let Some(s) = self.commit(t, &current, new, dry_run).await? {
                let out = if sub == Some("scale") {
                    scale_of(t.res, &s.object)
                } else {
                    s.object
                };
                return Ok(json_response(200, &out));
            }
            if pinned.is_some() {
                return Err(ApiError::stale(t.res.group, t.res.plural, t.name()));
            }
        }
        Err(ApiError::conflict(
            t.res.group,
            t.res.plural,
            t.name(),
            "too many concurrent updates; try again",
        ))
    }

    async fn patch(
        &self,
        t: &Target,
        q: &Query,
        body: &Bytes,
        content_type: &str,
        sub: Option<&str>,
    ) -> Result<Resp, ApiError> {
        let dry_run = q.dry_run()?;
        let ct = content_type.split(';').next().unwrap_or("").trim();
        if ct == "application/apply-patch+yaml" {
            return self.server_side_apply(t, q, body, sub).await;
        }
        let patch: Value = match ct {
            "application/json-patch+json"
            | "application/merge-patch+json"
            | "application/strategic-merge-patch+json" => serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
            other => return Err(ApiError::unsupported_media_type(other)),
        };
        for _ in 0..UPDATE_RETRIES {
            let current = self.get(t, &Query::default()).await?;
            // A patch applies to what the client sees: the Scale for /scale.
            let mut view = if sub == Some("scale") {
                scale_of(t.res, &current.object)
            } else {
                current.object.clone()
            };
            let before = view.clone();
            match ct {
                "application/json-patch+json" => patch::json_patch(&mut view, &patch)?,
                "application/strategic-merge-patch+json" => {
                    let (group, version, kind) = if sub == Some("scale") {
                        ("autoscaling", "v1", "Scale")
                    } else {
                        (t.res.group, t.res.version, t.res.kind)
                    };
                    let def = crate::openapi::schemas::schemas().kind_def(group, version, kind);
                    crate::strategic::apply(def, &mut view, &patch)?
                }
                _ => patch::merge_patch(&mut view, &patch),
            }
            let warnings = fieldvalidation::check_patch(t.res, sub, body, &before, &view, q)?;
            let pinned = view
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|rv| {
                    patch.pointer("/metadata/resourceVersion").is_some() && *rv != current.revision
                });
            if pinned.is_some() {
                return Err(ApiError::stale(t.res.group, t.res.plural, t.name()));
            }
            let new = match sub {
                None => {
                    let mut new = self.merge_update(t, &current.object, view.clone(), None)?;
                    // A patch of the main resource leaves status as it was (merge_update did),
                    // except for kinds without a status subresource, where it is part of the object.
                    if !t.res.subresources.contains(&"status") {
                        if let Some(s) = view.get("status") {
                            crate::value::set(&mut new, &["status"], s.clone());
                        }
                    }
                    new
                }
                Some(s) => self.merge_update(t, &current.object, view, Some(s))?,
            };
            if let Some(s) = self.commit(t, &current, new, dry_run).await? {
                let out = if sub == Some("scale") {
                    scale_of(t.res, &s.object)
                } else {
                    s.object
                };
                return Ok(fieldvalidation::with_warnings(
                    json_response(200, &out),
                    &warnings,
                ));
            }
        }
        Err(ApiError::conflict(
            t.res.group,
            t.res.plural,
            t.name(),
            "too many concurrent updates; try again",
        ))
    }

    /// Server-side apply: creates the object if it is absent, else merges the configuration
    /// in, with field ownership (see [`crate::apply`]).
    async fn server_side_apply(
        &self,
        t: &Target,
        q: &Query,
        body: &Bytes,
        sub: Option<&str>,
    ) -> Result<Resp, ApiError> {
        let dry_run = q.dry_run()?;
        let manager = q
            .get("fieldManager")
            .filter(|m| !m.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(
                    "meta.k8s.io",
                    "PatchOptions",
                    "",
                    vec![crate::error::Cause {
                        reason: "FieldValueRequired",
                        field: "fieldManager".into(),
                        message: "Required value: is required for apply patch".into(),
                    }],
                )
            })?;
        if sub.is_some() {
            return Err(ApiError::method_not_allowed("server-side apply of a subresource is not supported by this server; apply the object itself"));
        }
        let force = q.flag("force");
        let config: Value = serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
        if !config.is_object() {
            return Err(ApiError::bad_request(
                "the applied configuration is not an object",
            ));
        }
        if let Some(n) = config.pointer("/metadata/name").and_then(Value::as_str) {
            if n != t.name() {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({})",
                    t.name()
                )));
            }
        }
        let def =
            crate::openapi::schemas::schemas().kind_def(t.res.group, t.res.version, t.res.kind);
        let api_version = t.res.api_version();
        for _ in 0..UPDATE_RETRIES {
            let current = self.store.get(&t.key(), Freshness::Latest).await?;
            let Some(current) = current else {
                let mut object =
                    crate::apply::apply(def, None, &config, manager, force, &api_version, &now())?;
                crate::value::set(&mut object, &["metadata", "name"], json!(t.name()));
                return self.create(t, q, object).await;
            };
            let applied = crate::apply::apply(
                def,
                Some(&current.object),
                &config,
                manager,
                force,
                &api_version,
                &now(),
            )?;
            let new = self.merge_update(t, &current.object, applied, None)?;
            if let Some(s) = self.commit(t, &current, new, dry_run).await? {
                return Ok(json_response(200, &s.object));
            }
        }
        Err(ApiError::conflict(
            t.res.group,
            t.res.plural,
            t.name(),
            "too many concurrent updates; try again",
        ))
    }

    /// Deletes one object, or marks it for deletion when finalizers hold it. Returns what the
    /// response carries: the object's last state.
    async fn delete(&self, t: &Target, q: &Query, body: Option<&Value>) -> Result<Value, ApiError> {
        let dry_run = q.dry_run()?;
        let opts = DeleteOptions::from(q, body)?;
        if t.res.kind == "Namespace" && admission::protected_namespace(t.name()) {
            return Err(ApiError::forbidden(format!(
                "namespaces \"{}\" is forbidden: this namespace may not be deleted",
                t.name()
            )));
        }
        for _ in 0..UPDATE_RETRIES {
            let current = self.get(t, &Query::default()).await?;
            if let Some(uid) = &opts.uid {
                let have = meta_str(&current.object, "uid").unwrap_or("");
                if uid != have {
                    return Err(ApiError::conflict(t.res.group, t.res.plural, t.name(), &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                    )));
                }
            }
            if let Some(rv) = &opts.resource_version {
                if *rv != current.revision.to_string() {
                    return Err(ApiError::conflict(t.res.group, t.res.plural, t.name(), &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        current.revision
                    )));
                }
            }
            let mut finalizers: Vec<Value> = current
                .object
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            // Orphan and Foreground propagation are finalizers the garbage collector finishes:
            // it releases or deletes the dependents, then removes them.
            let propagation_finalizer = match opts.propagation.as_deref() {
                Some("Orphan") => Some("orphan"),
                Some("Foreground") => Some("foregroundDeletion"),
                _ => None,
            };
            if let Some(f) = propagation_finalizer {
                if t.res.kind != "Namespace" && !finalizers.iter().any(|x| x == f) {
                    finalizers.push(json!(f));
                }
            }
            let is_namespace = t.res.kind == "Namespace";
            // A pod on a node ends gracefully: marked with a deadline, its agent stops the
            // containers and then deletes it for good (with a zero grace period).
            let grace = if t.res.group.is_empty() && t.res.kind == "Pod" {
                pod_grace_period(&current.object, opts.grace)
            } else {
                0
            };
            if grace > 0 {
                let mut new = current.object.clone();
                let deadline = chrono::Utc::now() + chrono::Duration::seconds(grace);
                let stamp = deadline.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                let marked = current
                    .object
                    .pointer("/metadata/deletionTimestamp")
                    .and_then(Value::as_str)
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
                match marked {
                    // Already terminating with an earlier or the same deadline.
                    Some(at) if at.with_timezone(&chrono::Utc) <= deadline => {
                        return Ok(current.object)
                    }
                    _ => {}
                }
                let m = meta_mut(&mut new)?;
                if !finalizers.is_empty() {
                    m.insert("finalizers".into(), json!(finalizers));
                }
                m.insert("deletionTimestamp".into(), json!(stamp));
                m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                if dry_run {
                    return Ok(new);
                }
                match self.store.put_if(&t.key(), &new, current.revision).await? {
                    Write::Done(s) => return Ok(s.object),
                    Write::Lost(_) => continue,
                }
            }
            if !finalizers.is_empty() || is_namespace {
                // Marked, not removed: whoever owns the finalizers finishes the deletion.
                if current
                    .object
                    .pointer("/metadata/deletionTimestamp")
                    .is_some()
                    && (t.res.kind != "Pod"
                        || current
                            .object
                            .pointer("/metadata/deletionGracePeriodSeconds")
                            == Some(&json!(0)))
                {
                    return Ok(current.object);
                }
                let mut new = current.object.clone();
                let m = meta_mut(&mut new)?;
                if !finalizers.is_empty() {
                    m.insert("finalizers".into(), json!(finalizers));
                }
                m.insert("deletionTimestamp".into(), json!(now()));
                // Only pods end gracefully; for them this is the zero grace period's mark.
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
                if is_namespace {
                    crate::value::set(&mut new, &["status", "phase"], json!("Terminating"));
                }
                if dry_run {
                    return Ok(new);
                }
                match self.store.put_if(&t.key(), &new, current.revision).await? {
                    Write::Done(s) => return Ok(s.object),
                    Write::Lost(_) => continue,
                }
            }
            if dry_run {
                return Ok(current.object);
            }
            let changes = self
                .changes_for(t, &t.key(), current.revision, Some(&current.object), None)
                .await?;
            if self.store.apply(&changes).await?.is_some() {
                return Ok(current.object);
            }
        }
        Err(ApiError::conflict(
            t.res.group,
            t.res.plural,
            t.name(),
            "too many concurrent updates; try again",
        ))
    }

    async fn delete_collection(&self, t: &Target, q: &Query) -> Result<Resp, ApiError> {
        let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or(""))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or(""), t.res.kind)?;
        let (items, rev, _) = self
            .select(t, &labels, &fields, 0, None, Freshness::Latest)
            .await?;
        let mut deleted = Vec::new();
        for item in items {
            let name = meta_str(&item, "name").unwrap_or("").to_string();
            let ns = meta_str(&item, "namespace").map(str::to_string);
            let one = Target {
                res: t.res,
                ns: ns.or(t.ns.clone()),
                name: Some(name),
                sub: None,
            };
            if t.res.kind == "Namespace" && admission::protected_namespace(one.name()) {
                continue;
            }
            match self.delete(&one, q, None).await {
                Ok(o) => deleted.push(o),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(json_response(
            200,
            &json!({
                "kind": format!("{}List", t.res.kind),
                "apiVersion": t.res.api_version(),
                "metadata": {"resourceVersion": rev.to_string()},
                "items": deleted,
            }),
        ))
    }

    /// pods/binding: assigns a pod to a node, once.
    async fn bind(&self, t: &Target, q: &Query, binding: Value) -> Result<Resp, ApiError> {
        let dry_run = q.dry_run()?;
        let node = binding
            .pointer("/target/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(
                    "",
                    "Binding",
                    t.name(),
                    vec![crate::error::Cause {
                        reason: "FieldValueRequired",
                        field: "target.name".into(),
                        message: "Required value".into(),
                    }],
                )
            })?
            .to_string();
        for _ in 0..UPDATE_RETRIES {
            let current = self.get(t, &Query::default()).await?;
            if let Some(existing) = current
                .object
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            {
                return Err(ApiError::conflict(
                    "",
                    "pods/binding",
                    t.name(),
                    &format!(
                        "pod {} is already assigned to node \"{existing}\"",
                        t.name()
                    ),
                ));
            }
            if current
                .object
                .pointer("/metadata/deletionTimestamp")
                .is_some()
            {
                return Err(ApiError::conflict(
                    "",
                    "pods/binding",
                    t.name(),
                    "pod is being deleted, cannot be assigned to a host",
                ));
            }
            let mut new = current.object.clone();
            crate::value::set(&mut new, &["spec", "nodeName"], json!(node));
            let conds = new["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut conds: Vec<Value> = conds
                .into_iter()
                .filter(|c| c["type"] != "PodScheduled")
                .collect();
            conds.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now()}));
            crate::value::set(&mut new, &["status", "conditions"], json!(conds));
            if self.commit(t, &current, new, dry_run).await?.is_some() {
                return Ok(json_response(201, &success_status()));
            }
        }
        Err(ApiError::conflict(
            "",
            "pods/binding",
            t.name(),
            "too many concurrent updates; try again",
        ))
    }

    async fn watch(&self, t: &Target, q: &Query, accept: &str) -> Result<Resp, ApiError> {
        let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or(""))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or(""), t.res.kind)?;
        let bookmarks = q.flag("allowWatchBookmarks");
        let timeout =
            Duration::from_secs(q.int("timeoutSeconds")?.filter(|s| *s > 0).unwrap_or(1800) as u64);
        let form = table::form(accept);
        let include = q.get("includeObject").unwrap_or("Metadata").to_string();
        let res = t.res;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(256);
        let encode = move |ty: &str, object: Value| -> Bytes {
            let object = match (form, ty) {
                (_, "ERROR" | "BOOKMARK") => object,
                (Form::Table, _) => {
                    table::table(res, std::slice::from_ref(&object), json!({}), &include)
                }
                (Form::Metadata, _) => table::metadata_only(&object),
                (Form::Object, _) => object,
            };
            let mut line =
                serde_json::to_vec(&json!({"type": ty, "object": object})).unwrap_or_default();
            line.push(b'\n');
            Bytes::from(line)
        };
        // Where to start: rv unset or 0 sends the current state as ADDED events first.
        let start = match q.get("resourceVersion") {
            None | Some("") | Some("0") => {
                let fresh = if q.get("resourceVersion") == Some("0") {
                    Freshness::Any
                } else {
                    Freshness::Latest
                };
                let (items, rev, _) = self.select(t, &labels, &fields, 0, None, fresh).await?;
                for item in items {
                    let _ = tx.send(Ok(encode("ADDED", item))).await;
                }
                rev + 1
            }
            Some(v) => {
                let rv: i64 = v.parse().map_err(|_| {
                    ApiError::bad_request(format!(
                        "resourceVersion: Invalid value: {v:?}: must be an integer"
                    ))
                })?;
                rv + 1
            }
        };
        let prefix = t.res.prefix(t.ns.as_deref());
        let spec = WatchSpec {
            range: match &t.name {
                Some(n) => KeyRange::single(t.res.key(t.ns.as_deref(), n).into_bytes()),
                None => KeyRange::prefix(prefix.into_bytes()),
            },
            start_revision: start,
            prev_kv: true,
            progress_every: Some(Duration::from_secs(5)),
            ..Default::default()
        };
        let kind = t.res.kind;
        let api_version = t.res.api_version();
        let compact = self.store.compact_revision();
        if start <= compact {
            let e = ApiError::gone(format!(
                "too old resource version: {} ({})",
                start - 1,
                compact + 1
            ));
            let _ = tx.send(Ok(encode("ERROR", e.status()))).await;
            drop(tx);
            return Ok(stream_response(rx));
        }
        let mut events = store_watch::start(self.node.mvcc.clone(), spec, 1024);
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                let msg = tokio::select! {
                    m = events.recv() => m,
                    _ = tokio::time::sleep_until(deadline) => None,
                    _ = tx.closed() => None,
                };
                let Some(msg) = msg else { break };
                match msg {
                    WatchMessage::Events {
                        revision,
                        events: evs,
                    } => {
                        for ev in evs {
                            let old = ev
                                .prev_kv
                                .as_ref()
                                .and_then(|kv| decode(kv).ok())
                                .map(|s| s.object);
                            let matches =
                                |o: &Value| labels.matches_object(o) && fields.matches_object(o);
                            let old_matches = old.as_ref().is_some_and(matches);
                            let out = match ev.kind {
                                EventKind::Put => {
                                    let Ok(new) = decode(&ev.kv) else { continue };
                                    let new = new.object;
                                    match (old_matches, matches(&new)) {
                                        (true, true) => Some(("MODIFIED", new)),
                                        (false, true) => Some(("ADDED", new)),
                                        (true, false) => Some(("DELETED", new)),
                                        (false, false) => None,
                                    }
                                }
                                EventKind::Delete => old.filter(|_| old_matches).map(|mut o| {
                                    set_resource_version(&mut o, revision);
                                    ("DELETED", o)
                                }),
                            };
                            if let Some((ty, o)) = out {
                                if tx.send(Ok(encode(ty, o))).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    WatchMessage::Progress { revision } => {
                        if bookmarks {
                            let b = json!({"kind": kind, "apiVersion": api_version,
                                           "metadata": {"resourceVersion": revision.to_string()}});
                            if tx.send(Ok(encode("BOOKMARK", b))).await.is_err() {
                                return;
                            }
                        }
                    }
                    WatchMessage::Compacted { compact_revision } => {
                        let e = ApiError::gone(format!(
                            "too old resource version: {} ({compact_revision})",
                            start - 1
                        ));
                        let _ = tx.send(Ok(encode("ERROR", e.status()))).await;
                        return;
                    }
                }
            }
        });
        Ok(stream_response(rx))
    }
}

fn stream_response(rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Resp {
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty()))
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

async fn read_body(req: Request<Body>) -> Result<Bytes, ApiError> {
    let limited = http_body_util::Limited::new(req.into_body(), MAX_BODY);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("Request entity too large: limit is {MAX_BODY}"),
            ))
        }
        Err(e) => Err(ApiError::bad_request(format!(
            "reading the request body failed: {e}"
        ))),
    }
}

fn decode_body(body: &Bytes, content_type: &str) -> Result<Value, ApiError> {
    let ct = content_type.split(';').next().unwrap_or("").trim();
    let v: Value = match ct {
        "" | "application/json" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as JSON: {e}"
            ))
        })?,
        "application/vnd.kubernetes.protobuf" => crate::protobuf::decode(body)?,
        "application/yaml" => serde_yaml::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as YAML: {e}"
            ))
        })?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the request body is not a JSON object",
        ));
    }
    Ok(v)
}

/// A copy of `new` with metadata.generation bumped if its spec differs from `current`'s.
fn bump_generation(res: &Resource, current: &Value, mut new: Value) -> Value {
    if res.has_spec && current.get("spec") != new.get("spec") {
        let g = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            + 1;
        crate::value::set(&mut new, &["metadata", "generation"], json!(g));
    }
    new
}

/// Fields that may not change after creation.
fn check_immutable(res: &Resource, current: &Value, new: &Value) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    let name = meta_str(new, "name").unwrap_or("");
    let immutable: &[&str] = match (res.group, res.kind) {
        ("", "Service") => &["/spec/clusterIP"],
        ("apps", "Deployment" | "ReplicaSet") => &["/spec/selector"],
        ("", "Pod") => &[],
        _ => &[],
    };
    for ptr in immutable {
        let old = current.pointer(ptr);
        if old.is_some() && old != new.pointer(ptr) {
            causes.push(crate::error::Cause {
                reason: "FieldValueInvalid",
                field: ptr.trim_start_matches('/').replace('/', "."),
                message: format!(
                    "Invalid value: {}: field is immutable",
                    new.pointer(ptr).cloned().unwrap_or(Value::Null)
                ),
            });
        }
    }
    if res.kind == "Pod" {
        // A pod's spec is fixed once created, except container images and a few others.
        let strip = |v: Option<&Value>| {
            let mut v = v.cloned().unwrap_or(json!({}));
            for list in ["containers", "initContainers"] {
                if let Some(cs) = v.get_mut(list).and_then(Value::as_array_mut) {
                    for c in cs {
                        if let Some(c) = c.as_object_mut() {
                            c.remove("image");
                        }
                    }
                }
            }
            if let Some(o) = v.as_object_mut() {
                for f in [
                    "activeDeadlineSeconds",
                    "tolerations",
                    "terminationGracePeriodSeconds",
                    "nodeName",
                ] {
                    o.remove(f);
                }
            }
            v
        };
        if strip(current.get("spec")) != strip(new.get("spec")) {
            causes.push(crate::error::Cause {
                reason: "FieldValueForbidden",
                field: "spec".into(),
                message: "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".into(),
            });
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(res.group, res.kind, name, causes))
    }
}

/// The autoscaling/v1 Scale of a workload.
fn scale_of(res: &Resource, o: &Value) -> Value {
    let selector = match o.pointer("/spec/selector") {
        Some(sel) if sel.get("matchLabels").is_some() || sel.get("matchExpressions").is_some() => {
            let mut parts: Vec<String> = sel
                .get("matchLabels")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect();
            parts.sort();
            parts.join(",")
        }
        Some(sel) => sel
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
            .collect::<Vec<_>>()
            .join(","),
        None => String::new(),
    };
    let m = meta(o).cloned().unwrap_or_default();
    let _ = res;
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": m.get("name"), "namespace": m.get("namespace"), "uid": m.get("uid"),
            "resourceVersion": m.get("resourceVersion"), "creationTimestamp": m.get("creationTimestamp"),
        },
        "spec": {"replicas": o.pointer("/spec/replicas").cloned().unwrap_or(json!(0))},
        "status": {
            "replicas": o.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector,
        },
    })
}

/// Bad input never panics the server: random and mutated bodies, patches, selectors, paths,
/// query strings and continue tokens go through the same functions requests do, and each
/// either works or is an error with a status code.
#[cfg(test)]
mod robustness {
    use super::*;
    use rand::{Rng, SeedableRng};

    const SEEDS: &[&str] = &[
        r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","labels":{"app":"web"}},"spec":{"replicas":2,"selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"c","image":"nginx","ports":[{"containerPort":80}],"resources":{"limits":{"cpu":"1"}}}]}}}}"#,
        r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"type":"NodePort","ports":[{"port":80,"nodePort":30001}],"selector":{"a":"b"}}}"#,
        r#"[{"op":"add","path":"/metadata/labels/x","value":"1"},{"op":"move","from":"/spec","path":"/spec2"},{"op":"test","path":"/a/0","value":null}]"#,
        r#"{"metadata":{"labels":{"a":null}},"spec":{"template":{"spec":{"containers":[{"name":"c","$patch":"delete"}]}}}}"#,
    ];

    fn mutate(rng: &mut rand::rngs::StdRng, seed: &str) -> Vec<u8> {
        let mut b = seed.as_bytes().to_vec();
        for _ in 0..rng.gen_range(1..8) {
            let pos = rng.gen_range(0..=b.len());
            match rng.gen_range(0..4) {
                0 if !b.is_empty() => {
                    let i = rng.gen_range(0..b.len());
                    b[i] = rng.gen();
                }
                1 => {
                    let s: &[u8] = [
                        &b"{"[..],
                        b"}",
                        b"[",
                        b"]",
                        b"\"",
                        b":",
                        b",",
                        b"null",
                        b"-1",
                        b"1e999",
                        b"\"\\u0000\"",
                    ][rng.gen_range(0..11)];
                    b.splice(pos..pos, s.iter().copied());
                }
                2 if pos < b.len() => {
                    let end = rng.gen_range(pos..b.len());
                    b.drain(pos..end);
                }
                _ => {
                    let i = rng.gen_range(0..=b.len());
                    b.truncate(i);
                }
            }
        }
        b
    }

    fn random_value(rng: &mut rand::rngs::StdRng, depth: usize) -> Value {
        match if depth > 3 {
            rng.gen_range(0..4)
        } else {
            rng.gen_range(0..6)
        } {
            0 => Value::Null,
            1 => json!(rng.gen::<i32>()),
            2 => {
                json!(["name", "image", "spec", "status", "", "0", "-", "~1"][rng.gen_range(0..8)])
            }
            3 => json!(rng.gen::<bool>()),
            4 => Value::Array(
                (0..rng.gen_range(0..4))
                    .map(|_| random_value(rng, depth + 1))
                    .collect(),
            ),
            _ => {
                let keys = [
                    "metadata",
                    "spec",
                    "status",
                    "containers",
                    "labels",
                    "name",
                    "ports",
                    "nodePort",
                    "clusterIP",
                    "replicas",
                    "selector",
                    "template",
                    "resources",
                    "limits",
                    "$patch",
                    "op",
                    "path",
                    "value",
                    "from",
                ];
                Value::Object(
                    (0..rng.gen_range(0..5))
                        .map(|_| {
                            (
                                keys[rng.gen_range(0..keys.len())].to_string(),
                                random_value(rng, depth + 1),
                            )
                        })
                        .collect(),
                )
            }
        }
    }

    #[test]
    fn random_input_is_an_error_never_a_panic() {
        // RKUBE_FUZZ_SEED and RKUBE_FUZZ_ROUNDS run it longer or differently (see README).
        let seed = std::env::var("RKUBE_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(7);
        let rounds = std::env::var("RKUBE_FUZZ_ROUNDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3000);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let net = ServiceNet::default();
        let authz = crate::rbac::Authorizer::new();
        let tokens = crate::token::tests::test_key();
        let folders = [
            "/registry/clusterroles/",
            "/registry/roles/",
            "/registry/clusterrolebindings/",
            "/registry/rolebindings/",
        ];
        for round in 0..rounds {
            let seed = SEEDS[round % SEEDS.len()];
            let bytes = Bytes::from(mutate(&mut rng, seed));
            let _ = decode_body(&bytes, "application/json");
            let _ = decode_body(&bytes, "application/yaml");
            let _ = decode_body(&bytes, "text/plain");
            let target = random_value(&mut rng, 0);
            let patch = serde_json::from_slice::<Value>(&bytes)
                .unwrap_or_else(|_| random_value(&mut rng, 0));
            let mut doc = target.clone();
            let _ = patch::json_patch(&mut doc, &patch);
            patch::merge_patch(&mut doc, &patch);
            let _ = decode_body(&bytes, "application/vnd.kubernetes.protobuf");
            let mut proto = b"k8s\0".to_vec();
            proto.extend_from_slice(&bytes);
            let _ = crate::protobuf::decode(&proto);
            for def in [
                Some("io.k8s.api.apps.v1.Deployment"),
                Some("io.k8s.api.core.v1.Service"),
                None,
            ] {
                let mut doc = target.clone();
                let _ = crate::strategic::apply(def, &mut doc, &patch);
                let live = crate::apply::apply(def, None, &target, "a", false, "v1", "t");
                if let Ok(live) = live {
                    let _ = crate::apply::apply(
                        def,
                        Some(&live),
                        &patch,
                        "b",
                        round % 2 == 0,
                        "v1",
                        "t",
                    );
                }
            }
            for res in resources::RESOURCES {
                let mut o = random_value(&mut rng, 0);
                admission::defaults(res, &mut o);
                let _ = admission::validate(res, &o);
                let _ = crate::quota::usage(res, &o);
                let _ = bump_generation(res, &target, o.clone());
                let _ = check_immutable(res, &target, &o);
                let _ = scale_of(res, &o);
                let _ = crate::table::table(res, std::slice::from_ref(&o), json!({}), "Object");
            }
            let mut svc = random_value(&mut rng, 0);
            let _ = services::allocate(&net, &mut svc);
            let text = String::from_utf8_lossy(&bytes).to_string();
            let _ = LabelSelector::parse(&text);
            let _ = FieldSelector::parse(&text, "Pod");
            let _ = decode_continue(&text);
            let q = Query::parse(Some(&text));
            let _ = freshness(&q);
            let _ = q.dry_run();
            let segs: Vec<&str> = text.split('/').collect();
            let _ = parse_target("", "v1", &segs);
            let _ = rkube_core::quantity::parse_quantity(&text);
            // Authentication and authorization: random tokens, RBAC objects and requests.
            let _ = tokens.verify(&text);
            let folder = folders[round % folders.len()];
            authz.load_at(folder, &text, &random_value(&mut rng, 0));
            authz.load_at(folder, "ns/x", &patch);
            let user = crate::auth::User {
                name: text.clone(),
                groups: vec![text.clone()],
                ..Default::default()
            };
            let _ = authz.authorize(
                &user,
                &Attributes::resource("get", &text, &text, "", "ns", ""),
            );
            let _ = authz.authorize(&user, &Attributes::path(&text, &text));
            let _ = authz.rules_for(&user, "ns");
            let _ = authz.aggregations();
            // events.k8s.io conversion of bodies, patches and selectors.
            for ct in [
                "application/json",
                "application/yaml",
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
                "text/plain",
            ] {
                let _ = crate::events::body_to_core(&bytes, ct);
            }
            let _ =
                crate::events::query_to_core(&Query::parse(Some(&format!("fieldSelector={text}"))));
        }
    }
}
