//! `rkube bench put`: put throughput and latency percentiles against a cluster, with N
//! concurrent clients each on its own connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use hdrhistogram::Histogram;
use rkube_store::proto::etcdserverpb as pb;
use tokio::sync::Mutex;

use crate::client::Target;

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Concurrent clients.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Total puts.
    #[arg(long, default_value_t = 10_000)]
    pub total: usize,
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    #[arg(long, default_value_t = 256)]
    pub val_size: usize,
    /// Distinct keys written (round robin).
    #[arg(long, default_value_t = 100_000)]
    pub key_space: usize,
}

pub async fn put(target: &Target, args: BenchArgs) -> Result<()> {
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let value = vec![b'v'; args.val_size];
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        // Each client on its own connection, spread over the endpoints (followers forward).
        let endpoint = &target.endpoints[c % target.endpoints.len()];
        let mut kv = pb::kv_client::KvClient::new(target.channel_to(endpoint)?);
        let (hist, next, value, args) = (hist.clone(), next.clone(), value.clone(), args.clone());
        tasks.push(tokio::spawn(async move {
            let mut local = Histogram::<u64>::new(3)?;
            let mut errors = 0usize;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= args.total {
                    break;
                }
                let key =
                    format!("{:0width$}", i % args.key_space, width = args.key_size).into_bytes();
                let t = Instant::now();
                match kv
                    .put(pb::PutRequest {
                        key,
                        value: value.clone(),
                        ..Default::default()
                    })
                    .await
                {
                    Ok(_) => local.record(t.elapsed().as_micros() as u64)?,
                    Err(_) => errors += 1,
                }
            }
            hist.lock().await.add(&local)?;
            anyhow::Ok(errors)
        }));
    }
    let mut errors = 0;
    for t in tasks {
        errors += t.await??;
    }
    let elapsed = started.elapsed();
    let h = hist.lock().await;
    let ms = |us: u64| Duration::from_micros(us).as_secs_f64() * 1000.0;
    println!(
        "clients={} total={} errors={} elapsed={:.2}s throughput={:.0} puts/s p50={:.2}ms p99={:.2}ms max={:.2}ms",
        args.clients,
        h.len(),
        errors,
        elapsed.as_secs_f64(),
        h.len() as f64 / elapsed.as_secs_f64(),
        ms(h.value_at_quantile(0.50)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
    );
    Ok(())
}
