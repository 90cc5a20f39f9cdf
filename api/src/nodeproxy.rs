//! Reaching a node's agent (its kubelet port) for `kubectl logs`, `exec`, `attach` and
//! `port-forward` (upgraded streams passed through): HTTPS to the node's
//! InternalIP and `daemonEndpoints.kubeletEndpoint.Port`, with the API server's own client
//! certificate (`kube-apiserver-kubelet-client`). As kube-apiserver does by default, the
//! agent's serving certificate is not checked (`--kubelet-certificate-authority` unset); the
//! agent checks the API server's.

use std::sync::Arc;

use axum::body::Body;
use rkube_core::upgrade::upgrade_through;
pub use rkube_core::upgrade::UpgradeRequest;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::error::ApiError;

#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS client the API server uses toward agents.
pub fn client_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| e.to_string())?;
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_client_auth_cert(chain, key)
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(config))
}

/// A TLS connection to the agent at `host:port`; errors are the API's 502 in Kubernetes' words.
async fn connect(
    tls: Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
    path_and_query: &str,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, ApiError> {
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| unreachable(host, port, path_and_query, &e))?;
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| unreachable(host, port, path_and_query, &e))?;
    tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| unreachable(host, port, path_and_query, &e))
}

fn unreachable(host: &str, port: u16, path_and_query: &str, e: &dyn std::fmt::Display) -> ApiError {
    ApiError::new(
        502,
        "BadGateway",
        format!("Get \"https://{host}:{port}{path_and_query}\": {e}"),
    )
}

/// GET `path_and_query` on the agent at `host:port`; its answer (status, body streamed) as the
/// API's response.
pub async fn get(
    tls: Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
    path_and_query: &str,
) -> Result<hyper::Response<Body>, ApiError> {
    let stream = connect(tls, host, port, path_and_query).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(host, port, path_and_query, &e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = hyper::Request::get(path_and_query)
        .header("host", format!("{host}:{port}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| unreachable(host, port, path_and_query, &e))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| unreachable(host, port, path_and_query, &e))?;
    let (parts, body) = resp.into_parts();
    Ok(hyper::Response::from_parts(parts, Body::new(body)))
}

/// `kubectl exec`, `attach` and `port-forward` on the agent at `host:port`: the client's
/// upgrade request is sent on, and the two upgraded connections are joined.
pub async fn upgrade(
    tls: Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
    request: UpgradeRequest<'_>,
) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
    let stream = connect(tls, host, port, request.path_and_query).await?;
    let path = request.path_and_query.to_string();
    upgrade_through(stream, &format!("{host}:{port}"), request)
        .await
        .map_err(|e| unreachable(host, port, &path, &e))
}
