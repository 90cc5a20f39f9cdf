//! What the informer's cache of JSON objects and each of its typed views ([`crate::store`]) are
//! made of: objects by key (`namespace/name`, or `name`), and handlers called with every change.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// Called with (old, new): an add has no old, a delete no new.
pub type Handler<T> = Box<dyn Fn(Option<&Arc<T>>, Option<&Arc<T>>) + Send + Sync>;

pub struct Cache<T> {
    objects: RwLock<BTreeMap<String, Arc<T>>>,
    handlers: RwLock<Vec<Handler<T>>>,
}

impl<T> Default for Cache<T> {
    fn default() -> Self {
        Cache {
            objects: RwLock::new(BTreeMap::new()),
            handlers: RwLock::new(Vec::new()),
        }
    }
}

impl<T> Cache<T> {
    /// Adds a handler of changes; handlers run in the order they were added.
    pub fn on_change(&self, h: Handler<T>) {
        self.handlers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(h);
    }

    /// Adds a handler after `seed` has seen the objects as they are: together they see every
    /// object once at least, however the cache changes meanwhile (a change between the look
    /// and the first event may be seen twice).
    pub fn on_change_seeded(&self, h: Handler<T>, seed: impl FnOnce(&BTreeMap<String, Arc<T>>)) {
        let mut handlers = self.handlers.write().unwrap_or_else(|e| e.into_inner());
        seed(&self.objects.read().unwrap_or_else(|e| e.into_inner()));
        handlers.push(h);
    }

    pub fn get(&self, key: &str) -> Option<Arc<T>> {
        self.objects
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    /// Every object whose key starts with `prefix` (`ns/` for one namespace, `` for all).
    pub fn list(&self, prefix: &str) -> Vec<Arc<T>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        objects
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// One change (None: deleted): into the cache, then, outside its lock, to the handlers.
    pub fn apply(&self, key: String, new: Option<Arc<T>>) {
        let old = {
            let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
            match &new {
                Some(n) => objects.insert(key, n.clone()),
                None => objects.remove(&key),
            }
        };
        if old.is_some() || new.is_some() {
            self.notify(old.as_ref(), new.as_ref());
        }
    }

    /// Replaces every object (a new list), answering the ones it held; the caller tells the
    /// handlers what changed.
    pub fn replace(&self, fresh: BTreeMap<String, Arc<T>>) -> BTreeMap<String, Arc<T>> {
        std::mem::replace(
            &mut *self.objects.write().unwrap_or_else(|e| e.into_inner()),
            fresh,
        )
    }

    pub fn notify(&self, old: Option<&Arc<T>>, new: Option<&Arc<T>>) {
        for h in self
            .handlers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            h(old, new);
        }
    }
}
