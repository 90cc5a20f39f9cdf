//! rkube's own backups: `rkube snapshot save`/`status` and a restore into a new cluster, and the
//! scheduled snapshots the leader takes, rotates and lists. Snapshots exchanged with etcd's
//! tools are in `snapshots`.

use std::collections::BTreeMap;
use std::time::Duration;

use cluster_tests::{wait_for, Cluster, Options, WithLogs};

use super::common::check_all_present;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_save_and_restore_into_a_new_cluster_keeps_every_key() {
    let c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    let leader = c.wait_leader().await;
    let mut acked = BTreeMap::new();
    for n in 0..30 {
        let key = format!("/registry/configmaps/default/cm{n:02}");
        c.put(n % 3, &key, &format!("v{n}"))
            .await
            .logs(&c)
            .expect("write");
        acked.insert(key, format!("v{n}"));
    }
    let file = c.path().join("backup.snap");
    let rkube = |args: &[&str]| {
        let out = std::process::Command::new(cluster_tests::rkube_bin())
            .args(args)
            .output()
            .expect("rkube runs");
        assert!(
            out.status.success(),
            "rkube {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let dir = c.path().to_string_lossy().into_owned();
    let file_s = file.to_string_lossy().into_owned();
    rkube(&["snapshot", "save", &file_s, "--dir", &dir]);
    let status: serde_json::Value =
        serde_json::from_str(&rkube(&["snapshot", "status", &file_s, "-o", "json"])).expect("json");
    let revision = status["revision"].as_i64().expect("revision");
    assert_eq!(status["totalKey"].as_u64(), Some(30));
    assert_eq!(
        status["hash"].as_u64().map(|h| h as u32),
        c.hash_kv(leader, revision).await,
        "snapshot hash != HashKV"
    );

    let restored = Cluster::start(Options {
        restore: Some(file.clone()),
        ..Options::default()
    })
    .await
    .expect("restored cluster");
    restored.wait_leader().await;
    check_all_present(&restored, &[0, 1, 2], "/registry/", &acked).await;
    let rev = restored
        .put(0, "/registry/configmaps/default/after", "x")
        .await
        .expect("write to the restored cluster");
    assert!(
        rev > revision + 1_000_000 - 1,
        "the restored cluster did not bump its revision ({rev})"
    );
}

/// Runs the rkube CLI and returns its standard output; fails the test if it fails.
fn rkube_cli(args: &[&str]) -> String {
    let out = std::process::Command::new(cluster_tests::rkube_bin())
        .args(args)
        .output()
        .expect("rkube runs");
    assert!(
        out.status.success(),
        "rkube {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_snapshots_are_taken_by_the_leader_rotated_and_restorable() {
    let c = Cluster::start(Options {
        up_args: ["--snapshot-interval", "1s", "--snapshot-retain", "2"]
            .map(String::from)
            .to_vec(),
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    // Files of the operator's own beside the snapshots: retention must leave them alone.
    for i in 0..3 {
        std::fs::write(c.snapshot_dir(i).join("notes.txt"), b"mine").expect("own file");
    }
    let mut last = 0;
    for n in 0..20 {
        let rev = c
            .put(n % 3, &format!("/registry/secrets/default/s{n:02}"), "x")
            .await
            .logs(&c)
            .expect("write");
        last = last.max(rev);
    }

    wait_for(
        "a scheduled snapshot on the leader that covers every write",
        Duration::from_secs(30),
        || async {
            let l = c.leader().await?;
            let newest = c.scheduled_snapshots(l).into_iter().next()?;
            (newest.revision >= last).then_some(())
        },
    )
    .await;

    // A window in which one leader, in one term, takes three more snapshots: the followers'
    // dirs must not change in it, and retention must delete the leader's older files.
    let taken = "rkube_scheduled_snapshots_total";
    let (leader, first, followers, before, after) = wait_for(
        "three more snapshots under one stable leader",
        Duration::from_secs(90),
        || async {
            let l = c.leader().await?;
            let term = c.status(l).await?.raft_term;
            let followers: Vec<usize> = (0..c.members.len()).filter(|&i| i != l).collect();
            let before: Vec<_> = followers
                .iter()
                .map(|&f| c.scheduled_snapshots(f))
                .collect();
            let first = c.scheduled_snapshots(l).into_iter().next()?;
            let count = c.metric(l, taken).await?;
            wait_for(
                "the leader's next three snapshots (or a leader change)",
                Duration::from_secs(30),
                || async {
                    if c.leader().await != Some(l) {
                        return Some(());
                    }
                    (c.metric(l, taken).await? >= count + 3.0).then_some(())
                },
            )
            .await;
            let stable = c.leader().await == Some(l) && c.status(l).await?.raft_term == term;
            let after: Vec<_> = followers
                .iter()
                .map(|&f| c.scheduled_snapshots(f))
                .collect();
            stable.then_some((l, first, followers, before, after))
        },
    )
    .await;
    for (k, &f) in followers.iter().enumerate() {
        let name = &c.members[f].name;
        assert_eq!(
            before[k], after[k],
            "follower {name} took snapshots while {} was leader",
            c.members[leader].name
        );
        // A member that has seen one leader only, the current one, was never leader itself.
        if c.metric(f, "rkube_raft_leader_changes_total").await == Some(1.0) {
            assert!(
                after[k].is_empty(),
                "follower {name} has snapshots: {after:?}"
            );
            assert_eq!(c.metric(f, taken).await, Some(0.0), "follower {name}");
        }
    }
    assert!(
        !c.snapshot_dir(leader).join(&first.file).exists(),
        "{} was not deleted after two newer snapshots (retain 2)",
        first.file
    );
    // Between a new file's rename and the deletion of the oldest there can be three.
    let kept = wait_for(
        "retention to keep two files",
        Duration::from_secs(10),
        || {
            let kept = c.scheduled_snapshots(leader);
            async move { (kept.len() == 2).then_some(kept) }
        },
    )
    .await;
    assert_eq!(
        c.metric(leader, "rkube_scheduled_snapshot_failures_total")
            .await,
        Some(0.0)
    );
    for i in 0..3 {
        assert!(
            c.snapshot_dir(i).join("notes.txt").exists(),
            "retention deleted a file that is not a snapshot"
        );
    }

    // The leader dies; the new one goes on taking snapshots into its own dir.
    c.kill(leader).await;
    let old = c.scheduled_snapshots(leader);
    let new_leader = c.wait_new_leader(leader).await;
    wait_for(
        "a snapshot from the new leader",
        Duration::from_secs(30),
        || async { c.scheduled_snapshots(new_leader).first().map(|_| ()) },
    )
    .await;
    assert!(
        old.first() >= kept.first(),
        "the old leader's newest file went away: {old:?}"
    );

    // A damaged file with a snapshot's name is reported in the listing, which goes on.
    let bad = "rkube-snapshot-20000101T000000.000Z-rev1.snap";
    std::fs::write(c.snapshot_dir(leader).join(bad), b"RKUBE-SNAPSHOT\ngarbage")
        .expect("damaged file");
    let dir = c.path().to_string_lossy().into_owned();
    let listed: serde_json::Value = serde_json::from_str(&rkube_cli(&[
        "snapshot", "list", "--dir", &dir, "-o", "json",
    ]))
    .expect("json");
    let listed = listed.as_array().expect("a list");
    let old_name = &c.members[leader].name;
    let of_old: Vec<&serde_json::Value> = listed
        .iter()
        .filter(|e| e["member"].as_str() == Some(old_name))
        .collect();
    let files: Vec<&str> = of_old.iter().filter_map(|e| e["file"].as_str()).collect();
    let mut want: Vec<&str> = old.iter().map(|n| n.file.as_str()).collect();
    want.push(bad);
    assert_eq!(files, want, "the old leader's files, newest first");
    assert!(of_old[..old.len()].iter().all(|e| e["error"].is_null()));
    assert!(
        of_old[old.len()]["error"]
            .as_str()
            .is_some_and(|e| e.contains("truncated or corrupted")),
        "{:?}",
        of_old[old.len()]
    );
    assert!(listed
        .iter()
        .any(|e| e["member"].as_str() == Some(&c.members[new_leader].name)));
    let table = rkube_cli(&[
        "snapshot",
        "list",
        &c.snapshot_dir(leader).to_string_lossy(),
    ]);
    assert!(
        old.iter().all(|n| table.contains(&n.file)),
        "rkube snapshot list DIR does not name the snapshots:\n{table}"
    );

    // The newest is an ordinary backup file: status reads it, restore builds a data dir from it.
    let newest = c.snapshot_dir(leader).join(&old[0].file);
    let newest = newest.to_string_lossy();
    let status: serde_json::Value =
        serde_json::from_str(&rkube_cli(&["snapshot", "status", &newest, "-o", "json"]))
            .expect("json");
    assert_eq!(status["revision"].as_i64(), Some(last), "{status}");
    assert_eq!(status["totalKey"].as_u64(), Some(20), "{status}");
    let restored = c.path().join("restored");
    let out = rkube_cli(&[
        "snapshot",
        "restore",
        &newest,
        "--data-dir",
        &restored.to_string_lossy(),
    ]);
    assert!(
        out.contains(&format!("restored 20 keys at revision {last}")),
        "{out}"
    );
}
