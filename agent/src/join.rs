//! Joining a cluster as kubeadm and the kubelet do it, trusted both ways:
//!
//! 1. discovery: read `kube-public/cluster-info` without trusting the server yet, check that the
//!    server knows the bootstrap token (the ConfigMap's kubeconfig carries a detached JWS keyed
//!    by it), then check the CA it names against the pinned SHA-256 of its public key;
//! 2. TLS bootstrap: with the now-trusted CA and the bootstrap token, send a
//!    CertificateSigningRequest for `CN=system:node:<name>, O=system:nodes`, wait for the
//!    control plane to approve and sign it, and keep the certificate and key on disk;
//! 3. rotation: before the certificate expires (at 80% of its life) ask for a new one with the
//!    current one, and switch to it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

const CA_FILE: &str = "ca.crt";
const IDENTITY_FILE: &str = "kubelet-client-current.pem";
const CSR_WAIT: Duration = Duration::from_secs(120);

/// A node's client certificate and key (PEM), and its validity (seconds since the epoch).
#[derive(Clone)]
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_before: i64,
    pub not_after: i64,
}

impl Identity {
    fn from_pem(cert_pem: String, key_pem: String) -> Result<Identity> {
        let (not_before, not_after) = rkube_pki::validity(cert_pem.as_bytes())?;
        Ok(Identity {
            cert_pem,
            key_pem,
            not_before,
            not_after,
        })
    }

    /// When to ask for the next certificate: 80% into this one's life.
    pub fn renew_at(&self) -> i64 {
        self.not_before + (self.not_after - self.not_before) * 8 / 10
    }
}

/// How a client authenticates.
enum Auth<'a> {
    Anonymous,
    Token(&'a str),
    Certificate(&'a Identity),
}

/// A client for `server`, trusting `ca_pem` (or nothing: None skips verification, only for
/// discovery, whose answer is checked by other means).
async fn client(server: &str, ca_pem: Option<&str>, auth: Auth<'_>) -> Result<kube::Client> {
    let mut cluster = serde_json::Map::new();
    cluster.insert("server".into(), json!(server));
    match ca_pem {
        Some(ca) => {
            cluster.insert(
                "certificate-authority-data".into(),
                json!(STANDARD.encode(ca)),
            );
        }
        None => {
            cluster.insert("insecure-skip-tls-verify".into(), json!(true));
        }
    }
    let user = match auth {
        Auth::Anonymous => json!({}),
        Auth::Token(t) => json!({"token": t}),
        Auth::Certificate(id) => json!({
            "client-certificate-data": STANDARD.encode(&id.cert_pem),
            "client-key-data": STANDARD.encode(&id.key_pem)}),
    };
    let doc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x"});
    let text = serde_yaml::to_string(&doc)?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    with_keepalive(config)
}

/// TCP keepalive on the agent's connections: idle this long, a connection is probed.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
/// Between unanswered probes; after `KEEPALIVE_PROBES` of them the connection is dead.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_PROBES: u32 = 3;

/// A client whose connections are probed when idle. A watch only reads: when its server's host
/// goes away without closing it (a partition, a control-plane endpoint that moved on), only a
/// probe finds out, and the agent lists and watches again instead of waiting for events that
/// never come (client-go's dialer probes too).
fn with_keepalive(config: kube::Config) -> Result<kube::Client> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use kube::client::ConfigExt;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    http.set_keepalive(Some(KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(KEEPALIVE_PROBES));
    let https = config.rustls_https_connector_with_connector(http)?;
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, kube::client::Body>(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { Box::new(e) })
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// A discovery failure that may pass (the server not ready yet, the token not signed yet).
#[derive(Debug)]
pub struct Retry(pub anyhow::Error);

impl std::fmt::Display for Retry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for Retry {}

/// A client error in a sentence: the API's own message, or the transport's.
pub fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}

/// Discovery: the cluster CA, once the server proved it knows `token` and the CA matches the
/// `pin` (`sha256:<hex>` of its SubjectPublicKeyInfo). Errors that may pass are [`Retry`].
pub async fn discover(server: &str, token: &str, pin: &str) -> Result<String> {
    let (id, secret) = rkube_core::bootstrap_token::parse(token).ok_or_else(|| {
        anyhow!("the token {token:?} is not a bootstrap token: it must look like [a-z0-9]{{6}}.[a-z0-9]{{16}}")
    })?;
    let pin = pin.trim().to_ascii_lowercase();
    if !pin.starts_with("sha256:") || pin.len() != 7 + 64 {
        bail!("--discovery-token-ca-cert-hash must be sha256:<64 hex digits>, as `rkube server --init` prints it");
    }
    let anonymous = client(server, None, Auth::Anonymous).await?;
    let cm: ConfigMap = Api::namespaced(anonymous, "kube-public")
        .get("cluster-info")
        .await
        .map_err(|e| {
            anyhow!(
                "reading kube-public/cluster-info from {server}: {}",
                describe(&e)
            )
        })
        .map_err(Retry)?;
    let data = cm.data.unwrap_or_default();
    let kubeconfig = data
        .get("kubeconfig")
        .ok_or_else(|| anyhow!("the cluster-info ConfigMap at {server} holds no kubeconfig"))?;
    let jws = data.get(&format!("jws-kubeconfig-{id}")).ok_or_else(|| {
        Retry(anyhow!(
            "there is no JWS signed token in the cluster-info ConfigMap at {server}: the token id {id:?} is invalid for this cluster, or it has expired"
        ))
    })?;
    if !rkube_core::bootstrap_token::verify_detached_jws(jws, kubeconfig, id, secret) {
        bail!("the cluster-info ConfigMap at {server} is not signed by this token: failed to verify JWS signature of received cluster info object, can't trust this API server");
    }
    let doc: Value = serde_yaml::from_str(kubeconfig).context("the cluster-info kubeconfig")?;
    let ca_b64 = doc
        .pointer("/clusters/0/cluster/certificate-authority-data")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("the cluster-info kubeconfig names no certificate authority"))?;
    let ca_pem = String::from_utf8(STANDARD.decode(ca_b64)?)?;
    let actual = rkube_pki::ca_spki_sha256(ca_pem.as_bytes())?;
    if actual != pin {
        bail!("cluster CA found in cluster-info ConfigMap is invalid: none of the public keys \"{actual}\" are pinned (--discovery-token-ca-cert-hash {pin})");
    }
    Ok(ca_pem)
}

/// A client that trusts `ca_pem` and authenticates with a bootstrap token.
pub async fn token_client(server: &str, ca_pem: &str, token: &str) -> Result<kube::Client> {
    client(server, Some(ca_pem), Auth::Token(token)).await
}

/// Discovery against each server in turn until one answers, retrying what may pass (a server
/// not ready yet, a token not signed yet) for up to `timeout`: the server and the CA.
pub async fn discover_any(
    servers: &[String],
    token: &str,
    pin: &str,
    timeout: Duration,
) -> Result<(String, String)> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = None;
    for server in servers.iter().cycle() {
        if last.is_some() && tokio::time::Instant::now() > deadline {
            break;
        }
        match discover(server, token, pin).await {
            Ok(ca) => return Ok((server.clone(), ca)),
            Err(e) if e.downcast_ref::<Retry>().is_some() => {
                tracing::warn!(server, error = %format!("{e:#}"), "discovery failed; retrying");
                last = Some(e);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
    let last = last.unwrap_or_else(|| anyhow!("no server answered"));
    Err(anyhow!(
        "joining failed after {timeout:?} of trying: {last:#}"
    ))
}

/// Sends a CSR for `node`'s client certificate as the holder of `auth` and waits for the
/// certificate.
async fn request_certificate(client: kube::Client, node: &str) -> Result<Identity> {
    let (csr_pem, key_pem) = rkube_pki::new_csr(&format!("system:node:{node}"), &["system:nodes"])?;
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("node-csr-".into()),
            ..ObjectMeta::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(csr_pem.into_bytes()),
            signer_name: rkube_pki::KUBELET_CLIENT_SIGNER.into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..CertificateSigningRequestSpec::default()
        },
        status: None,
    };
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .map_err(|e| anyhow!("sending the certificate signing request: {}", describe(&e)))?;
    let name = created.metadata.name.unwrap_or_default();
    tracing::info!(csr = %name, node, "waiting for the node's client certificate");
    let deadline = tokio::time::Instant::now() + CSR_WAIT;
    loop {
        let csr = api.get(&name).await.map_err(|e| {
            anyhow!(
                "reading the certificate signing request {name}: {}",
                describe(&e)
            )
        })?;
        let status = csr.status.unwrap_or_default();
        for c in status.conditions.unwrap_or_default() {
            if c.type_ == "Denied" || c.type_ == "Failed" {
                bail!(
                    "the certificate signing request {name} was {}: {}",
                    c.type_.to_lowercase(),
                    c.message.unwrap_or_default()
                );
            }
        }
        if let Some(cert) = status.certificate {
            let cert_pem = String::from_utf8(cert.0).context("the issued certificate")?;
            return Identity::from_pem(cert_pem, key_pem);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the certificate signing request {name} was not approved and signed within {CSR_WAIT:?}; is the control plane's CA key present on its leader?");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What the agent keeps in its directory, and how it reaches the API servers.
pub struct Clients {
    servers: Vec<String>,
    ca_pem: String,
    dir: PathBuf,
    node: String,
    state: RwLock<(usize, kube::Client, Identity)>,
}

impl Clients {
    /// Joins (discovery and TLS bootstrap) unless `dir` already holds a valid identity.
    pub async fn join(
        servers: Vec<String>,
        token: Option<&str>,
        pin: Option<&str>,
        dir: &Path,
        node: &str,
        discovery_timeout: Duration,
    ) -> Result<Arc<Clients>> {
        if servers.is_empty() {
            bail!("--server names no API server");
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let now = chrono::Utc::now().timestamp();
        if let Some((ca_pem, id)) = load(dir)? {
            if id.not_after > now {
                let c = client(&servers[0], Some(&ca_pem), Auth::Certificate(&id)).await?;
                tracing::info!(node, "using the node's existing client certificate");
                return Ok(Arc::new(Clients {
                    servers,
                    ca_pem,
                    dir: dir.to_path_buf(),
                    node: node.to_string(),
                    state: RwLock::new((0, c, id)),
                }));
            }
            tracing::warn!(
                node,
                "the node's client certificate has expired; joining again"
            );
        }
        let token = token.ok_or_else(|| {
            anyhow!("this node has no client certificate yet: join with --token and --discovery-token-ca-cert-hash (`rkube token create` makes a token)")
        })?;
        let pin = pin.ok_or_else(|| {
            anyhow!("--discovery-token-ca-cert-hash is required to join: it pins the cluster CA (`rkube server --init` prints it)")
        })?;
        let (server, ca_pem) = discover_any(&servers, token, pin, discovery_timeout).await?;
        let bootstrap = client(&server, Some(&ca_pem), Auth::Token(token)).await?;
        let id = request_certificate(bootstrap, node).await?;
        save(dir, &ca_pem, &id)?;
        let c = client(&server, Some(&ca_pem), Auth::Certificate(&id)).await?;
        tracing::info!(node, server, "joined the cluster");
        let index = servers.iter().position(|s| *s == server).unwrap_or(0);
        Ok(Arc::new(Clients {
            servers,
            ca_pem,
            dir: dir.to_path_buf(),
            node: node.to_string(),
            state: RwLock::new((index, c, id)),
        }))
    }

    /// The cluster CA (PEM) this node trusts.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn get(&self) -> kube::Client {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    pub fn identity(&self) -> Identity {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .2
            .clone()
    }

    /// After a connection failure: the next server, with the same identity.
    pub async fn fail_over(&self) {
        if self.servers.len() < 2 {
            return;
        }
        let (next, id) = {
            let s = self.state.read().unwrap_or_else(|e| e.into_inner());
            ((s.0 + 1) % self.servers.len(), s.2.clone())
        };
        match client(
            &self.servers[next],
            Some(&self.ca_pem),
            Auth::Certificate(&id),
        )
        .await
        {
            Ok(c) => {
                let mut s = self.state.write().unwrap_or_else(|e| e.into_inner());
                s.0 = next;
                s.1 = c;
                tracing::info!(server = %self.servers[next], "switched API server");
            }
            Err(e) => tracing::warn!(error = %e, "building a client failed"),
        }
    }

    /// Renews the client certificate at 80% of its life, forever.
    pub async fn rotate_forever(self: Arc<Self>) {
        loop {
            let id = self.identity();
            let wait = (id.renew_at() - chrono::Utc::now().timestamp()).max(0) as u64;
            tokio::time::sleep(Duration::from_secs(wait)).await;
            match request_certificate(self.get(), &self.node).await {
                Ok(new) => {
                    if let Err(e) = save(&self.dir, &self.ca_pem, &new) {
                        tracing::warn!(error = %e, "saving the renewed certificate failed");
                    }
                    let server = {
                        let s = self.state.read().unwrap_or_else(|e| e.into_inner());
                        self.servers[s.0].clone()
                    };
                    match client(&server, Some(&self.ca_pem), Auth::Certificate(&new)).await {
                        Ok(c) => {
                            let mut s = self.state.write().unwrap_or_else(|e| e.into_inner());
                            s.1 = c;
                            s.2 = new;
                            tracing::info!(node = %self.node, "renewed the node's client certificate");
                        }
                        Err(e) => tracing::warn!(error = %e, "building a client failed"),
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "renewing the node's certificate failed; retrying in 10s");
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
            }
        }
    }
}

fn load(dir: &Path) -> Result<Option<(String, Identity)>> {
    let ca = dir.join(CA_FILE);
    let id = dir.join(IDENTITY_FILE);
    if !ca.exists() || !id.exists() {
        return Ok(None);
    }
    let ca_pem = std::fs::read_to_string(&ca)?;
    let both = std::fs::read_to_string(&id)?;
    let split = both
        .find("-----BEGIN PRIVATE KEY-----")
        .ok_or_else(|| anyhow!("{} holds no private key", id.display()))?;
    let (cert, key) = both.split_at(split);
    Ok(Some((
        ca_pem,
        Identity::from_pem(cert.to_string(), key.to_string())?,
    )))
}

fn save(dir: &Path, ca_pem: &str, id: &Identity) -> Result<()> {
    std::fs::write(dir.join(CA_FILE), ca_pem)?;
    let mut both = id.cert_pem.clone();
    if !both.ends_with('\n') {
        both.push('\n');
    }
    both.push_str(&id.key_pem);
    rkube_pki::write_private(
        &dir.join(IDENTITY_FILE),
        both.as_bytes(),
        "node client certificate",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's timer on the TCP socket from local port `local` to port `remote` on
    /// loopback, from /proc/net/tcp: (timer kind, clock ticks until it fires). Kind 2 is
    /// keepalive (0: none, 1: retransmission).
    fn tcp_timer(local: u16, remote: u16) -> Option<(u32, u64)> {
        let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
        table.lines().skip(1).find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next()?, 16).ok();
            if port(f[1])? != local || port(f[2])? != remote {
                return None;
            }
            let (kind, when) = f[5].split_once(':')?;
            Some((
                u32::from_str_radix(kind, 16).ok()?,
                u64::from_str_radix(when, 16).ok()?,
            ))
        })
    }

    #[tokio::test]
    async fn the_agents_connections_are_probed_when_idle() {
        // A server that takes the connection and never answers: the client waits on it, idle,
        // as a watch with no events does.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let api = client(&format!("https://127.0.0.1:{port}"), None, Auth::Anonymous)
            .await
            .unwrap();
        let request = tokio::spawn(async move { api.apiserver_version().await });
        let (conn, peer) = listener.accept().await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let timer = loop {
            // Once the client's first bytes are acknowledged, only the keepalive timer is left.
            match tcp_timer(peer.port(), port) {
                Some((2, when)) => break when,
                _ if std::time::Instant::now() > deadline => {
                    panic!(
                        "no keepalive timer on the agent's connection: {:?}",
                        tcp_timer(peer.port(), port)
                    )
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        // In clock ticks (USER_HZ, 100 a second): the first probe within the idle time.
        assert!(
            timer <= KEEPALIVE_IDLE.as_secs() * 100,
            "first probe in {timer} ticks"
        );
        request.abort();
        drop(conn);
    }
}
