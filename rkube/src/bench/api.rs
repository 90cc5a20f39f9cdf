//! `rkube bench api`: the Kubernetes API under load, measured as Kubernetes' SLOs are: pod
//! create, get, list and watch-delivery latency (p50, p99) and throughput with concurrent
//! clients, each on its own HTTPS connection, and the LIST of many pods.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

#[derive(Debug, Clone, Args)]
pub struct ApiBenchArgs {
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Pods created (then read back, listed and deleted).
    #[arg(long, default_value_t = 2000)]
    pub pods: usize,
    /// Pods in the large LIST (created for it, then deleted).
    #[arg(long, default_value_t = 10_000)]
    pub list_pods: usize,
    /// Watchers for the delivery-latency run.
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// Pods created while the watchers watch.
    #[arg(long, default_value_t = 200)]
    pub watched_pods: usize,
}

struct Conn {
    tls: Arc<rustls::ClientConfig>,
    addr: String,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

impl Conn {
    fn new(dir: &std::path::Path) -> Result<Conn> {
        let local = crate::up::LocalCluster::load(dir)?;
        if local.store_only {
            bail!(
                "{} is a store-only cluster: it serves no Kubernetes API",
                dir.display()
            );
        }
        let member = local
            .members
            .first()
            .context("the cluster has no members")?;
        let pki = dir.join("pki");
        let read = |f: &str| std::fs::read(pki.join(f)).with_context(|| format!("reading pki/{f}"));
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&read("ca.crt")?) {
            roots.add(c?)?;
        }
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(&read("admin.crt")?).collect::<Result<_, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(&read("admin.key")?)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Conn {
            tls: Arc::new(tls),
            addr: member.api_addr(),
        })
    }

    async fn open(&self) -> Result<Sender> {
        let tcp = tokio::net::TcpStream::connect(&self.addr).await?;
        tcp.set_nodelay(true)?;
        let host = self
            .addr
            .rsplit_once(':')
            .map(|(h, _)| h)
            .unwrap_or("127.0.0.1");
        let name = ServerName::try_from(host.to_string())?;
        let stream = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }
}

async fn call(
    s: &mut Sender,
    method: &str,
    path: &str,
    body: Option<String>,
) -> Result<(u16, Bytes)> {
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "rkube")
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
    s.ready().await?;
    let resp = s.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

fn pod(name: &str, stamp: Option<u128>) -> String {
    let annotations = stamp
        .map(|t| format!(",\"annotations\":{{\"bench/sent-us\":\"{t}\"}}"))
        .unwrap_or_default();
    format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"{name}\",\"labels\":{{\"app\":\"bench\"}}{annotations}}},\"spec\":{{\"containers\":[{{\"name\":\"c\",\"image\":\"busybox\"}}]}}}}"
    )
}

fn micros_now() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

const NS: &str = "rkube-bench";

/// Runs `total` requests over `clients` connections; `req(i)` gives request i.
async fn load<F>(
    conn: &Conn,
    clients: usize,
    total: usize,
    expect: u16,
    req: F,
) -> Result<(Histogram<u64>, Duration)>
where
    F: Fn(usize) -> (&'static str, String, Option<String>) + Send + Sync + 'static,
{
    let req = Arc::new(req);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let mut s = conn.open().await?;
        let (req, next) = (req.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new(3)?;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let (method, path, body) = req(i);
                let t = Instant::now();
                let (status, resp) = call(&mut s, method, &path, body).await?;
                if status != expect {
                    bail!(
                        "{method} {path}: {status} {}",
                        String::from_utf8_lossy(&resp)
                    );
                }
                h.record(t.elapsed().as_micros() as u64)?;
            }
            anyhow::Ok(h)
        }));
    }
    let mut all = Histogram::<u64>::new(3)?;
    for t in tasks {
        all.add(t.await??)?;
    }
    Ok((all, started.elapsed()))
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn row(what: &str, h: &Histogram<u64>, elapsed: Duration, slo_ms: f64) {
    let p99 = ms(h.value_at_quantile(0.99));
    println!(
        "| {what} | {:.0} | {:.2} | {:.2} | {slo_ms:.0} | {:.0}x |",
        h.len() as f64 / elapsed.as_secs_f64(),
        ms(h.value_at_quantile(0.50)),
        p99,
        slo_ms / p99.max(0.001),
    );
}

/// Runs every API workload against the local cluster in `dir` (its first server).
pub async fn run(dir: &std::path::Path, args: ApiBenchArgs) -> Result<()> {
    let conn = Arc::new(Conn::new(dir)?);
    let mut admin = conn.open().await?;
    let (status, body) = call(
        &mut admin,
        "POST",
        "/api/v1/namespaces",
        Some(format!("{{\"metadata\":{{\"name\":\"{NS}\"}}}}")),
    )
    .await?;
    if status != 201 && status != 409 {
        bail!(
            "creating namespace {NS}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }
    println!(
        "| operation ({} clients) | requests/s | p50 ms | p99 ms | SLO p99 ms | inside SLO by |",
        args.clients
    );
    println!("|---|---|---|---|---|---|");
    let base = format!("/api/v1/namespaces/{NS}/pods");
    let b = base.clone();
    let (h, e) = load(&conn, args.clients, args.pods, 201, move |i| {
        ("POST", b.clone(), Some(pod(&format!("p{i}"), None)))
    })
    .await?;
    row("pod create", &h, e, 1000.0);
    let b = base.clone();
    let (h, e) = load(&conn, args.clients, args.pods, 200, move |i| {
        ("GET", format!("{b}/p{i}"), None)
    })
    .await?;
    row("pod get", &h, e, 1000.0);
    let b = base.clone();
    let (h, e) = load(&conn, args.clients, 200.min(args.pods), 200, move |_| {
        ("GET", format!("{b}?labelSelector=app%3Dbench"), None)
    })
    .await?;
    row(
        &format!("list {} pods (namespace)", args.pods),
        &h,
        e,
        5000.0,
    );
    let b = base.clone();
    let (h, e) = load(&conn, args.clients, args.pods, 200, move |i| {
        ("DELETE", format!("{b}/p{i}"), None)
    })
    .await?;
    row("pod delete", &h, e, 1000.0);

    // The large LIST: fill, list whole and in kubectl's chunks of 500, empty again.
    if args.list_pods > 0 {
        let b = base.clone();
        let (_, fill) = load(&conn, args.clients, args.list_pods, 201, move |i| {
            ("POST", b.clone(), Some(pod(&format!("l{i}"), None)))
        })
        .await?;
        let b = base.clone();
        let (h, e) = load(&conn, 1, 10, 200, move |_| ("GET", b.clone(), None)).await?;
        row(
            &format!(
                "list {} pods, one response (filled at {:.0}/s)",
                args.list_pods,
                args.list_pods as f64 / fill.as_secs_f64()
            ),
            &h,
            e,
            30_000.0,
        );
        let mut s = conn.open().await?;
        let mut h = Histogram::<u64>::new(3)?;
        let started = Instant::now();
        for _ in 0..5 {
            let t = Instant::now();
            let mut cont = String::new();
            let mut n = 0;
            loop {
                let path = if cont.is_empty() {
                    format!("{base}?limit=500")
                } else {
                    format!("{base}?limit=500&continue={cont}")
                };
                let (status, body) = call(&mut s, "GET", &path, None).await?;
                if status != 200 {
                    bail!("chunked list: {status}");
                }
                let v: serde_json::Value = serde_json::from_slice(&body)?;
                n += v["items"].as_array().map_or(0, Vec::len);
                match v["metadata"]["continue"].as_str() {
                    Some(c) if !c.is_empty() => cont = c.to_string(),
                    _ => break,
                }
            }
            if n != args.list_pods {
                bail!("the chunked list returned {n} pods, not {}", args.list_pods);
            }
            h.record(t.elapsed().as_micros() as u64)?;
        }
        row(
            &format!("list {} pods in chunks of 500", args.list_pods),
            &h,
            started.elapsed(),
            30_000.0,
        );
        let b = base.clone();
        load(&conn, args.clients, args.list_pods, 200, move |i| {
            ("DELETE", format!("{b}/l{i}"), None)
        })
        .await?;
    }

    // Watch delivery: watchers on the namespace, pods created at a steady pace; latency from
    // the create's start (stamped in the pod) to each watcher's receipt of ADDED.
    if args.watchers > 0 {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
        let (status, body) = call(&mut admin, "GET", &format!("{base}?limit=1"), None).await?;
        if status != 200 {
            bail!("list before watch: {status}");
        }
        let rv = serde_json::from_slice::<serde_json::Value>(&body)?["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("0")
            .to_string();
        let mut ready = Vec::new();
        for _ in 0..args.watchers {
            let mut s = conn.open().await?;
            let path = format!("{base}?watch=1&resourceVersion={rv}");
            let tx = tx.clone();
            let req = hyper::Request::builder()
                .method("GET")
                .uri(path)
                .header("host", "rkube")
                .body(Full::new(Bytes::new()))?;
            let resp = s.send_request(req).await?;
            ready.push(tokio::spawn(async move {
                let mut body = resp.into_body();
                let mut buf = Vec::new();
                while let Some(frame) = body.frame().await {
                    let Ok(frame) = frame else { break };
                    let Some(data) = frame.data_ref() else {
                        continue;
                    };
                    buf.extend_from_slice(data);
                    while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buf.drain(..=pos).collect();
                        let now = micros_now();
                        if let Ok(ev) = serde_json::from_slice::<serde_json::Value>(&line) {
                            if ev["type"] == "ADDED" {
                                if let Some(sent) = ev["object"]["metadata"]["annotations"]
                                    ["bench/sent-us"]
                                    .as_str()
                                    .and_then(|s| s.parse::<u128>().ok())
                                {
                                    let _ = tx.send(now.saturating_sub(sent) as u64);
                                }
                            }
                        }
                    }
                }
                let _ = s;
            }));
        }
        drop(tx);
        let mut s = conn.open().await?;
        let started = Instant::now();
        for i in 0..args.watched_pods {
            let (status, body) = call(
                &mut s,
                "POST",
                &base,
                Some(pod(&format!("w{i}"), Some(micros_now()))),
            )
            .await?;
            if status != 201 {
                bail!(
                    "create while watched: {status} {}",
                    String::from_utf8_lossy(&body)
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let want = args.watchers * args.watched_pods;
        let mut h = Histogram::<u64>::new(3)?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while (h.len() as usize) < want {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(us)) => h.record(us.max(1))?,
                _ => break,
            }
        }
        if (h.len() as usize) < want {
            bail!(
                "only {} of {want} watch events arrived within 120 s",
                h.len()
            );
        }
        row(
            &format!("watch event delivery to {} watchers", args.watchers),
            &h,
            started.elapsed(),
            5000.0,
        );
        for t in ready {
            t.abort();
        }
        let b = base.clone();
        load(&conn, args.clients, args.watched_pods, 200, move |i| {
            ("DELETE", format!("{b}/w{i}"), None)
        })
        .await?;
    }
    Ok(())
}
