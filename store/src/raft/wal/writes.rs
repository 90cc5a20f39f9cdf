//! What changes the log: appending entries, saving the vote and the commit index, truncating
//! and purging; wiping it, and importing a log an older version kept.

use std::io;
use std::sync::atomic::Ordering;

use super::record::{encode_into, RecordRef};
use super::segment::{segment_path, sync_dir};
use super::{io_err, Inner, Loc, Waiter, Wal, WalError};
use crate::raft::{Entry, LogId, Vote};

impl Wal {
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
                write: inner.writes,
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

#[cfg(test)]
mod tests {
    use openraft::testing::log_id;

    use super::*;
    use crate::raft::wal::testing::{append, blank, indexes, segments};

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
}
