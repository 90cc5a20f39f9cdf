//! `rkube snapshot save|status|restore|list`: backups of the store's desired state, taken by
//! hand or by the leader on a schedule (`rkube server --snapshot-interval`), in etcd's snapshot
//! format: `etcdctl snapshot status|restore` read them, and these commands read etcd's (and
//! rkube's older format, and either zipped).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use futures::StreamExt;
use rkube_store::backup;
use rkube_store::proto::etcdserverpb as pb;
use rkube_store::server::snapshot_schedule;
use tonic::transport::Channel;

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Stream a consistent snapshot from a live member into FILE (etcd's snapshot format, as
    /// `etcdctl snapshot save` writes it).
    Save {
        file: PathBuf,
        /// Zip the file (one deflated entry, as k3s's --etcd-snapshot-compress); status and
        /// restore read it as it is.
        #[arg(long)]
        compress: bool,
    },
    /// Check a snapshot file and show what it holds.
    Status {
        file: PathBuf,
        /// Output format: table or json.
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// Build the data dir of one member of a new cluster from a snapshot (rkube's, or etcd's
    /// from `etcdctl snapshot save`); start it with `rkube server` using the same --name and
    /// --data-dir (every member restores the same file).
    Restore {
        file: PathBuf,
        #[arg(long)]
        data_dir: PathBuf,
        /// Jump the revision ahead by this much and mark older history compacted, so that
        /// watchers and caches of the old cluster re-list (0 keeps the revisions as they were).
        #[arg(long, default_value_t = 1_000_000)]
        bump_revision: i64,
        /// Accept a database without the SHA-256 a saved snapshot ends with (a copy of an etcd
        /// data dir's member/snap/db), as etcdctl snapshot restore --skip-hash-check does.
        #[arg(long)]
        skip_hash_check: bool,
    },
    /// List the scheduled snapshots, newest first, each file checked: those in the given
    /// snapshot dirs, or else in every member's snapshot dir of the local cluster --dir DIR
    /// (default ./rkube-local).
    List {
        /// Snapshot dirs (a server's --snapshot-dir, by default DATA_DIR/snapshots).
        snapshot_dirs: Vec<PathBuf>,
        /// Output format: table or json.
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
}

pub fn read(
    file: &Path,
    skip_hash_check: bool,
) -> Result<(backup::BackupInfo, rkube_store::mvcc::store::Dump)> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    backup::decode_with(&bytes, skip_hash_check)
        .with_context(|| format!("{} cannot be used", file.display()))
}

/// Writes a member's data dir holding the snapshot's state; refuses a data dir in use.
pub fn restore_into(file: &Path, data_dir: &Path, bump: i64) -> Result<backup::BackupInfo> {
    restore_checked(file, data_dir, bump, false)
}

fn restore_checked(
    file: &Path,
    data_dir: &Path,
    bump: i64,
    skip_hash_check: bool,
) -> Result<backup::BackupInfo> {
    let (info, dump) = read(file, skip_hash_check)?;
    if data_dir.exists() && std::fs::read_dir(data_dir)?.next().is_some() {
        bail!(
            "data dir {} is not empty; restore needs a new, empty data dir",
            data_dir.display()
        );
    }
    std::fs::create_dir_all(data_dir)?;
    let db = sled::Config::new().path(data_dir.join("db")).open()?;
    let store = rkube_store::mvcc::MvccStore::open_dir(&db, &data_dir.join("db"))?;
    store.restore_for_new_cluster(dump, bump)?;
    store.sync()?;
    Ok(info)
}

/// Runs a snapshot command; `save` needs `ch`, `list` may use the local cluster `cluster_dir`.
pub async fn run(
    ch: Option<Channel>,
    cluster_dir: Option<&Path>,
    cmd: SnapshotCommand,
) -> Result<()> {
    match cmd {
        SnapshotCommand::Save { file, compress } => {
            save(
                ch.context("snapshot save needs a cluster")?,
                &file,
                compress,
            )
            .await
        }
        SnapshotCommand::Status { file, output } => {
            let (info, _) = read(&file, true)?;
            let size = std::fs::metadata(&file)?.len();
            let format = format_name(&info);
            if output == "json" {
                let etcd = info.etcd.map(|e| {
                    serde_json::json!({
                        "hash": e.hash, "revision": e.revision, "totalKey": e.total_key,
                        "totalSize": e.total_size,
                    })
                });
                println!(
                    "{}",
                    serde_json::json!({
                        "format": format, "revision": info.revision, "compactRevision": info.compact_revision,
                        "totalKey": info.keys, "totalSize": size, "hash": info.hash,
                        "compressed": info.compressed, "etcd": etcd,
                    })
                );
            } else {
                println!(
                    "{:<8} {:>10} {:>10} {:>10} {:>12}  FORMAT",
                    "HASH", "REVISION", "COMPACTED", "TOTAL KEYS", "TOTAL SIZE"
                );
                println!(
                    "{:<8x} {:>10} {:>10} {:>10} {:>12}  {format}",
                    info.hash, info.revision, info.compact_revision, info.keys, size
                );
            }
            Ok(())
        }
        SnapshotCommand::List {
            snapshot_dirs,
            output,
        } => list(snapshot_dirs, cluster_dir, output == "json"),
        SnapshotCommand::Restore {
            file,
            data_dir,
            bump_revision,
            skip_hash_check,
        } => {
            let info = restore_checked(&file, &data_dir, bump_revision, skip_hash_check)?;
            println!(
                "restored {} keys at revision {} into {} (new revision {}); start the member with rkube server --data-dir {}",
                info.keys,
                info.revision,
                data_dir.display(),
                info.revision + bump_revision.max(0),
                data_dir.display()
            );
            Ok(())
        }
    }
}

/// The dirs `list` reads, each with the label it shows (a member's name, or the dir).
fn list_sources(
    snapshot_dirs: Vec<PathBuf>,
    cluster_dir: Option<&Path>,
) -> Result<(&'static str, Vec<(String, PathBuf)>)> {
    if !snapshot_dirs.is_empty() {
        if let Some(dir) = cluster_dir {
            bail!(
                "give snapshot dirs or the --dir of a local cluster, not both (--dir {})",
                dir.display()
            );
        }
        let sources = snapshot_dirs
            .into_iter()
            .map(|d| (d.display().to_string(), d))
            .collect();
        return Ok(("dir", sources));
    }
    let dir = cluster_dir.unwrap_or(Path::new(crate::up::DEFAULT_DIR));
    let hint = match cluster_dir {
        Some(d) => format!(
            "to list a snapshot dir rather than a local cluster's, pass it as an argument: rkube snapshot list {}",
            d.display()
        ),
        None => "no snapshot dir given: pass one (rkube snapshot list SNAPSHOT_DIR) or a local cluster's --dir".to_string(),
    };
    let local = crate::up::LocalCluster::load(dir).context(hint)?;
    let sources = local
        .members
        .iter()
        .map(|m| (m.name.clone(), local.snapshot_dir(dir, &m.name)))
        .collect();
    Ok(("member", sources))
}

fn list(snapshot_dirs: Vec<PathBuf>, cluster_dir: Option<&Path>, json: bool) -> Result<()> {
    let explicit = !snapshot_dirs.is_empty();
    let (label, sources) = list_sources(snapshot_dirs, cluster_dir)?;
    let mut rows = Vec::new();
    for (source, dir) in &sources {
        match snapshot_schedule::list(dir) {
            Ok(listed) => rows.extend(listed.into_iter().map(|l| (source.clone(), l))),
            // A member started without a schedule has no snapshot dir.
            Err(e) if !explicit && e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).context(format!("cannot list snapshot dir {}", dir.display())),
        }
    }
    rows.sort_by(|a, b| b.1.name.cmp(&a.1.name));
    let taken = |l: &snapshot_schedule::Listed| {
        l.name
            .taken
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    if json {
        let items: Vec<serde_json::Value> = rows
            .iter()
            .map(|(source, l)| {
                let info = l.check.as_ref().ok();
                serde_json::json!({
                    label: source,
                    "file": l.name.file,
                    "path": l.path,
                    "taken": taken(l),
                    "revision": info.map_or(l.name.revision, |i| i.revision),
                    "totalKey": info.map(|i| i.keys),
                    "totalSize": l.size,
                    "hash": info.map(|i| i.hash),
                    "error": l.check.as_ref().err().map(ToString::to_string),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(items));
        return Ok(());
    }
    if rows.is_empty() {
        let dirs: Vec<String> = sources
            .iter()
            .map(|(_, d)| d.display().to_string())
            .collect();
        eprintln!("no scheduled snapshots in {}", dirs.join(", "));
        return Ok(());
    }
    // One dir needs no column saying which.
    let show_source = !(explicit && sources.len() == 1);
    let width = rows
        .iter()
        .map(|(s, _)| s.len())
        .chain([label.len()])
        .max()
        .unwrap_or(0);
    let file_width = rows
        .iter()
        .map(|(_, l)| l.name.file.len())
        .max()
        .unwrap_or(0);
    let source_col = |s: &str| {
        if show_source {
            format!("{s:<width$}  ")
        } else {
            String::new()
        }
    };
    println!(
        "{}{:<file_width$}  {:<24}  {:>10}  {:>10}  {:>12}  CHECK",
        source_col(&label.to_uppercase()),
        "FILE",
        "TAKEN",
        "REVISION",
        "TOTAL KEYS",
        "TOTAL SIZE"
    );
    for (source, l) in &rows {
        let (revision, keys, check) = match &l.check {
            Ok(info) => (info.revision, info.keys.to_string(), "ok".to_string()),
            Err(e) => (l.name.revision, "-".to_string(), e.to_string()),
        };
        println!(
            "{}{:<file_width$}  {:<24}  {:>10}  {:>10}  {:>12}  {check}",
            source_col(source),
            l.name.file,
            taken(l),
            revision,
            keys,
            l.size
        );
    }
    Ok(())
}

/// Writes the stream into `part` with a progress bar, and syncs it.
async fn receive(stream: &mut tonic::Streaming<pb::SnapshotResponse>, part: &Path) -> Result<()> {
    let mut out =
        std::fs::File::create(part).with_context(|| format!("cannot create {}", part.display()))?;
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut received = 0u64;
    while let Some(msg) = stream.next().await {
        let msg = msg.map_err(|s| anyhow::anyhow!("snapshot stream failed: {}", s.message()))?;
        out.write_all(&msg.blob)?;
        received += msg.blob.len() as u64;
        bar.set_length(received + msg.remaining_bytes);
        bar.set_position(received);
    }
    bar.finish();
    out.sync_all()?;
    Ok(())
}

/// The format column: `etcd`, `rkube-v1`, with `+zip` when compressed.
fn format_name(info: &backup::BackupInfo) -> String {
    if info.compressed {
        format!("{}+zip", info.format)
    } else {
        info.format.to_string()
    }
}

async fn save(ch: Channel, file: &Path, compress: bool) -> Result<()> {
    let mut m =
        pb::maintenance_client::MaintenanceClient::new(ch).max_decoding_message_size(usize::MAX);
    let mut stream = m
        .snapshot(pb::SnapshotRequest {})
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    let mut part = file.as_os_str().to_owned();
    part.push(".part");
    let part = PathBuf::from(part);
    let result = receive(&mut stream, &part).await;
    if result.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    result?;
    let checked = read(&part, false).context("the received snapshot does not check out");
    let (info, _) = match checked {
        Ok(read) => read,
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    if compress {
        // The entry is named for the file without its .zip, as k3s names it.
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "snapshot".into());
        let name = name.strip_suffix(".zip").unwrap_or(&name).to_string();
        let bytes = std::fs::read(&part)?;
        let zipped = backup::compress(&name, &bytes)?;
        rkube_store::durable_file::replace(file, &part, &zipped)
            .with_context(|| format!("cannot write {}", file.display()))?;
    } else {
        std::fs::rename(&part, file)?;
    }
    println!(
        "Snapshot saved at {} (revision {}, {} keys, hash {:x})",
        file.display(),
        info.revision,
        info.keys,
        info.hash
    );
    Ok(())
}
