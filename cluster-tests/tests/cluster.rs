//! Multi-process scenarios against real `rkube server` processes started through `rkube up`.
//! Each test tells one story; the harness kills every process it started when the test ends.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_tests::{wait_for, Cluster, ClusterClient, Etcdctl, Options, WatchClient, WithLogs};
use futures::StreamExt;
use rkube_store::proto::etcdserverpb as pb;
use tokio::sync::Mutex;

#[path = "cluster/agent.rs"]
mod agent;
#[path = "cluster/chaos.rs"]
mod chaos;
#[path = "cluster/chaos_k8s.rs"]
mod chaos_k8s;
#[path = "cluster/controllers.rs"]
mod controllers;
#[path = "cluster/deploy.rs"]
mod deploy;
#[path = "cluster/kube_client.rs"]
mod kube_client;
#[path = "cluster/kubectl.rs"]
mod kubectl;
#[path = "cluster/maintenance.rs"]
mod maintenance;
#[path = "cluster/rbac.rs"]
mod rbac;
#[path = "cluster/recovery.rs"]
mod recovery;
#[path = "cluster/scheduler.rs"]
mod scheduler;
#[path = "cluster/services.rs"]
mod services;
#[path = "cluster/snapshots.rs"]
mod snapshots;
#[path = "cluster/status_page.rs"]
mod status_page;

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

// etcdctl 3.4 (Debian's etcd-client, which `.ci/run` installs) against a three-member cluster,
// with only the variables `rkube up` writes to DIR/env. Every command's output is checked
// against what etcd prints for it.

/// A `-w json` document.
fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// How etcdctl's `-w json` writes keys and values.
fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The `"Name" : value` lines of `-w fields`, values unquoted.
fn fields(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(" : ")?;
            Some((
                name.trim_matches('"').to_string(),
                value.trim().trim_matches('"').to_string(),
            ))
        })
        .collect()
}

/// Puts a key with `-w json` and returns the revision of the write.
async fn etcdctl_put(etcdctl: &Etcdctl, key: &str, value: &str) -> i64 {
    json(&etcdctl.ok(&["put", key, value, "-w", "json"]).await)["header"]["revision"]
        .as_i64()
        .expect("a put answers with the revision it wrote")
}

/// The simple output of `get` for these key/value pairs.
fn kv_lines(kvs: &[(&str, &str)]) -> String {
    kvs.iter().map(|(k, v)| format!("{k}\n{v}\n")).collect()
}

async fn started_cluster() -> Cluster {
    let c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    c.wait_leader().await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_put_get_delete_and_compaction() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    assert_eq!(etcdctl.endpoints().len(), 3, "DIR/env names every member");

    assert_eq!(
        etcdctl
            .ok(&["put", "/registry/minions/node-1", "node"])
            .await,
        "OK\n"
    );
    let nginx_v1 = etcdctl_put(&etcdctl, "/registry/pods/default/nginx", "nginx-v1").await;
    etcdctl_put(&etcdctl, "/registry/pods/default/web", "web").await;
    etcdctl_put(&etcdctl, "/registry/pods/kube-system/dns", "dns").await;
    assert_eq!(
        etcdctl
            .ok(&[
                "put",
                "/registry/pods/default/nginx",
                "nginx-v2",
                "--prev-kv"
            ])
            .await,
        "OK\n/registry/pods/default/nginx\nnginx-v1\n",
        "put --prev-kv prints the value it replaced"
    );
    let pods = [
        ("/registry/pods/default/nginx", "nginx-v2"),
        ("/registry/pods/default/web", "web"),
        ("/registry/pods/kube-system/dns", "dns"),
    ];

    assert_eq!(
        etcdctl.ok(&["get", "/registry/pods/", "--prefix"]).await,
        kv_lines(&pods)
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/registry/", "--prefix", "--keys-only"])
            .await,
        "/registry/minions/node-1\n\n/registry/pods/default/nginx\n\n\
         /registry/pods/default/web\n\n/registry/pods/kube-system/dns\n\n"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/registry/pods/", "--prefix", "--limit=2"])
            .await,
        kv_lines(&pods[..2])
    );
    assert_eq!(
        etcdctl
            .ok(&[
                "get",
                "/registry/pods/default/nginx",
                &format!("--rev={nginx_v1}")
            ])
            .await,
        "/registry/pods/default/nginx\nnginx-v1\n",
        "get --rev reads the value as of that revision"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/registry/pods/", "--prefix", "--print-value-only"])
            .await,
        "nginx-v2\nweb\ndns\n"
    );
    assert_eq!(
        etcdctl
            .ok(&[
                "get",
                "/registry/pods/default/web",
                "--from-key",
                "--keys-only"
            ])
            .await,
        "/registry/pods/default/web\n\n/registry/pods/kube-system/dns\n\n"
    );

    let latest = json(
        &etcdctl
            .ok(&["get", "/registry/minions/node-1", "-w", "json"])
            .await,
    )["header"]["revision"]
        .as_i64()
        .expect("header revision");
    let page = json(
        &etcdctl
            .ok(&[
                "get",
                "/registry/pods/",
                "--prefix",
                "--limit=1",
                "-w",
                "json",
            ])
            .await,
    );
    assert_eq!(page["header"]["revision"].as_i64(), Some(latest), "{page}");
    assert_eq!(page["count"].as_i64(), Some(3), "{page}");
    assert_eq!(page["more"].as_bool(), Some(true), "{page}");
    let kvs = page["kvs"].as_array().expect("kvs");
    assert_eq!(kvs.len(), 1, "{page}");
    assert_eq!(
        kvs[0]["key"].as_str(),
        Some(b64("/registry/pods/default/nginx").as_str())
    );
    assert_eq!(kvs[0]["value"].as_str(), Some(b64("nginx-v2").as_str()));
    assert_eq!(kvs[0]["create_revision"].as_i64(), Some(nginx_v1));
    assert_eq!(kvs[0]["mod_revision"].as_i64(), Some(latest));
    assert_eq!(kvs[0]["version"].as_i64(), Some(2));

    let f = fields(
        &etcdctl
            .ok(&["get", "/registry/pods/default/nginx", "-w", "fields"])
            .await,
    );
    for (name, value) in [
        ("Key", "/registry/pods/default/nginx".to_string()),
        ("Value", "nginx-v2".to_string()),
        ("CreateRevision", nginx_v1.to_string()),
        ("ModRevision", latest.to_string()),
        ("Version", "2".to_string()),
        ("Lease", "0".to_string()),
        ("Revision", latest.to_string()),
        ("Count", "1".to_string()),
        ("More", "false".to_string()),
    ] {
        assert_eq!(f.get(name), Some(&value), "field {name} in {f:?}");
    }
    assert_eq!(f.get("ClusterID").map(|id| id != "0"), Some(true), "{f:?}");

    assert_eq!(
        etcdctl
            .ok(&["del", "/registry/pods/default/", "--prefix", "--prev-kv"])
            .await,
        format!("2\n{}", kv_lines(&pods[..2])),
        "del --prev-kv prints the count, then each deleted key and value"
    );
    assert_eq!(
        etcdctl
            .ok(&["del", "/registry/pods/default/", "--prefix"])
            .await,
        "0\n"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/registry/", "--prefix", "--keys-only"])
            .await,
        "/registry/minions/node-1\n\n/registry/pods/kube-system/dns\n\n"
    );
    assert_eq!(
        etcdctl.fails(&["put", "", "x"]).await,
        "etcdserver: key is not provided"
    );

    let head = etcdctl_put(&etcdctl, "/registry/minions/node-1", "node-v2").await;
    assert_eq!(
        etcdctl.ok(&["compaction", &head.to_string()]).await,
        format!("compacted revision {head}\n")
    );
    assert_eq!(
        etcdctl
            .fails(&[
                "get",
                "/registry/pods/default/nginx",
                &format!("--rev={nginx_v1}")
            ])
            .await,
        "etcdserver: mvcc: required revision has been compacted"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/registry/minions/node-1", &format!("--rev={head}")])
            .await,
        "/registry/minions/node-1\nnode-v2\n",
        "the compaction revision itself stays readable"
    );
    assert_eq!(
        etcdctl
            .fails(&["compaction", &(head - 1).to_string()])
            .await,
        "etcdserver: mvcc: required revision has been compacted"
    );
    assert_eq!(
        etcdctl
            .fails(&["compaction", &(head + 1000).to_string()])
            .await,
        "etcdserver: mvcc: required revision is a future revision"
    );
    assert_eq!(
        etcdctl
            .fails(&[
                "get",
                "/registry/",
                "--prefix",
                &format!("--rev={}", head + 1000)
            ])
            .await,
        "etcdserver: mvcc: required revision is a future revision"
    );
}

/// Lines a watch prints for one event: its type, then (with --prev-kv) the previous key and
/// value, then the key and value (empty for a delete).
fn event_lines(kind: &str, prev: Option<(&str, &str)>, kv: (&str, &str)) -> Vec<String> {
    let mut lines = vec![kind.to_string()];
    if let Some((k, v)) = prev {
        lines.extend([k.to_string(), v.to_string()]);
    }
    lines.extend([kv.0.to_string(), kv.1.to_string()]);
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_watch_replays_from_a_revision_then_follows() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    let first = etcdctl_put(&etcdctl, "/w/a", "1").await;
    etcdctl_put(&etcdctl, "/w/b", "2").await;
    let a3 = etcdctl_put(&etcdctl, "/w/a", "3").await;
    assert_eq!(etcdctl.ok(&["del", "/w/b"]).await, "1\n");

    let watch = etcdctl.spawn(&[
        "watch",
        "/w",
        "--prefix",
        &format!("--rev={first}"),
        "--prev-kv",
    ]);
    let mut expected: Vec<String> = [
        event_lines("PUT", None, ("/w/a", "1")),
        event_lines("PUT", None, ("/w/b", "2")),
        event_lines("PUT", Some(("/w/a", "1")), ("/w/a", "3")),
        event_lines("DELETE", Some(("/w/b", "2")), ("/w/b", "")),
    ]
    .concat();
    assert_eq!(
        watch
            .wait_lines(expected.len(), Duration::from_secs(30))
            .await,
        expected,
        "the history since --rev, with previous values"
    );
    // Replayed history means the watch is in place: new events follow. The key outside the
    // prefix is written first, so it would show before /w/c if it were wrongly sent.
    etcdctl.ok(&["put", "/x/outside", "9"]).await;
    etcdctl.ok(&["put", "/w/c", "4"]).await;
    expected.extend(event_lines("PUT", None, ("/w/c", "4")));
    assert_eq!(
        watch
            .wait_lines(expected.len(), Duration::from_secs(30))
            .await,
        expected
    );
    watch.stop().await;

    // One key, from a later revision, without previous values.
    let single = etcdctl.spawn(&["watch", "/w/a", &format!("--rev={a3}")]);
    let mut expected = event_lines("PUT", None, ("/w/a", "3"));
    assert_eq!(
        single
            .wait_lines(expected.len(), Duration::from_secs(30))
            .await,
        expected
    );
    etcdctl.ok(&["put", "/w/b", "5"]).await;
    assert_eq!(etcdctl.ok(&["del", "/w/a"]).await, "1\n");
    expected.extend(event_lines("DELETE", None, ("/w/a", "")));
    assert_eq!(
        single
            .wait_lines(expected.len(), Duration::from_secs(30))
            .await,
        expected,
        "a watch on one key sees only that key"
    );
    single.stop().await;

    // Past history that was compacted away: the server cancels the watch and etcdctl says why.
    let head = etcdctl_put(&etcdctl, "/w/d", "6").await;
    etcdctl.ok(&["compaction", &head.to_string()]).await;
    let out = etcdctl
        .run(&["watch", "/w", "--prefix", &format!("--rev={first}")])
        .await;
    assert!(!out.success, "{out:?}");
    assert!(
        out.stderr.contains(
            "watch was canceled (etcdserver: mvcc: required revision has been compacted)"
        ),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_txn_runs_the_branch_its_compares_choose() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    let flag = etcdctl_put(&etcdctl, "/txn/flag", "on").await;
    etcdctl.ok(&["put", "/txn/a", "1"]).await;
    etcdctl.ok(&["put", "/txn/b", "2"]).await;
    let txn = |input: String| {
        let etcdctl = etcdctl.clone();
        async move {
            let out = etcdctl
                .run_with_input(&["txn", "--interactive=false"], &input)
                .await;
            assert!(out.success, "txn {input:?} failed: {out:?}");
            out.stdout
        }
    };

    // compares, blank line, success ops, blank line, failure ops, blank line.
    assert_eq!(
        txn("value(\"/txn/flag\") = \"on\"\n\nput /txn/result yes\nget /txn/flag\n\nput /txn/result no\n\n".into()).await,
        "SUCCESS\n\nOK\n\n/txn/flag\non\n"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/txn/result", "--print-value-only"])
            .await,
        "yes\n"
    );
    assert_eq!(
        txn(format!("mod(\"/txn/flag\") > \"{flag}\"\n\nput /txn/result yes\n\nput /txn/result no\nget /txn/a\n\n")).await,
        "FAILURE\n\nOK\n\n/txn/a\n1\n"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/txn/result", "--print-value-only"])
            .await,
        "no\n"
    );
    // Several compares must all hold; here the second does not.
    assert_eq!(
        txn(format!("create(\"/txn/flag\") = \"{flag}\"\nversion(\"/txn/a\") = \"2\"\n\nput /txn/result both\n\ndel /txn/result\n\n")).await,
        "FAILURE\n\n1\n"
    );
    let resp = json(&{
        let out = etcdctl
            .run_with_input(
                &["txn", "--interactive=false", "-w", "json"],
                "version(\"/txn/a\") = \"1\"\nvalue(\"/txn/b\") != \"9\"\n\ndel /txn --prefix\n\n\n",
            )
            .await;
        assert!(out.success, "{out:?}");
        out.stdout
    });
    assert_eq!(resp["succeeded"].as_bool(), Some(true), "{resp}");
    assert_eq!(
        resp["responses"][0]["Response"]["ResponseDeleteRange"]["deleted"].as_i64(),
        Some(3),
        "{resp}"
    );
    assert_eq!(etcdctl.ok(&["get", "/txn", "--prefix"]).await, "");

    let out = etcdctl
        .run_with_input(
            &["txn", "--interactive=false"],
            "\nput /txn/dup 1\nput /txn/dup 2\n\n\n",
        )
        .await;
    assert_eq!(
        out.error(),
        Some("etcdserver: duplicate key given in txn request"),
        "{out:?}"
    );
}

/// The hexadecimal lease ID in `lease <id> granted with TTL(...)`.
fn granted_lease(out: &str) -> String {
    let id = out
        .strip_prefix("lease ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("not a lease grant: {out}"));
    assert!(
        id.chars().all(|ch| ch.is_ascii_hexdigit()),
        "not a lease grant: {out}"
    );
    id.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_leases_keep_alive_list_revoke_and_expire() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    let out = etcdctl.ok(&["lease", "grant", "60"]).await;
    let id = granted_lease(&out);
    assert_eq!(out, format!("lease {id} granted with TTL(60s)\n"));
    let decimal = i64::from_str_radix(&id, 16).expect("hex lease id");
    for key in ["/lease/a", "/lease/b"] {
        assert_eq!(
            etcdctl
                .ok(&["put", key, "x", &format!("--lease={id}")])
                .await,
            "OK\n"
        );
    }
    assert_eq!(
        fields(&etcdctl.ok(&["get", "/lease/a", "-w", "fields"]).await).get("Lease"),
        Some(&decimal.to_string())
    );
    assert_eq!(
        etcdctl.ok(&["lease", "keep-alive", "--once", &id]).await,
        format!("lease {id} keepalived with TTL(60)\n")
    );
    let ttl = etcdctl.ok(&["lease", "timetolive", &id, "--keys"]).await;
    let remaining: i64 = ttl
        .strip_prefix(&format!("lease {id} granted with TTL(60s), remaining("))
        .and_then(|rest| rest.split_once("s), attached keys([/lease/a /lease/b])\n"))
        .filter(|(_, tail)| tail.is_empty())
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected timetolive output: {ttl}"));
    assert!((50..=60).contains(&remaining), "{ttl}");
    let list = etcdctl.ok(&["lease", "list"]).await;
    assert_eq!(list, format!("found 1 leases\n{id}\n"));

    assert_eq!(
        etcdctl.ok(&["lease", "revoke", &id]).await,
        format!("lease {id} revoked\n")
    );
    assert_eq!(
        etcdctl.ok(&["get", "/lease/", "--prefix"]).await,
        "",
        "revoking a lease deletes its keys"
    );
    assert_eq!(
        etcdctl.ok(&["lease", "timetolive", &id]).await,
        format!("lease {id} already expired\n")
    );
    assert_eq!(
        etcdctl.fails(&["lease", "keep-alive", "--once", &id]).await,
        "etcdserver: requested lease not found"
    );
    assert_eq!(
        etcdctl.fails(&["lease", "revoke", &id]).await,
        "failed to revoke lease (etcdserver: requested lease not found)"
    );
    assert_eq!(
        etcdctl
            .fails(&["put", "/lease/c", "x", &format!("--lease={id}")])
            .await,
        "etcdserver: requested lease not found"
    );
    assert_eq!(
        etcdctl.fails(&["lease", "grant", "9999999999"]).await,
        "failed to grant lease (etcdserver: too large lease TTL)"
    );

    // A lease nobody keeps alive expires and takes its keys with it.
    let short = granted_lease(&etcdctl.ok(&["lease", "grant", "3"]).await);
    etcdctl
        .ok(&["put", "/lease/short", "x", &format!("--lease={short}")])
        .await;
    wait_for(
        "the unrenewed lease's key to be deleted",
        Duration::from_secs(30),
        || async {
            etcdctl
                .ok(&["get", "/lease/short", "--keys-only"])
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        etcdctl.ok(&["lease", "timetolive", &short]).await,
        format!("lease {short} already expired\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_member_list_add_promote_and_remove_a_learner() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    let started: BTreeSet<String> = (0..3)
        .map(|i| {
            let m = &c.members[i];
            format!(
                "{:x}, started, {}, https://{}, https://{}, false",
                c.id_of(i),
                m.name,
                m.peer,
                m.client
            )
        })
        .collect();
    let list = |out: String| -> BTreeSet<String> { out.lines().map(str::to_string).collect() };
    // Each member publishes its name and client URL once it has joined: wait for all three.
    wait_for(
        "every member to publish its attributes",
        Duration::from_secs(30),
        || async { (list(etcdctl.ok(&["member", "list"]).await) == started).then_some(()) },
    )
    .await;

    // A learner that is never started: the spare port slot after the last member.
    let port = c.members[2]
        .peer
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .expect("peer port");
    let peer_url = format!("https://127.0.0.1:{}", port + 10);
    let out = etcdctl
        .ok(&[
            "member",
            "add",
            "n9",
            &format!("--peer-urls={peer_url}"),
            "--learner",
        ])
        .await;
    let (first, rest) = out.split_once('\n').expect("several lines");
    let words: Vec<&str> = first.split_whitespace().collect();
    assert!(
        words.len() == 6 && words[0] == "Member" && words[2..5] == ["added", "to", "cluster"],
        "{out}"
    );
    let id = words[1].to_string();
    let cluster_id = u64::from_str_radix(words[5], 16).expect("hex cluster id");
    assert_eq!(
        json(&etcdctl.ok(&["member", "list", "-w", "json"]).await)["header"]["cluster_id"].as_u64(),
        Some(cluster_id)
    );
    assert!(rest.contains("\nETCD_NAME=\"n9\"\n"), "{out}");
    assert!(
        rest.contains(&format!("n9={peer_url}"))
            && (0..3).all(|i| rest.contains(&format!(
                "{}=https://{}",
                c.members[i].name, c.members[i].peer
            ))),
        "ETCD_INITIAL_CLUSTER names every member: {out}"
    );
    assert!(
        rest.contains(&format!("ETCD_INITIAL_ADVERTISE_PEER_URLS=\"{peer_url}\""))
            && rest.contains("ETCD_INITIAL_CLUSTER_STATE=\"existing\""),
        "{out}"
    );
    let mut with_learner = started.clone();
    with_learner.insert(format!("{id}, unstarted, , {peer_url}, , true"));
    assert_eq!(list(etcdctl.ok(&["member", "list"]).await), with_learner);

    assert_eq!(
        etcdctl.fails(&["member", "promote", &id]).await,
        "etcdserver: can only promote a learner member which is in sync with leader"
    );
    assert_eq!(
        etcdctl.ok(&["member", "remove", &id]).await,
        // etcd prints both IDs with %16x: right-aligned, space-padded.
        format!(
            "Member {:16x} removed from cluster {cluster_id:16x}\n",
            u64::from_str_radix(&id, 16).expect("hex member id")
        )
    );
    assert_eq!(list(etcdctl.ok(&["member", "list"]).await), started);
    assert_eq!(
        etcdctl.fails(&["member", "remove", &id]).await,
        "etcdserver: member not found"
    );
    assert_eq!(
        etcdctl.fails(&["member", "promote", &id]).await,
        "etcdserver: member not found"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_endpoint_status_health_and_hashkv_cover_the_cluster() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    for n in 0..10 {
        etcdctl.ok(&["put", &format!("/e/{n}"), "x"]).await;
    }
    let leader = c.wait_leader().await;
    let client_url = |i: usize| format!("https://{}", c.members[i].client);
    let all_urls: BTreeSet<String> = (0..3).map(client_url).collect();

    // endpoint, ID, version, db size, is leader, is learner, raft term, raft index,
    // raft applied index, errors
    let status = etcdctl.ok(&["endpoint", "status", "--cluster"]).await;
    let rows: Vec<Vec<&str>> = status.lines().map(|l| l.split(", ").collect()).collect();
    assert_eq!(rows.len(), 3, "{status}");
    let mut urls = BTreeSet::new();
    for row in &rows {
        assert_eq!(row.len(), 10, "{status}");
        let i = (0..3)
            .find(|&i| row[0] == client_url(i))
            .unwrap_or_else(|| panic!("unknown endpoint in {status}"));
        urls.insert(row[0].to_string());
        assert_eq!(row[1], format!("{:x}", c.id_of(i)), "{status}");
        assert!(!row[2].is_empty(), "a version: {status}");
        assert_eq!(
            row[4],
            if i == leader { "true" } else { "false" },
            "{status}"
        );
        assert_eq!(row[5], "false", "no learners: {status}");
        assert!(row[7].parse::<u64>().is_ok_and(|n| n > 0), "{status}");
        assert_eq!(row[9], "", "no errors: {status}");
    }
    assert_eq!(urls, all_urls, "{status}");
    let statuses = json(
        &etcdctl
            .ok(&["endpoint", "status", "--cluster", "-w", "json"])
            .await,
    );
    let leaders: BTreeSet<u64> = statuses
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| s["Status"]["leader"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(
        leaders,
        BTreeSet::from([c.id_of(leader)]),
        "every member names the same leader: {statuses}"
    );

    let health = etcdctl.run(&["endpoint", "health", "--cluster"]).await;
    assert!(health.success, "{health:?}");
    // etcdctl 3.4 reports health on stderr.
    let healthy: BTreeSet<String> = format!("{}{}", health.stdout, health.stderr)
        .lines()
        .filter_map(|l| {
            l.split_once(" is healthy: successfully committed proposal: took = ")
                .map(|(url, _)| url.to_string())
        })
        .collect();
    assert_eq!(healthy, all_urls, "{health:?}");

    let revision = c.wait_converged(&[0, 1, 2]).await;
    let hashkv = etcdctl.ok(&["endpoint", "hashkv", "--cluster"]).await;
    let hashes: BTreeMap<String, u32> = hashkv
        .lines()
        .filter_map(|l| {
            let (url, hash) = l.split_once(", ")?;
            Some((url.to_string(), hash.parse().ok()?))
        })
        .collect();
    assert_eq!(
        hashes.keys().cloned().collect::<BTreeSet<_>>(),
        all_urls,
        "{hashkv}"
    );
    let distinct: BTreeSet<u32> = hashes.values().copied().collect();
    assert_eq!(distinct.len(), 1, "members disagree: {hashkv}");
    assert_eq!(
        distinct.first().copied(),
        c.hash_kv(0, revision).await,
        "etcdctl shows the HashKV at the current revision"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_snapshot_save_writes_a_backup_rkube_reads() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    for n in 0..20 {
        etcdctl.ok(&["put", &format!("/s/{n:02}"), "x"]).await;
    }
    let revision = c.wait_converged(&[0, 1, 2]).await;
    // etcdctl takes a snapshot from exactly one endpoint.
    let first = etcdctl.endpoints()[0].clone();
    let one = etcdctl.with_endpoint(&first);
    let file = c.path().join("etcdctl.snap");
    let file_s = file.to_string_lossy().into_owned();
    let out = one.run(&["snapshot", "save", &file_s]).await;
    assert!(out.success, "snapshot save failed: {out:?}");
    assert_eq!(out.stdout, format!("Snapshot saved at {file_s}\n"));
    let len = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    assert!(len > 0, "the snapshot file is missing or empty");
    // etcd's snapshot format: etcdctl reads the file it saved.
    let etcd_status = json(&one.ok(&["snapshot", "status", &file_s, "-w", "json"]).await);
    assert_eq!(
        etcd_status["revision"].as_i64(),
        Some(revision),
        "{etcd_status}"
    );
    assert_eq!(
        etcd_status["totalSize"].as_u64(),
        Some(len - 32),
        "{etcd_status}"
    );

    let status = std::process::Command::new(cluster_tests::rkube_bin())
        .args(["snapshot", "status", &file_s, "-o", "json"])
        .output()
        .expect("rkube runs");
    assert!(
        status.status.success(),
        "rkube cannot read etcdctl's snapshot: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let status = json(&String::from_utf8_lossy(&status.stdout));
    assert_eq!(status["revision"].as_i64(), Some(revision), "{status}");
    assert_eq!(status["totalKey"].as_u64(), Some(20), "{status}");
}

// The etcd-client crate (a third-party Rust client, as applications use it) over mutual TLS
// with the CA and admin certificate of DIR/pki.

/// An etcd-client connected to the listed members.
async fn etcd_client(c: &Cluster, members: &[usize]) -> etcd_client::Client {
    let pki = c.path().join("pki");
    let read = |file: &str| {
        std::fs::read(pki.join(file)).unwrap_or_else(|e| panic!("DIR/pki/{file}: {e}"))
    };
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read("ca.crt")))
        .identity(etcd_client::Identity::from_pem(
            read("admin.crt"),
            read("admin.key"),
        ));
    let endpoints: Vec<String> = members
        .iter()
        .map(|&i| format!("https://{}", c.members[i].client))
        .collect();
    let options = etcd_client::ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2));
    etcd_client::Client::connect(endpoints, Some(options))
        .await
        .expect("etcd-client connects")
}

/// The gRPC status of an etcd-client error.
fn grpc_status(e: etcd_client::Error) -> tonic::Status {
    match e {
        etcd_client::Error::GRpcStatus(s) => s,
        other => panic!("expected an error from the server, got {other}"),
    }
}

fn kv_pairs(kvs: &[etcd_client::KeyValue]) -> Vec<(String, String)> {
    kvs.iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
            )
        })
        .collect()
}

fn pairs(kvs: &[(&str, &str)]) -> Vec<(String, String)> {
    kvs.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_client_kv_with_options() {
    use etcd_client::{DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget};
    let c = started_cluster().await;
    let mut client = etcd_client(&c, &[0, 1, 2]).await;
    let revision = |h: Option<&etcd_client::ResponseHeader>| h.expect("header").revision();

    let a1 = revision(client.put("/kv/a", "1", None).await.expect("put").header());
    client.put("/kv/b", "2", None).await.expect("put");
    client.put("/kv/c", "3", None).await.expect("put");
    let resp = client
        .put("/kv/a", "10", Some(PutOptions::new().with_prev_key()))
        .await
        .expect("put");
    let a2 = revision(resp.header());
    let prev = resp.prev_key().expect("the replaced value");
    assert_eq!((prev.key(), prev.value()), (&b"/kv/a"[..], &b"1"[..]));
    assert_eq!(prev.mod_revision(), a1);

    let all = client
        .get("/kv/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!(
        kv_pairs(all.kvs()),
        pairs(&[("/kv/a", "10"), ("/kv/b", "2"), ("/kv/c", "3")])
    );
    assert_eq!((all.count(), all.more()), (3, false));
    let a = &all.kvs()[0];
    assert_eq!(
        (
            a.create_revision(),
            a.mod_revision(),
            a.version(),
            a.lease()
        ),
        (a1, a2, 2, 0)
    );
    assert_eq!(revision(all.header()), a2);

    let page = client
        .get("/kv/", Some(GetOptions::new().with_prefix().with_limit(2)))
        .await
        .expect("get");
    assert_eq!(
        kv_pairs(page.kvs()),
        pairs(&[("/kv/a", "10"), ("/kv/b", "2")])
    );
    assert_eq!((page.count(), page.more()), (3, true));

    let keys = client
        .get(
            "/kv/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("get");
    assert_eq!(
        kv_pairs(keys.kvs()),
        pairs(&[("/kv/a", ""), ("/kv/b", ""), ("/kv/c", "")])
    );
    let count = client
        .get(
            "/kv/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("get");
    assert_eq!((count.kvs().len(), count.count()), (0, 3));

    let by_mod = client
        .get(
            "/kv/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Mod, SortOrder::Descend),
            ),
        )
        .await
        .expect("get");
    assert_eq!(
        kv_pairs(by_mod.kvs()),
        pairs(&[("/kv/a", "10"), ("/kv/c", "3"), ("/kv/b", "2")])
    );
    let old = client
        .get("/kv/a", Some(GetOptions::new().with_revision(a1)))
        .await
        .expect("get");
    assert_eq!(kv_pairs(old.kvs()), pairs(&[("/kv/a", "1")]));
    let from = client
        .get("/kv/b", Some(GetOptions::new().with_from_key()))
        .await
        .expect("get");
    assert_eq!(
        kv_pairs(from.kvs()),
        pairs(&[("/kv/b", "2"), ("/kv/c", "3")])
    );
    let range = client
        .get("/kv/a", Some(GetOptions::new().with_range("/kv/c")))
        .await
        .expect("get");
    assert_eq!(
        kv_pairs(range.kvs()),
        pairs(&[("/kv/a", "10"), ("/kv/b", "2")])
    );
    // Each member answers a serializable read from its own state once it has applied a2.
    for i in 0..3 {
        let mut one = etcd_client(&c, &[i]).await;
        let local = wait_for(
            "the member to apply the last write",
            Duration::from_secs(30),
            || {
                let mut one = one.clone();
                async move {
                    let r = one
                        .get("/kv/a", Some(GetOptions::new().with_serializable()))
                        .await
                        .ok()?;
                    (revision(r.header()) >= a2).then_some(r)
                }
            },
        )
        .await;
        assert_eq!(kv_pairs(local.kvs()), pairs(&[("/kv/a", "10")]));
        one.put("/kv/z", format!("from {i}"), None)
            .await
            .expect("a put through any member");
    }

    let future = grpc_status(
        client
            .get("/kv/a", Some(GetOptions::new().with_revision(a2 + 1000)))
            .await
            .expect_err("a future revision"),
    );
    assert_eq!(future.code(), tonic::Code::OutOfRange);
    assert_eq!(
        future.message(),
        "etcdserver: mvcc: required revision is a future revision"
    );
    let empty = grpc_status(client.put("", "x", None).await.expect_err("an empty key"));
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);
    assert_eq!(empty.message(), "etcdserver: key is not provided");

    let none = client
        .delete("/kv/missing", Some(DeleteOptions::new().with_prev_key()))
        .await
        .expect("delete");
    assert_eq!((none.deleted(), none.prev_kvs().len()), (0, 0));
    let deleted = client
        .delete(
            "/kv/",
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .expect("delete");
    assert_eq!(deleted.deleted(), 4);
    assert_eq!(
        kv_pairs(deleted.prev_kvs()),
        pairs(&[
            ("/kv/a", "10"),
            ("/kv/b", "2"),
            ("/kv/c", "3"),
            ("/kv/z", "from 2")
        ])
    );
    let gone = client
        .get("/kv/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!((gone.kvs().len(), gone.count()), (0, 0));

    let head = revision(gone.header());
    client.compact(head, None).await.expect("compact");
    let compacted = grpc_status(
        client
            .get("/kv/a", Some(GetOptions::new().with_revision(a1)))
            .await
            .expect_err("a compacted revision"),
    );
    assert_eq!(compacted.code(), tonic::Code::OutOfRange);
    assert_eq!(
        compacted.message(),
        "etcdserver: mvcc: required revision has been compacted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_client_txn_compares_branches_and_nesting() {
    use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
    let c = started_cluster().await;
    let mut client = etcd_client(&c, &[0, 1, 2]).await;
    let lock = client
        .put("/txn/lock", "free", None)
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision();
    client.put("/txn/count", "0", None).await.expect("put");

    // Take the lock only if it is free and unchanged since we read it.
    let take = Txn::new()
        .when([
            Compare::value("/txn/lock", CompareOp::Equal, "free"),
            Compare::mod_revision("/txn/lock", CompareOp::Equal, lock),
        ])
        .and_then([
            TxnOp::put("/txn/lock", "mine", None),
            TxnOp::get("/txn/count", None),
        ])
        .or_else([TxnOp::get("/txn/lock", None)]);
    let resp = client.txn(take.clone()).await.expect("txn");
    assert!(resp.succeeded());
    let ops = resp.op_responses();
    assert_eq!(ops.len(), 2);
    assert!(matches!(ops[0], TxnOpResponse::Put(_)), "{ops:?}");
    match &ops[1] {
        TxnOpResponse::Get(g) => assert_eq!(kv_pairs(g.kvs()), pairs(&[("/txn/count", "0")])),
        other => panic!("expected a get, got {other:?}"),
    }

    // The same transaction again: the compares fail and the else branch reports the holder.
    let resp = client.txn(take).await.expect("txn");
    assert!(!resp.succeeded());
    match resp.op_responses().as_slice() {
        [TxnOpResponse::Get(g)] => assert_eq!(kv_pairs(g.kvs()), pairs(&[("/txn/lock", "mine")])),
        other => panic!("expected one get, got {other:?}"),
    }

    // A transaction inside a transaction, and compares on version, creation and absence.
    let nested = Txn::new()
        .when([
            Compare::version("/txn/lock", CompareOp::Equal, 2),
            Compare::create_revision("/txn/missing", CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::txn(
            Txn::new()
                .when([Compare::value("/txn/count", CompareOp::Less, "1")])
                .and_then([
                    TxnOp::put("/txn/count", "1", None),
                    TxnOp::delete("/txn/lock", None),
                ]),
        )]);
    let resp = client.txn(nested).await.expect("txn");
    assert!(resp.succeeded());
    match resp.op_responses().as_slice() {
        [TxnOpResponse::Txn(inner)] => {
            assert!(inner.succeeded());
            match inner.op_responses().as_slice() {
                [TxnOpResponse::Put(_), TxnOpResponse::Delete(d)] => assert_eq!(d.deleted(), 1),
                other => panic!("expected a put and a delete, got {other:?}"),
            }
        }
        other => panic!("expected a nested txn, got {other:?}"),
    }
    let now = client
        .get("/txn/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!(kv_pairs(now.kvs()), pairs(&[("/txn/count", "1")]));
    // Everything in one transaction is one revision.
    assert_eq!(
        now.kvs()[0].mod_revision(),
        now.header().expect("header").revision()
    );

    let dup = grpc_status(
        client
            .txn(Txn::new().and_then([
                TxnOp::put("/txn/dup", "1", None),
                TxnOp::put("/txn/dup", "2", None),
            ]))
            .await
            .expect_err("two puts of one key"),
    );
    assert_eq!(dup.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        dup.message(),
        "etcdserver: duplicate key given in txn request"
    );
}

/// (revision, key) of each event a watch delivered, in order.
type SeenEvents = Arc<Mutex<Vec<(i64, String)>>>;

/// Collects the events of a watch stream until it ends or fails.
fn collect_events(
    mut stream: etcd_client::WatchStream,
) -> (SeenEvents, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok(Some(resp)) = stream.message().await {
            assert!(
                !resp.canceled(),
                "the watch was canceled: {}",
                resp.cancel_reason()
            );
            let mut sink = sink.lock().await;
            for e in resp.events() {
                let kv = e.kv().expect("an event has a key");
                sink.push((
                    kv.mod_revision(),
                    String::from_utf8_lossy(kv.key()).into_owned(),
                ));
            }
        }
    });
    (seen, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_client_watch_resumed_on_another_member_after_a_kill_misses_nothing() {
    use etcd_client::WatchOptions;
    let c = Arc::new(started_cluster().await);
    let leader = c.wait_leader().await;
    let member = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let writers = Writers::start(&c, "/cw", 2);
    writers.wait_count(20).await;

    // From revision 1: the history so far, then live events, from one member only.
    let mut client = etcd_client(&c, &[member]).await;
    let (_watcher, stream) = client
        .watch(
            "/cw/",
            Some(WatchOptions::new().with_prefix().with_start_revision(1)),
        )
        .await
        .expect("watch");
    let (seen, task) = collect_events(stream);
    let before = writers.count().await;
    wait_for(
        "live events on the first watch",
        Duration::from_secs(30),
        || async { (seen.lock().await.len() >= before + 20).then_some(()) },
    )
    .await;
    c.kill(member).await;
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the watch stream ends when its member dies")
        .expect("the watch task did not panic");
    let first: Vec<(i64, String)> = seen.lock().await.clone();
    let resume_from = first.last().map_or(1, |e| e.0 + 1);
    let before = writers.count().await;
    writers.wait_count(before + 40).await;

    let mut client = etcd_client(&c, &[other]).await;
    let (_watcher, stream) = client
        .watch(
            "/cw/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(resume_from),
            ),
        )
        .await
        .expect("watch resumed on another member");
    let (rest, task) = collect_events(stream);
    let acked = writers.finish().await;
    let last = c.wait_converged(&[leader, other]).await;
    wait_for(
        "the resumed watch to reach the last revision",
        Duration::from_secs(30),
        || async { (rest.lock().await.last().map_or(0, |e| e.0) >= last).then_some(()) },
    )
    .await;
    task.abort();

    let mut all = first;
    all.extend(rest.lock().await.iter().cloned());
    assert_exactly_once_in_order(&all);
    // Every write is a put of a new key: the revisions seen must have no gap.
    for w in all.windows(2) {
        assert_eq!(
            w[1].0,
            w[0].0 + 1,
            "events between {:?} and {:?} were missed",
            w[0],
            w[1]
        );
    }
    assert_eq!(all.last().map(|e| e.0), Some(last));
    let keys: BTreeSet<&String> = all.iter().map(|(_, k)| k).collect();
    for k in acked.keys() {
        assert!(keys.contains(k), "the watch missed acknowledged write {k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_client_lease_keep_alive_keeps_keys_past_the_ttl() {
    use etcd_client::{LeaseTimeToLiveOptions, PutOptions};
    const TTL: i64 = 3;
    let c = started_cluster().await;
    let mut client = etcd_client(&c, &[0, 1, 2]).await;
    let lease = client.lease_grant(TTL, None).await.expect("grant");
    assert_eq!(lease.ttl(), TTL);
    let id = lease.id();
    client
        .put("/held", "x", Some(PutOptions::new().with_lease(id)))
        .await
        .expect("put with the lease");
    let ttl = client
        .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .expect("time to live");
    assert_eq!(ttl.granted_ttl(), TTL);
    assert!((1..=TTL).contains(&ttl.ttl()), "remaining {}", ttl.ttl());
    assert_eq!(ttl.keys(), [b"/held".to_vec()]);

    let (mut keeper, mut answers) = client.lease_keep_alive(id).await.expect("keep-alive");
    let granted = Instant::now();
    // Renew once a second, as a client's keep-alive loop does, for three TTLs.
    let mut every_second = tokio::time::interval(Duration::from_secs(1));
    while granted.elapsed() < Duration::from_secs(3 * TTL as u64) {
        every_second.tick().await;
        keeper.keep_alive().await.expect("keep-alive sent");
        let answer = tokio::time::timeout(Duration::from_secs(5), answers.message())
            .await
            .expect("a keep-alive answer within 5 s")
            .expect("the keep-alive stream works")
            .expect("the keep-alive stream is open");
        assert_eq!((answer.id(), answer.ttl()), (id, TTL));
        let held = client.get("/held", None).await.expect("get");
        assert_eq!(
            held.kvs().len(),
            1,
            "the key expired {:?} after the grant although its lease was kept alive",
            granted.elapsed()
        );
    }
    assert_eq!(
        client
            .leases()
            .await
            .expect("leases")
            .leases()
            .iter()
            .map(|l| l.id())
            .collect::<Vec<_>>(),
        [id]
    );

    // Without renewals the lease runs out and takes its key with it.
    drop(keeper);
    drop(answers);
    wait_for(
        "the key to go once its lease is no longer renewed",
        Duration::from_secs(30),
        || {
            let mut client = client.clone();
            async move {
                let got = client.get("/held", None).await.ok()?;
                got.kvs().is_empty().then_some(())
            }
        },
    )
    .await;
    let expired = client
        .lease_time_to_live(id, None)
        .await
        .expect("time to live of an expired lease");
    assert_eq!(expired.ttl(), -1);
    let revoked = grpc_status(
        client
            .lease_revoke(id)
            .await
            .expect_err("revoke of an expired lease"),
    );
    assert_eq!(revoked.code(), tonic::Code::NotFound);
    assert_eq!(revoked.message(), "etcdserver: requested lease not found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_client_writes_retry_onto_a_new_leader_after_the_leader_is_killed() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let c = started_cluster().await;
    let leader = c.wait_leader().await;
    let client = etcd_client(&c, &[0, 1, 2]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    // key -> (value, raft term in the answer)
    let acked: Arc<Mutex<BTreeMap<String, (String, u64)>>> = Arc::new(Mutex::new(BTreeMap::new()));
    let writer = {
        let (stop, errors, acked) = (stop.clone(), errors.clone(), acked.clone());
        let mut kv = client.kv_client();
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (key, value) = (format!("/failover/{n:06}"), format!("v{n}"));
                // Retry each write until it is acknowledged; a failed attempt may or may not
                // have committed, and writing the same value again is harmless.
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    match kv.put(key.as_str(), value.as_str(), None).await {
                        Ok(resp) => {
                            let term = resp.header().map_or(0, |h| h.raft_term());
                            acked.lock().await.insert(key, (value, term));
                            break;
                        }
                        Err(e) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            assert!(
                                Instant::now() < deadline,
                                "write {key} still failing after 60 s: {e}"
                            );
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                n += 1;
            }
        })
    };
    let count = || async { acked.lock().await.len() };
    wait_for(
        "writes before the kill",
        Duration::from_secs(60),
        || async { (count().await >= 50).then_some(()) },
    )
    .await;
    let old_term = c
        .status(leader)
        .await
        .and_then(|s| s.header)
        .map_or(0, |h| h.raft_term);
    c.kill(leader).await;
    let new_leader = c.wait_new_leader(leader).await;
    let before = count().await;
    wait_for(
        "writes to go on after the kill",
        Duration::from_secs(60),
        || async { (count().await >= before + 100).then_some(()) },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("the writer did not give up");
    let acked = Arc::try_unwrap(acked).expect("writer done").into_inner();
    let new_term = acked.values().map(|(_, t)| *t).max().unwrap_or(0);
    assert!(
        new_term > old_term,
        "no write was acknowledged in a term after the killed leader's ({old_term}); \
         new leader {}, {} failed attempts",
        c.members[new_leader].name,
        errors.load(Ordering::Relaxed)
    );

    c.restart_missing().await.logs(&c).expect("restart");
    let acked: BTreeMap<String, String> = acked.into_iter().map(|(k, (v, _))| (k, v)).collect();
    check_all_present(&c, &[0, 1, 2], "/failover/", &acked).await;
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
