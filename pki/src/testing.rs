//! Test fixtures shared by the modules' tests: a PKI directory with a CA, a builder for its
//! leaves, and an in-memory TLS handshake.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use rustls::client::ClientConnection;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerConnection, WebPkiClientVerifier};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::{init_ca, issue, PkiError, TlsFiles, TlsMaterial};

/// A PKI directory with a CA, and a builder-style helper to issue leaves into it.
pub(crate) struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub(crate) fn new() -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        init_ca(dir.path()).expect("init_ca");
        Pki { dir }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn leaf(&self, name: &str) -> LeafBuilder<'_> {
        LeafBuilder {
            pki: self,
            name: name.to_string(),
            common_name: name.to_string(),
            organization: None,
            sans: vec!["localhost".into(), "127.0.0.1".into()],
            server: true,
            client: true,
        }
    }

    pub(crate) fn material(&self, name: &str) -> TlsMaterial {
        TlsFiles::for_member(self.path(), name)
            .load()
            .expect("load TLS material")
    }

    pub(crate) fn read(&self, file: &str) -> Vec<u8> {
        fs::read(self.path().join(file)).expect("read file")
    }
}

pub(crate) struct LeafBuilder<'a> {
    pki: &'a Pki,
    name: String,
    common_name: String,
    organization: Option<String>,
    sans: Vec<String>,
    server: bool,
    client: bool,
}

impl LeafBuilder<'_> {
    pub(crate) fn common_name(mut self, cn: &str) -> Self {
        self.common_name = cn.to_string();
        self
    }
    pub(crate) fn organization(mut self, o: &str) -> Self {
        self.organization = Some(o.to_string());
        self
    }
    pub(crate) fn sans(mut self, sans: &[&str]) -> Self {
        self.sans = sans.iter().map(|s| s.to_string()).collect();
        self
    }
    pub(crate) fn usage(mut self, server: bool, client: bool) -> Self {
        self.server = server;
        self.client = client;
        self
    }
    pub(crate) fn try_issue(self) -> Result<(), PkiError> {
        issue(
            self.pki.path(),
            &self.name,
            &self.common_name,
            self.organization.as_deref(),
            &self.sans,
            self.server,
            self.client,
        )
    }
    pub(crate) fn issue(self) {
        self.try_issue().expect("issue");
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca_pem: &[u8]) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.expect("CA PEM")).expect("add CA root");
    }
    Arc::new(roots)
}

fn chain(m: &TlsMaterial) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(&m.cert_pem)
        .collect::<Result<_, _>>()
        .expect("cert PEM")
}

fn key(m: &TlsMaterial) -> PrivateKeyDer<'static> {
    PrivateKeyDer::from_pem_slice(&m.key_pem).expect("key PEM")
}

/// Runs a TLS handshake in memory between a server holding `server` and a client holding
/// `client`, each trusting its own `ca_pem`. Returns the first error either side reports.
pub(crate) fn handshake(
    server: &TlsMaterial,
    client: &TlsMaterial,
    domain: &str,
) -> Result<(), rustls::Error> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(&server.ca_pem), provider())
        .build()
        .expect("client verifier");
    let server_config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain(server), key(server))
        .expect("server cert");
    let client_config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots(&client.ca_pem))
        .with_client_auth_cert(chain(client), key(client))
        .expect("client cert");

    let name = rustls::pki_types::ServerName::try_from(domain.to_string()).expect("server name");
    let mut c = ClientConnection::new(Arc::new(client_config), name).expect("client conn");
    let mut s = ServerConnection::new(Arc::new(server_config)).expect("server conn");

    for _ in 0..16 {
        let mut buf = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut buf).expect("client write_tls");
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            s.read_tls(&mut rd).expect("server read_tls");
            s.process_new_packets()?;
        }

        let mut buf = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut buf).expect("server write_tls");
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).expect("client read_tls");
            c.process_new_packets()?;
        }

        if !c.is_handshaking() && !s.is_handshaking() {
            // TLS 1.3: the server judges the client's certificate after the client thinks it
            // is done, so make sure the server has seen everything the client sent.
            let mut buf = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut buf).expect("client write_tls");
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                s.read_tls(&mut rd).expect("server read_tls");
                s.process_new_packets()?;
            }
            return Ok(());
        }
    }
    panic!("TLS handshake did not finish");
}
