//! Quorum loss: the documented way back with the data of the one member that survived.

use std::collections::BTreeMap;
use std::time::Duration;

use cluster_tests::{wait_for, Cluster, ClusterClient, Options, WithLogs};
use rkube_store::proto::etcdserverpb as pb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_new_cluster_brings_back_a_cluster_from_its_last_member() {
    let mut c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    c.wait_leader().await;
    let mut acked = BTreeMap::new();
    for n in 0..50 {
        let key = format!("/keep/{n:03}");
        c.put(n % 3, &key, "v").await.logs(&c).expect("put");
        acked.insert(key, "v".to_string());
    }
    let revision = c.wait_converged(&[0, 1, 2]).await;

    // Two of three are lost for good; the survivor alone cannot commit.
    c.kill(1).await;
    c.kill(2).await;
    let refused = c.put(0, "/lost", "v").await;
    assert!(refused.is_err(), "a write without quorum was acknowledged");

    // The survivor restarts as a new one-member cluster with its data.
    c.kill(0).await;
    c.spawn_server(0, &[0], "new", &["--force-new-cluster"])
        .expect("start n1 with --force-new-cluster");
    wait_for("n1 to lead alone", Duration::from_secs(30), || async {
        let s = c.status(0).await?;
        (s.leader != 0 && s.leader == s.header?.member_id).then_some(())
    })
    .await;
    let keys: BTreeMap<String, String> = c
        .local_keys(0, "/keep/")
        .await
        .logs(&c)
        .expect("read")
        .into_iter()
        .collect();
    assert_eq!(keys, acked, "the forced cluster lost acknowledged writes");
    let after = c.put(0, "/after", "v").await.logs(&c).expect("write");
    assert!(
        after > revision,
        "revisions went back: {after} <= {revision}"
    );
    acked.insert("/after".into(), "v".into());
    let members = ClusterClient::new(c.channel(0))
        .member_list(pb::MemberListRequest { linearizable: true })
        .await
        .expect("member list")
        .into_inner()
        .members;
    assert_eq!(members.len(), 1, "{members:?}");

    // The lost members come back as new ones with empty data dirs, and catch up on everything
    // from before the recovery (none of which is in the new log).
    for i in [1, 2] {
        std::fs::remove_dir_all(c.path().join(&c.members[i].name)).expect("wipe data dir");
        let peer = format!("https://{}", c.members[i].peer);
        let id = ClusterClient::new(c.channel(0))
            .member_add(pb::MemberAddRequest {
                peer_ur_ls: vec![peer],
                is_learner: true,
            })
            .await
            .logs(&c)
            .expect("member add")
            .into_inner()
            .member
            .expect("the added member")
            .id;
        let initial: Vec<usize> = (0..=i).collect();
        c.spawn_server(i, &initial, "existing", &[])
            .expect("start the member again");
        wait_for(
            "the learner to be promoted",
            Duration::from_secs(60),
            || async {
                ClusterClient::new(c.channel(0))
                    .member_promote(pb::MemberPromoteRequest { id })
                    .await
                    .ok()
            },
        )
        .await;
        c.wait_converged(&(0..=i).collect::<Vec<_>>()).await;
    }
    let revision = c.wait_converged(&[0, 1, 2]).await;
    let mut hashes = std::collections::BTreeSet::new();
    for i in 0..3 {
        let keys: BTreeMap<String, String> = c
            .local_keys(i, "/")
            .await
            .logs(&c)
            .expect("read")
            .into_iter()
            .filter(|(k, _)| k.starts_with("/keep/") || k == "/after")
            .collect();
        assert_eq!(
            keys, acked,
            "member {} is missing writes",
            c.members[i].name
        );
        hashes.insert(c.hash_kv(i, revision).await.expect("hash"));
    }
    assert_eq!(hashes.len(), 1, "members disagree on the keyspace");

    // The cluster has a quorum of three again: it survives losing one.
    c.kill(0).await;
    let leader = c.wait_new_leader(0).await;
    c.put(leader, "/survived", "v")
        .await
        .logs(&c)
        .expect("a write after losing the old survivor");
}
