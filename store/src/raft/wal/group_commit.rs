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
use crate::failpoints::{
    crash_point, RAFT_LOG_AFTER_FSYNC, RAFT_LOG_BEFORE_FSYNC, RAFT_LOG_LEADER_BEFORE_FSYNC,
};
use crate::raft::LogId;
use crate::raft::TypeConfig;

/// What the syncer tells when a sync is done.
pub enum Waiter {
    Log(LogFlushed<TypeConfig>),
    Done(tokio::sync::oneshot::Sender<io::Result<()>>),
    /// Nobody waits: the write was acknowledged before its sync (a leader's own entries, see
    /// `LogStore::append`), and the sync only moves the durable watermark on.
    Nobody,
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
            Waiter::Nobody => {}
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

    /// Every write up to `upto` is on stable storage: moves the watermark, and tells the leader
    /// to send on a commit index that was held back for it.
    fn synced_upto(&self, upto: u64) {
        self.synced.send_if_modified(|s| {
            let moved = upto > *s;
            *s = (*s).max(upto);
            moved
        });
        let held = self.held_back.load(Ordering::Acquire);
        if held != 0 && self.entry_synced(held, upto) {
            let _ = self
                .held_back
                .compare_exchange(held, 0, Ordering::AcqRel, Ordering::Relaxed);
            self.released.notify_one();
        }
    }

    /// Whether the entry this log holds at `index` was written by write `upto` or before (an
    /// entry it no longer holds was purged behind a snapshot on disk, or truncated: nothing
    /// to wait for).
    fn entry_synced(&self, index: u64, upto: u64) -> bool {
        self.lock().locs.get(&index).is_none_or(|l| l.write <= upto)
    }

    /// Waits until the entry this log holds at `index` is on stable storage.
    pub async fn durable(&self, index: u64) {
        let write = match self.lock().locs.get(&index) {
            Some(l) => l.write,
            None => return,
        };
        let mut synced = self.synced.subscribe();
        // The sender lives as long as `self`.
        let _ = synced.wait_for(|s| *s >= write).await;
    }

    /// The largest log id up to `commit` whose entry is on stable storage here, which is what
    /// a leader may tell its followers is committed: an entry counts as committed once a
    /// quorum has it, and this leader counts itself before its sync. When that is less than
    /// `commit`, the sync that covers `commit` wakes [`Wal::released`].
    pub fn durable_commit(&self, commit: LogId) -> Option<LogId> {
        let inner = self.lock();
        if inner.last_purged.is_some_and(|p| p.index >= commit.index) {
            return Some(commit);
        }
        let upto = *self.synced.borrow();
        let durable = inner
            .locs
            .range(..=commit.index)
            .rev()
            .find(|(_, loc)| loc.write <= upto)
            .map(|(_, loc)| loc.log_id)
            // Entries up to the purge point are behind a snapshot on disk.
            .or(inner.last_purged);
        if durable.is_none_or(|d| d.index < commit.index) {
            self.held_back.fetch_max(commit.index, Ordering::AcqRel);
        }
        durable
    }

    /// Returns once a commit index held back by [`Wal::durable_commit`] has become durable.
    pub async fn released(&self) {
        self.released.notified().await
    }

    /// Waits until everything written so far is synced.
    pub(super) async fn synced(&self) -> io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.enqueue(Waiter::Done(tx));
        rx.await
            .map_err(|_| io::Error::other("the write-ahead log's sync thread is gone"))?
    }
}

/// Puts the calling thread under `SCHED_BATCH`, or back under `SCHED_OTHER`.
///
/// The sync thread follows what it syncs. A leader's own entries are reported written before
/// their sync (`LogStore::append`), and the thread that wrote them goes on to send them to the
/// followers; their answers, not this sync, are what the write waits for. Under `SCHED_OTHER`
/// the wake-up of the sync thread often preempted that thread between the write and the
/// AppendEntries: traced with bpftrace on a leader during put with 1 client, the time from the
/// entries' `pwrite` to the first AppendEntries' `writev` averaged 45 µs, 21 µs under
/// `SCHED_BATCH`, whose wake-ups never preempt the running thread (the kernel's fair scheduler
/// leaves that to the tick). Everything else the thread syncs has a waiter that needs the sync
/// at once (a follower answers its leader only after it), so it runs under `SCHED_OTHER`.
fn set_batch_policy(batch: bool) {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if batch {
        libc::SCHED_BATCH
    } else {
        libc::SCHED_OTHER
    };
    // SAFETY: `param` is a valid sched_param, and pid 0 is the calling thread. Moving between
    // these two policies needs no privilege.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        tracing::warn!(
            error = %io::Error::last_os_error(),
            "cannot set the scheduling policy of the write-ahead log's sync thread"
        );
    }
}

/// The group-commit thread: takes every waiter queued, syncs the active segment once, and
/// completes them all.
pub(super) struct Syncer {
    pub(super) wal: std::sync::Weak<Wal>,
}

impl Syncer {
    pub(super) fn run(self, rx: mpsc::Receiver<Waiter>) {
        #[cfg(test)]
        if let Some(wal) = self.wal.upgrade() {
            // SAFETY: gettid has no preconditions.
            let _ = wal.sync_thread.set(unsafe { libc::gettid() });
        }
        let mut batch_policy = false;
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            batch.extend(rx.try_iter());
            let leaders_own = batch.iter().any(|w| matches!(w, Waiter::Nobody));
            if leaders_own != batch_policy {
                set_batch_policy(leaders_own);
                batch_policy = leaders_own;
            }
            let Some(wal) = self.wal.upgrade() else {
                for w in batch {
                    w.complete(&Err(io::Error::other("the write-ahead log is closed")));
                }
                return;
            };
            let (file, upto) = {
                let inner = wal.lock();
                (inner.active_file(), inner.writes)
            };
            if leaders_own {
                crash_point(RAFT_LOG_LEADER_BEFORE_FSYNC);
            }
            crash_point(RAFT_LOG_BEFORE_FSYNC);
            let result = wal.sync_file(&file);
            crash_point(RAFT_LOG_AFTER_FSYNC);
            match &result {
                Ok(()) => wal.synced_upto(upto),
                // As etcd does: a failed fsync may have dropped the data it was to make
                // durable, and retrying cannot tell; every waiter learns of the failure, and
                // the durable watermark stays where it was.
                Err(e) => tracing::error!(error = %e, "fdatasync of the write-ahead log failed"),
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
    use std::time::Duration;

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

    /// The sync thread runs under SCHED_BATCH while it syncs a leader's own entries (nobody
    /// waits for them), so that waking it does not preempt the thread sending them to the
    /// followers, and under SCHED_OTHER for everything else.
    #[tokio::test]
    async fn the_sync_thread_yields_to_a_leaders_sends_only_for_its_own_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wal = Wal::open(&dir.path().join("wal"), false).expect("open");
        append(&wal, vec![blank(1, 1)]).await;
        let tid = *wal.sync_thread.get().expect("the sync thread's id");
        // SAFETY: sched_getscheduler only reads the policy of the thread `tid` names.
        let policy = || unsafe { libc::sched_getscheduler(tid) };
        assert_eq!(policy(), libc::SCHED_OTHER, "syncing a follower's append");
        wal.append(vec![blank(1, 2)], Waiter::Nobody)
            .expect("append");
        tokio::time::timeout(Duration::from_secs(10), wal.durable(2))
            .await
            .expect("synced");
        assert_eq!(policy(), libc::SCHED_BATCH, "syncing a leader's own entry");
        append(&wal, vec![blank(1, 3)]).await;
        assert_eq!(policy(), libc::SCHED_OTHER, "syncing an append that waits");
    }

    /// A leader's own entry is reported written before its sync; until that sync, the log
    /// holds the commit index it tells followers below the entry, and an apply waiting for it
    /// waits. (The leader-only failpoint slows that one sync; no other test here reaches it.)
    #[tokio::test]
    async fn an_entry_reported_before_its_sync_is_held_back_until_synced() {
        use openraft::testing::log_id;
        let dir = tempfile::tempdir().expect("tempdir");
        let wal = Wal::open(&dir.path().join("wal"), false).expect("open");
        append(&wal, vec![blank(1, 1)]).await;
        fail::cfg(RAFT_LOG_LEADER_BEFORE_FSYNC, "sleep(1000)").expect("failpoint");
        wal.append(vec![blank(1, 2)], Waiter::Nobody)
            .expect("append");
        let held = wal.durable_commit(log_id(1, 0, 2));
        let durable = wal.durable(2);
        tokio::pin!(durable);
        let early = tokio::time::timeout(Duration::from_millis(200), &mut durable).await;
        let released = tokio::time::timeout(Duration::from_secs(10), wal.released()).await;
        fail::remove(RAFT_LOG_LEADER_BEFORE_FSYNC);
        assert_eq!(
            held,
            Some(log_id(1, 0, 1)),
            "a follower may learn only what is synced"
        );
        assert!(
            early.is_err(),
            "the entry counted as durable before its sync"
        );
        assert!(
            released.is_ok(),
            "the sync did not release the held-back commit index"
        );
        tokio::time::timeout(Duration::from_secs(10), durable)
            .await
            .expect("durable once synced");
        assert_eq!(wal.durable_commit(log_id(1, 0, 2)), Some(log_id(1, 0, 2)));
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
