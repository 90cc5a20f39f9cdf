//! A seedable randomized campaign: the system under test starts, the clients run, and faults
//! drawn from the chosen kinds are injected one after another until the duration is over;
//! then everything heals, the final state is read, the histories are checked, and every
//! member must hold the same keys and history at one revision (HashKV).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rkube_store::proto::etcdserverpb as pb;
use tokio::time::Instant;

use super::check::{self, Kind as OpKind, Op};
use super::proxy::LinkFault;
use super::system::{Kind, Setup, System, Tuning};
use super::workload::{self, lock, Record};
use crate::powerfs::CutReport;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    KillLeader,
    KillMember,
    QuorumLoss,
    PauseLeader,
    PartitionLeader,
    PartitionLeaderOut,
    PartitionLeaderIn,
    DelayPeers,
    LossPeers,
    SnapshotCatchup,
    PartitionFollower,
    ReplaceMember,
    Failpoint,
    RollingRestart,
    PowerFollower,
    PowerLeader,
    PowerTwo,
    PowerAll,
}

impl Fault {
    pub const ALL: [Fault; 18] = [
        Fault::KillLeader,
        Fault::KillMember,
        Fault::QuorumLoss,
        Fault::PauseLeader,
        Fault::PartitionLeader,
        Fault::PartitionLeaderOut,
        Fault::PartitionLeaderIn,
        Fault::DelayPeers,
        Fault::LossPeers,
        Fault::SnapshotCatchup,
        Fault::PartitionFollower,
        Fault::ReplaceMember,
        Fault::Failpoint,
        Fault::RollingRestart,
        Fault::PowerFollower,
        Fault::PowerLeader,
        Fault::PowerTwo,
        Fault::PowerAll,
    ];

    /// The power cuts: they need the members' data dirs on powerfs ([`Config::power_fs`]).
    pub const POWER: [Fault; 4] = [
        Fault::PowerFollower,
        Fault::PowerLeader,
        Fault::PowerTwo,
        Fault::PowerAll,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillLeader => "kill-leader",
            Fault::KillMember => "kill-member",
            Fault::QuorumLoss => "quorum-loss",
            Fault::PauseLeader => "pause-leader",
            Fault::PartitionLeader => "partition-leader",
            Fault::PartitionLeaderOut => "partition-leader-out",
            Fault::PartitionLeaderIn => "partition-leader-in",
            Fault::DelayPeers => "delay-peers",
            Fault::LossPeers => "loss-peers",
            Fault::SnapshotCatchup => "snapshot-catchup",
            Fault::PartitionFollower => "partition-follower",
            Fault::ReplaceMember => "replace-member",
            Fault::Failpoint => "failpoint",
            Fault::RollingRestart => "rolling-restart",
            Fault::PowerFollower => "power-follower",
            Fault::PowerLeader => "power-leader",
            Fault::PowerTwo => "power-two",
            Fault::PowerAll => "power-all",
        }
    }

    pub fn is_power_cut(self) -> bool {
        Fault::POWER.contains(&self)
    }

    pub fn parse(s: &str) -> Result<Fault> {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .with_context(|| {
                let all: Vec<_> = Fault::ALL.iter().map(|f| f.name()).collect();
                format!("unknown fault {s:?}; the faults are {}", all.join(", "))
            })
    }

    /// Whether the fault can be applied to this system (etcd's failpoints need a special build).
    pub fn applies(self, kind: Kind) -> bool {
        !(self == Fault::Failpoint && kind == Kind::Etcd)
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub system: Kind,
    pub seed: u64,
    pub duration: Duration,
    pub faults: Vec<Fault>,
    pub clients: usize,
    pub watchers: usize,
    /// Where the members' data and logs go, and on failure the seed and histories.
    pub dir: PathBuf,
    pub rkube_bin: PathBuf,
    pub tuning: Tuning,
    /// Every member's data dir on a powerfs of its own (needed by the power cuts; root and
    /// /dev/fuse).
    pub power_fs: bool,
    /// Extra arguments for every rkube member, e.g. `--unsafe-no-fsync`.
    pub rkube_args: Vec<String>,
}

/// One injected fault and how the cluster came back from it.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub fault: Fault,
    pub detail: String,
    /// When recovery is timed from (ns): the injection, or for quorum loss the restart.
    pub reference: u64,
    /// Whether the fault took the leader away (a new leader is then expected).
    pub deposes: bool,
    pub to_leader: Option<Duration>,
    pub to_write: Option<Duration>,
    /// False when the cluster did not serve writes again within the bound after healing.
    pub recovered: bool,
    /// False when the harness could not inject it (a failed member replacement, say).
    pub injected: bool,
    /// For a power cut: each member whose power was cut, what its filesystem threw away, and
    /// the fsyncs that filesystem had seen until then.
    pub cuts: Vec<(usize, CutReport, u64)>,
    /// For a fault that must not move the leadership (a follower cut off and back): whether
    /// the leader kept its term through it.
    pub leader_kept: Option<bool>,
}

#[derive(Debug)]
pub struct Summary {
    pub config: Config,
    pub faults: Vec<FaultRecord>,
    pub ops: usize,
    pub answered: usize,
    pub unknown: usize,
    pub appends_tried: u64,
    pub acked: usize,
    /// Acknowledged appends missing from the final state (none when it could not be read).
    pub lost: Vec<String>,
    /// Whether the final state could be read (a cluster that never came back cannot be).
    pub final_state: Result<(), String>,
    pub linearizable: check::Verdict,
    pub check_time: Duration,
    pub watch: check::WatchReport,
    pub revisions: Result<(), String>,
    /// Whether every member has the same HashKV at one revision after the campaign: what
    /// they agreed on, or where they did not.
    pub hashes: Result<String, String>,
    pub elapsed: Duration,
}

impl Summary {
    pub fn passed(&self) -> bool {
        let w = &self.watch;
        self.lost.is_empty()
            && self.final_state.is_ok()
            && self.linearizable.linearizable == Some(true)
            && w.ordered
            && w.unique
            && w.reliable
            && w.atomic
            && w.resumable
            && w.bookmarkable
            && self.revisions.is_ok()
            && self.hashes.is_ok()
            && self
                .faults
                .iter()
                .all(|f| f.recovered && f.injected && f.leader_kept != Some(false))
    }

    /// The summary table.
    pub fn table(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "chaos campaign: {}, seed {}, {:.0} s of faults ({:.0} s in all), {} clients, {} watchers\n",
            c.system.name(),
            c.seed,
            c.duration.as_secs_f64(),
            self.elapsed.as_secs_f64(),
            c.clients,
            c.watchers
        );
        out += &format!(
            "{:<22}{:>5}  {:>26}  {:>26}\n",
            "fault", "n", "new leader p50/p99/max s", "first write p50/p99/max s"
        );
        let mut by: BTreeMap<Fault, Vec<&FaultRecord>> = BTreeMap::new();
        for f in &self.faults {
            by.entry(f.fault).or_default().push(f);
        }
        for (fault, recs) in &by {
            let leader: Vec<Duration> = recs
                .iter()
                .filter(|r| r.deposes)
                .filter_map(|r| r.to_leader)
                .collect();
            let write: Vec<Duration> = recs.iter().filter_map(|r| r.to_write).collect();
            let failed = recs.iter().filter(|r| !r.recovered || !r.injected).count();
            out += &format!(
                "{:<22}{:>5}  {:>26}  {:>26}{}\n",
                fault.name(),
                recs.len(),
                percentiles(&leader),
                percentiles(&write),
                if failed > 0 {
                    format!("  ({failed} not injected or not recovered)")
                } else {
                    String::new()
                }
            );
        }
        let cuts: Vec<&FaultRecord> = self.faults.iter().filter(|f| !f.cuts.is_empty()).collect();
        if !cuts.is_empty() {
            out +=
                "power cuts (what each member's filesystem threw away; its fsyncs until then):\n";
        }
        for r in cuts {
            let each: Vec<String> = r
                .cuts
                .iter()
                .map(|(m, report, fsyncs)| {
                    format!("m{m} {}, {fsyncs} fsyncs", describe_cut(report))
                })
                .collect();
            out += &format!(
                "  {:<14} at {:>6.1} s: {}\n",
                r.fault.name(),
                r.reference as f64 / 1e9,
                each.join("; ")
            );
        }
        let yes = |b: bool| if b { "yes" } else { "NO" };
        out += &format!(
            "operations: {} register/txn ({} answered, {} unknown outcome); appends {} ({} acknowledged)\n",
            self.ops, self.answered, self.unknown, self.appends_tried, self.acked
        );
        out += &match &self.final_state {
            Ok(()) if self.lost.is_empty() => "acknowledged writes lost: 0\n".to_string(),
            Ok(()) => format!(
                "acknowledged writes lost: {} ({}{})\n",
                self.lost.len(),
                self.lost[..self.lost.len().min(5)].join(", "),
                if self.lost.len() > 5 { ", ..." } else { "" }
            ),
            Err(e) => format!("acknowledged writes lost: unknown: {e}\n"),
        };
        out += &format!(
            "linearizable: {} ({} ops in {} key groups, checked in {:.2} s){}\n",
            match self.linearizable.linearizable {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "unknown (checker budget exceeded)",
            },
            self.linearizable.ops,
            self.linearizable.groups,
            self.check_time.as_secs_f64(),
            self.linearizable
                .failure
                .as_ref()
                .map(|f| format!(": {f}"))
                .unwrap_or_default()
        );
        let w = &self.watch;
        out += &format!(
            "watches: {} watchers, {} events: ordered {}, unique {}, reliable {}, atomic {}, resumable {}, bookmarkable {}\n",
            w.watchers,
            w.events,
            yes(w.ordered),
            yes(w.unique),
            yes(w.reliable),
            yes(w.atomic),
            yes(w.resumable),
            yes(w.bookmarkable)
        );
        for p in w.problems.iter().take(5) {
            out += &format!("  watch problem: {p}\n");
        }
        out += &format!(
            "revisions never decrease: {}\n",
            match &self.revisions {
                Ok(()) => "yes".to_string(),
                Err(e) => format!("NO: {e}"),
            }
        );
        out += &format!(
            "members agree (HashKV): {}\n",
            match &self.hashes {
                Ok(what) => format!("yes, {what}"),
                Err(e) => format!("NO: {e}"),
            }
        );
        out += &format!("result: {}\n", if self.passed() { "PASS" } else { "FAIL" });
        out
    }
}

/// "dropped 12.0 KiB in 3 files, 0 directory entries".
pub fn describe_cut(r: &CutReport) -> String {
    format!(
        "dropped {:.1} KiB in {} files, {} directory entries",
        r.bytes_dropped as f64 / 1024.0,
        r.files_reverted,
        r.entries_reverted
    )
}

pub fn percentiles(xs: &[Duration]) -> String {
    if xs.is_empty() {
        return "-".into();
    }
    let mut v: Vec<f64> = xs.iter().map(|d| d.as_secs_f64()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    format!("{:.2} / {:.2} / {:.2}", at(0.5), at(0.99), v[v.len() - 1])
}

/// How long a healed cluster may take to serve writes again before the campaign calls it a
/// failure to recover.
const RECOVERY_BOUND: Duration = Duration::from_secs(60);

/// Leader claims seen by the monitor: (when, the claimant of the highest term and that term).
type Claims = Arc<std::sync::Mutex<Vec<(u64, Option<(usize, u64)>)>>>;

struct Run {
    sys: System,
    rec: Arc<Record>,
    rng: StdRng,
    /// Leader claims seen by the monitor: (when, member, term), highest term first claimant.
    claims: Claims,
    /// (start, end, ok) of every probe write.
    probes: Arc<std::sync::Mutex<Vec<(u64, u64, bool)>>>,
}

pub async fn run(config: Config) -> Result<Summary> {
    let began = Instant::now();
    if !config.power_fs {
        if let Some(f) = config.faults.iter().find(|f| f.is_power_cut()) {
            bail!(
                "{} cuts the power of members, which needs their data dirs on powerfs (--power-fs)",
                f.name()
            );
        }
    }
    std::fs::create_dir_all(&config.dir)?;
    let sys = System::start(
        config.system,
        3,
        &config.dir,
        config.tuning.clone(),
        &config.rkube_bin,
        &Setup {
            power_fs: config.power_fs,
            rkube_args: match config.system {
                Kind::Rkube => config.rkube_args.clone(),
                Kind::Etcd => Vec::new(),
            },
        },
    )
    .await?;
    let rec = Arc::new(Record::new());
    let mut run = Run {
        sys,
        rec: rec.clone(),
        rng: StdRng::seed_from_u64(config.seed),
        claims: Arc::default(),
        probes: Arc::default(),
    };
    run.wait_writable(Duration::from_secs(60))
        .await
        .context("the new cluster never served a write")?;

    let channels: Vec<_> = (0..run.sys.size()).map(|i| run.sys.channel(i)).collect();
    let statuses: Vec<_> = channels.clone();
    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(monitor(
        statuses,
        run.sys.epochs.clone(),
        rec.clone(),
        run.claims.clone(),
    )));
    tasks.push(tokio::spawn(prober(
        channels.clone(),
        rec.clone(),
        run.probes.clone(),
    )));
    tasks.push(tokio::spawn(workload::compactor(
        channels.clone(),
        rec.clone(),
    )));
    for id in 0..config.clients {
        tasks.push(tokio::spawn(workload::client(
            id,
            channels.clone(),
            rec.clone(),
            config.seed,
        )));
    }
    let from = run.head_revision().await.unwrap_or(1);
    for id in 0..config.watchers {
        tasks.push(tokio::spawn(workload::watcher(
            id,
            channels.clone(),
            rec.clone(),
            from,
        )));
    }

    let faults: Vec<Fault> = config
        .faults
        .iter()
        .copied()
        .filter(|f| f.applies(config.system))
        .collect();
    let mut records = Vec::new();
    let end = Instant::now() + config.duration;
    // Some undisturbed traffic first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Faults come in rounds: every kind once per round, in an order drawn from the seed; a
    // round once started is finished, and there is at least one, so that every campaign has
    // tried every kind.
    let mut bag: Vec<Fault> = Vec::new();
    let mut rounds = 0;
    while !faults.is_empty() {
        if bag.is_empty() {
            if rounds > 0 && Instant::now() >= end {
                break;
            }
            rounds += 1;
            bag = faults.clone();
            bag.shuffle(&mut run.rng);
        }
        let fault = bag.pop().expect("refilled");
        eprintln!(
            "[{:>6.1} s] {}",
            rec.start.elapsed().as_secs_f64(),
            fault.name()
        );
        let mut r = match run.inject(fault).await {
            Ok(r) => r,
            Err(e) => {
                let at = rec.now();
                let mut r = run.record(fault, format!("could not be injected: {e:#}"), at, false);
                r.injected = false;
                r
            }
        };
        r.recovered = run.wait_writable(RECOVERY_BOUND).await.is_ok();
        if !r.recovered {
            eprintln!("  did not recover within {RECOVERY_BOUND:?}");
        }
        eprintln!("  {}", r.detail);
        let recovered = r.recovered;
        records.push(r);
        if !recovered {
            // A cluster that stays down has failed the campaign; more faults would tell
            // nothing more.
            eprintln!("  stopping the faults: the cluster did not recover");
            break;
        }
        // Quiet time between faults.
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }

    // Heal everything, bring every member back, and let the clients finish.
    run.sys.proxies.heal();
    for i in 0..run.sys.size() {
        run.sys.resume(i);
        if !run.sys.running(i) {
            run.sys.restart(i, &[])?;
        }
    }
    // After a fault the cluster never recovered from, a short second chance.
    let bound = if records.last().is_some_and(|r| !r.recovered) {
        Duration::from_secs(15)
    } else {
        RECOVERY_BOUND
    };
    let healed = run.wait_writable(bound).await;
    eprintln!(
        "[{:>6.1} s] healed; stopping the clients",
        rec.start.elapsed().as_secs_f64()
    );
    rec.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(30), futures::future::join_all(tasks)).await;
    let found = match healed {
        Ok(()) => run
            .final_reads()
            .await
            .map_err(|e| format!("the final state could not be read: {e:#}")),
        Err(e) => Err(format!(
            "the cluster did not come back after healing: {e:#}"
        )),
    };
    let hashes = match &found {
        Ok(_) => run.members_agree().await,
        Err(_) => Err("not checked (no final state)".into()),
    };
    eprintln!("[{:>6.1} s] checking", rec.start.elapsed().as_secs_f64());

    // Recovery times from the monitor's and the prober's records.
    for r in &mut records {
        let (l, w) = run.recovery(r);
        r.to_leader = l;
        r.to_write = w;
    }

    let ops = std::mem::take(&mut *lock(&rec.ops));
    let answered = ops.iter().filter(|o| o.ret.is_some()).count();
    let acked = lock(&rec.acked).clone();
    let lost = match &found {
        Ok(found) => check::lost_writes(&acked, found),
        Err(_) => Vec::new(),
    };
    let t = std::time::Instant::now();
    let linearizable = check::linearizable(&ops, Duration::from_secs(120));
    let check_time = t.elapsed();
    let watches = std::mem::take(&mut *lock(&rec.watches));
    let watch = check::check_watches(&watches, None);
    let observed = std::mem::take(&mut *lock(&rec.revisions));
    let revisions = check::revisions_monotonic(&observed);
    let summary = Summary {
        config: config.clone(),
        faults: records,
        ops: ops.len(),
        answered,
        unknown: ops.len() - answered,
        appends_tried: rec.appends_tried.load(std::sync::atomic::Ordering::Relaxed),
        acked: acked.len(),
        lost,
        final_state: found.map(|_| ()),
        linearizable,
        check_time,
        watch,
        revisions,
        hashes,
        elapsed: began.elapsed(),
    };
    if !summary.passed() {
        save_failure(&config, &summary, &ops, &watches, &observed)?;
    }
    Ok(summary)
}

/// Keeps the seed, the table and the histories of a failed campaign in its dir.
fn save_failure(
    config: &Config,
    summary: &Summary,
    ops: &[Op],
    watches: &[check::WatchLog],
    revisions: &[(String, u64, i64)],
) -> Result<()> {
    let d = &config.dir;
    std::fs::write(d.join("seed"), format!("{}\n", config.seed))?;
    std::fs::write(d.join("summary.txt"), summary.table())?;
    let mut f = String::new();
    for r in &summary.faults {
        f += &format!(
            "{:>8.1} s {}: {}\n",
            r.reference as f64 / 1e9,
            r.fault.name(),
            r.detail
        );
    }
    std::fs::write(d.join("faults.txt"), f)?;
    if !summary.lost.is_empty() {
        std::fs::write(d.join("lost.txt"), summary.lost.join("\n") + "\n")?;
    }
    let mut h = String::new();
    for o in ops {
        h += &format!("{o:?}\n");
    }
    std::fs::write(d.join("history.txt"), h)?;
    let mut w = String::new();
    for l in watches {
        w += &format!("{l:?}\n");
    }
    std::fs::write(d.join("watches.txt"), w)?;
    let mut r = String::new();
    for (who, at, revision) in revisions {
        r += &format!("{:.6} {who} {revision}\n", *at as f64 / 1e9);
    }
    std::fs::write(d.join("revisions.txt"), r)?;
    eprintln!(
        "the seed, the summary and the histories are in {}",
        d.display()
    );
    Ok(())
}

/// Polls every member's status: the leader claims (the highest term's claimant wins) and
/// each member's revision, which must never go back, restarts included, within one epoch of
/// the member (see [`System::epochs`]).
///
/// # Correctness
/// A power cut starts a new epoch: the member's own revision may then be lower than before,
/// until it has applied its log again. etcd allows that: a status, like a serializable read,
/// is answered from the member's local state, which "may access stale data with respect to
/// quorum" (etcd's API guarantees), and etcd's maintainers keep serving such stale reads
/// while a restarted member catches up (etcd issue 3879: ask for a linearizable read to avoid
/// them). Linearizable requests get no such excuse: every client's revisions are checked
/// across all faults, and the final HashKV check shows the member caught up.
async fn monitor(
    channels: Vec<tonic::transport::Channel>,
    epochs: Arc<Vec<std::sync::atomic::AtomicU64>>,
    rec: Arc<Record>,
    claims: Claims,
) {
    let mut last: Option<Option<(usize, u64)>> = None;
    while !rec.stop.load(std::sync::atomic::Ordering::Relaxed) {
        let polls = channels.iter().enumerate().map(|(i, ch)| {
            let mut m = pb::maintenance_client::MaintenanceClient::new(ch.clone());
            async move {
                let r = tokio::time::timeout(
                    Duration::from_millis(500),
                    m.status(pb::StatusRequest {}),
                )
                .await;
                (i, r.ok().and_then(|r| r.ok()).map(|r| r.into_inner()))
            }
        });
        let gen = |i: usize| epochs[i].load(std::sync::atomic::Ordering::SeqCst);
        let before: Vec<u64> = (0..channels.len()).map(gen).collect();
        let all = futures::future::join_all(polls).await;
        let now = rec.now();
        let mut best: Option<(usize, u64)> = None;
        for (i, s) in &all {
            let Some(s) = s else { continue };
            if let Some(h) = &s.header {
                // A new epoch's revisions start over (an answer from while the member was
                // being replaced or restarted after a power cut is not attributed).
                let g = gen(*i);
                if g == before[*i] {
                    lock(&rec.revisions).push((format!("member-m{i}.{g}"), now, h.revision));
                }
                if crate::claims_leadership(s) && best.is_none_or(|(_, t)| s.raft_term > t) {
                    best = Some((*i, s.raft_term));
                }
            }
        }
        if last != Some(best) {
            lock(&claims).push((now, best));
            last = Some(best);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts a probe write every 100 ms, each to the next member in turn and given 3 s: the
/// first success started after a fault times how long writes were not served.
async fn prober(
    channels: Vec<tonic::transport::Channel>,
    rec: Arc<Record>,
    probes: Arc<std::sync::Mutex<Vec<(u64, u64, bool)>>>,
) {
    let mut member = 0;
    let mut inflight = tokio::task::JoinSet::new();
    while !rec.stop.load(std::sync::atomic::Ordering::Relaxed) {
        let mut kv = pb::kv_client::KvClient::new(channels[member].clone());
        member = (member + 1) % channels.len();
        let (rec, probes) = (rec.clone(), probes.clone());
        inflight.spawn(async move {
            let start = rec.now();
            let r = tokio::time::timeout(
                Duration::from_secs(3),
                kv.put(pb::PutRequest {
                    key: b"probe".to_vec(),
                    value: b"1".to_vec(),
                    ..Default::default()
                }),
            )
            .await;
            let ok = matches!(r, Ok(Ok(_)));
            lock(&probes).push((start, rec.now(), ok));
        });
        while inflight.try_join_next().is_some() {}
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while inflight.join_next().await.is_some() {}
}

impl Run {
    async fn head_revision(&self) -> Option<i64> {
        for i in 0..self.sys.size() {
            if let Some(s) = self.sys.status(i).await {
                return s.header.map(|h| h.revision);
            }
        }
        None
    }

    /// Waits until some member accepts a write.
    async fn wait_writable(&self, bound: Duration) -> Result<()> {
        let end = Instant::now() + bound;
        while Instant::now() < end {
            for i in 0..self.sys.size() {
                let mut kv = pb::kv_client::KvClient::new(self.sys.channel(i));
                let put = kv.put(pb::PutRequest {
                    key: b"probe".to_vec(),
                    value: b"1".to_vec(),
                    ..Default::default()
                });
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), put).await {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("no member accepted a write within {bound:?}")
    }

    /// Waits (bounded) until a member other than `skip` says it leads; that member, if any.
    async fn wait_leader_except(&self, skip: Option<usize>, bound: Duration) -> Option<usize> {
        let end = Instant::now() + bound;
        while Instant::now() < end {
            if let Some(l) = self.sys.leader_except(skip).await {
                return Some(l);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    fn term_at(&self, t: u64) -> u64 {
        lock(&self.claims)
            .iter()
            .take_while(|(at, _)| *at <= t)
            .filter_map(|(_, c)| c.map(|(_, term)| term))
            .max()
            .unwrap_or(0)
    }

    /// (to a new leader, to the first successful write) after a fault's reference point.
    fn recovery(&self, r: &FaultRecord) -> (Option<Duration>, Option<Duration>) {
        let before = self.term_at(r.reference);
        let leader = lock(&self.claims)
            .iter()
            .find(|(at, c)| {
                *at >= r.reference && c.is_some_and(|(_, term)| !r.deposes || term > before)
            })
            .map(|(at, _)| Duration::from_nanos(at - r.reference));
        let write = lock(&self.probes)
            .iter()
            .filter(|(start, _, ok)| *ok && *start >= r.reference)
            .map(|(_, end, _)| Duration::from_nanos(end - r.reference))
            .min();
        (leader, write)
    }

    fn others(&self, m: usize) -> Vec<usize> {
        (0..self.sys.size()).filter(|i| *i != m).collect()
    }

    fn record(&self, fault: Fault, detail: String, reference: u64, deposes: bool) -> FaultRecord {
        FaultRecord {
            fault,
            detail,
            reference,
            deposes,
            to_leader: None,
            to_write: None,
            recovered: false,
            injected: true,
            cuts: Vec::new(),
            leader_kept: None,
        }
    }

    /// Writes `n` keys as fast as the cluster takes them (20 at a time) through every member
    /// but `cut_off`: enough entries for a snapshot, or to leave a cut-off follower behind.
    async fn fill(&self, n: usize, cut_off: Option<usize>) -> usize {
        use futures::StreamExt;
        let channels: Vec<_> = (0..self.sys.size())
            .filter(|i| Some(*i) != cut_off)
            .map(|i| self.sys.channel(i))
            .collect();
        let done = futures::stream::iter(0..n)
            .map(|k| {
                let mut kv = pb::kv_client::KvClient::new(channels[k % channels.len()].clone());
                async move {
                    tokio::time::timeout(
                        Duration::from_secs(3),
                        kv.put(pb::PutRequest {
                            key: format!("fill/{k}").into(),
                            value: vec![b'x'; 100],
                            ..Default::default()
                        }),
                    )
                    .await
                    .is_ok_and(|r| r.is_ok())
                }
            })
            .buffer_unordered(20)
            .filter(|ok| futures::future::ready(*ok))
            .count()
            .await;
        done
    }

    /// Waits until member m answers with a revision at least `rev`.
    async fn wait_caught_up(&self, m: usize, rev: i64, bound: Duration) -> Option<Duration> {
        let t = Instant::now();
        while t.elapsed() < bound {
            if let Some(s) = self.sys.status(m).await {
                if s.header.is_some_and(|h| h.revision >= rev) {
                    return Some(t.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    async fn inject(&mut self, fault: Fault) -> Result<FaultRecord> {
        let n = self.sys.size();
        let leader = self.wait_leader_except(None, Duration::from_secs(30)).await;
        let l = leader.unwrap_or(0);
        let now = || self.rec.now();
        Ok(match fault {
            Fault::KillLeader => {
                self.sys.kill(l);
                let at = now();
                let new = self
                    .wait_leader_except(Some(l), Duration::from_secs(30))
                    .await;
                self.sys.restart(l, &[])?;
                self.record(
                    fault,
                    format!("killed leader m{l}; new leader {new:?}"),
                    at,
                    true,
                )
            }
            Fault::KillMember => {
                let m = self.rng.gen_range(0..n);
                self.sys.kill(m);
                let at = now();
                tokio::time::sleep(Duration::from_secs(2)).await;
                self.sys.restart(m, &[])?;
                self.record(fault, format!("killed m{m} for 2 s"), at, m == l)
            }
            Fault::QuorumLoss => {
                let others = self.others(l);
                let f = others[self.rng.gen_range(0..others.len())];
                self.sys.kill(l);
                self.sys.kill(f);
                tokio::time::sleep(Duration::from_secs(3)).await;
                self.sys.restart(l, &[])?;
                self.sys.restart(f, &[])?;
                let at = now();
                self.record(
                    fault,
                    format!("killed m{l} (leader) and m{f} for 3 s"),
                    at,
                    true,
                )
            }
            Fault::PauseLeader => {
                self.sys.pause(l);
                let at = now();
                let hold = 2 * self.sys.tuning.election_timeout_ms + 1500;
                tokio::time::sleep(Duration::from_millis(hold)).await;
                self.sys.resume(l);
                self.record(fault, format!("paused leader m{l} for {hold} ms"), at, true)
            }
            Fault::PartitionLeader | Fault::PartitionLeaderOut | Fault::PartitionLeaderIn => {
                let (out, inc) = match fault {
                    Fault::PartitionLeader => (true, true),
                    Fault::PartitionLeaderOut => (true, false),
                    _ => (false, true),
                };
                let all: Vec<usize> = (0..n).collect();
                self.sys.proxies.isolate(l, &all, out, inc, LinkFault::Cut);
                let at = now();
                let old_refuses = self.old_leader_refuses(l).await;
                tokio::time::sleep(Duration::from_secs(4)).await;
                self.sys.proxies.heal();
                let dir = match (out, inc) {
                    (true, true) => "both ways",
                    (true, false) => "leader -> followers",
                    _ => "followers -> leader",
                };
                self.record(
                    fault,
                    format!("cut leader m{l} off ({dir}) for 4 s; the old leader {old_refuses}"),
                    at,
                    true,
                )
            }
            Fault::DelayPeers | Fault::LossPeers => {
                for a in 0..n {
                    for b in (0..n).filter(|b| *b != a) {
                        let f = if fault == Fault::DelayPeers {
                            LinkFault::Delay(Duration::from_millis(self.rng.gen_range(50..250)))
                        } else {
                            LinkFault::Loss(0.2)
                        };
                        self.sys.proxies.set(a, b, Some(f));
                    }
                }
                let at = now();
                tokio::time::sleep(Duration::from_secs(5)).await;
                self.sys.proxies.heal();
                let what = if fault == Fault::DelayPeers {
                    "50-250 ms delay"
                } else {
                    "20% loss"
                };
                self.record(
                    fault,
                    format!("{what} on every peer link for 5 s"),
                    at,
                    false,
                )
            }
            Fault::PartitionFollower => {
                // A follower cut off both ways for two election timeouts and more: with
                // PreVote it never raises its term, so coming back it deposes nobody.
                let others = self.others(l);
                let f = others[self.rng.gen_range(0..others.len())];
                let term_of = |s: Option<pb::StatusResponse>| s.map(|s| s.raft_term);
                let before = term_of(self.sys.status(l).await);
                let all: Vec<usize> = (0..n).collect();
                self.sys
                    .proxies
                    .isolate(f, &all, true, true, LinkFault::Cut);
                let at = now();
                let hold = 2 * self.sys.tuning.election_timeout_ms + 1500;
                tokio::time::sleep(Duration::from_millis(hold)).await;
                let head = self.head_revision_of(l).await.unwrap_or(0);
                self.sys.proxies.heal();
                let caught = self.wait_caught_up(f, head, RECOVERY_BOUND).await;
                // A deposed leader shows within an election timeout of the heal.
                tokio::time::sleep(Duration::from_millis(self.sys.tuning.election_timeout_ms))
                    .await;
                let after = term_of(self.sys.status(l).await);
                let still_leads = self.sys.leader().await == Some(l);
                let kept = before.is_some() && before == after && still_leads;
                let mut r = self.record(
                    fault,
                    format!(
                        "cut follower m{f} off both ways for {hold} ms; caught up {}; leader m{l} {}",
                        caught.map_or("never".into(), |d| format!("{:.2} s after the heal", d.as_secs_f64())),
                        if kept {
                            format!("kept term {}", before.unwrap_or(0))
                        } else {
                            format!(
                                "did not keep its leadership (term {before:?} -> {after:?}, leads: {still_leads})"
                            )
                        }
                    ),
                    at,
                    false,
                );
                r.leader_kept = Some(kept);
                r
            }
            Fault::SnapshotCatchup => {
                let others = self.others(l);
                let f = others[self.rng.gen_range(0..others.len())];
                let all: Vec<usize> = (0..n).collect();
                self.sys
                    .proxies
                    .isolate(f, &all, true, true, LinkFault::Cut);
                let at = now();
                let t = &self.sys.tuning;
                let wrote = self
                    .fill(
                        (t.snapshot_count + t.snapshot_catchup_entries + 200) as usize,
                        Some(f),
                    )
                    .await;
                let head = self.head_revision_of(l).await.unwrap_or(0);
                self.sys.proxies.heal();
                let caught = self.wait_caught_up(f, head, RECOVERY_BOUND).await;
                self.record(
                    fault,
                    format!(
                        "cut follower m{f} off while {wrote} writes went in; caught up {}",
                        caught.map_or("never".into(), |d| format!(
                            "{:.2} s after the heal",
                            d.as_secs_f64()
                        ))
                    ),
                    at,
                    false,
                )
            }
            Fault::ReplaceMember => {
                let others = self.others(l);
                let f = others[self.rng.gen_range(0..others.len())];
                self.sys.kill(f);
                let at = now();
                self.sys.replace(f).await?;
                let head = self.head_revision_of(l).await.unwrap_or(0);
                let caught = self.wait_caught_up(f, head, RECOVERY_BOUND).await;
                self.record(
                    fault,
                    format!(
                        "replaced m{f} (removed, wiped, added back); caught up {}",
                        caught.map_or("never".into(), |d| format!("in {:.2} s", d.as_secs_f64()))
                    ),
                    at,
                    false,
                )
            }
            Fault::Failpoint => self.failpoint(l).await?,
            Fault::PowerFollower | Fault::PowerLeader | Fault::PowerTwo | Fault::PowerAll => {
                let others = self.others(l);
                let f = others[self.rng.gen_range(0..others.len())];
                let members = match fault {
                    Fault::PowerFollower => vec![f],
                    Fault::PowerLeader => vec![l],
                    Fault::PowerTwo => vec![l, f],
                    _ => (0..n).collect(),
                };
                self.power_cut(fault, &members, leader).await?
            }
            Fault::RollingRestart => {
                let at = now();
                for m in 0..n {
                    self.sys.stop(m).await;
                    self.sys.restart(m, &[])?;
                    let head = self.head_revision_of((m + 1) % n).await.unwrap_or(0);
                    self.wait_caught_up(m, head, RECOVERY_BOUND).await;
                }
                self.record(
                    fault,
                    "stopped and restarted every member in turn".into(),
                    at,
                    false,
                )
            }
        })
    }

    /// Cuts the power of `members` at once while the clients write: SIGKILL to all of them
    /// right after the clients' next acknowledged append, each reaped, everything it had not
    /// fsynced thrown away, and each restarted from the same data dir.
    async fn power_cut(
        &mut self,
        fault: Fault,
        members: &[usize],
        leader: Option<usize>,
    ) -> Result<FaultRecord> {
        let writing = self.next_acknowledgement(Duration::from_secs(10)).await;
        self.sys.kill_all(members);
        let at = self.rec.now();
        let mut cuts = Vec::new();
        for &m in members {
            let (report, fsyncs) = self.sys.cut_power(m)?;
            cuts.push((m, report, fsyncs));
        }
        for &m in members {
            self.sys.restart(m, &[])?;
        }
        let who: Vec<String> = members
            .iter()
            .map(|&m| {
                if Some(m) == leader {
                    format!("m{m} (leader)")
                } else {
                    format!("m{m}")
                }
            })
            .collect();
        let lost: Vec<String> = cuts
            .iter()
            .map(|(m, report, _)| format!("m{m} {}", describe_cut(report)))
            .collect();
        let mut r = self.record(
            fault,
            format!(
                "cut the power of {} {}; {}",
                who.join(", "),
                if writing {
                    "right after an acknowledged append"
                } else {
                    "(no append acknowledged in the 10 s before)"
                },
                lost.join("; ")
            ),
            at,
            leader.is_some_and(|l| members.contains(&l)),
        );
        r.cuts = cuts;
        Ok(r)
    }

    /// Waits (bounded) for the clients' next acknowledged append: whether one came.
    async fn next_acknowledgement(&self, bound: Duration) -> bool {
        let seen = lock(&self.rec.acked).len();
        let end = Instant::now() + bound;
        while Instant::now() < end {
            if lock(&self.rec.acked).len() > seen {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    }

    /// After the campaign: every member reaches the leader's revision and has the same
    /// HashKV (hash and compaction revision) there. What they agree on, or where they differ.
    async fn members_agree(&self) -> Result<String, String> {
        let l = self
            .wait_leader_except(None, RECOVERY_BOUND)
            .await
            .ok_or("no leader to take the revision from")?;
        let head = self
            .sys
            .status(l)
            .await
            .and_then(|s| s.header)
            .map(|h| h.revision)
            .ok_or_else(|| format!("leader m{l} did not answer a status request"))?;
        let mut hashes = Vec::new();
        for m in 0..self.sys.size() {
            if self.wait_caught_up(m, head, RECOVERY_BOUND).await.is_none() {
                return Err(format!(
                    "m{m} did not reach revision {head} within {RECOVERY_BOUND:?}"
                ));
            }
            let mut mc = pb::maintenance_client::MaintenanceClient::new(self.sys.channel(m));
            let call = mc.hash_kv(pb::HashKvRequest { revision: head });
            match tokio::time::timeout(Duration::from_secs(10), call).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    hashes.push((m, r.hash, r.compact_revision));
                }
                Ok(Err(e)) => return Err(format!("m{m}: HashKV at {head}: {}", e.message())),
                Err(_) => return Err(format!("m{m} did not answer HashKV at {head} in 10 s")),
            }
        }
        let (m0, hash, compacted) = hashes[0];
        match hashes
            .iter()
            .find(|(_, h, c)| (*h, *c) != (hash, compacted))
        {
            None => Ok(format!(
                "hash {hash:08x} at revision {head} (compacted at {compacted})"
            )),
            Some((m, h, c)) => Err(format!(
                "at revision {head} m{m0} has hash {hash:08x} (compacted at {compacted}) \
                 and m{m} has {h:08x} (compacted at {c})"
            )),
        }
    }

    async fn head_revision_of(&self, m: usize) -> Option<i64> {
        match self.sys.status(m).await {
            Some(s) => s.header.map(|h| h.revision),
            None => self.head_revision().await,
        }
    }

    /// Whether a deposed leader refuses writes once a new leader is in charge: asks it for one
    /// write after the others elected someone.
    async fn old_leader_refuses(&self, old: usize) -> String {
        let Some(new) = self
            .wait_leader_except(Some(old), Duration::from_secs(10))
            .await
        else {
            return "kept leading (no other leader within 10 s)".into();
        };
        let mut kv = pb::kv_client::KvClient::new(self.sys.channel(old));
        let put = kv.put(pb::PutRequest {
            key: b"probe-old-leader".to_vec(),
            value: b"1".to_vec(),
            ..Default::default()
        });
        match tokio::time::timeout(Duration::from_secs(3), put).await {
            Ok(Ok(_)) => format!("ACCEPTED a write after m{new} took over"),
            Ok(Err(e)) => format!("refused a write after m{new} took over ({})", e.message()),
            Err(_) => format!("did not answer a write after m{new} took over"),
        }
    }

    /// Restarts a member with one crash point armed, drives traffic until it crashes there,
    /// then starts it clean.
    async fn failpoint(&mut self, leader: usize) -> Result<FaultRecord> {
        let points = rkube_store::failpoints::FAILPOINTS;
        let point = points[self.rng.gen_range(0..points.len())];
        let others = self.others(leader);
        let m = if point.starts_with("snapshot-install") {
            others[self.rng.gen_range(0..others.len())]
        } else {
            self.rng.gen_range(0..self.sys.size())
        };
        self.sys.stop(m).await;
        let armed = format!("{point}=return");
        self.sys
            .restart(m, &[("RKUBE_FAILPOINTS", armed.as_str())])?;
        let t = self.sys.tuning.clone();
        let all: Vec<usize> = (0..self.sys.size()).collect();
        if point.starts_with("snapshot-install") {
            // Leave it behind the leader's log so that it is sent a snapshot.
            self.sys
                .proxies
                .isolate(m, &all, true, true, LinkFault::Cut);
            self.fill(
                (t.snapshot_count + t.snapshot_catchup_entries + 200) as usize,
                Some(m),
            )
            .await;
            self.sys.proxies.heal();
        } else if point.starts_with("snapshot-build") {
            self.fill(t.snapshot_count as usize + 100, None).await;
        } else {
            self.fill(50, None).await;
        }
        let end = Instant::now() + Duration::from_secs(30);
        while self.sys.running(m) && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let crashed = !self.sys.running(m);
        let at = self.rec.now();
        // The stop and armed restart may have moved leadership already: the crash deposes a
        // leader only if m led when it crashed.
        let led = lock(&self.claims)
            .iter()
            .rev()
            .find(|(t, _)| *t <= at)
            .and_then(|(_, c)| *c)
            .is_some_and(|(i, _)| i == m);
        if !crashed {
            self.sys.kill(m);
        }
        self.sys.restart(m, &[])?;
        Ok(self.record(
            Fault::Failpoint,
            format!(
                "m{m} armed at {point}: {}",
                if crashed {
                    "crashed there"
                } else {
                    "not reached within 30 s (killed)"
                }
            ),
            at,
            led,
        ))
    }

    /// After the campaign: one linearizable read of every register and of the transaction
    /// keys (recorded in the history, so that lost register writes show as violations) and the
    /// appends found.
    async fn final_reads(&self) -> Result<HashSet<String>> {
        let l = self
            .wait_leader_except(None, RECOVERY_BOUND)
            .await
            .context("no leader after healing")?;
        let mut kv = pb::kv_client::KvClient::new(self.sys.channel(l));
        for k in 0..workload::REGISTERS {
            let key = workload::register_key(k);
            let call = self.rec.now();
            let r = kv
                .range(pb::RangeRequest {
                    key: key.clone().into(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            let got = r
                .kvs
                .first()
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
            lock(&self.rec.ops).push(Op {
                client: usize::MAX - k,
                call,
                ret: Some(self.rec.now()),
                keys: vec![key],
                kind: OpKind::Read { got: vec![got] },
            });
        }
        let prefix = b"ack/".to_vec();
        let r = kv
            .range(pb::RangeRequest {
                key: prefix.clone(),
                range_end: rkube_store::mvcc::prefix_end(&prefix),
                keys_only: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok(r.kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect())
    }
}
