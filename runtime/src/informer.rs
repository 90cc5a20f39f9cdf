//! Shared informers: a cache of one resource's objects, filled from the member's own store (a
//! list at one revision, then a watch from the next), and handlers called with every change.
//! Controllers read the cache and enqueue keys from the handlers; they never read the store on
//! their own.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use rkube_api::storage::{decode, Freshness, ObjectStore};
use rkube_store::mvcc::types::{prefix_end, EventKind, KeyRange};
use rkube_store::mvcc::watch::{self as store_watch, WatchMessage, WatchSpec};
use rkube_store::server::node::Node;
use serde_json::Value;
use tokio::sync::watch;

use crate::cache::Cache;
use crate::store::{Object, Store};

/// Called with (old, new): an add has no old, a delete no new.
pub type Handler = Box<dyn Fn(Option<&Value>, Option<&Value>) + Send + Sync>;

pub struct Informer {
    /// The store folder, e.g. `/registry/pods/`.
    prefix: String,
    /// `namespace/name` (or `name`) -> object, with its resourceVersion.
    cache: Cache<Value>,
    synced: watch::Sender<bool>,
    /// The typed views of this cache, one per type, each a `Store<K>` ([`Informer::typed`]).
    typed: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl Informer {
    pub fn new(prefix: &str) -> Arc<Informer> {
        Arc::new(Informer {
            prefix: prefix.to_string(),
            cache: Cache::default(),
            synced: watch::channel(false).0,
            typed: Mutex::new(HashMap::new()),
        })
    }

    /// This cache's objects decoded as `K`, shared by every caller that asks for the same type:
    /// each change is decoded once, when it comes in, not at every read.
    pub fn typed<K: Object>(&self) -> Arc<Store<K>> {
        let mut typed = self.typed.lock().unwrap_or_else(|e| e.into_inner());
        let any = typed
            .entry(TypeId::of::<K>())
            .or_insert_with(|| Store::<K>::attach(self) as Arc<dyn Any + Send + Sync>)
            .clone();
        match any.downcast::<Store<K>>() {
            Ok(store) => store,
            // The map is keyed by the type it holds.
            Err(_) => unreachable!(
                "a typed store of another type under {}",
                std::any::type_name::<K>()
            ),
        }
    }

    /// Whether the first list is in the cache, as a receiver to wait on.
    pub fn synced(&self) -> watch::Receiver<bool> {
        self.synced.subscribe()
    }

    /// The JSON cache itself, for the typed views built on it.
    pub(crate) fn cache(&self) -> &Cache<Value> {
        &self.cache
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn on_change(&self, h: Handler) {
        self.cache.on_change(Box::new(move |old, new| {
            h(old.map(|o| &**o), new.map(|n| &**n))
        }));
    }

    pub fn get(&self, key: &str) -> Option<Arc<Value>> {
        self.cache.get(key)
    }

    /// Every cached object whose key starts with `prefix` (`ns/` for one namespace, `` for all).
    pub fn list(&self, prefix: &str) -> Vec<Arc<Value>> {
        self.cache.list(prefix)
    }

    /// Waits until the first list is in the cache.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Lists and watches until `stop` turns true. A compacted watch lists again; the handlers
    /// then see what changed in between as adds, updates and deletes.
    pub async fn run(self: Arc<Self>, node: Arc<Node>, mut stop: watch::Receiver<bool>) {
        let store = ObjectStore::new(node.clone());
        let end = prefix_end(self.prefix.as_bytes());
        loop {
            if *stop.borrow() {
                return;
            }
            let listed = store.range(&self.prefix, &end, 0, Freshness::Any).await;
            let (kvs, rev, _) = match listed {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, prefix = %self.prefix, "informer list failed");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    continue;
                }
            };
            let mut fresh = BTreeMap::new();
            for kv in &kvs {
                let key = String::from_utf8_lossy(&kv.key).to_string();
                if let (Some(rest), Ok(s)) = (key.strip_prefix(&self.prefix), decode(kv)) {
                    fresh.insert(rest.to_string(), Arc::new(s.object));
                }
            }
            let old = self.cache.replace(fresh.clone());
            for (k, v) in &fresh {
                match old.get(k) {
                    Some(o) if o == v => {}
                    o => self.cache.notify(o, Some(v)),
                }
            }
            for (k, o) in &old {
                if !fresh.contains_key(k) {
                    self.cache.notify(Some(o), None);
                }
            }
            self.synced.send_replace(true);
            let spec = WatchSpec {
                range: KeyRange::prefix(self.prefix.as_bytes().to_vec()),
                start_revision: rev + 1,
                ..Default::default()
            };
            let mut events = store_watch::start(node.mvcc.clone(), spec, 4096);
            loop {
                let msg = tokio::select! {
                    m = events.recv() => m,
                    _ = stop.changed() => return,
                };
                match msg {
                    Some(WatchMessage::Events { events, .. }) => {
                        for ev in events {
                            let key = String::from_utf8_lossy(&ev.kv.key).to_string();
                            let Some(rest) = key.strip_prefix(&self.prefix) else {
                                continue;
                            };
                            let new = match ev.kind {
                                EventKind::Put => decode(&ev.kv).ok().map(|s| Arc::new(s.object)),
                                EventKind::Delete => None,
                            };
                            self.cache.apply(rest.to_string(), new);
                        }
                    }
                    Some(WatchMessage::Progress { .. }) => {}
                    Some(WatchMessage::Compacted { .. }) | None => break,
                }
            }
        }
    }
}

impl Informer {
    /// The first list is in, for tests that fill the cache by [`Informer::inject`].
    #[cfg(test)]
    pub(crate) fn mark_synced(&self) {
        self.synced.send_replace(true);
    }

    /// A change as the watch would bring it (`old` names the object of a delete), for tests of
    /// what is built on informers.
    #[cfg(test)]
    pub(crate) fn inject(&self, old: Option<&Value>, new: Option<&Value>) {
        if let Some(key) = new.or(old).map(key_of) {
            self.cache.apply(key, new.cloned().map(Arc::new));
        }
    }
}

/// The cache key of an object: `namespace/name`, or `name` when cluster-scoped.
pub fn key_of(o: &Value) -> String {
    let name = o
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    match o.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}
