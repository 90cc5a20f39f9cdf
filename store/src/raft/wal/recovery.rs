//! Opening the log: every segment is replayed in order; a torn tail of the last one is cut off,
//! and damage in an older one refuses the open.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc, Mutex};

use super::group_commit::Syncer;
use super::record::{Record, HEADER, MAX_RECORD};
use super::segment::{preallocate, segment_path, sync_dir};
use super::{io_err, Inner, Loc, Segment, Wal, WalError, WalStats, SEGMENT_BYTES};

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
                    "cutting the write-ahead log's torn tail (a write that was never synced)"
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
            synced: tokio::sync::watch::Sender::new(0),
            held_back: AtomicU64::new(0),
            released: tokio::sync::Notify::new(),
            #[cfg(test)]
            sync_thread: std::sync::OnceLock::new(),
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
                        write: 0,
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use openraft::testing::log_id;

    use super::*;
    use crate::raft::wal::record::{encode_into, RecordRef};
    use crate::raft::wal::testing::{append, blank, indexes, segments};

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
