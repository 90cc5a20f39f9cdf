//! Watches over the raw gRPC API across failures: every event exactly once, in order, through
//! a leader change and when resumed on another member after the watched one was killed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cluster_tests::{wait_for, Cluster, Options, WatchClient};
use futures::StreamExt;
use rkube_store::proto::etcdserverpb as pb;
use tokio::sync::Mutex;

use super::common::{assert_exactly_once_in_order, Writers};

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
