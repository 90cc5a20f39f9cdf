//! Scheduled snapshots (`rkube server --snapshot-interval`): every interval, the member that is
//! Raft leader writes a snapshot file — etcd's snapshot format, as `rkube snapshot save` and
//! `etcdctl snapshot save` write it, [`crate::backup`] — into the snapshot dir and keeps the
//! newest `retain` of them. Followers write none, so a cluster with a stable leader makes one
//! file per interval wherever its leader runs.
//!
//! Files are named `rkube-snapshot-<UTC time>-rev<revision>.snap` (`.snap.zip` when compressed,
//! `--snapshot-compress`: a zip of the `.snap` file, as k3s compresses its etcd snapshots) and
//! sort by time. Each is written under a hidden temporary name, fsynced and renamed, so a crash
//! never leaves a partial file under a snapshot's name. Retention counts both kinds and deletes
//! only files with those name patterns.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDateTime, SubsecRound, Utc};
use tokio::time::MissedTickBehavior;

use super::history::EventKind;
use super::node::Node;
use crate::backup::{self, BackupError, BackupInfo};
use crate::error::StorageError;
use crate::mvcc::MvccStore;

/// Scheduled snapshots kept when `--snapshot-retain` is not given.
pub const DEFAULT_RETAIN: usize = 5;
/// The shortest interval accepted: each snapshot is a full copy of the store.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

const PREFIX: &str = "rkube-snapshot-";
const SUFFIX: &str = ".snap";
/// After [`SUFFIX`] for a compressed snapshot.
const ZIP_SUFFIX: &str = ".zip";
const TIME_FORMAT: &str = "%Y%m%dT%H%M%S%.3fZ";
/// The leader checks whether a snapshot is due at most this far apart.
const MAX_CHECK_PERIOD: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSchedule {
    /// At least [`MIN_INTERVAL`].
    pub interval: Duration,
    /// At least 1.
    pub retain: usize,
    pub dir: PathBuf,
    /// Zip each file (`--snapshot-compress`).
    pub compress: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("cannot copy the store: {0}")]
    Encode(#[from] StorageError),
    #[error("cannot compress the snapshot: {0}")]
    Compress(#[from] BackupError),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot list snapshot dir {dir}: {source}")]
    ReadDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot delete old snapshot {path}: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the snapshot task failed: {0}")]
    Task(String),
}

/// The name of a scheduled snapshot file. Orders by time, then revision.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SnapshotName {
    pub taken: DateTime<Utc>,
    pub revision: i64,
    pub file: String,
}

impl SnapshotName {
    /// The name for a snapshot taken at `taken` (kept to the millisecond) at `revision`.
    pub fn new(taken: DateTime<Utc>, revision: i64) -> Self {
        let taken = taken.trunc_subsecs(3);
        let file = format!(
            "{PREFIX}{}-rev{revision}{SUFFIX}",
            taken.format(TIME_FORMAT)
        );
        Self {
            taken,
            revision,
            file,
        }
    }

    /// The name of the same snapshot compressed.
    pub fn zipped(mut self) -> Self {
        if !self.compressed() {
            self.file.push_str(ZIP_SUFFIX);
        }
        self
    }

    pub fn compressed(&self) -> bool {
        self.file.ends_with(ZIP_SUFFIX)
    }

    /// Parses a file name; `None` for any name rkube's scheduler does not write.
    pub fn parse(file: &str) -> Option<Self> {
        let plain = file.strip_suffix(ZIP_SUFFIX).unwrap_or(file);
        let rest = plain.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
        let (time, revision) = rest.split_once("-rev")?;
        if revision.is_empty() || !revision.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let revision = revision.parse().ok()?;
        let taken = NaiveDateTime::parse_from_str(time, TIME_FORMAT)
            .ok()?
            .and_utc();
        Some(Self {
            taken,
            revision,
            file: file.to_string(),
        })
    }
}

/// The scheduled snapshots in `dir`, newest first. Other files are left out.
pub fn scheduled_in(dir: &Path) -> std::io::Result<Vec<SnapshotName>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        if let Some(name) = entry.file_name().to_str().and_then(SnapshotName::parse) {
            names.push(name);
        }
    }
    names.sort_by(|a, b| b.cmp(a));
    Ok(names)
}

/// Which of `files` retention deletes: the scheduled snapshots beyond the newest `retain`
/// (never fewer than one kept). A name that is not a scheduled snapshot's is never chosen.
pub fn expired(files: &[String], retain: usize) -> Vec<String> {
    let mut names: Vec<SnapshotName> = files
        .iter()
        .filter_map(|f| SnapshotName::parse(f))
        .collect();
    names.sort_by(|a, b| b.cmp(a));
    names
        .into_iter()
        .skip(retain.max(1))
        .map(|n| n.file)
        .collect()
}

/// A snapshot written by [`take`].
#[derive(Debug, Clone)]
pub struct Taken {
    pub path: PathBuf,
    pub info: BackupInfo,
    pub size: u64,
}

/// Writes a snapshot of `store` into `dir`, named for `now` and its revision, zipped if
/// `compress`. Blocking: call it off the async runtime.
pub fn take(
    store: &MvccStore,
    dir: &Path,
    now: DateTime<Utc>,
    compress: bool,
) -> Result<Taken, ScheduleError> {
    let (mut info, mut bytes) = backup::encode(store)?;
    let mut name = SnapshotName::new(now, info.revision);
    if compress {
        bytes = backup::compress(&name.file, &bytes)?;
        info.compressed = true;
        name = name.zipped();
    }
    let path = dir.join(&name.file);
    // Hidden and without the .snap suffix: never listed, restored or pruned as a snapshot.
    let tmp = dir.join(format!(".{}.tmp", name.file));
    if let Err(source) = crate::durable_file::replace(&path, &tmp, &bytes) {
        let _ = std::fs::remove_file(&tmp);
        return Err(ScheduleError::Write { path, source });
    }
    Ok(Taken {
        path,
        info,
        size: bytes.len() as u64,
    })
}

/// Deletes the scheduled snapshots in `dir` beyond the newest `retain`; returns what it deleted.
pub fn prune(dir: &Path, retain: usize) -> Result<Vec<PathBuf>, ScheduleError> {
    let read_dir = |source| ScheduleError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    };
    let files: Vec<String> = scheduled_in(dir)
        .map_err(read_dir)?
        .into_iter()
        .map(|n| n.file)
        .collect();
    let mut deleted = Vec::new();
    for file in expired(&files, retain) {
        let path = dir.join(file);
        match std::fs::remove_file(&path) {
            Ok(()) => deleted.push(path),
            // Someone else removed it: what retention wanted.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(ScheduleError::Remove { path, source }),
        }
    }
    Ok(deleted)
}

/// One file of a listing: its name, and its header if it checks out.
#[derive(Debug)]
pub struct Listed {
    pub name: SnapshotName,
    pub path: PathBuf,
    pub size: u64,
    pub check: Result<BackupInfo, BackupError>,
}

/// The scheduled snapshots in `dir`, newest first, each read and checked; a corrupt file is
/// reported in its entry. A file deleted by retention while listing is left out.
pub fn list(dir: &Path) -> std::io::Result<Vec<Listed>> {
    let mut out = Vec::new();
    for name in scheduled_in(dir)? {
        let path = dir.join(&name.file);
        let (size, check) = match std::fs::read(&path) {
            Ok(bytes) => (bytes.len() as u64, backup::inspect(&bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => (0, Err(BackupError::Io(e))),
        };
        out.push(Listed {
            name,
            path,
            size,
            check,
        });
    }
    Ok(out)
}

fn check_period(interval: Duration) -> Duration {
    (interval / 4).clamp(Duration::from_millis(100), MAX_CHECK_PERIOD)
}

/// The age of the newest scheduled snapshot in `dir` as a point on the monotonic clock; `None`
/// when there is none (or it is dated in the future or too far back to represent).
fn newest_as_instant(dir: &Path) -> Option<Instant> {
    let newest = scheduled_in(dir).ok()?.into_iter().next()?;
    let age = (Utc::now() - newest.taken).to_std().ok()?;
    Instant::now().checked_sub(age)
}

/// Takes the scheduled snapshots while this member is leader, until `stopped`.
pub async fn run(node: Arc<Node>, schedule: SnapshotSchedule, stopped: impl Future<Output = ()>) {
    tokio::pin!(stopped);
    let mut tick = tokio::time::interval(check_period(schedule.interval));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last: Option<Instant> = None;
    let mut read_dir = true;
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tick.tick() => {}
        }
        if !node.is_leader() {
            continue;
        }
        if read_dir {
            // The first time as leader in this process, go on from the files already there, so
            // that restarts more frequent than the interval neither stop nor multiply snapshots.
            read_dir = false;
            let dir = schedule.dir.clone();
            last = tokio::task::spawn_blocking(move || newest_as_instant(&dir))
                .await
                .ok()
                .flatten();
        }
        if last.is_some_and(|at| at.elapsed() < schedule.interval) {
            continue;
        }
        // Counted from the attempt: a failing disk is retried once per interval, not per check.
        last = Some(Instant::now());
        tokio::select! {
            _ = &mut stopped => return,
            _ = snapshot_once(&node, &schedule) => {}
        }
    }
}

async fn snapshot_once(node: &Node, schedule: &SnapshotSchedule) {
    let started = Instant::now();
    let store = node.mvcc.clone();
    let (dir, retain, compress) = (schedule.dir.clone(), schedule.retain, schedule.compress);
    let outcome = tokio::task::spawn_blocking(move || {
        let taken = take(&store, &dir, Utc::now(), compress)?;
        Ok::<_, ScheduleError>((taken, prune(&dir, retain)))
    })
    .await
    .map_err(|e| ScheduleError::Task(e.to_string()))
    .and_then(|r| r);
    let m = &node.metrics;
    match outcome {
        Ok((taken, pruned)) => {
            m.scheduled_snapshots.inc();
            m.scheduled_snapshot_seconds
                .observe(started.elapsed().as_secs_f64());
            m.scheduled_snapshot_last_success
                .set(Utc::now().timestamp());
            m.history.record(EventKind::ScheduledSnapshot {
                file: taken
                    .path
                    .file_name()
                    .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
                revision: taken.info.revision,
                bytes: taken.size,
            });
            tracing::info!(
                file = %taken.path.display(),
                revision = taken.info.revision,
                keys = taken.info.keys,
                bytes = taken.size,
                "scheduled snapshot taken"
            );
            match pruned {
                Ok(deleted) => {
                    for path in deleted {
                        tracing::info!(file = %path.display(), "old scheduled snapshot deleted");
                    }
                }
                Err(e) => {
                    m.scheduled_snapshot_failures.inc();
                    tracing::warn!(error = %e, "cannot delete old scheduled snapshots");
                }
            }
        }
        Err(e) => {
            m.scheduled_snapshot_failures.inc();
            m.history.record(EventKind::ScheduledSnapshotFailed {
                error: e.to_string(),
            });
            tracing::error!(error = %e, dir = %schedule.dir.display(), "scheduled snapshot failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{Command, Op, PutRequest, TxnRequest};

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("test time")
            .with_timezone(&Utc)
    }

    fn put(store: &MvccStore, key: &str) {
        let put = Op::Put(PutRequest {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        });
        store
            .apply(
                &Command::Txn(TxnRequest {
                    compare: vec![],
                    success: vec![put],
                    failure: vec![],
                }),
                vec![],
            )
            .expect("apply");
    }

    #[test]
    fn names_sort_by_time_and_parse_back() {
        let name = SnapshotName::new(at("2025-03-04T05:06:07.123456Z"), 42);
        assert_eq!(name.file, "rkube-snapshot-20250304T050607.123Z-rev42.snap");
        assert_eq!(SnapshotName::parse(&name.file), Some(name.clone()));
        let later = SnapshotName::new(at("2025-03-04T05:06:08.001Z"), 7);
        assert!(later.file > name.file && later > name);
        let zipped = name.clone().zipped();
        assert_eq!(
            zipped.file,
            "rkube-snapshot-20250304T050607.123Z-rev42.snap.zip"
        );
        assert!(zipped.compressed() && !name.compressed());
        assert_eq!(SnapshotName::parse(&zipped.file), Some(zipped.clone()));
        assert_eq!(zipped.clone().zipped(), zipped);
    }

    #[test]
    fn other_names_are_not_snapshots() {
        for file in [
            "backup.snap",
            "notes.txt",
            "rkube-snapshot-20250304T050607.123Z-rev42.snap.tmp",
            ".rkube-snapshot-20250304T050607.123Z-rev42.snap.tmp",
            "rkube-snapshot-20250304T050607.123Z-rev.snap",
            "rkube-snapshot-20250304T050607.123Z-rev-1.snap",
            "rkube-snapshot-20250304T050607.123Z-rev42x.snap",
            "rkube-snapshot-2025-03-04-rev42.snap",
            "rkube-snapshot-20251304T050607.123Z-rev42.snap",
            "my-rkube-snapshot-20250304T050607.123Z-rev42.snap",
            "rkube-snapshot-20250304T050607.123Z-rev42.zip",
            "rkube-snapshot-20250304T050607.123Z-rev42.snap.zip.zip",
            ".rkube-snapshot-20250304T050607.123Z-rev42.snap.zip.tmp",
        ] {
            assert_eq!(SnapshotName::parse(file), None, "{file}");
        }
    }

    #[test]
    fn retention_deletes_only_the_oldest_scheduled_snapshots() {
        let snap = |t: &str, rev: i64| SnapshotName::new(at(t), rev).file;
        let s1 = snap("2025-01-01T00:00:00Z", 10);
        let s2 = snap("2025-01-01T00:30:00Z", 20);
        let s3 = snap("2025-01-01T01:00:00Z", 30);
        // Same millisecond (a restarted leader): the higher revision is the newer.
        let s3b = snap("2025-01-01T01:00:00Z", 31);
        let s4 = snap("2026-01-01T00:00:00Z", 5);
        let other = |f: &str| f.to_string();
        let cases: Vec<(&str, Vec<String>, usize, Vec<String>)> = vec![
            ("nothing to delete", vec![s1.clone(), s2.clone()], 2, vec![]),
            ("empty dir", vec![], 3, vec![]),
            (
                "oldest beyond retain, in any listing order",
                vec![s3.clone(), s1.clone(), s4.clone(), s2.clone()],
                2,
                vec![s2.clone(), s1.clone()],
            ),
            (
                "time decides, not revision (a restored cluster restarts low)",
                vec![s4.clone(), s3.clone()],
                1,
                vec![s3.clone()],
            ),
            (
                "same time: lower revision goes",
                vec![s3.clone(), s3b.clone()],
                1,
                vec![s3.clone()],
            ),
            (
                "other files are never chosen",
                vec![
                    other("backup.snap"),
                    s1.clone(),
                    other("notes.txt"),
                    s2.clone(),
                    other(".rkube-snapshot-20240101T000000.000Z-rev1.snap.tmp"),
                    other("rkube-snapshot-garbage.snap"),
                ],
                1,
                vec![s1.clone()],
            ),
            (
                "compressed files count like the others",
                vec![
                    format!("{s1}.zip"),
                    s2.clone(),
                    format!("{s3}.zip"),
                    s4.clone(),
                ],
                2,
                vec![s2.clone(), format!("{s1}.zip")],
            ),
            (
                "retain 0 still keeps the newest",
                vec![s1.clone(), s2.clone()],
                0,
                vec![s1.clone()],
            ),
        ];
        for (what, files, retain, want) in cases {
            assert_eq!(expired(&files, retain), want, "{what}");
        }
    }

    #[test]
    fn take_writes_a_restorable_file_and_prune_keeps_the_newest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::Config::new().temporary(true).open().expect("db");
        let store = MvccStore::open(&db).expect("store");
        std::fs::write(dir.path().join("notes.txt"), b"mine").expect("foreign file");
        let mut taken = Vec::new();
        for (i, t) in [
            "2025-01-01T00:00:00Z",
            "2025-01-01T00:00:01Z",
            "2025-01-01T00:00:02Z",
        ]
        .into_iter()
        .enumerate()
        {
            put(&store, &format!("k{i}"));
            taken.push(take(&store, dir.path(), at(t), false).expect("take"));
        }
        assert_eq!(taken[2].info.revision, 3);
        let bytes = std::fs::read(&taken[2].path).expect("read");
        let (info, _) = backup::decode(&bytes).expect("a backup file");
        assert_eq!((info.revision, info.keys), (3, 3));

        let deleted = prune(dir.path(), 2).expect("prune");
        assert_eq!(deleted, vec![taken[0].path.clone()]);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![
                "notes.txt".to_string(),
                "rkube-snapshot-20250101T000001.000Z-rev2.snap".to_string(),
                "rkube-snapshot-20250101T000002.000Z-rev3.snap".to_string(),
            ],
            "no temporary file is left and other files are kept"
        );
    }

    #[test]
    fn compressed_snapshots_restore_and_count_for_retention() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::Config::new().temporary(true).open().expect("db");
        let store = MvccStore::open(&db).expect("store");
        for i in 0..50 {
            put(&store, &format!("key-{i:03}"));
        }
        let plain = take(&store, dir.path(), at("2025-01-01T00:00:00Z"), false).expect("take");
        let zipped = take(&store, dir.path(), at("2025-01-01T00:00:01Z"), true).expect("take");
        assert!(zipped.path.to_string_lossy().ends_with("-rev50.snap.zip"));
        assert!(zipped.info.compressed && !plain.info.compressed);
        assert!(
            zipped.size < plain.size,
            "{} !< {}",
            zipped.size,
            plain.size
        );
        let (info, dump) =
            backup::decode(&std::fs::read(&zipped.path).expect("read")).expect("decode");
        assert_eq!(info, zipped.info);
        assert_eq!((dump.revision(), dump.key_count()), (50, 50));

        let listed = list(dir.path()).expect("list");
        assert_eq!(listed.len(), 2);
        assert!(listed[0].name.compressed(), "newest first");
        assert!(listed.iter().all(|l| l.check.is_ok()));
        put(&store, "one-more");
        take(&store, dir.path(), at("2025-01-01T00:00:02Z"), true).expect("take");
        assert_eq!(prune(dir.path(), 2).expect("prune"), vec![plain.path]);
    }

    #[test]
    fn listing_reports_a_corrupt_file_and_goes_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::Config::new().temporary(true).open().expect("db");
        let store = MvccStore::open(&db).expect("store");
        put(&store, "a");
        let good = take(&store, dir.path(), at("2025-01-01T00:00:00Z"), false).expect("take");
        let bad = SnapshotName::new(at("2025-01-02T00:00:00Z"), 9).file;
        let mut bytes = std::fs::read(&good.path).expect("read");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(dir.path().join(&bad), bytes).expect("write");

        let listed = list(dir.path()).expect("list");
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].name.file, bad, "newest first");
        assert!(matches!(listed[0].check, Err(BackupError::Corrupt(_))));
        assert_eq!(listed[1].path, good.path);
        assert_eq!(listed[1].size, good.size);
        assert_eq!(listed[1].check.as_ref().map(|i| i.revision).ok(), Some(1));
    }
}
