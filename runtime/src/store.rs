//! A typed view of an informer's cache ([`Informer::typed`]): the objects decoded into one
//! k8s-openapi type, once per change as the informer takes it in, so that readers get `Arc<K>`
//! without decoding and handlers see typed old and new objects.
//!
//! # Correctness
//! The view changes inside the informer's handler, before the view's own handlers run, so a
//! handler that reads the view sees the change it is called for. An object that does not decode
//! (the API validated it, so this is not expected) is logged and left out of the view: to its
//! readers it is absent.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

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

    /// A secondary index of this view: its objects grouped by `value_of` (a pod's node), kept
    /// up to date with the view, so a reader of one group does not walk every object. An
    /// object for which `value_of` answers None is in no group.
    pub fn index(
        &self,
        value_of: impl Fn(&K) -> Option<String> + Send + Sync + 'static,
    ) -> Arc<Index<K>> {
        let index = Arc::new(Index {
            value_of: Box::new(value_of),
            groups: RwLock::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&index);
        self.cache.on_change_seeded(
            Box::new(move |old, new| {
                if let Some(index) = weak.upgrade() {
                    index.change(old, new);
                }
            }),
            |objects| {
                for object in objects.values() {
                    index.change(None, Some(object));
                }
            },
        );
        index
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

/// What an [`Index`] groups an object by (None: in no group).
type IndexFn<K> = Box<dyn Fn(&K) -> Option<String> + Send + Sync>;

/// Objects of a [`Store`] grouped by a value computed from each ([`Store::index`]).
pub struct Index<K> {
    value_of: IndexFn<K>,
    /// value -> (object key -> object)
    groups: RwLock<HashMap<String, BTreeMap<String, Arc<K>>>>,
}

impl<K: Object> Index<K> {
    /// The objects whose value is `value`, in key order.
    pub fn get(&self, value: &str) -> Vec<Arc<K>> {
        self.groups
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(value)
            .map(|group| group.values().cloned().collect())
            .unwrap_or_default()
    }

    fn change(&self, old: Option<&Arc<K>>, new: Option<&Arc<K>>) {
        let mut groups = self.groups.write().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = old {
            if let Some(value) = (self.value_of)(old) {
                let key = rkube_core::meta::key(old.metadata());
                if let Some(group) = groups.get_mut(&value) {
                    group.remove(&key);
                    if group.is_empty() {
                        groups.remove(&value);
                    }
                }
            }
        }
        if let Some(new) = new {
            if let Some(value) = (self.value_of)(new) {
                let key = rkube_core::meta::key(new.metadata());
                groups.entry(value).or_default().insert(key, new.clone());
            }
        }
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

    #[test]
    fn an_index_groups_the_objects_as_they_change() {
        let on = |name: &str, node: &str| {
            let mut p = pod(name, json!({}));
            p["spec"] = json!({"nodeName": node});
            p
        };
        let informer = Informer::new("/registry/pods/");
        informer.inject(None, Some(&on("a", "n1")));
        let pods = informer.typed::<Pod>();
        let by_node = pods.index(|p: &Pod| p.spec.as_ref()?.node_name.clone());
        let names = |node: &str| -> Vec<String> {
            by_node
                .get(node)
                .iter()
                .map(|p| rkube_core::meta::name(&p.metadata).to_string())
                .collect()
        };
        assert_eq!(names("n1"), ["a"], "seeded from the view");
        informer.inject(None, Some(&on("b", "n1")));
        informer.inject(None, Some(&pod("pending", json!({}))));
        assert_eq!(names("n1"), ["a", "b"]);
        informer.inject(Some(&on("a", "n1")), Some(&on("a", "n2")));
        assert_eq!(
            (names("n1"), names("n2")),
            (vec!["b".into()], vec!["a".into()])
        );
        informer.inject(Some(&on("b", "n1")), None);
        assert!(names("n1").is_empty(), "a delete leaves the group");
        assert!(names("").is_empty(), "an unbound pod is in no group");
    }
}
