//! The state the clients share: their API clients, request stats, the writers' history and
//! the violations found; and how a request goes to one member after another.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Result};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, Resource};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use super::violation::Violation;
use super::{DESCRIBED, NS, RECOVERY_BOUND, REQUEST_TIMEOUT, SERVERS};
use crate::Cluster;

/// How a request was answered.
pub(super) enum Answer<T> {
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
pub(super) struct Stats {
    pub(super) made: AtomicU64,
    pub(super) ok: AtomicU64,
    pub(super) conflict: AtomicU64,
    pub(super) gone: AtomicU64,
    pub(super) not_found: AtomicU64,
    pub(super) other: AtomicU64,
}

/// What the writers did, for the checks.
#[derive(Default)]
pub(super) struct History {
    /// Acknowledged creates and updates of the watched ConfigMaps: resourceVersion -> name.
    pub(super) acked: BTreeMap<i64, String>,
    /// Successful writes of the shared objects by the version they were based on:
    /// (name, version) -> (token, new version; 0 for a delete).
    from: HashMap<(String, i64), (String, i64)>,
    pub(super) updates_ok: usize,
    /// Newest acknowledged version of each object.
    newest: HashMap<String, i64>,
    /// Tokens of writes answered 409.
    pub(super) conflicted: HashSet<String>,
    /// Tokens seen in reads and watch events.
    pub(super) observed: HashSet<String>,
}

pub(super) struct Shared {
    pub(super) clients: Vec<Client>,
    pub(super) stats: Stats,
    pub(super) other_errors: Mutex<Vec<String>>,
    pub(super) found: Mutex<BTreeMap<Violation, (usize, Vec<String>)>>,
    pub(super) history: Mutex<History>,
    /// The newest version any acknowledged write made: a quorum read that starts later may
    /// not be older.
    pub(super) newest_acked: AtomicI64,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A client's name: its member's, or `endpoint` for the control-plane endpoint's.
pub(super) fn member(i: usize) -> String {
    if i == SERVERS {
        "endpoint".into()
    } else {
        format!("n{}", i + 1)
    }
}

pub(super) fn rv_of(meta: &ObjectMeta) -> Option<i64> {
    meta.resource_version.as_deref()?.parse().ok()
}

fn token_of(cm: &ConfigMap) -> Option<&str> {
    cm.data.as_ref()?.get("token").map(String::as_str)
}

impl Shared {
    pub(super) fn violation(&self, v: Violation, what: String) {
        let mut found = lock(&self.found);
        let entry = found.entry(v).or_default();
        entry.0 += 1;
        if entry.1.len() < DESCRIBED {
            entry.1.push(what);
        }
    }

    pub(super) fn other_error(&self, what: String) {
        let mut errors = lock(&self.other_errors);
        let kind: String = what.chars().take(60).collect();
        if errors.len() < 6 && !errors.iter().any(|e| e.starts_with(&kind)) {
            errors.push(what);
        }
    }

    /// Sends a request with a bound of its own, and counts how it was answered.
    pub(super) async fn call<T>(
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

    pub(super) fn api<K>(&self, i: usize) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.clients[i].clone(), NS)
    }

    pub(super) fn newest(&self, name: &str) -> i64 {
        lock(&self.history).newest.get(name).copied().unwrap_or(0)
    }

    pub(super) fn newest_acked(&self) -> i64 {
        self.newest_acked.load(Ordering::SeqCst)
    }

    pub(super) fn observe(&self, cm: &ConfigMap) {
        if let Some(t) = token_of(cm) {
            lock(&self.history).observed.insert(t.to_string());
        }
    }

    pub(super) fn conflicted(&self, token: &str) {
        lock(&self.history).conflicted.insert(token.to_string());
    }

    /// An acknowledged create or update of a watched ConfigMap.
    pub(super) fn acked(&self, name: &str, rv: i64) {
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
    pub(super) fn wrote_from(
        &self,
        name: &str,
        from: i64,
        to: Option<i64>,
        token: &str,
        on: usize,
    ) {
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
pub(super) struct Cursor {
    pub(super) member: usize,
    pub(super) members: usize,
}

impl Cursor {
    pub(super) fn next(&mut self) {
        self.member = (self.member + 1) % self.members;
    }
}

/// Sleeps for `d` unless told to stop first; returns whether to stop.
pub(super) async fn pause_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    let told = tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.wait_for(|s| *s) => true,
    };
    told || *stop.borrow()
}

pub(super) fn configmap(name: &str, labels: serde_json::Value, token: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "data": {"token": token},
    }))
    .unwrap_or_default()
}

fn client_config_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("the admin kubeconfig: {e}")
}

/// The admin's client of every server (its context in DIR/admin.kubeconfig), then of the
/// control-plane endpoint (the `rkube` context, which the leader serves).
pub(super) async fn clients(c: &Cluster) -> Result<Vec<Client>> {
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
pub(super) async fn until_ok<T, F>(shared: &Shared, what: &str, mut op: F) -> Result<()>
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
