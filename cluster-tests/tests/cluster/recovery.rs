//! Quorum loss: the documented way back with the data of the one member that survived; members
//! that crash at a failpoint of their write path (`RKUBE_FAILPOINTS`) and come back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

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

/// How member `i`'s process (a child of the test, started by
/// [`Cluster::spawn_server_with_env`]) ended, once it has: the signal that ended it, if a signal
/// did.
fn exit_signal(c: &Cluster, i: usize) -> Option<Option<i32>> {
    let pid = c.pid(i)?;
    let mut status = 0;
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    (r == pid).then(|| libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)))
}

/// Writes unique keys under `prefix` through `leader` until member `i` has exited, and checks
/// that failpoint `point` ended it with SIGABRT and that its log names the point.
async fn write_until_crash(
    c: &Cluster,
    i: usize,
    point: &str,
    leader: usize,
    prefix: &str,
    acked: &mut BTreeMap<String, String>,
) {
    let name = &c.members[i].name;
    let deadline = Instant::now() + Duration::from_secs(120);
    let signal = loop {
        if let Some(signal) = exit_signal(c, i) {
            break signal;
        }
        assert!(
            Instant::now() < deadline,
            "{name} did not crash at {point} within 120 s\n{}",
            c.logs()
        );
        let key = format!("{prefix}{:04}", acked.len());
        c.put(leader, &key, "v")
            .await
            .logs(c)
            .expect("a write while a follower crashes");
        acked.insert(key, "v".into());
    };
    assert_eq!(
        signal,
        Some(libc::SIGABRT),
        "{name} did not abort at {point}\n{}",
        c.logs()
    );
    let log = std::fs::read_to_string(c.path().join(format!("{name}.log"))).unwrap_or_default();
    assert!(
        log.contains(&format!("failpoint {point}: aborting the process")),
        "{name}'s log does not name the failpoint\n{}",
        c.logs()
    );
}

/// Member `i` started again with `RKUBE_FAILPOINTS=<point>=return`.
fn restart_armed(c: &mut Cluster, i: usize, point: &str) {
    let armed = format!("{point}=return");
    c.spawn_server_with_env(i, &[0, 1, 2], "new", &[], &[("RKUBE_FAILPOINTS", &armed)])
        .expect("restart the member with the failpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_crashing_after_the_log_fsync_comes_back_with_every_write() {
    let point = rkube_store::failpoints::RAFT_LOG_AFTER_FSYNC;
    let mut c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    let leader = c.wait_leader().await;
    let follower = (leader + 1) % 3;
    let mut acked = BTreeMap::new();
    for n in 0..10 {
        let key = format!("/fp/before/{n:02}");
        c.put(n % 3, &key, "v").await.logs(&c).expect("put");
        acked.insert(key, "v".to_string());
    }
    // Nothing is left to send to the follower when it comes back.
    c.wait_converged(&[0, 1, 2]).await;

    // The follower comes back armed, and is in step with the others before the next write.
    c.kill(follower).await;
    restart_armed(&mut c, follower, point);
    c.wait_converged(&[0, 1, 2]).await;

    // Its next append is fsynced and then it dies before answering; the leader and the other
    // follower are a quorum, so writes are acknowledged all along.
    write_until_crash(&c, follower, point, leader, "/fp/crash/", &mut acked).await;
    let seen: BTreeMap<String, String> = c
        .local_keys(leader, "/fp/")
        .await
        .logs(&c)
        .expect("read")
        .into_iter()
        .collect();
    assert_eq!(
        seen, acked,
        "the leader does not have every acknowledged write"
    );

    // Started again without failpoints, it catches up and agrees with the others.
    c.spawn_server(follower, &[0, 1, 2], "new", &[])
        .expect("restart the follower");
    c.put(leader, "/fp/after", "v")
        .await
        .logs(&c)
        .expect("a write after the restart");
    acked.insert("/fp/after".into(), "v".into());
    super::common::check_all_present(&c, &[0, 1, 2], "/fp/", &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_crashing_in_apply_and_snapshot_build_comes_back_with_every_write() {
    use rkube_store::failpoints::{APPLY_AFTER, SNAPSHOT_BUILD_AFTER_SAVE};
    let mut c = Cluster::start(Options {
        snapshot_count: 50,
        snapshot_catchup_entries: 10,
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    let leader = c.wait_leader().await;
    let follower = (leader + 1) % 3;
    let mut acked = BTreeMap::new();
    c.kill(follower).await;
    // After an entry's transaction, before openraft hears of it; then once its own snapshot
    // file is in place (every 50 entries).
    for point in [APPLY_AFTER, SNAPSHOT_BUILD_AFTER_SAVE] {
        restart_armed(&mut c, follower, point);
        write_until_crash(&c, follower, point, leader, "/fp-sm/", &mut acked).await;
    }
    c.spawn_server(follower, &[0, 1, 2], "new", &[])
        .expect("restart the follower");
    super::common::check_all_present(&c, &[0, 1, 2], "/fp-sm/", &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_crashing_while_installing_a_snapshot_installs_it_on_restart() {
    use rkube_store::failpoints::{SNAPSHOT_INSTALL_AFTER, SNAPSHOT_INSTALL_BEFORE};
    let mut c = Cluster::start(Options {
        snapshot_count: 50,
        snapshot_catchup_entries: 10,
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    let leader = c.wait_leader().await;
    let follower = (leader + 1) % 3;
    c.kill(follower).await;
    // Far enough ahead that the leader's log no longer reaches back to the follower's.
    let mut acked = BTreeMap::new();
    for n in 0..200 {
        let key = format!("/fp-snap/{n:04}");
        c.put(leader, &key, "v").await.logs(&c).expect("write");
        acked.insert(key, "v".to_string());
    }

    // It crashes before the snapshot is written, then once it is in place, and catches up when
    // it starts without failpoints.
    for point in [SNAPSHOT_INSTALL_BEFORE, SNAPSHOT_INSTALL_AFTER] {
        restart_armed(&mut c, follower, point);
        write_until_crash(&c, follower, point, leader, "/fp-snap/more/", &mut acked).await;
    }
    c.spawn_server(follower, &[0, 1, 2], "new", &[])
        .expect("restart the follower");
    super::common::check_all_present(&c, &[0, 1, 2], "/fp-snap/", &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_failpoints_stop_the_server_from_starting() {
    let dir = tempfile::tempdir().expect("temp dir");
    let table = [
        ("raft-log-after-fsync", "is not POINT=ACTIONS"),
        (
            "raft-log-after-fsink=return",
            "there is no failpoint \"raft-log-after-fsink\"",
        ),
        (
            "apply-after=retrun",
            "cannot use \"retrun\" for apply-after",
        ),
    ];
    for (value, says) in table {
        let data = dir.path().join("n1");
        let run = tokio::process::Command::new(cluster_tests::rkube_bin())
            .arg("server")
            .args(["--name", "n1", "--data-dir"])
            .arg(&data)
            .args([
                "--listen-peer",
                "127.0.0.1:0",
                "--listen-client",
                "127.0.0.1:0",
            ])
            .args(["--initial-cluster", "n1=127.0.0.1:1"])
            .arg("--pki")
            .arg(dir.path().join("pki"))
            .env("RKUBE_FAILPOINTS", value)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .unwrap_or_else(|_| panic!("rkube server with RKUBE_FAILPOINTS={value} kept running"))
            .expect("rkube server runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "RKUBE_FAILPOINTS={value}: {stderr}"
        );
        assert!(
            stderr.contains("Error: RKUBE_FAILPOINTS: ") && stderr.contains(says),
            "RKUBE_FAILPOINTS={value}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!data.exists(), "the refused start made its data dir");
    }
}

/// `rkube recover ARGS`, which must succeed; what it printed.
fn rkube_recover(c: &Cluster, args: &[&std::ffi::OsStr]) -> String {
    let out = std::process::Command::new(cluster_tests::rkube_bin())
        .arg("recover")
        .args(args)
        .output()
        .expect("rkube runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "rkube recover failed:\n{text}\n{}",
        c.logs()
    );
    text
}

/// `rkube recover --dir`, as an operator runs it after losing members.
fn recover(c: &Cluster, yes: bool) -> String {
    let mut args = vec!["--dir".as_ref(), c.path().as_os_str()];
    if yes {
        args.push("--yes".as_ref());
    }
    rkube_recover(c, &args)
}

/// Writes /keep/NNN for each n of `range` through the members in turn, noting each
/// acknowledged write, and waits until all three have applied them.
async fn put_keys(
    c: &Cluster,
    acked: &mut BTreeMap<String, String>,
    range: std::ops::Range<usize>,
) {
    for n in range {
        let key = format!("/keep/{n:03}");
        c.put(n % 3, &key, "v").await.logs(c).expect("put");
        acked.insert(key, "v".to_string());
    }
    c.wait_converged(&[0, 1, 2]).await;
}

/// Three voters again, each holding every acknowledged write, and one keyspace.
async fn whole_again(c: &Cluster, acked: &BTreeMap<String, String>) {
    wait_for("three voters", Duration::from_secs(60), || async {
        let members = ClusterClient::new(c.channel(0))
            .member_list(pb::MemberListRequest { linearizable: true })
            .await
            .ok()?
            .into_inner()
            .members;
        (members.len() == 3 && members.iter().all(|m| !m.is_learner)).then_some(())
    })
    .await;
    let revision = c.wait_converged(&[0, 1, 2]).await;
    let mut hashes = std::collections::BTreeSet::new();
    for i in 0..3 {
        let keys: BTreeMap<String, String> = c
            .local_keys(i, "/keep/")
            .await
            .logs(c)
            .expect("read")
            .into_iter()
            .collect();
        assert_eq!(
            &keys, acked,
            "member {} is missing writes",
            c.members[i].name
        );
        hashes.insert(c.hash_kv(i, revision).await.expect("hash"));
    }
    assert_eq!(hashes.len(), 1, "members disagree on the keyspace");
}

/// Guided recovery: `rkube recover` reads the stopped members' data dirs, shows each one's
/// Raft state, and carries out the plan with --yes — starting the members that still hold a
/// quorum's data and replacing the one whose data is gone, or, when too few hold data, keeping
/// the most up-to-date member as a new cluster and adding the others back. Every acknowledged
/// write survives both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rkube_recover_brings_back_three_voters_with_every_acknowledged_write() {
    let c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    c.wait_leader().await;
    let mut acked = BTreeMap::new();
    put_keys(&c, &mut acked, 0..40).await;

    // Two members killed, one of them with its data gone.
    c.kill(1).await;
    c.kill(2).await;
    std::fs::remove_dir_all(c.path().join(&c.members[2].name)).expect("delete n3's data");
    let plan = recover(&c, false);
    assert!(plan.contains("n1       running"), "{plan}");
    assert!(plan.contains("n2       stopped"), "{plan}");
    assert!(plan.contains("n3       data lost"), "{plan}");
    assert!(plan.contains("a quorum, so no forced recovery"), "{plan}");
    assert!(plan.contains("1. start n2 from its data dir"), "{plan}");
    assert!(plan.contains("2. replace n3"), "{plan}");
    assert!(plan.contains("Run again with --yes"), "{plan}");
    assert!(c.status(1).await.is_none(), "the dry run started a member");
    // On hosts: the data dirs given are compared and the steps printed.
    let n2 = c.path().join(&c.members[1].name);
    let said = rkube_recover(&c, &["--data-dir".as_ref(), n2.as_os_str()]);
    assert!(said.contains("Keep n2 (the most up to date"), "{said}");
    assert!(said.contains("--force-new-cluster"), "{said}");
    let done = recover(&c, true);
    assert!(done.contains("promoted n3 to voter"), "{done}");
    whole_again(&c, &acked).await;

    // Now two members' data gone for good: n1 alone holds it.
    put_keys(&c, &mut acked, 40..60).await;
    c.kill(1).await;
    c.kill(2).await;
    for i in [1, 2] {
        std::fs::remove_dir_all(c.path().join(&c.members[i].name)).expect("delete data");
    }
    let done = recover(&c, true);
    assert!(done.contains("stopped n1"), "{done}");
    assert!(done.contains("Keep n1 (the most up to date"), "{done}");
    assert!(done.contains("--force-new-cluster"), "{done}");
    whole_again(&c, &acked).await;
    let leader = c.wait_leader().await;
    c.put(leader, "/after", "v")
        .await
        .logs(&c)
        .expect("a write after recovery");
}
