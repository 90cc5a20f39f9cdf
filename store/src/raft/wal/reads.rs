//! What the log holds: the vote, the commit index, the last purged and last log ids, and
//! entries, read back from their segments.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::record::{decode, Record};
use super::segment::segment_path;
use super::{io_err, Loc, Wal, WalError};
use crate::raft::{Entry, LogId, Vote};

impl Wal {
    pub fn vote(&self) -> Option<Vote> {
        self.lock().vote
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
}
