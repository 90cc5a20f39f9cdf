//! Multi-process scenarios against real `rkube server` processes started through `rkube up`.
//! Each test tells one story; the harness kills every process it started when the test ends.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_tests::{wait_for, Cluster, ClusterClient, Options, WatchClient, WithLogs};
use futures::StreamExt;
use rkube_store::proto::etcdserverpb as pb;
use tokio::sync::Mutex;

#[path = "cluster/maintenance.rs"]
mod maintenance;
#[path = "cluster/recovery.rs"]
mod recovery;

/// Writers that put unique keys (`prefix/<writer>/<n>`) round-robin over the members until
/// stopped, remembering every acknowledged key.
struct Writers {
    stop: Arc<std::sync::atomic::AtomicBool>,
    acked: Arc<Mutex<BTreeMap<String, String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    fn start(cluster: &Arc<Cluster>, prefix: &str, writers: usize) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(BTreeMap::new()));
        let mut tasks = Vec::new();
        for w in 0..writers {
            let (cluster, stop, acked, prefix) = (
                cluster.clone(),
                stop.clone(),
                acked.clone(),
                prefix.to_string(),
            );
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let member = (w + n as usize) % cluster.members.len();
                    let key = format!("{prefix}/{w}/{n:06}");
                    let value = format!("v{w}-{n}");
                    if cluster.put(member, &key, &value).await.is_ok() {
                        acked.lock().await.insert(key, value);
                    } else {
                        // A failed write may or may not have committed; it is not counted as
                        // acknowledged. Back off briefly while the cluster recovers.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    n += 1;
                }
            }));
        }
        Self { stop, acked, tasks }
    }

    async fn count(&self) -> usize {
        self.acked.lock().await.len()
    }

    async fn wait_count(&self, at_least: usize) {
        wait_for(
            "writes to be acknowledged",
            Duration::from_secs(60),
            || async { (self.count().await >= at_least).then_some(()) },
        )
        .await
    }

    async fn finish(self) -> BTreeMap<String, String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        Arc::try_unwrap(self.acked)
            .map(|m| m.into_inner())
            .unwrap_or_default()
    }
}

/// Every acknowledged write is on every listed member, and they agree on revision and hash.
async fn check_all_present(
    c: &Cluster,
    members: &[usize],
    prefix: &str,
    acked: &BTreeMap<String, String>,
) {
    let revision = c.wait_converged(members).await;
    let mut hashes = BTreeSet::new();
    for &i in members {
        let keys: BTreeMap<String, String> = c
            .local_keys(i, prefix)
            .await
            .logs(c)
            .expect("read keys")
            .into_iter()
            .collect();
        for (k, v) in acked {
            assert_eq!(
                keys.get(k),
                Some(v),
                "member {} lost acknowledged write {k} (it has {} keys under {prefix}, revision {revision})",
                c.members[i].name,
                keys.len()
            );
        }
        hashes.insert(c.hash_kv(i, revision).await.expect("hash"));
    }
    assert_eq!(
        hashes.len(),
        1,
        "members disagree on the hash of the keyspace at revision {revision}"
    );
}

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
}

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

/// Opens a watch on `member` for `prefix` from `start`, and collects (revision, key) of every
/// event into the returned list until the stream ends.
async fn watch_into(
    c: &Cluster,
    member: usize,
    prefix: &str,
    start: i64,
) -> (Arc<Mutex<Vec<(i64, String)>>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut client = WatchClient::new(c.channel(member));
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key: prefix.into(),
                range_end: rkube_store::mvcc::prefix_end(prefix.as_bytes()),
                start_revision: start,
                ..Default::default()
            },
        )),
    })
    .await
    .expect("send create");
    let mut stream = client
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("watch")
        .into_inner();
    let sink = seen.clone();
    let task = tokio::spawn(async move {
        let _keep_open = tx;
        while let Some(Ok(resp)) = stream.next().await {
            let mut sink = sink.lock().await;
            for e in resp.events {
                let kv = e.kv.unwrap_or_default();
                sink.push((
                    kv.mod_revision,
                    String::from_utf8_lossy(&kv.key).into_owned(),
                ));
            }
        }
    });
    (seen, task)
}

fn assert_exactly_once_in_order(seen: &[(i64, String)]) {
    for w in seen.windows(2) {
        assert!(
            w[0].0 < w[1].0,
            "events out of order or repeated: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_watch_sees_every_event_once_across_leader_change() {
    let c = Arc::new(
        Cluster::start(Options::default())
            .await
            .expect("cluster starts"),
    );
    let leader = c.wait_leader().await;
    let follower = (leader + 1) % 3;
    let (seen, task) = watch_into(&c, follower, "/w/", 1).await;
    let writers = Writers::start(&c, "/w", 2);
    writers.wait_count(50).await;
    c.kill(leader).await;
    c.wait_new_leader(leader).await;
    let before = writers.count().await;
    writers.wait_count(before + 50).await;
    let acked = writers.finish().await;
    c.restart_missing().await.expect("restart");
    let last = c.wait_converged(&[0, 1, 2]).await;
    wait_for(
        "the watcher to reach the last revision",
        Duration::from_secs(30),
        || async { (seen.lock().await.last().map_or(0, |e| e.0) >= last).then_some(()) },
    )
    .await;
    task.abort();
    let seen = seen.lock().await.clone();
    assert_exactly_once_in_order(&seen);
    let keys: BTreeSet<&String> = seen.iter().map(|(_, k)| k).collect();
    for k in acked.keys() {
        assert!(
            keys.contains(k),
            "the watcher missed acknowledged write {k}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_resumed_after_its_member_was_killed_misses_nothing() {
    let c = Arc::new(
        Cluster::start(Options::default())
            .await
            .expect("cluster starts"),
    );
    let leader = c.wait_leader().await;
    let member = (leader + 2) % 3;
    let other = (leader + 1) % 3;
    let (seen, task) = watch_into(&c, member, "/r/", 1).await;
    let writers = Writers::start(&c, "/r", 2);
    writers.wait_count(40).await;
    c.kill(member).await;
    task.abort();
    let first: Vec<(i64, String)> = seen.lock().await.clone();
    let resume_from = first.last().map_or(1, |e| e.0 + 1);
    let before = writers.count().await;
    writers.wait_count(before + 40).await;
    // Resume on another member from the last revision seen + 1.
    let (rest, task) = watch_into(&c, other, "/r/", resume_from).await;
    let acked = writers.finish().await;
    let last = c.wait_converged(&[leader, other]).await;
    wait_for(
        "the resumed watcher to reach the last revision",
        Duration::from_secs(30),
        || async { (rest.lock().await.last().map_or(0, |e| e.0) >= last).then_some(()) },
    )
    .await;
    task.abort();
    let mut all = first;
    all.extend(rest.lock().await.iter().cloned());
    assert_exactly_once_in_order(&all);
    let keys: BTreeSet<&String> = all.iter().map(|(_, k)| k).collect();
    for k in acked.keys() {
        assert!(
            keys.contains(k),
            "the resumed watch missed acknowledged write {k}"
        );
    }
    // Every write here is a put of a new key, so the revisions must be contiguous.
    let revs: Vec<i64> = all.iter().map(|e| e.0).collect();
    for w in revs.windows(2) {
        assert_eq!(
            w[1],
            w[0] + 1,
            "a revision is missing between {} and {}",
            w[0],
            w[1]
        );
    }
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
    rkube_store::pki::init_ca(stranger.path()).expect("other ca");
    rkube_store::pki::issue(
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

/// etcdctl (3.4, from Debian's etcd-client, which `.ci/run` installs) against the store, with
/// the variables `rkube up` writes to DIR/env.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_works_against_the_store() {
    let c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    c.wait_leader().await;
    let env: Vec<(String, String)> = std::fs::read_to_string(c.path().join("env"))
        .expect("DIR/env")
        .lines()
        .filter_map(|l| {
            l.strip_prefix("export ")?
                .split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    let etcdctl = |args: &[&str]| {
        let out = std::process::Command::new("etcdctl")
            .args(args)
            .envs(env.iter().cloned())
            .output()
            .expect("etcdctl is installed (Debian package etcd-client; .ci/run installs it)");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = etcdctl(&["put", "/registry/pods/default/nginx", "{}"]);
    assert!(ok && out.trim() == "OK", "{out}{err}");
    etcdctl(&["put", "/registry/minions/node-1", "{}"]);
    let (ok, out, err) = etcdctl(&["get", "/", "--prefix", "--keys-only", "--limit=10"]);
    assert!(ok, "{err}");
    let keys: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        keys,
        ["/registry/minions/node-1", "/registry/pods/default/nginx"]
    );
    let (ok, out, err) = etcdctl(&["endpoint", "health"]);
    assert!(
        ok && out.matches("is healthy").count() + err.matches("is healthy").count() == 3,
        "{out}{err}"
    );
    let (ok, out, err) = etcdctl(&["member", "list"]);
    assert!(
        ok && out.lines().count() == 3 && out.contains("started, n1"),
        "{out}{err}"
    );
    let (ok, out, _) = etcdctl(&["get", "/registry/pods/default/nginx", "-w", "json"]);
    let json: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert!(
        ok && json["kvs"][0]["mod_revision"].as_i64() == Some(1),
        "{out}"
    );
    let (ok, _, _) = etcdctl(&["compaction", "2"]);
    assert!(ok);
    let (ok, _, err) = etcdctl(&["get", "/registry/pods/default/nginx", "--rev", "1"]);
    assert!(
        !ok && err.contains("etcdserver: mvcc: required revision has been compacted"),
        "{err}"
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
        eprintln!(
            "DEBUG {name} {:?}",
            c.metric(f, "rkube_raft_leader_changes_total").await
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
