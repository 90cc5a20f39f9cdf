//! The ReplicaSet and ReplicationController controller: keep `spec.replicas` pods that match the
//! selector and name the set as their controller.
//!
//! A reconcile reads the set and the namespace's pods from the informers, adopts matching
//! orphans and releases owned pods that stopped matching, then creates pods from the template
//! (in slow-start batches of 1, 2, 4...) or deletes the surplus (unscheduled, then pending,
//! then not-ready, then the newest first), and writes the status. Expectations
//! ([`Expectations`]) make a reconcile wait until the informer has seen the pods the previous
//! one created or deleted, so a stale cache never creates twice. The two kinds differ only in
//! what [`ReplicatedSet`] reads from them.

mod expectations;
mod kinds;
mod rank;

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as MetaSelector, ObjectMeta};
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{controller_of, controller_ref, key, name, namespace};
use rkube_core::selector::LabelSelector;
use serde::Serialize;

pub use expectations::Expectations;

use crate::pods::{is_active, is_available, is_ready};
use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::controller::{owner_key, Action, Controller};
use rkube_runtime::events::{Recorder, NORMAL, WARNING};
use rkube_runtime::store::{Object, Store};

/// Most pods one reconcile creates or deletes (Kubernetes' burstReplicas).
const BURST: usize = 500;
/// Parallel reconciles.
const WORKERS: usize = 4;

/// The counts a set's status reports, the same for both kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub replicas: i32,
    pub fully_labeled: i32,
    pub ready: i32,
    pub available: i32,
    pub observed_generation: i64,
}

/// What the controller reads from and writes to a set, ReplicaSet or ReplicationController.
pub trait ReplicatedSet: Object + Serialize + Clone {
    /// The component its events are reported by.
    const COMPONENT: &'static str;
    /// `spec.replicas` (1 when unset).
    fn replicas(&self) -> i32;
    fn min_ready_seconds(&self) -> i32;
    /// The selector as a metav1.LabelSelector (an RC's is a plain map, or its template's
    /// labels).
    fn selector(&self) -> MetaSelector;
    fn template(&self) -> Option<&PodTemplateSpec>;
    /// The set with `counts` as its status (conditions kept), or None when that is its status
    /// already.
    fn with_counts(&self, counts: Counts) -> Option<Self>;
}

/// Kubernetes' validation refuses an empty selector, and a controller never claims every pod:
/// an empty one matches nothing.
fn selects(selector: &MetaSelector) -> Option<LabelSelector> {
    let empty = selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(|e| e.is_empty());
    (!empty).then(|| LabelSelector::from_selector(selector))
}

fn matches(selector: &Option<LabelSelector>, pod: &Pod) -> bool {
    selector
        .as_ref()
        .is_some_and(|s| s.matches_labels(pod.metadata.labels.as_ref()))
}

/// The reconciler's context: what a reconcile of one set reads and writes.
pub struct Sets<S> {
    kind: PhantomData<fn() -> S>,
    pods: Arc<Store<Pod>>,
    client: LocalClient,
    expectations: Arc<Expectations>,
    recorder: Recorder,
}

/// Starts the controller of the sets of kind `S` until `stop`.
pub fn start<S: ReplicatedSet>(
    sets: Arc<Store<S>>,
    pods: Arc<Store<Pod>>,
    client: LocalClient,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let expectations = Arc::new(Expectations::default());
    // # Correctness
    // Expectations count a pod event before the builder's handler (added after this one)
    // queues the set: a reconcile taking the key must see its own writes observed.
    let e = expectations.clone();
    pods.on_change(Box::new(move |old, new| observe::<S>(&e, old, new)));
    let selecting = {
        let sets = sets.clone();
        move |old: Option<&Arc<Pod>>, new: Option<&Arc<Pod>>| {
            orphan_selected_by::<S>(&sets, old, new)
        }
    };
    let gone = expectations.clone();
    let controller = Controller::new(S::COMPONENT, sets)
        .owns(&pods)
        .watches(&pods, selecting)
        .on_gone(move |key| gone.forget(key));
    let ctx = Arc::new(Sets {
        kind: PhantomData,
        pods,
        recorder: Recorder::new(client.clone(), S::COMPONENT),
        client,
        expectations,
    });
    controller.run(
        WORKERS,
        stop,
        ctx,
        |set: Arc<S>, ctx: Arc<Sets<S>>| async move { ctx.reconcile(&set).await },
    );
}

/// Counts a pod event against the expectations of the set that controls the pod.
pub(crate) fn observe<S: Object>(e: &Expectations, old: Option<&Arc<Pod>>, new: Option<&Arc<Pod>>) {
    match (old, new) {
        (None, Some(p)) => {
            if let Some(k) = owner_key::<S>(&p.metadata) {
                e.creation_observed(&k);
            }
        }
        (Some(p), None) => {
            if let Some(k) = owner_key::<S>(&p.metadata) {
                e.deletion_observed(&k, &key(&p.metadata));
            }
        }
        (Some(o), Some(n)) => {
            if let Some(k) = owner_key::<S>(&n.metadata) {
                if n.metadata.deletion_timestamp.is_some()
                    && o.metadata.deletion_timestamp.is_none()
                {
                    // Graceful deletion starts: as good as gone for the count.
                    e.deletion_observed(&k, &key(&n.metadata));
                }
            }
        }
        (None, None) => {}
    }
}

/// The sets in the pod's namespace whose selector matches it, when it is an orphan to adopt or
/// its labels changed.
fn orphan_selected_by<S: ReplicatedSet>(
    sets: &Store<S>,
    old: Option<&Arc<Pod>>,
    new: Option<&Arc<Pod>>,
) -> Vec<String> {
    let Some(pod) = new else {
        return Vec::new();
    };
    let orphan = controller_of(&pod.metadata).is_none_or(|r| r.kind != S::KIND);
    let relabelled = old.is_some_and(|o| o.metadata.labels != pod.metadata.labels);
    if !orphan && !relabelled {
        return Vec::new();
    }
    sets.in_namespace(namespace(&pod.metadata))
        .iter()
        .filter(|set| matches(&selects(&set.selector()), pod))
        .map(|set| key(set.metadata()))
        .collect()
}

impl<S: ReplicatedSet> Sets<S> {
    /// One reconcile of `set`; asks to look again while pods wait out minReadySeconds.
    async fn reconcile(&self, set: &S) -> Result<Action, ApiError> {
        let meta = set.metadata();
        let (set_key, ns) = (key(meta), namespace(meta));
        let uid = meta.uid.as_deref().unwrap_or("");
        let sel = selects(&set.selector());
        let deleting = meta.deletion_timestamp.is_some();

        // Claim: adopt matching orphans, release owned pods that no longer match.
        let mut owned: Vec<Arc<Pod>> = Vec::new();
        for pod in self.pods.in_namespace(ns) {
            let matching = matches(&sel, &pod);
            match controller_of(&pod.metadata) {
                Some(r) if r.uid == uid => {
                    if matching || deleting {
                        owned.push(pod);
                    } else {
                        crate::pods::release(&self.client, &pod, uid).await?;
                    }
                }
                Some(_) => {}
                None if matching && !deleting && is_active(&pod) => {
                    if let Some(adopted) = crate::pods::adopt(&self.client, set, &pod).await? {
                        owned.push(Arc::new(adopted));
                    }
                }
                None => {}
            }
        }
        let active: Vec<Arc<Pod>> = owned.iter().filter(|p| is_active(p)).cloned().collect();

        if self.expectations.satisfied(&set_key) && !deleting {
            let want = set.replicas().max(0) as usize;
            if active.len() < want {
                self.create_pods(&set_key, set, want - active.len()).await;
            } else if active.len() > want {
                self.delete_pods(&set_key, set, &active, active.len() - want)
                    .await;
            }
        }
        self.write_status(set, &owned).await?;
        let min_ready = i64::from(set.min_ready_seconds());
        let now = crate::pods::now();
        let waiting = active
            .iter()
            .any(|p| is_ready(p) && !is_available(p, min_ready, now));
        Ok(if min_ready > 0 && waiting {
            Action::requeue(Duration::from_secs(1))
        } else {
            Action::await_change()
        })
    }

    fn pods_in<'a>(&'a self, ns: &'a str) -> Objects<'a, Pod> {
        Objects::namespaced(&self.client, ns)
    }

    fn pod_from_template(set: &S) -> Pod {
        let meta = set.metadata();
        let template = set.template();
        let t = template.and_then(|t| t.metadata.as_ref());
        Pod {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-", name(meta))),
                namespace: Some(namespace(meta).to_string()),
                labels: t.and_then(|t| t.labels.clone()),
                annotations: t.and_then(|t| t.annotations.clone()),
                finalizers: t.and_then(|t| t.finalizers.clone()),
                owner_references: Some(vec![controller_ref(set)]),
                ..Default::default()
            },
            spec: Some(template.and_then(|t| t.spec.clone()).unwrap_or_default()),
            status: None,
        }
    }

    /// Creates `n` pods (at most a burst) in slow-start batches: 1, 2, 4... A batch with a
    /// failure stops the rest, which the expectations forget.
    async fn create_pods(&self, set_key: &str, set: &S, n: usize) {
        let n = n.min(BURST);
        self.expectations.expect_creations(set_key, n as i64);
        let pods = self.pods_in(namespace(set.metadata()));
        let pod = Self::pod_from_template(set);
        let mut done = 0;
        let mut batch = 1;
        while done < n {
            let size = batch.min(n - done);
            let results = futures::future::join_all((0..size).map(|_| pods.create(&pod))).await;
            let mut failed = 0;
            for r in results {
                match r {
                    Ok(created) => {
                        let msg = format!("Created pod: {}", name(&created.metadata));
                        self.recorder
                            .event_for(set, NORMAL, "SuccessfulCreate", &msg)
                            .await;
                    }
                    Err(e) => {
                        failed += 1;
                        self.expectations.creation_observed(set_key);
                        let msg = format!("Error creating: {}", e.message);
                        self.recorder
                            .event_for(set, WARNING, "FailedCreate", &msg)
                            .await;
                    }
                }
            }
            done += size;
            if failed > 0 {
                // The rest of this burst is not attempted: forget its expectations.
                for _ in done..n {
                    self.expectations.creation_observed(set_key);
                }
                return;
            }
            batch *= 2;
        }
    }

    async fn delete_pods(&self, set_key: &str, set: &S, active: &[Arc<Pod>], n: usize) {
        let n = n.min(BURST);
        let victims = rank::victims(active, n);
        self.expectations
            .expect_deletions(set_key, victims.iter().map(|p| key(&p.metadata)).collect());
        for pod in victims {
            let m = &pod.metadata;
            match self.pods_in(namespace(m)).delete(name(m)).await {
                Ok(()) => {
                    let msg = format!("Deleted pod: {}", name(m));
                    self.recorder
                        .event_for(set, NORMAL, "SuccessfulDelete", &msg)
                        .await;
                }
                Err(e) => {
                    self.expectations.deletion_observed(set_key, &key(m));
                    if e.code != 404 {
                        let msg = format!("Error deleting: {}", e.message);
                        self.recorder
                            .event_for(set, WARNING, "FailedDelete", &msg)
                            .await;
                    }
                }
            }
        }
    }

    async fn write_status(&self, set: &S, owned: &[Arc<Pod>]) -> Result<(), ApiError> {
        let template_labels = set
            .template()
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        let min_ready = i64::from(set.min_ready_seconds());
        let now = crate::pods::now();
        let active: Vec<&Arc<Pod>> = owned.iter().filter(|p| is_active(p)).collect();
        let count = |f: &dyn Fn(&Pod) -> bool| active.iter().filter(|p| f(p)).count() as i32;
        let counts = Counts {
            replicas: active.len() as i32,
            fully_labeled: count(&|p| {
                let labels = p.metadata.labels.as_ref();
                template_labels
                    .iter()
                    .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
            }),
            ready: count(&|p| is_ready(p)),
            available: count(&|p| is_available(p, min_ready, now)),
            observed_generation: set.metadata().generation.unwrap_or(1),
        };
        let Some(updated) = set.with_counts(counts) else {
            return Ok(());
        };
        let m = set.metadata();
        let objects = Objects::<S>::namespaced(&self.client, namespace(m));
        ignore_gone(objects.replace_status(name(m), &updated).await).map(|_| ())
    }
}
