//! Snapshots that etcd's own tools read, both ways: a snapshot `etcdctl snapshot save` took from
//! rkube is checked by `etcdctl snapshot status` and restored into a real etcd 3.4 (Debian's
//! `etcd-server`), and one it took from that etcd is restored into rkube; either way the keys,
//! values, create/mod revisions, versions and the lease come back. A damaged file is refused.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use cluster_tests::{exclusive_ports, rkube_bin, wait_for, Cluster, Etcdctl, Options};

use super::common::{b64, json};

/// TTL of the story's lease: long enough to outlive the test.
const LEASE_TTL: i64 = 600;

/// What a store holds after the story: `get --prefix /story/ -w json` and the lease.
#[derive(Debug)]
struct Seen {
    /// The kvs (key, value, create/mod revisions, version, lease), as etcdctl prints them.
    kvs: serde_json::Value,
    revision: i64,
    lease: String,
}

/// Several revisions of a key, a deleted key, a key attached to a lease, and a compaction, in
/// the same commands against rkube and etcd.
async fn write_story(etcdctl: &Etcdctl) -> String {
    for v in ["v1", "v2", "v3"] {
        etcdctl.ok(&["put", "/story/a", v]).await;
    }
    etcdctl.ok(&["put", "/story/b", "short-lived"]).await;
    etcdctl.ok(&["put", "/story/c", "c1"]).await;
    let compact_at = json(&etcdctl.ok(&["get", "/story/c", "-w", "json"]).await)["header"]
        ["revision"]
        .as_i64()
        .expect("revision");
    etcdctl.ok(&["del", "/story/b"]).await;
    let granted = etcdctl
        .ok(&["lease", "grant", &LEASE_TTL.to_string()])
        .await;
    // "lease 694d7c... granted with TTL(600s)"
    let lease = granted
        .split_whitespace()
        .nth(1)
        .expect("a lease id")
        .to_string();
    etcdctl
        .ok(&["put", "/story/leased", "x", "--lease", &lease])
        .await;
    etcdctl
        .ok(&["compaction", &(compact_at - 1).to_string()])
        .await;
    etcdctl.ok(&["put", "/story/c", "c2"]).await;
    lease
}

async fn seen(etcdctl: &Etcdctl, lease: &str) -> Seen {
    let got = json(
        &etcdctl
            .ok(&["get", "--prefix", "/story/", "-w", "json"])
            .await,
    );
    Seen {
        kvs: got["kvs"].clone(),
        revision: got["header"]["revision"].as_i64().expect("revision"),
        lease: lease.to_string(),
    }
}

/// The same keys with the same values, revisions and versions, the same revision, and the
/// lease still there with its key.
async fn assert_same(what: &str, etcdctl: &Etcdctl, before: &Seen, same_revision: bool) {
    let after = seen(etcdctl, &before.lease).await;
    assert_eq!(after.kvs, before.kvs, "{what}: keys");
    assert_eq!(
        before.kvs.as_array().map(Vec::len),
        Some(3),
        "{what}: a, c and leased"
    );
    if same_revision {
        assert_eq!(after.revision, before.revision, "{what}: revision");
    }
    let leases = etcdctl.ok(&["lease", "list"]).await;
    assert!(
        leases.lines().any(|l| l.trim() == before.lease),
        "{what}: lease {} missing from:\n{leases}",
        before.lease
    );
    let ttl = json(
        &etcdctl
            .ok(&["lease", "timetolive", &before.lease, "--keys", "-w", "json"])
            .await,
    );
    // etcdctl 3.4 writes this field with a hyphen.
    assert_eq!(
        ttl["granted-ttl"].as_i64(),
        Some(LEASE_TTL),
        "{what}: {ttl}"
    );
    assert_eq!(
        ttl["keys"],
        serde_json::json!([b64("/story/leased")]),
        "{what}: {ttl}"
    );
}

/// A real etcd 3.4 of one member on loopback ports; killed when dropped.
struct Etcd {
    child: std::process::Child,
    etcdctl: Etcdctl,
    peer_url: String,
    log: PathBuf,
}

impl Etcd {
    /// Starts etcd on `data_dir` (a new one, or one `etcdctl snapshot restore` made for the
    /// same name and peer URL) and waits until it answers.
    async fn start(dir: &Path, data_dir: &Path, base_port: u16) -> Etcd {
        let client = format!("http://127.0.0.1:{base_port}");
        let peer_url = format!("http://127.0.0.1:{}", base_port + 1);
        let log = dir.join("etcd.log");
        let out = std::fs::File::create(&log).expect("etcd log");
        let child = std::process::Command::new("etcd")
            .args(["--name", "e1"])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("e1={peer_url}")])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("etcd runs (Debian package etcd-server; .ci/run installs it)");
        let env = dir.join("etcd.env");
        std::fs::write(&env, format!("export ETCDCTL_ENDPOINTS={client}\n")).expect("env");
        let etcd = Etcd {
            child,
            etcdctl: Etcdctl::from_env_file(&env).expect("env file"),
            peer_url,
            log,
        };
        wait_for("etcd to answer", Duration::from_secs(60), || async {
            etcd.etcdctl
                .run(&["endpoint", "health"])
                .await
                .success
                .then_some(())
        })
        .await;
        etcd
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs rkube and returns what it printed; `ok` says whether it must succeed or fail.
fn rkube(args: &[&str], ok: bool) -> String {
    let out = std::process::Command::new(rkube_bin())
        .args(args)
        .output()
        .expect("rkube runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.success(),
        ok,
        "rkube {args:?}:\n{stdout}{stderr}"
    );
    if ok {
        stdout
    } else {
        stderr
    }
}

/// `etcdctl snapshot status -w json`.
async fn etcdctl_status(etcdctl: &Etcdctl, file: &str) -> serde_json::Value {
    json(
        &etcdctl
            .ok(&["snapshot", "status", file, "-w", "json"])
            .await,
    )
}

/// Flips one byte in the middle of `file` into `damaged`.
fn damage(file: &Path, damaged: &Path) {
    let mut bytes = std::fs::read(file).expect("snapshot");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    std::fs::write(damaged, bytes).expect("damaged copy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restores_a_snapshot_etcdctl_saved_from_rkube() {
    let c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    c.wait_leader().await;
    let etcdctl = c.etcdctl();
    let lease = write_story(&etcdctl).await;
    let before = seen(&etcdctl, &lease).await;

    // etcdctl takes a snapshot from one member, as it does from an etcd member.
    let work = tempfile::tempdir().expect("tempdir");
    let file = work.path().join("from-rkube.db");
    let file_s = file.to_string_lossy().into_owned();
    let one = etcdctl.with_endpoint(&etcdctl.endpoints()[0]);
    one.ok(&["snapshot", "save", &file_s]).await;
    let status = etcdctl_status(&one, &file_s).await;
    assert_eq!(
        status["revision"].as_i64(),
        Some(before.revision),
        "{status}"
    );
    // rkube reads the same file and reports what etcdctl does.
    let ours = json(&rkube(&["snapshot", "status", &file_s, "-o", "json"], true));
    assert_eq!(ours["etcd"], status, "rkube snapshot status vs etcdctl");
    assert_eq!(ours["format"], "etcd");
    assert_eq!(ours["revision"].as_i64(), Some(before.revision));
    assert_eq!(ours["totalKey"].as_u64(), Some(3), "live keys: {ours}");
    drop(c);

    // A damaged copy: etcdctl refuses it by its SHA-256, as rkube does.
    let damaged = work.path().join("damaged.db");
    damage(&file, &damaged);
    let damaged_s = damaged.to_string_lossy().into_owned();
    let (_turn, port) = exclusive_ports(1);
    let etcd_dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        etcd_dir.path().join("plain.env"),
        format!("export ETCDCTL_ENDPOINTS=http://127.0.0.1:{port}\n"),
    )
    .expect("env");
    let plain = Etcdctl::from_env_file(&etcd_dir.path().join("plain.env")).expect("env");
    let peer = format!("http://127.0.0.1:{}", port + 1);
    let restore = |from: String, into: PathBuf| {
        let plain = plain.clone();
        let peer = peer.clone();
        async move {
            plain
                .run(&[
                    "snapshot",
                    "restore",
                    &from,
                    "--data-dir",
                    &into.to_string_lossy(),
                    "--name",
                    "e1",
                    "--initial-cluster",
                    &format!("e1={peer}"),
                    "--initial-advertise-peer-urls",
                    &peer,
                ])
                .await
        }
    };
    let refused = restore(damaged_s.clone(), etcd_dir.path().join("bad")).await;
    assert!(!refused.success, "etcdctl restored a damaged file");
    assert!(
        refused.stderr.contains("sha256"),
        "etcdctl's refusal: {}",
        refused.stderr
    );
    let err = rkube(
        &[
            "snapshot",
            "restore",
            &damaged_s,
            "--data-dir",
            &etcd_dir.path().join("bad-rkube").to_string_lossy(),
        ],
        false,
    );
    assert!(err.contains("SHA-256"), "{err}");

    // The real one restores, and etcd serves from it what rkube served.
    let data = etcd_dir.path().join("restored");
    let restored = restore(file_s.clone(), data.clone()).await;
    assert!(restored.success, "etcdctl snapshot restore: {restored:?}");
    let etcd = Etcd::start(etcd_dir.path(), &data, port).await;
    assert_eq!(etcd.peer_url, peer);
    assert_same("etcd restored from rkube", &etcd.etcdctl, &before, true).await;
    // etcd goes on from there: the next write gets the next revision.
    let next = json(
        &etcd
            .etcdctl
            .ok(&["put", "/story/d", "d", "-w", "json"])
            .await,
    );
    assert_eq!(
        next["header"]["revision"].as_i64(),
        Some(before.revision + 1),
        "{}",
        etcd.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rkube_restores_a_snapshot_etcdctl_saved_from_etcd() {
    let (turn, port) = exclusive_ports(1);
    let etcd_dir = tempfile::tempdir().expect("tempdir");
    let etcd = Etcd::start(etcd_dir.path(), &etcd_dir.path().join("data"), port).await;
    let lease = write_story(&etcd.etcdctl).await;
    let before = seen(&etcd.etcdctl, &lease).await;
    let file = etcd_dir.path().join("from-etcd.db");
    let file_s = file.to_string_lossy().into_owned();
    etcd.etcdctl.ok(&["snapshot", "save", &file_s]).await;
    let status = etcdctl_status(&etcd.etcdctl, &file_s).await;
    drop(etcd);
    drop(turn);

    let ours = json(&rkube(&["snapshot", "status", &file_s, "-o", "json"], true));
    assert_eq!(ours["etcd"], status, "rkube snapshot status vs etcdctl");
    assert_eq!(ours["revision"].as_i64(), Some(before.revision), "{ours}");
    assert_eq!(ours["totalKey"].as_u64(), Some(3), "{ours}");

    // By hand into one data dir (refused when it is not empty) ...
    let by_hand = etcd_dir.path().join("member");
    let said = rkube(
        &[
            "snapshot",
            "restore",
            &file_s,
            "--data-dir",
            &by_hand.to_string_lossy(),
        ],
        true,
    );
    assert!(
        said.contains(&format!("restored 3 keys at revision {}", before.revision)),
        "{said}"
    );
    // ... and as a new cluster, every member from the file, revisions kept as they were.
    let c = Cluster::start(Options {
        restore: Some(file.clone()),
        up_args: ["--bump-revision", "0"].map(String::from).to_vec(),
        ..Options::default()
    })
    .await
    .expect("restored cluster");
    c.wait_leader().await;
    let etcdctl = c.etcdctl();
    for endpoint in etcdctl.endpoints() {
        let member = etcdctl.with_endpoint(&endpoint);
        wait_for(
            "the member to serve the restored keys",
            Duration::from_secs(30),
            || async {
                let out = member
                    .run(&[
                        "get",
                        "--prefix",
                        "/story/",
                        "--consistency",
                        "s",
                        "-w",
                        "json",
                    ])
                    .await;
                (out.success && json(&out.stdout)["kvs"] == before.kvs).then_some(())
            },
        )
        .await;
    }
    // A quorum read once the members agree on a leader (the first one may lose its place to
    // a member that started after it and heard nothing yet).
    wait_for("a linearizable read", Duration::from_secs(60), || async {
        etcdctl
            .run(&["get", "/story/a"])
            .await
            .success
            .then_some(())
    })
    .await;
    assert_same("rkube restored from etcd", &etcdctl, &before, true).await;
    let next = json(&etcdctl.ok(&["put", "/story/d", "d", "-w", "json"]).await);
    assert_eq!(
        next["header"]["revision"].as_i64(),
        Some(before.revision + 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_snapshots_restore_and_damaged_ones_are_refused() {
    let c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    c.wait_leader().await;
    let etcdctl = c.etcdctl();
    for n in 0..50 {
        etcdctl
            .ok(&["put", &format!("/zip/{n:02}"), &"x".repeat(200)])
            .await;
    }
    let revision = c.wait_converged(&[0, 1, 2]).await;
    let dir = c.path().to_string_lossy().into_owned();
    let plain = c.path().join("plain.db");
    let zipped = c.path().join("zipped.db.zip");
    let (plain_s, zipped_s) = (
        plain.to_string_lossy().into_owned(),
        zipped.to_string_lossy().into_owned(),
    );
    rkube(&["snapshot", "save", &plain_s, "--dir", &dir], true);
    rkube(
        &["snapshot", "save", &zipped_s, "--compress", "--dir", &dir],
        true,
    );
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    assert!(
        size(&zipped) < size(&plain) / 2,
        "{} !< {}/2",
        size(&zipped),
        size(&plain)
    );
    let status = json(&rkube(
        &["snapshot", "status", &zipped_s, "-o", "json"],
        true,
    ));
    assert_eq!(status["format"], "etcd+zip", "{status}");
    assert_eq!(status["compressed"], true);
    assert_eq!(status["revision"].as_i64(), Some(revision));
    assert_eq!(status["totalKey"].as_u64(), Some(50));
    let plain_status = json(&rkube(
        &["snapshot", "status", &plain_s, "-o", "json"],
        true,
    ));
    assert_eq!(status["hash"], plain_status["hash"]);
    // What etcdctl thinks of the plain file: the same revision.
    let one = etcdctl.with_endpoint(&etcdctl.endpoints()[0]);
    assert_eq!(
        etcdctl_status(&one, &plain_s).await["revision"].as_i64(),
        Some(revision)
    );

    // A flipped byte: refused by status and restore, whichever file it is in.
    for (what, file) in [("plain", &plain), ("zipped", &zipped)] {
        let damaged = c.path().join(format!("damaged-{what}"));
        damage(file, &damaged);
        let damaged_s = damaged.to_string_lossy().into_owned();
        let err = rkube(&["snapshot", "status", &damaged_s], false);
        assert!(err.contains("truncated or corrupted"), "{what}: {err}");
        let into = c.path().join(format!("restore-{what}"));
        let err = rkube(
            &[
                "snapshot",
                "restore",
                &damaged_s,
                "--data-dir",
                &into.to_string_lossy(),
            ],
            false,
        );
        assert!(err.contains("truncated or corrupted"), "{what}: {err}");
        assert!(
            !into.join("db").exists(),
            "{what}: a data dir was made from a damaged file"
        );
    }

    // The zipped file builds a cluster like the plain one.
    let restored = Cluster::start(Options {
        restore: Some(zipped.clone()),
        ..Options::default()
    })
    .await
    .expect("restored cluster");
    restored.wait_leader().await;
    let got = json(
        &restored
            .etcdctl()
            .ok(&["get", "--prefix", "/zip/", "--keys-only", "-w", "json"])
            .await,
    );
    assert_eq!(got["count"].as_i64(), Some(50), "{got}");
}

/// `rkube up --snapshot-compress`: the leader's scheduled snapshots are zipped (`.snap.zip`, as
/// k3s's), and `rkube snapshot status` reads them as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_takes_compressed_scheduled_snapshots() {
    let c = Cluster::start(Options {
        up_args: ["--snapshot-interval", "1s", "--snapshot-compress"]
            .map(String::from)
            .to_vec(),
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    let rev = c.put(0, "/zipped", "x").await.expect("write");
    let file = wait_for(
        "a zipped scheduled snapshot that covers the write",
        Duration::from_secs(60),
        || async {
            let l = c.leader().await?;
            let newest = c.scheduled_snapshots(l).into_iter().next()?;
            (newest.revision >= rev).then(|| c.snapshot_dir(l).join(newest.file))
        },
    )
    .await;
    assert!(
        file.to_string_lossy().ends_with(".snap.zip"),
        "{}",
        file.display()
    );
    let out = std::process::Command::new(rkube_bin())
        .args(["snapshot", "status", "-o", "json"])
        .arg(&file)
        .output()
        .expect("rkube runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(status["compressed"], serde_json::json!(true), "{status}");
    assert!(status["revision"].as_i64().unwrap_or(0) >= rev, "{status}");
}
