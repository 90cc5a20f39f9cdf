//! `rkube up` and `rkube down`: a local HA cluster on loopback, one process per server.
//!
//! DIR holds `cluster.json` (the layout, so that `up` on an existing DIR restarts the same
//! members), `pki/` (CA, member and admin certificates), `<name>/` (data dirs), `<name>.pid`,
//! `<name>.log` and `env` (export lines for etcdctl and rkube's own clients). Scheduled snapshots
//! go to `<name>/snapshots/` (or `SNAPSHOT_DIR/<name>/` with `--snapshot-dir`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::status::{collect, print_table};
use rkube_store::server::snapshot_schedule::DEFAULT_RETAIN;

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
    /// Raft snapshot after this many applied entries (passed to every server).
    #[arg(long, default_value_t = 10_000)]
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

/// etcd's default space quota.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 * 1024 * 1024 * 1024;

fn default_quota() -> u64 {
    DEFAULT_QUOTA_BYTES
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalCluster {
    pub token: String,
    pub members: Vec<LocalMember>,
    pub snapshot_count: u64,
    pub snapshot_catchup_entries: u64,
    pub heartbeat_interval: u64,
    pub election_timeout: u64,
    #[serde(default = "default_quota")]
    pub quota_backend_bytes: u64,
    /// Scheduled snapshots, 0: none. (Absent in layouts written before they existed.)
    #[serde(default)]
    pub snapshot_interval_ms: u64,
    #[serde(default = "default_retain")]
    pub snapshot_retain: usize,
    /// Scheduled snapshots are zipped.
    #[serde(default)]
    pub snapshot_compress: bool,
    /// Absolute; each member writes to its own subdirectory.
    #[serde(default)]
    pub snapshot_dir: Option<PathBuf>,
    /// Members serve only the store, no Kubernetes API.
    #[serde(default)]
    pub store_only: bool,
    /// Controller settings given to `up` (`--node-monitor-grace-period 3s`...), passed to
    /// every server.
    #[serde(default)]
    pub controller_flags: Vec<String>,
    /// Node agents (`agent1`, `agent2`...), started after the servers.
    #[serde(default)]
    pub agents: usize,
    /// `--unsafe-no-fsync` for every server.
    #[serde(default)]
    pub unsafe_no_fsync: bool,
    #[serde(default)]
    pub agent_flags: Vec<String>,
    /// The agents run containers through containerd, each a host on this network (absent: the
    /// simulated runtime).
    #[serde(default)]
    pub network: Option<crate::hosts::HostNetwork>,
    /// The control-plane endpoint, held by the leader (absent in DIRs made before it existed).
    #[serde(default)]
    pub endpoint: Option<LocalEndpoint>,
}

/// Where the leader serves the etcd API and (unless store-only) the Kubernetes API, besides
/// its own ports: one address for the kubeconfig, DIR/env and the agents that survives the
/// loss of any member while a quorum stays (`rkube server --vip-client/--vip-api`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalEndpoint {
    pub client: String,
    #[serde(default)]
    pub api: Option<String>,
}

fn default_retain() -> usize {
    DEFAULT_RETAIN
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalMember {
    pub name: String,
    pub client: String,
    pub peer: String,
    pub metrics: String,
    /// The Kubernetes API (HTTPS). Absent in DIRs made before the API existed: the port after
    /// the metrics one.
    #[serde(default)]
    pub api: String,
}

impl LocalMember {
    /// Where the member serves cluster DNS (with containerd hosts): the port after the API's.
    pub fn dns_addr(&self) -> String {
        let api = self.api_addr();
        match api.rsplit_once(':') {
            Some((host, port)) => format!(
                "{host}:{}",
                port.parse::<u16>().unwrap_or(0).saturating_add(1)
            ),
            None => api,
        }
    }

    pub fn api_addr(&self) -> String {
        if !self.api.is_empty() {
            return self.api.clone();
        }
        match self.metrics.rsplit_once(':') {
            Some((host, port)) => format!(
                "{host}:{}",
                port.parse::<u16>().unwrap_or(0).saturating_add(1)
            ),
            None => self.metrics.clone(),
        }
    }
}

impl LocalCluster {
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("cluster.json");
        let bytes = std::fs::read(&path).with_context(|| {
            format!(
                "{} is not a local cluster (no {}); start one with `rkube up --dir {}`",
                dir.display(),
                path.display(),
                dir.display()
            )
        })?;
        serde_json::from_slice(&bytes).with_context(|| format!("cannot parse {}", path.display()))
    }

    pub fn client_urls(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("https://{}", m.client))
            .collect()
    }

    /// Where member `name` writes its scheduled snapshots; `dir` is the cluster's DIR.
    pub fn snapshot_dir(&self, dir: &Path, name: &str) -> PathBuf {
        match &self.snapshot_dir {
            Some(d) => d.join(name),
            None => dir.join(name).join("snapshots"),
        }
    }

    /// Applies the snapshot and controller flags given to `up`; true when the layout changed.
    fn apply_snapshot_flags(&mut self, args: &UpArgs) -> Result<bool> {
        let flags_before = self.controller_flags.clone();
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        for (flag, value) in [
            ("--node-monitor-period", args.node_monitor_period.map(ms)),
            (
                "--node-monitor-grace-period",
                args.node_monitor_grace_period.map(ms),
            ),
            (
                "--node-eviction-rate",
                args.node_eviction_rate.map(|r| r.to_string()),
            ),
            ("--compaction-interval", args.compaction_interval.map(ms)),
        ] {
            let Some(value) = value else { continue };
            if let Some(i) = self.controller_flags.iter().position(|f| f == flag) {
                self.controller_flags
                    .drain(i..(i + 2).min(self.controller_flags.len()));
            }
            self.controller_flags.push(flag.to_string());
            self.controller_flags.push(value);
        }
        let flags_changed = flags_before != self.controller_flags;
        let before = (
            self.snapshot_interval_ms,
            self.snapshot_retain,
            self.snapshot_dir.clone(),
            self.snapshot_compress,
        );
        self.snapshot_compress |= args.snapshot_compress;
        if let Some(interval) = args.snapshot_interval {
            self.snapshot_interval_ms = interval.as_millis() as u64;
        }
        if let Some(retain) = args.snapshot_retain {
            self.snapshot_retain = retain;
        }
        if let Some(dir) = &args.snapshot_dir {
            self.snapshot_dir = Some(
                std::path::absolute(dir)
                    .with_context(|| format!("cannot resolve --snapshot-dir {}", dir.display()))?,
            );
        }
        Ok(flags_changed
            || before
                != (
                    self.snapshot_interval_ms,
                    self.snapshot_retain,
                    self.snapshot_dir.clone(),
                    self.snapshot_compress,
                ))
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn pid_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.pid"))
}

/// The pid of a member's running process, if it still runs.
pub fn running_pid(dir: &Path, name: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pid_path(dir, name))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // Signal 0 checks existence; the command line check guards against a reused pid.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    let ours = cmdline.contains(&format!("{name}\0")) || cmdline.contains(&format!("/{name}/"));
    (alive && ours).then_some(pid)
}

/// The agents' runtime for a new DIR: the containerd hosts' network, or None (simulated).
fn choose_runtime(args: &UpArgs) -> Result<Option<crate::hosts::HostNetwork>> {
    if args.store_only || args.agents == 0 || args.runtime.as_deref() == Some("sim") {
        return Ok(None);
    }
    match crate::hosts::cri_unavailable() {
        Some(why) => {
            println!("the agents use the simulated runtime (sim): the containerd runtime (cri) cannot run here, {why}");
            Ok(None)
        }
        None => Ok(Some(crate::hosts::HostNetwork::choose()?)),
    }
}

fn create(args: &UpArgs) -> Result<LocalCluster> {
    if args.servers == 0 {
        bail!("--servers must be at least 1");
    }
    let network = choose_runtime(args)?;
    // With containerd hosts, the API listens on the bridge's address, which both this machine
    // and the agents' namespaces reach.
    let api_host = network
        .as_ref()
        .map(|n| n.host_ip())
        .unwrap_or_else(|| "127.0.0.1".into());
    let members = (1..=args.servers)
        .map(|i| {
            let base = args.base_port as usize + 10 * (i - 1);
            if base + 3 > u16::MAX as usize {
                bail!(
                    "--base-port {} leaves no room for {} servers",
                    args.base_port,
                    args.servers
                );
            }
            Ok(LocalMember {
                name: format!("n{i}"),
                client: format!("127.0.0.1:{base}"),
                peer: format!("127.0.0.1:{}", base + 1),
                metrics: format!("127.0.0.1:{}", base + 2),
                api: format!("{api_host}:{}", base + 3),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // The endpoint takes the two ports after the first server's DNS port, on the API's host.
    let endpoint = LocalEndpoint {
        client: format!("{api_host}:{}", args.base_port as usize + 5),
        api: (!args.store_only).then(|| format!("{api_host}:{}", args.base_port as usize + 6)),
    };
    Ok(LocalCluster {
        token: format!("rkube-{:016x}", rand::random::<u64>()),
        members,
        endpoint: Some(endpoint),
        snapshot_count: args.snapshot_count,
        snapshot_catchup_entries: args.snapshot_catchup_entries,
        heartbeat_interval: args.heartbeat_interval,
        election_timeout: args.election_timeout,
        quota_backend_bytes: args.quota_backend_bytes.unwrap_or(DEFAULT_QUOTA_BYTES),
        snapshot_interval_ms: 0,
        snapshot_retain: DEFAULT_RETAIN,
        snapshot_compress: false,
        snapshot_dir: None,
        store_only: args.store_only,
        controller_flags: Vec::new(),
        agents: if args.store_only { 0 } else { args.agents },
        unsafe_no_fsync: args.unsafe_no_fsync,
        agent_flags: args.agent_args.clone(),
        network,
    })
}

fn write_pki(dir: &Path, cluster: &LocalCluster) -> Result<()> {
    use rkube_pki as pki;
    let pki_dir = dir.join("pki");
    pki::init_ca(&pki_dir)?;
    pki::init_service_account_key(&pki_dir)?;
    let mut sans = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    if let Some(net) = &cluster.network {
        sans.push(net.host_ip());
    }
    for m in &cluster.members {
        let mut sans = sans.clone();
        sans.push(m.name.clone());
        pki::issue(&pki_dir, &m.name, &m.name, None, &sans, true, true)?;
    }
    pki::issue(
        &pki_dir,
        "admin",
        "kubernetes-admin",
        Some("system:masters"),
        &[],
        false,
        true,
    )?;
    pki::issue_kubelet_client(&pki_dir)?;
    Ok(())
}

fn write_env(dir: &Path, cluster: &LocalCluster) -> Result<()> {
    let abs = std::fs::canonicalize(dir)?;
    let pki = abs.join("pki");
    let mut env = format!(
        "export ETCDCTL_API=3\nexport ETCDCTL_ENDPOINTS={}\nexport ETCDCTL_CACERT={}\nexport ETCDCTL_CERT={}\nexport ETCDCTL_KEY={}\n",
        match &cluster.endpoint {
            Some(e) => format!("https://{}", e.client),
            None => cluster.client_urls().join(","),
        },
        pki.join("ca.crt").display(),
        pki.join("admin.crt").display(),
        pki.join("admin.key").display(),
    );
    if !cluster.store_only {
        env.push_str(&format!(
            "export KUBECONFIG={}\n",
            abs.join(KUBECONFIG_FILE).display()
        ));
    }
    std::fs::write(dir.join("env"), env)?;
    Ok(())
}

pub const KUBECONFIG_FILE: &str = "admin.kubeconfig";

/// DIR/admin.kubeconfig: the admin's certificate, the control-plane endpoint's context
/// (`rkube`, current) and one context per server (`rkube-n1`...). Written once: later changes (`kubectl config set-context`) are the
/// user's.
fn write_kubeconfig(dir: &Path, cluster: &LocalCluster) -> Result<()> {
    use base64::Engine;
    let path = dir.join(KUBECONFIG_FILE);
    if path.exists() {
        return Ok(());
    }
    let b64 = |f: &str| -> Result<String> {
        let bytes =
            std::fs::read(dir.join("pki").join(f)).with_context(|| format!("reading pki/{f}"))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    let (ca, cert, key) = (b64("ca.crt")?, b64("admin.crt")?, b64("admin.key")?);
    let mut clusters = String::new();
    let mut contexts = String::new();
    let endpoint = cluster.endpoint.as_ref().and_then(|e| e.api.as_deref());
    if let Some(api) = endpoint {
        clusters.push_str(&format!(
            "- name: rkube\n  cluster:\n    server: https://{api}\n    certificate-authority-data: {ca}\n"
        ));
        contexts.push_str(
            "- name: rkube\n  context:\n    cluster: rkube\n    user: kubernetes-admin\n",
        );
    }
    for m in &cluster.members {
        clusters.push_str(&format!(
            "- name: rkube-{name}\n  cluster:\n    server: https://{addr}\n    certificate-authority-data: {ca}\n",
            name = m.name,
            addr = m.api_addr(),
        ));
        contexts.push_str(&format!(
            "- name: rkube-{name}\n  context:\n    cluster: rkube-{name}\n    user: kubernetes-admin\n",
            name = m.name,
        ));
    }
    let current = match endpoint {
        Some(_) => "rkube".to_string(),
        None => format!(
            "rkube-{}",
            cluster
                .members
                .first()
                .map(|m| m.name.as_str())
                .unwrap_or("n1")
        ),
    };
    let doc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n{clusters}contexts:\n{contexts}current-context: {current}\nusers:\n- name: kubernetes-admin\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\npreferences: {{}}\n"
    );
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(doc.as_bytes())?;
    Ok(())
}

/// Starts member `m` of the local cluster with its recorded flags and `extra` ones.
pub(crate) fn spawn_member(
    dir: &Path,
    cluster: &LocalCluster,
    m: &LocalMember,
    extra: &[&str],
) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("cannot find the rkube executable")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{}.log", m.name)))?;
    let abs = std::fs::canonicalize(dir)?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("server")
        .args(["--name", &m.name])
        .arg("--data-dir")
        .arg(abs.join(&m.name))
        .args([
            "--listen-peer",
            &m.peer,
            "--listen-client",
            &m.client,
            "--listen-metrics",
            &m.metrics,
        ]);
    if let Some(e) = &cluster.endpoint {
        command.args(["--vip-client", &e.client]);
        if let (Some(api), false) = (&e.api, cluster.store_only) {
            command.args(["--vip-api", api]);
        }
    }
    if !cluster.store_only {
        command.args(["--listen-api", &m.api_addr()]);
        command.args(&cluster.controller_flags);
        // Containerd hosts' pods resolve names with the servers' cluster DNS, on the port
        // after the API's.
        if let Some(net) = &cluster.network {
            command.args(["--listen-dns", &m.dns_addr()]);
            // LoadBalancer Services get addresses on the hosts' bridge network, which the
            // nodes answer for.
            command.args(["--load-balancer-ip-range", &net.load_balancer_range()]);
        }
    }
    command
        .args(["--initial-cluster", &cluster.initial_cluster()])
        .args(["--initial-cluster-token", &cluster.token])
        .arg("--pki")
        .arg(abs.join("pki"))
        .args(["--snapshot-count", &cluster.snapshot_count.to_string()])
        .args([
            "--snapshot-catchup-entries",
            &cluster.snapshot_catchup_entries.to_string(),
        ])
        .args([
            "--heartbeat-interval",
            &cluster.heartbeat_interval.to_string(),
        ])
        .args(["--election-timeout", &cluster.election_timeout.to_string()])
        .args([
            "--quota-backend-bytes",
            &cluster.quota_backend_bytes.to_string(),
        ])
        .args(cluster.unsafe_no_fsync.then_some("--unsafe-no-fsync"))
        .args(extra);
    if cluster.snapshot_interval_ms > 0 {
        command
            .args([
                "--snapshot-interval",
                &format!("{}ms", cluster.snapshot_interval_ms),
                "--snapshot-retain",
                &cluster.snapshot_retain.to_string(),
            ])
            .arg("--snapshot-dir")
            .arg(cluster.snapshot_dir(&abs, &m.name))
            .args(cluster.snapshot_compress.then_some("--snapshot-compress"));
    }
    let child = command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C in the terminal reaches `up`, which stops members in order.
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start server {}", m.name))?;
    let pid = child.id() as i32;
    std::fs::write(pid_path(dir, &m.name), pid.to_string())?;
    Ok(pid)
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
                started.push(pid);
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

#[derive(Debug, Clone, Args)]
pub struct DownArgs {
    #[arg(long, default_value = DEFAULT_DIR)]
    pub dir: PathBuf,
}

pub async fn down(args: DownArgs) -> Result<()> {
    let cluster = LocalCluster::load(&args.dir)?;
    down_dir(&args.dir, &cluster).await
}

async fn down_dir(dir: &Path, cluster: &LocalCluster) -> Result<()> {
    let agents: Vec<String> = (1..=cluster.agents).map(agent_name).collect();
    stop(dir, &agents).await;
    if let Some(net) = &cluster.network {
        // Containers stop with their node: sandboxes first (their addresses are released),
        // then each containerd and its shims, then the namespaces and the bridge.
        let abs = std::fs::canonicalize(dir)?;
        for agent in &agents {
            match net.stop_pods(&abs, agent).await {
                Ok(0) => {}
                Ok(n) => println!("stopped {n} pod(s) on {agent}"),
                Err(e) => println!("could not stop {agent}'s pods: {e:#}"),
            }
        }
        let containerds: Vec<String> = agents
            .iter()
            .map(|a| crate::hosts::HostNetwork::containerd_name(a))
            .collect();
        stop(dir, &containerds).await;
        for agent in &agents {
            net.stop_shims(&abs, agent);
        }
        for e in net.tear_down(&agents) {
            println!("cleaning up the hosts' network: {e}");
        }
    }
    let members: Vec<String> = cluster.members.iter().map(|m| m.name.clone()).collect();
    stop(dir, &members).await;
    Ok(())
}

/// SIGTERM to the named processes of DIR, SIGKILL to those still running after 10 s.
pub(crate) async fn stop(dir: &Path, names: &[String]) {
    let mut pids = Vec::new();
    for name in names {
        if let Some(pid) = running_pid(dir, name) {
            unsafe { libc::kill(pid, libc::SIGTERM) };
            pids.push((name.clone(), pid));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for (name, pid) in pids {
        while running_pid(dir, &name).is_some() && Instant::now() < deadline {
            reap(pid);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if running_pid(dir, &name).is_some() {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            reap(pid);
        }
        let _ = std::fs::remove_file(pid_path(dir, &name));
        println!("stopped {name} (pid {pid})");
    }
}

/// Agent i's HTTPS port: above the last server's ports.
fn agent_port(cluster: &LocalCluster, i: usize) -> u16 {
    let top = cluster
        .members
        .iter()
        .filter_map(|m| {
            m.api_addr()
                .rsplit(':')
                .next()
                .and_then(|p| p.parse::<u16>().ok())
        })
        .max()
        .unwrap_or(2402);
    top.saturating_add(10 + i as u16)
}

pub fn agent_name(i: usize) -> String {
    format!("agent{i}")
}

/// Starts the agents that are not running; an agent without a certificate yet joins with a
/// fresh bootstrap token (valid for an hour), as a worker on a real cluster would.
async fn start_agents(dir: &Path, cluster: &LocalCluster) -> Result<()> {
    let abs = std::fs::canonicalize(dir)?;
    // The endpoint first: the agents fall back to the members only while it is down.
    let servers: Vec<String> = cluster
        .endpoint
        .iter()
        .filter_map(|e| e.api.clone())
        .chain(cluster.members.iter().map(|m| m.api_addr()))
        .map(|a| format!("https://{a}"))
        .collect();
    let ca_hash = rkube_pki::ca_spki_sha256(&std::fs::read(abs.join("pki").join("ca.crt"))?)?;
    let mut token = None;
    for i in 1..=cluster.agents {
        let name = agent_name(i);
        if let Some(pid) = running_pid(dir, &name) {
            println!("{name} is already running (pid {pid})");
            continue;
        }
        let agent_dir = abs.join("agents").join(&name);
        if !agent_dir.join("kubelet-client-current.pem").exists() && token.is_none() {
            token = Some(join_token(dir).await?);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.log")))?;
        let exe = std::env::current_exe().context("cannot find the rkube executable")?;
        let mut netns = None;
        let (mut command, what) = match &cluster.network {
            Some(net) => {
                // The agent's own host: its namespace, its containerd, its address.
                let containerd = crate::hosts::HostNetwork::containerd_name(&name);
                if running_pid(dir, &containerd).is_none() {
                    let pid = net.start_containerd(dir, &abs, &name)?;
                    println!(
                        "started {containerd} (pid {pid}) in network namespace {}, log {}",
                        net.netns(&name),
                        dir.join(format!("{containerd}.log")).display()
                    );
                }
                let mut c = std::process::Command::new(exe);
                netns = Some(net.enter(&mut c, &name)?);
                c.arg("agent")
                    .arg("--container-runtime-endpoint")
                    .arg(net.containerd_socket(&abs, &name))
                    .arg("--cni-conf-dir")
                    .arg(net.cni_dir(&abs, &name))
                    .args(["--node-ip", &net.node_ip(i)])
                    .args(["--pod-cidr", &net.pod_cidr(i)])
                    // kube-dns: the tenth address of the default service range.
                    .args(["--cluster-dns", "10.96.0.10"]);
                let what = format!(
                    "containerd runtime, host {} in network namespace {}, pods {}",
                    net.node_ip(i),
                    net.netns(&name),
                    net.pod_cidr(i)
                );
                (c, what)
            }
            None => {
                let mut c = std::process::Command::new(exe);
                c.arg("agent")
                    .arg("--sim")
                    .args(["--pod-cidr", &format!("10.244.{i}.0/24")])
                    // All agents share 127.0.0.1: each its own port, after the servers' ports.
                    .args(["--port", &agent_port(cluster, i).to_string()]);
                (c, "simulated runtime".to_string())
            }
        };
        command
            .args(["--server", &servers.join(",")])
            .args(["--discovery-token-ca-cert-hash", &ca_hash])
            .arg("--dir")
            .arg(&agent_dir)
            .args(["--name", &name])
            .args(&cluster.agent_flags);
        if let Some(t) = &token {
            command.env("RKUBE_JOIN_TOKEN", t);
        }
        use std::os::unix::process::CommandExt;
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        drop(netns);
        let pid = child.id() as i32;
        std::fs::write(pid_path(dir, &name), pid.to_string())?;
        println!(
            "started {name} (pid {pid}, {what}), log {}",
            dir.join(format!("{name}.log")).display()
        );
    }
    Ok(())
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

/// A bootstrap token for the local agents, made through the API with the admin's kubeconfig
/// (the API answers: `up` waited for it).
async fn join_token(dir: &Path) -> Result<String> {
    let args = crate::token::TokenArgs {
        kubeconfig: Some(dir.join(KUBECONFIG_FILE)),
        dir: Some(dir.to_path_buf()),
    };
    let (client, _) = crate::token::admin_client(&args).await?;
    crate::token::create(
        client,
        None,
        Duration::from_secs(3600),
        "signing,authentication",
        "system:bootstrappers:kubeadm:default-node-token",
        "rkube up: joins the local agents",
    )
    .await
    .context("creating a bootstrap token for the agents")
}

/// Collects an exited child so it does not linger as a zombie (only our own children).
fn reap(pid: i32) {
    let mut status = 0;
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
}
