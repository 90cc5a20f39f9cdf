//! What one sync of a StatefulSet does, decided from its pods alone (Kubernetes'
//! `updateStatefulSet`): every ordinal of `[start, start+replicas)` gets a pod, at the current
//! revision below the partition and at the update revision from it; a failed or succeeded pod
//! is deleted to be made again; pods beyond the replicas are deleted, highest ordinal first;
//! then a RollingUpdate deletes the highest-ordinal pod at or above the partition that is not
//! at the update revision, one at a time, each waiting for the ones above to be healthy.
//!
//! With OrderedReady (monotonic) management each step waits for the pods before it to be
//! Running and Ready (and available for minReadySeconds): one pod is created or deleted per
//! sync, and an unhealthy pod stops the sync. Parallel management creates and deletes all at
//! once.
//!
//! The status is counted from the same pods ([`status`]).

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::identity::{revision_of, POD_INDEX_LABEL, POD_NAME_LABEL};
use crate::pods::{is_available, is_ready, phase};

/// The revision a new pod is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Current,
    Update,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create the pod of this ordinal (its claims first).
    Create(i32, Which),
    /// Delete a pod that ended, to make it again (`failed`: it failed).
    Recreate { pod: String, failed: bool },
    /// Delete a pod beyond the replicas.
    Condemn(String),
    /// Delete a pod of an old revision, for the rolling update.
    Update(String),
    /// Put back the labels that name the pod and its ordinal (an adopted pod lacks them).
    Fix(String, i32),
}

/// What the sync has to work on.
pub struct Input<'a> {
    pub start: i32,
    pub replicas: i32,
    /// OrderedReady.
    pub monotonic: bool,
    /// The partition of a RollingUpdate; None for OnDelete.
    pub partition: Option<i32>,
    pub update_revision: &'a str,
    pub min_ready: i64,
    pub now: Timestamp,
    /// The set's pods, by ordinal.
    pub pods: &'a [(i32, &'a Pod)],
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// A pod is Ready but not yet available for minReadySeconds: look again.
    pub waiting_for_available: bool,
}

fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn running_and_ready(pod: &Pod) -> bool {
    phase(pod) == "Running" && is_ready(pod)
}

/// Running, Ready, available and not being deleted.
fn healthy(pod: &Pod, min_ready: i64, now: Timestamp) -> bool {
    running_and_ready(pod) && is_available(pod, min_ready, now) && !terminating(pod)
}

fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// The pod's labels name it and its ordinal.
fn identity_matches(pod: &Pod, ordinal: i32) -> bool {
    let labels = pod.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    label(POD_NAME_LABEL) == pod.metadata.name.as_deref()
        && label(POD_INDEX_LABEL) == Some(ordinal.to_string().as_str())
}

pub fn plan(input: &Input) -> Plan {
    let mut plan = Plan::default();
    let end = input.start + input.replicas.max(0);
    let in_range = |o: i32| o >= input.start && o < end;
    let mut replicas: Vec<Option<&Pod>> = vec![None; input.replicas.max(0) as usize];
    let mut condemned: Vec<(i32, &Pod)> = Vec::new();
    for &(o, pod) in input.pods {
        if in_range(o) {
            replicas[(o - input.start) as usize] = Some(pod);
        } else {
            condemned.push((o, pod));
        }
    }
    // Highest ordinal first.
    condemned.sort_by_key(|(o, _)| std::cmp::Reverse(*o));
    let healthy = |p: &Pod| healthy(p, input.min_ready, input.now);
    // The first unhealthy pod (by ordinal among the replicas, then the lowest condemned one)
    // may be deleted by a scale-down even in OrderedReady: it would block it forever.
    let first_unhealthy: Option<String> = replicas
        .iter()
        .flatten()
        .copied()
        .chain(condemned.iter().rev().map(|(_, p)| *p))
        .find(|p| !healthy(p))
        .map(name);

    // The replicas, in ordinal order.
    for (i, slot) in replicas.iter().enumerate() {
        let ordinal = input.start + i as i32;
        let Some(pod) = slot else {
            let which = match input.partition {
                Some(p) if (i as i32) < p => Which::Current,
                _ => Which::Update,
            };
            plan.steps.push(Step::Create(ordinal, which));
            if input.monotonic {
                return plan;
            }
            continue;
        };
        if matches!(phase(pod), "Failed" | "Succeeded") {
            if !terminating(pod) {
                plan.steps.push(Step::Recreate {
                    pod: name(pod),
                    failed: phase(pod) == "Failed",
                });
            }
            if input.monotonic {
                return plan;
            }
            continue;
        }
        if input.monotonic {
            if terminating(pod) || !running_and_ready(pod) {
                return plan;
            }
            if !is_available(pod, input.min_ready, input.now) {
                plan.waiting_for_available = true;
                return plan;
            }
        }
        if !identity_matches(pod, ordinal) {
            plan.steps.push(Step::Fix(name(pod), ordinal));
        }
    }
    if !input.monotonic
        && plan
            .steps
            .iter()
            .any(|s| matches!(s, Step::Recreate { .. }))
    {
        return plan;
    }

    // Pods beyond the replicas, highest ordinal first.
    for (_, pod) in &condemned {
        if terminating(pod) {
            if input.monotonic {
                return plan;
            }
            continue;
        }
        let first = first_unhealthy.as_deref() == Some(name(pod).as_str());
        if input.monotonic && !first {
            if !running_and_ready(pod) {
                return plan;
            }
            if !is_available(pod, input.min_ready, input.now) {
                plan.waiting_for_available = true;
                return plan;
            }
        }
        plan.steps.push(Step::Condemn(name(pod)));
        if input.monotonic {
            return plan;
        }
    }

    // The rolling update, from the highest ordinal down to the partition.
    let Some(partition) = input.partition else {
        return plan;
    };
    if plan.steps.iter().any(|s| !matches!(s, Step::Fix(..))) {
        // Parallel: what was created this sync is not healthy yet; the update waits.
        return plan;
    }
    for slot in replicas.iter().skip(partition.max(0) as usize).rev() {
        let Some(pod) = slot else {
            return plan;
        };
        if revision_of(pod) != input.update_revision && !terminating(pod) {
            plan.steps.push(Step::Update(name(pod)));
            return plan;
        }
        if !healthy(pod) {
            if running_and_ready(pod) && !terminating(pod) {
                plan.waiting_for_available = true;
            }
            return plan;
        }
    }
    plan
}

/// The status Kubernetes' `computeReplicaStatus` and `completeRollingUpdate` give: pods
/// counted by readiness, availability and revision; a RollingUpdate whose pods are all updated
/// and Ready makes the update revision the current one.
pub fn status(
    set: &StatefulSet,
    pods: &[(i32, &Pod)],
    current: &str,
    update: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> StatefulSetStatus {
    let min_ready = super::min_ready(set);
    let (mut replicas, mut ready, mut available, mut cur, mut updated) = (0, 0, 0, 0, 0);
    for (_, pod) in pods {
        replicas += 1;
        if phase(pod) == "Running" && is_ready(pod) {
            ready += 1;
            if is_available(pod, min_ready, now) {
                available += 1;
            }
        }
        if pod.metadata.deletion_timestamp.is_none() {
            if revision_of(pod) == current {
                cur += 1;
            }
            if revision_of(pod) == update {
                updated += 1;
            }
        }
    }
    let previous = set.status.clone().unwrap_or_default();
    let mut current = current.to_string();
    let rolling = super::shape(set).3.is_some();
    if rolling && updated == replicas && ready == replicas {
        cur = updated;
        current = update.to_string();
    }
    let some = |n: i32| (n > 0).then_some(n);
    StatefulSetStatus {
        replicas,
        ready_replicas: some(ready),
        available_replicas: Some(available),
        current_replicas: some(cur),
        updated_replicas: some(updated),
        current_revision: Some(current),
        update_revision: Some(update.to_string()),
        observed_generation: set.metadata.generation,
        collision_count: Some(previous.collision_count.unwrap_or(0)),
        conditions: previous.conditions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn pod(name: &str, rev: &str, status: Value) -> Pod {
        let ordinal = name.rsplit_once('-').map_or("", |(_, o)| o);
        serde_json::from_value(json!({"metadata": {"name": name,
            "labels": {"controller-revision-hash": rev, POD_NAME_LABEL: name,
                       POD_INDEX_LABEL: ordinal}}, "status": status}))
        .unwrap()
    }

    fn ready() -> Value {
        json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    }

    fn pending() -> Value {
        json!({"phase": "Pending"})
    }

    fn deleting(mut p: Pod) -> Pod {
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        ));
        p
    }

    struct Case {
        what: &'static str,
        replicas: i32,
        monotonic: bool,
        partition: Option<i32>,
        pods: Vec<Pod>,
        want: Vec<Step>,
    }

    #[test]
    fn an_adopted_pod_gets_the_labels_that_name_it() {
        let mut adopted = pod("web-1", "new", ready());
        adopted.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        let c = Case {
            what: "",
            replicas: 2,
            monotonic: true,
            partition: None,
            pods: vec![pod("web-0", "new", ready()), adopted],
            want: vec![],
        };
        assert_eq!(run(&c).steps, [Step::Fix("web-1".into(), 1)]);
    }

    #[test]
    fn ordinals_start_where_asked_and_min_ready_seconds_hold_the_next_pod() {
        let p0 = pod("web-5", "new", ready());
        let pods = [(5, &p0)];
        let input = |min_ready| Input {
            start: 5,
            replicas: 2,
            monotonic: true,
            partition: Some(0),
            update_revision: "new",
            min_ready,
            now: "2026-01-01T00:00:30Z".parse().unwrap(),
            pods: &pods,
        };
        // Ready since 00:00:00: available after 10 s, not after 60 s.
        let got = plan(&input(10));
        assert_eq!(got.steps, [Step::Create(6, Which::Update)]);
        let got = plan(&input(60));
        assert_eq!(
            got,
            Plan {
                steps: vec![],
                waiting_for_available: true
            }
        );
        // web-4 is below the start: it goes as a scaled-down pod would.
        let below = pod("web-4", "new", ready());
        let six = pod("web-6", "new", ready());
        let pods = [(4, &below), (5, &p0), (6, &six)];
        let got = plan(&Input {
            pods: &pods,
            ..input(0)
        });
        assert_eq!(got.steps, [Step::Condemn("web-4".into())]);
    }

    fn run(c: &Case) -> Plan {
        let ordinals: Vec<(i32, &Pod)> = c
            .pods
            .iter()
            .map(|p| {
                let n = p.metadata.name.as_deref().unwrap();
                (super::super::identity::ordinal_of("web", n).unwrap(), p)
            })
            .collect();
        plan(&Input {
            start: 0,
            replicas: c.replicas,
            monotonic: c.monotonic,
            partition: c.partition,
            update_revision: "new",
            min_ready: 0,
            now: "2026-01-01T01:00:00Z".parse().unwrap(),
            pods: &ordinals,
        })
    }

    #[test]
    fn ordered_and_parallel_management() {
        use Step::*;
        let upd = Which::Update;
        let cases = vec![
            Case {
                what: "ordered: web-0 first",
                replicas: 3,
                monotonic: true,
                partition: Some(0),
                pods: vec![],
                want: vec![Create(0, upd)],
            },
            Case {
                what: "ordered: web-1 waits for web-0 to be Ready",
                replicas: 3,
                monotonic: true,
                partition: Some(0),
                pods: vec![pod("web-0", "new", pending())],
                want: vec![],
            },
            Case {
                what: "ordered: then web-1",
                replicas: 3,
                monotonic: true,
                partition: Some(0),
                pods: vec![pod("web-0", "new", ready())],
                want: vec![Create(1, upd)],
            },
            Case {
                what: "parallel: all at once",
                replicas: 3,
                monotonic: false,
                partition: Some(0),
                pods: vec![pod("web-0", "new", pending())],
                want: vec![Create(1, upd), Create(2, upd)],
            },
            Case {
                what: "ordered: scale down from the highest ordinal, one at a time",
                replicas: 1,
                monotonic: true,
                partition: Some(0),
                pods: vec![
                    pod("web-0", "new", ready()),
                    pod("web-1", "new", ready()),
                    pod("web-2", "new", ready()),
                ],
                want: vec![Condemn("web-2".into())],
            },
            Case {
                what: "ordered: web-1 waits for web-2 to go",
                replicas: 1,
                monotonic: true,
                partition: Some(0),
                pods: vec![
                    pod("web-0", "new", ready()),
                    pod("web-1", "new", ready()),
                    deleting(pod("web-2", "new", ready())),
                ],
                want: vec![],
            },
            Case {
                what: "ordered: an unhealthy replica stops the scale-down",
                replicas: 1,
                monotonic: true,
                partition: Some(0),
                pods: vec![pod("web-0", "new", pending()), pod("web-1", "new", ready())],
                want: vec![],
            },
            Case {
                what: "ordered: the first unhealthy pod may go",
                replicas: 1,
                monotonic: true,
                partition: Some(0),
                pods: vec![pod("web-0", "new", ready()), pod("web-1", "new", pending())],
                want: vec![Condemn("web-1".into())],
            },
            Case {
                what: "parallel: every condemned pod at once",
                replicas: 1,
                monotonic: false,
                partition: Some(0),
                pods: vec![
                    pod("web-0", "new", ready()),
                    pod("web-1", "new", pending()),
                    pod("web-2", "new", ready()),
                ],
                want: vec![Condemn("web-2".into()), Condemn("web-1".into())],
            },
            Case {
                what: "a failed pod is made again",
                replicas: 2,
                monotonic: true,
                partition: Some(0),
                pods: vec![
                    pod("web-0", "new", json!({"phase": "Failed"})),
                    pod("web-1", "new", ready()),
                ],
                want: vec![Recreate {
                    pod: "web-0".into(),
                    failed: true,
                }],
            },
        ];
        for c in &cases {
            assert_eq!(run(c).steps, c.want, "{}", c.what);
        }
    }

    #[test]
    fn rolling_updates_respect_the_partition_and_on_delete_waits() {
        use Step::*;
        let all_old = || {
            vec![
                pod("web-0", "old", ready()),
                pod("web-1", "old", ready()),
                pod("web-2", "old", ready()),
            ]
        };
        let cases = vec![
            Case {
                what: "the highest ordinal goes first",
                replicas: 3,
                monotonic: true,
                partition: Some(0),
                pods: all_old(),
                want: vec![Update("web-2".into())],
            },
            Case {
                what: "the next waits for the updated one to be healthy",
                replicas: 3,
                monotonic: true,
                partition: Some(0),
                pods: vec![
                    pod("web-0", "old", ready()),
                    pod("web-1", "old", ready()),
                    pod("web-2", "new", pending()),
                ],
                want: vec![],
            },
            Case {
                what: "then the next one",
                replicas: 3,
                monotonic: false,
                partition: Some(0),
                pods: vec![
                    pod("web-0", "old", ready()),
                    pod("web-1", "old", ready()),
                    pod("web-2", "new", ready()),
                ],
                want: vec![Update("web-1".into())],
            },
            Case {
                what: "ordinals below the partition keep their revision",
                replicas: 3,
                monotonic: true,
                partition: Some(2),
                pods: vec![
                    pod("web-0", "old", ready()),
                    pod("web-1", "old", ready()),
                    pod("web-2", "new", ready()),
                ],
                want: vec![],
            },
            Case {
                what: "and are made again at it",
                replicas: 3,
                monotonic: true,
                partition: Some(2),
                pods: vec![pod("web-1", "old", ready()), pod("web-2", "new", ready())],
                want: vec![Create(0, Which::Current)],
            },
            Case {
                what: "OnDelete leaves old pods alone",
                replicas: 3,
                monotonic: true,
                partition: None,
                pods: all_old(),
                want: vec![],
            },
            Case {
                what: "OnDelete makes a deleted pod at the update revision",
                replicas: 3,
                monotonic: true,
                partition: None,
                pods: vec![pod("web-0", "old", ready()), pod("web-2", "old", ready())],
                want: vec![Create(1, Which::Update)],
            },
        ];
        for c in &cases {
            assert_eq!(run(c).steps, c.want, "{}", c.what);
        }
    }

    #[test]
    fn the_status_counts_pods_by_readiness_and_revision() {
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let set = |strategy: Value| -> StatefulSet {
            serde_json::from_value(json!({"metadata": {"name": "web", "generation": 4},
                "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                         "template": {}, "updateStrategy": strategy}}))
            .unwrap()
        };
        let rolling = set(json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}));
        let (a, b, c) = (
            pod("web-0", "web-old", ready()),
            pod("web-1", "web-new", ready()),
            pod("web-2", "web-new", json!({"phase": "Pending"})),
        );
        let pods = [(0, &a), (1, &b), (2, &c)];
        let s = status(&rolling, &pods, "web-old", "web-new", now);
        assert_eq!(
            serde_json::to_value(s).unwrap(),
            json!({"replicas": 3, "readyReplicas": 2, "availableReplicas": 2,
                   "currentReplicas": 1, "updatedReplicas": 2, "currentRevision": "web-old",
                   "updateRevision": "web-new", "observedGeneration": 4, "collisionCount": 0})
        );
        // All updated and Ready: the update revision becomes the current one.
        let c = pod("web-2", "web-new", ready());
        let a = pod("web-0", "web-new", ready());
        let pods = [(0, &a), (1, &b), (2, &c)];
        let s = status(&rolling, &pods, "web-old", "web-new", now);
        assert_eq!(
            (s.current_revision.as_deref(), s.current_replicas),
            (Some("web-new"), Some(3))
        );
        // Not with OnDelete.
        let on_delete = set(json!({"type": "OnDelete"}));
        let s = status(&on_delete, &pods, "web-old", "web-new", now);
        assert_eq!(
            (s.current_revision.as_deref(), s.current_replicas),
            (Some("web-old"), None)
        );
    }
}
