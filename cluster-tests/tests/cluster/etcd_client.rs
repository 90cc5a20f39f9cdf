//! The etcd-client crate (a third-party Rust client, as applications use it) over mutual TLS
//! with the CA and admin certificate of DIR/pki.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster_tests::{wait_for, Cluster, WithLogs};
use tokio::sync::Mutex;

use super::common::{assert_exactly_once_in_order, check_all_present, started_cluster, Writers};

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

/// A compaction sent to a follower is answered once that follower has applied it, as etcd
/// answers it: a serializable read of a compacted revision sent to the same member right after
/// is refused as compacted. The follower applies every entry 300 ms late (the `apply-before`
/// failpoint's `sleep`), so without that wait it would still serve the old revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_through_a_follower_is_applied_there_before_it_is_answered() {
    use etcd_client::GetOptions;
    let mut c = started_cluster().await;
    let leader = c.wait_leader().await;
    let follower = (leader + 1) % 3;
    c.kill(follower).await;
    let slow = format!("{}=sleep(300)", rkube_store::failpoints::APPLY_BEFORE);
    c.spawn_server_with_env(
        follower,
        &[0, 1, 2],
        "new",
        &[],
        &[("RKUBE_FAILPOINTS", &slow)],
    )
    .expect("restart the follower with slow applies");
    c.wait_converged(&[0, 1, 2]).await;
    let mut client = etcd_client(&c, &[follower]).await;
    let old = client
        .put("/compact/k", "old", None)
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision();
    let head = client
        .put("/compact/k", "new", None)
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision();
    client.compact(head, None).await.expect("compact");
    let read = client
        .get(
            "/compact/k",
            Some(GetOptions::new().with_revision(old).with_serializable()),
        )
        .await
        .map(|r| r.kvs().len())
        .map_err(grpc_status);
    assert!(
        matches!(&read, Err(s) if s.message() == "etcdserver: mvcc: required revision has been compacted"),
        "a serializable read at revision {old}, compacted at {head} through the same follower, gave {read:?}"
    );
}

/// A leader tells openraft its own entries are written before their fdatasync (so that it
/// replicates them while it syncs), and may count itself in a quorum before that sync. No
/// member may show the write before the put is answered, though: the leader applies only what
/// its log has synced, and tells followers a commit index only up to that. Here the leader's
/// sync of its own entries is 1.5 s late (the leader-only failpoint; followers sync at once):
/// reads on every member, while the put is unanswered, must not see it, and every member sees
/// it soon after the answer. Without either rule, the leader or the followers show the write
/// within milliseconds, while it is durable on the followers alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_member_shows_a_write_before_the_leader_has_synced_it() {
    use etcd_client::GetOptions;
    let mut c = started_cluster().await;
    let slow = format!(
        "{}=sleep(1500)",
        rkube_store::failpoints::RAFT_LOG_LEADER_BEFORE_FSYNC
    );
    for m in 0..3 {
        c.kill(m).await;
        c.spawn_server_with_env(m, &[0, 1, 2], "new", &[], &[("RKUBE_FAILPOINTS", &slow)])
            .expect("restart with a slow leader sync");
        c.wait_converged(&[0, 1, 2]).await;
    }
    let leader = c.wait_leader().await;
    let mut readers = Vec::new();
    for m in 0..3 {
        readers.push((m, etcd_client(&c, &[m]).await));
    }
    let mut writer = etcd_client(&c, &[leader]).await;
    writer
        .put("/durable/warm", "up", None)
        .await
        .expect("a first put");

    // The leader's sync of the put's entry is held 1.5 s: a read sent in the first second
    // after the put must not see it on any member. (A read later in the put's life may: the
    // leader applies the entry a moment before its answer reaches this client.)
    const BEFORE_SYNC: Duration = Duration::from_millis(1000);
    let put_started = Instant::now();
    let put = tokio::spawn(async move {
        let r = writer.put("/durable/k", "v", None).await;
        (r.map(|_| ()), put_started.elapsed())
    });
    let mut reads_while_pending = 0;
    while !put.is_finished() {
        for (m, client) in readers.iter_mut() {
            let sent = put_started.elapsed();
            let got = client
                .get("/durable/k", Some(GetOptions::new().with_serializable()))
                .await
                .map(|r| r.kvs().len());
            if let Ok(n) = got {
                if sent < BEFORE_SYNC {
                    reads_while_pending += 1;
                    assert_eq!(
                        n, 0,
                        "m{m} (the leader is m{leader}) showed the write {sent:?} after the put \
                         was sent, before the leader's sync"
                    );
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (result, took) = put.await.expect("put task");
    result.expect("the put is answered");
    assert!(
        took >= BEFORE_SYNC,
        "the put was answered in {took:?}, before the leader's late sync: the failpoint did not hold it"
    );
    assert!(
        reads_while_pending > 3,
        "only {reads_while_pending} reads ran in the put's first second"
    );
    for (m, client) in &readers {
        wait_for(
            &format!("m{m} to show the answered write"),
            Duration::from_secs(20),
            || {
                let mut client = client.clone();
                async move {
                    client
                        .get("/durable/k", Some(GetOptions::new().with_serializable()))
                        .await
                        .ok()
                        .filter(|r| r.kvs().len() == 1)
                        .map(|_| ())
                }
            },
        )
        .await;
    }
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
