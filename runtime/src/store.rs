//! A typed view of an informer's cache ([`Informer::typed`]): the objects decoded into one
//! k8s-openapi type, once per change as the informer takes it in, so that readers get `Arc<K>`
//! without decoding and handlers see typed old and new objects.
//!
//! # Correctness
//! The view changes inside the informer's handler, before the view's own handlers run, so a
//! handler that reads the view sees the change it is called for. An object that does not decode
//! (the API validated it, so this is not expected) is logged and left out of the view: to its
//! readers it is absent.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{Metadata, Resource};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::watch;

use crate::cache::Cache;
use crate::informer::{key_of, Informer};

/// What a typed view holds: a k8s-openapi object with standard metadata.
pub trait Object:
    Resource + Metadata<Ty = ObjectMeta> + DeserializeOwned + Send + Sync + 'static
{
}

impl<K> Object for K where
    K: Resource + Metadata<Ty = ObjectMeta> + DeserializeOwned + Send + Sync + 'static
{
}

/// Called with (old, new): an add has no old, a delete no new.
pub type TypedHandler<K> = crate::cache::Handler<K>;

pub struct Store<K> {
    /// The informer's keys (`namespace/name`, or `name`) -> the decoded object.
    cache: Cache<K>,
    synced: watch::Receiver<bool>,
}

fn decode<K: Object>(object: &Value) -> Option<Arc<K>> {
    <K as serde::Deserialize>::deserialize(object)
        .inspect_err(|e| {
            tracing::warn!(kind = K::KIND, object = %key_of(object), error = %e,
                "cannot read this object as its type; controllers leave it alone");
        })
        .ok()
        .map(Arc::new)
}

impl<K: Object> Store<K> {
    /// A view of `informer`'s cache, kept up to date by a handler on it.
    pub(crate) fn attach(informer: &Informer) -> Arc<Store<K>> {
        let store = Arc::new(Store {
            cache: Cache::default(),
            synced: informer.synced(),
        });
        let weak = Arc::downgrade(&store);
        informer.cache().on_change_seeded(
            Box::new(move |old, new| {
                let (Some(store), Some(key)) = (weak.upgrade(), new.or(old).map(|o| key_of(o)))
                else {
                    return;
                };
                store.cache.apply(key, new.and_then(|n| decode::<K>(n)));
            }),
            |objects| {
                for (key, object) in objects {
                    if let Some(o) = decode(object) {
                        store.cache.apply(key.clone(), Some(o));
                    }
                }
            },
        );
        store
    }

    /// Adds a handler of changes; handlers run in the order they were added.
    pub fn on_change(&self, h: TypedHandler<K>) {
        self.cache.on_change(h);
    }

    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.cache.get(key)
    }

    /// Every object whose key starts with `prefix` (`ns/` for one namespace, `` for all).
    pub fn list(&self, prefix: &str) -> Vec<Arc<K>> {
        self.cache.list(prefix)
    }

    /// Every object in `namespace`.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        self.list(&format!("{namespace}/"))
    }

    /// Whether the informer's first list is in, as a receiver to wait on.
    pub fn synced(&self) -> watch::Receiver<bool> {
        self.synced.clone()
    }

    /// Waits until the informer's first list is in the view.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.clone();
        let _ = rx.wait_for(|s| *s).await;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;
    use std::sync::Mutex;

    pub(crate) fn pod(name: &str, labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn the_view_follows_the_cache_and_decodes_each_change_once() {
        let informer = Informer::new("/registry/pods/");
        informer.inject(None, Some(&pod("early", json!({}))));
        let pods = informer.typed::<Pod>();
        assert!(
            Arc::ptr_eq(&pods, &informer.typed::<Pod>()),
            "one view per type"
        );
        assert!(pods.get("ns/early").is_some(), "seeded from the cache");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let view = Arc::downgrade(&pods);
        pods.on_change(Box::new(move |old, new| {
            let name = |p: Option<&Arc<Pod>>| p.and_then(|p| p.metadata.name.clone());
            // The view already holds the change a handler is called for.
            let held = view
                .upgrade()
                .and_then(|v| new.and_then(|n| v.get(&rkube_core::meta::key(&n.metadata))));
            s.lock()
                .unwrap()
                .push((name(old), name(new), held.is_some()));
        }));
        informer.inject(None, Some(&pod("web", json!({"app": "web"}))));
        let first = pods.get("ns/web").unwrap();
        assert!(
            Arc::ptr_eq(&first, &pods.get("ns/web").unwrap()),
            "not decoded per read"
        );
        assert_eq!(pods.in_namespace("ns").len(), 2);
        // A labels value that is not a string does not decode: the view leaves it out.
        informer.inject(
            Some(&pod("web", json!({"app": "web"}))),
            Some(&pod("web", json!({"app": 1}))),
        );
        assert!(pods.get("ns/web").is_none());
        informer.inject(Some(&pod("early", json!({}))), None);
        assert!(pods.get("ns/early").is_none());
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                (None, Some("web".into()), true),
                (Some("web".into()), None, false),
                (Some("early".into()), None, false),
            ]
        );
    }
}
