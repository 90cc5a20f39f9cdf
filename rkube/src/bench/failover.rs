//! `rkube bench failover`: finds the leader, writes continuously to the other members, SIGKILLs
//! the leader's process and measures the time from the kill to the first successful write that
//! was sent after it. Between rounds a given shell command restarts the killed member and the
//! tool waits until every member takes writes again.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use hdrhistogram::Histogram;
use rkube_store::proto::etcdserverpb as pb;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{connect_all, leader_of, new_hist, record, statuses, Report};
use crate::client::Target;

#[derive(Debug, Clone, Args)]
pub struct FailoverArgs {
    /// ENDPOINT=PIDFILE for every member, comma-separated; the pid file is read again each round,
    /// so a restarted member is found by its new pid.
    #[arg(long, value_delimiter = ',', required = true)]
    pub pid_files: Vec<String>,
    /// Leader kills.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Shell command (sh -c) that restarts the killed member between rounds. It gets
    /// RKUBE_BENCH_ENDPOINT and RKUBE_BENCH_PIDFILE of that member in its environment.
    #[arg(long)]
    pub restart: Option<String>,
    /// Milliseconds between write attempts (each attempt is sent without waiting for earlier ones).
    #[arg(long, default_value_t = 10)]
    pub interval_ms: u64,
    /// Seconds to wait for a write to succeed after the kill, and for the cluster to be whole
    /// again after a restart.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Seconds to let a restarted member catch up before the next round.
    #[arg(long, default_value_t = 3)]
    pub settle: u64,
}

/// `https://127.0.0.1:2379` and `127.0.0.1:2379` name the same member.
fn host_port(endpoint: &str) -> &str {
    endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest)
        .trim_end_matches('/')
}

/// The pid file of each of the target's endpoints, in the target's order.
fn pid_files(target: &Target, args: &FailoverArgs) -> Result<Vec<PathBuf>> {
    let mut map = Vec::new();
    for entry in &args.pid_files {
        let (ep, file) = entry
            .split_once('=')
            .with_context(|| format!("--pid-files entry {entry:?} is not ENDPOINT=PIDFILE"))?;
        if !target
            .endpoints
            .iter()
            .any(|e| host_port(e) == host_port(ep))
        {
            bail!("--pid-files names {ep}, which is not among the endpoints");
        }
        map.push((host_port(ep).to_string(), PathBuf::from(file)));
    }
    target
        .endpoints
        .iter()
        .map(|e| {
            map.iter()
                .find(|(ep, _)| ep == host_port(e))
                .map(|(_, f)| f.clone())
                .with_context(|| format!("--pid-files has no pid file for endpoint {e}"))
        })
        .collect()
}

/// The pid in `file`, if that process runs (and is not a zombie).
fn running_pid(file: &PathBuf) -> Result<i32> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read pid file {}", file.display()))?;
    let pid: i32 = text
        .trim()
        .parse()
        .with_context(|| format!("pid file {} holds no pid", file.display()))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the parenthesized command name: "PID (comm) S ...".
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.trim_start().chars().next());
    match state {
        Some('Z' | 'X') | None => bail!("pid {pid} from {} is not running", file.display()),
        Some(_) => Ok(pid),
    }
}

/// Waits until a member leads and a put through every endpoint succeeds.
async fn wait_whole(target: &Target, timeout: Duration) -> Result<usize> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        match whole(target).await {
            Ok(leader) => return Ok(leader),
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!(
        "the cluster did not take writes on every member within {} s: {last}",
        timeout.as_secs()
    )
}

async fn whole(target: &Target) -> Result<usize> {
    let leader = leader_of(target, &statuses(target).await)?;
    for e in &target.endpoints {
        let mut kv = pb::kv_client::KvClient::new(target.channel_to(e)?);
        let mut req = tonic::Request::new(put_request());
        req.set_timeout(Duration::from_secs(2));
        kv.put(req)
            .await
            .map_err(|s| anyhow::anyhow!("{e}: {}", s.message()))?;
    }
    Ok(leader)
}

fn put_request() -> pb::PutRequest {
    pb::PutRequest {
        key: b"failover".to_vec(),
        value: vec![b'v'; 256],
        ..Default::default()
    }
}

/// What one round measured.
struct Round {
    /// From the kill to the first successful write sent after it.
    took: Duration,
    /// The endpoint that write went through.
    by: String,
    /// Wall-clock time of the kill, to line up with the members' logs.
    killed_at: chrono::DateTime<chrono::Utc>,
}

async fn round(target: &Target, leader: usize, pid: i32, args: &FailoverArgs) -> Result<Round> {
    let others: Vec<String> = (0..target.endpoints.len())
        .filter(|&i| i != leader)
        .map(|i| target.endpoints[i].clone())
        .collect();
    if others.is_empty() {
        bail!("a one-member cluster has no member left to write to after the kill");
    }
    let channels = connect_all(target, &others, others.len()).await?;
    let timeout = Duration::from_secs(args.timeout);
    let (ok_tx, mut ok_rx) = mpsc::unbounded_channel::<(Instant, Instant, usize)>();
    let mut attempts = JoinSet::new();
    let mut ticker = tokio::time::interval(Duration::from_millis(args.interval_ms.max(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // Write for half a second before the kill, so the kill lands amid a steady stream.
    let kill_at = tokio::time::Instant::now() + Duration::from_millis(500);
    let mut killed: Option<Instant> = None;
    let mut killed_at = chrono::Utc::now();
    let mut n = 0usize;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                if killed.is_none() && tokio::time::Instant::now() >= kill_at {
                    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
                        bail!("cannot SIGKILL pid {pid}: {}", std::io::Error::last_os_error());
                    }
                    killed = Some(Instant::now());
                    killed_at = chrono::Utc::now();
                }
                if let Some(k) = killed {
                    if k.elapsed() > timeout {
                        bail!("no write succeeded within {} s after the leader was killed", args.timeout);
                    }
                }
                let which = n % channels.len();
                n += 1;
                let mut kv = pb::kv_client::KvClient::new(channels[which].clone());
                let ok_tx = ok_tx.clone();
                attempts.spawn(async move {
                    let sent = Instant::now();
                    let mut req = tonic::Request::new(put_request());
                    req.set_timeout(timeout);
                    if kv.put(req).await.is_ok() {
                        let _ = ok_tx.send((sent, Instant::now(), which));
                    }
                });
            }
            Some((sent, done, which)) = ok_rx.recv() => {
                if let Some(k) = killed {
                    if sent >= k {
                        // Dropping the JoinSet aborts the attempts still in flight.
                        attempts.abort_all();
                        return Ok(Round { took: done - k, by: others[which].clone(), killed_at });
                    }
                }
            }
            Some(_) = attempts.join_next(), if !attempts.is_empty() => {}
        }
    }
}

pub async fn run(target: &Target, args: FailoverArgs) -> Result<()> {
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if args.rounds > 1 && args.restart.is_none() {
        bail!("--rounds above 1 needs --restart (a command that restarts the killed member)");
    }
    let files = pid_files(target, &args)?;
    for f in &files {
        running_pid(f)?;
    }
    let timeout = Duration::from_secs(args.timeout);
    let mut hist: Histogram<u64> = new_hist();
    let mut rounds_ms = Vec::new();
    for r in 1..=args.rounds {
        let leader = wait_whole(target, timeout).await?;
        let pid = running_pid(&files[leader])?;
        let Round {
            took,
            by,
            killed_at,
        } = round(target, leader, pid, &args).await?;
        record(&mut hist, took);
        rounds_ms.push((took.as_secs_f64() * 100_000.0).round() / 100.0);
        println!(
            "round {r}: killed the leader {} (pid {pid}) at {}; first write after the kill succeeded through {by} after {:.1} ms",
            target.endpoints[leader],
            killed_at.format("%H:%M:%S%.3f UTC"),
            took.as_secs_f64() * 1000.0
        );
        if let Some(cmd) = &args.restart {
            let status = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .env("RKUBE_BENCH_ENDPOINT", &target.endpoints[leader])
                .env("RKUBE_BENCH_PIDFILE", &files[leader])
                .status()
                .await
                .context("cannot run the --restart command")?;
            if !status.success() {
                bail!("the --restart command failed ({status})");
            }
            let deadline = Instant::now() + timeout;
            while running_pid(&files[leader]).map_or(true, |p| p == pid) {
                if Instant::now() > deadline {
                    bail!(
                        "after --restart, {} names no running process",
                        files[leader].display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            wait_whole(target, timeout).await?;
            tokio::time::sleep(Duration::from_secs(args.settle)).await;
        }
    }
    Report::new("failover")
        .field("rounds", args.rounds)
        .field("rounds_ms", rounds_ms)
        .field("interval_ms", args.interval_ms)
        .latency(&hist)
        .print();
    Ok(())
}
