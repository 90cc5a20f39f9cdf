//! What one sync of a Job decides from the job and its pods, without writing anything: which
//! finished pods to count (and free of the tracking finalizer), whether the job has succeeded
//! or failed, how many pods (of which indexes) to create or which to delete, the status to
//! write, and when to look again. Kubernetes' `syncJob` is the model.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobSpec, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::indexes::{format_indexes, parse_indexes};
use super::policy::{match_policy, PolicyAction};
use crate::pods::{is_active, is_finished, phase};

/// The finalizer that keeps a finished pod until the job has counted it.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// An Indexed job's pod's index (annotation and label).
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// How often an index had failed before this pod (backoffLimitPerIndex).
pub const INDEX_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-failure-count";

/// The first delay before a failed pod is replaced, doubled per failure up to MAX_BACKOFF.
const BACKOFF: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(360);

/// How a finished pod counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    /// Ends without counting: ignored by the pod failure policy, or deleted while the job
    /// was suspended.
    Uncounted,
}

/// A condition that ends the job, or announces that it will end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    pub failed: bool,
    pub reason: &'static str,
    pub message: String,
}

/// What one sync does.
#[derive(Debug, Default)]
pub struct Plan {
    /// Finished pods to count and free of the finalizer: (uid, name, outcome).
    pub count: Vec<(String, String, Outcome)>,
    /// Pods to create: one entry per pod, with its index in an Indexed job, and how often that
    /// index failed before.
    pub create: Vec<(Option<i32>, i32)>,
    /// Active pods to delete, by name.
    pub delete: Vec<String>,
    /// The status once the counted pods are freed.
    pub status: JobStatus,
    /// A newly reached end (SuccessCriteriaMet or FailureTarget), for its event.
    pub reached: Option<Finish>,
    /// The job just became Complete or Failed.
    pub finished_now: bool,
    /// The job was just suspended (Some(true)) or resumed (Some(false)).
    pub suspended_now: Option<bool>,
    /// When to look again even if nothing changes.
    pub requeue: Option<Duration>,
}

fn has_finalizer(pod: &Pod) -> bool {
    pod.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == TRACKING_FINALIZER)
}

pub fn index_of(pod: &Pod) -> Option<i32> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(COMPLETION_INDEX))
        .or_else(|| pod.metadata.labels.as_ref()?.get(COMPLETION_INDEX))
        .and_then(|v| v.parse().ok())
}

fn index_failures(pod: &Pod) -> i32 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INDEX_FAILURE_COUNT))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn is_terminating(pod: &Pod) -> bool {
    !is_finished(pod) && pod.metadata.deletion_timestamp.is_some()
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// When the pod finished: its containers' latest finish, else its deletion, else None.
fn finished_at(pod: &Pod) -> Option<Timestamp> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref();
    let latest = statuses
        .into_iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
        .map(|t| t.0)
        .max();
    latest.or_else(|| pod.metadata.deletion_timestamp.as_ref().map(|t| t.0))
}

/// Under restartPolicy OnFailure a failing container restarts in its pod rather than failing
/// it: the restarts of the running and pending pods count against the backoff limit.
fn past_limit_on_failure(spec: &JobSpec, pods: &[Arc<Pod>], limit: i32) -> bool {
    let on_failure = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        == Some("OnFailure");
    if !on_failure {
        return false;
    }
    let restarts: i32 = pods
        .iter()
        .filter(|p| matches!(phase(p), "Running" | "Pending"))
        .filter_map(|p| p.status.as_ref())
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .sum();
    if limit == 0 {
        restarts > 0
    } else {
        restarts >= limit
    }
}

/// Failed pods are replaced, and terminating ones only once they have failed: what
/// podReplacementPolicy Failed asks, and what a pod failure policy implies.
fn only_replace_failed(spec: &JobSpec) -> bool {
    spec.pod_replacement_policy.as_deref() == Some("Failed") || spec.pod_failure_policy.is_some()
}

/// The message of the first successPolicy rule the succeeded indexes meet ("Matched rules at
/// index 0"): all of its succeededIndexes, or succeededCount of them, or succeededCount
/// indexes at all.
fn success_policy_met(spec: &JobSpec, completed: &BTreeSet<i32>) -> Option<String> {
    let rules = &spec.success_policy.as_ref()?.rules;
    let completions = spec.completions?;
    if completed.is_empty() || spec.completion_mode.as_deref() != Some("Indexed") {
        return None;
    }
    rules.iter().enumerate().find_map(|(i, rule)| {
        let met = match (&rule.succeeded_indexes, rule.succeeded_count) {
            (Some(indexes), count) => {
                let required: BTreeSet<i32> = parse_indexes(Some(indexes))
                    .into_iter()
                    .filter(|i| *i < completions)
                    .collect();
                let done = required.intersection(completed).count();
                !required.is_empty()
                    && count.map_or(done == required.len(), |c| done as i64 >= i64::from(c))
            }
            (None, Some(c)) => completed.len() as i64 >= i64::from(c),
            (None, None) => false,
        };
        met.then(|| format!("Matched rules at index {i}"))
    })
}

pub fn condition_true(status: Option<&JobStatus>, ty: &str) -> bool {
    status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == ty && c.status == "True"))
}

fn condition(ty: &str, status: &str, reason: &str, message: &str, now: Timestamp) -> JobCondition {
    JobCondition {
        type_: ty.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// Sets a condition, keeping its transition time when its status does not change.
fn set_condition(status: &mut JobStatus, c: JobCondition) {
    let conds = status.conditions.get_or_insert_with(Vec::new);
    match conds.iter_mut().find(|x| x.type_ == c.type_) {
        Some(x) if x.status == c.status => {}
        Some(x) => *x = c,
        None => conds.push(c),
    }
}

/// What counting the finished pods found: the pods to count (uid, name, outcome), an end
/// a FailJob rule calls for, and the indexes FailIndex rules fail.
type Counting = (
    Vec<(String, String, Outcome)>,
    Option<Finish>,
    BTreeSet<i32>,
);

/// The pods of the job to count now: finished (or being deleted) and still held by the
/// tracking finalizer, except those whose finalizer was already taken off (`freed`, which the
/// cache may not show yet); and the uids the status already holds as uncounted.
fn to_count(
    pods: &[Arc<Pod>],
    status: &JobStatus,
    freed: &HashSet<String>,
    spec: &JobSpec,
) -> Counting {
    let suspended = spec.suspend == Some(true);
    // Pods deleted because the job succeeded (or was suspended) do not count as failures.
    let succeeding = condition_true(Some(status), "SuccessCriteriaMet");
    let ending = succeeding || condition_true(Some(status), "FailureTarget");
    let only_failed = only_replace_failed(spec);
    let uncounted = status.uncounted_terminated_pods.clone().unwrap_or_default();
    let was = |list: &Option<Vec<String>>, uid: &str| list.iter().flatten().any(|u| u == uid);
    let mut out = Vec::new();
    let mut fail_job = None;
    let mut fail_index = BTreeSet::new();
    for pod in pods {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let listed_ok = was(&uncounted.succeeded, &uid);
        let listed_failed = was(&uncounted.failed, &uid);
        let deleted = pod.metadata.deletion_timestamp.is_some() && phase(pod) != "Succeeded";
        // Under podReplacementPolicy Failed a pod being deleted counts once it has failed,
        // unless the job is ending or suspended anyway.
        let finished = is_finished(pod) || (deleted && (!only_failed || ending || suspended));
        let held = has_finalizer(pod) && !freed.contains(&uid);
        if !(listed_ok || listed_failed || (held && finished)) {
            continue;
        }
        let outcome = if listed_ok || phase(pod) == "Succeeded" {
            Outcome::Succeeded
        } else if listed_failed {
            Outcome::Failed
        } else if deleted && (suspended || succeeding) {
            Outcome::Uncounted
        } else if phase(pod) == "Failed" {
            match match_policy(spec, pod) {
                Some((PolicyAction::FailJob, message)) => {
                    fail_job.get_or_insert(Finish {
                        failed: true,
                        reason: "PodFailurePolicy",
                        message,
                    });
                    Outcome::Failed
                }
                Some((PolicyAction::Ignore, _)) => Outcome::Uncounted,
                Some((PolicyAction::FailIndex, _)) => {
                    if let Some(i) = index_of(pod) {
                        fail_index.insert(i);
                    }
                    Outcome::Failed
                }
                Some((PolicyAction::Count, _)) | None => Outcome::Failed,
            }
        } else {
            Outcome::Failed
        };
        out.push((uid, name, outcome));
    }
    // Listed before, and gone since: counted as listed.
    let present: HashSet<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    for (list, outcome) in [
        (&uncounted.succeeded, Outcome::Succeeded),
        (&uncounted.failed, Outcome::Failed),
    ] {
        for uid in list.iter().flatten() {
            if !present.contains(uid.as_str()) {
                out.push((uid.clone(), String::new(), outcome));
            }
        }
    }
    (out, fail_job, fail_index)
}

/// One sync's decisions for `job` with its `pods` at `now`; `freed` holds the uids of pods
/// whose finalizer this controller has already removed.
pub fn plan(job: &Job, pods: &[Arc<Pod>], freed: &HashSet<String>, now: Timestamp) -> Plan {
    let spec = job.spec.clone().unwrap_or_default();
    let old = job.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let mut plan = Plan::default();
    let suspended = spec.suspend == Some(true);
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let finished = condition_true(Some(&old), "Complete") || condition_true(Some(&old), "Failed");

    // Count what finished.
    let (count, fail_job, policy_failed_indexes) = to_count(pods, &old, freed, &spec);
    let mut succeeded = old.succeeded.unwrap_or(0);
    let mut failed = old.failed.unwrap_or(0);
    let mut completed: BTreeSet<i32> = parse_indexes(old.completed_indexes.as_deref());
    let mut failed_indexes: BTreeSet<i32> = parse_indexes(old.failed_indexes.as_deref());
    let completions = spec.completions;
    let by_uid: BTreeMap<&str, &Arc<Pod>> = pods
        .iter()
        .map(|p| (p.metadata.uid.as_deref().unwrap_or(""), p))
        .collect();
    for (uid, _, outcome) in &count {
        let pod = by_uid.get(uid.as_str());
        let index = pod.and_then(|p| index_of(p));
        match outcome {
            Outcome::Succeeded => {
                if indexed {
                    // An index counts once, however many of its pods succeed.
                    if let Some(i) = index.filter(|i| completions.is_some_and(|c| *i < c)) {
                        if completed.insert(i) {
                            succeeded += 1;
                        }
                    }
                } else {
                    succeeded += 1;
                }
            }
            Outcome::Failed => {
                failed += 1;
                if let (Some(limit), Some(i), Some(p)) = (spec.backoff_limit_per_index, index, pod)
                {
                    if index_failures(p) + 1 > limit {
                        failed_indexes.insert(i);
                    }
                }
            }
            Outcome::Uncounted => {}
        }
    }
    failed_indexes.extend(&policy_failed_indexes);
    failed_indexes.retain(|i| !completed.contains(i));
    plan.count = count;

    let active: Vec<&Arc<Pod>> = pods.iter().filter(|p| is_active(p)).collect();
    let terminating = pods.iter().filter(|p| is_terminating(p)).count() as i32;

    // Suspension starts and ends the clock.
    let was_suspended = condition_true(Some(&old), "Suspended");
    if !finished {
        if suspended && !was_suspended {
            set_condition(
                &mut status,
                condition("Suspended", "True", "JobSuspended", "Job suspended", now),
            );
            status.start_time = None;
            plan.suspended_now = Some(true);
        } else if !suspended && was_suspended {
            set_condition(
                &mut status,
                condition("Suspended", "False", "JobResumed", "Job resumed", now),
            );
            plan.suspended_now = Some(false);
        }
        if !suspended && status.start_time.is_none() {
            status.start_time = Some(Time(now));
        }
    }

    // Has the job reached its end?
    let mut end: Option<Finish> = None;
    for (ty, failed) in [("FailureTarget", true), ("SuccessCriteriaMet", false)] {
        if let Some(c) = old
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == ty && c.status == "True")
        {
            end = Some(Finish {
                failed,
                reason: match c.reason.as_deref() {
                    Some("BackoffLimitExceeded") => "BackoffLimitExceeded",
                    Some("DeadlineExceeded") => "DeadlineExceeded",
                    Some("PodFailurePolicy") => "PodFailurePolicy",
                    Some("MaxFailedIndexesExceeded") => "MaxFailedIndexesExceeded",
                    Some("FailedIndexes") => "FailedIndexes",
                    Some("SuccessPolicy") => "SuccessPolicy",
                    _ => "CompletionsReached",
                },
                message: c.message.clone().unwrap_or_default(),
            });
        }
    }
    let backoff_limit = spec.backoff_limit.unwrap_or(6);
    let pending: Vec<i32> = match (indexed, completions) {
        (true, Some(c)) => (0..c)
            .filter(|i| !completed.contains(i) && !failed_indexes.contains(i))
            .collect(),
        _ => Vec::new(),
    };
    if end.is_none() && !finished {
        let deadline = spec.active_deadline_seconds.and_then(|secs| {
            let start = status.start_time.as_ref()?.0;
            Some(start.as_second() + secs)
        });
        end = if let Some(f) = fail_job {
            Some(f)
        } else if spec.backoff_limit_per_index.is_none()
            && (failed > backoff_limit || past_limit_on_failure(&spec, pods, backoff_limit))
        {
            Some(Finish {
                failed: true,
                reason: "BackoffLimitExceeded",
                message: "Job has reached the specified backoff limit".into(),
            })
        } else if spec
            .max_failed_indexes
            .is_some_and(|m| failed_indexes.len() as i32 > m)
        {
            Some(Finish {
                failed: true,
                reason: "MaxFailedIndexesExceeded",
                message: "Job has exceeded the specified maximal number of failed indexes".into(),
            })
        } else if !suspended && deadline.is_some_and(|d| now.as_second() >= d) {
            Some(Finish {
                failed: true,
                reason: "DeadlineExceeded",
                message: "Job was active longer than specified deadline".into(),
            })
        } else if indexed && pending.is_empty() && !failed_indexes.is_empty() {
            Some(Finish {
                failed: true,
                reason: "FailedIndexes",
                message: "Job has failed indexes".into(),
            })
        } else if let Some(message) = success_policy_met(&spec, &completed) {
            Some(Finish {
                failed: false,
                reason: "SuccessPolicy",
                message,
            })
        } else {
            let done = match (indexed, completions) {
                (true, Some(c)) => completed.len() as i32 >= c,
                (false, Some(c)) => succeeded >= c,
                // A work queue: done when one pod succeeded and none runs.
                (_, None) => succeeded > 0 && active.is_empty(),
            };
            done.then(|| Finish {
                failed: false,
                reason: "CompletionsReached",
                message: "Reached expected number of succeeded pods".into(),
            })
        };
        if let Some(f) = &end {
            let ty = if f.failed {
                "FailureTarget"
            } else {
                "SuccessCriteriaMet"
            };
            set_condition(
                &mut status,
                condition(ty, "True", f.reason, &f.message, now),
            );
            plan.reached = Some(f.clone());
        } else if let Some(d) = deadline.filter(|_| !suspended) {
            plan.requeue = Some(Duration::from_secs((d - now.as_second()).max(1) as u64));
        }
    }

    // The pods the job should run now.
    let want: usize = if finished || end.is_some() || suspended {
        0
    } else {
        let parallelism = spec.parallelism.unwrap_or(1).max(0);
        match (indexed, completions) {
            (true, Some(_)) => (parallelism as usize).min(pending.len()),
            (false, Some(c)) => parallelism.min((c - succeeded).max(0)) as usize,
            (_, None) if succeeded > 0 => active.len().min(parallelism as usize),
            (_, None) => parallelism as usize,
        }
    };
    let mut keep: Vec<&Arc<Pod>> = Vec::new();
    let mut surplus: Vec<&Arc<Pod>> = Vec::new();
    let mut held_indexes = BTreeSet::new();
    for p in &active {
        // Indexed: a pod of an index already done, or a second pod of an index, goes.
        let index_ok =
            !indexed || index_of(p).is_some_and(|i| pending.contains(&i) && held_indexes.insert(i));
        if index_ok {
            keep.push(p);
        } else {
            surplus.push(p);
        }
    }
    if keep.len() > want {
        // Not ready first, then the newest.
        keep.sort_by_key(|p| {
            (
                is_ready(p),
                std::cmp::Reverse(p.metadata.creation_timestamp.as_ref().map(|t| t.0)),
            )
        });
        let extra = keep.len() - want;
        let gone: Vec<&Arc<Pod>> = keep.drain(..extra).collect();
        for p in gone {
            if let Some(i) = index_of(p) {
                held_indexes.remove(&i);
            }
            surplus.push(p);
        }
    }
    plan.delete = surplus
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    // Under podReplacementPolicy Failed a pod is replaced only once it has failed: the pods
    // still terminating hold their places (and their indexes).
    let only_failed = only_replace_failed(&spec);
    let held = if only_failed {
        for p in pods.iter().filter(|p| is_terminating(p)) {
            if let Some(i) = index_of(p) {
                held_indexes.insert(i);
            }
        }
        keep.len() + terminating as usize
    } else {
        keep.len()
    };
    if held < want {
        let new_failures = plan
            .count
            .iter()
            .filter(|(_, _, o)| *o == Outcome::Failed)
            .count();
        // Failed pods are replaced after a delay that doubles with each failure.
        let last_failure = pods
            .iter()
            .filter(|p| phase(p) == "Failed")
            .filter_map(|p| finished_at(p))
            .max();
        let delay = match failed {
            0 => Duration::ZERO,
            n => BACKOFF
                .saturating_mul(1u32 << (n - 1).min(10) as u32)
                .min(MAX_BACKOFF),
        };
        let ready_at = last_failure.map(|t| t.as_second() + delay.as_secs() as i64);
        match ready_at.filter(|at| *at > now.as_second() && (failed > 0 || new_failures > 0)) {
            Some(at) => {
                let wait = Duration::from_secs((at - now.as_second()) as u64);
                plan.requeue = Some(plan.requeue.map_or(wait, |r| r.min(wait)));
            }
            None => {
                let n = want - held;
                if indexed {
                    let failures_of = |i: i32| {
                        pods.iter()
                            .filter(|p| index_of(p) == Some(i) && phase(p) == "Failed")
                            .map(|p| index_failures(p) + 1)
                            .max()
                            .unwrap_or(0)
                    };
                    plan.create = pending
                        .iter()
                        .filter(|i| !held_indexes.contains(i))
                        .take(n)
                        .map(|i| (Some(*i), failures_of(*i)))
                        .collect();
                } else {
                    plan.create = vec![(None, 0); n];
                }
            }
        }
    }

    // The status.
    // The pods about to be created count as active, as Kubernetes counts them.
    status.active = Some((keep.len() + plan.create.len()) as i32);
    status.ready = Some(keep.iter().filter(|p| is_ready(p)).count() as i32);
    status.terminating = Some(terminating + plan.delete.len() as i32);
    status.succeeded = Some(succeeded);
    status.failed = Some(failed);
    status.uncounted_terminated_pods = Some(UncountedTerminatedPods::default());
    if indexed {
        status.completed_indexes = Some(format_indexes(&completed));
        if spec.backoff_limit_per_index.is_some() {
            status.failed_indexes = Some(format_indexes(&failed_indexes));
        }
    }
    if let Some(f) = end.as_ref().filter(|_| !finished) {
        // The job ends once none of its pods runs any more.
        let running = keep.len() + surplus.len() + terminating as usize;
        if running == 0 {
            let ty = if f.failed { "Failed" } else { "Complete" };
            set_condition(
                &mut status,
                condition(ty, "True", f.reason, &f.message, now),
            );
            if !f.failed {
                status.completion_time = Some(Time(now));
            }
            plan.finished_now = true;
        } else if plan.requeue.is_none() {
            plan.requeue = Some(Duration::from_secs(1));
        }
    }
    plan.status = status;
    plan
}

#[cfg(test)]
mod tests;
