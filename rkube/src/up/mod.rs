//! `rkube up` and `rkube down`: a local HA cluster on loopback, one process per server.
//!
//! DIR holds `cluster.json` (the layout, so that `up` on an existing DIR restarts the same
//! members), `pki/` (CA, member and admin certificates), `<name>/` (data dirs), `<name>.pid`,
//! `<name>.log` and `env` (export lines for etcdctl and rkube's own clients). Scheduled snapshots
//! go to `<name>/snapshots/` (or `SNAPSHOT_DIR/<name>/` with `--snapshot-dir`).
//!
//! `layout.rs` is `cluster.json`: the members' addresses and the settings every start passes
//! on. `plan.rs` lays out a new DIR (the agents' runtime, the servers' ports); `access.rs`
//! writes the certificates, the admin's kubeconfig and `env`; `members.rs` starts a server and
//! `agents.rs` the node agents; `process.rs` finds and stops the processes by their pid files;
//! `down.rs` is `rkube down`. This file holds `up`'s flags and `up` itself: start what is not
//! running, wait for a leader and the API, then show the status table until Ctrl-C (or return
//! at once with `--detach`).

mod access;
mod agents;
mod down;
mod layout;
mod members;
mod plan;
mod process;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::status::{collect, print_table};
use access::{write_env, write_kubeconfig, write_pki};
use agents::start_agents;
use down::down_dir;
use plan::create;

pub use access::KUBECONFIG_FILE;
pub use agents::agent_name;
pub use down::{down, DownArgs};
pub use layout::{LocalCluster, LocalMember};
pub(crate) use members::spawn_member;
pub use process::running_pid;
pub(crate) use process::stop;

pub const DEFAULT_DIR: &str = "rkube-local";

#[derive(Debug, Clone, Args)]
pub struct UpArgs {
    /// Directory of the local cluster.
    #[arg(long, default_value = DEFAULT_DIR)]
    pub dir: PathBuf,
    /// Number of control-plane servers (for a new DIR).
    #[arg(long, default_value_t = 3)]
    pub servers: usize,
    /// First port: server i listens for clients on BASE+10*(i-1), peers on +1, metrics on +2.
    #[arg(long, default_value_t = 2379)]
    pub base_port: u16,
    /// Start the cluster in the background and return once it has a leader.
    #[arg(long)]
    pub detach: bool,
    /// Raft snapshot after this many applied entries (passed to every server); etcd 3.4's
    /// default.
    #[arg(long, default_value_t = 100_000)]
    pub snapshot_count: u64,
    /// Entries kept behind a snapshot for slow followers.
    #[arg(long, default_value_t = 5_000)]
    pub snapshot_catchup_entries: u64,
    /// Raft heartbeat interval in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Raft election timeout in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub election_timeout: u64,
    /// For a new DIR: start the cluster from this snapshot (`rkube snapshot save`), every
    /// member restored from it.
    #[arg(long)]
    pub restore: Option<PathBuf>,
    /// With --restore: how far to jump the revision ahead (see `rkube snapshot restore`).
    #[arg(long, default_value_t = 1_000_000)]
    pub bump_revision: i64,
    /// Database size in bytes past which a server raises a NOSPACE alarm (default 2 GiB).
    /// Given for an existing DIR, it replaces the saved value for the members this call
    /// starts (stop a member first to restart it with the new quota).
    #[arg(long)]
    pub quota_backend_bytes: Option<u64>,
    /// For a new DIR: run only the replicated store (the etcd v3 API), without the Kubernetes
    /// API, for using rkube as a key-value store.
    #[arg(long)]
    pub store_only: bool,
    /// The leader writes a backup file this often, e.g. 30m, 1h, 10s (0: never; the default for
    /// a new DIR). Given for an existing DIR, it replaces the recorded setting.
    #[arg(long, value_parser = crate::flags::parse_snapshot_interval)]
    pub snapshot_interval: Option<Duration>,
    /// Scheduled snapshots each member keeps (default 5).
    #[arg(long, value_parser = crate::flags::parse_retain)]
    pub snapshot_retain: Option<usize>,
    /// Scheduled snapshots go to SNAPSHOT_DIR/<name>/ (default: DIR/<name>/snapshots/).
    #[arg(long)]
    pub snapshot_dir: Option<PathBuf>,
    /// Zip the scheduled snapshots (`rkube server --snapshot-compress`). Recorded for the DIR.
    #[arg(long)]
    pub snapshot_compress: bool,
    /// How often the node controller checks nodes (default 5s). Recorded for the DIR.
    #[arg(long, value_parser = crate::flags::parse_duration)]
    pub node_monitor_period: Option<Duration>,
    /// How long a node may go without a heartbeat before it is Unknown (default 40s).
    #[arg(long, value_parser = crate::flags::parse_duration)]
    pub node_monitor_grace_period: Option<Duration>,
    /// NoExecute taints (evictions) started per second (default 0.1).
    #[arg(long)]
    pub node_eviction_rate: Option<f64>,
    /// How often the leader compacts the store's history (default 5m; 0: never).
    #[arg(long, value_parser = crate::flags::parse_duration)]
    pub compaction_interval: Option<Duration>,
    /// How often the servers scrape the agents' resource usage (default 15s). Recorded for
    /// the DIR.
    #[arg(long, value_parser = crate::flags::parse_duration)]
    pub metric_resolution: Option<Duration>,
    /// How often the HorizontalPodAutoscaler controller looks at each autoscaler (default
    /// 15s). Recorded for the DIR.
    #[arg(long, value_parser = crate::flags::parse_duration)]
    pub horizontal_pod_autoscaler_sync_period: Option<Duration>,
    /// How many terminated pods may stay before the pod garbage collector deletes the oldest
    /// (default 12500; 0 keeps them all). Recorded for the DIR.
    #[arg(long)]
    pub terminated_pod_gc_threshold: Option<usize>,
    /// Node agents to run (for a new DIR), each joined with a bootstrap token as a worker.
    #[arg(long, default_value_t = 2)]
    pub agents: usize,
    /// The agents' container runtime (for a new DIR): cri, real containers through a containerd
    /// per agent, each agent a host of its own (network namespace, address, pod CIDR); or sim,
    /// kwok-style simulated pods. Default: cri where containerd, runc, the CNI plugins and root
    /// are at hand, else sim (and `up` says why).
    #[arg(long, value_parser = ["cri", "sim"])]
    pub runtime: Option<String>,
    /// For a new DIR: the servers acknowledge writes without syncing their write-ahead logs
    /// (`rkube server --unsafe-no-fsync`). A power cut then loses acknowledged writes; for
    /// tests that must show it.
    #[arg(long)]
    pub unsafe_no_fsync: bool,
    /// More flags for every agent (e.g. --agent-args=--lease-interval=1s).
    #[arg(long = "agent-args", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
}

pub async fn up(args: UpArgs) -> Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let (mut cluster, fresh) = match LocalCluster::load(&args.dir) {
        Ok(_) if args.restore.is_some() => {
            bail!(
                "{} already holds a cluster; --restore starts a new one and needs a new DIR",
                args.dir.display()
            )
        }
        Ok(mut c) => {
            if let Some(quota) = args.quota_backend_bytes {
                c.quota_backend_bytes = quota;
                std::fs::write(
                    args.dir.join("cluster.json"),
                    serde_json::to_vec_pretty(&c)?,
                )?;
            }
            (c, false)
        }
        Err(_) => {
            let c = create(&args)?;
            if let Some(file) = &args.restore {
                for m in &c.members {
                    let info = crate::snapshot::restore_into(
                        file,
                        &args.dir.join(&m.name),
                        args.bump_revision,
                    )?;
                    println!(
                        "restored {} from {} (revision {}, {} keys)",
                        m.name,
                        file.display(),
                        info.revision,
                        info.keys
                    );
                }
            }
            (c, true)
        }
    };
    let changed = cluster.apply_snapshot_flags(&args)?;
    if fresh || changed {
        std::fs::write(
            args.dir.join("cluster.json"),
            serde_json::to_vec_pretty(&cluster)?,
        )?;
    }
    if cluster.snapshot_interval_ms > 0 {
        println!(
            "scheduled snapshots: every {:?} on the leader, {} kept, in {}",
            Duration::from_millis(cluster.snapshot_interval_ms),
            cluster.snapshot_retain,
            cluster.snapshot_dir(&args.dir, "<name>").display()
        );
    }
    write_pki(&args.dir, &cluster)?;
    if !cluster.store_only {
        write_kubeconfig(&args.dir, &cluster)?;
    }
    write_env(&args.dir, &cluster)?;
    match (&cluster.network, args.runtime.as_deref()) {
        (Some(_), Some("sim")) | (None, Some("cri")) if !fresh => println!(
            "{} keeps the runtime it was made with ({}); --runtime applies to a new DIR",
            args.dir.display(),
            if cluster.network.is_some() {
                "cri"
            } else {
                "sim"
            }
        ),
        _ => {}
    }
    if let (Some(net), true) = (&cluster.network, cluster.agents > 0) {
        let agents: Vec<String> = (1..=cluster.agents).map(agent_name).collect();
        net.set_up(&agents)
            .context("setting up the hosts' network (bridge, namespaces, routes)")?;
        println!(
            "hosts' network: bridge {} at {}/24, nodes {}..{}, pods in 10.{}.<node>.0/24",
            net.bridge,
            net.host_ip(),
            net.node_ip(1),
            net.node_ip(cluster.agents),
            net.octet
        );
    }
    let mut started = Vec::new();
    for m in &cluster.members {
        match running_pid(&args.dir, &m.name) {
            Some(pid) if changed && !fresh => println!(
                "{} is already running (pid {pid}); it takes the new snapshot settings when restarted",
                m.name
            ),
            Some(pid) => println!("{} is already running (pid {pid})", m.name),
            None => {
                let pid = spawn_member(&args.dir, &cluster, m, &[])?;
                println!(
                    "started {} (pid {pid}): etcd https://{}, kubernetes https://{}, log {}",
                    m.name,
                    m.client,
                    m.api_addr(),
                    args.dir.join(format!("{}.log", m.name)).display()
                );
                started.push((m.name.clone(), pid));
            }
        }
    }
    let target = crate::client::ClusterArgs {
        endpoints: None,
        cacert: None,
        cert: None,
        key: None,
        dir: Some(args.dir.clone()),
        insecure: false,
    }
    .resolve()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut rows = loop {
        let rows = collect(&target).await;
        // Every member started and answering, one of them the leader.
        let answered = rows
            .iter()
            .all(|r| r.role != "unreachable" && r.role != "unstarted");
        if answered && rows.iter().any(|r| r.role == "leader") {
            break rows;
        }
        // A member that exited (a port taken, a damaged data dir) will not answer: say which
        // and why now rather than after the whole minute.
        if let Some((name, how)) = started
            .iter()
            .find_map(|(name, pid)| process::ended(*pid).map(|how| (name, how)))
        {
            let log = args.dir.join(format!("{name}.log"));
            bail!(
                "{name} {how} while the cluster was starting; the end of {}:\n{}",
                log.display(),
                process::log_tail(&log, 20)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "the cluster did not elect a leader with every member answering within 60 s; \
                 see the logs in {}",
                args.dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    print_table(&rows);
    if !cluster.store_only {
        api_ready(&args.dir).await?;
    }
    if cluster.agents > 0 {
        start_agents(&args.dir, &cluster).await?;
    }
    println!(
        "\nsource {}/env to use kubectl, etcdctl or `rkube kv` without flags",
        args.dir.display()
    );
    if args.detach {
        println!("stop it with: rkube down --dir {}", args.dir.display());
        return Ok(());
    }
    println!("Ctrl-C stops the cluster");
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = tick.tick() => {
                let now = collect(&target).await;
                if summary(&now) != summary(&rows) {
                    println!();
                    print_table(&now);
                    rows = now;
                }
            }
        }
    }
    println!("\nstopping the cluster");
    down_dir(&args.dir, &cluster).await
}

fn summary(rows: &[crate::status::Row]) -> Vec<(String, String, u64)> {
    rows.iter()
        .map(|r| (r.name.clone(), r.role.clone(), r.term))
        .collect()
}

/// Waits until the Kubernetes API answers and the leader has made the system namespaces, so
/// that what a user runs next (`kubectl`, `rkube token create`) finds them.
async fn api_ready(dir: &Path) -> Result<()> {
    let args = crate::token::TokenArgs {
        kubeconfig: Some(dir.join(KUBECONFIG_FILE)),
        dir: Some(dir.to_path_buf()),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let attempt = async {
            let (client, _) = crate::token::admin_client(&args).await?;
            let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
                kube::Api::all(client);
            namespaces.get("kube-system").await?;
            anyhow::Ok(())
        };
        match attempt.await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(e.context("the Kubernetes API was not ready within 60 s"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
