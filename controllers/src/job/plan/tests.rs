//! The planner's table: jobs and pods in, the counts, conditions and pod changes out.

use super::*;
use serde_json::{json, Value};

const NOW: &str = "2026-01-01T00:10:00Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn job(spec: Value, status: Value) -> Job {
    serde_json::from_value(
        json!({"metadata": {"name": "pi", "namespace": "ns", "uid": "j"},
        "spec": spec, "status": status}),
    )
    .unwrap()
}

/// A pod of the job: `state` is running, ready, succeeded, failed:<code>[@finish], or
/// deleting; `index` for Indexed jobs.
fn pod(name: &str, state: &str, index: Option<i32>) -> Arc<Pod> {
    // A trailing `!`: counted already, the finalizer is off.
    let (state, counted) = match state.strip_suffix('!') {
        Some(s) => (s, true),
        None => (state, false),
    };
    let (phase, code, at) = match state.split_once(':') {
        Some(("failed", rest)) => {
            let (code, at) = rest
                .split_once('@')
                .unwrap_or((rest, "2026-01-01T00:00:00Z"));
            ("Failed", code.parse::<i32>().unwrap(), at.to_string())
        }
        _ => match state {
            "succeeded" => ("Succeeded", 0, "2026-01-01T00:00:00Z".to_string()),
            _ => ("Running", -1, String::new()),
        },
    };
    let mut p = json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"),
            "finalizers": [TRACKING_FINALIZER],
            "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": phase, "conditions": [
            {"type": "Ready", "status": if state == "ready" {"True"} else {"False"}}]}});
    if code >= 0 {
        p["status"]["containerStatuses"] = json!([{"name": "c", "image": "i", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "finishedAt": at}}}]);
    }
    if state == "deleting" {
        p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:09:00Z");
    }
    if counted {
        p["metadata"]["finalizers"] = json!([]);
    }
    if let Some(n) = state.strip_prefix("restarted:") {
        p["status"]["containerStatuses"] = json!([{"name": "c", "image": "i", "imageID": "",
            "ready": true, "restartCount": n.parse::<i32>().unwrap(),
            "state": {"running": {}}}]);
    }
    if let Some(i) = index {
        p["metadata"]["annotations"] = json!({COMPLETION_INDEX: i.to_string()});
    }
    Arc::new(serde_json::from_value(p).unwrap())
}

fn conditions(p: &Plan) -> Vec<String> {
    p.status
        .conditions
        .iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={}:{}",
                c.type_,
                c.status,
                c.reason.as_deref().unwrap_or("")
            )
        })
        .collect()
}

#[test]
fn next_actions_from_the_pods() {
    let started = json!({"startTime": "2026-01-01T00:00:00Z"});
    struct Case {
        what: &'static str,
        spec: Value,
        status: Value,
        pods: Vec<Arc<Pod>>,
        create: usize,
        delete: usize,
        counts: (i32, i32),
        conditions: &'static [&'static str],
    }
    let cases = [
        Case {
            what: "a new job starts parallelism pods",
            spec: json!({"completions": 3, "parallelism": 2}),
            status: json!({}),
            pods: vec![],
            create: 2,
            delete: 0,
            counts: (0, 0),
            conditions: &[],
        },
        Case {
            what: "one succeeded: one more for the last completion",
            spec: json!({"completions": 3, "parallelism": 2}),
            status: started.clone(),
            pods: vec![pod("a", "succeeded", None), pod("b", "running", None)],
            create: 1,
            delete: 0,
            counts: (1, 0),
            conditions: &[],
        },
        Case {
            what: "all completions: complete",
            spec: json!({"completions": 2, "parallelism": 2}),
            status: json!({"startTime": "2026-01-01T00:00:00Z", "succeeded": 1}),
            pods: vec![pod("b", "succeeded", None)],
            create: 0,
            delete: 0,
            counts: (2, 0),
            conditions: &[
                "SuccessCriteriaMet=True:CompletionsReached",
                "Complete=True:CompletionsReached",
            ],
        },
        Case {
            what: "a failure within the limit waits out the backoff",
            spec: json!({"completions": 1, "parallelism": 1, "backoffLimit": 2}),
            status: started.clone(),
            pods: vec![pod("a", "failed:1@2026-01-01T00:09:55Z", None)],
            create: 0,
            delete: 0,
            counts: (0, 1),
            conditions: &[],
        },
        Case {
            what: "after the backoff the failed pod is replaced",
            spec: json!({"completions": 1, "parallelism": 1, "backoffLimit": 2}),
            status: json!({"startTime": "2026-01-01T00:00:00Z", "failed": 1}),
            pods: vec![pod("a", "failed:1@2026-01-01T00:09:00Z!", None)],
            create: 1,
            delete: 0,
            counts: (0, 1),
            conditions: &[],
        },
        Case {
            what: "past the backoff limit the job fails and its pods go",
            spec: json!({"completions": 2, "parallelism": 2, "backoffLimit": 1}),
            status: json!({"startTime": "2026-01-01T00:00:00Z", "failed": 1}),
            pods: vec![pod("a", "failed:1", None), pod("b", "running", None)],
            create: 0,
            delete: 1,
            counts: (0, 2),
            conditions: &["FailureTarget=True:BackoffLimitExceeded"],
        },
        Case {
            what: "OnFailure: restarts in the pods count against the limit",
            spec: json!({"completions": 1, "parallelism": 1, "backoffLimit": 2,
                "template": {"spec": {"restartPolicy": "OnFailure", "containers": []}}}),
            status: started.clone(),
            pods: vec![pod("a", "restarted:2", None)],
            create: 0,
            delete: 1,
            counts: (0, 0),
            conditions: &["FailureTarget=True:BackoffLimitExceeded"],
        },
        Case {
            what: "OnFailure: fewer restarts than the limit go on",
            spec: json!({"completions": 1, "parallelism": 1, "backoffLimit": 3,
                "template": {"spec": {"restartPolicy": "OnFailure", "containers": []}}}),
            status: started.clone(),
            pods: vec![pod("a", "restarted:2", None)],
            create: 0,
            delete: 0,
            counts: (0, 0),
            conditions: &[],
        },
        Case {
            what: "the deadline passed",
            spec: json!({"completions": 1, "parallelism": 1, "activeDeadlineSeconds": 60}),
            status: started.clone(),
            pods: vec![pod("a", "running", None)],
            create: 0,
            delete: 1,
            counts: (0, 0),
            conditions: &["FailureTarget=True:DeadlineExceeded"],
        },
        Case {
            what: "suspended: the active pods go, uncounted",
            spec: json!({"completions": 1, "parallelism": 1, "suspend": true}),
            status: started.clone(),
            pods: vec![pod("a", "running", None), pod("b", "deleting", None)],
            create: 0,
            delete: 1,
            counts: (0, 0),
            conditions: &["Suspended=True:JobSuspended"],
        },
        Case {
            what: "a FailJob rule fails the job at once",
            spec: json!({"completions": 1, "parallelism": 1, "backoffLimit": 6,
                "podFailurePolicy": {"rules": [
                    {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [2]}},
                    {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}}),
            status: started.clone(),
            pods: vec![pod("a", "failed:42", None)],
            create: 0,
            delete: 0,
            counts: (0, 1),
            conditions: &[
                "FailureTarget=True:PodFailurePolicy",
                "Failed=True:PodFailurePolicy",
            ],
        },
        Case {
            what: "an Ignore rule does not count the failure",
            spec: json!({"completions": 1, "parallelism": 1, "backoffLimit": 0,
                "podFailurePolicy": {"rules": [
                    {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [2]}}]}}),
            status: started.clone(),
            pods: vec![pod("a", "failed:2", None)],
            create: 1,
            delete: 0,
            counts: (0, 0),
            conditions: &[],
        },
        Case {
            what: "indexed: the missing indexes are created",
            spec: json!({"completions": 4, "parallelism": 2, "completionMode": "Indexed"}),
            status: json!({"startTime": "2026-01-01T00:00:00Z", "succeeded": 1,
                "completedIndexes": "0"}),
            pods: vec![pod("a", "running", Some(1))],
            create: 1,
            delete: 0,
            counts: (1, 0),
            conditions: &[],
        },
        Case {
            what: "indexed: a second success of an index counts once",
            spec: json!({"completions": 2, "parallelism": 2, "completionMode": "Indexed"}),
            status: json!({"startTime": "2026-01-01T00:00:00Z", "succeeded": 1,
                "completedIndexes": "0"}),
            pods: vec![
                pod("a", "succeeded", Some(0)),
                pod("b", "succeeded", Some(1)),
            ],
            create: 0,
            delete: 0,
            counts: (2, 0),
            conditions: &[
                "SuccessCriteriaMet=True:CompletionsReached",
                "Complete=True:CompletionsReached",
            ],
        },
        Case {
            what: "indexed with a per-index limit: the index fails, the others go on",
            spec: json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed",
                "backoffLimitPerIndex": 0, "backoffLimit": i32::MAX}),
            status: started.clone(),
            pods: vec![
                pod("a", "failed:1@2026-01-01T00:00:00Z", Some(0)),
                pod("b", "running", Some(1)),
                pod("c", "running", Some(2)),
            ],
            create: 0,
            delete: 0,
            counts: (0, 1),
            conditions: &[],
        },
        Case {
            what: "a success policy rule met: the other indexes go",
            spec: json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed",
                "successPolicy": {"rules": [{"succeededCount": 3}, {"succeededIndexes": "1"}]}}),
            status: started.clone(),
            pods: vec![
                pod("a", "running", Some(0)),
                pod("b", "succeeded", Some(1)),
                pod("c", "running", Some(2)),
            ],
            create: 0,
            delete: 2,
            counts: (1, 0),
            conditions: &["SuccessCriteriaMet=True:SuccessPolicy"],
        },
        Case {
            what: "a success policy not met yet: the job goes on",
            spec: json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed",
                "successPolicy": {"rules": [{"succeededIndexes": "0-1", "succeededCount": 2}]}}),
            status: started.clone(),
            pods: vec![
                pod("a", "running", Some(0)),
                pod("b", "succeeded", Some(1)),
                pod("c", "running", Some(2)),
            ],
            create: 0,
            delete: 0,
            counts: (1, 0),
            conditions: &[],
        },
        Case {
            what: "succeeded by policy: the pods deleted for it are no failures",
            spec: json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed",
                "successPolicy": {"rules": [{"succeededIndexes": "1"}]}}),
            status: json!({"startTime": "2026-01-01T00:00:00Z", "succeeded": 1,
                "completedIndexes": "1", "conditions": [{"type": "SuccessCriteriaMet",
                    "status": "True", "reason": "SuccessPolicy",
                    "message": "Matched rules at index 0"}]}),
            pods: vec![pod("a", "deleting", Some(0))],
            create: 0,
            delete: 0,
            counts: (1, 0),
            conditions: &["SuccessCriteriaMet=True:SuccessPolicy"],
        },
        Case {
            what: "podReplacementPolicy Failed: a terminating pod is neither failed nor replaced",
            spec: json!({"completions": 1, "parallelism": 1, "podReplacementPolicy": "Failed"}),
            status: started.clone(),
            pods: vec![pod("a", "deleting", None)],
            create: 0,
            delete: 0,
            counts: (0, 0),
            conditions: &[],
        },
        Case {
            what: "TerminatingOrFailed: a terminating pod is failed and replaced",
            spec: json!({"completions": 1, "parallelism": 1,
                "podReplacementPolicy": "TerminatingOrFailed"}),
            status: started.clone(),
            pods: vec![pod("a", "deleting", None)],
            create: 1,
            delete: 0,
            counts: (0, 1),
            conditions: &[],
        },
        Case {
            what: "podReplacementPolicy Failed, indexed: a terminating pod keeps its index",
            spec: json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed",
                "podReplacementPolicy": "Failed"}),
            status: started.clone(),
            pods: vec![pod("a", "deleting", Some(0)), pod("b", "running", Some(1))],
            create: 1,
            delete: 0,
            counts: (0, 0),
            conditions: &[],
        },
    ];
    for c in cases {
        let j = job(c.spec, c.status);
        let p = plan(&j, &c.pods, &HashSet::new(), now());
        assert_eq!(p.create.len(), c.create, "{}: creates", c.what);
        assert_eq!(p.delete.len(), c.delete, "{}: deletes", c.what);
        assert_eq!(
            (p.status.succeeded.unwrap(), p.status.failed.unwrap()),
            c.counts,
            "{}: counts",
            c.what
        );
        assert_eq!(conditions(&p), c.conditions, "{}: conditions", c.what);
    }
}

#[test]
fn indexes_and_backoff_details() {
    let j = job(
        json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed",
            "backoffLimitPerIndex": 0, "backoffLimit": i32::MAX}),
        json!({"startTime": "2026-01-01T00:00:00Z"}),
    );
    let pods = vec![
        pod("a", "failed:1", Some(0)),
        pod("b", "succeeded", Some(2)),
    ];
    let p = plan(&j, &pods, &HashSet::new(), now());
    assert_eq!(p.status.failed_indexes.as_deref(), Some("0"));
    assert_eq!(p.status.completed_indexes.as_deref(), Some("2"));
    assert_eq!(p.create, [(Some(1), 0)]);

    // podReplacementPolicy Failed: the index of a terminating pod is not started again.
    let j = job(
        json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed",
            "podReplacementPolicy": "Failed"}),
        json!({"startTime": "2026-01-01T00:00:00Z"}),
    );
    let pods = vec![pod("a", "deleting", Some(0)), pod("b", "running", Some(1))];
    let p = plan(&j, &pods, &HashSet::new(), now());
    assert_eq!(p.create, [(Some(2), 0)]);
    assert_eq!(p.status.terminating, Some(1));

    // The backoff doubles: the third failure waits 40 s from the last one.
    let j = job(
        json!({"completions": 1, "parallelism": 1}),
        json!({"startTime": "2026-01-01T00:00:00Z", "failed": 3}),
    );
    let pods = vec![pod("a", "failed:1@2026-01-01T00:09:50Z", None)];
    let p = plan(&j, &pods, &HashSet::from(["u-a".to_string()]), now());
    assert!(p.create.is_empty());
    assert_eq!(p.requeue, Some(Duration::from_secs(30)));

    // Pods whose finalizer is already off are not counted again.
    let j = job(
        json!({"completions": 2, "parallelism": 1}),
        json!({"succeeded": 1}),
    );
    let p = plan(
        &j,
        &[pod("a", "succeeded", None)],
        &HashSet::from(["u-a".into()]),
        now(),
    );
    assert_eq!(p.status.succeeded, Some(1));
    assert!(p.count.is_empty());
    assert_eq!(p.create.len(), 1);
}
