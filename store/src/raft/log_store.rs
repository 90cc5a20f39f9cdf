//! The Raft log and vote in sled.
//!
//! # Correctness
//! `append` reports completion only after sled has flushed (fsync) the entries; `save_vote`
//! flushes before returning. The log and the state machine share one sled database, so a flush
//! also makes every state change applied before it durable.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::histogram::Histogram;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};

use crate::failpoints::{crash_point, RAFT_LOG_AFTER_FSYNC, RAFT_LOG_BEFORE_FSYNC};

use super::{
    logs_delete, logs_read, logs_write, store_read, store_write, vote_write, Entry, LogId,
    RaftStorageError, TypeConfig, Vote,
};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    /// The committed index as openraft last reported it, for status and metrics.
    committed: Arc<AtomicU64>,
    fsync_seconds: Option<Histogram>,
    /// The state machine's [`super::state_machine::StateMachine::snapshot_watermark`]: a purge
    /// is persisted only once a snapshot covering it is on disk.
    snapshot_on_disk: Option<tokio::sync::watch::Receiver<u64>>,
}

impl LogStore {
    pub fn open(db: &sled::Db) -> Result<Self, sled::Error> {
        Ok(Self {
            db: db.clone(),
            log: db.open_tree("raft_log")?,
            meta: db.open_tree("raft_meta")?,
            committed: Arc::new(AtomicU64::new(0)),
            fsync_seconds: None,
            snapshot_on_disk: None,
        })
    }

    /// Purges wait until the state machine's snapshot on disk covers them.
    pub fn purging_behind(mut self, snapshot_on_disk: tokio::sync::watch::Receiver<u64>) -> Self {
        self.snapshot_on_disk = Some(snapshot_on_disk);
        self
    }

    /// Reports the committed index into `committed` and fsync times into `fsync_seconds`.
    pub fn observed(mut self, committed: Arc<AtomicU64>, fsync_seconds: Histogram) -> Self {
        self.committed = committed;
        self.fsync_seconds = Some(fsync_seconds);
        self
    }

    fn get_meta<T: for<'de> serde::Deserialize<'de>>(
        &self,
        key: &[u8],
    ) -> Result<Option<T>, RaftStorageError> {
        match self.meta.get(key).map_err(store_read)? {
            Some(v) => bincode::deserialize(&v).map(Some).map_err(store_read),
            None => Ok(None),
        }
    }

    fn put_meta<T: serde::Serialize>(&self, key: &[u8], value: &T) -> Result<(), RaftStorageError> {
        let bytes = bincode::serialize(value).map_err(store_write)?;
        self.meta.insert(key, bytes).map_err(store_write)?;
        Ok(())
    }

    async fn flush(&self) -> Result<(), sled::Error> {
        let started = std::time::Instant::now();
        // On tokio's blocking pool, whose threads stay: sled's own flush_async hands each flush
        // to its I/O pool, which starts threads afresh under load (measured: about 40% of a
        // leader's CPU at 64 clients went to those threads).
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.flush())
            .await
            .map_err(|e| sled::Error::Io(std::io::Error::other(e.to_string())))??;
        if let Some(h) = &self.fsync_seconds {
            h.observe(started.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// Number of entries currently kept.
    pub fn len(&self) -> usize {
        self.log.len()
    }

    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }

    /// Forgets the whole log, the vote and the commit index, durably (a forced new cluster
    /// starts its Raft state afresh over the applied data).
    pub fn wipe(&self) -> Result<(), sled::Error> {
        self.log.clear()?;
        self.meta.clear()?;
        self.db.flush()?;
        Ok(())
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, RaftStorageError> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let mut out = Vec::new();
        for item in self.log.range(index_key(start)..) {
            let (k, v) = item.map_err(logs_read)?;
            let index = u64::from_be_bytes(k.as_ref().try_into().unwrap_or([0xff; 8]));
            if !range.contains(&index) {
                break;
            }
            out.push(bincode::deserialize(&v).map_err(logs_read)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftStorageError> {
        let last_purged: Option<LogId> = self.get_meta(LAST_PURGED)?;
        let last = match self.log.last().map_err(logs_read)? {
            Some((_, v)) => {
                let entry: Entry = bincode::deserialize(&v).map_err(logs_read)?;
                Some(entry.log_id)
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), RaftStorageError> {
        self.put_meta(VOTE, vote)?;
        self.flush().await.map_err(vote_write)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, RaftStorageError> {
        self.get_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), RaftStorageError> {
        self.committed
            .store(committed.map_or(0, |l| l.index), Ordering::Relaxed);
        self.put_meta(COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, RaftStorageError> {
        let committed = self.get_meta::<Option<LogId>>(COMMITTED)?.flatten();
        self.committed
            .store(committed.map_or(0, |l| l.index), Ordering::Relaxed);
        Ok(committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), RaftStorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let bytes = bincode::serialize(&entry).map_err(logs_write)?;
            batch.insert(&index_key(entry.log_id.index), bytes);
        }
        self.log.apply_batch(batch).map_err(logs_write)?;
        crash_point(RAFT_LOG_BEFORE_FSYNC);
        let flushed = self.flush().await.map_err(std::io::Error::other);
        crash_point(RAFT_LOG_AFTER_FSYNC);
        callback.log_io_completed(flushed);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        let mut batch = sled::Batch::default();
        for item in self.log.range(index_key(log_id.index)..) {
            let (k, _) = item.map_err(logs_delete)?;
            batch.remove(k);
        }
        self.log.apply_batch(batch).map_err(logs_delete)?;
        self.flush().await.map_err(logs_delete)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        if let Some(on_disk) = &mut self.snapshot_on_disk {
            // openraft purges up to a snapshot it is still installing; the install runs on the
            // state machine's task and raises the watermark once its file is durable.
            loop {
                let wait = on_disk.wait_for(|i| *i >= log_id.index);
                let waited = tokio::time::timeout(std::time::Duration::from_secs(10), wait)
                    .await
                    .map(|r| r.is_ok());
                match waited {
                    Ok(true) => break,
                    // The state machine is gone (shutting down): purge nothing.
                    Ok(false) => return Ok(()),
                    Err(_) => tracing::warn!(
                        upto = log_id.index,
                        on_disk = *on_disk.borrow(),
                        "log purge waiting for a snapshot covering it to be on disk"
                    ),
                }
            }
        }
        self.put_meta(LAST_PURGED, &log_id)?;
        let mut batch = sled::Batch::default();
        for item in self.log.range(..=index_key(log_id.index)) {
            let (k, _) = item.map_err(logs_delete)?;
            batch.remove(k);
        }
        self.log.apply_batch(batch).map_err(logs_delete)?;
        Ok(())
    }
}
