//! Group commit: a thread syncs the active segment once for every write queued meanwhile and
//! then acknowledges them all; and the fdatasync itself, counted and timed.

use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

use openraft::storage::LogFlushed;
use prometheus_client::metrics::histogram::Histogram;

use super::Wal;
use crate::failpoints::{crash_point, RAFT_LOG_AFTER_FSYNC, RAFT_LOG_BEFORE_FSYNC};
use crate::raft::TypeConfig;

/// What the syncer tells when a sync is done.
pub enum Waiter {
    Log(LogFlushed<TypeConfig>),
    Done(tokio::sync::oneshot::Sender<io::Result<()>>),
}

impl Waiter {
    pub(super) fn complete(self, result: &io::Result<()>) {
        let result = match result {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        match self {
            Waiter::Log(cb) => cb.log_io_completed(result),
            Waiter::Done(tx) => {
                let _ = tx.send(result);
            }
        }
    }
}

fn fdatasync(file: &File) -> io::Result<()> {
    file.sync_data()
}

impl Wal {
    /// Reports the duration of every fdatasync into `h` (the first histogram given stays).
    pub fn observe_fsyncs(&self, h: Histogram) {
        let _ = self.fsync_seconds.set(h);
    }

    pub(super) fn sync_file(&self, file: &File) -> io::Result<()> {
        if self.no_fsync {
            return Ok(());
        }
        let started = Instant::now();
        let r = fdatasync(file);
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        if let Some(h) = self.fsync_seconds.get() {
            h.observe(started.elapsed().as_secs_f64());
        }
        r
    }

    pub(super) fn enqueue(&self, waiter: Waiter) {
        let tx = self.sync_tx.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(mpsc::SendError(w)) = tx.send(waiter) {
            w.complete(&Err(io::Error::other(
                "the write-ahead log's sync thread is gone",
            )));
        }
    }

    /// Waits until everything written so far is synced.
    pub(super) async fn synced(&self) -> io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.enqueue(Waiter::Done(tx));
        rx.await
            .map_err(|_| io::Error::other("the write-ahead log's sync thread is gone"))?
    }
}

/// The group-commit thread: takes every waiter queued, syncs the active segment once, and
/// completes them all.
pub(super) struct Syncer {
    pub(super) wal: std::sync::Weak<Wal>,
}

impl Syncer {
    pub(super) fn run(self, rx: mpsc::Receiver<Waiter>) {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            batch.extend(rx.try_iter());
            let Some(wal) = self.wal.upgrade() else {
                for w in batch {
                    w.complete(&Err(io::Error::other("the write-ahead log is closed")));
                }
                return;
            };
            let file = wal.lock().active_file();
            crash_point(RAFT_LOG_BEFORE_FSYNC);
            let result = wal.sync_file(&file);
            crash_point(RAFT_LOG_AFTER_FSYNC);
            if let Err(e) = &result {
                // As etcd does: a failed fsync may have dropped the data it was to make
                // durable, and retrying cannot tell; every waiter learns of the failure.
                tracing::error!(error = %e, "fdatasync of the write-ahead log failed");
            }
            drop(wal);
            for w in batch {
                w.complete(&result);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::wal::testing::{append, blank};
    use crate::raft::Vote;

    #[tokio::test]
    async fn one_fdatasync_covers_every_batch_written_before_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wal = Wal::open(&dir.path().join("wal"), false).expect("open");
        let base = wal.stats.syncs.load(Ordering::Relaxed);
        let mut pending = Vec::new();
        for i in 1..=50 {
            let (cb, rx) = tokio::sync::oneshot::channel();
            wal.append(vec![blank(1, i)], Waiter::Done(cb))
                .expect("append");
            pending.push(rx);
        }
        for rx in pending {
            rx.await.expect("callback").expect("synced");
        }
        let syncs = wal.stats.syncs.load(Ordering::Relaxed) - base;
        assert!(syncs >= 1, "acknowledged without an fdatasync");
        assert!(syncs <= 50, "at most one fdatasync per batch: {syncs}");
        assert_eq!(wal.stats.appends.load(Ordering::Relaxed), 50);
    }

    #[tokio::test]
    async fn unsafe_no_fsync_acknowledges_without_syncing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wal = Wal::open(&dir.path().join("wal"), true).expect("open");
        append(&wal, vec![blank(1, 1)]).await;
        wal.save_vote(&Vote::new(1, 1)).await.expect("vote");
        assert_eq!(wal.stats.syncs.load(Ordering::Relaxed), 0);
    }
}
