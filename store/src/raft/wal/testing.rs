//! What the log's tests share: entries to append, an append that waits for its group commit,
//! and what the log and its directory hold.

use std::path::{Path, PathBuf};

use openraft::testing::log_id;
use openraft::EntryPayload;

use super::{Waiter, Wal};
use crate::raft::Entry;

pub(super) fn blank(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, 0, index),
        payload: EntryPayload::Blank,
    }
}

/// Appends and waits for the group commit.
pub(super) async fn append(wal: &Wal, entries: Vec<Entry>) {
    let (cb, rx) = tokio::sync::oneshot::channel();
    wal.append(entries, Waiter::Done(cb)).expect("append");
    rx.await.expect("callback").expect("synced");
}

pub(super) fn indexes(wal: &Wal) -> Vec<u64> {
    wal.read(0, u64::MAX)
        .expect("read")
        .into_iter()
        .map(|e| e.log_id.index)
        .collect()
}

pub(super) fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    v.sort();
    v
}
