//! Leader failures under load: a SIGKILLed leader, a paused (then deposed) leader, and the loss
//! of quorum; nothing acknowledged is lost and writes resume once a leader is back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_tests::{wait_for, Cluster, Options, WithLogs};
use rkube_store::proto::etcdserverpb as pb;

use super::common::{check_all_present, Writers};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_leader_during_writes_loses_nothing() {
    let c = Arc::new(
        Cluster::start(Options::default())
            .await
            .expect("cluster starts"),
    );
    let leader = c.wait_leader().await;
    let writers = Writers::start(&c, "/kill", 4);
    writers.wait_count(100).await;
    c.kill(leader).await;
    let new_leader = c.wait_new_leader(leader).await;
    assert_ne!(new_leader, leader);
    let before = writers.count().await;
    writers.wait_count(before + 100).await;
    c.restart_missing().await.logs(&c).expect("restart");
    let acked = writers.finish().await;
    check_all_present(&c, &[0, 1, 2], "/kill", &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn losing_quorum_fails_writes_clearly_and_recovers() {
    let c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    let leader = c.wait_leader().await;
    for n in 0..20 {
        c.put(n % 3, &format!("/q/before/{n}"), "x")
            .await
            .logs(&c)
            .expect("write with quorum");
    }
    let survivor = (leader + 1) % 3;
    for i in 0..3 {
        if i != survivor {
            c.kill(i).await;
        }
    }
    // A two-key transaction: applied entirely or not at all.
    let started = Instant::now();
    let txn = pb::TxnRequest {
        compare: vec![],
        success: ["/q/pair/a", "/q/pair/b"]
            .iter()
            .map(|k| pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                    key: k.as_bytes().to_vec(),
                    value: b"1".to_vec(),
                    ..Default::default()
                })),
            })
            .collect(),
        failure: vec![],
    };
    let err = c
        .kv(survivor)
        .txn(txn)
        .await
        .expect_err("a write without quorum must fail");
    assert_eq!(
        err.code(),
        tonic::Code::Unavailable,
        "unexpected error: {err:?}"
    );
    assert!(
        err.message().contains("no leader")
            || err.message().contains("timed out")
            || err.message().contains("quorum"),
        "the error should say the cluster has no quorum: {}",
        err.message()
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the failure took {:?}",
        started.elapsed()
    );

    c.restart_missing().await.logs(&c).expect("restart");
    c.wait_leader().await;
    let rev = wait_for("writes to resume", Duration::from_secs(30), || async {
        c.put(survivor, "/q/after", "y").await.ok()
    })
    .await;
    assert!(rev > 0);
    let keys: BTreeMap<String, String> = c
        .local_keys(survivor, "/q/")
        .await
        .expect("read")
        .into_iter()
        .collect();
    for n in 0..20 {
        assert!(
            keys.contains_key(&format!("/q/before/{n}")),
            "write {n} from before the outage was lost"
        );
    }
    assert_eq!(
        keys.contains_key("/q/pair/a"),
        keys.contains_key("/q/pair/b"),
        "a transaction was half applied: {keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_leader_commits_nothing_after_a_new_election() {
    let c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    let leader = c.wait_leader().await;
    c.put(leader, "/pause/before", "1").await.expect("write");
    c.pause(leader);
    let new_leader = c.wait_new_leader(leader).await;
    c.put(new_leader, "/pause/during", "2")
        .await
        .logs(&c)
        .expect("write to the new leader");
    c.resume(leader);
    let rev = c.wait_converged(&[0, 1, 2]).await;
    let hashes: BTreeSet<u32> = futures::future::join_all((0..3).map(|i| c.hash_kv(i, rev)))
        .await
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(
        hashes.len(),
        1,
        "members diverged after the old leader resumed"
    );
}
