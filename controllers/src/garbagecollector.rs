//! The garbage collector: objects whose owners are all gone are deleted (Background
//! propagation, and what `kubectl delete deployment` relies on to remove its ReplicaSets and
//! pods); an owner deleted with Foreground propagation (finalizer `foregroundDeletion`) stays
//! until its dependents are gone; one deleted with Orphan (finalizer `orphan`) first has its
//! dependents released from their owner references.
//!
//! The graph is the informers' caches: each object by uid, and for each owner uid the
//! dependents that name it. An owner missing from the caches is looked up with a quorum read
//! before anything is deleted, so a lagging cache never deletes a live object's dependents.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::json::str_at as s;
use serde_json::{json, Value};

use rkube_runtime::informer::{key_of, Informer};
use rkube_runtime::queue::WorkQueue;

const WORKERS: usize = 2;
const ORPHAN: &str = "orphan";
const FOREGROUND: &str = "foregroundDeletion";

/// The resources the collector follows: (store folder, API group/version base, plural).
pub const FOLLOWED: &[(&str, &str, &str)] = &[
    ("/registry/pods/", "/api/v1", "pods"),
    ("/registry/replicasets/", "/apis/apps/v1", "replicasets"),
    ("/registry/deployments/", "/apis/apps/v1", "deployments"),
    ("/registry/daemonsets/", "/apis/apps/v1", "daemonsets"),
    ("/registry/statefulsets/", "/apis/apps/v1", "statefulsets"),
    // A StatefulSet's claims are owned by it or by a scaled-down pod (its retention policy).
    (
        "/registry/persistentvolumeclaims/",
        "/api/v1",
        "persistentvolumeclaims",
    ),
    (
        "/registry/controllers/",
        "/api/v1",
        "replicationcontrollers",
    ),
    (
        "/registry/controllerrevisions/",
        "/apis/apps/v1",
        "controllerrevisions",
    ),
    (
        "/registry/endpointslices/",
        "/apis/discovery.k8s.io/v1",
        "endpointslices",
    ),
    ("/registry/services/endpoints/", "/api/v1", "endpoints"),
    ("/registry/jobs/", "/apis/batch/v1", "jobs"),
    ("/registry/cronjobs/", "/apis/batch/v1", "cronjobs"),
    ("/registry/configmaps/", "/api/v1", "configmaps"),
    ("/registry/secrets/", "/api/v1", "secrets"),
    // Nodes own their Leases in kube-node-lease.
    ("/registry/minions/", "/api/v1", "nodes"),
    (
        "/registry/leases/",
        "/apis/coordination.k8s.io/v1",
        "leases",
    ),
];

fn owner_uids(o: &Value) -> Vec<String> {
    o.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|rs| rs.iter().map(|r| s(r, "/uid").to_string()).collect())
        .unwrap_or_default()
}

fn has_finalizer(o: &Value, f: &str) -> bool {
    o.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|fs| fs.iter().any(|x| x == f))
}

/// Where an object lives: (index into FOLLOWED, cache key).
type Place = (usize, String);

#[derive(Default)]
struct Graph {
    by_uid: HashMap<String, Place>,
    dependents: HashMap<String, HashSet<Place>>,
}

pub struct Collector {
    informers: Vec<Arc<Informer>>,
    client: LocalClient,
    queue: Arc<WorkQueue>,
    graph: Mutex<Graph>,
}

impl Collector {
    /// The collector over the informers of FOLLOWED, in that order.
    pub fn new(informers: Vec<Arc<Informer>>, client: LocalClient) -> Arc<Collector> {
        let c = Arc::new(Collector {
            informers: informers.clone(),
            client,
            queue: Arc::new(WorkQueue::new()),
            graph: Mutex::new(Graph::default()),
        });
        for (i, inf) in informers.iter().enumerate() {
            let weak = Arc::downgrade(&c);
            inf.on_change(Box::new(move |old, new| {
                if let Some(c) = weak.upgrade() {
                    c.changed(i, old, new);
                }
            }));
        }
        c
    }

    fn graph(&self) -> std::sync::MutexGuard<'_, Graph> {
        self.graph.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changed(&self, i: usize, old: Option<&Value>, new: Option<&Value>) {
        let mut g = self.graph();
        if let Some(o) = old {
            let place = (i, key_of(o));
            for owner in owner_uids(o) {
                if let Some(set) = g.dependents.get_mut(&owner) {
                    set.remove(&place);
                }
            }
        }
        match new {
            Some(n) => {
                let place = (i, key_of(n));
                let uid = s(n, "/metadata/uid").to_string();
                g.by_uid.insert(uid, place.clone());
                let owners = owner_uids(n);
                for owner in &owners {
                    g.dependents
                        .entry(owner.clone())
                        .or_default()
                        .insert(place.clone());
                }
                drop(g);
                if !owners.is_empty() {
                    self.queue.add(&format!("dep {i} {}", place.1));
                }
                if n.pointer("/metadata/deletionTimestamp").is_some()
                    && (has_finalizer(n, ORPHAN) || has_finalizer(n, FOREGROUND))
                {
                    self.queue.add(&format!("own {i} {}", place.1));
                }
            }
            None => {
                let Some(o) = old else { return };
                let uid = s(o, "/metadata/uid").to_string();
                g.by_uid.remove(&uid);
                let deps: Vec<Place> = g
                    .dependents
                    .get(&uid)
                    .map(|d| d.iter().cloned().collect())
                    .unwrap_or_default();
                drop(g);
                for (di, dk) in deps {
                    self.queue.add(&format!("dep {di} {dk}"));
                }
                // A dependent's owner that was being deleted in the foreground may now finish.
                for owner in owner_uids(o) {
                    let place = self.graph().by_uid.get(&owner).cloned();
                    if let Some((oi, ok)) = place {
                        self.queue.add(&format!("own {oi} {ok}"));
                    }
                }
            }
        }
    }

    pub fn run(self: &Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let c = self.clone();
        rkube_runtime::queue::run_workers(
            "garbage-collector",
            self.queue.clone(),
            WORKERS,
            self.informers.clone(),
            stop,
            move |item| {
                let c = c.clone();
                async move {
                    let again = match item.split_once(' ') {
                        Some(("dep", rest)) => c.check_dependent(rest).await?,
                        Some(("own", rest)) => c.finish_owner(rest).await?,
                        _ => false,
                    };
                    Ok(again.then_some(Duration::from_millis(500)))
                }
            },
        );
    }

    fn lookup(&self, rest: &str) -> Option<(usize, Arc<Value>)> {
        let (i, key) = rest.split_once(' ')?;
        let i: usize = i.parse().ok()?;
        let inf = self.informers.get(i)?;
        inf.get(key).map(|o| (i, o))
    }

    fn path(i: usize, o: &Value) -> String {
        let (_, base, plural) = FOLLOWED[i];
        match o.pointer("/metadata/namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() => {
                format!("{base}/namespaces/{ns}/{plural}/{}", s(o, "/metadata/name"))
            }
            _ => format!("{base}/{plural}/{}", s(o, "/metadata/name")),
        }
    }

    /// Whether an owner reference still names a live object: the cache first, then the API.
    async fn owner_state(&self, dependent: &Value, r: &Value) -> Result<Option<Value>, ApiError> {
        let uid = s(r, "/uid");
        let cached = self.graph().by_uid.get(uid).cloned();
        if let Some((i, key)) = cached {
            if let Some(o) = self.informers[i].get(&key) {
                return Ok(Some(o.as_ref().clone()));
            }
        }
        // Not (yet) in the caches: ask the API, by kind and name, and compare the uid.
        let api_version = s(r, "/apiVersion");
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let Some(res) = rkube_api::resources::by_kind(group, s(r, "/kind")) else {
            // A kind this server does not serve cannot exist here.
            return Ok(None);
        };
        let base = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if res.namespaced {
            format!(
                "{base}/namespaces/{}/{}/{}",
                s(dependent, "/metadata/namespace"),
                res.plural,
                s(r, "/name")
            )
        } else {
            format!("{base}/{}/{}", res.plural, s(r, "/name"))
        };
        match self.client.get(&path).await {
            Ok(o) if s(&o, "/metadata/uid") == uid => Ok(Some(o)),
            Ok(_) => Ok(None),
            Err(e) if e.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes a dependent whose owners are all gone, or whose owner waits for it in the
    /// foreground. Returns whether to look again.
    async fn check_dependent(&self, rest: &str) -> Result<bool, ApiError> {
        let Some((i, dep)) = self.lookup(rest) else {
            return Ok(false);
        };
        if dep.pointer("/metadata/deletionTimestamp").is_some() {
            return Ok(false);
        }
        let refs: Vec<Value> = dep
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if refs.is_empty() {
            return Ok(false);
        }
        let mut live = 0;
        let mut waiting_foreground = false;
        for r in &refs {
            if let Some(owner) = self.owner_state(&dep, r).await? {
                live += 1;
                if owner.pointer("/metadata/deletionTimestamp").is_some()
                    && has_finalizer(&owner, FOREGROUND)
                    && r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true)
                {
                    waiting_foreground = true;
                }
            }
        }
        let policy = if live == 0 {
            "Background"
        } else if waiting_foreground && live == 1 {
            "Foreground"
        } else {
            return Ok(false);
        };
        // # Correctness
        // The dependent is deleted only as the cache saw it: its owner references may have
        // changed since (released by an Orphan deletion whose owner's event came first), and
        // then the precondition fails and the newer event brings another check.
        let mut preconditions = json!({"uid": s(&dep, "/metadata/uid")});
        let seen = s(&dep, "/metadata/resourceVersion");
        if !seen.is_empty() {
            preconditions["resourceVersion"] = json!(seen);
        }
        let options = json!({"kind": "DeleteOptions", "apiVersion": "v1",
            "propagationPolicy": policy, "preconditions": preconditions});
        match self
            .client
            .delete(&Self::path(i, &dep), Some(&options))
            .await
        {
            Ok(_) => Ok(false),
            Err(e) if e.code == 404 || e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// An owner being deleted with Orphan or Foreground propagation: release or wait for its
    /// dependents, then remove the finalizer. Returns whether to look again.
    async fn finish_owner(&self, rest: &str) -> Result<bool, ApiError> {
        let Some((i, owner)) = self.lookup(rest) else {
            return Ok(false);
        };
        if owner.pointer("/metadata/deletionTimestamp").is_none() {
            return Ok(false);
        }
        let uid = s(&owner, "/metadata/uid").to_string();
        let deps: Vec<Place> = self
            .graph()
            .dependents
            .get(&uid)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        let live: Vec<(usize, Arc<Value>)> = deps
            .iter()
            .filter_map(|(di, dk)| self.informers[*di].get(dk).map(|d| (*di, d)))
            .collect();
        let finalizer = if has_finalizer(&owner, ORPHAN) {
            for (di, d) in &live {
                let refs: Vec<Value> = d
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .map(|rs| rs.iter().filter(|r| s(r, "/uid") != uid).cloned().collect())
                    .unwrap_or_default();
                let patch = json!({"metadata": {
                    "ownerReferences": if refs.is_empty() { Value::Null } else { json!(refs) },
                    "resourceVersion": s(d, "/metadata/resourceVersion"),
                }});
                match self.client.merge_patch(&Self::path(*di, d), &patch).await {
                    Ok(_) => {}
                    Err(e) if e.code == 404 => {}
                    Err(e) if e.code == 409 => return Ok(true),
                    Err(e) => return Err(e),
                }
            }
            ORPHAN
        } else if has_finalizer(&owner, FOREGROUND) {
            let blocking: Vec<&(usize, Arc<Value>)> = live
                .iter()
                .filter(|(_, d)| {
                    d.pointer("/metadata/ownerReferences")
                        .and_then(Value::as_array)
                        .is_some_and(|rs| {
                            rs.iter().any(|r| {
                                s(r, "/uid") == uid
                                    && r.get("blockOwnerDeletion").and_then(Value::as_bool)
                                        == Some(true)
                            })
                        })
                })
                .collect();
            if !blocking.is_empty() {
                for (di, d) in &live {
                    if d.pointer("/metadata/deletionTimestamp").is_none() {
                        self.queue.add(&format!("dep {di} {}", key_of(d)));
                    }
                }
                return Ok(true);
            }
            FOREGROUND
        } else {
            return Ok(false);
        };
        let remaining: Vec<Value> = owner
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .map(|fs| fs.iter().filter(|f| *f != finalizer).cloned().collect())
            .unwrap_or_default();
        let patch = json!({"metadata": {
            "finalizers": if remaining.is_empty() { Value::Null } else { json!(remaining) },
            "resourceVersion": s(&owner, "/metadata/resourceVersion"),
        }});
        match self
            .client
            .merge_patch(&Self::path(i, &owner), &patch)
            .await
        {
            Ok(_) => Ok(false),
            Err(e) if e.code == 404 => Ok(false),
            Err(e) if e.code == 409 => Ok(true),
            Err(e) => Err(e),
        }
    }
}
