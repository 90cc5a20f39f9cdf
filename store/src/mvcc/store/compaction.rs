//! Compaction: dropping history older than a revision (see [`KeyIndex::compact`]).

use super::*;

impl MvccStore {
    /// Drops history older than `revision`, keeping for every key its newest version at or
    /// before it (unless that version is a deletion). Idempotent, so a crash midway is mended
    /// by running it again, which [`MvccStore::finish_compaction`] does at the next start.
    pub(super) fn compact(&self, revision: i64) -> Result<(), StorageError> {
        let t = &self.trees;
        let _gate = self
            .compaction_gate
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        remove_records(&t.hist, index.compact(revision))?;
        t.meta.insert(META_COMPACT, &revision.to_be_bytes())?;
        self.compact_revision.store(revision, Ordering::Release);
        Ok(())
    }

    /// Carries out a compaction that was committed but not done, because the member stopped
    /// in between (etcd's scheduled compact revision).
    pub(super) fn finish_compaction(&self) -> Result<(), StorageError> {
        let scheduled = read_i64(&self.trees.meta, META_COMPACT_SCHEDULED)?;
        if scheduled > self.compact_revision() {
            self.compact(scheduled)?;
        }
        Ok(())
    }

    // ---- snapshots ----
}
