//! A server's data dir belongs to one member of one cluster: another process, another cluster
//! or another member name is refused at startup.

use cluster_tests::{Cluster, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_refuses_a_data_dir_that_is_not_its_own() {
    let c = Cluster::start(Options {
        servers: 1,
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    let m = &c.members[0];
    let run = |name: &str, token: &str, data: &std::path::Path| {
        std::process::Command::new(cluster_tests::rkube_bin())
            .args(["server", "--name", name, "--data-dir"])
            .arg(data)
            .args([
                "--listen-peer",
                "127.0.0.1:1",
                "--listen-client",
                "127.0.0.1:1",
            ])
            .args([
                "--initial-cluster",
                &format!("{name}={}", m.peer),
                "--initial-cluster-token",
                token,
                "--pki",
            ])
            .arg(c.path().join("pki"))
            .output()
            .expect("runs")
    };
    let data = c.path().join("n1");
    let token = serde_json::from_slice::<serde_json::Value>(
        &std::fs::read(c.path().join("cluster.json")).expect("layout"),
    )
    .expect("json")["token"]
        .as_str()
        .expect("token")
        .to_string();
    let check = |name: &str, tok: &str, expected: &str| {
        let out = run(name, tok, &data);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "server started on a data dir it must refuse"
        );
        assert!(
            stderr.contains(expected),
            "expected {expected:?} in: {stderr}"
        );
    };
    check("n1", &token, "in use by another rkube process");
    c.kill(0).await;
    check("n1", "some-other-cluster", "belongs to another cluster");
    check("n7", &token, "belongs to member \"n1\"");
}
