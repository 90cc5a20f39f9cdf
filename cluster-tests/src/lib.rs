//! The harness for multi-process cluster tests: starts real `rkube` server processes on
//! loopback (through `rkube up`, the way a user would), and can kill, stop, restart and add
//! members, and talk to each member with the etcd v3 API over mutual TLS.
//!
//! Every process a test starts is killed when its [`Cluster`] is dropped, even on panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rkube_store::proto::etcdserverpb as pb;
use rkube_store::server::snapshot_schedule::{self, SnapshotName};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

pub mod chaos;
pub mod etcdctl;
pub mod kubectl;
pub mod powerfs;
mod process;
pub mod pty;

pub use etcdctl::{Etcdctl, EtcdctlChild, EtcdctlOutput};
pub use pb::cluster_client::ClusterClient;
pub use pb::kv_client::KvClient;
pub use pb::lease_client::LeaseClient;
pub use pb::maintenance_client::MaintenanceClient;
pub use pb::watch_client::WatchClient;

/// Whether the member that answered this status says it is the leader.
pub fn claims_leadership(s: &pb::StatusResponse) -> bool {
    s.leader != 0 && s.header.as_ref().is_some_and(|h| h.member_id == s.leader)
}

/// The rkube binary, built once per test process.
pub fn rkube_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("RKUBE_BIN") {
            return PathBuf::from(p);
        }
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root")
            .to_path_buf();
        let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        build
            .args(["build", "-p", "rkube", "--bin", "rkube"])
            .current_dir(&workspace);
        // Cargo sets these for this test crate. Build scripts (ring's) watch some of them, so
        // passing them on would make this build and the next plain `cargo build` or
        // `cargo test` rebuild each other's dependencies every time.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("CARGO_PKG_")
                || name.starts_with("CARGO_MANIFEST_")
                || matches!(
                    name.as_ref(),
                    "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                        | "CARGO_RUSTC_CURRENT_DIR"
                )
            {
                build.env_remove(name.as_ref());
            }
        }
        let status = build.status().expect("cargo build of rkube runs");
        assert!(status.success(), "building the rkube binary failed");
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| workspace.join("target"));
        target.join("debug").join("rkube")
    })
}

/// Waits until `cond` returns `Some`, checking every 50 ms, for at most `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = cond().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub servers: usize,
    pub snapshot_count: u64,
    pub snapshot_catchup_entries: u64,
    pub election_timeout_ms: u64,
    /// Start every member from this snapshot file (`rkube up --restore`).
    pub restore: Option<PathBuf>,
    /// More `rkube up` flags, passed through to every server.
    pub up_args: Vec<String>,
    /// Serve the Kubernetes API too; store scenarios run the store alone (`--store-only`), so
    /// that the API's own objects do not show up in their keys and revisions.
    pub kubernetes_api: bool,
    /// Node agents `rkube up` starts (simulated runtime unless up_args has --runtime cri); 0
    /// for tests that make their own nodes.
    pub agents: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            servers: 3,
            snapshot_count: 10_000,
            snapshot_catchup_entries: 5_000,
            election_timeout_ms: 1000,
            restore: None,
            up_args: Vec::new(),
            kubernetes_api: false,
            agents: 0,
        }
    }
}

#[derive(Debug, Clone)]
pub struct MemberInfo {
    pub name: String,
    pub client: String,
    pub peer: String,
    pub metrics: String,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub members: Vec<MemberInfo>,
    token: String,
    tls: ClientTlsConfig,
    opts: Options,
    /// Members started by the harness itself (not through `up`), with their pids.
    extra: Vec<(String, u32)>,
    /// Released after the processes are gone (fields drop after `Drop::drop`).
    _turn: Turn,
}

/// One test's clusters run at a time: their failovers hinge on election timeouts, and two
/// tests' clusters on two cores starve each other into spurious elections. A test may hold
/// several clusters (a restore into a new one): turns are per test thread, and a turn is `Send`
/// so a cluster shared with spawned tasks may be dropped anywhere.
struct Turn;

struct TurnState {
    owner: Option<String>,
    held: usize,
}

static TURNS: std::sync::Mutex<TurnState> = std::sync::Mutex::new(TurnState {
    owner: None,
    held: 0,
});
static TURN_FREE: std::sync::Condvar = std::sync::Condvar::new();

impl Turn {
    fn take() -> Self {
        let me = std::thread::current()
            .name()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{:?}", std::thread::current().id()));
        let mut state = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        while state.held > 0 && state.owner.as_deref() != Some(me.as_str()) {
            state = TURN_FREE.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.owner = Some(me);
        state.held += 1;
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut state = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        state.held -= 1;
        if state.held == 0 {
            state.owner = None;
            TURN_FREE.notify_all();
        }
    }
}

/// The machine to this test alone, for tests whose servers are not started through this crate
/// (the compose deployment's containers): the turn ends when the guard is dropped.
pub fn machine_turn() -> impl Drop + Send {
    Turn::take()
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A test's own processes (not started through `rkube up`): its turn on the machine and a
/// base port with room for `n` members (+10 each, 4 ports each). The turn ends when the guard
/// is dropped.
pub fn exclusive_ports(n: usize) -> (impl Drop + Send, u16) {
    let turn = Turn::take();
    (turn, free_base(n))
}

/// A base port with room for `n` members (+10 each, 7 ports each: a member's four, its DNS
/// port and, after the first member's, the control-plane endpoint's two) plus one spare member.
///
/// The ports lie below the kernel's ephemeral range, so that no outgoing connection of this
/// machine (the members' own peer connections, kubectl's) can take one between this check and
/// the member's bind and leave that member unable to listen.
fn free_base(n: usize) -> u16 {
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let first = 10_000u16;
    let span = (n as u16 + 1) * 10;
    let bases = ephemeral_start.saturating_sub(first + span) / 10;
    assert!(
        bases > 0,
        "no ports below the ephemeral range ({ephemeral_start}) for {n} members"
    );
    for _ in 0..200 {
        let base = first + (rand::random::<u16>() % bases) * 10;
        if (0..=n).all(|i| (0..7).all(|p| port_free(base + (i * 10) as u16 + p))) {
            return base;
        }
    }
    panic!("no free loopback ports found");
}

impl Cluster {
    pub async fn start(opts: Options) -> Result<Self> {
        let turn = Turn::take();
        let dir = tempfile::tempdir()?;
        let base = free_base(opts.servers);
        let mut up = Command::new(rkube_bin());
        up.arg("up");
        if let Some(file) = &opts.restore {
            up.arg("--restore").arg(file);
        }
        let out = up
            .arg("--dir")
            .arg(dir.path())
            .args([
                "--servers",
                &opts.servers.to_string(),
                "--base-port",
                &base.to_string(),
                "--detach",
            ])
            .args(["--snapshot-count", &opts.snapshot_count.to_string()])
            .args([
                "--snapshot-catchup-entries",
                &opts.snapshot_catchup_entries.to_string(),
            ])
            .args([
                "--election-timeout",
                &opts.election_timeout_ms.to_string(),
                "--heartbeat-interval",
                "100",
            ])
            .args(["--agents", &opts.agents.to_string()])
            // Simulated agents unless the test asks for containerd hosts.
            .args(
                (opts.agents > 0 && !opts.up_args.iter().any(|a| a.starts_with("--runtime")))
                    .then_some(["--runtime", "sim"])
                    .into_iter()
                    .flatten(),
            )
            .args(&opts.up_args)
            .args((!opts.kubernetes_api).then_some("--store-only"))
            .stdin(Stdio::null())
            .output()?;
        let layout: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join("cluster.json")).unwrap_or_default(),
        )
        .unwrap_or(serde_json::Value::Null);
        let members = layout["members"]
            .as_array()
            .map(|ms| {
                ms.iter()
                    .map(|m| MemberInfo {
                        name: m["name"].as_str().unwrap_or_default().to_string(),
                        client: m["client"].as_str().unwrap_or_default().to_string(),
                        peer: m["peer"].as_str().unwrap_or_default().to_string(),
                        metrics: m["metrics"].as_str().unwrap_or_default().to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let token = layout["token"].as_str().unwrap_or_default().to_string();
        let pki = dir.path().join("pki");
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(
                std::fs::read(pki.join("ca.crt")).unwrap_or_default(),
            ))
            .identity(Identity::from_pem(
                std::fs::read(pki.join("admin.crt")).unwrap_or_default(),
                std::fs::read(pki.join("admin.key")).unwrap_or_default(),
            ));
        let cluster = Self {
            dir,
            members,
            token,
            tls,
            opts,
            extra: Vec::new(),
            _turn: turn,
        };
        if !out.status.success() {
            bail!(
                "rkube up failed: {}{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                cluster.logs()
            );
        }
        Ok(cluster)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Every member's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for m in &self.members {
            let log = std::fs::read_to_string(self.path().join(format!("{}.log", m.name)))
                .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            out.push_str(&format!(
                "--- {} ---\n{}\n",
                m.name,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        out
    }

    pub fn pid(&self, i: usize) -> Option<i32> {
        let name = &self.members[i].name;
        if let Some((_, pid)) = self.extra.iter().find(|(n, _)| n == name) {
            return Some(*pid as i32);
        }
        std::fs::read_to_string(self.path().join(format!("{name}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Whether process `pid` was started for this cluster: its command line names the cluster's
    /// directory. A pid file outlives its process, and this machine's pid space is small
    /// (`kernel.pid_max` may be 32768), so a stale pid can belong to another test's process
    /// by the time it is signalled (another cluster's member, killed as it started).
    fn started_here(&self, pid: i32) -> bool {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let dir = self.path();
        let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        [dir.to_path_buf(), canonical].iter().any(|d| {
            let d = d.as_os_str().as_encoded_bytes();
            !d.is_empty() && cmdline.windows(d.len()).any(|w| w == d)
        })
    }

    /// Sends `sig` to process `pid` if it was started for this cluster.
    fn signal_pid(&self, pid: i32, sig: i32) -> bool {
        self.started_here(pid) && unsafe { libc::kill(pid, sig) } == 0
    }

    fn signal(&self, i: usize, sig: i32) {
        if let Some(pid) = self.pid(i) {
            self.signal_pid(pid, sig);
        }
    }

    /// SIGKILL a member and wait until its process is gone.
    pub async fn kill(&self, i: usize) {
        let Some(pid) = self.pid(i) else {
            return;
        };
        // A process whose command line is empty is exiting (or a zombie): it is waited for
        // below like a killed one. One with another command line is not ours any more.
        let reused = |pid: i32| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            !cmdline.is_empty() && !self.started_here(pid)
        };
        if reused(pid) {
            return;
        }
        unsafe { libc::kill(pid, libc::SIGKILL) };
        {
            wait_for(
                "killed process to exit",
                Duration::from_secs(10),
                || async move {
                    let mut status = 0;
                    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                    // Gone, or a zombie: an empty cmdline comes earlier in exit and is not enough.
                    let stat =
                        std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                    let state = stat
                        .rsplit(')')
                        .next()
                        .and_then(|rest| rest.split_whitespace().next())
                        .unwrap_or("");
                    // A zombie main thread may still have sibling threads exiting (an fsync in
                    // flight) that share its open files: only when they are gone too is the
                    // data dir lock free.
                    let threads =
                        std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
                    let gone = stat.is_empty()
                        || ((state == "Z" || state == "X") && threads <= 1)
                        || reused(pid);
                    gone.then_some(())
                },
            )
            .await;
        }
    }

    pub fn pause(&self, i: usize) {
        self.signal(i, libc::SIGSTOP);
    }

    pub fn resume(&self, i: usize) {
        self.signal(i, libc::SIGCONT);
    }

    /// Starts every member of the `up` layout that is not running, with its data (`rkube up`
    /// on an existing DIR).
    pub async fn restart_missing(&self) -> Result<()> {
        self.restart_missing_with(&[]).await
    }

    /// [`Cluster::restart_missing`] with more `rkube up` flags.
    pub async fn restart_missing_with(&self, args: &[&str]) -> Result<()> {
        let out = Command::new(rkube_bin())
            .arg("up")
            .arg("--dir")
            .arg(self.path())
            .arg("--detach")
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!(
                "rkube up (restart) failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Starts one more server process that joins as `existing` (after `member add`).
    pub fn spawn_joiner(&mut self, name: &str) -> Result<usize> {
        let i = self.members.len();
        let last = &self.members[i - 1];
        let port = |addr: &str| {
            addr.rsplit(':')
                .next()
                .and_then(|p| p.parse::<u16>().ok())
                .unwrap_or(0)
        };
        let base = port(&last.client) + 10;
        let m = MemberInfo {
            name: name.to_string(),
            client: format!("127.0.0.1:{base}"),
            peer: format!("127.0.0.1:{}", base + 1),
            metrics: format!("127.0.0.1:{}", base + 2),
        };
        let pki = self.path().join("pki");
        rkube_pki::issue(
            &pki,
            name,
            name,
            None,
            &["127.0.0.1".into(), "localhost".into()],
            true,
            true,
        )?;
        self.members.push(m);
        let all: Vec<usize> = (0..=i).collect();
        self.spawn_server(i, &all, "existing", &[])?;
        Ok(i)
    }

    /// Starts the server process of member `i` by hand (not through `up`), with
    /// `--initial-cluster` naming the members `initial`, and more flags.
    pub fn spawn_server(
        &mut self,
        i: usize,
        initial: &[usize],
        state: &str,
        extra: &[&str],
    ) -> Result<()> {
        self.spawn_server_with_env(i, initial, state, extra, &[])
    }

    /// [`Cluster::spawn_server`] with more environment for the process (`RKUBE_FAILPOINTS`).
    pub fn spawn_server_with_env(
        &mut self,
        i: usize,
        initial: &[usize],
        state: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<()> {
        let m = self.members[i].clone();
        let name = m.name.as_str();
        let initial: Vec<String> = initial
            .iter()
            .map(|&j| format!("{}={}", self.members[j].name, self.members[j].peer))
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path().join(format!("{name}.log")))?;
        let child = Command::new(rkube_bin())
            .arg("server")
            .args(["--name", name])
            .arg("--data-dir")
            .arg(self.path().join(name))
            .args([
                "--listen-peer",
                &m.peer,
                "--listen-client",
                &m.client,
                "--listen-metrics",
                &m.metrics,
            ])
            .args([
                "--initial-cluster",
                &initial.join(","),
                "--initial-cluster-state",
                state,
            ])
            .args(["--initial-cluster-token", &self.token])
            .arg("--pki")
            .arg(self.path().join("pki"))
            .args(["--snapshot-count", &self.opts.snapshot_count.to_string()])
            .args([
                "--snapshot-catchup-entries",
                &self.opts.snapshot_catchup_entries.to_string(),
            ])
            .args([
                "--election-timeout",
                &self.opts.election_timeout_ms.to_string(),
                "--heartbeat-interval",
                "100",
            ])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.extra.retain(|(n, _)| n != name);
        self.extra.push((name.to_string(), child.id()));
        Ok(())
    }

    pub fn channel(&self, i: usize) -> Channel {
        Endpoint::from_shared(format!("https://{}", self.members[i].client))
            .expect("endpoint")
            .tls_config(self.tls.clone())
            .expect("tls")
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(8))
            .connect_lazy()
    }

    pub fn kv(&self, i: usize) -> KvClient<Channel> {
        KvClient::new(self.channel(i))
    }

    pub async fn status(&self, i: usize) -> Option<pb::StatusResponse> {
        let mut m = MaintenanceClient::new(self.channel(i));
        let mut req = tonic::Request::new(pb::StatusRequest {});
        req.set_timeout(Duration::from_secs(2));
        // A bound of our own: a paused member accepts TCP but never finishes the TLS handshake,
        // and tonic's timeouts do not cover connection setup.
        tokio::time::timeout(Duration::from_secs(3), m.status(req))
            .await
            .ok()?
            .ok()
            .map(|r| r.into_inner())
    }

    /// Index of the member that is leader and that the others agree on, if any.
    pub async fn leader(&self) -> Option<usize> {
        for i in 0..self.members.len() {
            if self.status(i).await.is_some_and(|s| claims_leadership(&s)) {
                return Some(i);
            }
        }
        None
    }

    pub async fn wait_leader(&self) -> usize {
        wait_for("a leader", Duration::from_secs(30), || self.leader()).await
    }

    /// Waits until a new leader other than `old` is elected.
    pub async fn wait_new_leader(&self, old: usize) -> usize {
        wait_for("a new leader", Duration::from_secs(30), || async {
            self.leader().await.filter(|l| *l != old)
        })
        .await
    }

    /// Puts a key; returns the revision it was written at.
    pub async fn put(&self, i: usize, key: &str, value: &str) -> Result<i64, tonic::Status> {
        let mut kv = self.kv(i);
        let call = kv.put(pb::PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        });
        let resp = tokio::time::timeout(Duration::from_secs(15), call)
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no answer within 15 s"))??
            .into_inner();
        Ok(resp.header.map_or(0, |h| h.revision))
    }

    /// Every key with `prefix` on member `i`, read locally (serializable) so each member's own
    /// state is checked.
    pub async fn local_keys(
        &self,
        i: usize,
        prefix: &str,
    ) -> Result<Vec<(String, String)>, tonic::Status> {
        let mut kv = self.kv(i);
        let call = kv.range(pb::RangeRequest {
            key: prefix.into(),
            range_end: rkube_store::mvcc::prefix_end(prefix.as_bytes()),
            serializable: true,
            ..Default::default()
        });
        let resp = tokio::time::timeout(Duration::from_secs(15), call)
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no answer within 15 s"))??
            .into_inner();
        Ok(resp
            .kvs
            .into_iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key).into_owned(),
                    String::from_utf8_lossy(&kv.value).into_owned(),
                )
            })
            .collect())
    }

    /// Waits until the listed members report the same revision, then returns it.
    pub async fn wait_converged(&self, members: &[usize]) -> i64 {
        wait_for(
            "members to converge on one revision",
            Duration::from_secs(60),
            || async {
                let mut revs = Vec::new();
                for &i in members {
                    revs.push(self.status(i).await?.header?.revision);
                }
                (revs.windows(2).all(|w| w[0] == w[1])).then(|| revs[0])
            },
        )
        .await
    }

    pub async fn hash_kv(&self, i: usize, revision: i64) -> Option<u32> {
        let mut m = MaintenanceClient::new(self.channel(i));
        let call = m.hash_kv(pb::HashKvRequest { revision });
        tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .ok()?
            .ok()
            .map(|r| r.into_inner().hash)
    }

    /// The body of a GET of `path` on member `i`'s metrics address, if it answered 200 within
    /// 30 s.
    pub async fn get_metrics_path(&self, i: usize, path: &str) -> Option<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let get = async {
            let mut s = tokio::net::TcpStream::connect(&self.members[i].metrics)
                .await
                .ok()?;
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .ok()?;
            let mut response = String::new();
            s.read_to_string(&mut response).await.ok()?;
            Some(response)
        };
        let response = tokio::time::timeout(Duration::from_secs(30), get)
            .await
            .ok()??;
        let (head, body) = response.split_once("\r\n\r\n")?;
        (head.split_whitespace().nth(1) == Some("200")).then(|| body.to_string())
    }

    /// A metric value from a member's /metrics, if present.
    pub async fn metric(&self, i: usize, name: &str) -> Option<f64> {
        let body = self.get_metrics_path(i, "/metrics").await?;
        body.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|rest| rest.trim().parse().ok())
        })
    }

    /// The kinds of the events in member `i`'s history (its `/status.json`), oldest first.
    pub async fn event_kinds(&self, i: usize) -> Option<Vec<String>> {
        let body = self.get_metrics_path(i, "/status.json").await?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        let events = status["events"].as_array()?;
        Some(
            events
                .iter()
                .filter_map(|e| e["kind"].as_str().map(str::to_string))
                .collect(),
        )
    }

    /// Member `i`'s scheduled snapshot dir (the default, DATA_DIR/snapshots).
    pub fn snapshot_dir(&self, i: usize) -> PathBuf {
        self.path().join(&self.members[i].name).join("snapshots")
    }

    /// The scheduled snapshots in member `i`'s snapshot dir, newest first (none if it has no dir).
    pub fn scheduled_snapshots(&self, i: usize) -> Vec<SnapshotName> {
        snapshot_schedule::scheduled_in(&self.snapshot_dir(i)).unwrap_or_default()
    }

    pub fn id_of(&self, i: usize) -> u64 {
        let json = std::fs::read(self.path().join(&self.members[i].name).join("member.json"))
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap_or(serde_json::Value::Null);
        v["member_id"].as_u64().unwrap_or(0)
    }
}

impl Cluster {
    /// The agents `rkube up` started (`agent1`...), by the layout.
    pub fn agent_names(&self) -> Vec<String> {
        let layout: serde_json::Value = serde_json::from_slice(
            &std::fs::read(self.path().join("cluster.json")).unwrap_or_default(),
        )
        .unwrap_or_default();
        (1..=layout["agents"].as_u64().unwrap_or(0))
            .map(|i| format!("agent{i}"))
            .collect()
    }

    pub fn agent_pid(&self, name: &str) -> Option<i32> {
        std::fs::read_to_string(self.path().join(format!("{name}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// SIGKILL an agent and wait until it is gone.
    pub async fn kill_agent(&self, name: &str) {
        let Some(pid) = self.agent_pid(name) else {
            return;
        };
        if !self.signal_pid(pid, libc::SIGKILL) {
            let _ = std::fs::remove_file(self.path().join(format!("{name}.pid")));
            return;
        }
        wait_for(
            "the killed agent to exit",
            Duration::from_secs(10),
            || async move {
                let mut status = 0;
                let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                (r == pid || unsafe { libc::kill(pid, 0) } != 0).then_some(())
            },
        )
        .await;
        let _ = std::fs::remove_file(self.path().join(format!("{name}.pid")));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A failing test shows what its members (and agents) said last.
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
            for a in self.agent_names() {
                let log = std::fs::read_to_string(self.path().join(format!("{a}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                eprintln!(
                    "--- {a} ---\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
        }
        // Containerd hosts: `rkube down` stops their pods and containerds and removes the
        // namespaces, bridge and routes `up` made.
        let layout: serde_json::Value = serde_json::from_slice(
            &std::fs::read(self.path().join("cluster.json")).unwrap_or_default(),
        )
        .unwrap_or_default();
        if !layout["network"].is_null() {
            let _ = Command::new(crate::rkube_bin())
                .arg("down")
                .arg("--dir")
                .arg(self.path())
                .stdout(Stdio::null())
                .status();
        }
        for a in self.agent_names() {
            if let Some(pid) = self.agent_pid(&a) {
                if self.signal_pid(pid, libc::SIGKILL) {
                    let mut status = 0;
                    unsafe { libc::waitpid(pid, &mut status, 0) };
                }
            }
        }
        for i in 0..self.members.len() {
            self.signal(i, libc::SIGCONT);
            self.signal(i, libc::SIGKILL);
        }
        for i in 0..self.members.len() {
            if let Some(pid) = self.pid(i) {
                let mut status = 0;
                unsafe { libc::waitpid(pid, &mut status, 0) };
            }
        }
    }
}

/// Context for errors that carry a cluster's logs.
pub trait WithLogs<T> {
    fn logs(self, c: &Cluster) -> Result<T>;
}

impl<T, E: std::fmt::Display> WithLogs<T> for std::result::Result<T, E> {
    fn logs(self, c: &Cluster) -> Result<T> {
        self.map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| c.logs())
    }
}

/// `GET /` over HTTP/1.0 from the test to `addr` (`host:port` of a pod, node port or address
/// the test itself made): the whole response, or None when nothing answered within 3 s.
pub async fn http_get(addr: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(3), s.read_to_string(&mut body))
        .await
        .ok()?
        .ok()?;
    Some(body)
}

/// Builds the locally made images into `dir` (`busybox.tar`: rkube.local/busybox:1,
/// `pause.tar`: rkube.local/pause:1) with images/build-busybox.sh.
pub fn build_images(dir: &Path) {
    let built = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("images/build-busybox.sh"))
        .arg(dir)
        .output()
        .expect("images/build-busybox.sh runs");
    assert!(
        built.status.success(),
        "building the test images: {}",
        String::from_utf8_lossy(&built.stderr)
    );
}
