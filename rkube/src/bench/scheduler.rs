//! `rkube bench scheduler`: the scheduler's decisions in process, without the API — N nodes,
//! P pending pods of a few Deployments (owned, so spread by default), each scheduled against
//! the scheduler's incremental cache with the default profile and counted on its node, as the
//! runner does between a decision and its binding. It measures the framework and its plugins;
//! binding through the API is measured by the `api` workload's writes.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use hdrhistogram::Histogram;
use rand::SeedableRng;
use rkube_scheduler::cache::Cache;
use rkube_scheduler::framework::schedule_from;
use serde_json::json;

#[derive(Debug, Args)]
pub struct SchedulerBenchArgs {
    /// Nodes (32 CPUs, 64Gi, 110 pods each, in 10 zones).
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// Pending pods (100m CPU, 128Mi each), of 100 Deployments.
    #[arg(long, default_value_t = 10_000)]
    pub pods: usize,
}

pub fn run(args: SchedulerBenchArgs) -> Result<()> {
    let mut cache = Cache::default();
    for i in 0..args.nodes {
        cache.set_node(Arc::new(serde_json::from_value(json!({
            "metadata": {"name": format!("node-{i}"), "labels": {
                "kubernetes.io/hostname": format!("node-{i}"),
                "topology.kubernetes.io/zone": format!("zone-{}", i % 10)}},
            "status": {"allocatable": {"cpu": "32", "memory": "64Gi", "pods": "110"}},
        }))?));
    }
    let profile = rkube_scheduler::plugins::default_profile();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut latency = Histogram::<u64>::new(3)?;
    let started = Instant::now();
    let mut unschedulable = 0;
    for i in 0..args.pods {
        let app = format!("bench-{}", i % 100);
        let pod = Arc::new(serde_json::from_value(json!({
            "metadata": {"name": format!("{app}-{i}"), "namespace": "default",
                         "labels": {"app": app},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                              "name": app, "uid": app, "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "nginx",
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
        }))?);
        let t = Instant::now();
        let mut start = cache.next_start;
        let decision = schedule_from(&profile, &pod, &cache.nodes, &mut rng, &mut start);
        cache.next_start = start;
        match decision {
            Ok(node) => cache.place(&format!("default/{app}-{i}"), &node, pod),
            Err(_) => unschedulable += 1,
        }
        latency.record(t.elapsed().as_micros() as u64)?;
    }
    let elapsed = started.elapsed();
    let rate = args.pods as f64 / elapsed.as_secs_f64();
    let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "scheduler: {} nodes, {} pods: {:.0} pods/s, p50 {:.2} ms, p99 {:.2} ms per decision, {} unschedulable, {:.1} s",
        args.nodes,
        args.pods,
        rate,
        ms(0.5),
        ms(0.99),
        unschedulable,
        elapsed.as_secs_f64()
    );
    println!(
        "BENCH_JSON {}",
        json!({"workload": "scheduler", "nodes": args.nodes, "pods": args.pods,
               "pods_per_s": rate, "p50_ms": ms(0.5), "p99_ms": ms(0.99),
               "unschedulable": unschedulable})
    );
    Ok(())
}
