//! `rkube bench watch-latency`: N watchers, multiplexed over a number of gRPC watch streams that
//! are spread over a number of connections to all members, watch one key (or a prefix) while a
//! putter writes at a target rate. Each value starts with the wall-clock time it was sent at
//! (microseconds since the Unix epoch, 20 digits); the latency of an event is its receive time
//! minus that send time, recorded once per watcher that receives it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use hdrhistogram::Histogram;
use rkube_store::mvcc::prefix_end;
use rkube_store::proto::etcdserverpb as pb;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::{connect_all, endpoints_for, new_hist, Report, To};
use crate::client::Target;

/// Digits of the send timestamp at the start of every value.
const STAMP: usize = 20;

#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    /// Watchers in all.
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// gRPC watch streams the watchers are multiplexed over.
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
    /// Connections the streams are spread over (round robin over all endpoints).
    #[arg(long, default_value_t = 10)]
    pub connections: usize,
    /// Puts per second the putter aims at.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Seconds the putter runs.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Puts in flight at most; when the cluster is slower, the put rate drops below --rate.
    #[arg(long, default_value_t = 256)]
    pub max_in_flight: usize,
    /// Watch a prefix and put distinct keys under it instead of one key.
    #[arg(long)]
    pub prefix: bool,
    /// With --prefix: distinct keys written under the prefix (round robin).
    #[arg(long, default_value_t = 1000)]
    pub key_space: usize,
    /// Key size in bytes.
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size in bytes (at least 20, the send timestamp).
    #[arg(long, default_value_t = 256)]
    pub val_size: usize,
    /// Seconds to wait for outstanding events after the last put.
    #[arg(long, default_value_t = 10)]
    pub drain: u64,
    /// Members the puts go to.
    #[arg(long, value_enum, default_value = "leader")]
    pub to: To,
}

fn check(args: &WatchArgs) -> Result<()> {
    if args.watchers == 0 {
        bail!("--watchers must be at least 1");
    }
    if args.streams == 0 || args.streams > args.watchers {
        bail!(
            "--streams must be between 1 and --watchers ({})",
            args.watchers
        );
    }
    if args.connections == 0 || args.connections > args.streams {
        bail!(
            "--connections must be between 1 and --streams ({})",
            args.streams
        );
    }
    if args.rate == 0 || args.duration == 0 {
        bail!("--rate and --duration must be at least 1");
    }
    if args.max_in_flight == 0 {
        bail!("--max-in-flight must be at least 1");
    }
    if args.val_size < STAMP {
        bail!("--val-size must be at least {STAMP} (the send timestamp)");
    }
    if args.prefix {
        if args.key_space == 0 {
            bail!("--key-space must be at least 1");
        }
        let digits = (args.key_space - 1).to_string().len();
        if args.key_size < digits + 1 {
            bail!(
                "--key-size {} cannot hold a one-byte prefix and {} distinct keys",
                args.key_size,
                args.key_space
            );
        }
    } else if args.key_size == 0 {
        bail!("--key-size must be at least 1");
    }
    Ok(())
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A value of `size` bytes starting with the current time.
fn stamped_value(size: usize) -> Vec<u8> {
    let mut v = format!("{:0STAMP$}", now_micros()).into_bytes();
    v.resize(size, b'v');
    v
}

fn stamp_of(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value.get(..STAMP)?).ok()?.parse().ok()
}

/// One watch stream carrying `watchers` watches on `key..range_end`. Sends `()` on `ready` once
/// the server confirmed every watch, then records events until `stop` turns true.
async fn watch_stream(
    ch: Channel,
    watchers: usize,
    key: Vec<u8>,
    range_end: Vec<u8>,
    ready: mpsc::Sender<Result<()>>,
    mut stop: watch::Receiver<bool>,
    received: Arc<AtomicU64>,
) -> Result<Histogram<u64>> {
    let (tx, rx) = mpsc::channel(watchers);
    for _ in 0..watchers {
        tx.send(pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key: key.clone(),
                    range_end: range_end.clone(),
                    ..Default::default()
                },
            )),
        })
        .await?;
    }
    let setup = async {
        let mut client = pb::watch_client::WatchClient::new(ch);
        let mut stream = client
            .watch(ReceiverStream::new(rx))
            .await
            .map_err(|s| anyhow::anyhow!("watch: {}", s.message()))?
            .into_inner();
        let mut created = 0;
        while created < watchers {
            let r = stream
                .message()
                .await
                .map_err(|s| anyhow::anyhow!("watch: {}", s.message()))?
                .context("the watch stream ended before every watch was created")?;
            if r.canceled {
                bail!("watch canceled: {}", r.cancel_reason);
            }
            if r.created {
                created += 1;
            }
        }
        anyhow::Ok(stream)
    };
    let mut stream = match setup.await {
        Ok(s) => {
            let _ = ready.send(Ok(())).await;
            s
        }
        Err(e) => {
            let msg = format!("{e:#}");
            let _ = ready.send(Err(e)).await;
            bail!(msg);
        }
    };
    let mut hist = new_hist();
    loop {
        tokio::select! {
            m = stream.message() => {
                let r = m
                    .map_err(|s| anyhow::anyhow!("watch: {}", s.message()))?
                    .context("the watch stream ended")?;
                if r.canceled {
                    bail!("watch canceled: {}", r.cancel_reason);
                }
                let now = now_micros();
                let mut n = 0;
                for e in &r.events {
                    if let Some(sent) = e.kv.as_ref().and_then(|kv| stamp_of(&kv.value)) {
                        hist.saturating_record(now.saturating_sub(sent).max(1));
                        n += 1;
                    }
                }
                received.fetch_add(n, Ordering::Relaxed);
            }
            _ = stop.changed() => break,
        }
    }
    drop(tx);
    Ok(hist)
}

pub async fn run(target: &Target, args: WatchArgs) -> Result<()> {
    check(&args)?;
    let (key, range_end) = if args.prefix {
        (b"w".to_vec(), prefix_end(b"w"))
    } else {
        (vec![b'w'; args.key_size], Vec::new())
    };
    let channels = connect_all(target, &target.endpoints, args.connections).await?;
    let (ready_tx, mut ready_rx) = mpsc::channel(args.streams);
    let (stop_tx, stop_rx) = watch::channel(false);
    let received = Arc::new(AtomicU64::new(0));
    let mut streams = Vec::with_capacity(args.streams);
    for s in 0..args.streams {
        let n = args.watchers / args.streams + usize::from(s < args.watchers % args.streams);
        streams.push(tokio::spawn(watch_stream(
            channels[s % args.connections].clone(),
            n,
            key.clone(),
            range_end.clone(),
            ready_tx.clone(),
            stop_rx.clone(),
            received.clone(),
        )));
    }
    drop(ready_tx);
    let setup_deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for _ in 0..args.streams {
        match tokio::time::timeout_at(setup_deadline, ready_rx.recv()).await {
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(e))) => return Err(e.context("setting up the watchers")),
            Ok(None) => bail!("a watch stream failed while setting up"),
            Err(_) => bail!("the watchers were not all created within 60 s"),
        }
    }

    let put_endpoints = endpoints_for(target, args.to).await?;
    let put_channels = connect_all(target, &put_endpoints, put_endpoints.len()).await?;
    let puts = args.rate * args.duration;
    let in_flight = Arc::new(Semaphore::new(args.max_in_flight));
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate as f64));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut sent = Vec::with_capacity(puts as usize);
    for i in 0..puts as usize {
        ticker.tick().await;
        let permit = in_flight.clone().acquire_owned().await?;
        let mut kv = pb::kv_client::KvClient::new(put_channels[i % put_channels.len()].clone());
        let key = if args.prefix {
            format!("w{:0w$}", i % args.key_space, w = args.key_size - 1).into_bytes()
        } else {
            key.clone()
        };
        let val_size = args.val_size;
        sent.push(tokio::spawn(async move {
            let r = kv
                .put(pb::PutRequest {
                    key,
                    value: stamped_value(val_size),
                    ..Default::default()
                })
                .await;
            drop(permit);
            r.map(|_| ()).map_err(|s| s.message().to_string())
        }));
    }
    let (mut ok, mut first_error) = (0u64, None);
    for t in sent {
        match t.await? {
            Ok(()) => ok += 1,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let put_elapsed = started.elapsed();

    // Every successful put is one event for each watcher.
    let expected = ok * args.watchers as u64;
    let drain_deadline = Instant::now() + Duration::from_secs(args.drain);
    while received.load(Ordering::Relaxed) < expected && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_tx.send(true)?;
    let mut hist = new_hist();
    for s in streams {
        hist.add(&s.await??)?;
    }
    let r = Report::new("watch-latency")
        .field("watchers", args.watchers)
        .field("streams", args.streams)
        .field("connections", args.connections)
        .field("target_rate", args.rate)
        .field("puts", ok)
        .field("put_errors", puts - ok)
        .field("put_rate", ok as f64 / put_elapsed.as_secs_f64())
        .field("events", hist.len())
        .field("events_expected", expected)
        .latency(&hist);
    match first_error {
        Some(e) => r.field("first_error", e),
        None => r,
    }
    .print();
    Ok(())
}
