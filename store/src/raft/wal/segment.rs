//! Segment files: their names, creating one (preallocated, the log's state as its first
//! records), and writing at the end of the log, starting a new segment when a write does not
//! fit.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::record::{encode_into, RecordRef};
use super::{io_err, Inner, Segment, Wal, WalError};

pub(super) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.wal"))
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), WalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// Reserves `len` bytes for the file without changing what it reads as. Best effort: a
/// filesystem without fallocate just grows the file as it is written.
pub(super) fn preallocate(file: &File, len: u64) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: fallocate on an open descriptor we own; it reads no memory of ours.
    let _ = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
}

impl Wal {
    /// Creates segment `seq` with the current state as its first records and makes it active.
    /// The previous active segment must already be synced.
    pub(super) fn start_segment(&self, inner: &mut Inner, seq: u64) -> Result<(), WalError> {
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
    pub(super) fn write(&self, inner: &mut Inner, buf: &[u8]) -> Result<u64, WalError> {
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
        inner.writes += 1;
        Ok(at)
    }
}
