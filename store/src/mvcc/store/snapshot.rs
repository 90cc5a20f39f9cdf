//! Dumps and restores of the whole state (Raft snapshots, backups), and syncing sled's files.

use std::io::{Read, Seek, SeekFrom, Write};

use super::*;

/// What a Raft snapshot's dump starts with: its format's mark and version (u16, little-endian).
/// A dump of a build before the mark starts with its tree count, a small little-endian u64,
/// which the mark's bytes never are; it reads as version 0.
const DUMP_MARK: &[u8; 6] = b"RKDUMP";
/// The version [`MvccStore::write_dump`] writes and the highest [`Dump::decode`] reads.
/// Version 2: a history value can be a run of records (`history_runs`), which builds that
/// read version 1 at most take for a damaged record.
const DUMP_VERSION: u16 = 2;

impl Dump {
    /// A dump as [`MvccStore::write_dump`] writes it (or as builds before the version mark
    /// did), in memory. A newer version is refused by name, so a member of an older build that
    /// is sent a snapshot it cannot read says so instead of failing to decode it.
    pub fn decode(mut bytes: &[u8]) -> Result<Dump, StorageError> {
        Dump::collect(|visit| read_dump(&mut bytes, visit))
    }

    /// The rows `rows` gives its visitor (each tree's name before its rows), kept.
    fn collect(
        rows: impl FnOnce(&mut RowVisitor<'_>) -> Result<(), StorageError>,
    ) -> Result<Dump, StorageError> {
        let mut trees: Vec<(String, Rows)> = Vec::new();
        rows(&mut |row| {
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

    /// Reads a dump from `input` to its end without keeping it: an error names what is wrong
    /// with it, as [`Dump::decode`] would.
    pub fn check(input: &mut impl Read) -> Result<(), StorageError> {
        read_dump(input, |_| Ok(()))
    }
}

/// A dump's rows as they are written or read: a tree's name, then its rows.
pub(super) enum DumpRow<'a> {
    Tree(&'a str),
    Row(&'a [u8], &'a [u8]),
}

/// What a dump's rows are given to, one at a time.
type RowVisitor<'v> = dyn FnMut(DumpRow<'_>) -> Result<(), StorageError> + 'v;

/// A dump cut short, or a length or name that cannot be.
fn cut_short(what: &str) -> StorageError {
    StorageError::Corrupt(format!("a snapshot cut short in {what}"))
}

fn read_u64(input: &mut impl Read, what: &str) -> Result<u64, StorageError> {
    let mut b = [0u8; 8];
    input.read_exact(&mut b).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => cut_short(what),
        _ => e.into(),
    })?;
    Ok(u64::from_le_bytes(b))
}

/// `len` bytes into `buf`, grown as they arrive: a damaged length reads to the end of the
/// input and fails there, instead of allocating what it claims.
fn read_into(
    input: &mut impl Read,
    len: u64,
    buf: &mut Vec<u8>,
    what: &str,
) -> Result<(), StorageError> {
    buf.clear();
    input.take(len).read_to_end(buf)?;
    if buf.len() as u64 != len {
        return Err(cut_short(what));
    }
    Ok(())
}

/// Reads a dump as [`MvccStore::write_dump`] writes it (bincode's encoding of a [`Dump`],
/// after the format's mark and version; or without them, as builds before the mark wrote
/// it), one row at a time, and gives `visit` each tree's name before its rows.
pub(super) fn read_dump(
    input: &mut impl Read,
    mut visit: impl FnMut(DumpRow<'_>) -> Result<(), StorageError>,
) -> Result<(), StorageError> {
    let mut head = [0u8; 8];
    input
        .read_exact(&mut head[..DUMP_MARK.len()])
        .map_err(|_| cut_short("its format mark"))?;
    let trees = if head[..DUMP_MARK.len()] == DUMP_MARK[..] {
        let mut version = [0u8; 2];
        input
            .read_exact(&mut version)
            .map_err(|_| cut_short("its format version"))?;
        let version = u16::from_le_bytes(version);
        if version > DUMP_VERSION {
            return Err(StorageError::Unsupported(format!(
                "snapshot format version {version} is not supported by this rkube \
                 (it reads versions 0 to {DUMP_VERSION}); upgrade this member"
            )));
        }
        read_u64(input, "its tree count")?
    } else {
        // Version 0: the six bytes read are the start of the tree count.
        input
            .read_exact(&mut head[DUMP_MARK.len()..])
            .map_err(|_| cut_short("its tree count"))?;
        u64::from_le_bytes(head)
    };
    let (mut key, mut value) = (Vec::new(), Vec::new());
    for _ in 0..trees {
        let len = read_u64(input, "a tree's name")?;
        read_into(input, len, &mut key, "a tree's name")?;
        let name = std::str::from_utf8(&key)
            .map_err(|_| StorageError::Corrupt("a snapshot's tree name is not UTF-8".into()))?;
        visit(DumpRow::Tree(name))?;
        let rows = read_u64(input, "a tree's row count")?;
        for _ in 0..rows {
            let len = read_u64(input, "a row")?;
            read_into(input, len, &mut key, "a row")?;
            let len = read_u64(input, "a row")?;
            read_into(input, len, &mut value, "a row")?;
            visit(DumpRow::Row(&key, &value))?;
        }
    }
    Ok(())
}

/// Rows written to sled at once by a restore.
const RESTORE_BATCH: usize = 4096;

/// How large a run of history records a restore makes (see `history_runs`). A commit groups
/// its own records within [`RUN_BYTES`](super::history_runs::RUN_BYTES); a restore writes the
/// whole history at once, and sled's cost is mostly per value: 200,000 records of 1.1 KiB
/// took 2.9-3.5 s to insert one per value and 1.0-1.5 s as 50,000 values of 4.4 KiB (a scratch
/// program, 2026-12-07).
const RESTORE_RUN_BYTES: usize = 4096;

/// Puts the history value `Runs` closed, if any, into `batch` under its revision; returns how
/// many values it put.
fn put_value(batch: &mut sled::Batch, value: Option<(Revision, Vec<u8>)>) -> usize {
    match value {
        Some((rev, value)) => {
            batch.insert(&rev.to_bytes(), value);
            1
        }
        None => 0,
    }
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
        let view = self.dump_view()?;
        Dump::collect(|visit| view.rows(visit))
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
        self.restore_rows(|visit| {
            for (name, rows) in &dump.trees {
                visit(DumpRow::Tree(name))?;
                for (k, v) in rows {
                    visit(DumpRow::Row(k, v))?;
                }
            }
            Ok(())
        })
    }

    /// Replaces the whole state with the dump `input` holds, read as it is written to the
    /// trees: a dump the size of the store is never in memory. Check it first
    /// ([`Dump::check`]): one found damaged halfway leaves the trees half restored.
    pub fn restore_from(&self, input: &mut impl Read) -> Result<(), StorageError> {
        self.restore_rows(|visit| read_dump(input, visit))
    }

    /// Replaces the whole state with the rows `rows` gives its visitor (each tree's name
    /// before its rows; rows of a tree the store does not have are left out).
    fn restore_rows(
        &self,
        rows: impl FnOnce(&mut RowVisitor<'_>) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let gate = self
            .compaction_gate
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        // The last commit's redo is about the state being replaced.
        self.trees.redo.clear()?;
        let all = self.trees.all();
        for (_, tree) in all {
            tree.clear()?;
        }
        // The index is built from the history's records as they pass, not read back from sled.
        index.clear();
        let mut tree: Option<&sled::Tree> = None;
        let mut in_hist = false;
        let mut batch = sled::Batch::default();
        let mut batched = 0;
        let mut runs = Runs::new(RESTORE_RUN_BYTES);
        rows(&mut |row| {
            match row {
                DumpRow::Tree(name) => {
                    if let Some(t) = tree {
                        put_value(&mut batch, runs.finish());
                        t.apply_batch(std::mem::take(&mut batch))?;
                    }
                    batched = 0;
                    tree = all.iter().find(|(n, _)| *n == name).map(|(_, t)| *t);
                    in_hist = name == "hist";
                }
                DumpRow::Row(k, v) => {
                    let Some(t) = tree else {
                        return Ok(());
                    };
                    if in_hist {
                        for (rev, record) in HistValue::parse(k, v)?.records() {
                            index_record(&mut index, rev, record)?;
                            batched += put_value(&mut batch, runs.push(rev, record.to_vec()));
                        }
                    } else {
                        batch.insert(k, v);
                        batched += 1;
                    }
                    if batched >= RESTORE_BATCH {
                        t.apply_batch(std::mem::take(&mut batch))?;
                        batched = 0;
                    }
                }
            }
            Ok(())
        })?;
        if let Some(t) = tree {
            put_value(&mut batch, runs.finish());
            t.apply_batch(batch)?;
        }
        self.revision.store(
            read_i64(&self.trees.meta, META_REVISION)?,
            Ordering::Release,
        );
        self.compact_revision
            .store(read_i64(&self.trees.meta, META_COMPACT)?, Ordering::Release);
        self.reload_alarms()?;
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
        self.reload_alarms()?;
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

    /// A store with `n` keys (a third of them on a lease) and a compaction behind it.
    fn store_with(n: usize) -> MvccStore {
        let db = sled::Config::new().temporary(true).open().expect("db");
        let store = MvccStore::open(&db).expect("store");
        store
            .apply(&Command::LeaseGrant { id: 3, ttl: 60 }, Vec::new())
            .expect("grant");
        for i in 0..n {
            let cmd = Command::Txn(TxnRequest {
                success: vec![Op::Put(PutRequest {
                    key: format!("k{}", i % (n / 2 + 1)).into_bytes(),
                    value: vec![i as u8; i % 100],
                    lease: if i % 3 == 0 { 3 } else { 0 },
                    ..Default::default()
                })],
                ..Default::default()
            });
            store.apply(&cmd, Vec::new()).expect("put");
        }
        store
            .apply(&Command::Compact { revision: 5 }, Vec::new())
            .expect("compact");
        store
    }

    #[test]
    fn a_dump_read_as_it_is_restored_makes_the_same_store() {
        // More rows than one restore batch.
        let source = store_with(3 * RESTORE_BATCH);
        let (bytes, _) = source.dump_encoded(&[]).expect("encoded dump");
        let target = store_with(10);
        Dump::check(&mut &bytes[..]).expect("the dump reads");
        target.restore_from(&mut &bytes[..]).expect("restore");
        assert_eq!(target.revision(), source.revision());
        assert_eq!(target.compact_revision(), source.compact_revision());
        assert_eq!(target.hash_kv(0), source.hash_kv(0));
        // The same records, in runs of another size.
        assert_eq!(
            target.dump().expect("dump").contents(),
            source.dump().expect("dump").contents()
        );
        assert_eq!(
            target.lease_keys(3).expect("lease keys"),
            source.lease_keys(3).expect("lease keys")
        );
        // One small record per commit in the source; the restore made runs of them.
        assert!(
            target.trees.hist.len() * 10 < source.trees.hist.len(),
            "{} history values restored from {}",
            target.trees.hist.len(),
            source.trees.hist.len()
        );
        // The index the restore built as the records passed is the one the history makes.
        let mut rebuilt = KeyIndex::default();
        target.rebuild_index(&mut rebuilt).expect("rebuild");
        assert_eq!(*target.index.read().unwrap(), rebuilt);
        // Every revision kept reads the same from the runs.
        let every = KeyRange {
            key: vec![0],
            range_end: vec![0],
        };
        for revision in (source.compact_revision()..=source.revision()).step_by(97) {
            let req = RangeRequest {
                range: every.clone(),
                revision,
                ..Default::default()
            };
            assert_eq!(
                target.range(&req).expect("range"),
                source.range(&req).expect("range"),
                "at revision {revision}"
            );
        }
    }

    #[test]
    fn a_damaged_dump_is_refused_by_what_is_wrong_with_it() {
        let store = store_with(50);
        let (bytes, _) = store.dump_encoded(&[]).expect("encoded dump");
        let refused = |bytes: &[u8]| {
            let err = Dump::check(&mut &bytes[..]).expect_err("refused");
            let decoded = Dump::decode(bytes).err().map(|e| e.to_string());
            assert_eq!(decoded, Some(err.to_string()), "decode and check agree");
            err.to_string()
        };
        assert!(refused(&bytes[..4]).contains("cut short in its format mark"));
        assert!(refused(&bytes[..bytes.len() - 1]).contains("cut short in a row"));
        // A row's length damaged to claim more than there is: read to the end, not allocated.
        let dump = store.dump().expect("dump");
        let (_, last) = dump.rows("meta").last().expect("a metadata row");
        let mut long = bytes.clone();
        let at = long.len() - last.len() - 8;
        assert_eq!(long[at..at + 8], (last.len() as u64).to_le_bytes());
        long[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(refused(&long).contains("cut short"));
    }

    #[test]
    fn an_encoded_dump_is_the_dump_encoded() {
        let db = sled::Config::new().temporary(true).open().expect("db");
        let store = MvccStore::open(&db).expect("store");
        let marked = |dump: &Dump| [&b"RKDUMP\x02\x00"[..], &encode(dump)].concat();
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
        let newer = [&b"RKDUMP\x03\x00"[..], &encode(&dump)].concat();
        let refused = Dump::decode(&newer).err().map(|e| e.to_string());
        assert_eq!(
            refused.as_deref(),
            Some(
                "storage: snapshot format version 3 is not supported by this rkube (it reads \
                 versions 0 to 2); upgrade this member"
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
