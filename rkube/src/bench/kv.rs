//! `rkube bench put` and `rkube bench range`: N clients in a closed loop (each sends its next
//! request when the previous one answered) until a total count is done.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use futures::future::BoxFuture;
use hdrhistogram::Histogram;
use pb::kv_client::KvClient;
use rkube_store::proto::etcdserverpb as pb;
use tonic::transport::Channel;

use super::{check_key_space, connect_all, endpoints_for, key_of, new_hist, record, Report, To};
use crate::client::Target;

/// Settings shared by the closed-loop workloads.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Concurrent clients.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Connections the clients share (default: one per client).
    #[arg(long)]
    pub conns: Option<usize>,
    /// Total requests.
    #[arg(long, default_value_t = 10_000)]
    pub total: usize,
    /// Key size in bytes (zero-padded decimal numbers).
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256)]
    pub val_size: usize,
}

#[derive(Debug, Clone, Args)]
pub struct PutArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Distinct keys written (round robin).
    #[arg(long, default_value_t = 100_000)]
    pub key_space: usize,
    /// Members the puts go to.
    #[arg(long, value_enum, default_value = "leader")]
    pub to: To,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Consistency {
    /// Linearizable: the member confirms it is up to date with the leader before answering.
    #[value(name = "l")]
    Linearizable,
    /// Serializable: the member answers from its local state.
    #[value(name = "s")]
    Serializable,
}

#[derive(Debug, Clone, Args)]
pub struct RangeArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// l (linearizable) or s (serializable).
    #[arg(long, value_enum, default_value = "l")]
    pub consistency: Consistency,
    /// Keys to read from, each read gets one of them; they are written first unless --no-preload.
    #[arg(long, default_value_t = 10_000)]
    pub keys: usize,
    /// The keys already exist (an earlier run wrote them with the same --keys and sizes).
    #[arg(long)]
    pub no_preload: bool,
    /// Members the reads go to.
    #[arg(long, value_enum, default_value = "all")]
    pub to: To,
}

/// One request of a closed loop: given a KV client and the request's sequence number.
type Op = Arc<
    dyn Fn(KvClient<Channel>, usize) -> BoxFuture<'static, Result<(), tonic::Status>> + Send + Sync,
>;

struct Outcome {
    hist: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
    elapsed: Duration,
}

impl Outcome {
    fn report(&self, workload: &'static str, load: &LoadArgs, conns: usize) -> Report {
        let r = Report::new(workload)
            .field("clients", load.clients)
            .field("conns", conns)
            .field("total", load.total)
            .field("errors", self.errors)
            .throughput(self.hist.len(), self.elapsed)
            .latency(&self.hist);
        match &self.first_error {
            Some(e) => r.field("first_error", e.clone()),
            None => r,
        }
    }
}

fn check_load(load: &LoadArgs) -> Result<usize> {
    if load.clients == 0 {
        bail!("--clients must be at least 1");
    }
    if load.total == 0 {
        bail!("--total must be at least 1");
    }
    match load.conns {
        Some(0) => bail!("--conns must be at least 1"),
        Some(c) if c > load.clients => {
            bail!("--conns {c} is more than --clients {}", load.clients)
        }
        Some(c) => Ok(c),
        None => Ok(load.clients),
    }
}

/// Runs `op` `total` times from `clients` concurrent clients over `conns` connections.
async fn closed_loop(
    target: &Target,
    endpoints: &[String],
    clients: usize,
    conns: usize,
    total: usize,
    op: Op,
) -> Result<Outcome> {
    let channels = connect_all(target, endpoints, conns).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for c in 0..clients {
        let kv = KvClient::new(channels[c % conns].clone());
        let (next, op) = (next.clone(), op.clone());
        tasks.push(tokio::spawn(async move {
            let mut hist = new_hist();
            let (mut errors, mut first_error) = (0u64, None);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let t = Instant::now();
                match op(kv.clone(), i).await {
                    Ok(()) => record(&mut hist, t.elapsed()),
                    Err(s) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| s.message().to_string());
                    }
                }
            }
            (hist, errors, first_error)
        }));
    }
    let mut out = Outcome {
        hist: new_hist(),
        errors: 0,
        first_error: None,
        elapsed: Duration::ZERO,
    };
    for t in tasks {
        let (hist, errors, first_error) = t.await?;
        out.hist.add(&hist)?;
        out.errors += errors;
        if out.first_error.is_none() {
            out.first_error = first_error;
        }
    }
    out.elapsed = started.elapsed();
    Ok(out)
}

/// Puts `value` under key number `i % key_space`.
fn put_op(key_space: usize, key_size: usize, value: Vec<u8>) -> Op {
    let value = Arc::new(value);
    Arc::new(move |mut kv, i| {
        let key = key_of(i % key_space, key_size);
        let value = value.to_vec();
        Box::pin(async move {
            kv.put(pb::PutRequest {
                key,
                value,
                ..Default::default()
            })
            .await
            .map(|_| ())
        })
    })
}

pub async fn put(target: &Target, args: PutArgs) -> Result<()> {
    let conns = check_load(&args.load)?;
    check_key_space(args.key_space, args.load.key_size)?;
    let endpoints = endpoints_for(target, args.to).await?;
    let load = &args.load;
    let op = put_op(args.key_space, load.key_size, vec![b'v'; load.val_size]);
    let out = closed_loop(target, &endpoints, load.clients, conns, load.total, op).await?;
    out.report("put", load, conns)
        .field("key_size", load.key_size)
        .field("val_size", load.val_size)
        .field("to", endpoints.join(","))
        .print();
    Ok(())
}

pub async fn range(target: &Target, args: RangeArgs) -> Result<()> {
    let conns = check_load(&args.load)?;
    check_key_space(args.keys, args.load.key_size)?;
    let load = &args.load;
    if !args.no_preload {
        // Written through the leader by 16 clients; not part of the measurement.
        let leader = endpoints_for(target, To::Leader).await?;
        let writers = 16.min(args.keys);
        let op = put_op(args.keys, load.key_size, vec![b'v'; load.val_size]);
        let out = closed_loop(target, &leader, writers, writers, args.keys, op).await?;
        if out.errors > 0 {
            bail!(
                "preloading {} keys: {} puts failed (first: {})",
                args.keys,
                out.errors,
                out.first_error.unwrap_or_default()
            );
        }
        println!(
            "preloaded {} keys of {} + {} bytes in {:.1}s",
            args.keys,
            load.key_size,
            load.val_size,
            out.elapsed.as_secs_f64()
        );
    }
    let endpoints = endpoints_for(target, args.to).await?;
    let serializable = args.consistency == Consistency::Serializable;
    let (keys, key_size) = (args.keys, load.key_size);
    let op: Op = Arc::new(move |mut kv, i| {
        // A spread-out but reproducible key order (Fibonacci hashing of the sequence number).
        let spread = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 1;
        let key = key_of((spread % keys as u64) as usize, key_size);
        Box::pin(async move {
            let r = kv
                .range(pb::RangeRequest {
                    key,
                    serializable,
                    ..Default::default()
                })
                .await?
                .into_inner();
            if r.kvs.len() == 1 {
                Ok(())
            } else {
                Err(tonic::Status::not_found(
                    "key not found (were the keys preloaded with the same --keys and --key-size?)",
                ))
            }
        })
    });
    let out = closed_loop(target, &endpoints, load.clients, conns, load.total, op).await?;
    out.report("range", load, conns)
        .field(
            "consistency",
            if serializable {
                "serializable"
            } else {
                "linearizable"
            },
        )
        .field("keys", args.keys)
        .field("key_size", load.key_size)
        .field("val_size", load.val_size)
        .field("to", endpoints.join(","))
        .print();
    Ok(())
}
