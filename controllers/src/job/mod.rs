//! The Job controller: run a job's pods until enough of them succeed, or fail it.
//!
//! A reconcile reads the job and the pods it controls from the informers and asks [`plan`]
//! what to do: count finished pods, create pods (each index of an Indexed job once, failed
//! pods replaced after a backoff), delete surplus ones (suspension, an end reached), and the
//! status with its conditions. Finished pods are counted through the tracking finalizer, as
//! Kubernetes does it: a pod is created with `batch.kubernetes.io/job-tracking`; once it
//! finished, its uid is written to `status.uncountedTerminatedPods`, its finalizer removed, and
//! then it moves into the `succeeded`/`failed` counts. A pod is so counted exactly once even
//! when it disappears meanwhile. Expectations keep a stale cache from creating twice; a
//! finished job with `ttlSecondsAfterFinished` is deleted, with its pods, when that runs out.

mod indexes;
mod plan;
mod policy;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{controller_of, controller_ref, key, name, namespace};
use rkube_core::selector::LabelSelector;
use serde_json::json;

pub use plan::{COMPLETION_INDEX, TRACKING_FINALIZER};

use crate::replicaset::Expectations;
use plan::{condition_true, Outcome, Plan};
use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::controller::{owner_key, Action, Controller};
use rkube_runtime::events::{Recorder, NORMAL, WARNING};
use rkube_runtime::store::Store;

const COMPONENT: &str = "job-controller";
/// The `spec.managedBy` of jobs this controller reconciles (also when the field is unset).
pub const MANAGED_BY: &str = "kubernetes.io/job-controller";
/// Parallel reconciles.
const WORKERS: usize = 4;
/// Most pods one reconcile creates (Kubernetes' burst of pods per sync).
const BURST: usize = 500;

/// The reconciler's context.
pub struct Jobs {
    pods: Arc<Store<Pod>>,
    client: LocalClient,
    expectations: Arc<Expectations>,
    /// Pods whose finalizer this controller removed and whose change the cache may not show
    /// yet: they are not counted again.
    freed: Arc<Mutex<HashSet<String>>>,
    recorder: Recorder,
}

/// Starts the Job controller until `stop`.
pub fn start(
    jobs: Arc<Store<Job>>,
    pods: Arc<Store<Pod>>,
    client: LocalClient,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let expectations = Arc::new(Expectations::default());
    let freed: Arc<Mutex<HashSet<String>>> = Arc::default();
    // # Correctness
    // This handler runs before the builder's (added after it): a reconcile taking the job's
    // key sees its own pod writes observed.
    let (e, f) = (expectations.clone(), freed.clone());
    pods.on_change(Box::new(move |old, new| observe(&e, &f, old, new)));
    let gone = {
        let (expectations, pods, client) = (expectations.clone(), pods.clone(), client.clone());
        move |job_key: &str| {
            expectations.forget(job_key);
            // A job deleted without its pods leaves them held by the finalizer: free them.
            let (pods, client, job_key) = (pods.clone(), client.clone(), job_key.to_string());
            tokio::spawn(async move { free_orphans(&pods, &client, &job_key).await });
        }
    };
    // A pod without a controller (or relabelled) that a job's selector takes: that job
    // looks, to adopt it (or let it go).
    let orphans = crate::pods::claimers(jobs.clone(), |j, pod| {
        managed_here(j) && selects(selector_of(j).as_ref(), pod)
    });
    let controller = Controller::new(COMPONENT, jobs)
        .owns(&pods)
        .watches(&pods, orphans)
        .on_gone(gone);
    let ctx = Arc::new(Jobs {
        pods,
        recorder: Recorder::new(client.clone(), COMPONENT),
        client,
        expectations,
        freed,
    });
    controller.run(
        WORKERS,
        stop,
        ctx,
        |job: Arc<Job>, ctx: Arc<Jobs>| async move { ctx.reconcile(&job).await },
    );
}

/// Whether this controller reconciles the job: `spec.managedBy` unset or naming it. A job
/// another controller manages is left to it (only its ttlSecondsAfterFinished is kept).
fn managed_here(job: &Job) -> bool {
    job.spec
        .as_ref()
        .and_then(|s| s.managed_by.as_deref())
        .is_none_or(|m| m == MANAGED_BY)
}

/// The selector the job claims its pods with (None: an empty one, which takes none).
fn selector_of(job: &Job) -> Option<LabelSelector> {
    crate::pods::claiming_selector(job.spec.as_ref()?.selector.as_ref()?)
}

fn selects(selector: Option<&LabelSelector>, pod: &Pod) -> bool {
    selector.is_some_and(|s| s.matches_labels(pod.metadata.labels.as_ref()))
}

fn has_finalizer(pod: &Pod) -> bool {
    pod.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == TRACKING_FINALIZER)
}

fn observe(
    e: &Expectations,
    freed: &Mutex<HashSet<String>>,
    old: Option<&Arc<Pod>>,
    new: Option<&Arc<Pod>>,
) {
    let now_unheld = match new {
        None => old,
        Some(p) if !has_finalizer(p) => Some(p),
        Some(_) => None,
    };
    if let Some(uid) = now_unheld.and_then(|p| p.metadata.uid.as_ref()) {
        freed.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }
    match (old, new) {
        (None, Some(p)) => {
            if let Some(k) = owner_key::<Job>(&p.metadata) {
                e.creation_observed(&k);
            }
        }
        (Some(p), None) => {
            if let Some(k) = owner_key::<Job>(&p.metadata) {
                e.deletion_observed(&k, &key(&p.metadata));
            }
        }
        (Some(o), Some(n)) => {
            if let Some(k) = owner_key::<Job>(&n.metadata) {
                if n.metadata.deletion_timestamp.is_some()
                    && o.metadata.deletion_timestamp.is_none()
                {
                    e.deletion_observed(&k, &key(&n.metadata));
                }
            }
        }
        (None, None) => {}
    }
}

/// Takes the tracking finalizer off `pod` (if it has not changed since it was read).
async fn free(client: &LocalClient, pod: &Pod) -> Result<(), ApiError> {
    let m = &pod.metadata;
    let left: Vec<&String> = m
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != TRACKING_FINALIZER)
        .collect();
    let patch = json!({"metadata": {
        "finalizers": if left.is_empty() { json!(null) } else { json!(left) },
        "resourceVersion": m.resource_version,
    }});
    let pods = Objects::<Pod>::namespaced(client, namespace(m));
    match pods.merge_patch(name(m), &patch).await {
        Ok(_) => Ok(()),
        Err(e) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Frees the pods of a job that is gone.
async fn free_orphans(pods: &Store<Pod>, client: &LocalClient, job_key: &str) {
    let (ns, job) = job_key.split_once('/').unwrap_or(("", job_key));
    for pod in pods.in_namespace(ns) {
        let of_job = controller_of(&pod.metadata).is_some_and(|r| r.kind == "Job" && r.name == job);
        if of_job && has_finalizer(&pod) {
            if let Err(e) = free(client, &pod).await {
                tracing::debug!(pod = %key(&pod.metadata), error = %e.message, "freeing the pod of a deleted job failed; a later event retries");
            }
        }
    }
}

fn now() -> Timestamp {
    crate::pods::now()
}

impl Jobs {
    async fn reconcile(&self, job: &Job) -> Result<Action, ApiError> {
        let meta = &job.metadata;
        let job_key = key(meta);
        if !managed_here(job) {
            let ttl = self.expire(job, now()).await?;
            return Ok(ttl.map_or_else(Action::await_change, Action::requeue));
        }
        let uid = meta.uid.as_deref().unwrap_or("");
        let owned: Vec<Arc<Pod>> = if meta.deletion_timestamp.is_some() {
            self.pods
                .in_namespace(namespace(meta))
                .into_iter()
                .filter(|p| controller_of(&p.metadata).is_some_and(|r| r.uid == uid))
                .collect()
        } else {
            // Orphans the selector takes are adopted, held by the tracking finalizer as the
            // pods this controller creates are; owned pods it no longer takes are let go.
            let selector = selector_of(job);
            crate::pods::claim_holding(
                &self.client,
                &self.pods,
                job,
                |p| selects(selector.as_ref(), p),
                Some(TRACKING_FINALIZER),
            )
            .await?
        };

        if meta.deletion_timestamp.is_some() {
            // Being deleted (foreground, or held by a finalizer): let its pods go.
            for p in owned.iter().filter(|p| has_finalizer(p)) {
                free(&self.client, p).await?;
            }
            return Ok(Action::await_change());
        }
        if !self.expectations.satisfied(&job_key) {
            // The pod events of the last writes bring the next look; this one is a safety net.
            return Ok(Action::requeue(Duration::from_secs(5)));
        }

        let freed = self.freed.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let now = now();
        let plan = plan::plan(job, &owned, &freed, now);
        let mut job = self.record_uncounted(job, &plan).await?;
        let Some(current) = job.take() else {
            // The job moved meanwhile: its event brings another reconcile.
            return Ok(Action::await_change());
        };
        self.free_counted(&owned, &plan).await?;
        self.delete_pods(&current, &owned, &plan).await;
        let created = self.create_pods(&current, &plan).await;
        self.write_status(&current, &plan).await?;
        self.record_events(&current, &plan).await;
        // A failed create comes back after the queue's backoff.
        created?;
        let finished_job = Job {
            status: Some(plan.status.clone()),
            ..current.clone()
        };
        let ttl = self.expire(&finished_job, now).await?;
        Ok(match (plan.requeue, ttl) {
            (Some(a), Some(b)) => Action::requeue(a.min(b)),
            (Some(a), None) | (None, Some(a)) => Action::requeue(a),
            (None, None) => Action::await_change(),
        })
    }

    fn jobs_in<'a>(&'a self, ns: &'a str) -> Objects<'a, Job> {
        Objects::namespaced(&self.client, ns)
    }

    /// Writes the uids of the pods about to be counted to `uncountedTerminatedPods`, before
    /// their finalizers go. None when the job changed meanwhile.
    async fn record_uncounted(&self, job: &Job, plan: &Plan) -> Result<Option<Job>, ApiError> {
        let mut status = job.status.clone().unwrap_or_default();
        let uncounted = status
            .uncounted_terminated_pods
            .get_or_insert_with(Default::default);
        let mut added = false;
        for (uid, _, outcome) in &plan.count {
            let list = match outcome {
                Outcome::Succeeded => uncounted.succeeded.get_or_insert_with(Vec::new),
                Outcome::Failed => uncounted.failed.get_or_insert_with(Vec::new),
                Outcome::Uncounted => continue,
            };
            if !list.contains(uid) {
                list.push(uid.clone());
                added = true;
            }
        }
        if !added {
            return Ok(Some(job.clone()));
        }
        let updated = Job {
            status: Some(status),
            ..job.clone()
        };
        ignore_gone(
            self.jobs_in(namespace(&job.metadata))
                .replace_status(name(&job.metadata), &updated)
                .await,
        )
    }

    /// Takes the finalizer off the pods counted now.
    async fn free_counted(&self, owned: &[Arc<Pod>], plan: &Plan) -> Result<(), ApiError> {
        let by_uid: BTreeMap<&str, &Arc<Pod>> = owned
            .iter()
            .map(|p| (p.metadata.uid.as_deref().unwrap_or(""), p))
            .collect();
        for (uid, _, _) in &plan.count {
            let Some(pod) = by_uid.get(uid.as_str()) else {
                continue;
            };
            if has_finalizer(pod) {
                free(&self.client, pod).await?;
                self.freed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(uid.clone());
            }
        }
        Ok(())
    }

    async fn delete_pods(&self, job: &Job, owned: &[Arc<Pod>], plan: &Plan) {
        if plan.delete.is_empty() {
            return;
        }
        let job_key = key(&job.metadata);
        let victims: Vec<&Arc<Pod>> = owned
            .iter()
            .filter(|p| {
                plan.delete
                    .iter()
                    .any(|n| Some(n) == p.metadata.name.as_ref())
            })
            .take(BURST)
            .collect();
        self.expectations
            .expect_deletions(&job_key, victims.iter().map(|p| key(&p.metadata)).collect());
        for pod in victims {
            let m = &pod.metadata;
            let pods = Objects::<Pod>::namespaced(&self.client, namespace(m));
            match pods.delete(name(m)).await {
                Ok(()) => {
                    let msg = format!("Deleted pod: {}", name(m));
                    self.recorder
                        .event_for(job, NORMAL, "SuccessfulDelete", &msg)
                        .await;
                }
                Err(e) => {
                    self.expectations.deletion_observed(&job_key, &key(m));
                    if e.code != 404 {
                        let msg = format!("Error deleting: {}", e.message);
                        self.recorder
                            .event_for(job, WARNING, "FailedDelete", &msg)
                            .await;
                    }
                }
            }
        }
    }

    /// Creates the planned pods; the first error, if any failed.
    async fn create_pods(&self, job: &Job, plan: &Plan) -> Result<(), ApiError> {
        let todo: Vec<_> = plan.create.iter().take(BURST).collect();
        if todo.is_empty() {
            return Ok(());
        }
        let job_key = key(&job.metadata);
        self.expectations
            .expect_creations(&job_key, todo.len() as i64);
        let pods = Objects::<Pod>::namespaced(&self.client, namespace(&job.metadata));
        let bodies: Vec<Pod> = todo
            .iter()
            .map(|(index, failures)| pod_for(job, *index, *failures))
            .collect();
        let made = futures::future::join_all(bodies.iter().map(|p| pods.create(p))).await;
        let mut first_error = None;
        for r in made {
            match r {
                Ok(created) => {
                    let msg = format!("Created pod: {}", name(&created.metadata));
                    self.recorder
                        .event_for(job, NORMAL, "SuccessfulCreate", &msg)
                        .await;
                }
                Err(e) => {
                    self.expectations.creation_observed(&job_key);
                    let msg = format!("Error creating: {}", e.message);
                    self.recorder
                        .event_for(job, WARNING, "FailedCreate", &msg)
                        .await;
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn write_status(&self, job: &Job, plan: &Plan) -> Result<(), ApiError> {
        if job.status.as_ref() == Some(&plan.status) {
            return Ok(());
        }
        let updated = Job {
            status: Some(plan.status.clone()),
            ..job.clone()
        };
        let m = &job.metadata;
        ignore_gone(
            self.jobs_in(namespace(m))
                .replace_status(name(m), &updated)
                .await,
        )
        .map(|_| ())
    }

    async fn record_events(&self, job: &Job, plan: &Plan) {
        if let Some(f) = plan.reached.as_ref().filter(|f| f.failed) {
            self.recorder
                .event_for(job, WARNING, f.reason, &f.message)
                .await;
        }
        if plan.finished_now && !condition_true(Some(&plan.status), "Failed") {
            self.recorder
                .event_for(job, NORMAL, "Completed", "Job completed")
                .await;
        }
        match plan.suspended_now {
            Some(true) => {
                self.recorder
                    .event_for(job, NORMAL, "Suspended", "Job suspended")
                    .await
            }
            Some(false) => {
                self.recorder
                    .event_for(job, NORMAL, "Resumed", "Job resumed")
                    .await
            }
            None => {}
        }
    }

    /// ttlSecondsAfterFinished: deletes a finished job (its pods with it) once the time is
    /// up; else the time left.
    async fn expire(&self, job: &Job, now: Timestamp) -> Result<Option<Duration>, ApiError> {
        let Some(ttl) = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished) else {
            return Ok(None);
        };
        let Some(finished) = finish_time(job) else {
            return Ok(None);
        };
        let left = finished.as_second() + i64::from(ttl) - now.as_second();
        if left > 0 {
            return Ok(Some(Duration::from_secs(left as u64)));
        }
        let m = &job.metadata;
        let path = rkube_core::path::object::<Job>(namespace(m), name(m));
        let options = json!({"kind": "DeleteOptions", "apiVersion": "v1",
            "propagationPolicy": "Foreground",
            "preconditions": {"uid": m.uid}});
        ignore_gone(self.client.delete(&path, Some(&options)).await)?;
        Ok(None)
    }
}

/// When the job became Complete or Failed.
fn finish_time(job: &Job) -> Option<Timestamp> {
    let status = job.status.as_ref()?;
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0))
        .or_else(|| status.completion_time.as_ref().map(|t| t.0))
}

/// A pod of the job's template: named after the job (and its index), held by the tracking
/// finalizer, controlled by the job.
fn pod_for(job: &Job, index: Option<i32>, failures: i32) -> Pod {
    let meta = &job.metadata;
    let job_name = name(meta);
    let spec = job.spec.clone().unwrap_or_default();
    let template = spec.template;
    let t = template.metadata.unwrap_or_default();
    let mut labels = t.labels.unwrap_or_default();
    let mut annotations = t.annotations.unwrap_or_default();
    let mut finalizers = t.finalizers.unwrap_or_default();
    finalizers.push(TRACKING_FINALIZER.to_string());
    let mut pod_spec = template.spec.unwrap_or_default();
    let mut generate_name = format!("{job_name}-");
    if let Some(i) = index {
        generate_name = format!("{job_name}-{i}-");
        annotations.insert(COMPLETION_INDEX.into(), i.to_string());
        labels.insert(COMPLETION_INDEX.into(), i.to_string());
        if spec.backoff_limit_per_index.is_some() {
            annotations.insert(plan::INDEX_FAILURE_COUNT.into(), failures.to_string());
        }
        if pod_spec.hostname.as_deref().is_none_or(str::is_empty) {
            pod_spec.hostname = Some(format!("{job_name}-{i}"));
        }
        let env = EnvVar {
            name: "JOB_COMPLETION_INDEX".into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: Some("v1".into()),
                    field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
                }),
                ..Default::default()
            }),
        };
        for c in pod_spec
            .init_containers
            .iter_mut()
            .flatten()
            .chain(pod_spec.containers.iter_mut())
        {
            c.env.get_or_insert_with(Vec::new).push(env.clone());
        }
    }
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(generate_name),
            namespace: Some(namespace(meta).to_string()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            finalizers: Some(finalizers),
            owner_references: Some(vec![controller_ref(job)]),
            ..Default::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_indexed_pod_carries_its_index() {
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": "sum", "namespace": "ns", "uid": "j"},
            "spec": {"completions": 3, "completionMode": "Indexed", "backoffLimitPerIndex": 1,
                "template": {"metadata": {"labels": {"job-name": "sum"}},
                    "spec": {"restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "busybox"}]}}}}))
        .unwrap();
        let pod = pod_for(&job, Some(2), 1);
        let m = &pod.metadata;
        assert_eq!(m.generate_name.as_deref(), Some("sum-2-"));
        assert_eq!(m.labels.as_ref().unwrap()[COMPLETION_INDEX], "2");
        let a = m.annotations.as_ref().unwrap();
        assert_eq!(a[COMPLETION_INDEX], "2");
        assert_eq!(a[plan::INDEX_FAILURE_COUNT], "1");
        assert_eq!(m.finalizers.as_ref().unwrap(), &[TRACKING_FINALIZER]);
        let spec = pod.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("sum-2"));
        let env = spec.containers[0].env.as_ref().unwrap();
        assert_eq!(env[0].name, "JOB_COMPLETION_INDEX");
        assert_eq!(m.owner_references.as_ref().unwrap()[0].kind, "Job");
    }
}
