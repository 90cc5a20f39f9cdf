//! The system under test: three rkube servers, or three etcd 3.4 members for the side-by-side
//! run, each a process in its own network namespace (a host of its own), reaching the others
//! only through the fault proxies. The campaign kills (SIGKILL), pauses (SIGSTOP/SIGCONT),
//! stops (SIGTERM), restarts (optionally with failpoints armed), replaces (remove, wipe, add
//! back) and cuts the power of members here.
//!
//! With [`Setup::power_fs`] every member's data dir is a [`PowerFs`] of its own, mounted in
//! this process before the member first starts (a mount made before `ip netns exec` is seen in
//! the member's namespace: it copies this process's mounts) and unmounted when the system is
//! dropped, after the members are dead. Cutting a member's power throws away everything it
//! had not fsynced.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rkube_store::proto::etcdserverpb as pb;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::net::Hosts;
use super::proxy::FaultProxies;
use crate::powerfs::{CutReport, PowerFs};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Rkube,
    Etcd,
    /// An `rkube up` cluster serving the Kubernetes API ([`crate::Cluster`]), which the
    /// Kubernetes campaign faults; a [`System`] is never one.
    Kubernetes,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Rkube => "rkube",
            Kind::Etcd => "etcd 3.4",
            Kind::Kubernetes => "Kubernetes API on rkube",
        }
    }
}

/// Timing and log compaction of the members under test.
#[derive(Debug, Clone)]
pub struct Tuning {
    pub election_timeout_ms: u64,
    pub heartbeat_ms: u64,
    /// A snapshot after this many entries, so that a follower cut off for long needs one.
    pub snapshot_count: u64,
    pub snapshot_catchup_entries: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            election_timeout_ms: 1000,
            heartbeat_ms: 100,
            snapshot_count: 1000,
            snapshot_catchup_entries: 300,
        }
    }
}

/// How the members are set up, beyond their timing.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// Each member's data dir on a powerfs of its own, so that its power can be cut.
    pub power_fs: bool,
    /// Extra arguments for every rkube member (`--unsafe-no-fsync`, say); not for etcd.
    pub rkube_args: Vec<String>,
}

const CLIENT_PORT: u16 = 2379;
const PEER_PORT: u16 = 2380;

pub struct System {
    pub kind: Kind,
    pub dir: PathBuf,
    pub tuning: Tuning,
    pub proxies: FaultProxies,
    /// Each member's process while it runs.
    children: Vec<Option<Child>>,
    paused: Vec<bool>,
    /// Bumped whenever member i's own revision may start over lower: when it is wiped and
    /// added back (a new member), and when its power is cut (its state rolls back to what it
    /// had synced, until it has applied its log again).
    pub epochs: std::sync::Arc<Vec<std::sync::atomic::AtomicU64>>,
    token: String,
    tls: Option<ClientTlsConfig>,
    bin: PathBuf,
    rkube_args: Vec<String>,
    /// Member i's data dir, when the members run on powerfs. Dropped after the members are
    /// killed (`Drop for System` runs first).
    power: Vec<PowerFs>,
    // Dropped last: the namespaces go once the processes are dead.
    pub hosts: Hosts,
}

impl System {
    /// Makes the hosts, proxies, certificates and (with `setup.power_fs`) the members'
    /// filesystems, and starts `n` members as a new cluster.
    pub async fn start(
        kind: Kind,
        n: usize,
        dir: &Path,
        tuning: Tuning,
        bin: &Path,
        setup: &Setup,
    ) -> Result<Self> {
        if kind == Kind::Kubernetes {
            bail!("a Kubernetes cluster is started with Cluster::start, not as a System");
        }
        if let Some(why) = super::net::unavailable() {
            bail!("{why}");
        }
        let mut power = Vec::new();
        if setup.power_fs {
            crate::powerfs::available().map_err(anyhow::Error::msg)?;
            for i in 0..n {
                let at = dir.join(Self::name(i));
                let fs = PowerFs::mount(&at)
                    .with_context(|| format!("mounting powerfs at {}", at.display()))?;
                // etcd wants its data dir private to its user; rkube does not mind.
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o700))?;
                power.push(fs);
            }
        }
        let hosts = Hosts::create(n)?;
        let targets = (0..n)
            .map(|i| SocketAddr::new(IpAddr::V4(hosts.member_ip(i)), PEER_PORT))
            .collect();
        let proxies = FaultProxies::start(&hosts, 12380, targets).await?;
        let token = format!("chaos-{:08x}", rand::random::<u32>());
        let tls = match kind {
            Kind::Etcd | Kind::Kubernetes => None,
            Kind::Rkube => Some(make_pki(&dir.join("pki"), &hosts)?),
        };
        let mut sys = Self {
            kind,
            dir: dir.to_path_buf(),
            tuning,
            proxies,
            children: (0..n).map(|_| None).collect(),
            paused: vec![false; n],
            epochs: std::sync::Arc::new((0..n).map(|_| Default::default()).collect()),
            token,
            tls,
            bin: bin.to_path_buf(),
            rkube_args: setup.rkube_args.clone(),
            power,
            hosts,
        };
        for i in 0..n {
            sys.spawn(i, "new", &[])?;
        }
        Ok(sys)
    }

    pub fn size(&self) -> usize {
        self.children.len()
    }

    pub fn name(i: usize) -> String {
        format!("m{i}")
    }

    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.join(Self::name(i))
    }

    fn peer_url(&self, i: usize) -> String {
        let scheme = if self.kind == Kind::Rkube {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.proxies.addrs[i])
    }

    pub fn client_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.hosts.member_ip(i)), CLIENT_PORT)
    }

    /// Starts member i's process: `state` new or existing, `env` extra environment (failpoints).
    pub fn spawn(&mut self, i: usize, state: &str, env: &[(&str, &str)]) -> Result<()> {
        if self.running(i) {
            bail!("member {i} is already running");
        }
        let initial: Vec<String> = (0..self.size())
            .map(|j| format!("{}={}", Self::name(j), self.peer_url(j)))
            .collect();
        let ip = self.hosts.member_ip(i);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", Self::name(i))))?;
        let t = &self.tuning;
        let mut cmd = match self.kind {
            Kind::Kubernetes => bail!("a System is never a Kubernetes cluster"),
            Kind::Rkube => {
                let mut c = self.hosts.command(i, &self.bin);
                c.arg("server")
                    .args(["--name", &Self::name(i)])
                    .arg("--data-dir")
                    .arg(self.data_dir(i))
                    .args(["--listen-peer", &format!("{ip}:{PEER_PORT}")])
                    .args(["--listen-client", &format!("{ip}:{CLIENT_PORT}")])
                    .args(["--listen-metrics", &format!("{ip}:2381")])
                    .args(["--initial-cluster", &initial.join(",")])
                    .args(["--initial-cluster-state", state])
                    .args(["--initial-cluster-token", &self.token])
                    .arg("--pki")
                    .arg(self.dir.join("pki"))
                    .args(["--snapshot-count", &t.snapshot_count.to_string()])
                    .args([
                        "--snapshot-catchup-entries",
                        &t.snapshot_catchup_entries.to_string(),
                    ])
                    .args(&self.rkube_args)
                    .env("RUST_LOG", "info");
                c
            }
            Kind::Etcd => {
                let mut c = self.hosts.command(i, Path::new("etcd"));
                c.args(["--name", &Self::name(i)])
                    .arg("--data-dir")
                    .arg(self.data_dir(i))
                    .args(["--listen-peer-urls", &format!("http://{ip}:{PEER_PORT}")])
                    .args(["--initial-advertise-peer-urls", &self.peer_url(i)])
                    .args([
                        "--listen-client-urls",
                        &format!("http://{ip}:{CLIENT_PORT}"),
                    ])
                    .args([
                        "--advertise-client-urls",
                        &format!("http://{ip}:{CLIENT_PORT}"),
                    ])
                    .args(["--initial-cluster", &initial.join(",")])
                    .args(["--initial-cluster-state", state])
                    .args(["--initial-cluster-token", &self.token])
                    .args(["--snapshot-count", &t.snapshot_count.to_string()])
                    // PreVote, as rkube always has it (etcd 3.5 made it the default).
                    .arg("--pre-vote")
                    .args(["--logger", "zap", "--log-level", "warn"]);
                c
            }
        };
        cmd.args(["--election-timeout", &t.election_timeout_ms.to_string()])
            .args(["--heartbeat-interval", &t.heartbeat_ms.to_string()]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting member {i}"))?;
        self.children[i] = Some(child);
        self.paused[i] = false;
        Ok(())
    }

    /// Whether member i's process is alive (a paused one is).
    pub fn running(&mut self, i: usize) -> bool {
        match &mut self.children[i] {
            Some(c) => match c.try_wait() {
                Ok(None) => true,
                _ => {
                    self.children[i] = None;
                    false
                }
            },
            None => false,
        }
    }

    fn signal(&self, i: usize, sig: i32) {
        if let Some(c) = &self.children[i] {
            unsafe {
                libc::kill(c.id() as i32, sig);
            }
        }
    }

    /// SIGKILL, and waits for the process to be gone.
    pub fn kill(&mut self, i: usize) {
        self.kill_all(&[i]);
    }

    /// SIGKILL to every member of `members` at once (no waiting between the signals), then
    /// waits for each process to be gone.
    pub fn kill_all(&mut self, members: &[usize]) {
        for &i in members {
            self.signal(i, libc::SIGKILL);
        }
        for &i in members {
            if let Some(mut c) = self.children[i].take() {
                let _ = c.wait();
            }
            self.paused[i] = false;
        }
    }

    /// Throws away everything member i has not fsynced, as a power cut does; the member must
    /// have been killed and reaped. What was lost, and the fsyncs its filesystem has seen.
    pub fn cut_power(&mut self, i: usize) -> Result<(CutReport, u64)> {
        if self.running(i) {
            bail!("the power of m{i} cannot be cut while its process runs");
        }
        let fs = self
            .power
            .get(i)
            .context("the members' data dirs are not on powerfs")?;
        let report = fs.cut_power();
        self.epochs[i].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok((report, fs.fsyncs()))
    }

    /// SIGTERM, and waits (up to 20 s, then SIGKILL) for the process to exit.
    pub async fn stop(&mut self, i: usize) {
        self.resume(i);
        self.signal(i, libc::SIGTERM);
        for _ in 0..200 {
            if !self.running(i) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.kill(i);
    }

    pub fn pause(&mut self, i: usize) {
        self.signal(i, libc::SIGSTOP);
        self.paused[i] = true;
    }

    pub fn resume(&mut self, i: usize) {
        if self.paused[i] {
            self.signal(i, libc::SIGCONT);
            self.paused[i] = false;
        }
    }

    /// Starts member i again from its data dir.
    pub fn restart(&mut self, i: usize, env: &[(&str, &str)]) -> Result<()> {
        self.spawn(i, "new", env)
    }

    /// A client connection to member i's client port.
    pub fn channel(&self, i: usize) -> Channel {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut e = Endpoint::from_shared(format!("{scheme}://{}", self.client_addr(i)))
            .expect("endpoint")
            .connect_timeout(Duration::from_secs(1))
            .timeout(Duration::from_secs(5));
        if let Some(tls) = &self.tls {
            e = e.tls_config(tls.clone()).expect("tls");
        }
        e.connect_lazy()
    }

    /// Member i's status, bounded: a paused member accepts connections and never answers.
    pub async fn status(&self, i: usize) -> Option<pb::StatusResponse> {
        let mut m = pb::maintenance_client::MaintenanceClient::new(self.channel(i));
        let call = m.status(pb::StatusRequest {});
        tokio::time::timeout(Duration::from_millis(800), call)
            .await
            .ok()?
            .ok()
            .map(|r| r.into_inner())
    }

    /// Asks the cluster to hand leadership to member `to` (etcd's MoveLeader, sent to the
    /// member that leads now); true once `to` says it leads, within `within`.
    pub async fn move_leader(&self, to: usize, within: Duration) -> bool {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if let (Some(target), Some(leader)) = (self.status(to).await, self.leader().await) {
                if leader == to {
                    return true;
                }
                let id = target.header.map_or(0, |h| h.member_id);
                let mut m = pb::maintenance_client::MaintenanceClient::new(self.channel(leader));
                let call = m.move_leader(pb::MoveLeaderRequest { target_id: id });
                let _ = tokio::time::timeout(Duration::from_secs(5), call).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// The member that says it leads, if one does.
    pub async fn leader(&self) -> Option<usize> {
        self.leader_except(None).await
    }

    /// The member other than `skip` that says it leads, if one does.
    pub async fn leader_except(&self, skip: Option<usize>) -> Option<usize> {
        let others = (0..self.size()).filter(|i| Some(*i) != skip);
        let all =
            futures::future::join_all(others.map(|i| async move { (i, self.status(i).await) }))
                .await;
        all.into_iter()
            .find_map(|(i, s)| s.filter(crate::claims_leadership).map(|_| i))
    }

    /// Removes member i from the cluster, wipes its data and adds it back as a new member
    /// with the same address; the process must already be stopped.
    pub async fn replace(&mut self, i: usize) -> Result<()> {
        let other = (0..self.size())
            .find(|j| *j != i)
            .context("no other member")?;
        let mut cluster = pb::cluster_client::ClusterClient::new(self.channel(other));
        let members = cluster
            .member_list(pb::MemberListRequest::default())
            .await?
            .into_inner();
        let url = self.peer_url(i);
        let id = members
            .members
            .iter()
            .find(|m| {
                m.peer_ur_ls.iter().any(|u| {
                    u.split_once("://").map_or(u.as_str(), |(_, a)| a)
                        == self.proxies.addrs[i].to_string()
                })
            })
            .map(|m| m.id)
            .with_context(|| format!("member {i} ({url}) is not in the member list"))?;
        cluster
            .member_remove(pb::MemberRemoveRequest { id })
            .await
            .context("member remove")?;
        std::fs::remove_dir_all(self.data_dir(i)).ok();
        self.epochs[i].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // The removal is committed by a quorum; adding back right away is what an operator does.
        let mut added = None;
        for _ in 0..150 {
            match cluster
                .member_add(pb::MemberAddRequest {
                    peer_ur_ls: vec![url.clone()],
                    is_learner: false,
                })
                .await
            {
                Ok(r) => {
                    added = Some(r);
                    break;
                }
                Err(e) => {
                    eprintln!("  member add of m{i}: {}", e.message());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        added.context("member add kept failing")?;
        self.spawn(i, "existing", &[])
    }
}

impl Drop for System {
    fn drop(&mut self) {
        for i in 0..self.size() {
            self.kill(i);
        }
    }
}

/// The cluster CA, a certificate per member (valid for its own address and the proxies'
/// address, which is how the other members reach it) and a client certificate.
fn make_pki(dir: &Path, hosts: &Hosts) -> Result<ClientTlsConfig> {
    use rkube_pki as pki;
    pki::init_ca(dir)?;
    for i in 0..hosts.members {
        let sans = vec![
            hosts.member_ip(i).to_string(),
            hosts.host_ip().to_string(),
            "127.0.0.1".to_string(),
        ];
        pki::issue(
            dir,
            &System::name(i),
            &System::name(i),
            None,
            &sans,
            true,
            true,
        )?;
    }
    pki::issue(dir, "admin", "root", None, &[], false, true)?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(dir.join("ca.crt"))?))
        .identity(Identity::from_pem(
            std::fs::read(dir.join("admin.crt"))?,
            std::fs::read(dir.join("admin.key"))?,
        )))
}
