//! `rkube snapshot save|status|restore`: backups of the store's desired state.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use futures::StreamExt;
use rkube_store::backup;
use rkube_store::proto::etcdserverpb as pb;
use tonic::transport::Channel;

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Stream a consistent snapshot from a live member into FILE.
    Save { file: PathBuf },
    /// Check a snapshot file and show what it holds.
    Status {
        file: PathBuf,
        /// Output format: table or json.
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// Build the data dir of one member of a new cluster from a snapshot; start it with
    /// `rkube server` using the same --name and --data-dir (every member restores the same file).
    Restore {
        file: PathBuf,
        #[arg(long)]
        data_dir: PathBuf,
        /// Jump the revision ahead by this much and mark older history compacted, so that
        /// watchers and caches of the old cluster re-list (0 keeps the revisions as they were).
        #[arg(long, default_value_t = 1_000_000)]
        bump_revision: i64,
    },
}

pub fn read(file: &Path) -> Result<(backup::BackupInfo, rkube_store::mvcc::store::Dump)> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    backup::decode(&bytes).with_context(|| format!("{} cannot be used", file.display()))
}

/// Writes a member's data dir holding the snapshot's state; refuses a data dir in use.
pub fn restore_into(file: &Path, data_dir: &Path, bump: i64) -> Result<backup::BackupInfo> {
    let (info, dump) = read(file)?;
    if data_dir.exists() && std::fs::read_dir(data_dir)?.next().is_some() {
        bail!(
            "data dir {} is not empty; restore needs a new, empty data dir",
            data_dir.display()
        );
    }
    std::fs::create_dir_all(data_dir)?;
    let db = sled::Config::new().path(data_dir.join("db")).open()?;
    let store = rkube_store::mvcc::MvccStore::open(&db)?;
    store.restore_for_new_cluster(dump, bump)?;
    db.flush()?;
    Ok(info)
}

pub async fn run(ch: Option<Channel>, cmd: SnapshotCommand) -> Result<()> {
    match cmd {
        SnapshotCommand::Save { file } => {
            save(ch.context("snapshot save needs a cluster")?, &file).await
        }
        SnapshotCommand::Status { file, output } => {
            let (info, _) = read(&file)?;
            let size = std::fs::metadata(&file)?.len();
            if output == "json" {
                println!(
                    "{}",
                    serde_json::json!({
                        "format": info.format, "revision": info.revision, "compactRevision": info.compact_revision,
                        "totalKey": info.keys, "totalSize": size, "hash": info.hash,
                    })
                );
            } else {
                println!(
                    "{:<8} {:>10} {:>10} {:>10} {:>12} {:>7}",
                    "HASH", "REVISION", "COMPACTED", "TOTAL KEYS", "TOTAL SIZE", "FORMAT"
                );
                println!(
                    "{:<8x} {:>10} {:>10} {:>10} {:>12} {:>7}",
                    info.hash, info.revision, info.compact_revision, info.keys, size, info.format
                );
            }
            Ok(())
        }
        SnapshotCommand::Restore {
            file,
            data_dir,
            bump_revision,
        } => {
            let info = restore_into(&file, &data_dir, bump_revision)?;
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

async fn save(ch: Channel, file: &Path) -> Result<()> {
    let mut m =
        pb::maintenance_client::MaintenanceClient::new(ch).max_decoding_message_size(usize::MAX);
    let mut stream = m
        .snapshot(pb::SnapshotRequest {})
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    let part = file.with_extension("part");
    let mut out = std::fs::File::create(&part)
        .with_context(|| format!("cannot create {}", part.display()))?;
    let started = Instant::now();
    let mut received = 0usize;
    while let Some(msg) = stream.next().await {
        let msg = msg.map_err(|s| anyhow::anyhow!("snapshot stream failed: {}", s.message()))?;
        out.write_all(&msg.blob)?;
        received += msg.blob.len();
        let rate = received as f64 / started.elapsed().as_secs_f64().max(0.001) / 1e6;
        eprint!(
            "\rreceived {received} bytes ({rate:.1} MB/s), {} left   ",
            msg.remaining_bytes
        );
    }
    eprintln!();
    out.sync_all()?;
    drop(out);
    let (info, _) = read(&part).context("the received snapshot does not check out")?;
    std::fs::rename(&part, file)?;
    println!(
        "Snapshot saved at {} (revision {}, {} keys, hash {:x})",
        file.display(),
        info.revision,
        info.keys,
        info.hash
    );
    Ok(())
}
