//! Pod startup latency, as Kubernetes' SLO defines it: from a pod's creation to its agent
//! reporting it Running, seen through a watch; for N pods created by C concurrent clients on a
//! cluster with agents (`rkube up`'s, or `rkube agent --sim --nodes N`). Kubernetes' SLO: p99
//! at most 5 s (without image pulls).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use super::{new_hist, record, Report};

#[derive(Debug, Clone, Args)]
pub struct PodsBenchArgs {
    /// Pods to create.
    #[arg(long, default_value_t = 1000)]
    pub pods: usize,
    /// Concurrent creating clients.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// The admin kubeconfig (default: DIR/admin.kubeconfig).
    #[arg(long)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The pods' image (with the cri runtime: one the nodes hold, e.g. rkube.local/busybox:1).
    #[arg(long, default_value = "busybox")]
    pub image: String,
    /// Give up after this long.
    #[arg(long, default_value = "10m", value_parser = crate::flags::parse_duration)]
    pub timeout: Duration,
}

pub async fn run(dir: &std::path::Path, args: PodsBenchArgs) -> Result<()> {
    let (client, _) = crate::token::admin_client(&crate::token::TokenArgs {
        kubeconfig: args.kubeconfig.clone(),
        dir: Some(dir.to_path_buf()),
    })
    .await?;
    let ns = format!("bench-pods-{:x}", rand::random::<u32>());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let started: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let running: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    // The watch first, so that no Running is missed.
    let watch = {
        let pods = pods.clone();
        let running = running.clone();
        let want = args.pods;
        tokio::spawn(async move {
            // A watch lasts under 5 minutes (the API's limit): go on from the last version.
            let mut rv = "0".to_string();
            loop {
                let Ok(stream) = pods.watch(&WatchParams::default().timeout(290), &rv).await else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let mut stream = Box::pin(stream);
                while let Some(ev) = stream.next().await {
                    if let Ok(WatchEvent::Added(p) | WatchEvent::Modified(p)) = ev {
                        rv = p.metadata.resource_version.clone().unwrap_or(rv);
                        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                        if phase == Some("Running") {
                            let mut r = running.lock().unwrap_or_else(|e| e.into_inner());
                            r.entry(p.metadata.name.unwrap_or_default())
                                .or_insert_with(Instant::now);
                            if r.len() >= want {
                                return;
                            }
                        }
                    }
                }
            }
        })
    };
    // The watch is open before the first create (a moment for its request to land).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let begin = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut creators = Vec::new();
    for _ in 0..args.clients.max(1) {
        let (pods, started, next, total) = (pods.clone(), started.clone(), next.clone(), args.pods);
        let image = args.image.clone();
        creators.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    return anyhow::Ok(());
                }
                let name = format!("p{i}");
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"bench": "pods"}},
                    "spec": {"terminationGracePeriodSeconds": 1,
                             "containers": [{"name": "c", "image": image, "command": ["sleep", "3600"],
                             "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}]}}))?;
                started
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name, Instant::now());
                pods.create(&PostParams::default(), &pod).await?;
            }
        }));
    }
    for c in creators {
        c.await??;
    }
    let created_in = begin.elapsed();
    let deadline = Instant::now() + args.timeout;
    loop {
        let n = running.lock().unwrap_or_else(|e| e.into_inner()).len();
        if n >= args.pods {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "only {n} of {} pods were Running after {:?}",
                args.pods,
                args.timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_in = begin.elapsed();
    watch.abort();
    let mut hist = new_hist();
    {
        let s = started.lock().unwrap_or_else(|e| e.into_inner());
        let r = running.lock().unwrap_or_else(|e| e.into_inner());
        for (name, t0) in s.iter() {
            if let Some(t1) = r.get(name) {
                record(&mut hist, t1.saturating_duration_since(*t0));
            }
        }
    }
    println!(
        "pod startup: {} pods by {} clients created in {:.1} s, all Running in {:.1} s (Kubernetes SLO: p99 <= 5000 ms)",
        args.pods,
        args.clients,
        created_in.as_secs_f64(),
        all_in.as_secs_f64(),
    );
    Report::new("pod-startup")
        .field("pods", args.pods)
        .field("clients", args.clients)
        .field("all_running_s", all_in.as_secs_f64())
        .latency(&hist)
        .print();
    // Clean up: the namespace and everything in it.
    namespaces.delete(&ns, &DeleteParams::default()).await.ok();
    Ok(())
}
