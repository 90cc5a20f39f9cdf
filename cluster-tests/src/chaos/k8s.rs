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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::serde::de::DeserializeOwned;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, Resource};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rkube_store::proto::etcdserverpb as pb;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::{Cluster, Options};

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

/// What the checkers can find.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Violation {
    StaleUpdateAccepted,
    UpdateNotNewer,
    TwoFromOneVersion,
    OneVersionTwoWrites,
    ConflictApplied,
    StaleRead,
    ListWentBack,
    LostCreate,
    WatchOrder,
    WatchResume,
    WatchGap,
    WatchBehind,
    NotGone,
    WriteWithoutQuorum,
    PodOnTwoNodes,
    TooManyPods,
    ApiDown,
    NotConverged,
}

impl Violation {
    pub const ALL: [Violation; 18] = [
        Violation::StaleUpdateAccepted,
        Violation::UpdateNotNewer,
        Violation::TwoFromOneVersion,
        Violation::OneVersionTwoWrites,
        Violation::ConflictApplied,
        Violation::StaleRead,
        Violation::ListWentBack,
        Violation::LostCreate,
        Violation::WatchOrder,
        Violation::WatchResume,
        Violation::WatchGap,
        Violation::WatchBehind,
        Violation::NotGone,
        Violation::WriteWithoutQuorum,
        Violation::PodOnTwoNodes,
        Violation::TooManyPods,
        Violation::ApiDown,
        Violation::NotConverged,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Violation::StaleUpdateAccepted => "stale-update-accepted",
            Violation::UpdateNotNewer => "update-not-newer",
            Violation::TwoFromOneVersion => "two-from-one-version",
            Violation::OneVersionTwoWrites => "one-version-two-writes",
            Violation::ConflictApplied => "conflict-applied",
            Violation::StaleRead => "stale-read",
            Violation::ListWentBack => "list-went-back",
            Violation::LostCreate => "lost-create",
            Violation::WatchOrder => "watch-order",
            Violation::WatchResume => "watch-resume",
            Violation::WatchGap => "watch-gap",
            Violation::WatchBehind => "watch-behind",
            Violation::NotGone => "not-gone",
            Violation::WriteWithoutQuorum => "write-without-quorum",
            Violation::PodOnTwoNodes => "pod-on-two-nodes",
            Violation::TooManyPods => "too-many-pods",
            Violation::ApiDown => "api-down",
            Violation::NotConverged => "not-converged",
        }
    }

    pub fn meaning(self) -> &'static str {
        match self {
            Violation::StaleUpdateAccepted => {
                "an update or delete from a known old resourceVersion succeeded (must be 409)"
            }
            Violation::UpdateNotNewer => {
                "an update's new resourceVersion is not above the one it was based on"
            }
            Violation::TwoFromOneVersion => {
                "two writes based on the same resourceVersion of an object both succeeded"
            }
            Violation::OneVersionTwoWrites => {
                "two acknowledged writes got the same resourceVersion"
            }
            Violation::ConflictApplied => "a write answered 409 Conflict was applied after all",
            Violation::StaleRead => {
                "a get or list returned a version older than a write acknowledged before it began"
            }
            Violation::ListWentBack => "a client's list resourceVersion went back",
            Violation::LostCreate => "a list lacked an acknowledged create never deleted",
            Violation::WatchOrder => "watch events out of resourceVersion order or repeated",
            Violation::WatchResume => {
                "a resumed watch's first event was at or before the version it resumed from"
            }
            Violation::WatchGap => {
                "a watch skipped an acknowledged write in the range it covered, without 410"
            }
            Violation::WatchBehind => "a watch did not deliver the last write after the faults",
            Violation::NotGone => {
                "a watch or continue token from before a compaction was not answered 410 Gone"
            }
            Violation::WriteWithoutQuorum => "a write was acknowledged with two of three down",
            Violation::PodOnTwoNodes => "a pod's nodeName changed once set",
            Violation::TooManyPods => "more live pods than replicas + maxSurge",
            Violation::ApiDown => "the API did not serve again within the bound after a fault",
            Violation::NotConverged => "the Deployment did not converge after the faults",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    KillLeader,
    KillMember,
    PauseLeader,
    QuorumLoss,
    /// SIGKILL of the member holding the control-plane endpoint (the admin kubeconfig's
    /// current context), which one writer and one watcher use.
    KillEndpoint,
}

impl FaultKind {
    pub const ALL: [FaultKind; 5] = [
        FaultKind::KillLeader,
        FaultKind::KillMember,
        FaultKind::PauseLeader,
        FaultKind::QuorumLoss,
        FaultKind::KillEndpoint,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill-leader",
            FaultKind::KillMember => "kill-member",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::QuorumLoss => "quorum-loss",
            FaultKind::KillEndpoint => "kill-endpoint",
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub kind: FaultKind,
    pub detail: String,
    /// False when there was no leader to fault.
    pub injected: bool,
    /// From the injection (for quorum loss: from the restart) to the first write the API
    /// acknowledged; None when it did not within the bound.
    pub to_api: Option<Duration>,
}

/// Requests the clients made and how they were answered.
#[derive(Debug, Clone, Default)]
pub struct Requests {
    pub made: u64,
    pub ok: u64,
    /// 409: Conflict (a stale resourceVersion) or AlreadyExists.
    pub conflict: u64,
    /// 410 Gone, as an answer or as a watch's ERROR event.
    pub gone: u64,
    pub not_found: u64,
    /// No answer in time, transport errors, and every other status.
    pub other: u64,
}

/// The explicit checks run after every fault: how many gave a definite answer, of how many.
#[derive(Debug, Clone, Default)]
pub struct Explicit {
    pub stale_update: (u32, u32),
    pub gone_watch: (u32, u32),
    pub gone_continue: (u32, u32),
}

#[derive(Debug)]
pub struct K8sSummary {
    pub seed: u64,
    pub duration: Duration,
    pub elapsed: Duration,
    pub faults: Vec<FaultRecord>,
    pub requests: Requests,
    /// The first few distinct "other" errors, to tell what they were.
    pub other_errors: Vec<String>,
    pub writes_acked: usize,
    pub updates_ok: usize,
    pub conflicts: usize,
    pub watch_sessions: usize,
    pub watch_events: usize,
    pub explicit: Explicit,
    pub image_changes: u32,
    pub pods_seen: usize,
    pub max_pods: usize,
    pub pod_limit: usize,
    pub converged: Option<Duration>,
    /// Per kind: how many, and the first few described.
    pub violations: BTreeMap<Violation, (usize, Vec<String>)>,
}

impl K8sSummary {
    pub fn passed(&self) -> bool {
        let e = &self.explicit;
        self.violations.is_empty()
            && self.converged.is_some()
            && !self.faults.is_empty()
            && self.faults.iter().all(|f| f.injected && f.to_api.is_some())
            && self.writes_acked > 0
            && self.updates_ok > 0
            && e.stale_update.0 > 0
            && e.gone_watch.0 > 0
            && e.gone_continue.0 > 0
    }

    pub fn table(&self) -> String {
        let mut out = format!(
            "Kubernetes chaos campaign: seed {}, {:.0} s of faults, {:.0} s in all\n",
            self.seed,
            self.duration.as_secs_f64(),
            self.elapsed.as_secs_f64()
        );
        out += &format!(
            "{:<14}{:>4}  {:>30}\n",
            "fault", "n", "API serving again p50 / max"
        );
        let mut by: BTreeMap<FaultKind, Vec<&FaultRecord>> = BTreeMap::new();
        for f in &self.faults {
            by.entry(f.kind).or_default().push(f);
        }
        for (kind, recs) in &by {
            let times: Vec<Duration> = recs.iter().filter_map(|r| r.to_api).collect();
            let failed = recs
                .iter()
                .filter(|r| !r.injected || r.to_api.is_none())
                .count();
            out += &format!(
                "{:<14}{:>4}  {:>30}{}\n",
                kind.name(),
                recs.len(),
                p50_max(&times),
                if failed > 0 {
                    format!("  ({failed} not injected or not recovered)")
                } else {
                    String::new()
                }
            );
        }
        let r = &self.requests;
        out += &format!(
            "requests: {} made, {} ok, {} conflict (409), {} gone (410), {} not found (404), {} other errors\n",
            r.made, r.ok, r.conflict, r.gone, r.not_found, r.other
        );
        for e in &self.other_errors {
            out += &format!("  other error, e.g.: {e}\n");
        }
        out += &format!(
            "writes: {} acknowledged ({} updates with the resourceVersion they read), {} answered 409\n",
            self.writes_acked, self.updates_ok, self.conflicts
        );
        out += &format!(
            "watches: {} ConfigMap watchers, {} sessions, {} events\n",
            WATCHERS, self.watch_sessions, self.watch_events
        );
        let e = &self.explicit;
        out += &format!(
            "explicit checks (definite of run): stale update -> 409 {}/{}, compacted watch -> 410 {}/{}, compacted continue -> 410 {}/{}\n",
            e.stale_update.0, e.stale_update.1, e.gone_watch.0, e.gone_watch.1,
            e.gone_continue.0, e.gone_continue.1
        );
        out += &format!(
            "pods: {} seen, at most {} live at once (limit {} = {} replicas + maxSurge {})\n",
            self.pods_seen, self.max_pods, self.pod_limit, REPLICAS, MAX_SURGE
        );
        out += &format!(
            "deployment: {} image changes during the faults; converged after them: {}\n",
            self.image_changes,
            match self.converged {
                Some(d) => format!("yes, {:.1} s after the last fault healed", d.as_secs_f64()),
                None => "NO".into(),
            }
        );
        out += "violations:\n";
        for v in Violation::ALL {
            let (n, first) = self
                .violations
                .get(&v)
                .map(|(n, f)| (*n, f.as_slice()))
                .unwrap_or((0, &[]));
            out += &format!("  {:<24}{:>5}  {}\n", v.name(), n, v.meaning());
            for d in first {
                out += &format!("      {d}\n");
            }
        }
        out += if self.passed() { "PASS\n" } else { "FAIL\n" };
        out
    }
}

fn p50_max(times: &[Duration]) -> String {
    if times.is_empty() {
        return "-".into();
    }
    let mut t = times.to_vec();
    t.sort();
    format!(
        "{:.1} s / {:.1} s",
        t[(t.len() - 1) / 2].as_secs_f64(),
        t[t.len() - 1].as_secs_f64()
    )
}

/// maxSurge as Kubernetes resolves it: a number as it is, a percentage of the replicas rounded
/// up.
pub fn resolve_surge(surge: &IntOrString, replicas: i32) -> Result<i32> {
    match surge {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let pct: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .with_context(|| format!("maxSurge {s:?} is neither a number nor a percentage"))?;
            Ok(((pct * replicas as i64 + 99) / 100) as i32)
        }
    }
}

/// How a request was answered.
enum Answer<T> {
    Ok(T),
    /// 409: Conflict or AlreadyExists.
    Conflict,
    Gone,
    NotFound,
    /// No answer in time, a transport error, or a status that says the member cannot serve:
    /// the client tries another member.
    Failed,
}

#[derive(Default)]
struct Stats {
    made: AtomicU64,
    ok: AtomicU64,
    conflict: AtomicU64,
    gone: AtomicU64,
    not_found: AtomicU64,
    other: AtomicU64,
}

/// What the writers did, for the checks.
#[derive(Default)]
struct History {
    /// Acknowledged creates and updates of the watched ConfigMaps: resourceVersion -> name.
    acked: BTreeMap<i64, String>,
    /// Successful writes of the shared objects by the version they were based on:
    /// (name, version) -> (token, new version; 0 for a delete).
    from: HashMap<(String, i64), (String, i64)>,
    updates_ok: usize,
    /// Newest acknowledged version of each object.
    newest: HashMap<String, i64>,
    /// Tokens of writes answered 409.
    conflicted: HashSet<String>,
    /// Tokens seen in reads and watch events.
    observed: HashSet<String>,
}

struct Shared {
    clients: Vec<Client>,
    stats: Stats,
    other_errors: Mutex<Vec<String>>,
    found: Mutex<BTreeMap<Violation, (usize, Vec<String>)>>,
    history: Mutex<History>,
    /// The newest version any acknowledged write made: a quorum read that starts later may
    /// not be older.
    newest_acked: AtomicI64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A client's name: its member's, or `endpoint` for the control-plane endpoint's.
fn member(i: usize) -> String {
    if i == SERVERS {
        "endpoint".into()
    } else {
        format!("n{}", i + 1)
    }
}

fn rv_of(meta: &ObjectMeta) -> Option<i64> {
    meta.resource_version.as_deref()?.parse().ok()
}

fn token_of(cm: &ConfigMap) -> Option<&str> {
    cm.data.as_ref()?.get("token").map(String::as_str)
}

impl Shared {
    fn violation(&self, v: Violation, what: String) {
        let mut found = lock(&self.found);
        let entry = found.entry(v).or_default();
        entry.0 += 1;
        if entry.1.len() < DESCRIBED {
            entry.1.push(what);
        }
    }

    fn other_error(&self, what: String) {
        let mut errors = lock(&self.other_errors);
        let kind: String = what.chars().take(60).collect();
        if errors.len() < 6 && !errors.iter().any(|e| e.starts_with(&kind)) {
            errors.push(what);
        }
    }

    /// Sends a request with a bound of its own, and counts how it was answered.
    async fn call<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = kube::Result<T>>,
    ) -> Answer<T> {
        let s = &self.stats;
        s.made.fetch_add(1, Ordering::Relaxed);
        let (answer, counter) = match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
            Ok(Ok(v)) => (Answer::Ok(v), &s.ok),
            Ok(Err(kube::Error::Api(status))) => match status.code {
                409 => (Answer::Conflict, &s.conflict),
                410 => (Answer::Gone, &s.gone),
                404 => (Answer::NotFound, &s.not_found),
                code => {
                    self.other_error(format!("{what}: {code} {}", status.message));
                    (Answer::Failed, &s.other)
                }
            },
            Ok(Err(e)) => {
                self.other_error(format!("{what}: {e}"));
                (Answer::Failed, &s.other)
            }
            Err(_) => {
                self.other_error(format!("{what}: no answer within {REQUEST_TIMEOUT:?}"));
                (Answer::Failed, &s.other)
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        answer
    }

    fn api<K>(&self, i: usize) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.clients[i].clone(), NS)
    }

    fn newest(&self, name: &str) -> i64 {
        lock(&self.history).newest.get(name).copied().unwrap_or(0)
    }

    fn newest_acked(&self) -> i64 {
        self.newest_acked.load(Ordering::SeqCst)
    }

    fn observe(&self, cm: &ConfigMap) {
        if let Some(t) = token_of(cm) {
            lock(&self.history).observed.insert(t.to_string());
        }
    }

    fn conflicted(&self, token: &str) {
        lock(&self.history).conflicted.insert(token.to_string());
    }

    /// An acknowledged create or update of a watched ConfigMap.
    fn acked(&self, name: &str, rv: i64) {
        let mut h = lock(&self.history);
        if let Some(other) = h.acked.insert(rv, name.to_string()) {
            drop(h);
            self.violation(
                Violation::OneVersionTwoWrites,
                format!("writes of {other} and {name} were both acknowledged at version {rv}"),
            );
            return;
        }
        let newest = h.newest.entry(name.to_string()).or_default();
        *newest = (*newest).max(rv);
        drop(h);
        self.newest_acked.fetch_max(rv, Ordering::SeqCst);
    }

    /// A successful write of a shared object that was based on version `from`: an update
    /// that made version `to`, or a delete (`to` None).
    fn wrote_from(&self, name: &str, from: i64, to: Option<i64>, token: &str, on: usize) {
        if let Some(to) = to {
            if to <= from {
                self.violation(
                    Violation::UpdateNotNewer,
                    format!(
                        "{token} updated {name} from version {from} to {to} on {}",
                        member(on)
                    ),
                );
            }
        }
        let mut h = lock(&self.history);
        if to.is_some() {
            h.updates_ok += 1;
        }
        let before = h.from.insert(
            (name.to_string(), from),
            (token.to_string(), to.unwrap_or(0)),
        );
        drop(h);
        if let Some((other, other_to)) = before {
            let made = |v: i64| {
                if v == 0 {
                    "deleted it".to_string()
                } else {
                    format!("made {v}")
                }
            };
            self.violation(
                Violation::TwoFromOneVersion,
                format!(
                    "{other} ({}) and {token} on {} ({}) both succeeded from version {from} of {name}",
                    made(other_to),
                    member(on),
                    made(to.unwrap_or(0))
                ),
            );
        }
        if let Some(to) = to {
            self.acked(name, to);
        }
    }
}

/// A client's member; it moves on when the member fails.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    member: usize,
    members: usize,
}

impl Cursor {
    fn next(&mut self) {
        self.member = (self.member + 1) % self.members;
    }
}

/// Sleeps for `d` unless told to stop first; returns whether to stop.
async fn pause_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    let told = tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.wait_for(|s| *s) => true,
    };
    told || *stop.borrow()
}

fn configmap(name: &str, labels: serde_json::Value, token: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "data": {"token": token},
    }))
    .unwrap_or_default()
}

/// A writer: read-modify-write updates and deletes of the shared objects, and creates, lists
/// and deletes of its own.
struct Writer {
    shared: Arc<Shared>,
    id: usize,
    rng: StdRng,
    cursor: Cursor,
    seq: u64,
    /// Own objects whose create was acknowledged and that were never deleted: name -> version.
    own: BTreeMap<String, i64>,
    next_own: u64,
    last_list: i64,
}

impl Writer {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            self.seq += 1;
            let token = format!("w{}-{}", self.id, self.seq);
            let moved = match self.rng.gen_range(0..100) {
                0..=64 => self.update_shared(&token).await,
                65..=74 => self.create_own(&token).await,
                75..=81 => self.delete_own().await,
                82..=91 => self.list_own().await,
                _ => self.delete_shared(&token).await,
            };
            if moved {
                self.cursor.next();
            }
            let pace = Duration::from_millis(self.rng.gen_range(20..80));
            if pause_or_stop(pace, &mut stop).await {
                return;
            }
        }
    }

    fn api(&self) -> Api<ConfigMap> {
        self.shared.api(self.cursor.member)
    }

    fn on(&self) -> String {
        member(self.cursor.member)
    }

    /// Reads a shared object, checking it is not older than its newest acknowledged write;
    /// creates it when it is missing. Err(true): the member failed.
    async fn read_shared(&mut self, name: &str, token: &str) -> Result<Option<ConfigMap>, bool> {
        let floor = self.shared.newest(name);
        match self.shared.call("get", self.api().get(name)).await {
            Answer::Ok(cm) => {
                self.shared.observe(&cm);
                let rv = rv_of(&cm.metadata).unwrap_or(0);
                if rv < floor {
                    self.shared.violation(
                        Violation::StaleRead,
                        format!(
                            "get {name} on {} returned version {rv}, older than the acknowledged {floor}",
                            self.on()
                        ),
                    );
                }
                Ok(Some(cm))
            }
            Answer::NotFound => {
                let cm = configmap(name, json!({"app": CM_APP}), token);
                let (api, pp) = (self.api(), PostParams::default());
                match self.shared.call("create", api.create(&pp, &cm)).await {
                    Answer::Ok(made) => {
                        if let Some(rv) = rv_of(&made.metadata) {
                            self.shared.acked(name, rv);
                        }
                        Ok(None)
                    }
                    Answer::Conflict => {
                        self.shared.conflicted(token);
                        Ok(None)
                    }
                    Answer::Failed => Err(true),
                    Answer::Gone | Answer::NotFound => Ok(None),
                }
            }
            Answer::Failed => Err(true),
            Answer::Conflict | Answer::Gone => Ok(None),
        }
    }

    async fn update_shared(&mut self, token: &str) -> bool {
        let name = format!("race-{}", self.rng.gen_range(0..SHARED_OBJECTS));
        let mut cm = match self.read_shared(&name, token).await {
            Ok(Some(cm)) => cm,
            Ok(None) => return false,
            Err(moved) => return moved,
        };
        let Some(from) = rv_of(&cm.metadata) else {
            return false;
        };
        // The body keeps the resourceVersion it was read at: the update is conditional on it.
        cm.data
            .get_or_insert_default()
            .insert("token".into(), token.into());
        let (api, pp) = (self.api(), PostParams::default());
        match self
            .shared
            .call("update", api.replace(&name, &pp, &cm))
            .await
        {
            Answer::Ok(new) => {
                let to = rv_of(&new.metadata).unwrap_or(0);
                self.shared
                    .wrote_from(&name, from, Some(to), token, self.cursor.member);
                false
            }
            Answer::Conflict => {
                self.shared.conflicted(token);
                false
            }
            Answer::Failed => true,
            Answer::Gone | Answer::NotFound => false,
        }
    }

    async fn delete_shared(&mut self, token: &str) -> bool {
        let name = format!("race-{}", self.rng.gen_range(0..SHARED_OBJECTS));
        let cm = match self.read_shared(&name, token).await {
            Ok(Some(cm)) => cm,
            Ok(None) => return false,
            Err(moved) => return moved,
        };
        let Some(from) = rv_of(&cm.metadata) else {
            return false;
        };
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(from.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match self
            .shared
            .call("delete", self.api().delete(&name, &dp))
            .await
        {
            Answer::Ok(_) => {
                self.shared
                    .wrote_from(&name, from, None, token, self.cursor.member);
                false
            }
            Answer::Failed => true,
            _ => false,
        }
    }

    async fn create_own(&mut self, token: &str) -> bool {
        self.next_own += 1;
        let name = format!("own-{}-{}", self.id, self.next_own);
        let labels = json!({"app": CM_APP, "writer": format!("w{}", self.id)});
        let cm = configmap(&name, labels, token);
        let (api, pp) = (self.api(), PostParams::default());
        match self.shared.call("create", api.create(&pp, &cm)).await {
            Answer::Ok(made) => {
                if let Some(rv) = rv_of(&made.metadata) {
                    self.shared.acked(&name, rv);
                    self.own.insert(name, rv);
                }
                false
            }
            Answer::Conflict => {
                self.shared.conflicted(token);
                false
            }
            Answer::Failed => true,
            Answer::Gone | Answer::NotFound => false,
        }
    }

    async fn delete_own(&mut self) -> bool {
        // Once a delete is tried, its outcome may be unknown: the object leaves `own`.
        let Some((name, _)) = self.own.pop_first() else {
            return false;
        };
        let (api, dp) = (self.api(), DeleteParams::default());
        matches!(
            self.shared.call("delete", api.delete(&name, &dp)).await,
            Answer::Failed
        )
    }

    async fn list_own(&mut self) -> bool {
        let floor = self.shared.newest_acked();
        let expected = self.own.clone();
        let lp = ListParams::default().labels(&format!("app={CM_APP},writer=w{}", self.id));
        let list = match self.shared.call("list", self.api().list(&lp)).await {
            Answer::Ok(list) => list,
            Answer::Failed => return true,
            _ => return false,
        };
        let rv: i64 = list
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let on = self.on();
        let w = self.id;
        if rv < self.last_list {
            self.shared.violation(
                Violation::ListWentBack,
                format!(
                    "writer {w}'s list on {on} was at version {rv} after one at {}",
                    self.last_list
                ),
            );
        }
        self.last_list = self.last_list.max(rv);
        if rv < floor {
            self.shared.violation(
                Violation::StaleRead,
                format!("writer {w}'s list on {on} was at version {rv}, older than the acknowledged {floor}"),
            );
        }
        let names: HashSet<&str> = list
            .items
            .iter()
            .filter_map(|cm| cm.metadata.name.as_deref())
            .collect();
        for cm in &list.items {
            self.shared.observe(cm);
        }
        for (name, created) in &expected {
            if !names.contains(name.as_str()) {
                self.shared.violation(
                    Violation::LostCreate,
                    format!("writer {w}'s list on {on} at version {rv} lacks {name}, created at {created}"),
                );
            }
        }
        false
    }
}

/// One watch request: from where, what it delivered, and how far it vouched for.
#[derive(Debug, Clone)]
struct Session {
    member: usize,
    start: i64,
    /// The newest version delivered or bookmarked: every event up to it was sent.
    covered: i64,
    events: Vec<(i64, String)>,
}

/// What a watcher does with the state it lists and the events it sees.
trait View<K>: Send {
    fn listed(&mut self, items: &[K], rv: i64, shared: &Shared);
    fn event(&mut self, deleted: bool, object: &K, rv: i64, shared: &Shared);
}

/// Lists, watches from the list's version, resumes from the newest version seen (on the next
/// member when its member failed), and lists again only after 410 Gone.
struct Follower<V> {
    shared: Arc<Shared>,
    who: String,
    labels: String,
    cursor: Cursor,
    covered: Arc<AtomicI64>,
    sessions: Vec<Session>,
    last_list: i64,
    view: V,
}

enum End {
    Gone,
    Failed,
    Closed,
    Stopped,
}

/// The object types a follower lists and watches.
trait Watched:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + 'static
{
}

impl<V> Follower<V> {
    async fn run<K>(mut self, mut stop: watch::Receiver<bool>) -> Self
    where
        K: Watched,
        V: View<K>,
    {
        loop {
            let Some(rv) = self.list::<K>(&mut stop).await else {
                return self;
            };
            self.covered.store(rv, Ordering::SeqCst);
            loop {
                let mut session = Session {
                    member: self.cursor.member,
                    start: self.covered.load(Ordering::SeqCst),
                    covered: self.covered.load(Ordering::SeqCst),
                    events: Vec::new(),
                };
                let end = self.watch::<K>(&mut session, &mut stop).await;
                self.sessions.push(session);
                match end {
                    End::Gone => break,
                    End::Stopped => return self,
                    End::Closed => {}
                    End::Failed => {
                        self.cursor.next();
                        if pause_or_stop(Duration::from_millis(200), &mut stop).await {
                            return self;
                        }
                    }
                }
            }
        }
    }

    /// Lists until a member answers; None when told to stop first.
    async fn list<K>(&mut self, stop: &mut watch::Receiver<bool>) -> Option<i64>
    where
        K: Watched,
        V: View<K>,
    {
        loop {
            if *stop.borrow() {
                return None;
            }
            let floor = self.shared.newest_acked();
            let api: Api<K> = self.shared.api(self.cursor.member);
            let lp = ListParams::default().labels(&self.labels);
            if let Answer::Ok(list) = self.shared.call("list", api.list(&lp)).await {
                if let Some(rv) = list
                    .metadata
                    .resource_version
                    .as_deref()
                    .and_then(|v| v.parse::<i64>().ok())
                {
                    let on = member(self.cursor.member);
                    let who = &self.who;
                    let seen = self.last_list.max(self.covered.load(Ordering::SeqCst));
                    if rv < seen {
                        self.shared.violation(
                            Violation::ListWentBack,
                            format!(
                                "{who}'s list on {on} was at version {rv} after it had seen {seen}"
                            ),
                        );
                    }
                    if rv < floor {
                        self.shared.violation(
                            Violation::StaleRead,
                            format!("{who}'s list on {on} was at version {rv}, older than the acknowledged {floor}"),
                        );
                    }
                    self.last_list = self.last_list.max(rv);
                    self.view.listed(&list.items, rv, &self.shared);
                    return Some(rv);
                }
            }
            self.cursor.next();
            if pause_or_stop(Duration::from_millis(200), stop).await {
                return None;
            }
        }
    }

    async fn watch<K>(&mut self, s: &mut Session, stop: &mut watch::Receiver<bool>) -> End
    where
        K: Watched,
        V: View<K>,
    {
        let api: Api<K> = self.shared.api(s.member);
        let wp = WatchParams::default().labels(&self.labels).timeout(60);
        let mut stream = match self
            .shared
            .call("watch", api.watch(&wp, &s.start.to_string()))
            .await
        {
            Answer::Ok(stream) => stream.boxed(),
            Answer::Gone => return End::Gone,
            _ => return End::Failed,
        };
        loop {
            let next = tokio::select! {
                n = tokio::time::timeout(WATCH_IDLE, stream.next()) => n,
                _ = stop.wait_for(|s| *s) => return End::Stopped,
            };
            let event = match next {
                Err(_) => {
                    self.shared.other_error(format!(
                        "watch on {}: nothing for {WATCH_IDLE:?}",
                        member(s.member)
                    ));
                    return End::Failed;
                }
                Ok(None) => return End::Closed,
                Ok(Some(Err(e))) => {
                    self.shared
                        .other_error(format!("watch on {}: {e}", member(s.member)));
                    return End::Failed;
                }
                Ok(Some(Ok(event))) => event,
            };
            let (deleted, object) = match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => (false, o),
                WatchEvent::Deleted(o) => (true, o),
                WatchEvent::Bookmark(b) => {
                    let rv: i64 = b.metadata.resource_version.parse().unwrap_or(0);
                    let last = s.events.last().map_or(s.start, |e| e.0);
                    if rv < last {
                        self.shared.violation(
                            Violation::WatchOrder,
                            format!(
                                "{} on {}: a bookmark at {rv} after an event at {last}",
                                self.who,
                                member(s.member)
                            ),
                        );
                    }
                    s.covered = s.covered.max(rv);
                    self.covered.fetch_max(s.covered, Ordering::SeqCst);
                    continue;
                }
                WatchEvent::Error(status) => {
                    if status.code == 410 {
                        self.shared.stats.gone.fetch_add(1, Ordering::Relaxed);
                        return End::Gone;
                    }
                    self.shared.other_error(format!(
                        "watch on {}: ERROR {} {}",
                        member(s.member),
                        status.code,
                        status.message
                    ));
                    return End::Failed;
                }
            };
            let meta = object.meta();
            let name = meta.name.clone().unwrap_or_default();
            let rv = rv_of(meta).unwrap_or(0);
            let (who, on) = (&self.who, member(s.member));
            if s.events.is_empty() && rv <= s.start {
                self.shared.violation(
                    Violation::WatchResume,
                    format!(
                        "{who}'s watch from {} on {on} began with {name} at version {rv}",
                        s.start
                    ),
                );
            } else if rv <= s.covered {
                self.shared.violation(
                    Violation::WatchOrder,
                    format!(
                        "{who}'s watch from {} on {on}: {name} at version {rv} after {}",
                        s.start, s.covered
                    ),
                );
            }
            s.events.push((rv, name));
            s.covered = s.covered.max(rv);
            self.covered.fetch_max(s.covered, Ordering::SeqCst);
            self.view.event(deleted, &object, rv, &self.shared);
        }
    }
}

/// The ConfigMap watchers remember the tokens they see.
struct Tokens;

impl View<ConfigMap> for Tokens {
    fn listed(&mut self, items: &[ConfigMap], _rv: i64, shared: &Shared) {
        for cm in items {
            shared.observe(cm);
        }
    }

    fn event(&mut self, _deleted: bool, cm: &ConfigMap, _rv: i64, shared: &Shared) {
        shared.observe(cm);
    }
}

/// Acknowledged writes that a watcher's sessions covered (after their start, up to the newest
/// version they vouched for) but did not deliver, or delivered as another object.
fn gaps(who: &str, sessions: &[Session], acked: &BTreeMap<i64, String>) -> Vec<String> {
    let mut out = Vec::new();
    for s in sessions.iter().filter(|s| s.covered > s.start) {
        let seen: HashMap<i64, &str> = s.events.iter().map(|(rv, n)| (*rv, n.as_str())).collect();
        for (rv, name) in acked.range(s.start + 1..=s.covered) {
            match seen.get(rv) {
                Some(n) if n == name => {}
                Some(n) => out.push(format!(
                    "{who}'s watch from {} on {} delivered {n} at version {rv}, the acknowledged write of {name}",
                    s.start,
                    member(s.member)
                )),
                None => out.push(format!(
                    "{who}'s watch from {} on {} covered up to {} but skipped {name} at version {rv}",
                    s.start,
                    member(s.member),
                    s.covered
                )),
            }
        }
    }
    out
}

/// The Deployment's pods as a watcher sees them, checked at every version.
struct Pods {
    limit: usize,
    /// Pods now: uid -> (name, live).
    now: HashMap<String, (String, bool)>,
    /// The node each pod was first bound to.
    bound: HashMap<String, String>,
    max_live: usize,
    over: bool,
}

impl Pods {
    fn note(&mut self, pod: &Pod, rv: i64, shared: &Shared) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        match (self.bound.get(&uid), node) {
            (Some(first), Some(node)) if *first != node => shared.violation(
                Violation::PodOnTwoNodes,
                format!("pod {name} ({uid}) was bound to {first}, at version {rv} to {node}"),
            ),
            (Some(first), None) => shared.violation(
                Violation::PodOnTwoNodes,
                format!("pod {name} ({uid}) was bound to {first}, at version {rv} to no node"),
            ),
            (None, Some(node)) => {
                self.bound.insert(uid.clone(), node);
            }
            _ => {}
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let live = pod.metadata.deletion_timestamp.is_none()
            && !matches!(phase, Some("Failed") | Some("Succeeded"));
        self.now.insert(uid, (name, live));
    }

    fn count(&mut self, rv: i64, shared: &Shared) {
        let live: BTreeSet<&str> = self
            .now
            .values()
            .filter(|(_, live)| *live)
            .map(|(n, _)| n.as_str())
            .collect();
        self.max_live = self.max_live.max(live.len());
        // One violation per excursion above the limit.
        let over = live.len() > self.limit;
        if over && !self.over {
            shared.violation(
                Violation::TooManyPods,
                format!(
                    "{} live pods at version {rv} (limit {}): {}",
                    live.len(),
                    self.limit,
                    live.into_iter().collect::<Vec<_>>().join(" ")
                ),
            );
        }
        self.over = over;
    }
}

impl View<Pod> for Pods {
    fn listed(&mut self, items: &[Pod], rv: i64, shared: &Shared) {
        self.now.clear();
        for p in items {
            self.note(p, rv, shared);
        }
        self.count(rv, shared);
    }

    fn event(&mut self, deleted: bool, pod: &Pod, rv: i64, shared: &Shared) {
        if deleted {
            self.now
                .remove(pod.metadata.uid.as_deref().unwrap_or_default());
        } else {
            self.note(pod, rv, shared);
        }
        self.count(rv, shared);
    }
}

/// Changes the Deployment's image on every request, until the requests end; returns how many
/// changes were acknowledged.
async fn roll(shared: Arc<Shared>, mut requests: mpsc::UnboundedReceiver<()>) -> u32 {
    let mut cursor = Cursor {
        member: 0,
        members: shared.clients.len(),
    };
    let mut changes = 0;
    let mut image = 0;
    while requests.recv().await.is_some() {
        image += 1;
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "web", "image": format!("chaos.local/web:{image}")}]}}}});
        // Until one member takes it: a failed attempt may have been applied, and applying the
        // same image again changes nothing.
        let started = Instant::now();
        while started.elapsed() < RECOVERY_BOUND {
            let api: Api<Deployment> = shared.api(cursor.member);
            let (pp, merge) = (PatchParams::default(), Patch::Merge(&patch));
            match shared
                .call("patch deployment", api.patch("web", &pp, &merge))
                .await
            {
                Answer::Ok(_) => {
                    changes += 1;
                    break;
                }
                Answer::Failed => cursor.next(),
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    changes
}

fn client_config_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("the admin kubeconfig: {e}")
}

/// The admin's client of every server (its context in DIR/admin.kubeconfig), then of the
/// control-plane endpoint (the `rkube` context, which the leader serves).
async fn clients(c: &Cluster) -> Result<Vec<Client>> {
    let mut out = Vec::new();
    let contexts = (1..=c.members.len())
        .map(|i| format!("rkube-n{i}"))
        .chain(["rkube".to_string()]);
    for context in contexts {
        let kubeconfig = Kubeconfig::read_from(c.path().join("admin.kubeconfig"))
            .map_err(client_config_error)?;
        let options = KubeConfigOptions {
            context: Some(context),
            ..KubeConfigOptions::default()
        };
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(client_config_error)?;
        // A paused member accepts connections and then says nothing.
        config.connect_timeout = Some(Duration::from_secs(3));
        config.read_timeout = Some(Duration::from_secs(30));
        config.write_timeout = Some(Duration::from_secs(5));
        out.push(Client::try_from(config).map_err(client_config_error)?);
    }
    Ok(out)
}

/// Sends `op` to one member after another until one answers Ok (or 409: it exists already).
async fn until_ok<T, F>(shared: &Shared, what: &str, mut op: F) -> Result<()>
where
    F: FnMut(usize) -> BoxFuture<'static, kube::Result<T>>,
{
    let deadline = Instant::now() + RECOVERY_BOUND;
    let mut i = 0;
    while Instant::now() < deadline {
        match shared.call(what, op(i % shared.clients.len())).await {
            Answer::Ok(_) | Answer::Conflict => return Ok(()),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
        i += 1;
    }
    bail!("{what}: no member answered within {RECOVERY_BOUND:?}")
}

fn deployment() -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": WEB_APP}},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": MAX_SURGE, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": WEB_APP}},
                "spec": {"terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "web", "image": "chaos.local/web:0"}]}}}
    }))?)
}

/// Whether the Deployment has rolled out its current template to exactly its replicas, with
/// every live pod on it; Err says what is still missing.
async fn rolled_out(shared: &Shared, on: usize) -> Result<(), String> {
    let api: Api<Deployment> = shared.api(on);
    let d = match shared.call("get deployment", api.get("web")).await {
        Answer::Ok(d) => d,
        _ => return Err(format!("{} did not answer", member(on))),
    };
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let st = d.status.clone().unwrap_or_default();
    let status = format!(
        "generation {:?} observed {:?}, replicas {want}: status replicas {:?} updated {:?} ready {:?} available {:?}",
        d.metadata.generation,
        st.observed_generation,
        st.replicas,
        st.updated_replicas,
        st.ready_replicas,
        st.available_replicas
    );
    let done = d.metadata.generation.is_some()
        && st.observed_generation == d.metadata.generation
        && [
            st.replicas,
            st.updated_replicas,
            st.ready_replicas,
            st.available_replicas,
        ]
        .iter()
        .all(|n| *n == Some(want));
    if !done {
        return Err(status);
    }
    let image = d
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.image)
        .unwrap_or_default();
    let pods: Api<Pod> = shared.api(on);
    let lp = ListParams::default().labels(&format!("app={WEB_APP}"));
    let list = match shared.call("list pods", pods.list(&lp)).await {
        Answer::Ok(l) => l,
        _ => return Err(format!("{status}; pods not listed")),
    };
    let live: Vec<&Pod> = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let current = live
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.as_deref())
                == Some(image.as_str())
        })
        .count();
    if live.len() != want as usize || current != live.len() {
        return Err(format!(
            "{status}; {} live pods, {current} with {image}",
            live.len()
        ));
    }
    Ok(())
}

/// Waits (bounded) until the Deployment has rolled out; how long since `started`, or Err: the
/// last thing missing.
async fn converge(shared: &Shared, started: Instant) -> Result<Duration, String> {
    let mut i = 0;
    loop {
        match rolled_out(shared, i % shared.clients.len()).await {
            Ok(()) => return Ok(started.elapsed()),
            Err(missing) if started.elapsed() > CONVERGE_BOUND => return Err(missing),
            Err(_) => {}
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The fault injector and the explicit checks, on the main task.
struct Chaos<'a> {
    c: &'a Cluster,
    shared: Arc<Shared>,
    rng: StdRng,
    pings: u64,
    explicit: Explicit,
}

impl Chaos<'_> {
    fn members(&self) -> usize {
        self.c.members.len()
    }

    async fn leader(&self) -> Option<usize> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(l) = self.c.leader().await {
                return Some(l);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    /// One write through member `m`'s API: whether it was acknowledged.
    fn ping(&mut self, m: usize) -> BoxFuture<'static, bool> {
        self.pings += 1;
        let cm = configmap(
            &format!("ping-{}", self.pings),
            json!({"app": PING_APP}),
            "ping",
        );
        let shared = self.shared.clone();
        async move {
            let api: Api<ConfigMap> = shared.api(m);
            let pp = PostParams::default();
            matches!(
                shared.call("ping", api.create(&pp, &cm)).await,
                Answer::Ok(_)
            )
        }
        .boxed()
    }

    /// Time from `since` until the API of one of `members` acknowledges a write. A write to
    /// every one of them starts every half second, without waiting for the earlier ones: a
    /// request stuck on a deposed leader must not hide that a newer one would succeed.
    async fn serving(&mut self, members: &[usize], since: Instant) -> Option<Duration> {
        let mut tries = FuturesUnordered::new();
        let mut every = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = every.tick() => {
                    if since.elapsed() > RECOVERY_BOUND {
                        return None;
                    }
                    for &m in members {
                        tries.push(self.ping(m));
                    }
                }
                Some(ok) = tries.next(), if !tries.is_empty() => {
                    if ok {
                        return Some(since.elapsed());
                    }
                }
            }
        }
    }

    /// Waits until every member's API, and the control-plane endpoint, answer reads again.
    async fn all_serving(&mut self) -> bool {
        let started = Instant::now();
        let mut pending: Vec<usize> = (0..self.shared.clients.len()).collect();
        while started.elapsed() < RECOVERY_BOUND {
            let mut still = Vec::new();
            for &m in &pending {
                let api: Api<Namespace> = Api::all(self.shared.clients[m].clone());
                if !matches!(
                    self.shared.call("get namespace", api.get(NS)).await,
                    Answer::Ok(_)
                ) {
                    still.push(m);
                }
            }
            if still.is_empty() {
                return true;
            }
            pending = still;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    async fn restart(&self) -> String {
        match self.c.restart_missing().await {
            Ok(()) => String::new(),
            Err(e) => format!("; restart: {e}"),
        }
    }

    async fn inject(&mut self, kind: FaultKind) -> FaultRecord {
        let mut record = FaultRecord {
            kind,
            detail: String::new(),
            injected: false,
            to_api: None,
        };
        let Some(leader) = self.leader().await else {
            record.detail = "no leader to fault".into();
            return record;
        };
        let n = self.members();
        record.injected = true;
        match kind {
            FaultKind::KillLeader | FaultKind::KillMember => {
                let victim = if kind == FaultKind::KillLeader {
                    leader
                } else {
                    self.rng.gen_range(0..n)
                };
                let since = Instant::now();
                self.c.kill(victim).await;
                let others: Vec<usize> = (0..n).filter(|&i| i != victim).collect();
                record.to_api = self.serving(&others, since).await;
                record.detail = format!("killed {} (leader {})", member(victim), member(leader));
                record.detail += &self.restart().await;
            }
            FaultKind::KillEndpoint => {
                let mut holder = None;
                for i in 0..n {
                    if self.c.metric(i, "rkube_endpoint_held").await == Some(1.0) {
                        holder = Some(i);
                    }
                }
                let Some(victim) = holder else {
                    record.injected = false;
                    record.detail = format!(
                        "no member holds the control-plane endpoint (leader {})",
                        member(leader)
                    );
                    return record;
                };
                let since = Instant::now();
                self.c.kill(victim).await;
                // The endpoint's client, after the members'.
                record.to_api = self.serving(&[n], since).await;
                record.detail = format!(
                    "killed {} (holding the endpoint; leader {})",
                    member(victim),
                    member(leader)
                );
                record.detail += &self.restart().await;
            }
            FaultKind::PauseLeader => {
                let since = Instant::now();
                self.c.pause(leader);
                let others: Vec<usize> = (0..n).filter(|&i| i != leader).collect();
                record.to_api = self.serving(&others, since).await;
                // Past the election timeout in any case, so the others elect a new leader.
                tokio::time::sleep(PAUSE_FOR.saturating_sub(since.elapsed())).await;
                self.c.resume(leader);
                record.detail = format!("paused {} for {:?}", member(leader), since.elapsed());
            }
            FaultKind::QuorumLoss => {
                let others: Vec<usize> = (0..n).filter(|&i| i != leader).collect();
                let second = *others.choose(&mut self.rng).unwrap_or(&leader);
                let survivor = (0..n)
                    .find(|&i| i != leader && i != second)
                    .unwrap_or(leader);
                let down = Instant::now();
                self.c.kill(leader).await;
                self.c.kill(second).await;
                // Nothing may be acknowledged without a quorum.
                let ping = format!("ping-quorum-{}", self.pings);
                self.pings += 1;
                let cm = configmap(&ping, json!({"app": PING_APP}), "no-quorum");
                let api: Api<ConfigMap> = self.shared.api(survivor);
                if let Answer::Ok(made) = self
                    .shared
                    .call(
                        "write without quorum",
                        api.create(&PostParams::default(), &cm),
                    )
                    .await
                {
                    self.shared.violation(
                        Violation::WriteWithoutQuorum,
                        format!(
                            "{} acknowledged the create of {ping} at version {:?} with {} and {} down",
                            member(survivor),
                            made.metadata.resource_version,
                            member(leader),
                            member(second)
                        ),
                    );
                }
                tokio::time::sleep(QUORUM_LOSS_FOR.saturating_sub(down.elapsed())).await;
                let since = Instant::now();
                let restarted = self.restart().await;
                let all: Vec<usize> = (0..n).collect();
                record.to_api = self.serving(&all, since).await;
                record.detail = format!(
                    "killed {} (leader) and {} for {:?}{restarted}",
                    member(leader),
                    member(second),
                    since.duration_since(down)
                );
            }
        }
        record
    }

    /// An update and a delete from a version known to be old must be 409.
    async fn stale_update(&mut self) {
        let m = self.rng.gen_range(0..self.members());
        let api: Api<ConfigMap> = self.shared.api(m);
        let name = "stale-probe";
        self.explicit.stale_update.1 += 1;
        let first = match self.shared.call("get", api.get(name)).await {
            Answer::Ok(cm) => cm,
            Answer::NotFound => {
                let cm = configmap(name, json!({"app": "chaos-stale"}), "stale-0");
                match self
                    .shared
                    .call("create", api.create(&PostParams::default(), &cm))
                    .await
                {
                    Answer::Ok(cm) => cm,
                    _ => return,
                }
            }
            _ => return,
        };
        let Some(old) = rv_of(&first.metadata) else {
            return;
        };
        let mut next = first.clone();
        next.data
            .get_or_insert_default()
            .insert("token".into(), format!("stale-{old}"));
        let now = match self
            .shared
            .call("update", api.replace(name, &PostParams::default(), &next))
            .await
        {
            Answer::Ok(cm) => rv_of(&cm.metadata).unwrap_or(0),
            _ => return,
        };
        // `next` still carries version `old`.
        next.data
            .get_or_insert_default()
            .insert("token".into(), format!("stale-again-{old}"));
        match self
            .shared
            .call(
                "stale update",
                api.replace(name, &PostParams::default(), &next),
            )
            .await
        {
            Answer::Conflict => self.explicit.stale_update.0 += 1,
            Answer::Ok(cm) => {
                self.explicit.stale_update.0 += 1;
                self.shared.violation(
                    Violation::StaleUpdateAccepted,
                    format!(
                        "an update of {name} from version {old} succeeded on {} (current was {now}), making {:?}",
                        member(m),
                        cm.metadata.resource_version
                    ),
                );
            }
            _ => return,
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(old.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        if let Answer::Ok(_) = self
            .shared
            .call("stale delete", api.delete(name, &dp))
            .await
        {
            self.shared.violation(
                Violation::StaleUpdateAccepted,
                format!(
                    "a delete of {name} with precondition version {old} succeeded on {} (current was {now} or later)",
                    member(m)
                ),
            );
        }
    }

    /// A watch and a continue token from before a compaction must be 410 Gone on a member
    /// that has applied the compaction.
    async fn gone(&mut self) {
        let n = self.members();
        let (m, j) = (self.rng.gen_range(0..n), self.rng.gen_range(0..n));
        self.explicit.gone_watch.1 += 1;
        self.explicit.gone_continue.1 += 1;
        let api: Api<ConfigMap> = self.shared.api(m);
        let lp = ListParams::default().labels(&format!("app={GONE_APP}"));
        // Two objects exist, so a page of one has a continue token.
        let page = match self
            .shared
            .call("list", api.list(&lp.clone().limit(1)))
            .await
        {
            Answer::Ok(page) => page,
            _ => return,
        };
        let (Some(old), Some(token)) = (
            page.metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<i64>().ok()),
            page.metadata.continue_.clone().filter(|t| !t.is_empty()),
        ) else {
            return;
        };
        // Two writes after it, and a compaction to the second: revisions up to it are gone
        // whether or not the compaction revision itself stays readable.
        let mut to = 0;
        for k in 0..2 {
            let name = format!("gone-{}-{k}", old);
            let cm = configmap(&name, json!({"app": "chaos-gone-writes"}), "gone");
            match self
                .shared
                .call("create", api.create(&PostParams::default(), &cm))
                .await
            {
                Answer::Ok(made) => to = rv_of(&made.metadata).unwrap_or(0),
                _ => return,
            }
        }
        let mut kv = self.c.kv(m);
        let compact = kv.compact(pb::CompactionRequest {
            revision: to,
            physical: true,
        });
        match tokio::time::timeout(Duration::from_secs(10), compact).await {
            // Already compacted past it (by the leader's schedule) is as good.
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.code() == tonic::Code::OutOfRange => {}
            _ => return,
        }
        // Member j has applied the compaction once it refuses a read at `old`.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut kv = self.c.kv(j);
            let read = kv.range(pb::RangeRequest {
                key: b"/registry/namespaces/default".to_vec(),
                revision: old,
                serializable: true,
                ..Default::default()
            });
            match tokio::time::timeout(Duration::from_secs(3), read).await {
                Ok(Err(e)) if e.code() == tonic::Code::OutOfRange => break,
                _ if Instant::now() > deadline => return,
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let on = member(j);
        let api: Api<ConfigMap> = self.shared.api(j);
        let wp = WatchParams::default()
            .labels(&format!("app={GONE_APP}"))
            .timeout(30);
        match self
            .shared
            .call(
                "watch from a compacted version",
                api.watch(&wp, &old.to_string()),
            )
            .await
        {
            Answer::Gone => self.explicit.gone_watch.0 += 1,
            Answer::Ok(stream) => {
                let mut stream = stream.boxed();
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    match tokio::time::timeout_at(deadline, stream.next()).await {
                        Ok(Some(Ok(WatchEvent::Bookmark(_)))) => continue,
                        Ok(Some(Ok(WatchEvent::Error(s)))) if s.code == 410 => {
                            self.shared.stats.gone.fetch_add(1, Ordering::Relaxed);
                            self.explicit.gone_watch.0 += 1;
                        }
                        Ok(Some(Ok(WatchEvent::Error(s)))) => {
                            self.explicit.gone_watch.0 += 1;
                            self.shared.violation(
                                Violation::NotGone,
                                format!("a watch from version {old} on {on}, compacted to {to}, said {} {}", s.code, s.message),
                            );
                        }
                        Ok(Some(Ok(
                            WatchEvent::Added(cm)
                            | WatchEvent::Modified(cm)
                            | WatchEvent::Deleted(cm),
                        ))) => {
                            self.explicit.gone_watch.0 += 1;
                            self.shared.violation(
                                Violation::NotGone,
                                format!(
                                    "a watch from version {old} on {on}, compacted to {to}, delivered {:?} at version {:?} instead of 410 Gone",
                                    cm.metadata.name, cm.metadata.resource_version
                                ),
                            );
                        }
                        Err(_) => {
                            self.explicit.gone_watch.0 += 1;
                            self.shared.violation(
                                Violation::NotGone,
                                format!("a watch from version {old} on {on}, compacted to {to}, said nothing for 10 s"),
                            );
                        }
                        // The member failed: no answer either way.
                        Ok(Some(Err(_))) | Ok(None) => {}
                    }
                    break;
                }
            }
            Answer::Failed => {}
            Answer::Conflict | Answer::NotFound => {
                self.explicit.gone_watch.0 += 1;
                self.shared.violation(
                    Violation::NotGone,
                    format!("a watch from version {old} on {on}, compacted to {to}, was refused with 409 or 404"),
                );
            }
        }
        match self
            .shared
            .call(
                "list with an old continue token",
                api.list(&lp.limit(1).continue_token(&token)),
            )
            .await
        {
            Answer::Gone => self.explicit.gone_continue.0 += 1,
            Answer::Ok(page) => {
                self.explicit.gone_continue.0 += 1;
                self.shared.violation(
                    Violation::NotGone,
                    format!(
                        "a continue token from version {old} gave a page at version {:?} on {on} after a compaction to {to}",
                        page.metadata.resource_version
                    ),
                );
            }
            _ => {}
        }
    }
}

/// Runs the campaign: `duration` of faults from `seed`, then the checks. Err only when the
/// cluster could not be set up at all.
pub async fn campaign(seed: u64, duration: Duration) -> Result<K8sSummary> {
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
        shared: shared.clone(),
        rng: StdRng::seed_from_u64(seed),
        pings: 0,
        explicit: Explicit::default(),
    };
    let mut order = FaultKind::ALL.to_vec();
    order.shuffle(&mut chaos.rng);
    let mut faults = Vec::new();
    let faulting = Instant::now();
    while faulting.elapsed() < duration {
        let kind = match order.get(faults.len()) {
            Some(k) => *k,
            None => *FaultKind::ALL
                .choose(&mut chaos.rng)
                .unwrap_or(&FaultKind::KillLeader),
        };
        // Most faults hit a rollout in flight.
        if faults.is_empty() || chaos.rng.gen_bool(0.7) {
            let _ = roll_now.send(());
        }
        let record = chaos.inject(kind).await;
        let recovered = record.to_api.is_some();
        let detail = record.detail.clone();
        faults.push(record);
        if !recovered || !chaos.all_serving().await {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_surge_resolves_as_kubernetes_does() {
        let cases = [
            (IntOrString::Int(1), 6, 1),
            (IntOrString::Int(0), 6, 0),
            (IntOrString::String("25%".into()), 6, 2),
            (IntOrString::String("25%".into()), 4, 1),
            (IntOrString::String("25%".into()), 3, 1),
            (IntOrString::String("50%".into()), 3, 2),
            (IntOrString::String("0%".into()), 6, 0),
            (IntOrString::String("100%".into()), 6, 6),
        ];
        for (surge, replicas, want) in cases {
            assert_eq!(
                resolve_surge(&surge, replicas).expect("resolves"),
                want,
                "{surge:?} of {replicas}"
            );
        }
        assert!(resolve_surge(&IntOrString::String("lots".into()), 6).is_err());
    }

    fn session(start: i64, covered: i64, events: &[(i64, &str)]) -> Session {
        Session {
            member: 0,
            start,
            covered,
            events: events.iter().map(|(r, n)| (*r, n.to_string())).collect(),
        }
    }

    #[test]
    fn gaps_are_acknowledged_writes_a_session_covered_but_did_not_deliver() {
        let acked: BTreeMap<i64, String> = [(11, "a"), (12, "b"), (14, "a"), (20, "c")]
            .into_iter()
            .map(|(r, n)| (r, n.to_string()))
            .collect();
        let cases: [(&str, Vec<Session>, usize); 7] = [
            (
                "a session that delivered nothing",
                vec![session(12, 12, &[])],
                0,
            ),
            (
                "everything delivered",
                vec![session(10, 14, &[(11, "a"), (12, "b"), (14, "a")])],
                0,
            ),
            (
                "a bookmark vouches for what it covers",
                vec![session(10, 15, &[(11, "a"), (12, "b")])],
                1,
            ),
            (
                "resumed without a gap",
                vec![
                    session(10, 12, &[(11, "a"), (12, "b")]),
                    session(12, 14, &[(14, "a")]),
                ],
                0,
            ),
            (
                "a range never covered (after 410) is not a gap",
                vec![session(10, 11, &[(11, "a")]), session(19, 20, &[(20, "c")])],
                0,
            ),
            (
                "a skipped write",
                vec![session(10, 20, &[(11, "a"), (14, "a"), (20, "c")])],
                1,
            ),
            (
                "the wrong object at an acknowledged version",
                vec![session(10, 12, &[(11, "a"), (12, "x")])],
                1,
            ),
        ];
        for (what, sessions, want) in cases {
            assert_eq!(gaps("w", &sessions, &acked).len(), want, "{what}");
        }
    }

    #[test]
    fn pods_over_the_limit_are_one_violation_per_excursion() {
        let shared = Shared {
            clients: Vec::new(),
            stats: Stats::default(),
            other_errors: Mutex::new(Vec::new()),
            found: Mutex::new(BTreeMap::new()),
            history: Mutex::new(History::default()),
            newest_acked: AtomicI64::new(0),
        };
        let pod = |uid: &str, node: Option<&str>, deleting: bool| -> Pod {
            let mut p = json!({"metadata": {"name": format!("p-{uid}"), "uid": uid},
                               "spec": {"containers": []}});
            if let Some(node) = node {
                p["spec"]["nodeName"] = json!(node);
            }
            if deleting {
                p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            serde_json::from_value(p).expect("a pod")
        };
        let mut v = Pods {
            limit: 2,
            now: HashMap::new(),
            bound: HashMap::new(),
            max_live: 0,
            over: false,
        };
        v.listed(
            &[pod("1", Some("a"), false), pod("2", None, false)],
            1,
            &shared,
        );
        v.event(false, &pod("3", None, false), 2, &shared);
        v.event(false, &pod("4", None, false), 3, &shared);
        v.event(false, &pod("1", Some("a"), true), 4, &shared);
        v.event(true, &pod("1", Some("a"), true), 5, &shared);
        v.event(true, &pod("4", None, false), 6, &shared);
        v.event(false, &pod("5", None, false), 7, &shared);
        v.event(false, &pod("2", Some("b"), false), 8, &shared);
        v.event(false, &pod("2", Some("a"), false), 9, &shared);
        let found = lock(&shared.found).clone();
        assert_eq!(v.max_live, 4);
        assert_eq!(
            found.get(&Violation::TooManyPods).map(|f| f.0),
            Some(2),
            "{found:?}"
        );
        assert_eq!(
            found.get(&Violation::PodOnTwoNodes).map(|f| f.0),
            Some(1),
            "{found:?}"
        );
    }
}
