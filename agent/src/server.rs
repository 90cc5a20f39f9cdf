//! The agent's HTTPS port (the kubelet's 10250): container logs for `kubectl logs`, reached by
//! the API server only. The agent serves with a self-signed certificate (kube-apiserver does
//! not check a kubelet's serving certificate unless told to) and requires a client certificate
//! of the cluster CA naming the API server (`kube-apiserver-kubelet-client`).
//!
//! `GET /stats/summary` answers the node's resource usage ([`crate::stats`]).
//! `GET /containerLogs/<namespace>/<pod>/<container>?follow=&tailLines=&previous=` reads the
//! CRI log files (`<time> <stream> <P|F> <text>` lines) the runtime writes for the pod.
//! `/exec/<namespace>/<pod>/<container>?command=&stdin=&stdout=&stderr=&tty=`,
//! `/attach/<namespace>/<pod>/<container>` and `/portForward/<namespace>/<pod>` ask the runtime
//! for a stream (CRI Exec, Attach, PortForward) and join the API server's upgraded connection
//! with the runtime's streaming server; exec and attach over WebSocket v5
//! (`exec_websocket.rs`) and port-forward's SPDY tunnel in a WebSocket (`portforward_tunnel.rs`)
//! are answered here and translated to SPDY toward the runtime.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::cri::StreamRequest;

/// The user the API server's client certificate names (kubeadm's apiserver-kubelet-client).
pub const API_SERVER_CLIENT: &str = "kube-apiserver-kubelet-client";

type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

fn text(code: StatusCode, msg: impl Into<String>) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(msg.into()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = code;
    r
}

/// Serves on `addr` until the process ends; `logs` is where the runtime writes pod logs, or
/// None for the simulated runtime (whose containers write nothing).
pub async fn serve(
    addr: SocketAddr,
    ca_pem: String,
    node: String,
    runtime: Option<(crate::cri::Cri, PathBuf)>,
    sim: Arc<crate::stats::SimUsage>,
) -> Result<()> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = rcgen::CertificateParams::new(vec![node.clone(), addr.ip().to_string()])?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{node}@rkube-agent"));
    let cert = params.self_signed(&key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        let c: CertificateDer<'static> = c?;
        roots.add(c)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let key_der = PrivateKeyDer::try_from(key.serialize_der()).map_err(|e| anyhow!("{e}"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert.der().clone()], key_der)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving container logs to the API server");
    let runtime = Arc::new(runtime);
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                continue;
            }
        };
        let (acceptor, runtime) = (acceptor.clone(), runtime.clone());
        let (sim, node) = (sim.clone(), node.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let allowed = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| common_name(c.as_ref()))
                .is_some_and(|cn| cn == API_SERVER_CLIENT);
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let runtime = runtime.clone();
                let (sim, node) = (sim.clone(), node.clone());
                async move {
                    if !allowed {
                        return Ok::<_, Infallible>(text(
                            StatusCode::FORBIDDEN,
                            "only the API server may use this port",
                        ));
                    }
                    if req.uri().path() == "/stats/summary" {
                        return Ok(summary(runtime.as_ref().as_ref(), &sim, &node).await);
                    }
                    Ok(route(req, runtime.as_ref().as_ref()).await)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .with_upgrades()
                .await;
        });
    }
}

/// Serves `registry` as Prometheus text on `GET /metrics` over plain HTTP until the process
/// ends.
pub async fn serve_metrics(addr: SocketAddr, registry: prometheus_client::registry::Registry) {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(%addr, error = %e, "the agent's metrics are not served");
            return;
        }
    };
    let registry = Arc::new(registry);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let registry = registry.clone();
                async move {
                    if req.uri().path() != "/metrics" {
                        return Ok::<_, Infallible>(text(StatusCode::NOT_FOUND, "not found"));
                    }
                    let mut out = String::new();
                    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
                        return Ok(text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()));
                    }
                    let mut r = text(StatusCode::OK, out);
                    r.headers_mut().insert(
                        "content-type",
                        "text/plain; version=0.0.4".parse().expect("a valid header"),
                    );
                    Ok(r)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                .await;
        });
    }
}

/// `GET /stats/summary`: the node's and its containers' resource usage ([`crate::stats`]).
async fn summary(
    runtime: Option<&(crate::cri::Cri, PathBuf)>,
    sim: &crate::stats::SimUsage,
    node: &str,
) -> Response<Body> {
    let body = match runtime {
        Some((cri, _)) => match crate::stats::cri_summary(cri, node).await {
            Ok(v) => v,
            Err(e) => {
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the container runtime's stats could not be read: {e:#}"),
                )
            }
        },
        None => sim.summary(node),
    };
    let body = match serde_json::to_string(&body) {
        Ok(b) => b,
        Err(e) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the node's stats could not be encoded: {e}"),
            )
        }
    };
    let mut r = text(StatusCode::OK, body);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
    Some(cn.to_string())
}

async fn route(
    req: Request<hyper::body::Incoming>,
    runtime: Option<&(crate::cri::Cri, PathBuf)>,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let query: std::collections::HashMap<String, String> =
        form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    match parts.as_slice() {
        ["containerLogs", ns, pod, container] => {
            let Some((_, root)) = runtime else {
                return text(
                    StatusCode::BAD_REQUEST,
                    "this node runs the simulated runtime: its containers write no logs",
                );
            };
            let flag = |k: &str| {
                query
                    .get(k)
                    .is_some_and(|v| rkube_core::upgrade::query_flag(v))
            };
            let tail = query.get("tailLines").and_then(|v| v.parse::<usize>().ok());
            match log_file(root, ns, pod, container, flag("previous")) {
                Ok(file) => stream_log(file, tail, flag("follow")).await,
                Err(e) => text(StatusCode::BAD_REQUEST, e.to_string()),
            }
        }
        [kind @ ("exec" | "attach" | "portForward"), ns, pod, rest @ ..] => {
            let Some((cri, _)) = runtime else {
                return text(
                    StatusCode::BAD_REQUEST,
                    "this node runs the simulated runtime: its containers are not processes",
                );
            };
            let flag = |k: &str| {
                query
                    .get(k)
                    .is_some_and(|v| rkube_core::upgrade::query_flag(v))
            };
            let container = rest.first().map(|c| c.to_string()).unwrap_or_default();
            // exec and attach over WebSocket v5: translated here to SPDY toward the runtime.
            let v5 = (*kind != "portForward"
                && crate::exec_websocket::wants(&req, rkube_core::upgrade::EXEC_V5))
            .then(|| crate::exec_websocket::Streams {
                stdin: flag("stdin"),
                stdout: flag("stdout"),
                stderr: flag("stderr"),
                tty: flag("tty"),
            });
            let request = match *kind {
                "exec" => StreamRequest::Exec {
                    container,
                    cmd: form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                        .filter(|(k, _)| k == "command")
                        .map(|(_, v)| v.into_owned())
                        .collect(),
                    tty: flag("tty"),
                    stdin: flag("stdin"),
                    stdout: flag("stdout"),
                    stderr: flag("stderr"),
                },
                "attach" => StreamRequest::Attach {
                    container,
                    tty: flag("tty"),
                    stdin: flag("stdin"),
                    stdout: flag("stdout"),
                    stderr: flag("stderr"),
                },
                _ => StreamRequest::PortForward {
                    ports: query
                        .get("ports")
                        .map(|p| p.split(',').filter_map(|x| x.trim().parse().ok()).collect())
                        .unwrap_or_default(),
                },
            };
            // kubectl's port-forward over a WebSocket: a SPDY session tunnelled in it, unwrapped
            // here toward the runtime.
            let tunnel = *kind == "portForward"
                && crate::exec_websocket::wants(&req, crate::portforward_tunnel::PROTOCOL);
            let (ns, pod) = (ns.to_string(), pod.to_string());
            let forwarded_ports = match &request {
                // Over a WebSocket the ports are named only in the URL, as `port` (over SPDY each
                // stream's headers name its port), so the runtime's URL gets them too.
                StreamRequest::PortForward { ports } if !ports.is_empty() => Some(
                    ports
                        .iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                _ => None,
            };
            match (cri.stream_url(&ns, &pod, request).await, v5) {
                (Ok(url), Some(streams)) => {
                    match crate::exec_websocket::serve(&url, streams, req).await {
                        Ok(resp) => resp,
                        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e),
                    }
                }
                (Ok(url), None) if tunnel => {
                    match crate::portforward_tunnel::serve(&url, req).await {
                        Ok(resp) => resp,
                        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e),
                    }
                }
                (Ok(url), None) => {
                    let url = match forwarded_ports {
                        Some(ports) if !url.contains('?') => format!("{url}?port={ports}"),
                        _ => url,
                    };
                    stream(url, req).await
                }
                (Err(e), _) => text(StatusCode::NOT_FOUND, format!("{e:#}")),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found"),
    }
}

/// Passes the API server's upgrade request on to the runtime's streaming server at `url` and
/// joins the two connections once both are upgraded.
async fn stream(url: String, mut req: Request<hyper::body::Incoming>) -> Response<Body> {
    let failed = |e: &dyn std::fmt::Display| {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the runtime's streaming server at {url}: {e}"),
        )
    };
    let uri: hyper::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return failed(&e),
    };
    let (Some(authority), Some(path)) = (uri.authority(), uri.path_and_query()) else {
        return failed(&"not an http URL");
    };
    let tcp = match tokio::net::TcpStream::connect(authority.as_str()).await {
        Ok(t) => t,
        Err(e) => return failed(&e),
    };
    let client = hyper::upgrade::on(&mut req);
    let upgrade = rkube_core::upgrade::UpgradeRequest {
        method: req.method(),
        path_and_query: path.as_str(),
        headers: req.headers(),
        client,
    };
    match rkube_core::upgrade::upgrade_through(tcp, authority.as_str(), upgrade).await {
        Ok(resp) => resp.map(|b| b.map_err(std::io::Error::other).boxed()),
        Err(e) => failed(&e),
    }
}

/// The log file of a container's newest run (or the one before it).
fn log_file(root: &Path, ns: &str, pod: &str, container: &str, previous: bool) -> Result<PathBuf> {
    let prefix = format!("{ns}_{pod}_");
    let pod_dir = std::fs::read_dir(root)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .ok_or_else(|| anyhow!("pod \"{pod}\" has no logs on this node"))?
        .path();
    let mut runs: Vec<(u32, PathBuf)> = std::fs::read_dir(pod_dir.join(container))
        .map_err(|_| anyhow!("container \"{container}\" in pod \"{pod}\" has not started yet"))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let n = name.strip_suffix(".log")?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    runs.sort();
    let pick = if previous {
        runs.len().checked_sub(2)
    } else {
        runs.len().checked_sub(1)
    };
    pick.and_then(|i| runs.get(i).map(|(_, p)| p.clone()))
        .ok_or_else(|| {
            if previous {
                anyhow!("previous terminated container \"{container}\" in pod \"{pod}\" not found")
            } else {
                anyhow!("container \"{container}\" in pod \"{pod}\" has no logs yet")
            }
        })
}

/// The text of CRI log lines: `<time> <stream> <P|F> <text>`; P lines continue on the next.
pub fn cri_text(raw: &str) -> String {
    let mut out = String::new();
    for line in raw.lines() {
        let mut it = line.splitn(4, ' ');
        let (_time, _stream, tag, rest) = (it.next(), it.next(), it.next(), it.next());
        match (tag, rest) {
            (Some("P"), Some(t)) => out.push_str(t),
            (Some(_), Some(t)) => {
                out.push_str(t);
                out.push('\n');
            }
            (Some(_), None) => out.push('\n'),
            _ => {}
        }
    }
    out
}

async fn stream_log(file: PathBuf, tail: Option<usize>, follow: bool) -> Response<Body> {
    let mut f = match tokio::fs::File::open(&file).await {
        Ok(f) => f,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let mut raw = String::new();
    if let Err(e) = f.read_to_string(&mut raw).await {
        return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    }
    // Only whole lines now; a partial last line comes with the next read.
    let whole = raw.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let mut offset = whole as u64;
    let mut first = cri_text(&raw[..whole]);
    if let Some(n) = tail {
        let lines: Vec<&str> = first.split_inclusive('\n').collect();
        first = lines[lines.len().saturating_sub(n)..].concat();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(16);
    let _ = tx.send(Ok(Frame::data(Bytes::from(first)))).await;
    if follow {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if tx.is_closed() {
                    return;
                }
                let mut more = String::new();
                if f.seek(std::io::SeekFrom::Start(offset)).await.is_err()
                    || f.read_to_string(&mut more).await.is_err()
                {
                    return;
                }
                let whole = more.rfind('\n').map(|i| i + 1).unwrap_or(0);
                if whole == 0 {
                    continue;
                }
                offset += whole as u64;
                if tx
                    .send(Ok(Frame::data(Bytes::from(cri_text(&more[..whole])))))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    } else {
        drop(tx);
    }
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        "content-type",
        "text/plain".parse().expect("a valid header"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_log_lines_become_the_container_s_text() {
        let raw = "2026-12-04T06:30:00.1Z stdout F hello\n2026-12-04T06:30:00.2Z stderr P par\n2026-12-04T06:30:00.3Z stderr F tial\n2026-12-04T06:30:00.4Z stdout F\n";
        assert_eq!(cri_text(raw), "hello\npartial\n\n");
    }
}
