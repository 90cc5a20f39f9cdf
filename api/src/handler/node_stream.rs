//! The pod log, exec, attach and port-forward proxy: these subresources are served by the pod's
//! node agent, reached over HTTPS with this API server's kubelet client certificate.

use axum::body::Body;
use http_body_util::BodyExt;
use hyper::{Request, Response};
use serde_json::Value;

use crate::error::ApiError;
use crate::query::Query;
use crate::resources;
use crate::storage::Freshness;

use super::{Api, Resp, Target};

impl Api {
    /// pods/log, exec, attach and portforward are served by the pod's node agent: its
    /// kubelet port, reached with this API server's own client certificate. A pod with no node
    /// yet, or on a node with the simulated runtime, gets an answer saying why there is none.
    pub(super) async fn node_stream(
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
        // exec, attach, portforward: a stream the client upgrades to, SPDY/3.1 or a WebSocket
        // with one of the channel subprotocols the runtime's streaming server speaks, passed on
        // to the agent and from there to the runtime; for exec and attach also
        // v5.channel.k8s.io (kubectl 1.32's), for port-forward kubectl 1.32's SPDY tunnel
        // (SPDY/3.1+portforward.k8s.io), which the agent translates to SPDY.
        let upgrade = req
            .headers()
            .get(hyper::header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if upgrade.is_empty() {
            return Err(ApiError::bad_request("Upgrade request required"));
        }
        if upgrade.eq_ignore_ascii_case("websocket") {
            // What the agent answers itself and translates to SPDY toward the runtime.
            let translated = rkube_core::upgrade::offers(
                req.headers(),
                &[if sub == "portforward" {
                    rkube_core::upgrade::PORTFORWARD_TUNNEL
                } else {
                    rkube_core::upgrade::EXEC_V5
                }],
            );
            if !translated && !rkube_core::upgrade::offers_served_websocket_protocol(req.headers())
            {
                let offered: Vec<&str> = req
                    .headers()
                    .get_all("sec-websocket-protocol")
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .collect();
                let translated = if sub == "portforward" {
                    rkube_core::upgrade::PORTFORWARD_TUNNEL
                } else {
                    rkube_core::upgrade::EXEC_V5
                };
                return Err(ApiError::bad_request(format!(
                    "unable to upgrade: none of the WebSocket subprotocols requested ({}) is served for pods/{sub}; use one of {translated}, {} or SPDY/3.1",
                    offered.join(", "),
                    rkube_core::upgrade::WEBSOCKET_PROTOCOLS.join(", ")
                )));
            }
        } else if !upgrade.eq_ignore_ascii_case("SPDY/3.1") {
            return Err(ApiError::bad_request(format!(
                "unable to upgrade to {upgrade}: pods/{sub} streams are served over SPDY/3.1 or a WebSocket"
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
}
