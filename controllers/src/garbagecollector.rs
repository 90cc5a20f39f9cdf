//! The garbage collector: objects whose owners are all gone are deleted (Background
//! propagation, and what `kubectl delete deployment` relies on to remove its ReplicaSets and
//! pods); an owner deleted with Foreground propagation (finalizer `foregroundDeletion`) stays
//! until its dependents are gone; one deleted with Orphan (finalizer `orphan`) first has its
//! dependents released from their owner references.
//!
//! The graph is the informers' caches: each object by uid, and for each owner uid the
//! dependents that name it. An owner missing from the caches is looked up with a quorum read
//! before anything is deleted, so a lagging cache never deletes a live object's dependents.
//!
//! The collector follows many kinds and reads only their metadata: the informers' JSON objects
//! are read through a typed `ObjectMeta`, and API paths come from the served resource table.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    DeleteOptions, ObjectMeta, OwnerReference, Preconditions,
};
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_api::resources::Resource;
use rkube_core::meta::{key, name, namespace};
use serde::Deserialize;
use serde_json::{json, Value};

use rkube_runtime::client::delete_at;
use rkube_runtime::informer::Informer;
use rkube_runtime::queue::WorkQueue;

const WORKERS: usize = 2;
const ORPHAN: &str = "orphan";
const FOREGROUND: &str = "foregroundDeletion";

/// The resources the collector follows: (group, version, plural) of the served table.
const FOLLOWED: &[(&str, &str, &str)] = &[
    ("", "v1", "pods"),
    ("apps", "v1", "replicasets"),
    ("apps", "v1", "deployments"),
    ("apps", "v1", "daemonsets"),
    ("apps", "v1", "statefulsets"),
    // A StatefulSet's claims are owned by it or by a scaled-down pod (its retention policy).
    ("", "v1", "persistentvolumeclaims"),
    ("", "v1", "replicationcontrollers"),
    ("apps", "v1", "controllerrevisions"),
    ("discovery.k8s.io", "v1", "endpointslices"),
    ("", "v1", "endpoints"),
    ("batch", "v1", "jobs"),
    ("batch", "v1", "cronjobs"),
    ("", "v1", "configmaps"),
    ("", "v1", "secrets"),
    // Nodes own their Leases in kube-node-lease.
    ("", "v1", "nodes"),
    ("coordination.k8s.io", "v1", "leases"),
];

/// The served resources the collector follows; each one's store folder
/// ([`Resource::prefix`]) names its informer.
pub fn followed() -> Vec<&'static Resource> {
    FOLLOWED
        .iter()
        .filter_map(|(group, version, plural)| rkube_api::resources::find(group, version, plural))
        .collect()
}

/// The metadata of an object of any followed kind, the only part the collector reads (an
/// object whose metadata does not decode has none: no owners, no finalizers).
fn meta(o: &Value) -> ObjectMeta {
    o.get("metadata")
        .and_then(|m| ObjectMeta::deserialize(m).ok())
        .unwrap_or_default()
}

fn owner_refs(meta: &ObjectMeta) -> &[OwnerReference] {
    meta.owner_references.as_deref().unwrap_or_default()
}

fn owner_uids(meta: &ObjectMeta) -> Vec<String> {
    owner_refs(meta).iter().map(|r| r.uid.clone()).collect()
}

fn has_finalizer(meta: &ObjectMeta, f: &str) -> bool {
    meta.finalizers.iter().flatten().any(|x| x == f)
}

/// Where an object lives: (index into the followed resources, cache key).
type Place = (usize, String);

#[derive(Default)]
struct Graph {
    by_uid: HashMap<String, Place>,
    dependents: HashMap<String, HashSet<Place>>,
}

pub struct Collector {
    /// The followed resources and their informers, in the order of [`followed`].
    followed: Vec<(&'static Resource, Arc<Informer>)>,
    client: LocalClient,
    queue: Arc<WorkQueue>,
    graph: Mutex<Graph>,
}

impl Collector {
    /// The collector over the followed resources' informers.
    pub fn new(
        followed: Vec<(&'static Resource, Arc<Informer>)>,
        client: LocalClient,
    ) -> Arc<Collector> {
        let c = Arc::new(Collector {
            followed: followed.clone(),
            client,
            queue: Arc::new(WorkQueue::new()),
            graph: Mutex::new(Graph::default()),
        });
        for (i, (_, inf)) in followed.iter().enumerate() {
            let weak = Arc::downgrade(&c);
            inf.on_change(Box::new(move |old, new| {
                if let Some(c) = weak.upgrade() {
                    c.changed(i, old.map(meta).as_ref(), new.map(meta).as_ref());
                }
            }));
        }
        c
    }

    fn graph(&self) -> std::sync::MutexGuard<'_, Graph> {
        self.graph.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changed(&self, i: usize, old: Option<&ObjectMeta>, new: Option<&ObjectMeta>) {
        let mut g = self.graph();
        if let Some(o) = old {
            let place = (i, key(o));
            for owner in owner_uids(o) {
                if let Some(set) = g.dependents.get_mut(&owner) {
                    set.remove(&place);
                }
            }
        }
        match new {
            Some(n) => {
                let place = (i, key(n));
                let uid = n.uid.clone().unwrap_or_default();
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
                if n.deletion_timestamp.is_some()
                    && (has_finalizer(n, ORPHAN) || has_finalizer(n, FOREGROUND))
                {
                    self.queue.add(&format!("own {i} {}", place.1));
                }
            }
            None => {
                let Some(o) = old else { return };
                let uid = o.uid.clone().unwrap_or_default();
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
            self.followed.iter().map(|(_, inf)| inf.clone()).collect(),
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

    /// The metadata of the cached object at `place`.
    fn cached(&self, (i, key): (usize, &str)) -> Option<ObjectMeta> {
        let (_, inf) = self.followed.get(i)?;
        inf.get(key).map(|o| meta(&o))
    }

    /// The object a queue item (`<index> <key>`) names, as cached.
    fn lookup(&self, rest: &str) -> Option<(usize, ObjectMeta)> {
        let (i, key) = rest.split_once(' ')?;
        let i: usize = i.parse().ok()?;
        self.cached((i, key)).map(|m| (i, m))
    }

    fn path(&self, i: usize, meta: &ObjectMeta) -> String {
        self.followed[i].0.path(namespace(meta), name(meta))
    }

    /// Whether an owner reference still names a live object: the cache first, then the API.
    /// Answers the owner's metadata.
    async fn owner_state(
        &self,
        dependent: &ObjectMeta,
        r: &OwnerReference,
    ) -> Result<Option<ObjectMeta>, ApiError> {
        let cached = self.graph().by_uid.get(&r.uid).cloned();
        if let Some((i, key)) = cached {
            if let Some(o) = self.cached((i, &key)) {
                return Ok(Some(o));
            }
        }
        // Not (yet) in the caches: ask the API, by kind and name, and compare the uid.
        let group = r.api_version.split_once('/').map_or("", |(g, _)| g);
        let Some(res) = rkube_api::resources::by_kind(group, &r.kind) else {
            // A kind this server does not serve cannot exist here.
            return Ok(None);
        };
        let ns = if res.namespaced {
            namespace(dependent)
        } else {
            ""
        };
        let collection = rkube_core::path::collection_of(group, &r.api_version, res.plural, ns);
        match self.client.get(&format!("{collection}/{}", r.name)).await {
            Ok(o) => {
                let owner = meta(&o);
                Ok((owner.uid.as_deref() == Some(r.uid.as_str())).then_some(owner))
            }
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
        if dep.deletion_timestamp.is_some() {
            return Ok(false);
        }
        let refs = owner_refs(&dep);
        if refs.is_empty() {
            return Ok(false);
        }
        let mut live = 0;
        let mut waiting_foreground = false;
        for r in refs {
            if let Some(owner) = self.owner_state(&dep, r).await? {
                live += 1;
                if owner.deletion_timestamp.is_some()
                    && has_finalizer(&owner, FOREGROUND)
                    && r.block_owner_deletion == Some(true)
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
        let options = DeleteOptions {
            propagation_policy: Some(policy.into()),
            preconditions: Some(Preconditions {
                uid: dep.uid.clone(),
                resource_version: dep.resource_version.clone().filter(|rv| !rv.is_empty()),
            }),
            ..Default::default()
        };
        match delete_at(&self.client, &self.path(i, &dep), &options).await {
            Ok(()) => Ok(false),
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
        if owner.deletion_timestamp.is_none() {
            return Ok(false);
        }
        let uid = owner.uid.clone().unwrap_or_default();
        let deps: Vec<Place> = self
            .graph()
            .dependents
            .get(&uid)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        let live: Vec<(usize, ObjectMeta)> = deps
            .iter()
            .filter_map(|(di, dk)| self.cached((*di, dk)).map(|d| (*di, d)))
            .collect();
        let finalizer = if has_finalizer(&owner, ORPHAN) {
            for (di, d) in &live {
                let refs: Vec<&OwnerReference> =
                    owner_refs(d).iter().filter(|r| r.uid != uid).collect();
                let patch = json!({"metadata": {
                    "ownerReferences": if refs.is_empty() { Value::Null } else { json!(refs) },
                    "resourceVersion": d.resource_version.as_deref().unwrap_or(""),
                }});
                match self.client.merge_patch(&self.path(*di, d), &patch).await {
                    Ok(_) => {}
                    Err(e) if e.code == 404 => {}
                    Err(e) if e.code == 409 => return Ok(true),
                    Err(e) => return Err(e),
                }
            }
            ORPHAN
        } else if has_finalizer(&owner, FOREGROUND) {
            let blocking = live.iter().any(|(_, d)| {
                owner_refs(d)
                    .iter()
                    .any(|r| r.uid == uid && r.block_owner_deletion == Some(true))
            });
            if blocking {
                for (di, d) in &live {
                    if d.deletion_timestamp.is_none() {
                        self.queue.add(&format!("dep {di} {}", key(d)));
                    }
                }
                return Ok(true);
            }
            FOREGROUND
        } else {
            return Ok(false);
        };
        let remaining: Vec<&String> = owner
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != finalizer)
            .collect();
        let patch = json!({"metadata": {
            "finalizers": if remaining.is_empty() { Value::Null } else { json!(remaining) },
            "resourceVersion": owner.resource_version.as_deref().unwrap_or(""),
        }});
        match self.client.merge_patch(&self.path(i, &owner), &patch).await {
            Ok(_) => Ok(false),
            Err(e) if e.code == 404 => Ok(false),
            Err(e) if e.code == 409 => Ok(true),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_followed_resource_is_served() {
        let served = followed();
        assert_eq!(
            served.len(),
            FOLLOWED.len(),
            "a followed resource is not served"
        );
        let folders: Vec<String> = served.iter().map(|r| r.prefix(None)).collect();
        assert!(folders.contains(&"/registry/minions/".to_string()));
        assert!(folders.contains(&"/registry/services/endpoints/".to_string()));
        assert!(folders.contains(&"/registry/controllers/".to_string()));
    }

    #[test]
    fn metadata_is_read_from_any_kind() {
        let o = json!({"kind": "Whatever", "metadata": {"name": "a", "namespace": "ns",
            "uid": "u1", "finalizers": ["orphan"],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                 "uid": "u0", "blockOwnerDeletion": true}]},
            "spec": {"anything": 1}});
        let m = meta(&o);
        assert_eq!(key(&m), "ns/a");
        assert_eq!(owner_uids(&m), ["u0"]);
        assert!(has_finalizer(&m, ORPHAN) && !has_finalizer(&m, FOREGROUND));
        let broken = meta(&json!({"metadata": {"name": 3}}));
        assert!(owner_uids(&broken).is_empty());
    }
}
