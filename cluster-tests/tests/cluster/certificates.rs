//! Mutual TLS: the peer and client ports refuse callers without a certificate of the cluster's
//! CA.

use std::time::Duration;

use cluster_tests::{Cluster, Options};
use rkube_store::proto::etcdserverpb as pb;

/// Speaks the Raft stream on `addr` holding `material` (None: no certificate): one Vote frame
/// with an empty payload. True when an answer frame comes back (the member took the
/// connection; it refuses the empty payload itself, in the frame).
async fn raft_stream_answers(addr: &str, ca_pem: &[u8], identity: Option<(&[u8], &[u8])>) -> bool {
    use rkube_store::raft::stream::{self, Kind};
    use tokio::io::AsyncWriteExt;
    let material = rkube_pki::TlsMaterial {
        ca_pem: ca_pem.to_vec(),
        cert_pem: identity.map(|i| i.0.to_vec()).unwrap_or_default(),
        key_pem: identity.map(|i| i.1.to_vec()).unwrap_or_default(),
    };
    let config = match identity {
        Some(_) => material
            .rustls_client(&[stream::ALPN])
            .expect("client config"),
        None => {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem) {
                roots.add(c.expect("CA PEM")).expect("CA root");
            }
            let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
            config.alpn_protocols = vec![stream::ALPN.to_vec()];
            config
        }
    };
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").ok()?;
        let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
            .connect(name, tcp)
            .await
            .ok()?;
        tls.write_all(&stream::frame(1, Kind::Vote as u8, &[]))
            .await
            .ok()?;
        tls.flush().await.ok()?;
        stream::read_frame(&mut tls).await.ok()?
    };
    match tokio::time::timeout(Duration::from_secs(10), attempt).await {
        Ok(Some((id, outcome, why))) => {
            assert_eq!(
                (id, outcome),
                (1, stream::REFUSED),
                "an empty Vote is not a vote"
            );
            assert!(
                String::from_utf8_lossy(&why).contains("undecodable"),
                "{}",
                String::from_utf8_lossy(&why)
            );
            true
        }
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_and_clients_without_a_valid_certificate_are_refused() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    c.wait_leader().await;
    let pki = c.path().join("pki");
    let ca = std::fs::read(pki.join("ca.crt")).expect("ca");
    // A member's own certificate is answered on the Raft stream: the refusals below are the
    // certificates' doing, not the request's.
    let (own_crt, own_key) = (
        std::fs::read(pki.join(format!("{}.crt", c.members[1].name))).expect("crt"),
        std::fs::read(pki.join(format!("{}.key", c.members[1].name))).expect("key"),
    );
    assert!(
        raft_stream_answers(&c.members[0].peer, &ca, Some((&own_crt, &own_key))).await,
        "a member's own certificate was refused on the Raft stream"
    );
    // A stranger's CA and certificate.
    let stranger = tempfile::tempdir().expect("tempdir");
    rkube_pki::init_ca(stranger.path()).expect("other ca");
    rkube_pki::issue(
        stranger.path(),
        "n1",
        "n1",
        None,
        &["127.0.0.1".into()],
        true,
        true,
    )
    .expect("other cert");
    let (foreign_crt, foreign_key) = (
        std::fs::read(stranger.path().join("n1.crt")).expect("crt"),
        std::fs::read(stranger.path().join("n1.key")).expect("key"),
    );
    for (what, identity) in [
        ("no certificate", None),
        (
            "a certificate from another CA",
            Some((&foreign_crt[..], &foreign_key[..])),
        ),
    ] {
        assert!(
            !raft_stream_answers(&c.members[0].peer, &ca, identity).await,
            "the peer port's Raft stream accepted a caller with {what}"
        );
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca));
        if let Some((crt, key)) = identity {
            tls = tls.identity(Identity::from_pem(crt, key));
        }
        let ch = Endpoint::from_shared(format!("https://{}", c.members[0].client))
            .expect("uri")
            .tls_config(tls.clone())
            .expect("tls")
            .connect_lazy();
        let mut kv = cluster_tests::KvClient::new(ch);
        let call = kv.range(pb::RangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        });
        let refused = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .map(|r| r.is_err())
            .unwrap_or(true);
        assert!(refused, "the client port accepted a caller with {what}");
    }
}
