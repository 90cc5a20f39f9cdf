//! Mutual TLS: the peer and client ports refuse callers without a certificate of the cluster's
//! CA.

use std::time::Duration;

use cluster_tests::{Cluster, Options};
use rkube_store::proto::etcdserverpb as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_and_clients_without_a_valid_certificate_are_refused() {
    use rkube_store::proto::peer::{peer_client::PeerClient, Payload};
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    c.wait_leader().await;
    let ca = std::fs::read(c.path().join("pki/ca.crt")).expect("ca");
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
    let foreign = Identity::from_pem(
        std::fs::read(stranger.path().join("n1.crt")).expect("crt"),
        std::fs::read(stranger.path().join("n1.key")).expect("key"),
    );
    for (what, identity) in [
        ("no certificate", None),
        ("a certificate from another CA", Some(foreign)),
    ] {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca));
        if let Some(id) = identity {
            tls = tls.identity(id);
        }
        for (port_kind, addr) in [
            ("peer", &c.members[0].peer),
            ("client", &c.members[0].client),
        ] {
            let ch = Endpoint::from_shared(format!("https://{addr}"))
                .expect("uri")
                .tls_config(tls.clone())
                .expect("tls")
                .connect_lazy();
            let refused = if port_kind == "peer" {
                let mut peer = PeerClient::new(ch);
                let call = peer.vote(Payload { data: vec![] });
                tokio::time::timeout(Duration::from_secs(10), call)
                    .await
                    .map(|r| r.is_err())
                    .unwrap_or(true)
            } else {
                let mut kv = cluster_tests::KvClient::new(ch);
                let call = kv.range(pb::RangeRequest {
                    key: b"a".to_vec(),
                    ..Default::default()
                });
                tokio::time::timeout(Duration::from_secs(10), call)
                    .await
                    .map(|r| r.is_err())
                    .unwrap_or(true)
            };
            assert!(
                refused,
                "the {port_kind} port accepted a caller with {what}"
            );
        }
    }
}
