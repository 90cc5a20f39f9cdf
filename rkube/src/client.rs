//! How the small clients (`kv`, `lease`, `status`, `bench`) find and reach a cluster:
//! `--endpoints` with TLS flags, or `--dir` of a local cluster, or the ETCDCTL_* variables that
//! DIR/env exports.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use rkube_store::proto::etcdserverpb as pb;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Comma-separated client URLs (default: ETCDCTL_ENDPOINTS).
    #[arg(long, global = true)]
    pub endpoints: Option<String>,
    /// CA certificate that signed the servers' certificates (default: ETCDCTL_CACERT).
    #[arg(long, global = true)]
    pub cacert: Option<PathBuf>,
    /// Client certificate (default: ETCDCTL_CERT).
    #[arg(long = "cert", id = "tls_cert", global = true)]
    pub cert: Option<PathBuf>,
    /// Client key (default: ETCDCTL_KEY).
    #[arg(long = "key", id = "tls_key", global = true)]
    pub key: Option<PathBuf>,
    /// A local cluster's directory, as made by `rkube up` (its endpoints and admin certificate).
    #[arg(long, global = true)]
    pub dir: Option<PathBuf>,
    /// Plain TCP instead of TLS (only for servers started with --insecure-client).
    #[arg(long, global = true)]
    pub insecure: bool,
}

pub struct Target {
    pub endpoints: Vec<String>,
    tls: Option<ClientTlsConfig>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl ClusterArgs {
    pub fn resolve(&self) -> Result<Target> {
        let (endpoints, cacert, cert, key) = if let Some(dir) = &self.dir {
            let local = crate::up::LocalCluster::load(dir)?;
            let pki = dir.join("pki");
            (
                self.endpoints
                    .clone()
                    .unwrap_or_else(|| local.client_urls().join(",")),
                Some(self.cacert.clone().unwrap_or_else(|| pki.join("ca.crt"))),
                Some(self.cert.clone().unwrap_or_else(|| pki.join("admin.crt"))),
                Some(self.key.clone().unwrap_or_else(|| pki.join("admin.key"))),
            )
        } else {
            let endpoints = self.endpoints.clone().or_else(|| env("ETCDCTL_ENDPOINTS")).context(
                "no cluster given: pass --endpoints (with --cacert/--cert/--key) or --dir DIR, or `source DIR/env` first",
            )?;
            (
                endpoints,
                self.cacert
                    .clone()
                    .or_else(|| env("ETCDCTL_CACERT").map(PathBuf::from)),
                self.cert
                    .clone()
                    .or_else(|| env("ETCDCTL_CERT").map(PathBuf::from)),
                self.key
                    .clone()
                    .or_else(|| env("ETCDCTL_KEY").map(PathBuf::from)),
            )
        };
        let endpoints: Vec<String> = endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| {
                if e.contains("://") {
                    e.to_string()
                } else if self.insecure {
                    format!("http://{e}")
                } else {
                    format!("https://{e}")
                }
            })
            .collect();
        if endpoints.is_empty() {
            bail!("the endpoint list is empty");
        }
        let tls = if self.insecure || endpoints.iter().all(|e| e.starts_with("http://")) {
            None
        } else {
            let read = |p: &Option<PathBuf>, what: &str| -> Result<Vec<u8>> {
                let p = p
                    .as_ref()
                    .with_context(|| format!("TLS needs {what} (flag or ETCDCTL_* variable)"))?;
                std::fs::read(p).with_context(|| format!("cannot read {what} {}", p.display()))
            };
            let ca = read(&cacert, "--cacert")?;
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
            if cert.is_some() || key.is_some() {
                tls = tls.identity(Identity::from_pem(
                    read(&cert, "--cert")?,
                    read(&key, "--key")?,
                ));
            }
            Some(tls)
        };
        Ok(Target { endpoints, tls })
    }
}

impl Target {
    /// A channel to one endpoint.
    pub fn channel_to(&self, endpoint: &str) -> Result<Channel> {
        let mut ep = Endpoint::from_shared(endpoint.to_string())
            .with_context(|| format!("invalid endpoint {endpoint:?}"))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            ep = ep.tls_config(tls.clone())?;
        }
        Ok(ep.connect_lazy())
    }

    /// A connected channel to the first endpoint that answers.
    pub async fn connect(&self) -> Result<Channel> {
        let mut last = None;
        for e in &self.endpoints {
            let ch = self.channel_to(e)?;
            let mut probe = pb::maintenance_client::MaintenanceClient::new(ch.clone());
            let mut req = tonic::Request::new(pb::StatusRequest {});
            req.set_timeout(Duration::from_secs(3));
            match tokio::time::timeout(Duration::from_secs(3), probe.status(req)).await {
                Ok(Ok(_)) => return Ok(ch),
                Ok(Err(s)) => last = Some(format!("{e}: {}", s.message())),
                Err(_) => last = Some(format!("{e}: no answer within 3 s")),
            }
        }
        bail!("no endpoint answered ({})", last.unwrap_or_default())
    }
}
