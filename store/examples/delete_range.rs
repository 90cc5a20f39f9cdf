//! How long one DeleteRange over many keys takes to stage and commit, and the memory it takes:
//! the final step of `etcdctl check perf`, which deletes every key it wrote (256-byte keys,
//! 1 KiB values) in one request.
//!
//! `cargo run --release -p rkube-store --example delete_range -- [KEYS]` (default 100,000).
//! Peak RSS is the process's VmHWM, reset after the keys are loaded.

use std::time::Instant;

use rkube_store::mvcc::{Command, DeleteRequest, KeyRange, MvccStore, Op, PutRequest, TxnRequest};

const PREFIX: &[u8] = b"/etcdctl-check-perf/";

fn txn(op: Op) -> Command {
    Command::Txn(TxnRequest {
        compare: Vec::new(),
        success: vec![op],
        failure: Vec::new(),
    })
}

/// Like etcdctl's keys: the prefix, then a varint of a random number in 256 bytes.
fn key(i: u64) -> Vec<u8> {
    let mut key = PREFIX.to_vec();
    let mut body = [0u8; 256];
    let mut n = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 1;
    let mut at = 0;
    while n >= 0x80 {
        body[at] = (n as u8) | 0x80;
        n >>= 7;
        at += 1;
    }
    body[at] = n as u8;
    key.extend_from_slice(&body);
    key
}

fn status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn mib(kib: u64) -> String {
    format!("{:.0} MiB", kib as f64 / 1024.0)
}

fn main() {
    let keys: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().expect("temporary directory");
    // As a member opens it.
    let db = sled::Config::new()
        .path(dir.path().join("db"))
        .cache_capacity(256 * 1024 * 1024)
        .flush_every_ms(None)
        .open()
        .expect("sled opens");
    let store = MvccStore::open(&db).expect("store opens");

    let started = Instant::now();
    let value = vec![0u8; 1024];
    let mut i = 0;
    while i < keys {
        // As the state machine applies them: many puts to one commit.
        let mut changes = store.changes();
        for _ in 0..256.min(keys - i) {
            let put = Op::Put(PutRequest {
                key: key(i),
                value: value.clone(),
                ..Default::default()
            });
            store
                .stage(&mut changes, &txn(put))
                .expect("storage")
                .expect("staged");
            i += 1;
        }
        store.commit(changes).expect("commit");
    }
    println!(
        "loaded {keys} keys in {:.2?}; RSS {}",
        started.elapsed(),
        mib(status("VmRSS:"))
    );

    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = status("VmHWM:");
    let delete = txn(Op::Delete(DeleteRequest {
        range: KeyRange::prefix(PREFIX),
        prev_kv: false,
    }));
    let started = Instant::now();
    let mut changes = store.changes();
    let applied = store
        .stage(&mut changes, &delete)
        .expect("storage")
        .expect("staged");
    let staged = started.elapsed();
    store.commit(changes).expect("commit");
    let total = started.elapsed();
    assert!(applied.output.is_ok(), "the delete applies: {applied:?}");
    println!(
        "DeleteRange of {keys} keys: stage {staged:.2?}, commit {:.2?}, total {total:.2?}; \
         peak RSS {} (before the delete {}), RSS after {}",
        total - staged,
        mib(status("VmHWM:")),
        mib(before),
        mib(status("VmRSS:"))
    );
}
