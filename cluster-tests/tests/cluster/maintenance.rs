//! The Maintenance service as an operator meets it: the space quota and its NOSPACE alarm.

use std::time::Duration;

use cluster_tests::{wait_for, Cluster, MaintenanceClient, Options, WithLogs};
use rkube_store::proto::etcdserverpb as pb;

const NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";

async fn alarms(c: &Cluster, i: usize) -> Vec<pb::AlarmMember> {
    MaintenanceClient::new(c.channel(i))
        .alarm(pb::AlarmRequest {
            action: pb::alarm_request::AlarmAction::Get as i32,
            member_id: 0,
            alarm: pb::AlarmType::None as i32,
        })
        .await
        .logs(c)
        .expect("alarm list")
        .into_inner()
        .alarms
}

async fn disarm(c: &Cluster, i: usize, alarm: &pb::AlarmMember) -> Vec<pb::AlarmMember> {
    MaintenanceClient::new(c.channel(i))
        .alarm(pb::AlarmRequest {
            action: pb::alarm_request::AlarmAction::Deactivate as i32,
            member_id: alarm.member_id,
            alarm: alarm.alarm,
        })
        .await
        .logs(c)
        .expect("alarm disarm")
        .into_inner()
        .alarms
}

/// A put refused for lack of space, with etcd's code and message.
fn assert_no_space(result: Result<i64, tonic::Status>) {
    match result {
        Err(s) => {
            assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
            assert_eq!(s.message(), NO_SPACE);
        }
        Ok(rev) => panic!("a write past the quota was accepted (revision {rev})"),
    }
}

/// The alarms once all three members list the same, non-empty set.
async fn agreed_alarms(c: &Cluster) -> Vec<pb::AlarmMember> {
    wait_for(
        "every member to list the same alarms",
        Duration::from_secs(30),
        || async {
            let first = alarms(c, 0).await;
            let mut same = !first.is_empty();
            for i in 1..3 {
                same &= alarms(c, i).await == first;
            }
            same.then_some(first)
        },
    )
    .await
}

/// Disarms through member `i` whatever it lists until it lists nothing (a member whose
/// database passed the quota just after the others may have raised one more).
async fn disarm_all(c: &Cluster, i: usize) {
    wait_for("every alarm disarmed", Duration::from_secs(30), || async {
        let listed = alarms(c, i).await;
        for alarm in &listed {
            disarm(c, i, alarm).await;
        }
        listed.is_empty().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_alarm_refuses_writes_until_space_is_freed_and_it_is_disarmed() {
    let c = Cluster::start(Options {
        up_args: vec!["--quota-backend-bytes".into(), "300000".into()],
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;

    // Fill the database through member 0 until the quota stops it.
    let value = "x".repeat(8 * 1024);
    let mut written = 0;
    let refusal = wait_for(
        "the quota to refuse a write",
        Duration::from_secs(120),
        || {
            written += 1;
            let key = format!("/fill/{written:05}");
            let (c, value) = (&c, &value);
            async move { c.put(0, &key, value).await.err() }
        },
    )
    .await;
    assert_eq!(
        refusal.code(),
        tonic::Code::ResourceExhausted,
        "{refusal:?}"
    );
    assert_eq!(refusal.message(), NO_SPACE);

    // The alarm went through the log: every member lists it and refuses writes. Whose alarm
    // it is depends on which database passed the quota first (each member checks its own, and
    // the member that took the write need not be the one that raised it); another member may
    // raise its own a moment later, so the test waits until all three list the same.
    let raised = agreed_alarms(&c).await;
    assert!(
        raised
            .iter()
            .all(|a| a.alarm == pb::AlarmType::Nospace as i32),
        "{raised:?}"
    );
    for i in 0..3 {
        assert_no_space(c.put(i, "/more", "v").await);
    }
    for i in 0..3 {
        let status = c.status(i).await.expect("status");
        for alarm in &raised {
            let line = format!("memberID:{} alarm:NOSPACE", alarm.member_id);
            assert!(status.errors.contains(&line), "{:?}", status.errors);
        }
    }
    let mut lease = cluster_tests::LeaseClient::new(c.channel(1));
    let grant = lease
        .lease_grant(pb::LeaseGrantRequest { ttl: 60, id: 0 })
        .await;
    assert_eq!(grant.expect_err("lease grant refused").message(), NO_SPACE);

    // Reads, deletes and compaction still work.
    let keys = c.local_keys(1, "/fill/").await.expect("read");
    assert!(keys.len() >= 10, "only {} keys written", keys.len());
    let mut kv = c.kv(1);
    let deleted = kv
        .delete_range(pb::DeleteRangeRequest {
            key: b"/fill/".to_vec(),
            range_end: rkube_store::mvcc::prefix_end(b"/fill/"),
            ..Default::default()
        })
        .await
        .logs(&c)
        .expect("delete under NOSPACE")
        .into_inner();
    assert_eq!(deleted.deleted as usize, keys.len());
    let revision = deleted.header.map_or(0, |h| h.revision);
    kv.compact(pb::CompactionRequest {
        revision,
        physical: true,
    })
    .await
    .logs(&c)
    .expect("compaction under NOSPACE");

    // Disarming while the database is still past the quota: the next write raises it again.
    for alarm in &raised {
        assert_eq!(disarm(&c, 1, alarm).await, [*alarm]);
    }
    disarm_all(&c, 1).await;
    let mut more = 0;
    let refusal = wait_for(
        "the quota to refuse a write again",
        Duration::from_secs(60),
        || {
            more += 1;
            let key = format!("/again/{more:05}");
            let (c, value) = (&c, &value);
            async move { c.put(0, &key, value).await.err() }
        },
    )
    .await;
    assert_eq!(refusal.message(), NO_SPACE);
    let again = agreed_alarms(&c).await;

    // Restart the members with a larger quota: the alarm survived the restart, and once it is
    // disarmed writes are accepted again.
    for i in 0..3 {
        c.kill(i).await;
    }
    c.restart_missing_with(&["--quota-backend-bytes", "1073741824"])
        .await
        .logs(&c)
        .expect("restart with a larger quota");
    c.wait_leader().await;
    let kept = alarms(&c, 0).await;
    assert!(
        again.iter().all(|a| kept.contains(a)),
        "alarms before the restart {again:?}, after {kept:?}"
    );
    assert_no_space(c.put(0, "/still", "v").await);
    for alarm in &again {
        assert_eq!(disarm(&c, 2, alarm).await, [*alarm]);
    }
    disarm_all(&c, 2).await;
    for i in 0..3 {
        wait_for(
            "the disarm to reach every member",
            Duration::from_secs(10),
            || async { alarms(&c, i).await.is_empty().then_some(()) },
        )
        .await;
    }
    c.put(0, "/after", "v")
        .await
        .logs(&c)
        .expect("a write after the alarm is disarmed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_hands_leadership_to_the_chosen_voter() {
    let c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    let mut leader = c.wait_leader().await;
    let mut revision = 0;
    // Around the ring: each follower in turn, asked through a member that is not the leader.
    for _ in 0..3 {
        let to = (leader + 1) % 3;
        let via = (leader + 2) % 3;
        let target_id = c.id_of(to);
        let moved = MaintenanceClient::new(c.channel(via))
            .move_leader(pb::MoveLeaderRequest { target_id })
            .await
            .logs(&c)
            .expect("move-leader");
        assert!(moved.into_inner().header.is_some());
        let status = c.status(via).await.expect("status");
        assert_eq!(status.leader, target_id, "the leadership went elsewhere");
        leader = to;
        let rev = c
            .put(via, &format!("/moved/{to}"), "v")
            .await
            .logs(&c)
            .expect("a write under the new leader");
        assert!(rev > revision);
        revision = rev;
    }
    // Moving to itself changes nothing; a member that is not a voter is refused as etcd does.
    let me = c.id_of(leader);
    MaintenanceClient::new(c.channel(leader))
        .move_leader(pb::MoveLeaderRequest { target_id: me })
        .await
        .expect("move to the leader itself");
    assert_eq!(c.status(0).await.expect("status").leader, me);
    let refused = MaintenanceClient::new(c.channel(0))
        .move_leader(pb::MoveLeaderRequest { target_id: 42 })
        .await
        .expect_err("an unknown transferee is refused");
    assert_eq!(refused.message(), "etcdserver: bad leader transferee");
}

/// `etcdctl alarm`, `defrag` and `move-leader`, with only DIR/env, checked by their output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_alarm_defrag_and_move_leader() {
    let c = Cluster::start(Options {
        up_args: vec!["--quota-backend-bytes".into(), "200000".into()],
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    let leader = c.wait_leader().await;
    let etcdctl = c.etcdctl();
    assert_eq!(etcdctl.ok(&["alarm", "list"]).await, "");

    // `--cluster` reaches the client URLs members publish once they have joined.
    wait_for(
        "every member's client URL",
        Duration::from_secs(30),
        || async {
            let list = etcdctl.ok(&["member", "list"]).await;
            c.members
                .iter()
                .all(|m| list.contains(&format!("https://{}", m.client)))
                .then_some(())
        },
    )
    .await;
    let defrag = etcdctl.ok(&["defrag", "--cluster"]).await;
    for m in &c.members {
        assert!(
            defrag.contains(&format!(
                "Finished defragmenting etcd member[https://{}]",
                m.client
            )),
            "{defrag}"
        );
    }

    let to = (leader + 1) % 3;
    let moved = etcdctl
        .ok(&["move-leader", &format!("{:x}", c.id_of(to))])
        .await;
    assert_eq!(
        moved.trim(),
        format!(
            "Leadership transferred from {:x} to {:x}",
            c.id_of(leader),
            c.id_of(to)
        )
    );
    assert_eq!(c.status(leader).await.expect("status").leader, c.id_of(to));
    let refused = etcdctl.run(&["move-leader", "2a"]).await;
    assert!(!refused.success, "{refused:?}");
    assert_eq!(
        refused.error(),
        Some("etcdserver: bad leader transferee"),
        "{refused:?}"
    );

    // Fill the store through one member until the quota refuses a write.
    let member = etcdctl.with_endpoint(&format!("https://{}", c.members[0].client));
    let value = "x".repeat(16 * 1024);
    let mut n = 0;
    let refusal = loop {
        n += 1;
        assert!(n < 1000, "the quota never refused a write");
        let out = member.run(&["put", &format!("/fill/{n}"), &value]).await;
        if !out.success {
            break out;
        }
    };
    assert_eq!(refusal.error(), Some(NO_SPACE), "{refusal:?}");
    let alarm = format!("memberID:{} alarm:NOSPACE", c.id_of(0));
    let listed = etcdctl.ok(&["alarm", "list"]).await;
    assert!(listed.lines().any(|l| l.trim() == alarm), "{listed}");
    let status = etcdctl.ok(&["endpoint", "status", "--cluster"]).await;
    assert!(status.contains(&alarm), "{status}");
    etcdctl.ok(&["del", "--prefix", "/fill/"]).await;
    let disarmed = etcdctl.ok(&["alarm", "disarm"]).await;
    assert!(disarmed.lines().any(|l| l.trim() == alarm), "{disarmed}");
}
