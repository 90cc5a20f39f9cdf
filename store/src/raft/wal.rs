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
//!   ([`Syncer`]): one fdatasync covers every batch written before it (group commit). A
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

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Instant;

use openraft::storage::LogFlushed;
use prometheus_client::metrics::histogram::Histogram;
use serde::{Deserialize, Serialize};

use super::{Entry, LogId, TypeConfig, Vote};
use crate::failpoints::{crash_point, RAFT_LOG_AFTER_FSYNC, RAFT_LOG_BEFORE_FSYNC};

/// Size a segment is preallocated to; a batch larger than what is left starts a new segment.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
const HEADER: usize = 8;
/// Largest record accepted when reading: anything longer is a torn or garbage length.
const MAX_RECORD: u32 = 512 * 1024 * 1024;

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

/// What a record says. The borrowed twin [`RecordRef`] encodes the same bytes.
#[derive(Deserialize)]
enum Record {
    Entry(Entry),
    Vote(Vote),
    Committed(Option<LogId>),
    Truncate { since: u64 },
    Purge(LogId),
}

#[derive(Serialize)]
enum RecordRef<'a> {
    Entry(&'a Entry),
    Vote(&'a Vote),
    Committed(&'a Option<LogId>),
    Truncate { since: u64 },
    Purge(&'a LogId),
}

fn encode_into(buf: &mut Vec<u8>, record: &RecordRef<'_>) -> Result<(), WalError> {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; HEADER]);
    bincode::serialize_into(&mut *buf, record)?;
    let payload = &buf[start + HEADER..];
    let len = payload.len() as u32;
    let crc = crc32fast::hash(payload);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Where an entry's record is.
#[derive(Clone, Copy, Debug)]
struct Loc {
    seq: u64,
    offset: u64,
    len: u32,
    log_id: LogId,
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

/// What the syncer tells when a sync is done.
pub enum Waiter {
    Log(LogFlushed<TypeConfig>),
    Done(tokio::sync::oneshot::Sender<io::Result<()>>),
}

impl Waiter {
    fn complete(self, result: &io::Result<()>) {
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
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.wal"))
}

fn sync_dir(dir: &Path) -> Result<(), WalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// Reserves `len` bytes for the file without changing what it reads as. Best effort: a
/// filesystem without fallocate just grows the file as it is written.
fn preallocate(file: &File, len: u64) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: fallocate on an open descriptor we own; it reads no memory of ours.
    let _ = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
}

fn fdatasync(file: &File) -> io::Result<()> {
    file.sync_data()
}

impl Wal {
    /// Opens the log in `dir` (created if missing), reading every segment and cutting a torn
    /// tail off the last one.
    pub fn open(dir: &Path, no_fsync: bool) -> Result<Arc<Wal>, WalError> {
        Self::open_with(dir, no_fsync, SEGMENT_BYTES)
    }

    pub fn open_with(dir: &Path, no_fsync: bool, segment_bytes: u64) -> Result<Arc<Wal>, WalError> {
        let created = !dir.exists();
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        if created {
            if let Some(parent) = dir.parent() {
                sync_dir(parent)?;
            }
        }
        let mut seqs = Vec::new();
        for item in std::fs::read_dir(dir).map_err(io_err(dir))? {
            let item = item.map_err(io_err(dir))?;
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(hex) = name.strip_suffix(".wal") {
                if let Ok(seq) = u64::from_str_radix(hex, 16) {
                    seqs.push(seq);
                }
            }
        }
        seqs.sort_unstable();
        let mut inner = Inner::empty();
        let last_seq = seqs.last().copied();
        for seq in seqs {
            let path = segment_path(dir, seq);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io_err(&path))?;
            let (end, max_index, torn) = replay_segment(&file, &path, seq, &mut inner)?;
            if let Some(reason) = torn {
                if Some(seq) != last_seq {
                    return Err(WalError::Corrupt {
                        path,
                        offset: end,
                        reason,
                    });
                }
                tracing::warn!(
                    segment = %path.display(),
                    offset = end,
                    reason,
                    "cutting the write-ahead log's torn tail (a write that was never acknowledged)"
                );
                file.set_len(end).map_err(io_err(&path))?;
                preallocate(&file, segment_bytes);
                file.sync_all().map_err(io_err(&path))?;
            }
            inner.segments.insert(
                seq,
                Segment {
                    file: Arc::new(file),
                    max_index,
                },
            );
            inner.active = seq;
            inner.write_at = end;
        }
        if let (Some((_, first)), Some(purged)) = (inner.locs.first_key_value(), inner.last_purged)
        {
            if first.log_id.index != purged.index + 1 {
                return Err(WalError::Hole {
                    dir: dir.to_path_buf(),
                    purged: purged.index,
                    first: first.log_id.index,
                });
            }
        }
        inner.committed_written = inner.committed;
        let (sync_tx, sync_rx) = mpsc::channel();
        let wal = Arc::new(Wal {
            dir: dir.to_path_buf(),
            segment_bytes,
            inner: Mutex::new(inner),
            sync_tx: Mutex::new(sync_tx),
            no_fsync,
            stats: Arc::new(WalStats::default()),
            fsync_seconds: std::sync::OnceLock::new(),
        });
        {
            let mut inner = wal.lock();
            if inner.segments.is_empty() {
                wal.start_segment(&mut inner, 1)?;
            }
        }
        let weak = Arc::downgrade(&wal);
        std::thread::Builder::new()
            .name("wal-sync".into())
            .spawn(move || Syncer { wal: weak }.run(sync_rx))
            .map_err(io_err(dir))?;
        Ok(wal)
    }

    /// Reports the duration of every fdatasync into `h` (the first histogram given stays).
    pub fn observe_fsyncs(&self, h: Histogram) {
        let _ = self.fsync_seconds.set(h);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sync_file(&self, file: &File) -> io::Result<()> {
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

    /// Creates segment `seq` with the current state as its first records and makes it active.
    /// The previous active segment must already be synced.
    fn start_segment(&self, inner: &mut Inner, seq: u64) -> Result<(), WalError> {
        let path = segment_path(&self.dir, seq);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_err(&path))?;
        preallocate(&file, self.segment_bytes);
        let mut buf = Vec::new();
        if let Some(vote) = &inner.vote {
            encode_into(&mut buf, &RecordRef::Vote(vote))?;
        }
        encode_into(&mut buf, &RecordRef::Committed(&inner.committed))?;
        if let Some(purged) = &inner.last_purged {
            encode_into(&mut buf, &RecordRef::Purge(purged))?;
        }
        file.write_all_at(&buf, 0).map_err(io_err(&path))?;
        if !self.no_fsync {
            file.sync_all().map_err(io_err(&path))?;
            sync_dir(&self.dir)?;
        }
        inner.committed_written = inner.committed;
        inner.segments.insert(
            seq,
            Segment {
                file: Arc::new(file),
                max_index: 0,
            },
        );
        inner.active = seq;
        inner.write_at = buf.len() as u64;
        Ok(())
    }

    /// Writes `buf` at the end of the log, starting a new segment first if it does not fit.
    fn write(&self, inner: &mut Inner, buf: &[u8]) -> Result<u64, WalError> {
        if inner.write_at > 0 && inner.write_at + buf.len() as u64 > self.segment_bytes {
            let old = inner.active_file();
            self.sync_file(&old)
                .map_err(io_err(&segment_path(&self.dir, inner.active)))?;
            let next = inner.active + 1;
            self.start_segment(inner, next)?;
        }
        let at = inner.write_at;
        let path = segment_path(&self.dir, inner.active);
        inner
            .active_file()
            .write_all_at(buf, at)
            .map_err(io_err(&path))?;
        inner.write_at += buf.len() as u64;
        Ok(at)
    }

    fn enqueue(&self, waiter: Waiter) {
        let tx = self.sync_tx.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(mpsc::SendError(w)) = tx.send(waiter) {
            w.complete(&Err(io::Error::other(
                "the write-ahead log's sync thread is gone",
            )));
        }
    }

    /// Waits until everything written so far is synced.
    async fn synced(&self) -> io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.enqueue(Waiter::Done(tx));
        rx.await
            .map_err(|_| io::Error::other("the write-ahead log's sync thread is gone"))?
    }

    /// Appends entries; `done` runs once they are synced. They are readable at once.
    pub fn append(
        &self,
        entries: impl IntoIterator<Item = Entry>,
        done: Waiter,
    ) -> Result<(), WalError> {
        let written = {
            let mut inner = self.lock();
            self.write_entries(&mut inner, entries)
        };
        // Even a failed write is reported through the waiter, after the sync: openraft stops
        // on a log I/O error.
        match written {
            Ok(()) => {
                self.enqueue(done);
                Ok(())
            }
            Err(e) => {
                done.complete(&Err(io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    /// Writes entries in one write and indexes them.
    fn write_entries(
        &self,
        inner: &mut Inner,
        entries: impl IntoIterator<Item = Entry>,
    ) -> Result<(), WalError> {
        let mut buf = Vec::new();
        let mut spans = Vec::new();
        for entry in entries {
            let start = buf.len();
            encode_into(&mut buf, &RecordRef::Entry(&entry))?;
            spans.push((start, (buf.len() - start) as u32, entry.log_id));
        }
        if buf.is_empty() {
            return Ok(());
        }
        let at = self.write(inner, &buf)?;
        let seq = inner.active;
        for (start, len, log_id) in spans {
            let index = log_id.index;
            let loc = Loc {
                seq,
                offset: at + start as u64,
                len,
                log_id,
            };
            inner.locs.insert(index, loc);
            if let Some(s) = inner.segments.get_mut(&seq) {
                s.max_index = s.max_index.max(index);
            }
        }
        self.stats.appends.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub async fn save_vote(&self, vote: &Vote) -> io::Result<()> {
        {
            let mut inner = self.lock();
            let mut buf = Vec::new();
            encode_into(&mut buf, &RecordRef::Vote(vote))?;
            self.write(&mut inner, &buf)?;
            inner.vote = Some(*vote);
        }
        self.synced().await
    }

    pub fn vote(&self) -> Option<Vote> {
        self.lock().vote
    }

    /// Records the commit index: written at once (so a member killed and restarted applies
    /// everything committed before it serves), never synced on its own — after a power cut
    /// an older commit index only means the member waits for its leader to re-apply the rest.
    pub fn set_committed(&self, committed: Option<LogId>) -> Result<(), WalError> {
        let mut inner = self.lock();
        inner.committed = committed;
        if inner.committed_written == committed {
            return Ok(());
        }
        let mut buf = Vec::new();
        encode_into(&mut buf, &RecordRef::Committed(&committed))?;
        self.write(&mut inner, &buf)?;
        inner.committed_written = committed;
        Ok(())
    }

    pub fn committed(&self) -> Option<LogId> {
        self.lock().committed
    }

    /// (last purged, last entry or else last purged)
    pub fn state(&self) -> (Option<LogId>, Option<LogId>) {
        let inner = self.lock();
        (inner.last_purged, inner.last_log_id())
    }

    pub fn len(&self) -> usize {
        self.lock().locs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes entries from `since` on, durably.
    pub async fn truncate(&self, since: u64) -> io::Result<()> {
        {
            let mut inner = self.lock();
            let mut buf = Vec::new();
            encode_into(&mut buf, &RecordRef::Truncate { since })?;
            self.write(&mut inner, &buf)?;
            inner.locs.split_off(&since);
        }
        self.synced().await
    }

    /// Forgets entries up to `upto`, durably, then deletes the segments that hold nothing else.
    pub async fn purge(&self, upto: LogId) -> io::Result<()> {
        {
            let mut inner = self.lock();
            if inner.last_purged.is_some_and(|p| p.index >= upto.index) {
                return Ok(());
            }
            let mut buf = Vec::new();
            encode_into(&mut buf, &RecordRef::Purge(&upto))?;
            self.write(&mut inner, &buf)?;
            inner.last_purged = Some(upto);
            inner.purge_upto(upto.index);
        }
        self.synced().await?;
        let doomed: Vec<u64> = {
            let mut inner = self.lock();
            let active = inner.active;
            let doomed: Vec<u64> = inner
                .segments
                .iter()
                .filter(|(seq, s)| **seq < active && s.max_index <= upto.index)
                .map(|(seq, _)| *seq)
                .collect();
            for seq in &doomed {
                inner.segments.remove(seq);
            }
            doomed
        };
        for seq in doomed {
            let path = segment_path(&self.dir, seq);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(segment = %path.display(), error = %e, "could not remove a purged log segment");
            }
        }
        Ok(())
    }

    /// Reads the entries with indexes in `start..end` that the log holds.
    pub fn read(&self, start: u64, end: u64) -> Result<Vec<Entry>, WalError> {
        let (wanted, files) = {
            let inner = self.lock();
            if start >= end {
                return Ok(Vec::new());
            }
            let wanted: Vec<Loc> = inner.locs.range(start..end).map(|(_, l)| *l).collect();
            let mut files: BTreeMap<u64, Arc<File>> = BTreeMap::new();
            for l in &wanted {
                if let Some(s) = inner.segments.get(&l.seq) {
                    files.entry(l.seq).or_insert_with(|| s.file.clone());
                }
            }
            (wanted, files)
        };
        let mut out = Vec::with_capacity(wanted.len());
        let mut i = 0;
        while i < wanted.len() {
            // One read for a run of records that lie back to back in one segment.
            let mut j = i + 1;
            while j < wanted.len()
                && wanted[j].seq == wanted[i].seq
                && wanted[j].offset == wanted[j - 1].offset + wanted[j - 1].len as u64
            {
                j += 1;
            }
            let seq = wanted[i].seq;
            let path = segment_path(&self.dir, seq);
            let file = files.get(&seq).ok_or_else(|| WalError::Corrupt {
                path: path.clone(),
                offset: wanted[i].offset,
                reason: "the segment holding this entry is gone".into(),
            })?;
            let from = wanted[i].offset;
            let to = wanted[j - 1].offset + wanted[j - 1].len as u64;
            let mut buf = vec![0u8; (to - from) as usize];
            file.read_exact_at(&mut buf, from).map_err(io_err(&path))?;
            for l in &wanted[i..j] {
                let rec =
                    &buf[(l.offset - from) as usize..(l.offset - from) as usize + l.len as usize];
                match decode(rec) {
                    Ok(Record::Entry(e)) if e.log_id == l.log_id => out.push(e),
                    Ok(_) => {
                        return Err(WalError::Corrupt {
                            path,
                            offset: l.offset,
                            reason: format!("expected the entry {}", l.log_id),
                        })
                    }
                    Err(reason) => {
                        return Err(WalError::Corrupt {
                            path,
                            offset: l.offset,
                            reason,
                        })
                    }
                }
            }
            i = j;
        }
        Ok(out)
    }

    /// Forgets the whole log, the vote and the commit index, durably.
    pub fn wipe(&self) -> Result<(), WalError> {
        let mut inner = self.lock();
        let old: Vec<u64> = inner.segments.keys().copied().collect();
        let next = inner.active + 1;
        inner.vote = None;
        inner.committed = None;
        inner.last_purged = None;
        inner.locs.clear();
        // The new segment first, so that a crash in between leaves either the old log or
        // the empty one, never a mix.
        self.start_segment(&mut inner, next)?;
        for seq in old {
            inner.segments.remove(&seq);
            let path = segment_path(&self.dir, seq);
            std::fs::remove_file(&path).map_err(io_err(&path))?;
        }
        if !self.no_fsync {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Loads a log kept by an older version (sled trees) into this empty log, durably.
    pub fn import(
        &self,
        vote: Option<Vote>,
        committed: Option<LogId>,
        purged: Option<LogId>,
        entries: Vec<Entry>,
    ) -> Result<(), WalError> {
        let mut inner = self.lock();
        let mut buf = Vec::new();
        if let Some(v) = &vote {
            encode_into(&mut buf, &RecordRef::Vote(v))?;
        }
        if let Some(p) = &purged {
            encode_into(&mut buf, &RecordRef::Purge(p))?;
        }
        self.write(&mut inner, &buf)?;
        inner.vote = vote;
        inner.last_purged = purged;
        inner.committed = committed;
        self.write_entries(&mut inner, entries)?;
        let path = segment_path(&self.dir, inner.active);
        self.sync_file(&inner.active_file()).map_err(io_err(&path))
    }
}

fn decode(rec: &[u8]) -> Result<Record, String> {
    if rec.len() < HEADER {
        return Err("short record".into());
    }
    let len = u32::from_le_bytes(rec[0..4].try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(rec[4..8].try_into().unwrap_or_default());
    let payload = rec.get(HEADER..HEADER + len).ok_or("short record")?;
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch".into());
    }
    bincode::deserialize(payload).map_err(|e| format!("cannot decode: {e}"))
}

/// Reads one segment's records into `inner`. Returns the offset after the last good record,
/// the largest entry index, and why reading stopped early (a torn or damaged record), if it did.
fn replay_segment(
    file: &File,
    path: &Path,
    seq: u64,
    inner: &mut Inner,
) -> Result<(u64, u64, Option<String>), WalError> {
    let size = file.metadata().map_err(io_err(path))?.len();
    let mut data = vec![0u8; size as usize];
    file.read_exact_at(&mut data, 0).map_err(io_err(path))?;
    let mut at = 0usize;
    let mut max_index = 0;
    loop {
        if at + HEADER > data.len() {
            let torn = (at < data.len() && data[at..].iter().any(|b| *b != 0))
                .then(|| "a record header cut short".to_string());
            return Ok((at as u64, max_index, torn));
        }
        let len = u32::from_le_bytes(data[at..at + 4].try_into().unwrap_or_default());
        let crc = u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap_or_default());
        if len == 0 && crc == 0 {
            // The preallocated, never written rest of the segment — unless something follows.
            let torn = data[at..].iter().any(|b| *b != 0).then(|| {
                "a zero record header followed by data (a write that did not complete)".to_string()
            });
            return Ok((at as u64, max_index, torn));
        }
        if len > MAX_RECORD || at + HEADER + len as usize > data.len() {
            return Ok((
                at as u64,
                max_index,
                Some(format!("a record length of {len} bytes runs past the end")),
            ));
        }
        let payload = &data[at + HEADER..at + HEADER + len as usize];
        if crc32fast::hash(payload) != crc {
            return Ok((at as u64, max_index, Some("checksum mismatch".into())));
        }
        let record: Record = match bincode::deserialize(payload) {
            Ok(r) => r,
            Err(e) => {
                return Ok((
                    at as u64,
                    max_index,
                    Some(format!("cannot decode a record: {e}")),
                ))
            }
        };
        match record {
            Record::Entry(e) => {
                let index = e.log_id.index;
                max_index = max_index.max(index);
                let purged = inner.last_purged.map_or(0, |p| p.index);
                if inner.last_purged.is_some() && index <= purged {
                    // Already purged.
                } else {
                    let loc = Loc {
                        seq,
                        offset: at as u64,
                        len: HEADER as u32 + len,
                        log_id: e.log_id,
                    };
                    inner.locs.insert(index, loc);
                }
            }
            Record::Vote(v) => inner.vote = Some(v),
            Record::Committed(c) => inner.committed = c,
            Record::Truncate { since } => {
                inner.locs.split_off(&since);
            }
            Record::Purge(id) => {
                if inner.last_purged.is_none_or(|p| p.index < id.index) {
                    inner.last_purged = Some(id);
                }
                inner.purge_upto(id.index);
            }
        }
        at += HEADER + len as usize;
    }
}

/// The group-commit thread: takes every waiter queued, syncs the active segment once, and
/// completes them all.
struct Syncer {
    wal: std::sync::Weak<Wal>,
}

impl Syncer {
    fn run(self, rx: mpsc::Receiver<Waiter>) {
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
    use std::io::Write;

    use openraft::testing::log_id;
    use openraft::EntryPayload;

    use super::*;

    fn blank(term: u64, index: u64) -> Entry {
        Entry {
            log_id: log_id(term, 0, index),
            payload: EntryPayload::Blank,
        }
    }

    /// Appends and waits for the group commit.
    async fn append(wal: &Wal, entries: Vec<Entry>) {
        let (cb, rx) = tokio::sync::oneshot::channel();
        wal.append(entries, Waiter::Done(cb)).expect("append");
        rx.await.expect("callback").expect("synced");
    }

    fn indexes(wal: &Wal) -> Vec<u64> {
        wal.read(0, u64::MAX)
            .expect("read")
            .into_iter()
            .map(|e| e.log_id.index)
            .collect()
    }

    fn segments(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "wal"))
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn a_torn_tail_is_cut_and_what_follows_it_is_never_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wal_dir = dir.path().join("wal");
        {
            let wal = Wal::open(&wal_dir, false).expect("open");
            append(&wal, (1..=5).map(|i| blank(1, i)).collect()).await;
        }
        // A write that never completed: a record header with half its payload, then an
        // intact-looking record after it (stale bytes of the same torn write).
        let seg = segments(&wal_dir).pop().expect("segment");
        let end = {
            let wal = Wal::open(&wal_dir, false).expect("reopen");
            let inner = wal.lock();
            inner.write_at
        };
        let mut tail = Vec::new();
        encode_into(&mut tail, &RecordRef::Entry(&blank(1, 6))).expect("encode");
        let torn_len = tail.len();
        encode_into(&mut tail, &RecordRef::Entry(&blank(1, 7))).expect("encode");
        tail[HEADER + 1] ^= 0xff; // entry 6's payload is damaged
        {
            let f = OpenOptions::new().write(true).open(&seg).expect("segment");
            f.write_all_at(&tail, end).expect("write");
        }
        let wal = Wal::open(&wal_dir, false).expect("open cuts the tail");
        assert_eq!(indexes(&wal), [1, 2, 3, 4, 5]);
        // New appends land where the torn record was; the stale entry 7 after it is gone.
        append(&wal, vec![blank(2, 6)]).await;
        drop(wal);
        let wal = Wal::open(&wal_dir, false).expect("reopen");
        assert_eq!(indexes(&wal), [1, 2, 3, 4, 5, 6]);
        assert_eq!(wal.read(6, 7).expect("read")[0].log_id, log_id(2, 0, 6));
        assert!(torn_len > 0);
    }

    #[tokio::test]
    async fn damage_in_a_segment_synced_whole_refuses_the_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wal_dir = dir.path().join("wal");
        {
            let wal = Wal::open_with(&wal_dir, false, 1024).expect("open");
            for i in 1..=100 {
                append(&wal, vec![blank(1, i)]).await;
            }
        }
        let segs = segments(&wal_dir);
        assert!(segs.len() > 2, "small segments roll over: {segs:?}");
        let mut f = OpenOptions::new()
            .write(true)
            .open(&segs[0])
            .expect("first");
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(200)).expect("seek");
        f.write_all(b"garbage").expect("write");
        drop(f);
        match Wal::open_with(&wal_dir, false, 1024) {
            Err(WalError::Corrupt { .. }) => {}
            Err(e) => panic!("expected corruption, got {e}"),
            Ok(_) => panic!("a damaged older segment must refuse the open"),
        }
    }

    #[tokio::test]
    async fn rollover_purge_truncate_and_vote_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wal_dir = dir.path().join("wal");
        {
            let wal = Wal::open_with(&wal_dir, false, 4096).expect("open");
            wal.save_vote(&Vote::new(3, 1)).await.expect("vote");
            for i in 1..=200 {
                append(&wal, vec![blank(1, i)]).await;
            }
            wal.set_committed(Some(log_id(1, 0, 150)))
                .expect("committed");
            let before = segments(&wal_dir).len();
            wal.purge(log_id(1, 0, 120)).await.expect("purge");
            let after = segments(&wal_dir).len();
            assert!(
                after < before,
                "segments behind the purge are deleted: {before} -> {after}"
            );
            wal.truncate(181).await.expect("truncate");
            append(&wal, vec![blank(2, 181), blank(2, 182)]).await;
            assert_eq!(
                wal.state(),
                (Some(log_id(1, 0, 120)), Some(log_id(2, 0, 182)))
            );
        }
        let wal = Wal::open_with(&wal_dir, false, 4096).expect("reopen");
        assert_eq!(wal.vote(), Some(Vote::new(3, 1)));
        assert_eq!(wal.committed(), Some(log_id(1, 0, 150)));
        assert_eq!(
            wal.state(),
            (Some(log_id(1, 0, 120)), Some(log_id(2, 0, 182)))
        );
        assert_eq!(indexes(&wal), (121..=182).collect::<Vec<_>>());
        assert_eq!(
            wal.read(181, 183).expect("read")[0].log_id,
            log_id(2, 0, 181)
        );
    }

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

    #[test]
    fn garbage_after_the_preallocated_zeros_is_a_torn_tail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("0000000000000001.wal");
        let mut f = File::create(&path).expect("create");
        f.write_all(&[0u8; 64]).expect("zeros");
        f.write_all(b"x").expect("garbage");
        drop(f);
        let f = File::open(&path).expect("open");
        let mut inner = Inner::empty();
        let (end, _, torn) = replay_segment(&f, &path, 1, &mut inner).expect("replay");
        assert_eq!(end, 0);
        assert!(torn.is_some());
    }
}
