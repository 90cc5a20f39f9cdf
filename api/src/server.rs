//! The HTTPS listener: TLS with optional client certificates (verified against the cluster CA),
//! one HTTP/1.1 connection per client, each request handed to [`crate::handler`] with the user
//! the connection authenticated as.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rkube_pki::TlsMaterial;
use rkube_store::server::endpoint::Connection;
use rkube_store::server::node::Node;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::{self, User};
use crate::handler::Api;

#[derive(Debug)]
pub struct ApiConfig {
    pub listen: SocketAddr,
    /// Connections accepted at the control-plane endpoint while this member holds it, served
    /// as the ones to `listen` are.
    pub endpoint: Option<rkube_store::server::endpoint::Connections>,
    pub tls: TlsMaterial,
    /// Where ClusterIPs come from (`--service-cluster-ip-range`, default 10.96.0.0/12).
    pub service_net: crate::services::ServiceNet,
    /// Signs and checks service account tokens.
    pub service_account_key: crate::token::SigningKey,
    /// The client certificate and key (PEM) this server presents to node agents.
    pub kubelet_client: Option<(Vec<u8>, Vec<u8>)>,
    /// How often the node agents' resource usage is scraped (metrics-server's
    /// `--metric-resolution`).
    pub metric_resolution: std::time::Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error("cannot listen for the Kubernetes API on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the API server's TLS setup failed: {0}")]
    Tls(String),
}

pub struct ApiServer {
    pub addr: SocketAddr,
    api: Arc<Api>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    /// An in-process client acting as `user` (the controllers', the scheduler's).
    pub fn client(&self, user: User) -> crate::client::LocalClient {
        crate::client::LocalClient::new(self.api.clone(), user)
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

fn tls_config(tls: &TlsMaterial) -> Result<rustls::ServerConfig, ApiServerError> {
    let err = |e: &dyn std::fmt::Display| ApiServerError::Tls(e.to_string());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&tls.ca_pem) {
        roots.add(cert.map_err(|e| err(&e))?).map_err(|e| err(&e))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| err(&e))?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&tls.cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| err(&e))?;
    let key = PrivateKeyDer::from_pem_slice(&tls.key_pem).map_err(|e| err(&e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| err(&e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The next connection accepted at the control-plane endpoint; never without one.
async fn endpoint_connection(
    endpoint: &mut Option<rkube_store::server::endpoint::Connections>,
) -> Option<Connection> {
    match endpoint {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Starts serving the Kubernetes API; returns once the port listens.
pub async fn start(node: Arc<Node>, cfg: ApiConfig) -> Result<ApiServer, ApiServerError> {
    let tls = Arc::new(tls_config(&cfg.tls)?);
    let listener =
        TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| ApiServerError::Listen {
                addr: cfg.listen,
                source,
            })?;
    let addr = listener
        .local_addr()
        .map_err(|source| ApiServerError::Listen {
            addr: cfg.listen,
            source,
        })?;
    let mut api = Api::new(
        node.clone(),
        cfg.service_net,
        addr.port(),
        cfg.service_account_key,
    );
    if let Some((cert, key)) = &cfg.kubelet_client {
        api.kubelet_tls =
            Some(crate::nodeproxy::client_config(cert, key).map_err(ApiServerError::Tls)?);
    }
    let api = Arc::new(api);
    api.authz.start(node);
    let api_handle = api.clone();
    api.clone().start_background();
    api.clone().start_metrics_scraper(cfg.metric_resolution);
    // The OpenAPI documents take a moment to build: build them before the first request needs them.
    tokio::task::spawn_blocking(crate::openapi::warm);
    let (stop, mut stopped) = watch::channel(false);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut endpoint = cfg.endpoint;
    let task = tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                c = listener.accept() => match c {
                    Ok((tcp, _)) => {
                        let _ = tcp.set_nodelay(true);
                        Connection::own(tcp)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting an API connection failed");
                        continue;
                    }
                },
                Some(tcp) = endpoint_connection(&mut endpoint) => tcp,
                _ = stopped.changed() => break,
            };
            let acceptor = acceptor.clone();
            let api = api.clone();
            let mut stopped = stopped.clone();
            // Served until this member lets go of the endpoint it arrived at, if it did.
            let released = tcp.released();
            tokio::spawn(async move {
                let tls = match acceptor.accept(tcp).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                };
                let user = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(auth::from_certificate);
                let user: Arc<User> = Arc::new(user.unwrap_or_else(User::anonymous));
                let service = service_fn(move |req| {
                    let api = api.clone();
                    let user = user.clone();
                    async move {
                        let req = req.map(axum::body::Body::new);
                        Ok::<_, std::convert::Infallible>(api.handle(&user, req).await)
                    }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades();
                tokio::select! {
                    r = conn => if let Err(e) = r {
                        tracing::debug!(error = %e, "API connection ended");
                    },
                    _ = stopped.changed() => {}
                    _ = released => {}
                }
            });
        }
    });
    Ok(ApiServer {
        addr,
        api: api_handle,
        stop,
        task,
    })
}
