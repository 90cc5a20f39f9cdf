//! The Raft write-ahead log: an append-only, checksummed, segmented file log with group commit.
//!
//! Layout: `DATA_DIR/wal/<seq>.wal`, segments numbered from 1 in hex. A segment is
//! preallocated to [`SEGMENT_BYTES`] (so an append changes no file size) and holds records:
//!
//! ```text
//! | len: u32 LE | crc32 of payload: u32 LE | payload: bincode(Record) |   ... | zeros
//! ```
//!
//! A record is a log entry, the vote, the commit index, a truncation (entries from an index on
//! are gone) or a purge (entries up to a log id are gone). Every segment starts with the state
//! (vote, commit index, purge point) as of its creation, so a segment older than the active one
//! is needed only for its entries, and is deleted once a purge covers them all.
//!
//! # Correctness
//! - Appends are written with one `pwrite` per batch and acknowledged (openraft's
//!   `LogFlushed`) only after an `fdatasync` of the active segment that started after the write
//!   ([`Syncer`](group_commit::Syncer)): one fdatasync covers every batch written before it (group commit). A
//!   segment is fdatasync'ed before the next one is created, and the directory is fsync'ed
//!   after a segment is created, so "synced" always means "every record before it too".
//! - The vote, a truncation and a purge are synced before the call that makes them returns.
//! - At open, records are read in order until the first one whose length or checksum is wrong
//!   or that is all zeros: in the last segment that is the torn tail of a write that was never
//!   acknowledged, cut off (the file is truncated there and preallocated again, so stale bytes
//!   after the cut can never be read as records). In an older segment, which was synced whole
//!   before the next was made, it is corruption and the open fails.
//! - A purge record is synced before any segment is deleted, so the log after open never has a
//!   hole between the purge point and its first entry.
//!
//! `record.rs` is a record's encoding and checksum; `segment.rs` names and creates segment
//! files and writes at the end of the log, rolling over to a new segment; `group_commit.rs`
//! is the fdatasync path that acknowledges writes; `recovery.rs` opens the log, replaying
//! every segment; `writes.rs` and `reads.rs` are the log's operations. This file holds the
//! log's state in memory and its errors.

mod group_commit;
mod reads;
mod record;
mod recovery;
mod segment;
#[cfg(test)]
mod testing;
mod writes;

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc, Mutex, MutexGuard};

use prometheus_client::metrics::histogram::Histogram;

use super::{LogId, Vote};

pub use group_commit::Waiter;

/// Size a segment is preallocated to; a batch larger than what is left starts a new segment.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("write-ahead log {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("write-ahead log {path} is damaged at offset {offset}: {reason}; this segment was synced whole, so this is disk corruption: restore the member from a snapshot or remove and re-add it")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("write-ahead log in {dir} has a hole: the purge point is {purged} but the first entry is {first}")]
    Hole {
        dir: PathBuf,
        purged: u64,
        first: u64,
    },
    #[error("write-ahead log: cannot encode a record: {0}")]
    Encode(#[from] bincode::Error),
}

impl From<WalError> for io::Error {
    fn from(e: WalError) -> Self {
        match e {
            WalError::Io { source, .. } => source,
            other => io::Error::other(other.to_string()),
        }
    }
}

/// Where an entry's record is.
#[derive(Clone, Copy, Debug)]
struct Loc {
    seq: u64,
    offset: u64,
    len: u32,
    log_id: LogId,
    /// The write that put it there ([`Inner::writes`]); 0 for what was read at open.
    write: u64,
}

struct Segment {
    file: Arc<File>,
    /// The largest entry index ever written to it (0: none).
    max_index: u64,
}

struct Inner {
    segments: BTreeMap<u64, Segment>,
    active: u64,
    write_at: u64,
    /// Entries by index. openraft keeps them contiguous; the map does not insist (openraft's
    /// conformance suite writes holes).
    locs: BTreeMap<u64, Loc>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    /// The commit index as last written into a record.
    committed_written: Option<LogId>,
    last_purged: Option<LogId>,
    /// Writes made since open; a sync that starts after write `n` makes writes `..=n` durable.
    writes: u64,
}

impl Inner {
    /// Nothing read yet.
    fn empty() -> Self {
        Inner {
            segments: BTreeMap::new(),
            active: 0,
            write_at: 0,
            locs: BTreeMap::new(),
            vote: None,
            committed: None,
            committed_written: None,
            last_purged: None,
            writes: 0,
        }
    }

    fn last_log_id(&self) -> Option<LogId> {
        self.locs
            .last_key_value()
            .map(|(_, l)| l.log_id)
            .or(self.last_purged)
    }

    fn active_file(&self) -> Arc<File> {
        self.segments[&self.active].file.clone()
    }

    /// Forgets entries up to `upto`.
    fn purge_upto(&mut self, upto: u64) {
        self.locs = self.locs.split_off(&upto.saturating_add(1));
    }
}

/// Counters of the log's disk work, for metrics and benchmarks.
#[derive(Default)]
pub struct WalStats {
    /// fdatasync calls on segments (group commits, votes, truncations, purges, rollovers).
    pub syncs: AtomicU64,
    /// Batches of entries written (openraft `append` calls).
    pub appends: AtomicU64,
}

pub struct Wal {
    dir: PathBuf,
    segment_bytes: u64,
    inner: Mutex<Inner>,
    sync_tx: Mutex<mpsc::Sender<Waiter>>,
    /// `--unsafe-no-fsync`: acknowledge without syncing (etcd's flag of the same name). Tests
    /// use it to show that the power-loss test catches a store that does not sync.
    no_fsync: bool,
    pub stats: Arc<WalStats>,
    fsync_seconds: std::sync::OnceLock<Histogram>,
    /// The last write a completed sync covers (every write up to it is on stable storage).
    synced: tokio::sync::watch::Sender<u64>,
    /// A commit index held back from followers because this log had not synced it
    /// ([`Wal::durable_commit`]); 0: none.
    held_back: AtomicU64,
    /// Told once a held-back commit index is durable here, so the leader sends it on.
    released: tokio::sync::Notify,
    /// The sync thread's id, for tests of its scheduling policy.
    #[cfg(test)]
    sync_thread: std::sync::OnceLock<libc::pid_t>,
}

impl Wal {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_path_buf(),
        source,
    }
}
