//! A member's mutual TLS: the three files it needs, read and checked, and the tonic server and
//! client configurations built from them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::ca::CA_CERT_FILE;
use crate::cert::check_cert_pem;
use crate::error::PkiError;
use crate::files::read_file;

/// The three files one member needs for mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster CA certificate that peers' certificates must chain to.
    pub ca: PathBuf,
    /// This member's certificate.
    pub cert: PathBuf,
    /// This member's private key.
    pub key: PathBuf,
}

impl TlsFiles {
    /// The files of member `name` in PKI directory `dir`: `ca.crt`, `<name>.crt`, `<name>.key`.
    pub fn for_member(dir: &Path, name: &str) -> TlsFiles {
        TlsFiles {
            ca: dir.join(CA_CERT_FILE),
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        }
    }

    /// Reads the three files and checks that each holds PEM of the right kind, so a bad file is
    /// reported by name here rather than as an opaque TLS error when the first connection opens.
    pub fn load(&self) -> Result<TlsMaterial, PkiError> {
        let ca_pem = read_file(&self.ca, "TLS CA certificate")?;
        let cert_pem = read_file(&self.cert, "TLS certificate")?;
        let key_pem = read_file(&self.key, "TLS key")?;

        check_cert_pem(&ca_pem, &self.ca, "TLS CA certificate")?;
        check_cert_pem(&cert_pem, &self.cert, "TLS certificate")?;
        PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| PkiError::Pem {
            what: "TLS key",
            path: self.key.clone(),
            source,
        })?;

        Ok(TlsMaterial {
            ca_pem,
            cert_pem,
            key_pem,
        })
    }
}

/// PEM contents of a member's CA certificate, certificate and key.
#[derive(Clone)]
pub struct TlsMaterial {
    /// The cluster CA certificate.
    pub ca_pem: Vec<u8>,
    /// This member's certificate.
    pub cert_pem: Vec<u8>,
    /// This member's private key.
    pub key_pem: Vec<u8>,
}

// The key stays out of logs.
impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl TlsMaterial {
    /// Server side of mutual TLS: presents this member's certificate and requires every client
    /// to present one signed by the cluster CA.
    pub fn server_config(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new()
            .identity(self.identity())
            .client_ca_root(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .client_auth_optional(false)
    }

    /// Client side of mutual TLS: trusts only the cluster CA, expects the server's certificate to
    /// name `domain`, and presents this member's certificate.
    pub fn client_config(&self, domain: &str) -> tonic::transport::ClientTlsConfig {
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .identity(self.identity())
            .domain_name(domain)
    }

    /// rustls server side of mutual TLS for a protocol of rkube's own, offered by `alpn`:
    /// presents this member's certificate and requires a client certificate signed by the
    /// cluster CA, as [`server_config`](Self::server_config) does for gRPC.
    pub fn rustls_server(&self, alpn: &[&[u8]]) -> Result<rustls::ServerConfig, PkiError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots()?,
            provider.clone(),
        )
        .build()
        .map_err(|e| PkiError::TlsConfig(e.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(tls_config)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain()?, self.key()?)
            .map_err(tls_config)?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }

    /// rustls client side of mutual TLS for a protocol of rkube's own, asked for by `alpn`:
    /// trusts only the cluster CA and presents this member's certificate.
    pub fn rustls_client(&self, alpn: &[&[u8]]) -> Result<rustls::ClientConfig, PkiError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(tls_config)?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(self.chain()?, self.key()?)
            .map_err(tls_config)?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }

    fn roots(&self) -> Result<Arc<rustls::RootCertStore>, PkiError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.ca_pem) {
            let cert = cert.map_err(|e| PkiError::TlsConfig(e.to_string()))?;
            roots.add(cert).map_err(tls_config)?;
        }
        Ok(Arc::new(roots))
    }

    fn chain(&self) -> Result<Vec<CertificateDer<'static>>, PkiError> {
        CertificateDer::pem_slice_iter(&self.cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| PkiError::TlsConfig(e.to_string()))
    }

    fn key(&self) -> Result<PrivateKeyDer<'static>, PkiError> {
        PrivateKeyDer::from_pem_slice(&self.key_pem).map_err(|e| PkiError::TlsConfig(e.to_string()))
    }

    fn identity(&self) -> tonic::transport::Identity {
        tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem)
    }
}

fn tls_config(e: rustls::Error) -> PkiError {
    PkiError::TlsConfig(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{handshake, Pki};
    use std::time::Duration;

    #[test]
    fn mutual_tls_accepts_same_ca_and_rejects_others() {
        let pki = Pki::new();
        let other = Pki::new();
        pki.leaf("server").usage(true, false).issue();
        pki.leaf("client").usage(false, true).issue();
        pki.leaf("server-only").usage(true, false).issue();
        other.leaf("intruder").issue();

        let server = pki.material("server");
        let client = pki.material("client");
        let intruder = other.material("intruder");
        // The intruder's certificate but our CA as its trust root: it trusts us, we must not
        // trust it.
        let intruder_trusting_us = TlsMaterial {
            ca_pem: pki.read(CA_CERT_FILE),
            ..intruder.clone()
        };
        // A client holding a certificate without ClientAuth.
        let server_only_as_client = pki.material("server-only");

        struct Case<'a> {
            what: &'static str,
            server: &'a TlsMaterial,
            client: &'a TlsMaterial,
            domain: &'static str,
            /// `None`: the handshake must succeed; otherwise the certificate error it must fail with.
            reject: Option<fn(&rustls::CertificateError) -> bool>,
        }
        use rustls::CertificateError as E;
        let cases = [
            Case {
                what: "same CA",
                server: &server,
                client: &client,
                domain: "localhost",
                reject: None,
            },
            Case {
                what: "IP SAN",
                server: &server,
                client: &client,
                domain: "127.0.0.1",
                reject: None,
            },
            Case {
                what: "client cert from another CA",
                server: &server,
                client: &intruder_trusting_us,
                domain: "localhost",
                // Both CAs are named "rkube-ca", so the chain is found and its signature fails.
                reject: Some(|e| matches!(e, E::BadSignature | E::UnknownIssuer)),
            },
            Case {
                what: "server cert from another CA",
                server: &intruder,
                client: &client,
                domain: "localhost",
                reject: Some(|e| matches!(e, E::BadSignature | E::UnknownIssuer)),
            },
            Case {
                what: "client cert without ClientAuth",
                server: &server,
                client: &server_only_as_client,
                domain: "localhost",
                reject: Some(|e| matches!(e, E::InvalidPurposeContext { .. } | E::InvalidPurpose)),
            },
            Case {
                what: "name not in SANs",
                server: &server,
                client: &client,
                domain: "elsewhere.example",
                reject: Some(|e| {
                    matches!(e, E::NotValidForNameContext { .. } | E::NotValidForName)
                }),
            },
        ];
        for case in cases {
            match (
                case.reject,
                handshake(case.server, case.client, case.domain),
            ) {
                (None, result) => result.unwrap_or_else(|e| panic!("{}: {e}", case.what)),
                (Some(check), Err(rustls::Error::InvalidCertificate(e))) => {
                    assert!(check(&e), "{}: unexpected rejection {e:?}", case.what)
                }
                (Some(_), other) => {
                    panic!("{}: want a certificate error, got {other:?}", case.what)
                }
            }
        }
    }

    #[test]
    fn load_names_the_missing_file() {
        let pki = Pki::new();
        let files = TlsFiles::for_member(pki.path(), "absent");
        let err = files.load().expect_err("must fail");
        assert!(err.is_not_found());
        assert_eq!(
            err.to_string(),
            format!(
                "cannot read TLS certificate {}: No such file or directory",
                pki.path().join("absent.crt").display()
            )
        );
    }

    #[test]
    fn load_rejects_a_file_of_the_wrong_kind() {
        let pki = Pki::new();
        pki.leaf("m1").issue();
        let files = TlsFiles {
            key: pki.path().join("m1.crt"),
            ..TlsFiles::for_member(pki.path(), "m1")
        };
        let err = files.load().expect_err("a certificate is not a key");
        assert!(
            matches!(
                &err,
                PkiError::Pem {
                    what: "TLS key",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn tonic_accepts_the_configs() {
        let pki = Pki::new();
        pki.leaf("m1").issue();
        let m = pki.material("m1");
        tonic::transport::Server::builder()
            .tls_config(m.server_config())
            .expect("server TLS config");
        tonic::transport::Endpoint::from_static("https://127.0.0.1:1")
            .tls_config(m.client_config("localhost"))
            .expect("client TLS config");
    }

    /// Makes one gRPC call over `client` to a tonic server on `addr`. Any route answers
    /// Unimplemented, so `Ok(Code::Unimplemented)` means TLS and HTTP/2 both worked.
    async fn grpc_call(
        addr: std::net::SocketAddr,
        client: tonic::transport::ClientTlsConfig,
    ) -> Result<tonic::Code, String> {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
            .map_err(|e| e.to_string())?
            .tls_config(client)
            .map_err(|e| e.to_string())?;
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.map_err(|e| format!("ready: {e:?}"))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static("/rkube.test.Pki/Ping");
        let codec = tonic::codec::ProstCodec::<(), ()>::default();
        match grpc.unary(tonic::Request::new(()), path, codec).await {
            Ok(_) => Ok(tonic::Code::Ok),
            Err(status) => Ok(status.code()),
        }
    }

    #[tokio::test]
    async fn tonic_server_requires_a_client_certificate_from_the_cluster_ca() {
        let pki = Pki::new();
        let other = Pki::new();
        pki.leaf("server").usage(true, false).issue();
        pki.leaf("client").usage(false, true).issue();
        other.leaf("intruder").issue();
        let server = pki.material("server");
        let client = pki.material("client");
        let intruder = TlsMaterial {
            ca_pem: pki.read(CA_CERT_FILE),
            ..other.material("intruder")
        };

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(
            tonic::transport::Server::builder()
                .tls_config(server.server_config())
                .expect("server TLS config")
                .add_routes(tonic::service::Routes::default())
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                ),
        );

        let bounded =
            |config| tokio::time::timeout(Duration::from_secs(10), grpc_call(addr, config));
        let no_identity = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&client.ca_pem))
            .domain_name("localhost");

        let good = bounded(client.client_config("localhost"))
            .await
            .expect("in time");
        assert_eq!(good, Ok(tonic::Code::Unimplemented), "member client");
        let by_ip = bounded(client.client_config("127.0.0.1"))
            .await
            .expect("in time");
        assert_eq!(
            by_ip,
            Ok(tonic::Code::Unimplemented),
            "member client, IP SAN"
        );

        for (what, config) in [
            ("client without a certificate", no_identity),
            (
                "client certificate from another CA",
                intruder.client_config("localhost"),
            ),
        ] {
            let result = bounded(config).await.expect("in time");
            assert!(
                !matches!(result, Ok(tonic::Code::Unimplemented) | Ok(tonic::Code::Ok)),
                "{what} got through: {result:?}"
            );
        }

        let _ = stop.send(());
        serving.await.expect("server task").expect("server");
    }

    #[test]
    fn debug_does_not_print_the_key() {
        let pki = Pki::new();
        pki.leaf("m1").issue();
        let m = pki.material("m1");
        let shown = format!("{m:?}");
        assert!(shown.contains("<redacted>"));
        assert!(!shown.contains("PRIVATE KEY"));
    }
}
