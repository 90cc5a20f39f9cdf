//! The CronJob controller: a Job for each time of the schedule, as Kubernetes' cronjob
//! controller (v2) makes them.
//!
//! A reconcile brings `status.active` in line with the jobs the cronjob controls (a finished
//! job leaves it, and a successful one moves `lastSuccessfulTime`), deletes the oldest finished
//! jobs beyond the history limits, then looks for the most recent scheduled time not yet run
//! (in the cronjob's time zone, since `lastScheduleTime` or its creation, within
//! `startingDeadlineSeconds`) and starts a job for it as `concurrencyPolicy` allows, named
//! `<cronjob>-<minutes since the epoch>` so that one time makes at most one job. It asks to be
//! called again at the next scheduled time. The clock is a parameter, for tests.

mod schedule;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::Resource;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::cron::{names_zone, time_zone, Schedule};
use rkube_core::meta::{controller_of, controller_ref, name, namespace};
use serde_json::json;

use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::controller::{Action, Controller};
use rkube_runtime::events::{Recorder, NORMAL, WARNING};
use rkube_runtime::store::Store;
use schedule::{job_name, most_recent, TOO_MANY_MISSED};

const COMPONENT: &str = "cronjob-controller";
const WORKERS: usize = 2;
/// The annotation with the time a job was scheduled for, in the cronjob's time zone.
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

/// What a reconcile reads the time from.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

pub struct CronJobs {
    jobs: Arc<Store<Job>>,
    client: LocalClient,
    recorder: Recorder,
    clock: Clock,
}

/// Starts the CronJob controller until `stop`, with the system clock.
pub fn start(
    cronjobs: Arc<Store<CronJob>>,
    jobs: Arc<Store<Job>>,
    client: LocalClient,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    start_with_clock(cronjobs, jobs, client, stop, Arc::new(crate::pods::now))
}

/// Starts the CronJob controller with `clock` for the time.
pub fn start_with_clock(
    cronjobs: Arc<Store<CronJob>>,
    jobs: Arc<Store<Job>>,
    client: LocalClient,
    stop: tokio::sync::watch::Receiver<bool>,
    clock: Clock,
) {
    let controller = Controller::new(COMPONENT, cronjobs).owns(&jobs);
    let ctx = Arc::new(CronJobs {
        jobs,
        recorder: Recorder::new(client.clone(), COMPONENT),
        client,
        clock,
    });
    controller.run(
        WORKERS,
        stop,
        ctx,
        |cj: Arc<CronJob>, ctx: Arc<CronJobs>| async move { ctx.reconcile(&cj).await },
    );
}

fn finished(job: &Job) -> Option<&'static str> {
    let conds = job.status.as_ref()?.conditions.as_ref()?;
    conds
        .iter()
        .filter(|c| c.status == "True")
        .find_map(|c| match c.type_.as_str() {
            "Complete" => Some("Complete"),
            "Failed" => Some("Failed"),
            _ => None,
        })
}

fn reference(job: &Job) -> ObjectReference {
    let m = &job.metadata;
    ObjectReference {
        api_version: Some(Job::API_VERSION.into()),
        kind: Some(Job::KIND.into()),
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        ..Default::default()
    }
}

/// When a job started, for the order of the history: its start, else its creation.
fn started(job: &Job) -> Option<Timestamp> {
    job.status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .or(job.metadata.creation_timestamp.as_ref())
        .map(|t| t.0)
}

impl CronJobs {
    async fn reconcile(&self, cj: &CronJob) -> Result<Action, ApiError> {
        let meta = &cj.metadata;
        if meta.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let ns = namespace(meta);
        let uid = meta.uid.as_deref().unwrap_or("");
        let spec = cj.spec.clone().unwrap_or_default();
        let now = (self.clock)();
        let mut jobs: Vec<Arc<Job>> = self
            .jobs
            .in_namespace(ns)
            .into_iter()
            .filter(|j| controller_of(&j.metadata).is_some_and(|r| r.uid == uid))
            .collect();
        jobs.sort_by_key(|j| started(j));

        // The active list: the unfinished jobs it controls; finished ones leave.
        let old_status = cj.status.clone().unwrap_or_default();
        let mut status = old_status.clone();
        let mut active: Vec<ObjectReference> = Vec::new();
        for r in old_status.active.iter().flatten() {
            let job = jobs.iter().find(|j| j.metadata.uid == r.uid);
            match job {
                Some(j) if finished(j).is_some() => {
                    let condition = finished(j).unwrap_or("");
                    let msg = format!(
                        "Saw completed job: {}, condition: {condition}",
                        name(&j.metadata)
                    );
                    self.recorder
                        .event_for(cj, NORMAL, "SawCompletedJob", &msg)
                        .await;
                    if condition == "Complete" {
                        let done = j.status.as_ref().and_then(|s| s.completion_time.clone());
                        if done.as_ref().map(|t| t.0)
                            > status.last_successful_time.as_ref().map(|t| t.0)
                        {
                            status.last_successful_time = done;
                        }
                    }
                }
                Some(_) => active.push(r.clone()),
                None => {
                    // Not in the cache: gone, or created a moment ago. Ask.
                    let path = rkube_core::path::object::<Job>(ns, r.name.as_deref().unwrap_or(""));
                    match self.client.get(&path).await {
                        Ok(_) => active.push(r.clone()),
                        Err(e) if e.code == 404 => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        for j in &jobs {
            let listed = active.iter().any(|r| r.uid == j.metadata.uid);
            if !listed && finished(j).is_none() && j.metadata.deletion_timestamp.is_none() {
                active.push(reference(j));
            }
        }
        status.active = (!active.is_empty()).then_some(active);

        self.clean_history(cj, &spec, &jobs).await;

        let suspended = spec.suspend == Some(true);
        let mut requeue = None;
        if !suspended {
            match self.schedule(cj, &spec, &mut status, now).await {
                Ok(next) => requeue = next,
                Err(e) => {
                    self.write_status(cj, &old_status, &status).await?;
                    return Err(e);
                }
            }
        }
        self.write_status(cj, &old_status, &status).await?;
        Ok(requeue.map_or(Action::await_change(), Action::requeue))
    }

    async fn write_status(
        &self,
        cj: &CronJob,
        old: &k8s_openapi::api::batch::v1::CronJobStatus,
        new: &k8s_openapi::api::batch::v1::CronJobStatus,
    ) -> Result<(), ApiError> {
        if old == new {
            return Ok(());
        }
        let m = &cj.metadata;
        let updated = CronJob {
            status: Some(new.clone()),
            ..cj.clone()
        };
        ignore_gone(
            Objects::<CronJob>::namespaced(&self.client, namespace(m))
                .replace_status(name(m), &updated)
                .await,
        )
        .map(|_| ())
    }

    /// Deletes the oldest finished jobs beyond the history limits.
    async fn clean_history(
        &self,
        cj: &CronJob,
        spec: &k8s_openapi::api::batch::v1::CronJobSpec,
        jobs: &[Arc<Job>],
    ) {
        for (condition, limit) in [
            ("Complete", spec.successful_jobs_history_limit),
            ("Failed", spec.failed_jobs_history_limit),
        ] {
            let Some(limit) = limit else {
                continue;
            };
            let done: Vec<&Arc<Job>> = jobs
                .iter()
                .filter(|j| {
                    finished(j) == Some(condition) && j.metadata.deletion_timestamp.is_none()
                })
                .collect();
            let extra = done.len().saturating_sub(limit.max(0) as usize);
            for j in done.into_iter().take(extra) {
                self.delete_job(cj, j).await;
            }
        }
    }

    async fn delete_job(&self, cj: &CronJob, job: &Job) {
        let m = &job.metadata;
        let path = rkube_core::path::object::<Job>(namespace(m), name(m));
        let options = json!({"kind": "DeleteOptions", "apiVersion": "v1",
            "propagationPolicy": "Background"});
        match self.client.delete(&path, Some(&options)).await {
            Ok(_) => {
                let msg = format!("Deleted job {}", name(m));
                self.recorder
                    .event_for(cj, NORMAL, "SuccessfulDelete", &msg)
                    .await;
            }
            Err(e) if e.code == 404 => {}
            Err(e) => {
                let msg = format!("Error deleting job: {}", e.message);
                self.recorder
                    .event_for(cj, WARNING, "FailedDelete", &msg)
                    .await;
            }
        }
    }

    /// Starts the job of the most recent unmet scheduled time, if any and if allowed;
    /// answers when to look again.
    async fn schedule(
        &self,
        cj: &CronJob,
        spec: &k8s_openapi::api::batch::v1::CronJobSpec,
        status: &mut k8s_openapi::api::batch::v1::CronJobStatus,
        now: Timestamp,
    ) -> Result<Option<Duration>, ApiError> {
        let zone = match time_zone(spec.time_zone.as_deref()) {
            Ok(tz) => tz,
            Err(e) => {
                let msg = format!(
                    "invalid timeZone: {:?}: {e}",
                    spec.time_zone.as_deref().unwrap_or("")
                );
                self.recorder
                    .event_for(cj, WARNING, "UnknownTimeZone", &msg)
                    .await;
                return Ok(None);
            }
        };
        let sched = match Schedule::parse(&spec.schedule) {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("unparseable schedule: {:?} : {e}", spec.schedule);
                self.recorder
                    .event_for(cj, WARNING, "UnparseableSchedule", &msg)
                    .await;
                return Ok(None);
            }
        };
        // A zone the schedule names itself (in a CronJob stored before validation refused
        // them) wins over timeZone, as in Kubernetes, which warns about it.
        let tz = if names_zone(&spec.schedule) {
            let msg = format!(
                "CRON_TZ or TZ used in schedule {:?} is not officially supported, see https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ for more details",
                spec.schedule
            );
            self.recorder
                .event_for(cj, WARNING, "UnsupportedSchedule", &msg)
                .await;
            sched.zone().cloned().unwrap_or(zone)
        } else {
            zone
        };
        let created = cj.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let mut earliest = status
            .last_schedule_time
            .as_ref()
            .map(|t| t.0)
            .or(created)
            .unwrap_or(now);
        if let Some(sds) = spec.starting_deadline_seconds {
            let bound = Timestamp::from_second(now.as_second() - sds).unwrap_or(now);
            earliest = earliest.max(bound);
        }
        let next_wake = |after: Timestamp| {
            sched.next_after(after, &tz).map(|t| {
                // A moment after the time, so that it has come.
                Duration::from_secs((t.as_second() - now.as_second()).max(0) as u64 + 1)
            })
        };
        let (scheduled, missed) = most_recent(&sched, &tz, earliest, now);
        let Some(scheduled) = scheduled else {
            return Ok(next_wake(now));
        };
        if missed > TOO_MANY_MISSED {
            let msg = format!("too many missed start times: {missed}. Set or decrease .spec.startingDeadlineSeconds or check clock skew");
            self.recorder
                .event_for(cj, WARNING, "TooManyMissedTimes", &msg)
                .await;
        }
        if let Some(sds) = spec.starting_deadline_seconds {
            if scheduled.as_second() + sds < now.as_second() {
                let msg = format!(
                    "Missed scheduled time to start a job: {}",
                    rfc3339(scheduled, &tz)
                );
                self.recorder
                    .event_for(cj, WARNING, "MissSchedule", &msg)
                    .await;
                return Ok(next_wake(now));
            }
        }
        let active = status.active.clone().unwrap_or_default();
        match spec.concurrency_policy.as_deref() {
            Some("Forbid") if !active.is_empty() => {
                self.recorder
                    .event_for(
                        cj,
                        NORMAL,
                        "JobAlreadyActive",
                        "Not starting job because prior execution is running and concurrency policy is Forbid",
                    )
                    .await;
                // The time stays unmet: look again when the active job ends, or at the next.
                return Ok(next_wake(now));
            }
            Some("Replace") => {
                for r in &active {
                    if let Some(j) = self.jobs.get(&format!(
                        "{}/{}",
                        namespace(&cj.metadata),
                        r.name.as_deref().unwrap_or("")
                    )) {
                        self.delete_job(cj, &j).await;
                    }
                }
                status.active = None;
            }
            _ => {}
        }
        let job = job_for(cj, scheduled, &tz);
        let jobs = Objects::<Job>::namespaced(&self.client, namespace(&cj.metadata));
        match jobs.create(&job).await {
            Ok(created) => {
                let msg = format!("Created job {}", name(&created.metadata));
                self.recorder
                    .event_for(cj, NORMAL, "SuccessfulCreate", &msg)
                    .await;
                status
                    .active
                    .get_or_insert_with(Vec::new)
                    .push(reference(&created));
            }
            Err(e) if e.code == 409 => {
                // Made before (a status write was lost): the time is met.
            }
            Err(e) => {
                let msg = format!("Error creating job: {}", e.message);
                self.recorder
                    .event_for(cj, WARNING, "FailedCreate", &msg)
                    .await;
                return Err(e);
            }
        }
        status.last_schedule_time = Some(Time(scheduled));
        Ok(next_wake(now))
    }
}

fn rfc3339(t: Timestamp, tz: &k8s_openapi::jiff::tz::TimeZone) -> String {
    t.to_zoned(tz.clone())
        .strftime("%Y-%m-%dT%H:%M:%S%:z")
        .to_string()
        .replace("+00:00", "Z")
}

/// The job of the cronjob's template for the time `scheduled`.
fn job_for(cj: &CronJob, scheduled: Timestamp, tz: &k8s_openapi::jiff::tz::TimeZone) -> Job {
    let meta = &cj.metadata;
    let spec = cj.spec.clone().unwrap_or_default();
    let template_meta = spec.job_template.metadata.unwrap_or_default();
    let mut annotations = template_meta.annotations.unwrap_or_default();
    annotations.insert(SCHEDULED_TIMESTAMP.into(), rfc3339(scheduled, tz));
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(name(meta), scheduled)),
            namespace: Some(namespace(meta).to_string()),
            labels: template_meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref(cj)]),
            ..Default::default()
        },
        spec: Some(spec.job_template.spec.unwrap_or_default()),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_named_and_stamped_for_its_time() {
        let cj: CronJob = serde_json::from_value(json!({
            "metadata": {"name": "hello", "namespace": "ns", "uid": "c"},
            "spec": {"schedule": "*/1 * * * *", "jobTemplate": {
                "metadata": {"labels": {"app": "hello"}},
                "spec": {"template": {"spec": {"restartPolicy": "OnFailure",
                    "containers": [{"name": "c", "image": "busybox"}]}}}}}}))
        .unwrap();
        let at: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let job = job_for(&cj, at, &k8s_openapi::jiff::tz::TimeZone::UTC);
        let m = &job.metadata;
        assert_eq!(m.name.as_deref(), Some("hello-29453761"));
        assert_eq!(
            m.annotations.as_ref().unwrap()[SCHEDULED_TIMESTAMP],
            "2026-01-01T00:01:00Z"
        );
        assert_eq!(m.labels.as_ref().unwrap()["app"], "hello");
        assert_eq!(m.owner_references.as_ref().unwrap()[0].kind, "CronJob");
    }
}
