//! What the campaign's clients do while faults come and go, and what they saw: per-key
//! registers (read, put, compare-and-set with unique values), two-key transactions, unique
//! appends whose acknowledgements are counted at the end, watches resumed across failures
//! with progress requests, and compaction now and then. Every client talks to one member and
//! moves to the next when its member fails it, as etcd's clients do.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rkube_store::proto::etcdserverpb as pb;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use super::check::{Event, Kind, Op, WatchLog, WatchResponse};

/// Register keys (checked one by one) and the two keys the transactions move together.
pub const REGISTERS: usize = 8;
pub const TXN_KEYS: [&str; 2] = ["txn/a", "txn/b"];
/// The range the watchers watch: every register.
pub const WATCH_PREFIX: &str = "reg/";
/// How long a client waits for an answer before it counts the outcome as unknown.
const OP_TIMEOUT: Duration = Duration::from_secs(3);

/// Everything the clients saw, stamped with nanoseconds since the campaign began.
pub struct Record {
    pub start: Instant,
    pub ops: Mutex<Vec<Op>>,
    /// Unique append keys acknowledged, and how many were tried.
    pub acked: Mutex<Vec<String>>,
    pub appends_tried: AtomicU64,
    /// (who, when, header revision) of every answered request and member status.
    pub revisions: Mutex<Vec<(String, u64, i64)>>,
    pub watches: Mutex<Vec<WatchLog>>,
    pub stop: AtomicBool,
}

impl Record {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            ops: Mutex::default(),
            acked: Mutex::default(),
            appends_tried: AtomicU64::new(0),
            revisions: Mutex::default(),
            watches: Mutex::default(),
            stop: AtomicBool::new(false),
        }
    }

    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn revision(&self, who: &str, header: Option<&pb::ResponseHeader>) {
        if let Some(h) = header {
            let now = self.now();
            lock(&self.revisions).push((who.to_string(), now, h.revision));
        }
    }
}

impl Default for Record {
    fn default() -> Self {
        Self::new()
    }
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn register_key(i: usize) -> String {
    format!("{WATCH_PREFIX}{i}")
}

async fn bounded<T>(
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, ()> {
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        _ => Err(()),
    }
}

fn value_of(r: &pb::RangeResponse) -> Option<String> {
    r.kvs
        .first()
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
}

/// A compare that `key` holds `expect` (None: does not exist).
fn holds(key: &str, expect: &Option<String>) -> pb::Compare {
    use pb::compare::{CompareResult, CompareTarget, TargetUnion};
    match expect {
        Some(v) => pb::Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Value as i32,
            key: key.into(),
            target_union: Some(TargetUnion::Value(v.clone().into())),
            ..Default::default()
        },
        None => pb::Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Create as i32,
            key: key.into(),
            target_union: Some(TargetUnion::CreateRevision(0)),
            ..Default::default()
        },
    }
}

fn put_op(key: &str, value: &str) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })),
    }
}

fn get_op(key: &str) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
            key: key.into(),
            ..Default::default()
        })),
    }
}

/// One register/transaction client: `id` names it, it starts at member `id % n`.
pub async fn client(id: usize, channels: Vec<Channel>, rec: Arc<Record>, seed: u64) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (id as u64).wrapping_mul(0x9e37));
    let n = channels.len();
    let mut member = id % n;
    // A client whose request went unanswered becomes a new process (the unanswered op stays
    // open for ever in the history).
    let mut incarnation = 0usize;
    let mut seq = 0u64;
    let mut last_seen: Vec<Option<String>> = vec![None; REGISTERS + 1];
    let who = format!("client-{id}");
    while !rec.stopped() {
        let mut kv = pb::kv_client::KvClient::new(channels[member].clone());
        let process = id * 10_000 + incarnation;
        seq += 1;
        let unique = format!("c{id}-{seq}");
        let pick: f64 = rng.gen();
        let call = rec.now();
        let (keys, kind, ok): (Vec<String>, Option<Kind>, bool) = if pick < 0.1 {
            // A unique append: counted, not part of the register history.
            let key = format!("ack/{unique}");
            rec.appends_tried.fetch_add(1, Ordering::Relaxed);
            let r = bounded(kv.put(pb::PutRequest {
                key: key.clone().into(),
                value: b"1".to_vec(),
                ..Default::default()
            }))
            .await;
            if let Ok(r) = &r {
                rec.revision(&who, r.header.as_ref());
                lock(&rec.acked).push(key);
            }
            (Vec::new(), None, r.is_ok())
        } else if pick < 0.25 {
            // The two-key group, read or moved together.
            let keys: Vec<String> = TXN_KEYS.iter().map(|k| k.to_string()).collect();
            if rng.gen_bool(0.5) {
                let r = bounded(kv.txn(pb::TxnRequest {
                    success: keys.iter().map(|k| get_op(k)).collect(),
                    ..Default::default()
                }))
                .await;
                let got = r.as_ref().ok().map(|t| {
                    t.responses
                        .iter()
                        .map(|r| match &r.response {
                            Some(pb::response_op::Response::ResponseRange(rr)) => value_of(rr),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                });
                if let Ok(t) = &r {
                    rec.revision(&who, t.header.as_ref());
                }
                match got {
                    Some(got) => {
                        last_seen[REGISTERS] = got[0].clone();
                        (keys, Some(Kind::Read { got: got.clone() }), true)
                    }
                    None => (keys, None, false),
                }
            } else {
                let expect = vec![last_seen[REGISTERS].clone(), last_seen[REGISTERS].clone()];
                let values = vec![unique.clone(), unique.clone()];
                let r = bounded(
                    kv.txn(pb::TxnRequest {
                        compare: keys.iter().zip(&expect).map(|(k, e)| holds(k, e)).collect(),
                        success: keys
                            .iter()
                            .zip(&values)
                            .map(|(k, v)| put_op(k, v))
                            .collect(),
                        ..Default::default()
                    }),
                )
                .await;
                if let Ok(t) = &r {
                    rec.revision(&who, t.header.as_ref());
                    if t.succeeded {
                        last_seen[REGISTERS] = Some(unique.clone());
                    }
                }
                let ok = r.as_ref().ok().map(|t| t.succeeded);
                (keys, Some(Kind::Cas { expect, values, ok }), r.is_ok())
            }
        } else {
            let k = rng.gen_range(0..REGISTERS);
            let key = register_key(k);
            let keys = vec![key.clone()];
            if pick < 0.55 {
                let r = bounded(kv.range(pb::RangeRequest {
                    key: key.clone().into(),
                    ..Default::default()
                }))
                .await;
                match r {
                    Ok(r) => {
                        rec.revision(&who, r.header.as_ref());
                        let got = value_of(&r);
                        last_seen[k] = got.clone();
                        (keys, Some(Kind::Read { got: vec![got] }), true)
                    }
                    Err(()) => (keys, None, false),
                }
            } else if pick < 0.8 {
                let r = bounded(kv.put(pb::PutRequest {
                    key: key.clone().into(),
                    value: unique.clone().into(),
                    ..Default::default()
                }))
                .await;
                if let Ok(r) = &r {
                    rec.revision(&who, r.header.as_ref());
                    last_seen[k] = Some(unique.clone());
                }
                let ok = r.is_ok();
                (
                    keys,
                    Some(Kind::Put {
                        values: vec![unique.clone()],
                    }),
                    ok,
                )
            } else {
                let expect = vec![last_seen[k].clone()];
                let r = bounded(kv.txn(pb::TxnRequest {
                    compare: vec![holds(&key, &expect[0])],
                    success: vec![put_op(&key, &unique)],
                    ..Default::default()
                }))
                .await;
                if let Ok(t) = &r {
                    rec.revision(&who, t.header.as_ref());
                    if t.succeeded {
                        last_seen[k] = Some(unique.clone());
                    }
                }
                let ok = r.as_ref().ok().map(|t| t.succeeded);
                (
                    keys,
                    Some(Kind::Cas {
                        expect,
                        values: vec![unique.clone()],
                        ok,
                    }),
                    r.is_ok(),
                )
            }
        };
        if let Some(kind) = kind {
            let ret = ok.then(|| rec.now());
            lock(&rec.ops).push(Op {
                client: process,
                call,
                ret,
                keys,
                kind,
            });
        }
        if !ok {
            // This member failed us: the next one, after a pause as a client library would.
            incarnation += 1;
            member = (member + 1) % n;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A watcher of every register from the revision `from`, resumed after every break from the
/// revision after the last it saw, asking for progress now and then.
pub async fn watcher(id: usize, channels: Vec<Channel>, rec: Arc<Record>, from: i64) {
    let n = channels.len();
    let mut member = id % n;
    let prefix_end = rkube_store::mvcc::prefix_end(WATCH_PREFIX.as_bytes());
    let mut log = WatchLog {
        watcher: id,
        start: WATCH_PREFIX.to_string(),
        end: String::from_utf8_lossy(&prefix_end).into_owned(),
        responses: Vec::new(),
    };
    let mut next = from;
    while !rec.stopped() {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key: WATCH_PREFIX.into(),
                    range_end: prefix_end.clone(),
                    start_revision: next,
                    ..Default::default()
                },
            )),
        };
        let _ = tx.send(create).await;
        let mut client = pb::watch_client::WatchClient::new(channels[member].clone());
        let started = tokio::time::timeout(
            OP_TIMEOUT,
            client.watch(tokio_stream::wrappers::ReceiverStream::new(rx)),
        )
        .await;
        let mut stream = match started {
            Ok(Ok(s)) => s.into_inner(),
            _ => {
                member = (member + 1) % n;
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        log.responses.push(WatchResponse::Started { from: next });
        let mut progress_due = Instant::now() + Duration::from_secs(1);
        let mut created = false;
        loop {
            if rec.stopped() {
                break;
            }
            let resp = tokio::select! {
                r = stream.next() => r,
                _ = tokio::time::sleep_until(progress_due) => {
                    progress_due = Instant::now() + Duration::from_secs(1);
                    let _ = tx.try_send(pb::WatchRequest {
                        request_union: Some(pb::watch_request::RequestUnion::ProgressRequest(
                            pb::WatchProgressRequest {},
                        )),
                    });
                    continue;
                }
                // A member that stopped answering (paused, cut off) is left after a while
                // without events or progress.
                _ = tokio::time::sleep(Duration::from_secs(5)) => None,
            };
            // Watch headers are a member's own revision, not linearizable: not recorded as a
            // client's observations.
            let Some(Ok(resp)) = resp else { break };
            let header = resp.header.as_ref().map_or(0, |h| h.revision);
            if resp.compact_revision > 0 {
                log.responses.push(WatchResponse::Compacted {
                    compact_revision: resp.compact_revision,
                });
                next = resp.compact_revision;
                break;
            }
            if resp.canceled {
                break;
            }
            if resp.created && !created {
                created = true;
                continue;
            }
            if resp.events.is_empty() {
                log.responses.push(WatchResponse::Progress { header });
                continue;
            }
            let events: Vec<Event> = resp
                .events
                .iter()
                .map(|e| {
                    let kv = e.kv.clone().unwrap_or_default();
                    Event {
                        revision: kv.mod_revision,
                        key: String::from_utf8_lossy(&kv.key).into_owned(),
                        put: e.r#type == rkube_store::proto::mvccpb::event::EventType::Put as i32,
                        value: String::from_utf8_lossy(&kv.value).into_owned(),
                    }
                })
                .collect();
            next = events.iter().map(|e| e.revision).max().unwrap_or(next - 1) + 1;
            log.responses.push(WatchResponse::Events { header, events });
        }
        member = (member + 1) % n;
    }
    lock(&rec.watches).push(log);
}

/// Compacts the store to a little behind its head every few seconds, so that watchers resume
/// near the compaction point.
pub async fn compactor(channels: Vec<Channel>, rec: Arc<Record>) {
    let mut i = 0;
    while !rec.stopped() {
        tokio::time::sleep(Duration::from_secs(4)).await;
        i += 1;
        let mut kv = pb::kv_client::KvClient::new(channels[i % channels.len()].clone());
        let Ok(r) = bounded(kv.range(pb::RangeRequest {
            key: b"probe".to_vec(),
            ..Default::default()
        }))
        .await
        else {
            continue;
        };
        let head = r.header.map_or(0, |h| h.revision);
        if head > 300 {
            let _ = bounded(kv.compact(pb::CompactionRequest {
                revision: head - 300,
                physical: false,
            }))
            .await;
        }
    }
}
