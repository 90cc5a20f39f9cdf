//! Dumps and restores of the whole state (Raft snapshots, backups), and syncing sled's files.

use std::io::{Seek, SeekFrom, Write};

use super::*;

/// What a Raft snapshot's dump starts with: its format's mark and version (u16, little-endian).
/// A dump of a build before the mark starts with its tree count, a small little-endian u64,
/// which the mark's bytes never are; it reads as version 0.
const DUMP_MARK: &[u8; 6] = b"RKDUMP";
/// The version [`MvccStore::write_dump`] writes and the highest [`Dump::decode`] reads.
const DUMP_VERSION: u16 = 1;

impl Dump {
    /// A dump as [`MvccStore::write_dump`] writes it (or as builds before the version mark
    /// did). A newer version is refused by name, so a member of an older build that is sent a
    /// snapshot it cannot read says so instead of failing to decode it.
    pub fn decode(bytes: &[u8]) -> Result<Dump, StorageError> {
        let body = match bytes.strip_prefix(DUMP_MARK) {
            Some(rest) => {
                let (version, body) = rest.split_at_checked(2).ok_or_else(|| {
                    StorageError::Corrupt("a snapshot cut short in its format version".into())
                })?;
                let version = u16::from_le_bytes([version[0], version[1]]);
                if version > DUMP_VERSION {
                    return Err(StorageError::Unsupported(format!(
                        "snapshot format version {version} is not supported by this rkube \
                         (it reads versions 0 to {DUMP_VERSION}); upgrade this member"
                    )));
                }
                body
            }
            None => bytes,
        };
        Ok(bincode::deserialize(body)?)
    }
}

/// What [`DumpView::rows`] gives: a tree's name, then its rows.
pub(super) enum DumpRow<'a> {
    Tree(&'static str),
    Row(&'a [u8], &'a [u8]),
}

/// A dump in progress: the small trees and the revision, copied under the index lock; the
/// history up to that revision is read when the rows are visited (see
/// [`MvccStore::dump_view`]).
pub(super) struct DumpView<'a> {
    store: &'a MvccStore,
    _gate: std::sync::RwLockReadGuard<'a, ()>,
    revision: i64,
    small: Vec<(&'static str, Vec<(sled::IVec, sled::IVec)>)>,
}

impl DumpView<'_> {
    /// A metadata value as of the dump.
    fn meta(&self, key: &[u8]) -> Option<&[u8]> {
        let (_, rows) = self.small.iter().find(|(n, _)| *n == "meta")?;
        rows.iter()
            .find(|(k, _)| k.as_ref() == key)
            .map(|(_, v)| v.as_ref())
    }

    /// Every row of every tree (in [`Trees::all`]'s order), given to `visit` as a tree's name
    /// before its rows.
    pub(super) fn rows(
        &self,
        mut visit: impl FnMut(DumpRow<'_>) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        for (name, tree) in self.store.trees.all() {
            visit(DumpRow::Tree(name))?;
            if name == "hist" {
                let end = Revision::first_of(self.revision.saturating_add(1));
                for item in tree.range(..end) {
                    let (k, v) = item?;
                    visit(DumpRow::Row(&k, &v))?;
                }
            } else if let Some((_, rows)) = self.small.iter().find(|(n, _)| *n == name) {
                for (k, v) in rows {
                    visit(DumpRow::Row(k, v))?;
                }
            }
        }
        Ok(())
    }
}

/// Writes a length or count as bincode does (u64, little endian).
fn put_len(out: &mut impl Write, len: usize) -> std::io::Result<()> {
    out.write_all(&(len as u64).to_le_bytes())
}

fn put_bytes(out: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    put_len(out, bytes.len())?;
    out.write_all(bytes)
}

/// Writes `value` at `at` and comes back to the end.
fn patch_len<W: Write + Seek>(out: &mut W, at: u64, value: u64) -> std::io::Result<()> {
    out.seek(SeekFrom::Start(at))?;
    out.write_all(&value.to_le_bytes())?;
    out.seek(SeekFrom::End(0))?;
    Ok(())
}

impl MvccStore {
    /// Starts a dump consistent with one commit. Commits go on meanwhile: the index lock is
    /// held only while the small trees are copied and the revision is read; the history up to
    /// that revision is read later without it, since commits only add later revisions, and
    /// `compaction_gate` keeps compactions and restores, which remove history, out until the
    /// view is dropped. (Under the lock, a Raft snapshot of 200,000 keys held every write of the
    /// cluster for two seconds.)
    pub(super) fn dump_view(&self) -> Result<DumpView<'_>, StorageError> {
        let gate = self
            .compaction_gate
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let _index = self.read_lock();
        let mut small = Vec::new();
        for (name, tree) in self.trees.all() {
            if name == "hist" {
                continue;
            }
            let mut rows = Vec::new();
            for item in tree.iter() {
                rows.push(item?);
            }
            small.push((name, rows));
        }
        Ok(DumpView {
            store: self,
            _gate: gate,
            revision: self.revision(),
            small,
        })
    }

    /// A raw copy of every tree, consistent with one point of the applied log.
    pub fn dump(&self) -> Result<Dump, StorageError> {
        let mut trees: Vec<(String, Rows)> = Vec::new();
        self.dump_view()?.rows(|row| {
            match row {
                DumpRow::Tree(name) => trees.push((name.to_string(), Vec::new())),
                DumpRow::Row(k, v) => {
                    if let Some((_, rows)) = trees.last_mut() {
                        rows.push((k.to_vec(), v.to_vec()));
                    }
                }
            }
            Ok(())
        })?;
        Ok(Dump { trees })
    }

    /// [`MvccStore::dump`] as bincode encodes a [`Dump`], with the metadata values under
    /// `keys` as of the dump (see [`MvccStore::write_dump`]).
    pub fn dump_encoded(&self, keys: &[&[u8]]) -> Result<(Vec<u8>, MetaValues), StorageError> {
        let mut out = std::io::Cursor::new(Vec::new());
        let values = self.write_dump(&mut out, keys, |_, _| Ok(()))?;
        Ok((out.into_inner(), values))
    }

    /// Writes [`MvccStore::dump`] as bincode encodes a [`Dump`] to `out`, straight from the
    /// trees, after what `header` writes given the metadata values under `keys` as of the dump
    /// (a Raft snapshot file's metadata, which the dump decides, goes before it). Returns those
    /// values. A Raft snapshot of a large store was in memory
    /// whole, as large as the data (340 MiB more RSS on each member while `etcdctl check perf`
    /// ran); written to its file as it is read, it takes a buffer.
    pub fn write_dump<W: Write + Seek>(
        &self,
        out: &mut W,
        keys: &[&[u8]],
        header: impl FnOnce(&mut W, &[Option<Vec<u8>>]) -> Result<(), StorageError>,
    ) -> Result<MetaValues, StorageError> {
        let view = self.dump_view()?;
        let values: MetaValues = keys
            .iter()
            .map(|k| view.meta(k).map(<[u8]>::to_vec))
            .collect();
        header(out, &values)?;
        out.write_all(DUMP_MARK)?;
        out.write_all(&DUMP_VERSION.to_le_bytes())?;
        put_len(out, self.trees.all().len())?;
        // Where the row count of the tree being written goes, and its rows so far: the count
        // goes before the rows and is known once they are written.
        let mut open: Option<(u64, u64)> = None;
        view.rows(|row| {
            match row {
                DumpRow::Tree(name) => {
                    if let Some((at, count)) = open.take() {
                        patch_len(out, at, count)?;
                    }
                    put_bytes(out, name.as_bytes())?;
                    open = Some((out.stream_position()?, 0));
                    put_len(out, 0)?;
                }
                DumpRow::Row(k, v) => {
                    let Some((_, count)) = open.as_mut() else {
                        return Err(StorageError::Corrupt("a dump row before its tree".into()));
                    };
                    put_bytes(out, k)?;
                    put_bytes(out, v)?;
                    *count += 1;
                }
            }
            Ok(())
        })?;
        if let Some((at, count)) = open {
            patch_len(out, at, count)?;
        }
        Ok(values)
    }

    /// Makes everything written so far durable. sled's own flush writes its buffers but ends
    /// in `sync_file_range`, which syncs neither the file's metadata nor the drive's cache;
    /// the fsync of sled's file and directory that follows does. Not on the commit path: the
    /// Raft log is what makes a write durable, and this runs only where the log is about to
    /// forget entries (a snapshot install, a forced new cluster) and at shutdown.
    pub fn sync(&self) -> Result<(), StorageError> {
        self.trees.meta.flush()?;
        if let Some(dir) = &self.dir {
            // Values larger than a quarter of sled's segment go to files of their own, which
            // sled writes and never syncs; each is written once, under a new name.
            let blobs = dir.join("blobs");
            if blobs.is_dir() {
                let mut synced = self.synced_blobs.lock().unwrap_or_else(|e| e.into_inner());
                let mut present = HashSet::new();
                for item in std::fs::read_dir(&blobs)? {
                    let name = item?.file_name();
                    if !synced.contains(&name) {
                        match std::fs::File::open(blobs.join(&name)) {
                            Ok(f) => f.sync_all()?,
                            // Removed by sled meanwhile.
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                            Err(e) => return Err(e.into()),
                        }
                    }
                    present.insert(name);
                }
                std::fs::File::open(&blobs)?.sync_all()?;
                *synced = present;
            }
            // The log that points at them after them.
            std::fs::File::open(dir.join("db"))?.sync_all()?;
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Replaces the whole state with a dump.
    pub fn restore(&self, dump: Dump) -> Result<(), StorageError> {
        let gate = self
            .compaction_gate
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        // The last commit's redo is about the state being replaced.
        self.trees.redo.clear()?;
        for (name, tree) in self.trees.all() {
            tree.clear()?;
            if let Some((_, rows)) = dump.trees.iter().find(|(n, _)| n == name) {
                let mut batch = sled::Batch::default();
                for (k, v) in rows {
                    batch.insert(k.as_slice(), v.as_slice());
                }
                tree.apply_batch(batch)?;
            }
        }
        self.revision.store(
            read_i64(&self.trees.meta, META_REVISION)?,
            Ordering::Release,
        );
        self.compact_revision
            .store(read_i64(&self.trees.meta, META_COMPACT)?, Ordering::Release);
        self.rebuild_index(&mut index)?;
        drop(index);
        drop(gate);
        // A dump taken between a compaction's commit and its work carries it half done.
        self.finish_compaction()?;
        let _ = self.hub.send(Arc::new(RevisionBatch {
            revision: self.revision(),
            events: Vec::new(),
            restored: true,
        }));
        Ok(())
    }

    /// Loads a backup as the first state of a new cluster: the keys, values, leases and
    /// revisions of the dump, without the old cluster's Raft and member metadata. With `bump`,
    /// the revision jumps ahead by that much and all older history is compacted, so that
    /// watchers and caches of the old cluster re-list instead of missing changes silently.
    pub fn restore_for_new_cluster(&self, dump: Dump, bump: i64) -> Result<(), StorageError> {
        self.restore(dump)?;
        let mut batch = sled::Batch::default();
        for item in self.trees.meta.iter() {
            let (k, _) = item?;
            if k.starts_with(b"raft_")
                || k.starts_with(META_MEMBER_PREFIX)
                || k.as_ref() == META_ALARMS
            {
                batch.remove(k);
            }
        }
        batch.insert(META_BASELINE_PENDING, &[][..]);
        self.trees.meta.apply_batch(batch)?;
        if bump > 0 {
            let revision = self.revision();
            self.compact(revision)?;
            let bumped = revision + bump;
            let _guard = self.index.write().unwrap_or_else(|e| e.into_inner());
            self.trees
                .meta
                .insert(META_REVISION, &bumped.to_be_bytes())?;
            self.trees
                .meta
                .insert(META_COMPACT, &bumped.to_be_bytes())?;
            self.revision.store(bumped, Ordering::Release);
            self.compact_revision.store(bumped, Ordering::Release);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoded_dump_is_the_dump_encoded() {
        let db = sled::Config::new().temporary(true).open().expect("db");
        let store = MvccStore::open(&db).expect("store");
        let marked = |dump: &Dump| [&b"RKDUMP\x01\x00"[..], &encode(dump)].concat();
        let empty = store.dump_encoded(&[META_REVISION]).expect("encoded dump");
        assert_eq!(empty.0, marked(&store.dump().expect("dump")));
        assert_eq!(empty.1, vec![None]);
        let put = |key: &str, value: &[u8], lease| {
            let cmd = Command::Txn(TxnRequest {
                success: vec![Op::Put(PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: value.to_vec(),
                    lease,
                    ..Default::default()
                })],
                ..Default::default()
            });
            store.apply(&cmd, vec![(b"raft_applied".to_vec(), vec![7; 3])])
        };
        store
            .apply(&Command::LeaseGrant { id: 3, ttl: 60 }, Vec::new())
            .expect("grant");
        for i in 0..300 {
            put(
                &format!("k{i}"),
                &vec![i as u8; i],
                if i % 3 == 0 { 3 } else { 0 },
            )
            .expect("put");
        }
        let (bytes, values) = store
            .dump_encoded(&[b"raft_applied", META_REVISION, b"absent"])
            .expect("encoded dump");
        let dump = store.dump().expect("dump");
        assert_eq!(bytes, marked(&dump));
        // Read back as written, and as a build before the mark wrote it.
        for bytes in [&bytes[..], &encode(&dump)[..]] {
            let decoded = Dump::decode(bytes).expect("decodes");
            assert_eq!(encode(&decoded), encode(&dump));
        }
        let newer = [&b"RKDUMP\x02\x00"[..], &encode(&dump)].concat();
        let refused = Dump::decode(&newer).err().map(|e| e.to_string());
        assert_eq!(
            refused.as_deref(),
            Some(
                "storage: snapshot format version 2 is not supported by this rkube (it reads \
                 versions 0 to 1); upgrade this member"
            )
        );
        assert_eq!(
            values,
            vec![
                Some(vec![7; 3]),
                Some(dump.revision().to_be_bytes().to_vec()),
                None
            ]
        );
    }

    /// A dump reads the history without holding up commits: a commit made while a dump is
    /// halfway through the history finishes, and the dump holds the state before it.
    #[test]
    fn a_commit_goes_through_while_a_dump_reads_the_history() {
        let db = sled::Config::new().temporary(true).open().expect("db");
        let store = std::sync::Arc::new(MvccStore::open(&db).expect("store"));
        let put = |key: &str| {
            let cmd = Command::Txn(TxnRequest {
                success: vec![Op::Put(PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: b"v".to_vec(),
                    ..Default::default()
                })],
                ..Default::default()
            });
            store.apply(&cmd, Vec::new()).expect("put")
        };
        for i in 0..10 {
            put(&format!("k{i}"));
        }
        let before = store.dump().expect("dump");
        let (reached, wait) = std::sync::mpsc::channel::<()>();
        let (go_on, resume) = std::sync::mpsc::channel::<()>();
        let dumping = {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut paused = false;
                let mut trees: Vec<(String, Rows)> = Vec::new();
                store
                    .dump_view()
                    .expect("view")
                    .rows(|row| {
                        match row {
                            DumpRow::Tree(name) => trees.push((name.to_string(), Vec::new())),
                            DumpRow::Row(k, v) => {
                                if !paused {
                                    paused = true;
                                    reached.send(()).expect("test waits");
                                    resume.recv().expect("test resumes");
                                }
                                let rows = &mut trees.last_mut().expect("tree").1;
                                rows.push((k.to_vec(), v.to_vec()));
                            }
                        }
                        Ok(())
                    })
                    .expect("dump");
                Dump { trees }
            })
        };
        wait.recv().expect("the dump reads the history");
        let (done, committed) = std::sync::mpsc::channel();
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                let cmd = Command::Txn(TxnRequest {
                    success: vec![Op::Put(PutRequest {
                        key: b"during".to_vec(),
                        value: b"v".to_vec(),
                        ..Default::default()
                    })],
                    ..Default::default()
                });
                store.apply(&cmd, Vec::new()).expect("put");
                done.send(()).expect("test waits");
            })
        };
        let went_through = committed.recv_timeout(std::time::Duration::from_secs(30));
        go_on.send(()).expect("dump waits");
        let dump = dumping.join().expect("dump thread");
        writer.join().expect("writer thread");
        assert!(went_through.is_ok(), "the commit waited for the dump");
        assert_eq!(encode(&dump), encode(&before));
        assert_eq!(store.revision(), before.revision() + 1);
    }
}
