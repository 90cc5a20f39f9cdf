//! Jobs and CronJobs as a user runs them with kubectl, on a simulated node whose pods run to
//! completion (a Job's pods end at once, with the exit code of their `sim.rkube.io/exit-code`
//! annotation, 0 unless it says otherwise): a Job of three completions two at a time
//! completes; a failing Job stops at its backoff limit; an Indexed Job runs each index once; a
//! CronJob starts a Job every minute and keeps only its history limit of them, and
//! `kubectl create job --from=cronjob/...` starts one by hand. A successPolicy ends an Indexed
//! Job early; a Job of another controller (`managedBy`) is left alone; orphans a Job selects
//! are adopted; podReplacementPolicy Failed waits for a deleted pod to fail, which the pod
//! garbage collector makes it do when the pod was never scheduled. The pod garbage collector
//! keeps terminated pods up to its threshold and fails and deletes the pods of a missing node.

use std::collections::BTreeSet;
use std::time::Duration;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::Cluster;

async fn cluster_with_a_node() -> (Cluster, Kubectl) {
    super::common::sim_cluster(1).await
}

const JOBS: &str = r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: pi
spec:
  completions: 3
  parallelism: 2
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: pi
        image: busybox:1.36
        command: ["sh", "-c", "exit 0"]
---
apiVersion: batch/v1
kind: Job
metadata:
  name: doomed
spec:
  backoffLimit: 1
  template:
    metadata:
      annotations:
        sim.rkube.io/exit-code: "1"
    spec:
      restartPolicy: Never
      containers:
      - name: fail
        image: busybox:1.36
        command: ["sh", "-c", "exit 1"]
---
apiVersion: batch/v1
kind: Job
metadata:
  name: idx
spec:
  completions: 3
  parallelism: 3
  completionMode: Indexed
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: worker
        image: busybox:1.36
        command: ["sh", "-c", "echo $JOB_COMPLETION_INDEX"]
"#;

use super::common::{jsonpath, words};

/// The reasons of the events about `name`.
async fn event_reasons(k: &Kubectl, name: &str) -> Vec<String> {
    let out = jsonpath(
        k,
        &["events"],
        "{range .items[*]}{.involvedObject.name} {.reason}{\"\\n\"}{end}",
    )
    .await;
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(n, _)| *n == name)
        .map(|(_, r)| r.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_complete_fail_at_their_backoff_limit_and_run_each_index() {
    let (_c, k) = cluster_with_a_node().await;
    let applied = k.run_with_input(&["apply", "-f", "-"], JOBS).await.ok();
    for line in [
        "job.batch/pi created",
        "job.batch/doomed created",
        "job.batch/idx created",
    ] {
        assert!(applied.contains(line), "{applied}");
    }

    // Three completions, two pods at a time.
    let done = k
        .run(&[
            "wait",
            "--for=condition=complete",
            "job/pi",
            "--timeout=90s",
        ])
        .await;
    assert!(done.success, "{}{}", done.stdout, done.stderr);
    let t = words(&k.run(&["get", "job", "pi"]).await.ok());
    assert_eq!(t[0], ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]);
    assert_eq!(t[1][..3], ["pi", "Complete", "3/3"]);
    let status = jsonpath(
        &k,
        &["job", "pi"],
        "{.status.succeeded} {.status.failed} {.status.active} {.status.conditions[?(@.type==\"Complete\")].reason}",
    )
    .await;
    assert_eq!(status, "3 0 0 CompletionsReached");
    // The generated selector, and pods counted and freed of the tracking finalizer.
    let selector = jsonpath(&k, &["job", "pi"], "{.spec.selector.matchLabels}").await;
    assert!(
        selector.contains("batch.kubernetes.io/controller-uid"),
        "{selector}"
    );
    let pods = jsonpath(
        &k,
        &["pods", "-l", "batch.kubernetes.io/job-name=pi"],
        "{range .items[*]}{.status.phase} {.metadata.finalizers}{\"\\n\"}{end}",
    )
    .await;
    assert_eq!(
        pods.lines().collect::<Vec<_>>(),
        ["Succeeded "; 3],
        "{pods}"
    );
    let reasons = event_reasons(&k, "pi").await;
    for r in ["SuccessfulCreate", "Completed"] {
        assert!(reasons.iter().any(|x| x == r), "{reasons:?}");
    }

    // Two failures, one past the backoff limit of 1 (the second after a 10 s backoff).
    let failed = k
        .run(&[
            "wait",
            "--for=condition=failed",
            "job/doomed",
            "--timeout=120s",
        ])
        .await;
    assert!(failed.success, "{}{}", failed.stdout, failed.stderr);
    let status = jsonpath(
        &k,
        &["job", "doomed"],
        "{.status.failed} {.status.conditions[?(@.type==\"Failed\")].reason}",
    )
    .await;
    assert_eq!(status, "2 BackoffLimitExceeded");
    let t = words(&k.run(&["get", "job", "doomed"]).await.ok());
    assert_eq!(t[1][..3], ["doomed", "Failed", "0/1"]);
    assert!(event_reasons(&k, "doomed")
        .await
        .iter()
        .any(|r| r == "BackoffLimitExceeded"));

    // A FailJob rule of the pod failure policy ends the job at the first matching exit code;
    // activeDeadlineSeconds ends one whose pod runs too long.
    let ended = r#"{"apiVersion":"v1","kind":"List","items":[
      {"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"policy"},
       "spec":{"backoffLimit":6,"podFailurePolicy":{"rules":[
         {"action":"FailJob","onExitCodes":{"containerName":"main","operator":"In","values":[42]}}]},
       "template":{"metadata":{"annotations":{"sim.rkube.io/exit-code":"42"}},"spec":{
         "restartPolicy":"Never","containers":[{"name":"main","image":"busybox:1.36"}]}}}},
      {"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"slow"},
       "spec":{"activeDeadlineSeconds":2,
       "template":{"metadata":{"annotations":{"sim.rkube.io/run-seconds":"600"}},"spec":{
         "restartPolicy":"Never","terminationGracePeriodSeconds":1,
         "containers":[{"name":"main","image":"busybox:1.36"}]}}}}]}"#;
    k.run_with_input(&["apply", "-f", "-"], ended).await.ok();
    for (job, reason, failed) in [
        ("policy", "PodFailurePolicy", "1"),
        ("slow", "DeadlineExceeded", "1"),
    ] {
        let out = k
            .run(&[
                "wait",
                "--for=condition=failed",
                &format!("job/{job}"),
                "--timeout=60s",
            ])
            .await;
        assert!(out.success, "{job}: {}{}", out.stdout, out.stderr);
        let status = jsonpath(
            &k,
            &["job", job],
            "{.status.failed} {.status.active} {.status.conditions[?(@.type==\"Failed\")].reason}",
        )
        .await;
        assert_eq!(status, format!("{failed} 0 {reason}"), "{job}");
    }
    let message = jsonpath(
        &k,
        &["job", "policy"],
        "{.status.conditions[?(@.type==\"Failed\")].message}",
    )
    .await;
    assert!(
        message.starts_with("Container main for pod default/policy-")
            && message.ends_with("failed with exit code 42 matching FailJob rule at index 0"),
        "{message}"
    );

    // Suspended: no pods, the Suspended condition; resumed, it runs and completes; its
    // ttlSecondsAfterFinished then deletes it with its pods.
    let later = r#"{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"later"},
      "spec":{"suspend":true,"ttlSecondsAfterFinished":2,"template":{"spec":{
        "restartPolicy":"Never","containers":[{"name":"c","image":"busybox:1.36"}]}}}}"#;
    k.run_with_input(&["apply", "-f", "-"], later).await.ok();
    let suspended = k
        .run(&[
            "wait",
            "--for=condition=suspended",
            "job/later",
            "--timeout=30s",
        ])
        .await;
    assert!(
        suspended.success,
        "{}{}",
        suspended.stdout, suspended.stderr
    );
    let t = words(&k.run(&["get", "job", "later"]).await.ok());
    // Not started: no Duration (an empty cell), then the age.
    assert_eq!(t[1][..3], ["later", "Suspended", "0/1"]);
    assert_eq!(t[1].len(), 4, "{t:?}");
    assert_eq!(
        jsonpath(
            &k,
            &["pods", "-l", "batch.kubernetes.io/job-name=later"],
            "{.items}"
        )
        .await,
        "[]"
    );
    k.run(&[
        "patch",
        "job",
        "later",
        "-p",
        r#"{"spec":{"suspend":false}}"#,
    ])
    .await
    .ok();
    let done = k
        .run(&[
            "wait",
            "--for=condition=complete",
            "job/later",
            "--timeout=60s",
        ])
        .await;
    assert!(done.success, "{}{}", done.stdout, done.stderr);
    let gone = k
        .run(&["wait", "--for=delete", "job/later", "--timeout=60s"])
        .await;
    assert!(gone.success, "{}{}", gone.stdout, gone.stderr);
    let pods_gone = k
        .run(&[
            "wait",
            "--for=delete",
            "pods",
            "-l",
            "batch.kubernetes.io/job-name=later",
            "--timeout=60s",
        ])
        .await;
    assert!(
        pods_gone.success,
        "{}{}",
        pods_gone.stdout, pods_gone.stderr
    );
    let reasons = event_reasons(&k, "later").await;
    for r in ["Suspended", "Resumed", "Completed"] {
        assert!(reasons.iter().any(|x| x == r), "{r}: {reasons:?}");
    }

    // Each index once, with its index in a label, an annotation and the hostname.
    let done = k
        .run(&[
            "wait",
            "--for=condition=complete",
            "job/idx",
            "--timeout=90s",
        ])
        .await;
    assert!(done.success, "{}{}", done.stdout, done.stderr);
    assert_eq!(
        jsonpath(&k, &["job", "idx"], "{.status.completedIndexes}").await,
        "0-2"
    );
    let pods = jsonpath(
        &k,
        &["pods", "-l", "batch.kubernetes.io/job-name=idx"],
        "{range .items[*]}{.metadata.labels.batch\\.kubernetes\\.io/job-completion-index} {.spec.hostname} {.spec.containers[0].env[0].name}{\"\\n\"}{end}",
    )
    .await;
    let got: BTreeSet<&str> = pods.lines().collect();
    assert_eq!(
        got,
        BTreeSet::from([
            "0 idx-0 JOB_COMPLETION_INDEX",
            "1 idx-1 JOB_COMPLETION_INDEX",
            "2 idx-2 JOB_COMPLETION_INDEX"
        ]),
        "{pods}"
    );
}

const CRONJOB: &str = r#"
apiVersion: batch/v1
kind: CronJob
metadata:
  name: tick
spec:
  schedule: "* * * * *"
  timeZone: Etc/UTC
  successfulJobsHistoryLimit: 1
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          containers:
          - name: tick
            image: busybox:1.36
            command: ["date"]
"#;

/// The jobs the cronjob `tick` controls: (name, scheduled-timestamp annotation).
async fn ticks(k: &Kubectl) -> Vec<(String, String)> {
    let out = jsonpath(
        k,
        &["jobs"],
        "{range .items[*]}{.metadata.ownerReferences[0].name} {.metadata.name} {.metadata.annotations.batch\\.kubernetes\\.io/cronjob-scheduled-timestamp}{\"\\n\"}{end}",
    )
    .await;
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"tick") && f.len() == 3).then(|| (f[1].into(), f[2].into()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cronjob_starts_a_job_every_minute_and_keeps_its_history() {
    let (_c, k) = cluster_with_a_node().await;
    let applied = k.run_with_input(&["apply", "-f", "-"], CRONJOB).await.ok();
    assert!(applied.contains("cronjob.batch/tick created"), "{applied}");
    let out = k.run(&["get", "cronjob", "tick"]).await.ok();
    let t = words(&out);
    assert_eq!(
        t[0],
        ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "AGE"]
    );
    assert_eq!(
        t[1][..9],
        ["tick", "*", "*", "*", "*", "*", "Etc/UTC", "False", "0"],
        "{out}"
    );
    let defaults = jsonpath(
        &k,
        &["cronjob", "tick"],
        "{.spec.concurrencyPolicy} {.spec.failedJobsHistoryLimit} {.spec.suspend}",
    )
    .await;
    assert_eq!(defaults, "Allow 1 false");

    // kubectl's typed create commands (protobuf bodies).
    let made = k
        .run(&[
            "create",
            "cronjob",
            "made",
            "--image=busybox:1.36",
            "--schedule=*/5 * * * *",
            "--",
            "date",
        ])
        .await;
    assert!(made.success, "{}{}", made.stdout, made.stderr);
    let spec = jsonpath(
        &k,
        &["cronjob", "made"],
        "{.spec.schedule}|{.spec.jobTemplate.spec.template.spec.containers[0].image}|{.spec.jobTemplate.spec.template.spec.restartPolicy}|{.spec.successfulJobsHistoryLimit}",
    )
    .await;
    assert_eq!(spec, "*/5 * * * *|busybox:1.36|OnFailure|3");
    let made = k
        .run(&[
            "create",
            "job",
            "once",
            "--image=busybox:1.36",
            "--",
            "date",
        ])
        .await;
    assert!(made.success, "{}{}", made.stdout, made.stderr);
    let done = k
        .run(&[
            "wait",
            "--for=condition=complete",
            "job/once",
            "--timeout=60s",
        ])
        .await;
    assert!(done.success, "{}{}", done.stdout, done.stderr);

    // Two scheduled jobs have run, and the history keeps the last successful one only.
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(200);
    loop {
        let now = ticks(&k).await;
        seen.extend(now.iter().cloned());
        let last_success = jsonpath(&k, &["cronjob", "tick"], "{.status.lastSuccessfulTime}").await;
        if seen.len() >= 2 && now.len() == 1 && !last_success.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for two jobs of the cronjob and one kept: seen {seen:?}, now {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (name, stamp) in &seen {
        // tick-<minutes since the epoch>, scheduled at that minute.
        let minutes: i64 = name
            .strip_prefix("tick-")
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("{name}"));
        let at = chrono::DateTime::parse_from_rfc3339(stamp).expect(stamp);
        assert_eq!(at.timestamp(), minutes * 60, "{name} {stamp}");
    }
    let reasons = event_reasons(&k, "tick").await;
    for r in ["SuccessfulCreate", "SawCompletedJob", "SuccessfulDelete"] {
        assert!(reasons.iter().any(|x| x == r), "{r}: {reasons:?}");
    }
    let last = jsonpath(&k, &["cronjob", "tick"], "{.status.lastScheduleTime}").await;
    assert!(!last.is_empty());

    // A job by hand from a cronjob's template (`made`, whose history of three keeps it).
    let created = k
        .run(&["create", "job", "by-hand", "--from=cronjob/made"])
        .await;
    assert!(created.success, "{}{}", created.stdout, created.stderr);
    assert!(created.stdout.contains("job.batch/by-hand created"));
    let meta = jsonpath(
        &k,
        &["job", "by-hand"],
        "{.metadata.annotations.cronjob\\.kubernetes\\.io/instantiate} {.metadata.ownerReferences[0].kind} {.spec.backoffLimit}",
    )
    .await;
    assert_eq!(meta, "manual CronJob 6");
    let done = k
        .run(&[
            "wait",
            "--for=condition=complete",
            "job/by-hand",
            "--timeout=60s",
        ])
        .await;
    let events = k.run(&["get", "events"]).await.stdout;
    assert!(done.success, "{}{}\n{events}", done.stdout, done.stderr);
}

const CONTAINER_JOBS: &str = r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: ok
spec:
  completions: 2
  parallelism: 2
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      containers:
      - name: ok
        image: rkube.local/busybox:1
        command: ["sh", "-c", "exit 0"]
---
apiVersion: batch/v1
kind: Job
metadata:
  name: exits-1
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      containers:
      - name: fail
        image: rkube.local/busybox:1
        command: ["sh", "-c", "exit 1"]
---
apiVersion: batch/v1
kind: Job
metadata:
  name: restarts
spec:
  backoffLimit: 1
  template:
    spec:
      restartPolicy: OnFailure
      terminationGracePeriodSeconds: 1
      containers:
      - name: fail
        image: rkube.local/busybox:1
        command: ["sh", "-c", "exit 3"]
---
apiVersion: batch/v1
kind: Job
metadata:
  name: echo-index
spec:
  completions: 2
  parallelism: 2
  completionMode: Indexed
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      containers:
      - name: echo
        image: rkube.local/busybox:1
        command: ["sh", "-c", "echo index $JOB_COMPLETION_INDEX of $(hostname)"]
"#;

/// The same on a node running real containers (`rkube up --runtime cri`, busybox built here):
/// `exit 0` completes, `exit 1` fails the job at a backoff limit of 0, a container restarted
/// under OnFailure fails it at its limit, and an Indexed pod's container reads its index from
/// JOB_COMPLETION_INDEX.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_real_containers_to_completion() {
    let (_c, k) = super::common::cri_cluster(1).await;
    k.run_with_input(&["apply", "-f", "-"], CONTAINER_JOBS)
        .await
        .ok();

    for job in ["ok", "echo-index"] {
        let done = k
            .run(&[
                "wait",
                "--for=condition=complete",
                &format!("job/{job}"),
                "--timeout=120s",
            ])
            .await;
        assert!(done.success, "{job}: {}{}", done.stdout, done.stderr);
    }
    assert_eq!(
        jsonpath(&k, &["job", "ok"], "{.status.succeeded}").await,
        "2"
    );
    let failed = k
        .run(&[
            "wait",
            "--for=condition=failed",
            "job/exits-1",
            "--timeout=120s",
        ])
        .await;
    assert!(failed.success, "{}{}", failed.stdout, failed.stderr);
    let status = jsonpath(
        &k,
        &["job", "exits-1"],
        "{.status.failed} {.status.conditions[?(@.type==\"Failed\")].reason}",
    )
    .await;
    assert_eq!(status, "1 BackoffLimitExceeded");
    // Under OnFailure the container restarts in its pod; the restart reaches the limit.
    let failed = k
        .run(&[
            "wait",
            "--for=condition=failed",
            "job/restarts",
            "--timeout=120s",
        ])
        .await;
    assert!(failed.success, "{}{}", failed.stdout, failed.stderr);
    assert_eq!(
        jsonpath(
            &k,
            &["job", "restarts"],
            "{.status.conditions[?(@.type==\"Failed\")].reason}"
        )
        .await,
        "BackoffLimitExceeded"
    );
    let exit = jsonpath(
        &k,
        &["pods", "-l", "batch.kubernetes.io/job-name=exits-1"],
        "{.items[0].status.containerStatuses[0].state.terminated.exitCode}",
    )
    .await;
    assert_eq!(exit, "1");

    let pods = jsonpath(
        &k,
        &["pods", "-l", "batch.kubernetes.io/job-name=echo-index"],
        "{range .items[*]}{.metadata.name}{\"\\n\"}{end}",
    )
    .await;
    let mut said = BTreeSet::new();
    for pod in pods.lines() {
        said.insert(k.run(&["logs", pod]).await.ok().trim().to_string());
    }
    assert_eq!(
        said,
        BTreeSet::from([
            "index 0 of echo-index-0".to_string(),
            "index 1 of echo-index-1".to_string()
        ])
    );
}

/// `kubectl get <what> -o jsonpath=<path>` until it prints `want`.
async fn wait_jsonpath(k: &Kubectl, what: &[&str], path: &str, want: &str) {
    cluster_tests::wait_for(
        &format!("{what:?} {path} to be {want:?}"),
        Duration::from_secs(90),
        || async { (jsonpath(k, what, path).await == want).then_some(()) },
    )
    .await;
}

/// Writes the pod's phase as its node's agent would.
async fn set_phase(k: &Kubectl, pod: &str, phase: &str) {
    let patch = format!(r#"{{"status":{{"phase":"{phase}"}}}}"#);
    k.run(&[
        "patch",
        "pod",
        pod,
        "--subresource=status",
        "--type=merge",
        "-p",
        &patch,
    ])
    .await
    .ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_policy_ends_an_indexed_job_and_managed_by_leaves_a_job_alone() {
    let (_c, k) = cluster_with_a_node().await;
    // Three long-running indexes; the job succeeds once index 1 has (the second rule).
    let leader = r#"{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"leader"},
      "spec":{"completions":3,"parallelism":3,"completionMode":"Indexed",
        "successPolicy":{"rules":[{"succeededCount":3},{"succeededIndexes":"1"}]},
        "template":{"metadata":{"annotations":{"sim.rkube.io/run-seconds":"600"}},"spec":{
          "restartPolicy":"Never","terminationGracePeriodSeconds":1,
          "containers":[{"name":"c","image":"busybox:1.36"}]}}}}"#;
    // Another controller's job, beside one of this controller's.
    let others = r#"{"apiVersion":"v1","kind":"List","items":[
      {"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"elsewhere"},
       "spec":{"managedBy":"example.com/multikueue","template":{"spec":{
         "restartPolicy":"Never","containers":[{"name":"c","image":"busybox:1.36"}]}}}},
      {"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"here"},
       "spec":{"managedBy":"kubernetes.io/job-controller","template":{"spec":{
         "restartPolicy":"Never","containers":[{"name":"c","image":"busybox:1.36"}]}}}}]}"#;
    k.run_with_input(&["apply", "-f", "-"], leader).await.ok();
    k.run_with_input(&["apply", "-f", "-"], others).await.ok();

    wait_jsonpath(
        &k,
        &["pods", "-l", "batch.kubernetes.io/job-name=leader"],
        "{range .items[*]}{.status.phase} {end}",
        "Running Running Running ",
    )
    .await;
    let second = jsonpath(
        &k,
        &[
            "pods",
            "-l",
            "batch.kubernetes.io/job-name=leader,batch.kubernetes.io/job-completion-index=1",
        ],
        "{.items[0].metadata.name}",
    )
    .await;
    set_phase(&k, &second, "Succeeded").await;
    let done = k
        .run(&[
            "wait",
            "--for=condition=complete",
            "job/leader",
            "--timeout=55s",
        ])
        .await;
    assert!(done.success, "{}{}", done.stdout, done.stderr);
    let status = jsonpath(
        &k,
        &["job", "leader"],
        "{.status.succeeded} {.status.failed} {.status.active} {.status.terminating} {.status.completedIndexes}",
    )
    .await;
    assert_eq!(status, "1 0 0 0 1");
    for ty in ["SuccessCriteriaMet", "Complete"] {
        let c = jsonpath(
            &k,
            &["job", "leader"],
            &format!("{{.status.conditions[?(@.type==\"{ty}\")].reason}}: {{.status.conditions[?(@.type==\"{ty}\")].message}}"),
        )
        .await;
        assert_eq!(c, "SuccessPolicy: Matched rules at index 1", "{ty}");
    }
    // The other indexes' pods were terminated and are gone.
    let gone = k
        .run(&[
            "wait",
            "--for=delete",
            "pods",
            "-l",
            "batch.kubernetes.io/job-name=leader,batch.kubernetes.io/job-completion-index!=1",
            "--timeout=60s",
        ])
        .await;
    assert!(gone.success, "{}{}", gone.stdout, gone.stderr);

    // By the time this controller's job is done, the other one still has no pods nor status.
    let done = k
        .run(&[
            "wait",
            "--for=condition=complete",
            "job/here",
            "--timeout=55s",
        ])
        .await;
    assert!(done.success, "{}{}", done.stdout, done.stderr);
    assert_eq!(
        jsonpath(&k, &["job", "elsewhere"], "{.status}").await,
        "",
        "a job of another controller got a status"
    );
    assert_eq!(
        jsonpath(
            &k,
            &["pods", "-l", "batch.kubernetes.io/job-name=elsewhere"],
            "{.items}"
        )
        .await,
        "[]"
    );

    // managedBy and successPolicy are fixed once the job exists; a successPolicy needs an
    // Indexed job.
    let changed = k
        .run(&[
            "patch",
            "job",
            "elsewhere",
            "-p",
            r#"{"spec":{"managedBy":"kubernetes.io/job-controller"}}"#,
        ])
        .await;
    assert!(!changed.success);
    assert!(
        changed.stderr.contains(
            "The Job \"elsewhere\" is invalid: spec.managedBy: Invalid value: \"kubernetes.io/job-controller\": field is immutable"
        ),
        "{}",
        changed.stderr
    );
    let bad = r#"{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"bad"},
      "spec":{"successPolicy":{"rules":[{"succeededCount":1}]},
        "podReplacementPolicy":"Sometimes","template":{"spec":{
          "restartPolicy":"Never","containers":[{"name":"c","image":"busybox:1.36"}]}}}}"#;
    let refused = k.run_with_input(&["create", "-f", "-"], bad).await;
    assert!(!refused.success);
    for part in [
        "The Job \"bad\" is invalid:",
        "spec.successPolicy: Invalid value:",
        "requires indexed completion mode",
        "spec.podReplacementPolicy: Unsupported value: \"Sometimes\": supported values: \"Failed\", \"TerminatingOrFailed\"",
    ] {
        assert!(refused.stderr.contains(part), "{part}: {}", refused.stderr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_adopt_orphans_and_replace_only_failed_pods_when_asked() {
    let (_c, k) = cluster_with_a_node().await;
    // A pod that finished before any job selected it.
    let stray = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"stray",
        "labels":{"app":"stray"},"annotations":{"sim.rkube.io/exit-code":"0"}},
        "spec":{"restartPolicy":"Never",
        "containers":[{"name":"c","image":"busybox:1.36"}]}}"#;
    k.run_with_input(&["apply", "-f", "-"], stray).await.ok();
    wait_jsonpath(&k, &["pod", "stray"], "{.status.phase}", "Succeeded").await;
    let adopting = r#"{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"adopter"},
      "spec":{"manualSelector":true,"selector":{"matchLabels":{"app":"stray"}},
        "template":{"metadata":{"labels":{"app":"stray"}},"spec":{
          "restartPolicy":"Never","containers":[{"name":"c","image":"busybox:1.36"}]}}}}"#;
    k.run_with_input(&["apply", "-f", "-"], adopting).await.ok();
    let done = k
        .run(&[
            "wait",
            "--for=condition=complete",
            "job/adopter",
            "--timeout=55s",
        ])
        .await;
    assert!(done.success, "{}{}", done.stdout, done.stderr);
    // The job counted the adopted pod and made none of its own.
    assert_eq!(
        jsonpath(&k, &["job", "adopter"], "{.status.succeeded}").await,
        "1"
    );
    let owners = jsonpath(
        &k,
        &["pods", "-l", "app=stray"],
        "{range .items[*]}{.metadata.name} {.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {.metadata.ownerReferences[0].controller}{\"\\n\"}{end}",
    )
    .await;
    assert_eq!(owners, "stray Job/adopter true\n");

    // Two jobs whose pods cannot be scheduled, so a deleted pod stays terminating (held by the
    // tracking finalizer, no node to finish it): the default policy replaces it at once, and
    // podReplacementPolicy Failed only once it has failed.
    let jobs = r#"{"apiVersion":"v1","kind":"List","items":[
      {"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"patient"},
       "spec":{"podReplacementPolicy":"Failed","template":{"spec":{
         "restartPolicy":"Never","nodeSelector":{"no":"such-node"},
         "containers":[{"name":"c","image":"busybox:1.36"}]}}}},
      {"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"eager"},
       "spec":{"template":{"spec":{
         "restartPolicy":"Never","nodeSelector":{"no":"such-node"},
         "containers":[{"name":"c","image":"busybox:1.36"}]}}}}]}"#;
    k.run_with_input(&["apply", "-f", "-"], jobs).await.ok();
    assert_eq!(
        jsonpath(&k, &["job", "eager"], "{.spec.podReplacementPolicy}").await,
        "TerminatingOrFailed"
    );
    let mut first = Vec::new();
    for job in ["patient", "eager"] {
        wait_jsonpath(&k, &["job", job], "{.status.active}", "1").await;
        let selector = format!("batch.kubernetes.io/job-name={job}");
        let pod = jsonpath(&k, &["pods", "-l", &selector], "{.items[0].metadata.name}").await;
        k.run(&["delete", "pod", &pod, "--wait=false"]).await.ok();
        first.push(pod);
    }
    // The default: the terminating pod counts as failed and has a replacement.
    wait_jsonpath(
        &k,
        &["job", "eager"],
        "{.status.failed} {.status.active}",
        "1 1",
    )
    .await;
    // Failed: no node will finish the pod, so the pod garbage collector marks it Failed (and
    // deletes it); then it is counted and replaced.
    let patient = "{.status.failed} {.status.active} {.status.terminating}";
    wait_jsonpath(&k, &["job", "patient"], patient, "1 1 0").await;
    let left = jsonpath(
        &k,
        &["pods", "-l", "batch.kubernetes.io/job-name=patient"],
        "{range .items[*]}{.metadata.name} {end}",
    )
    .await;
    assert!(
        !left.is_empty() && !left.contains(&first[0]),
        "patient's pods: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_garbage_collector_keeps_terminated_pods_up_to_its_threshold_and_fails_orphans() {
    let args = vec!["--terminated-pod-gc-threshold".to_string(), "2".to_string()];
    let (_c, k) = super::common::cluster_of(1, args).await;
    // Four pods that end at once, oldest first (a name breaks a tie of creation times).
    for name in ["done-a", "done-b", "done-c", "done-d"] {
        let pod = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}",
            "labels":{{"app":"done"}},"annotations":{{"sim.rkube.io/exit-code":"0"}}}},
            "spec":{{"restartPolicy":"Never","containers":[{{"name":"c","image":"busybox:1.36"}}]}}}}"#
        );
        k.run_with_input(&["apply", "-f", "-"], &pod).await.ok();
    }
    // A pod still running is no terminated pod.
    let running = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"running"},
        "spec":{"containers":[{"name":"c","image":"busybox:1.36"}]}}"#;
    k.run_with_input(&["apply", "-f", "-"], running).await.ok();
    // Beyond the threshold of two, the two oldest go (a check every 20 seconds).
    wait_jsonpath(
        &k,
        &["pods", "-l", "app=done"],
        "{range .items[*]}{.metadata.name}={.status.phase} {end}",
        "done-c=Succeeded done-d=Succeeded ",
    )
    .await;
    assert_eq!(
        jsonpath(&k, &["pods", "running"], "{.metadata.name}").await,
        "running"
    );

    // A pod bound to a node that does not exist (held by a finalizer, to be looked at): once
    // the node has been missing at two checks, it is marked Failed with the DisruptionTarget
    // condition and deleted. Failed, it is one more terminated pod, so the oldest of the
    // others goes.
    let ghost = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"ghost",
        "finalizers":["example.com/hold"]},
        "spec":{"nodeName":"no-such-node","containers":[{"name":"c","image":"busybox:1.36"}]}}"#;
    k.run_with_input(&["apply", "-f", "-"], ghost).await.ok();
    wait_jsonpath(
        &k,
        &["pods", "ghost"],
        "{.status.phase} {.status.conditions[?(@.type==\"DisruptionTarget\")].reason}",
        "Failed DeletionByPodGC",
    )
    .await;
    let ghost = jsonpath(
        &k,
        &["pods", "ghost"],
        "{.status.conditions[?(@.type==\"DisruptionTarget\")].message} {.metadata.deletionGracePeriodSeconds}",
    )
    .await;
    assert_eq!(ghost, "PodGC: node no longer exists 0");
    wait_jsonpath(
        &k,
        &["pods", "-l", "app=done"],
        "{range .items[*]}{.metadata.name} {end}",
        "done-d ",
    )
    .await;
    k.run(&[
        "patch",
        "pod",
        "ghost",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ])
    .await
    .ok();
}
