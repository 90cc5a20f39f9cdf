//! The StatefulSet controller: pods with a stable identity and storage, made and removed in
//! order, as Kubernetes' statefulset controller keeps them.
//!
//! A reconcile records the current template as a ControllerRevision ([`crate::history`]; the
//! update revision) and finds the revision the set's status names as current, claims the pods
//! named `<set>-<ordinal>` that match the selector, and decides what to do from them alone
//! ([`plan`]): missing ordinals get a pod (its PersistentVolumeClaims from the claim templates
//! first, [`identity`]), pods that ended are deleted to be made again, pods beyond the replicas
//! are deleted from the highest ordinal, and a RollingUpdate replaces old-revision pods from
//! the highest ordinal down to its partition; OnDelete leaves them for their users to delete.
//! The claims' owner references follow the PVC retention policy (the garbage collector then
//! deletes them with the set or with the scaled-down pod). Old revisions beyond
//! revisionHistoryLimit are pruned and the status written.
//!
//! No expectations are kept: a pod's name is its ordinal, so a stale cache can only ask for a
//! pod that exists (409, nothing done) or delete one that is gone (404).

mod identity;
mod plan;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodTemplateSpec};
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{name, namespace};
use rkube_core::selector::LabelSelector;
use serde_json::json;

use crate::history;
use crate::pods::{is_available, is_ready, phase};
use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::controller::{Action, Controller};
use rkube_runtime::events::{Recorder, NORMAL, WARNING};
use rkube_runtime::store::Store;

use identity::{claims_for, new_pod, ordinal_of, retention_refs, revision_of};
pub use identity::{POD_INDEX_LABEL, POD_NAME_LABEL};
use plan::{Input, Step, Which};

const COMPONENT: &str = "statefulset-controller";
const WORKERS: usize = 2;

/// The reconciler's context.
pub struct StatefulSets {
    pods: Arc<Store<Pod>>,
    claims: Arc<Store<PersistentVolumeClaim>>,
    revisions: Arc<Store<ControllerRevision>>,
    client: LocalClient,
    recorder: Recorder,
}

fn selector_of(set: &StatefulSet) -> Option<LabelSelector> {
    crate::pods::claiming_selector(&set.spec.as_ref()?.selector)
}

/// Whether the pod is one of the set's (by its name) and matches its selector.
fn member(set: &StatefulSet, pod: &Pod) -> bool {
    ordinal_of(name(&set.metadata), name(&pod.metadata)).is_some()
        && selector_of(set).is_some_and(|s| s.matches_labels(pod.metadata.labels.as_ref()))
}

/// Starts the StatefulSet controller until `stop`.
pub fn start(
    sets: Arc<Store<StatefulSet>>,
    pods: Arc<Store<Pod>>,
    claims: Arc<Store<PersistentVolumeClaim>>,
    revisions: Arc<Store<ControllerRevision>>,
    client: LocalClient,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let orphans = crate::pods::claimers(sets.clone(), member);
    let controller = Controller::new(COMPONENT, sets)
        .owns(&pods)
        .owns(&revisions)
        .watches(&pods, orphans);
    let ctx = Arc::new(StatefulSets {
        pods,
        claims,
        revisions,
        recorder: Recorder::new(client.clone(), COMPONENT),
        client,
    });
    controller.run(
        WORKERS,
        stop,
        ctx,
        |set: Arc<StatefulSet>, ctx: Arc<StatefulSets>| async move { ctx.reconcile(&set).await },
    );
}

/// The template a revision holds (its data is the patch that puts the template back).
fn template_of(r: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut t = history::data(r)?.pointer("/spec/template")?.clone();
    t.as_object_mut()?.shift_remove("$patch");
    serde_json::from_value(t).ok()
}

fn min_ready(set: &StatefulSet) -> i64 {
    i64::from(
        set.spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .unwrap_or(0),
    )
}

/// (start ordinal, replicas, OrderedReady, RollingUpdate partition or None for OnDelete).
fn shape(set: &StatefulSet) -> (i32, i32, bool, Option<i32>) {
    let spec = set.spec.clone().unwrap_or_default();
    let start = spec.ordinals.and_then(|o| o.start).unwrap_or(0);
    let replicas = spec.replicas.unwrap_or(1);
    let monotonic = spec.pod_management_policy.as_deref() != Some("Parallel");
    let strategy = spec.update_strategy.unwrap_or_default();
    let partition = match strategy.type_.as_deref() {
        Some("OnDelete") => None,
        _ => Some(
            strategy
                .rolling_update
                .and_then(|r| r.partition)
                .unwrap_or(0),
        ),
    };
    (start, replicas, monotonic, partition)
}

impl StatefulSets {
    fn pods_in<'a>(&'a self, ns: &'a str) -> Objects<'a, Pod> {
        Objects::namespaced(&self.client, ns)
    }

    fn claims_in<'a>(&'a self, ns: &'a str) -> Objects<'a, PersistentVolumeClaim> {
        Objects::namespaced(&self.client, ns)
    }

    async fn reconcile(&self, set: &StatefulSet) -> Result<Action, ApiError> {
        let meta = &set.metadata;
        let Some((update_rev, old_revisions)) =
            history::record(&self.revisions, &self.client, set).await?
        else {
            // A name collision was counted: the next reconcile hashes anew.
            return Ok(Action::requeue(Duration::from_millis(100)));
        };
        let update = name(&update_rev.metadata).to_string();
        let named = set
            .status
            .as_ref()
            .and_then(|s| s.current_revision.as_deref())
            .filter(|c| *c != update);
        let current_rev = named
            .and_then(|c| old_revisions.iter().find(|r| name(&r.metadata) == c))
            .unwrap_or(&update_rev);
        let current = name(&current_rev.metadata).to_string();
        let owned = crate::pods::claim(&self.client, &self.pods, set, |p| member(set, p)).await?;
        let set_name = name(meta);
        let mut pods: Vec<(i32, &Pod)> = owned
            .iter()
            .filter_map(|p| Some((ordinal_of(set_name, name(&p.metadata))?, p.as_ref())))
            .collect();
        pods.sort_by_key(|(o, _)| *o);
        let (start, replicas, monotonic, partition) = shape(set);
        let now = crate::pods::now();
        let mut waiting = false;
        // A set being deleted only has its status written.
        if meta.deletion_timestamp.is_none() {
            self.fix_claims(set, &pods, start, replicas).await;
            // A pending pod's claims that went missing are made again.
            for (ordinal, pod) in &pods {
                if *ordinal >= start && *ordinal < start + replicas && phase(pod) == "Pending" {
                    self.ensure_claims(set, *ordinal, name(&pod.metadata)).await;
                }
            }
            let plan = plan::plan(&Input {
                start,
                replicas,
                monotonic,
                partition,
                update_revision: &update,
                min_ready: min_ready(set),
                now,
                pods: &pods,
            });
            waiting = plan.waiting_for_available;
            self.apply(set, plan.steps, (current_rev, &update_rev))
                .await;
        }
        let live: HashSet<&str> = pods.iter().map(|(_, p)| revision_of(p)).collect();
        // Revisions are named for their hash; pods carry the revision's name.
        let live_hashes: HashSet<&str> = old_revisions
            .iter()
            .filter(|r| live.contains(name(&r.metadata)))
            .map(history::hash_of)
            .collect();
        let keep_current: Vec<ControllerRevision> = old_revisions
            .iter()
            .filter(|r| name(&r.metadata) != current)
            .cloned()
            .collect();
        history::prune(&self.client, set, &keep_current, &live_hashes).await?;
        let status = plan::status(set, &pods, &current, &update, now);
        if set.status.as_ref() != Some(&status) {
            let mut updated = set.clone();
            updated.status = Some(status);
            let objects = Objects::<StatefulSet>::namespaced(&self.client, namespace(meta));
            ignore_gone(objects.replace_status(name(meta), &updated).await)?;
        }
        // Pods Ready but not yet for minReadySeconds become available without an event.
        let min_ready = min_ready(set);
        waiting |= min_ready > 0
            && pods
                .iter()
                .any(|(_, p)| is_ready(p) && !is_available(p, min_ready, now));
        Ok(if waiting {
            Action::requeue(Duration::from_secs(1))
        } else {
            Action::await_change()
        })
    }

    /// Carries out the plan's steps, recording Kubernetes' events; a pod's claims are created
    /// before it.
    async fn apply(
        &self,
        set: &StatefulSet,
        steps: Vec<Step>,
        (current, update): (&ControllerRevision, &ControllerRevision),
    ) {
        let ns = namespace(&set.metadata);
        let set_name = name(&set.metadata);
        let creates = steps.iter().filter_map(|s| match s {
            Step::Create(ordinal, which) => Some((*ordinal, *which)),
            _ => None,
        });
        let made = futures::future::join_all(creates.map(|(ordinal, which)| {
            let revision = match which {
                Which::Current => current,
                Which::Update => update,
            };
            self.create_pod(set, ordinal, revision)
        }));
        made.await;
        for step in steps {
            let (pod, note) = match step {
                Step::Create(..) => continue,
                Step::Fix(pod, ordinal) => {
                    let patch = json!({"metadata": {"labels": {
                        POD_NAME_LABEL: pod, POD_INDEX_LABEL: ordinal.to_string()}}});
                    let fixed = self.pods_in(ns).merge_patch(&pod, &patch).await;
                    let what = format!("Pod {pod} in StatefulSet {set_name}");
                    let (done, failed) = (
                        format!("update {what} successful"),
                        format!("update {what} failed"),
                    );
                    self.record(set, "Update", fixed, 404, &done, &failed).await;
                    continue;
                }
                Step::Recreate { pod, failed } => {
                    let (reason, what) = if failed {
                        ("RecreatingFailedPod", "failed")
                    } else {
                        ("RecreatingTerminatedPod", "terminated")
                    };
                    let msg = format!("StatefulSet {ns}/{set_name} is recreating {what} Pod {pod}");
                    (pod, Some((reason, msg)))
                }
                Step::Condemn(pod) | Step::Update(pod) => (pod, None),
            };
            if let Some((reason, msg)) = note {
                self.recorder.event_for(set, WARNING, reason, &msg).await;
            }
            let deleted = self.pods_in(ns).delete(&pod).await;
            let what = format!("Pod {pod} in StatefulSet {set_name}");
            let done = format!("delete {what} successful");
            let failed = format!("delete {what} failed");
            self.record(set, "Delete", deleted, 404, &done, &failed)
                .await;
        }
    }

    /// Records Kubernetes' event for a write of a pod or claim: `Successful<verb>` with `done`,
    /// or `Failed<verb>` with `failed` and the error. An error of code `benign` (gone, already
    /// there: an earlier reconcile's work) records nothing. Answers whether to go on.
    async fn record<T>(
        &self,
        set: &StatefulSet,
        verb: &str,
        result: Result<T, ApiError>,
        benign: u16,
        done: &str,
        failed: &str,
    ) -> bool {
        match result {
            Ok(_) => {
                let reason = format!("Successful{verb}");
                self.recorder.event_for(set, NORMAL, &reason, done).await;
                true
            }
            Err(e) if e.code == benign => true,
            Err(e) => {
                let reason = format!("Failed{verb}");
                let msg = format!("{failed} error: {}", e.message);
                self.recorder.event_for(set, WARNING, &reason, &msg).await;
                false
            }
        }
    }

    /// Creates the claims of the pod of `ordinal` that do not exist, then the pod.
    async fn create_pod(&self, set: &StatefulSet, ordinal: i32, revision: &ControllerRevision) {
        let ns = namespace(&set.metadata);
        let set_name = name(&set.metadata);
        let template = template_of(revision)
            .or_else(|| set.spec.as_ref().map(|s| s.template.clone()))
            .unwrap_or_default();
        let pod = new_pod(set, &template, ordinal, name(&revision.metadata));
        let pod_name = name(&pod.metadata).to_string();
        if !self.ensure_claims(set, ordinal, &pod_name).await {
            return;
        }
        let created = self.pods_in(ns).create(&pod).await;
        let what = format!("Pod {pod_name} in StatefulSet {set_name}");
        let (done, failed) = (
            format!("create {what} successful"),
            format!("create {what} failed"),
        );
        self.record(set, "Create", created, 409, &done, &failed)
            .await;
    }

    /// Creates the claims of the pod of `ordinal` that do not exist; false when the pod must
    /// wait (a claim failed, or is still being deleted).
    async fn ensure_claims(&self, set: &StatefulSet, ordinal: i32, pod_name: &str) -> bool {
        let ns = namespace(&set.metadata);
        let set_name = name(&set.metadata);
        for mut claim in claims_for(set, ordinal) {
            let claim_name = name(&claim.metadata).to_string();
            if let Some(existing) = self.claims.get(&format!("{ns}/{claim_name}")) {
                if existing.metadata.deletion_timestamp.is_some() {
                    // The pod waits for its claim to be gone and made again.
                    return false;
                }
                continue;
            }
            if let Some(refs) = retention_refs(&claim, set, None, false) {
                claim.metadata.owner_references = (!refs.is_empty()).then_some(refs);
            }
            let created = self.claims_in(ns).create(&claim).await;
            let done = format!(
                "create Claim {claim_name} Pod {pod_name} in StatefulSet {set_name} success"
            );
            let failed = format!(
                "create Claim {claim_name} for Pod {pod_name} in StatefulSet {set_name} failed"
            );
            if !self
                .record(set, "Create", created, 409, &done, &failed)
                .await
            {
                return false;
            }
        }
        true
    }

    /// Puts on the claims of every pod the owner references the retention policy asks for.
    async fn fix_claims(&self, set: &StatefulSet, pods: &[(i32, &Pod)], start: i32, replicas: i32) {
        let ns = namespace(&set.metadata);
        for (ordinal, pod) in pods {
            let scaled_down = *ordinal < start || *ordinal >= start + replicas;
            for wanted in claims_for(set, *ordinal) {
                let Some(claim) = self.claims.get(&format!("{ns}/{}", name(&wanted.metadata)))
                else {
                    continue;
                };
                let Some(refs) = retention_refs(&claim, set, Some(pod), scaled_down) else {
                    continue;
                };
                let patch = json!({"metadata": {"ownerReferences": refs,
                    "resourceVersion": claim.metadata.resource_version}});
                if let Err(e) = self
                    .claims_in(ns)
                    .merge_patch(name(&claim.metadata), &patch)
                    .await
                {
                    tracing::debug!(error = %e, claim = name(&claim.metadata),
                                    "the claim's owners were not updated; retried on the next sync");
                }
            }
        }
    }
}
