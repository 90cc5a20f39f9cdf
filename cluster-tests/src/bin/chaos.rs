//! `cargo run -p cluster-tests --bin chaos -- --seed S --duration D [--faults ...]`: a seedable
//! randomized chaos campaign against three rkube servers (or, with `--system etcd`, three etcd
//! 3.4 members), each on a host of its own; prints the summary table and exits non-zero when a
//! check failed, leaving the seed and the histories in --dir. `--system kubernetes` runs the
//! Kubernetes-level campaign instead (`chaos::k8s`: API clients and a Deployment on a local
//! `rkube up` cluster while members are killed and paused).
//!
//! The power cuts (`--faults power-follower,power-leader,power-two,power-all`) put every
//! member's data dir on a powerfs of its own (`--power-fs`, on whenever they are drawn);
//! `--unsafe-no-fsync` makes rkube acknowledge without syncing its log, which they must catch.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use cluster_tests::chaos::campaign::{self, Config};
use cluster_tests::chaos::faults::Fault;
use cluster_tests::chaos::system::{Kind, Tuning};

#[derive(Parser)]
#[command(
    about = "Run a chaos campaign against a three-member cluster (needs root: it makes network namespaces)"
)]
struct Args {
    /// Seed of the fault schedule and the clients' choices (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// How long faults keep coming, e.g. 60s, 10m; they come in rounds (every kind once, in a
    /// seeded order) and the last round started is finished.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// The fault kinds to draw from (comma-separated; default: all that apply).
    #[arg(long, value_delimiter = ',', value_parser = Fault::parse)]
    faults: Vec<Fault>,
    /// rkube, etcd (the etcd 3.4 reference from Debian's etcd-server package), or kubernetes
    /// (the Kubernetes-level campaign against rkube: its --faults are kill-leader,
    /// kill-member, quorum-loss, pause-leader and kill-endpoint; --clients, --watchers and
    /// --dir do not apply to it).
    #[arg(long, default_value = "rkube", value_parser = ["rkube", "etcd", "kubernetes"])]
    system: String,
    /// Register/transaction clients.
    #[arg(long, default_value_t = 6)]
    clients: usize,
    /// Watchers of the registers.
    #[arg(long, default_value_t = 4)]
    watchers: usize,
    /// Where the members' data, logs and (on failure) the seed and histories go (default: a
    /// new directory under the system's temporary directory, kept).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The members' heartbeat interval, milliseconds (both systems' --heartbeat-interval).
    #[arg(long, default_value_t = 100)]
    heartbeat_interval: u64,
    /// The members' election timeout, milliseconds.
    #[arg(long, default_value_t = 1000)]
    election_timeout: u64,
    /// The rkube binary (default: the workspace's debug build, built if needed).
    #[arg(long, env = "RKUBE_BIN")]
    rkube_bin: Option<PathBuf>,
    /// Every member's data dir on a powerfs of its own (a FUSE filesystem that loses what was
    /// not fsynced when the power is cut; needs /dev/fuse). Default: on when power faults are
    /// drawn; when --faults is not given and powerfs cannot run here, the power faults are
    /// left out.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    power_fs: Option<bool>,
    /// rkube members acknowledge writes without syncing their log (`rkube server
    /// --unsafe-no-fsync`): the power cuts must then fail the campaign.
    #[arg(long)]
    unsafe_no_fsync: bool,
    /// An extra argument for every rkube member (repeat it for more).
    #[arg(long = "rkube-arg", allow_hyphen_values = true)]
    rkube_args: Vec<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 90s, 10m or 1h"))?;
    match unit {
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(60 * n)),
        "h" => Ok(Duration::from_secs(3600 * n)),
        _ => Err(format!("{s:?} is not a duration like 90s, 10m or 1h")),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = Args::parse();
    let seed = a.seed.unwrap_or_else(rand::random);
    let dir = match a.dir {
        Some(d) => d,
        None => tempfile::Builder::new()
            .prefix("rkube-chaos-")
            .tempdir()?
            .keep(),
    };
    if a.system == "kubernetes" {
        eprintln!("seed {seed}");
        let faults = if a.faults.is_empty() {
            Fault::all_for(Kind::Kubernetes)
        } else {
            a.faults.clone()
        };
        let summary = cluster_tests::chaos::k8s::campaign_with(seed, a.duration, &faults)
            .await
            .context("the campaign could not run")?;
        print!("{}", summary.table());
        if !summary.passed() {
            std::process::exit(1);
        }
        return Ok(());
    }
    let system = if a.system == "etcd" {
        Kind::Etcd
    } else {
        Kind::Rkube
    };
    let rkube_bin = match a.rkube_bin {
        Some(b) => b,
        // Not used by an etcd campaign: not built for one.
        None if system == Kind::Etcd => PathBuf::from("rkube"),
        None => cluster_tests::rkube_bin().to_path_buf(),
    };
    let mut faults = if a.faults.is_empty() {
        Fault::all_for(system)
    } else {
        a.faults.clone()
    };
    let power_fs = match a.power_fs {
        Some(on) => on,
        None if a.faults.is_empty() => match cluster_tests::powerfs::available() {
            Ok(()) => true,
            Err(why) => {
                eprintln!("leaving the power faults out: {why}");
                faults.retain(|f| !f.is_power_cut());
                false
            }
        },
        None => faults.iter().any(|f| f.is_power_cut()),
    };
    let mut rkube_args = a.rkube_args;
    if a.unsafe_no_fsync {
        if system == Kind::Etcd {
            anyhow::bail!("etcd 3.4 has no --unsafe-no-fsync (it came with etcd 3.5)");
        }
        rkube_args.push("--unsafe-no-fsync".into());
    }
    eprintln!("seed {seed}; members' data and logs in {}", dir.display());
    let summary = campaign::run(Config {
        system,
        seed,
        duration: a.duration,
        faults,
        clients: a.clients,
        watchers: a.watchers,
        dir,
        rkube_bin,
        tuning: Tuning {
            heartbeat_ms: a.heartbeat_interval,
            election_timeout_ms: a.election_timeout,
            ..Tuning::default()
        },
        power_fs,
        rkube_args,
    })
    .await
    .context("the campaign could not run")?;
    print!("{}", summary.table());
    if !summary.passed() {
        std::process::exit(1);
    }
    Ok(())
}
