//! Raft log replication: a follower that was stopped while the leader compacted its log comes
//! back through a snapshot install.

use std::collections::BTreeMap;
use std::time::Duration;

use cluster_tests::{wait_for, Cluster, Options, WithLogs};

use super::common::check_all_present;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopped_follower_catches_up_by_snapshot() {
    let opts = Options {
        snapshot_count: 50,
        snapshot_catchup_entries: 10,
        ..Options::default()
    };
    let c = Cluster::start(opts).await.expect("cluster starts");
    let leader = c.wait_leader().await;
    let follower = (leader + 1) % 3;
    c.kill(follower).await;
    let mut acked = BTreeMap::new();
    for n in 0..300 {
        let key = format!("/snap/{n:04}");
        c.put(leader, &key, "v").await.logs(&c).expect("write");
        acked.insert(key, "v".to_string());
    }
    c.restart_missing()
        .await
        .logs(&c)
        .expect("restart follower");
    check_all_present(&c, &[0, 1, 2], "/snap/", &acked).await;
    let installs = c
        .metric(follower, "rkube_raft_snapshot_installs")
        .await
        .unwrap_or(0.0);
    assert!(
        installs >= 1.0,
        "the follower caught up without installing a snapshot (installs = {installs})"
    );
    // Each member's history shows its snapshots: the follower's install, the leader's builds.
    for (member, kind) in [
        (follower, "raftSnapshotInstalled"),
        (leader, "raftSnapshotBuilt"),
    ] {
        let what = format!("member {member}'s history to show a {kind}");
        wait_for(&what, Duration::from_secs(30), || async {
            c.event_kinds(member)
                .await
                .filter(|kinds| kinds.iter().any(|k| k == kind))
        })
        .await;
    }
}
