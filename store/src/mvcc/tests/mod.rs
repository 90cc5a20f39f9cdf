//! etcd's MVCC semantics, checked against the store directly: revisions and versions, ranges,
//! reads at past revisions, transactions, compaction, leases, watchers, and snapshots.
//!
//! Each test builds its state from commands through a tiny helper layer (`put`, `del`, `Txn`,
//! `get`, ...) so that a case reads like the etcdctl session it stands for. The helpers are
//! here; the cases are in one file per subject (`range.rs`, `txn.rs`, `watchers.rs`,
//! `commits.rs` for staging and crashes in a commit, ...).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::store::MAX_TXN_OPS;
use super::watch::{self, WatchMessage, WatchSpec};
use super::*;
use crate::error::MvccError;

mod alarms;
mod commits;
mod compaction;
mod leases;
mod range;
mod revisions;
mod snapshots;
mod txn;
mod watchers;

fn new_store() -> Arc<MvccStore> {
    let db = sled::Config::new()
        .temporary(true)
        .open()
        .expect("temporary sled db opens");
    Arc::new(MvccStore::open(&db).expect("mvcc store opens"))
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn apply(s: &MvccStore, cmd: Command) -> Applied {
    s.apply(&cmd, Vec::new()).expect("storage does not fail")
}

fn put(s: &MvccStore, key: &str, value: &str) -> Applied {
    apply(s, cmd_put(key, value))
}

fn put_lease(s: &MvccStore, key: &str, value: &str, lease: i64) -> Applied {
    apply(s, Txn::new().then(op_put_lease(key, value, lease)).cmd())
}

fn del(s: &MvccStore, range: KeyRange) -> Applied {
    apply(s, Txn::new().then(op_del(range)).cmd())
}

fn grant(s: &MvccStore, id: i64, ttl: i64) -> Applied {
    apply(s, Command::LeaseGrant { id, ttl })
}

fn cmd_put(key: &str, value: &str) -> Command {
    Txn::new().then(op_put(key, value)).cmd()
}

fn op_put(key: &str, value: &str) -> Op {
    op_put_lease(key, value, 0)
}

fn op_put_lease(key: &str, value: &str, lease: i64) -> Op {
    Op::Put(PutRequest {
        key: b(key),
        value: b(value),
        lease,
        ..Default::default()
    })
}

fn op_del(range: KeyRange) -> Op {
    Op::Delete(DeleteRequest {
        range,
        prev_kv: false,
    })
}

fn op_get(key: &str) -> Op {
    Op::Range(req(KeyRange::single(key)))
}

fn op_range(range: KeyRange) -> Op {
    Op::Range(req(range))
}

fn cmp(key: &str, result: CompareResult, target: CompareTarget) -> Compare {
    Compare {
        range: KeyRange::single(key),
        result,
        target,
    }
}

/// Builds a transaction: `Txn::new().when(..).then(..).otherwise(..)`.
#[derive(Default, Clone)]
struct Txn(TxnRequest);

impl Txn {
    fn new() -> Self {
        Self::default()
    }
    fn when(mut self, c: Compare) -> Self {
        self.0.compare.push(c);
        self
    }
    fn then(mut self, op: Op) -> Self {
        self.0.success.push(op);
        self
    }
    fn otherwise(mut self, op: Op) -> Self {
        self.0.failure.push(op);
        self
    }
    fn op(self) -> Op {
        Op::Txn(self.0)
    }
    fn cmd(self) -> Command {
        Command::Txn(self.0)
    }
}

/// Every key: etcd's `key = range_end = "\0"`.
fn all() -> KeyRange {
    KeyRange {
        key: vec![0],
        range_end: vec![0],
    }
}

fn between(key: &str, range_end: &str) -> KeyRange {
    KeyRange {
        key: b(key),
        range_end: b(range_end),
    }
}

/// Every key from `key` on: etcd's `range_end = "\0"`.
fn from_key(key: &str) -> KeyRange {
    KeyRange {
        key: b(key),
        range_end: vec![0],
    }
}

fn req(range: KeyRange) -> RangeRequest {
    RangeRequest {
        range,
        ..Default::default()
    }
}

fn range(s: &MvccStore, r: RangeRequest) -> Result<RangeResult, MvccError> {
    s.range(&r).map(|(result, _)| result)
}

fn get(s: &MvccStore, key: &str) -> Option<KeyValue> {
    get_at(s, key, 0).expect("a read at the newest revision works")
}

fn get_at(s: &MvccStore, key: &str, revision: i64) -> Result<Option<KeyValue>, MvccError> {
    let r = range(
        s,
        RangeRequest {
            revision,
            ..req(KeyRange::single(key))
        },
    )?;
    assert!(r.kvs.len() <= 1, "a single key read returned {:?}", r.kvs);
    Ok(r.kvs.into_iter().next())
}

/// What a read returns.
type Read = Result<Vec<KeyValue>, MvccError>;

/// Watch messages as (revision, events).
type Messages = Vec<(i64, Vec<Event>)>;

fn keys(kvs: &[KeyValue]) -> Vec<String> {
    kvs.iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

fn kv(key: &str, value: &str, create: i64, modified: i64, version: i64) -> KeyValue {
    KeyValue {
        key: b(key).into(),
        create_revision: create,
        mod_revision: modified,
        version,
        value: b(value).into(),
        lease: 0,
    }
}

fn txn_result(applied: &Applied) -> &TxnResult {
    match &applied.output {
        Ok(Output::Txn(t)) => t,
        other => panic!("expected a transaction result, got {other:?}"),
    }
}

fn range_response(op: &OpResult) -> &RangeResult {
    match op {
        OpResult::Range(r) => r,
        other => panic!("expected a range response, got {other:?}"),
    }
}

const WAIT: Duration = Duration::from_secs(10);

async fn next(rx: &mut tokio::sync::mpsc::Receiver<WatchMessage>) -> WatchMessage {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a watch message within the timeout")
        .expect("the watcher is still running")
}

fn put_event(key: &str, value: &str, create: i64, modified: i64, version: i64) -> Event {
    Event {
        kind: EventKind::Put,
        kv: kv(key, value, create, modified, version),
        prev_kv: None,
    }
}

fn delete_event(key: &str, modified: i64) -> Event {
    Event {
        kind: EventKind::Delete,
        kv: KeyValue {
            key: b(key).into(),
            mod_revision: modified,
            ..Default::default()
        },
        prev_kv: None,
    }
}

fn with_prev(mut e: Event, prev: KeyValue) -> Event {
    e.prev_kv = Some(prev);
    e
}

fn alarm(s: &MvccStore, activate: bool, member: u64) -> Applied {
    apply(
        s,
        Command::Alarm {
            activate,
            member,
            alarm: AlarmKind::NoSpace,
        },
    )
}

fn put_cmd_lease(key: &str, value: &str, lease: i64) -> Command {
    Txn::new().then(op_put_lease(key, value, lease)).cmd()
}
