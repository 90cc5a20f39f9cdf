//! A controller as kube-rs' runtime builds one: a primary kind whose objects are reconciled,
//! the kinds it owns (a change of a child reconciles the object its controller owner reference
//! names) and other kinds it watches through a mapper; then workers that take keys from a
//! [`WorkQueue`] and call `reconcile(object, ctx)`, which says when to look again.
//!
//! ```text
//! Controller::new("replicaset-controller", sets)
//!     .owns(&pods)
//!     .watches(&pods, move |old, new| orphans_selected_by_a_set(old, new))
//!     .run(WORKERS, stop, ctx, |set, ctx| async move { ctx.reconcile(&set).await });
//! ```
//!
//! The queue keeps Kubernetes' guarantees: a key waits at most once however often it changes,
//! one key is never reconciled by two workers at once, and a failed reconcile comes back after
//! a backoff that doubles with each failure in a row.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rkube_core::meta::{controller_of, namespace};
use tokio::sync::watch;

use crate::queue::{run_workers_when_synced, WorkQueue};
use crate::store::{Object, Store};

/// What a reconcile asks for: to be called again after a while, or only when something
/// changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Action {
    pub requeue_after: Option<Duration>,
}

impl Action {
    /// Look again after `after`, even if nothing changes (a deadline, a wait for availability).
    pub fn requeue(after: Duration) -> Action {
        Action {
            requeue_after: Some(after),
        }
    }

    /// Look again only when the object or what it owns or watches changes.
    pub fn await_change() -> Action {
        Action {
            requeue_after: None,
        }
    }
}

/// Called, in a worker, with the key of a primary object that is no longer in the cache.
type Gone = Arc<dyn Fn(&str) + Send + Sync>;

pub struct Controller<K> {
    name: &'static str,
    primary: Arc<Store<K>>,
    queue: Arc<WorkQueue>,
    /// Every view the workers wait on before the first reconcile.
    synced: Vec<watch::Receiver<bool>>,
    gone: Option<Gone>,
}

/// The key of the `K` that controls `child`, if its controller owner reference names a `K`
/// (kind only, as Kubernetes resolves it; the reconcile checks the uid when it claims).
pub fn owner_key<K: Object>(child: &ObjectMeta) -> Option<String> {
    let owner = controller_of(child).filter(|r| r.kind == K::KIND)?;
    Some(match namespace(child) {
        "" => owner.name.clone(),
        ns => format!("{ns}/{}", owner.name),
    })
}

impl<K: Object> Controller<K> {
    /// A controller of the objects in `primary`: each change of one (an add, an update, a
    /// delete) queues its key.
    pub fn new(name: &'static str, primary: Arc<Store<K>>) -> Controller<K> {
        Controller::selecting(name, primary, |_| true)
    }

    /// A controller of the objects in `primary` that `selected` admits, as kube-rs' watcher
    /// with a field selector (kube-scheduler's informer of the pods without a node): a change
    /// after which the object is selected queues its key, and so does the delete of a selected
    /// one; the others are not looked at.
    pub fn selecting(
        name: &'static str,
        primary: Arc<Store<K>>,
        selected: impl Fn(&K) -> bool + Send + Sync + 'static,
    ) -> Controller<K> {
        let queue = Arc::new(WorkQueue::new());
        let q = queue.clone();
        primary.on_change(Box::new(move |old, new| {
            let queued = match new {
                Some(n) => selected(n).then_some(n),
                None => old.filter(|o| selected(o)),
            };
            if let Some(o) = queued {
                q.add(&rkube_core::meta::key(o.metadata()));
            }
        }));
        Controller {
            name,
            synced: vec![primary.synced()],
            primary,
            queue,
            gone: None,
        }
    }

    /// Children of type `C`: a change of one queues the `K` its controller owner reference
    /// names, before and after the change (an owner that let go is looked at too).
    pub fn owns<C: Object>(mut self, child: &Arc<Store<C>>) -> Self {
        let q = self.queue.clone();
        child.on_change(Box::new(move |old, new| {
            let before = old.and_then(|o| owner_key::<K>(o.metadata()));
            let after = new.and_then(|n| owner_key::<K>(n.metadata()));
            if let Some(k) = &after {
                q.add(k);
            }
            if let Some(k) = before.filter(|b| after.as_ref() != Some(b)) {
                q.add(&k);
            }
        }));
        self.synced.push(child.synced());
        self
    }

    /// Objects of another type: `mapper` turns each change (old, new) into the keys of the
    /// `K`s to reconcile.
    pub fn watches<O: Object>(
        mut self,
        other: &Arc<Store<O>>,
        mapper: impl Fn(Option<&Arc<O>>, Option<&Arc<O>>) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        let q = self.queue.clone();
        other.on_change(Box::new(move |old, new| {
            for key in mapper(old, new) {
                q.add(&key);
            }
        }));
        self.synced.push(other.synced());
        self
    }

    /// What to do, in the worker and in turn with the key's reconciles, when a queued key's
    /// object is gone (forget what was remembered about it).
    pub fn on_gone(mut self, gone: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.gone = Some(Arc::new(gone));
        self
    }

    /// The queue, to add keys from elsewhere.
    pub fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    /// Starts `workers` workers that call `reconcile(object, ctx)` for each queued key whose
    /// object is in the cache, once every view holds its first list; they end with `stop`.
    /// An error brings the key back after a backoff; an [`Action::requeue`] after its delay.
    pub fn run<C, F, Fut, E>(
        self,
        workers: usize,
        stop: watch::Receiver<bool>,
        ctx: Arc<C>,
        reconcile: F,
    ) where
        C: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Action, E>> + Send,
        E: std::fmt::Display + Send + 'static,
    {
        self.run_with_cleanup(workers, stop, ctx, reconcile, |_, _| {
            std::future::ready(Ok(Action::await_change()))
        });
    }

    /// [`Controller::run`], and `cleanup(key, ctx)` for a queued key whose object is gone (after
    /// [`Controller::on_gone`]): what the object's controller removes itself because nothing
    /// owns it (a Service's Endpoints). A failed cleanup comes back like a failed reconcile.
    pub fn run_with_cleanup<C, F, Fut, G, GFut, E>(
        self,
        workers: usize,
        stop: watch::Receiver<bool>,
        ctx: Arc<C>,
        reconcile: F,
        cleanup: G,
    ) where
        C: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Action, E>> + Send,
        G: Fn(String, Arc<C>) -> GFut + Send + Sync + 'static,
        GFut: std::future::Future<Output = Result<Action, E>> + Send,
        E: std::fmt::Display + Send + 'static,
    {
        let (reconcile, cleanup) = (Arc::new(reconcile), Arc::new(cleanup));
        let (primary, gone) = (self.primary, self.gone);
        run_workers_when_synced(
            self.name,
            self.queue,
            workers,
            self.synced,
            stop,
            move |key: String| {
                let object = primary.get(&key);
                let (ctx, reconcile, cleanup, gone) = (
                    ctx.clone(),
                    reconcile.clone(),
                    cleanup.clone(),
                    gone.clone(),
                );
                async move {
                    let action = match object {
                        Some(o) => reconcile(o, ctx).await,
                        None => {
                            if let Some(gone) = gone {
                                gone(&key);
                            }
                            cleanup(key, ctx).await
                        }
                    };
                    action.map(|a| a.requeue_after)
                }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::informer::Informer;
    use crate::store::tests::pod;
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{json, Value};
    use std::sync::Mutex;

    fn set(name: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
               "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
               "spec": {"selector": {"matchLabels": {"app": name}}}})
    }

    fn owned(name: &str, kind: &str, owner: &str) -> Value {
        let mut p = pod(name, json!({}));
        p["metadata"]["ownerReferences"] = json!([
            {"apiVersion": "apps/v1", "kind": kind, "name": owner, "uid": "u", "controller": true}]);
        p
    }

    /// The keys a controller's queue hands out, in order, until it is empty.
    async fn drain(q: &WorkQueue) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(Some(k)) = tokio::time::timeout(Duration::from_millis(50), q.next()).await {
            q.done(&k);
            out.push(k);
        }
        out
    }

    #[tokio::test]
    async fn primaries_owned_children_and_watched_objects_queue_the_right_keys() {
        let (sets, pods) = (
            Informer::new("/registry/replicasets/"),
            Informer::new("/registry/pods/"),
        );
        let c = Controller::new("test", sets.typed::<ReplicaSet>())
            .owns(&pods.typed::<Pod>())
            .watches(&pods.typed::<Pod>(), |_, new| {
                // Orphans labelled for a set queue it (adoption).
                new.filter(|p| rkube_core::meta::controller_of(&p.metadata).is_none())
                    .and_then(|p| p.metadata.labels.as_ref()?.get("app").cloned())
                    .map(|app| vec![format!("ns/{app}")])
                    .unwrap_or_default()
            });
        let q = c.queue().clone();
        sets.inject(None, Some(&set("a")));
        sets.inject(None, Some(&set("b")));
        assert_eq!(drain(&q).await, ["ns/a", "ns/b"], "adds");
        sets.inject(Some(&set("b")), None);
        assert_eq!(drain(&q).await, ["ns/b"], "a delete");
        pods.inject(None, Some(&owned("p1", "ReplicaSet", "a")));
        pods.inject(None, Some(&owned("p2", "Deployment", "d")));
        assert_eq!(
            drain(&q).await,
            ["ns/a"],
            "only a controller of the kind counts"
        );
        // Handed from one owner to another: both are looked at.
        pods.inject(
            Some(&owned("p1", "ReplicaSet", "a")),
            Some(&owned("p1", "ReplicaSet", "c")),
        );
        assert_eq!(drain(&q).await, ["ns/c", "ns/a"]);
        pods.inject(None, Some(&pod("orphan", json!({"app": "z"}))));
        assert_eq!(drain(&q).await, ["ns/z"], "mapped by the watcher");
        pods.inject(Some(&owned("p1", "ReplicaSet", "c")), None);
        assert_eq!(drain(&q).await, ["ns/c"], "a deleted child");
    }

    #[tokio::test]
    async fn a_selecting_controller_queues_only_what_it_selects() {
        let pods = Informer::new("/registry/pods/");
        let unassigned = |p: &Pod| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_none_or(str::is_empty)
        };
        let c = Controller::selecting("test", pods.typed::<Pod>(), unassigned);
        let q = c.queue().clone();
        let bound = |name: &str| {
            let mut p = pod(name, json!({}));
            p["spec"] = json!({"nodeName": "n1", "containers": []});
            p
        };
        pods.inject(None, Some(&pod("a", json!({}))));
        pods.inject(None, Some(&bound("b")));
        assert_eq!(drain(&q).await, ["ns/a"], "a bound pod is not selected");
        pods.inject(Some(&pod("a", json!({}))), Some(&bound("a")));
        assert_eq!(drain(&q).await, Vec::<String>::new(), "bound meanwhile");
        pods.inject(Some(&bound("b")), None);
        pods.inject(None, Some(&pod("c", json!({}))));
        pods.inject(Some(&pod("c", json!({}))), None);
        assert_eq!(drain(&q).await, ["ns/c"], "only a selected object's delete");
    }

    #[tokio::test]
    async fn workers_reconcile_present_objects_and_report_gone_ones() {
        let sets = Informer::new("/registry/replicasets/");
        sets.inject(None, Some(&set("a")));
        let gone = Arc::new(Mutex::new(Vec::new()));
        let g = gone.clone();
        let c = Controller::new("test", sets.typed::<ReplicaSet>())
            .on_gone(move |k| g.lock().unwrap().push(k.to_string()));
        let q = c.queue().clone();
        let (tx, rx) = watch::channel(false);
        let calls = Arc::new(Mutex::new(0u32));
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        c.run(2, rx, calls.clone(), move |rs: Arc<ReplicaSet>, calls| {
            let done = done_tx.clone();
            async move {
                let n = {
                    let mut n = calls.lock().unwrap();
                    *n += 1;
                    *n
                };
                let _ = done.send(rs.metadata.name.clone());
                // The first call fails: the key comes back after a backoff.
                if n == 1 {
                    Err("first try fails")
                } else {
                    Ok(Action::await_change())
                }
            }
        });
        sets.mark_synced();
        q.add("ns/a");
        for why in ["the first call", "the retry after the failure"] {
            let name = tokio::time::timeout(Duration::from_secs(5), done_rx.recv()).await;
            assert_eq!(name.expect(why), Some(Some("a".into())), "{why}");
        }
        q.add("ns/missing");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while gone.lock().unwrap().is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the gone key was not reported"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(*gone.lock().unwrap(), ["ns/missing"]);
        assert_eq!(*calls.lock().unwrap(), 2);
        let _ = tx.send(true);
    }

    #[tokio::test]
    async fn a_gone_key_is_cleaned_up_and_a_failed_cleanup_comes_back() {
        let sets = Informer::new("/registry/replicasets/");
        sets.inject(None, Some(&set("a")));
        let c = Controller::new("test", sets.typed::<ReplicaSet>());
        let q = c.queue().clone();
        let (tx, rx) = watch::channel(false);
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        let cleanups = Arc::new(Mutex::new(0u32));
        c.run_with_cleanup(
            1,
            rx,
            cleanups.clone(),
            move |rs: Arc<ReplicaSet>, _| {
                let done = done_tx.clone();
                async move {
                    let _ = done.send(format!("reconcile {}", rkube_core::meta::key(&rs.metadata)));
                    Ok::<_, String>(Action::await_change())
                }
            },
            |key: String, cleanups| async move {
                let mut n = cleanups.lock().unwrap();
                *n += 1;
                // The first cleanup fails: the key comes back after a backoff.
                if *n == 1 {
                    Err(format!("cleanup of {key} failed"))
                } else {
                    Ok(Action::await_change())
                }
            },
        );
        sets.mark_synced();
        q.add("ns/a");
        let first = tokio::time::timeout(Duration::from_secs(5), done_rx.recv()).await;
        assert_eq!(first.expect("a reconcile"), Some("reconcile ns/a".into()));
        q.add("ns/gone");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while *cleanups.lock().unwrap() < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the failed cleanup did not come back"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(done_rx.try_recv().is_err(), "a gone key is not reconciled");
        let _ = tx.send(true);
    }
}
