//! The Kubernetes-level chaos campaign: an `rkube up` cluster (three servers, two simulated
//! agents) serves Kubernetes clients while, from a seed, its leader is killed or paused past
//! the election timeout, a random member is killed, or two of the three are killed (quorum
//! loss) and brought back; checkers judge what the clients saw.
//!
//! The clients, each on one member's API or the control-plane endpoint (the admin kubeconfig's
//! current context) and moving to the next when it fails:
//! - writers that race on shared ConfigMaps with read-modify-write updates, every update
//!   carrying the resourceVersion it read, and that create, list and delete ConfigMaps of their
//!   own; every write carries a unique token in its data;
//! - watchers that list, watch from the list's resourceVersion, resume from the newest version
//!   they saw (on another member when theirs failed), and list again only after a 410 Gone;
//! - a Deployment (rolling update, maxSurge 25%, maxUnavailable 0) whose image changes during
//!   the faults, and a watcher of its pods.
//!
//! The checks (see [`Violation`]): an update succeeds only from the current resourceVersion
//! (its new version is newer, no two succeed from one version, a write answered 409 never
//! shows up, and an explicit update from a known old version is 409); quorum reads are never
//! older than an acknowledged write and a client's lists never go back; watch events come in
//! resourceVersion order, once, and a watch delivers every acknowledged write in the range it
//! covered, so a resumed watch either continues without a gap or says 410 Gone (explicitly: a
//! watch and a continue token from before a compaction are 410); nothing is acknowledged
//! without quorum; no pod changes node once bound; the Deployment's pods never outnumber
//! replicas + maxSurge; after the faults the Deployment converges.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use futures::FutureExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::PostParams;
use kube::Api;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::system::Kind;
use crate::{Cluster, Options};

mod deployment;
mod inject;
mod shared;
mod summary;
mod violation;
mod watchers;
mod writer;

pub use super::faults::{Fault, FaultRecord};
pub use deployment::resolve_surge;
pub use summary::{Explicit, K8sSummary, Requests};
pub use violation::Violation;

use deployment::{converge, deployment, roll, Pods};
use inject::Chaos;
use shared::{clients, configmap, lock, until_ok, Cursor, History, Shared, Stats};
use watchers::{gaps, Follower, Tokens};
use writer::Writer;

/// The namespace the campaign's objects live in.
const NS: &str = "chaos-k8s";
/// Label (`app=`) of the ConfigMaps the writers write and the watchers watch.
const CM_APP: &str = "chaos-cm";
/// Label of the objects the explicit 410 checks list, watch and compact past.
const GONE_APP: &str = "chaos-gone";
/// Label of the objects written to see whether the API serves writes.
const PING_APP: &str = "chaos-ping";
/// Label of the Deployment's pods.
const WEB_APP: &str = "chaos-web";
const REPLICAS: i32 = 6;
const MAX_SURGE: &str = "25%";

/// Servers of the campaign's cluster; the clients' index SERVERS is the control-plane endpoint.
const SERVERS: usize = 3;
const WRITERS: usize = 3;
const WATCHERS: usize = 3;
/// ConfigMaps every writer updates, so that they race.
const SHARED_OBJECTS: usize = 2;

/// How long one request may take before the client gives up on its member.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// A watch silent for this long (bookmarks come every 5 s) is resumed on another member.
const WATCH_IDLE: Duration = Duration::from_secs(12);
/// How long the API may take to serve again after a fault.
const RECOVERY_BOUND: Duration = Duration::from_secs(60);
/// How long the Deployment may take to converge, before the faults and after them.
const CONVERGE_BOUND: Duration = Duration::from_secs(120);
/// How long the watchers may take after the faults to deliver the last acknowledged write.
const CATCH_UP_BOUND: Duration = Duration::from_secs(60);
/// How long the leader stays paused (beyond the 1 s election timeout).
const PAUSE_FOR: Duration = Duration::from_secs(4);
/// How long two of three members stay down.
const QUORUM_LOSS_FOR: Duration = Duration::from_secs(3);
/// Descriptions kept per kind of violation.
const DESCRIBED: usize = 5;

/// Runs the campaign: `duration` of faults from `seed`, then the checks. Err only when the
/// cluster could not be set up at all.
pub async fn campaign(seed: u64, duration: Duration) -> Result<K8sSummary> {
    campaign_with(seed, duration, &Fault::all_for(Kind::Kubernetes)).await
}

/// [`campaign`] drawing from `kinds` alone; Err when one does not apply to a Kubernetes
/// cluster or there is none.
pub async fn campaign_with(seed: u64, duration: Duration, kinds: &[Fault]) -> Result<K8sSummary> {
    if let Some(f) = kinds.iter().find(|f| !f.applies(Kind::Kubernetes)) {
        let all: Vec<&str> = Fault::all_for(Kind::Kubernetes)
            .iter()
            .map(|f| f.name())
            .collect();
        bail!(
            "{} does not apply to the Kubernetes campaign; its faults are {}",
            f.name(),
            all.join(", ")
        );
    }
    if kinds.is_empty() {
        bail!("no fault to draw from");
    }
    // Building the binary is no part of the campaign's time.
    crate::rkube_bin();
    let started = Instant::now();
    let c = Cluster::start(Options {
        servers: SERVERS,
        kubernetes_api: true,
        agents: 2,
        // The leader's own compaction too, so that a watcher left behind meets 410.
        up_args: vec!["--compaction-interval".into(), "15s".into()],
        ..Options::default()
    })
    .await?;
    let shared = Arc::new(Shared {
        clients: clients(&c).await?,
        stats: Stats::default(),
        other_errors: Mutex::new(Vec::new()),
        found: Mutex::new(BTreeMap::new()),
        history: Mutex::new(History::default()),
        newest_acked: AtomicI64::new(0),
    });
    let n = shared.clients.len();

    // The namespace, the two objects the 410 checks page through, and the Deployment.
    {
        let s = shared.clone();
        until_ok(&shared, "create namespace", move |i| {
            let api: Api<Namespace> = Api::all(s.clients[i].clone());
            let ns: Namespace =
                serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap_or_default();
            async move { api.create(&PostParams::default(), &ns).await }.boxed()
        })
        .await
        .with_context(|| c.logs())?;
    }
    for name in ["gone-a", "gone-b"] {
        let s = shared.clone();
        until_ok(&shared, "create", move |i| {
            let api: Api<ConfigMap> = s.api(i);
            let cm = configmap(name, json!({"app": GONE_APP}), "gone");
            async move { api.create(&PostParams::default(), &cm).await }.boxed()
        })
        .await?;
    }
    let web = deployment()?;
    let strategy = web
        .spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.max_surge.clone())
        .unwrap_or(IntOrString::Int(1));
    let limit = (REPLICAS + resolve_surge(&strategy, REPLICAS)?) as usize;

    // The pods' watcher starts before the Deployment, so that it sees every pod.
    let (stop_pods, pods_stop) = watch::channel(false);
    let pods_covered = Arc::new(AtomicI64::new(0));
    let pods = tokio::spawn(
        Follower {
            shared: shared.clone(),
            who: "the pod watcher".into(),
            labels: format!("app={WEB_APP}"),
            cursor: Cursor {
                member: 0,
                members: n,
            },
            covered: pods_covered,
            sessions: Vec::new(),
            last_list: 0,
            view: Pods {
                limit,
                now: HashMap::new(),
                bound: HashMap::new(),
                max_live: 0,
                over: false,
            },
        }
        .run::<Pod>(pods_stop),
    );
    {
        let s = shared.clone();
        until_ok(&shared, "create deployment", move |i| {
            let api: Api<Deployment> = s.api(i);
            let d = web.clone();
            async move { api.create(&PostParams::default(), &d).await }.boxed()
        })
        .await?;
    }
    if let Err(missing) = converge(&shared, Instant::now()).await {
        bail!(
            "the Deployment did not roll out before any fault within {CONVERGE_BOUND:?}: {missing}\n{}",
            c.logs()
        );
    }

    // The clients.
    let (stop_work, work_stop) = watch::channel(false);
    let (stop_watch, watch_stop) = watch::channel(false);
    let mut watchers = Vec::new();
    let mut covered = Vec::new();
    for w in 0..WATCHERS {
        let cov = Arc::new(AtomicI64::new(0));
        covered.push(cov.clone());
        watchers.push(tokio::spawn(
            Follower {
                shared: shared.clone(),
                who: format!("watcher {w}"),
                labels: format!("app={CM_APP}"),
                // The first on the control-plane endpoint (the last client), the others on
                // the members.
                cursor: Cursor {
                    member: (w + n - 1) % n,
                    members: n,
                },
                covered: cov,
                sessions: Vec::new(),
                last_list: 0,
                view: Tokens,
            }
            .run::<ConfigMap>(watch_stop.clone()),
        ));
    }
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let writer = Writer {
            shared: shared.clone(),
            id: w,
            rng: StdRng::seed_from_u64(seed.wrapping_add(1 + w as u64)),
            // The first on the control-plane endpoint (the last client), the others on the
            // members.
            cursor: Cursor {
                member: (w + n - 1) % n,
                members: n,
            },
            seq: 0,
            own: BTreeMap::new(),
            next_own: 0,
            last_list: 0,
        };
        writers.push(tokio::spawn(writer.run(work_stop.clone())));
    }
    let (roll_now, rolls) = mpsc::unbounded_channel();
    let roller = tokio::spawn(roll(shared.clone(), rolls));

    // The faults: every kind once in a seeded order, then drawn at random.
    let mut chaos = Chaos {
        c: &c,
        start: started,
        shared: shared.clone(),
        rng: StdRng::seed_from_u64(seed),
        pings: 0,
        explicit: Explicit::default(),
    };
    let mut order = kinds.to_vec();
    order.shuffle(&mut chaos.rng);
    let mut faults = Vec::new();
    let faulting = Instant::now();
    while faulting.elapsed() < duration {
        let kind = match order.get(faults.len()) {
            Some(k) => *k,
            None => *kinds.choose(&mut chaos.rng).unwrap_or(&Fault::KillLeader),
        };
        // Most faults hit a rollout in flight.
        if faults.is_empty() || chaos.rng.gen_bool(0.7) {
            let _ = roll_now.send(());
        }
        let mut record = chaos.inject(kind).await;
        // Recovered: some API took a write, and then every member's API and the endpoint
        // answer reads.
        record.recovered = record.to_write.is_some() && chaos.all_serving().await;
        let recovered = record.recovered;
        let detail = record.detail.clone();
        faults.push(record);
        if !recovered {
            shared.violation(
                Violation::ApiDown,
                format!(
                    "after {} ({detail}) not every member's API served within {RECOVERY_BOUND:?}",
                    kind.name()
                ),
            );
            break;
        }
        if faulting.elapsed() >= duration {
            break;
        }
        chaos.stale_update().await;
        chaos.gone().await;
        let pace = Duration::from_millis(chaos.rng.gen_range(1_000..3_000));
        tokio::time::sleep(pace).await;
    }
    // The Deployment's convergence is timed from here, right after the last fault healed.
    let healed = Instant::now();
    let faults_took = faulting.elapsed();
    let explicit = chaos.explicit.clone();

    // The workload stops; the watchers must deliver up to the last acknowledged write.
    let _ = stop_work.send(true);
    for w in writers {
        let _ = w.await;
    }
    drop(roll_now);
    let image_changes = roller.await.unwrap_or(0);
    let last = shared.newest_acked();
    let caught_up = Instant::now();
    while covered.iter().any(|c| c.load(Ordering::SeqCst) < last)
        && caught_up.elapsed() < CATCH_UP_BOUND
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (w, cov) in covered.iter().enumerate() {
        let at = cov.load(Ordering::SeqCst);
        if at < last {
            shared.violation(
                Violation::WatchBehind,
                format!("watcher {w} had delivered up to version {at} of {last} after {CATCH_UP_BOUND:?}"),
            );
        }
    }
    let _ = stop_watch.send(true);
    let mut followers = Vec::new();
    for w in watchers {
        if let Ok(f) = w.await {
            followers.push(f);
        }
    }

    let converged = match converge(&shared, healed).await {
        Ok(took) => Some(took),
        Err(missing) => {
            shared.violation(
                Violation::NotConverged,
                format!("after {CONVERGE_BOUND:?}: {missing}"),
            );
            None
        }
    };
    let _ = stop_pods.send(true);
    let pods = pods.await.ok();

    // The checks over everything seen.
    let h = std::mem::take(&mut *lock(&shared.history));
    let mut watch_sessions = 0;
    let mut watch_events = 0;
    for f in &followers {
        watch_sessions += f.sessions.len();
        watch_events += f.sessions.iter().map(|s| s.events.len()).sum::<usize>();
        for gap in gaps(&f.who, &f.sessions, &h.acked) {
            shared.violation(Violation::WatchGap, gap);
        }
    }
    let mut applied: Vec<&String> = h.conflicted.intersection(&h.observed).collect();
    applied.sort();
    for token in applied {
        shared.violation(
            Violation::ConflictApplied,
            format!("the write with token {token} was answered 409 and then seen in an object"),
        );
    }

    let stats = &shared.stats;
    let requests = Requests {
        made: stats.made.load(Ordering::Relaxed),
        ok: stats.ok.load(Ordering::Relaxed),
        conflict: stats.conflict.load(Ordering::Relaxed),
        gone: stats.gone.load(Ordering::Relaxed),
        not_found: stats.not_found.load(Ordering::Relaxed),
        other: stats.other.load(Ordering::Relaxed),
    };
    let violations = lock(&shared.found).clone();
    let other_errors = lock(&shared.other_errors).clone();
    Ok(K8sSummary {
        seed,
        duration: faults_took,
        elapsed: started.elapsed(),
        faults,
        requests,
        other_errors,
        writes_acked: h.acked.len(),
        updates_ok: h.updates_ok,
        conflicts: h.conflicted.len(),
        watch_sessions,
        watch_events,
        explicit,
        image_changes,
        pods_seen: pods.as_ref().map_or(0, |p| p.view.bound.len()),
        max_pods: pods.as_ref().map_or(0, |p| p.view.max_live),
        pod_limit: limit,
        converged,
        violations,
    })
}
