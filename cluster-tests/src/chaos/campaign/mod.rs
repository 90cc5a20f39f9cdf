//! A seedable randomized campaign: the system under test starts, the clients run, and faults
//! drawn from the chosen kinds are injected one after another until the duration is over;
//! then everything heals, the final state is read, the histories are checked, and every
//! member must hold the same keys and history at one revision (HashKV).

mod inject;
mod summary;
mod verify;

pub use super::faults::{Fault, FaultRecord};
pub use summary::{describe_cut, percentiles, Summary};

use std::collections::HashSet;
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
                Kind::Etcd | Kind::Kubernetes => Vec::new(),
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
                let mut r =
                    FaultRecord::new(fault, format!("could not be injected: {e:#}"), at, false);
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
