//! `rkube bench`: load generators that speak only the etcd v3 API, so the same binary drives an
//! rkube cluster and an etcd cluster: `put`, `range`, `watch-latency` and `failover`; `api`
//! drives a local cluster's Kubernetes API and `scheduler` the scheduler's decisions in process.
//!
//! Every workload prints a human line and then one `BENCH_JSON {...}` line with the same figures
//! for scripts (cluster-tests/bench/vs-etcd.sh turns those into tables). Latencies are recorded
//! in microseconds in an HDR histogram; the percentile and summary code lives here, once.

mod api;
mod failover;
mod kv;
mod pods;
mod scheduler;
mod watch;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use rkube_store::proto::etcdserverpb as pb;
use serde_json::Value;
use tonic::transport::Channel;

use crate::client::Target;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Put throughput and latency, N clients in a closed loop.
    Put(kv::PutArgs),
    /// Range (get of one key) throughput and latency, linearizable or serializable.
    Range(kv::RangeArgs),
    /// Latency from a put being sent to its event reaching each of many watchers.
    WatchLatency(watch::WatchArgs),
    /// Time from SIGKILL of the leader to the first successful write on another member.
    Failover(failover::FailoverArgs),
    /// The Kubernetes API of a local cluster (--dir): pod create/get/list/delete with
    /// concurrent clients, a large LIST, and watch event delivery to many watchers.
    Api(api::ApiBenchArgs),
    /// The scheduler's decisions in process (no cluster): N nodes, P pending pods.
    Scheduler(scheduler::SchedulerBenchArgs),
    /// Pod startup latency (create to Running) on a local cluster's agents (--dir).
    Pods(pods::PodsBenchArgs),
}

pub async fn run(cluster: &crate::client::ClusterArgs, cmd: BenchCommand) -> Result<()> {
    let cmd = match cmd {
        BenchCommand::Scheduler(args) => return scheduler::run(args),
        other => other,
    };
    if let BenchCommand::Pods(args) = cmd {
        let dir = cluster
            .dir
            .clone()
            .unwrap_or_else(|| std::path::PathBuf::from(crate::up::DEFAULT_DIR));
        return pods::run(&dir, args).await;
    }
    if let BenchCommand::Api(args) = cmd {
        let dir = cluster
            .dir
            .clone()
            .unwrap_or_else(|| std::path::PathBuf::from(crate::up::DEFAULT_DIR));
        return api::run(&dir, args).await;
    }
    let target = &cluster.resolve()?;
    match cmd {
        BenchCommand::Api(_) | BenchCommand::Scheduler(_) | BenchCommand::Pods(_) => {
            unreachable!("handled above")
        }
        BenchCommand::Put(args) => kv::put(target, args).await,
        BenchCommand::Range(args) => kv::range(target, args).await,
        BenchCommand::WatchLatency(args) => watch::run(target, args).await,
        BenchCommand::Failover(args) => failover::run(target, args).await,
    }
}

/// Which members a workload sends its requests to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum To {
    /// Only the current leader (found with Maintenance.Status).
    Leader,
    /// Every endpoint given, round robin over connections.
    All,
}

/// The endpoints a workload uses.
async fn endpoints_for(target: &Target, to: To) -> Result<Vec<String>> {
    Ok(match to {
        To::All => target.endpoints.clone(),
        To::Leader => {
            let statuses = statuses(target).await;
            vec![target.endpoints[leader_of(target, &statuses)?].clone()]
        }
    })
}

/// Maintenance.Status of every endpoint (an error per endpoint that does not answer in 2 s).
async fn statuses(target: &Target) -> Vec<Result<pb::StatusResponse>> {
    let asks = target.endpoints.iter().map(|e| async move {
        let mut m = pb::maintenance_client::MaintenanceClient::new(target.channel_to(e)?);
        let mut req = tonic::Request::new(pb::StatusRequest {});
        req.set_timeout(Duration::from_secs(2));
        match tokio::time::timeout(Duration::from_secs(2), m.status(req)).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => bail!("{e}: {}", s.message()),
            Err(_) => bail!("{e}: no answer within 2 s"),
        }
    });
    futures::future::join_all(asks).await
}

/// The index of the endpoint whose member reports itself as the leader.
fn leader_of(target: &Target, statuses: &[Result<pb::StatusResponse>]) -> Result<usize> {
    let mut problems = Vec::new();
    for (i, s) in statuses.iter().enumerate() {
        match s {
            Ok(s) => {
                let id = s.header.as_ref().map_or(0, |h| h.member_id);
                if s.leader != 0 && s.leader == id {
                    return Ok(i);
                }
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    bail!(
        "none of {} reports itself as the leader{}",
        target.endpoints.join(","),
        if problems.is_empty() {
            String::new()
        } else {
            format!(" ({})", problems.join("; "))
        }
    )
}

/// Connected channels, `count` of them, spread round robin over `endpoints`. Each is proven
/// with a Status call so that connection and TLS handshake time stays out of the measurement.
async fn connect_all(target: &Target, endpoints: &[String], count: usize) -> Result<Vec<Channel>> {
    let channels: Vec<Channel> = (0..count)
        .map(|i| target.channel_to(&endpoints[i % endpoints.len()]))
        .collect::<Result<_>>()?;
    let probes = channels.iter().enumerate().map(|(i, ch)| {
        let ch = ch.clone();
        let endpoint = endpoints[i % endpoints.len()].clone();
        async move {
            let mut m = pb::maintenance_client::MaintenanceClient::new(ch);
            let mut req = tonic::Request::new(pb::StatusRequest {});
            req.set_timeout(Duration::from_secs(5));
            m.status(req)
                .await
                .map_err(|s| anyhow::anyhow!("{endpoint}: {}", s.message()))
        }
    });
    for r in futures::future::join_all(probes).await {
        r.context("cannot reach an endpoint")?;
    }
    Ok(channels)
}

/// A latency histogram in microseconds, 1 µs to 1 h, 3 significant digits.
fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant histogram bounds are valid")
}

fn record(hist: &mut Histogram<u64>, d: Duration) {
    hist.saturating_record((d.as_micros() as u64).max(1));
}

/// `n` as a zero-padded decimal key of exactly `size` bytes.
fn key_of(n: usize, size: usize) -> Vec<u8> {
    format!("{n:0size$}").into_bytes()
}

/// Checks that `count` distinct keys fit in `size` decimal digits.
fn check_key_space(count: usize, size: usize) -> Result<()> {
    if count == 0 {
        bail!("the key count must be at least 1");
    }
    if size == 0 {
        bail!("--key-size must be at least 1");
    }
    let digits = (count - 1).to_string().len();
    if digits > size {
        bail!("{count} distinct keys need {digits}-byte keys, but --key-size is {size}");
    }
    Ok(())
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn ms(us: u64) -> f64 {
    round2(us as f64 / 1000.0)
}

/// One workload's result: printed as `workload k=v ...` and as `BENCH_JSON {...}`.
pub struct Report {
    workload: &'static str,
    fields: Vec<(&'static str, Value)>,
}

impl Report {
    fn new(workload: &'static str) -> Self {
        Report {
            workload,
            fields: Vec::new(),
        }
    }

    fn field(mut self, name: &'static str, v: impl Into<Value>) -> Self {
        let v = v.into();
        let v = match v.as_f64() {
            Some(f) if v.is_f64() => Value::from(round2(f)),
            _ => v,
        };
        self.fields.push((name, v));
        self
    }

    /// Ops per second over `elapsed`.
    fn throughput(self, ops: u64, elapsed: Duration) -> Self {
        self.field("elapsed_s", elapsed.as_secs_f64())
            .field("throughput", ops as f64 / elapsed.as_secs_f64().max(1e-9))
    }

    /// p50, p99 and max of a histogram in milliseconds (null when it holds no samples).
    fn latency(self, hist: &Histogram<u64>) -> Self {
        let q = |q: f64| {
            if hist.is_empty() {
                Value::Null
            } else {
                Value::from(ms(hist.value_at_quantile(q)))
            }
        };
        let max = if hist.is_empty() {
            Value::Null
        } else {
            Value::from(ms(hist.max()))
        };
        self.field("samples", hist.len())
            .field("p50_ms", q(0.50))
            .field("p99_ms", q(0.99))
            .field("max_ms", max)
    }

    fn print(&self) {
        let human: Vec<String> = self
            .fields
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                v => format!("{k}={v}"),
            })
            .collect();
        println!("{}: {}", self.workload, human.join(" "));
        let mut json = serde_json::Map::new();
        json.insert("workload".into(), Value::from(self.workload));
        for (k, v) in &self.fields {
            json.insert((*k).into(), v.clone());
        }
        println!("BENCH_JSON {}", Value::Object(json));
    }
}
