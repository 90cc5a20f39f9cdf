//! Membership changes through the Cluster service while clients write: a learner joins, is
//! promoted once in sync, and is removed again.

use std::sync::Arc;
use std::time::Duration;

use cluster_tests::{wait_for, Cluster, ClusterClient, Options, WithLogs};
use rkube_store::proto::etcdserverpb as pb;

use super::common::{check_all_present, Writers};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn membership_three_to_four_to_three_under_writes() {
    let mut c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    c.wait_leader().await;
    let n4 = c.spawn_joiner("n4").expect("spawn n4");
    let peer = format!("https://{}", c.members[n4].peer);
    let c = Arc::new(c);
    let writers = Writers::start(&c, "/member", 2);
    writers.wait_count(20).await;

    let mut cluster = ClusterClient::new(c.channel(0));
    let added = cluster
        .member_add(pb::MemberAddRequest {
            peer_ur_ls: vec![peer],
            is_learner: true,
        })
        .await
        .logs(&c)
        .expect("member add")
        .into_inner();
    let id = added.member.expect("added member").id;
    assert_eq!(
        id,
        wait_for("n4 to record its id", Duration::from_secs(20), || async {
            Some(c.id_of(n4)).filter(|i| *i != 0)
        })
        .await
    );

    // Promotion is refused until the learner is in sync, then accepted.
    wait_for(
        "the learner to be promoted",
        Duration::from_secs(60),
        || async {
            ClusterClient::new(c.channel(1))
                .member_promote(pb::MemberPromoteRequest { id })
                .await
                .ok()
        },
    )
    .await;
    let list = cluster
        .member_list(pb::MemberListRequest { linearizable: true })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(
        list.members.iter().filter(|m| !m.is_learner).count(),
        4,
        "{list:?}"
    );
    let before = writers.count().await;
    writers.wait_count(before + 20).await;

    cluster
        .member_remove(pb::MemberRemoveRequest { id })
        .await
        .logs(&c)
        .expect("member remove");
    let list = cluster
        .member_list(pb::MemberListRequest { linearizable: true })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(list.members.len(), 3, "{list:?}");
    let before = writers.count().await;
    writers.wait_count(before + 20).await;
    let acked = writers.finish().await;
    check_all_present(&c, &[0, 1, 2], "/member", &acked).await;
}
