//! Resource metrics and autoscaling as a user sees them with kubectl, on a simulated node whose
//! pods use the CPU and memory their `sim.rkube.io/cpu` and `sim.rkube.io/memory` annotations
//! say: `kubectl top nodes|pods` (and `--containers`) print the scraped usage, metrics.k8s.io
//! answers Kubernetes' NotFound and is listed by `kubectl api-resources`; `kubectl autoscale`
//! makes an autoscaling/v2 HorizontalPodAutoscaler whose TARGETS show `cpu: 20%/50%`; when the
//! pods' usage rises it scales the Deployment up to its maximum (SuccessfulRescale events in
//! Kubernetes' words, ScalingLimited TooManyReplicas), and when it falls back down after its
//! short stabilization window. An autoscaler made by `kubectl autoscale statefulset` scales a
//! StatefulSet through its autoscaling/v1 Scale. Then, with real containers (`rkube up
//! --runtime cri`), a busy-looping container's CPU shows in `kubectl top pods` and an
//! autoscaler scales up on it.

use std::time::Duration;

use serde_json::json;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::{wait_for, Cluster, Options};

use crate::common::jsonpath;

/// A cluster whose servers scrape every second and whose autoscalers sync every second.
async fn cluster(agents: usize, extra: &[&str]) -> (Cluster, Kubectl) {
    let mut up_args: Vec<String> = [
        "--metric-resolution",
        "1s",
        "--horizontal-pod-autoscaler-sync-period",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    up_args.extend(extra.iter().map(|s| s.to_string()));
    let c = Cluster::start(Options {
        kubernetes_api: true,
        agents,
        up_args,
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    let k = Kubectl::from_env_file(&c.path().join("env"), &c.path().join("home")).expect("env");
    let names = c.agent_names();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    k.wait_nodes_ready(&names).await;
    (c, k)
}

fn words(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// The rows of `kubectl ARGS` once it succeeds with at least one row besides the header.
async fn rows_when_listed(k: &Kubectl, args: &[&str], what: &str) -> Vec<Vec<String>> {
    wait_for(what, Duration::from_secs(60), || async {
        let out = k.run(args).await;
        let t = words(&out.stdout);
        (out.success && t.len() > 1).then_some(t)
    })
    .await
}

/// Millicores of a `kubectl top` CPU cell (`20m`, `1`).
fn millicores(cell: &str) -> i64 {
    match cell.strip_suffix('m') {
        Some(m) => m.parse().unwrap_or(-1),
        None => cell.parse::<i64>().map(|c| c * 1000).unwrap_or(-1),
    }
}

/// The messages of the events of `reason` about `name`.
async fn event_messages(k: &Kubectl, name: &str, reason: &str) -> Vec<String> {
    let out = jsonpath(
        k,
        &["events"],
        "{range .items[*]}{.involvedObject.name}|{.reason}|{.message}{\"\\n\"}{end}",
    )
    .await;
    out.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, '|');
            let (n, r, m) = (parts.next()?, parts.next()?, parts.next()?);
            (n == name && r == reason).then(|| m.to_string())
        })
        .collect()
}

fn web(cpu: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
      annotations:
        sim.rkube.io/cpu: "{cpu}"
        sim.rkube.io/memory: 32Mi
    spec:
      containers:
      - name: web
        image: nginx:1.27
        resources:
          requests:
            cpu: 100m
      - name: sidecar
        image: busybox:1.36
        resources:
          requests:
            cpu: 100m
"#
    )
}

/// Rolls deployment web out with pods that each use `cpu` per container.
async fn set_cpu(k: &Kubectl, cpu: &str) {
    let patch = json!({"spec": {"template": {"metadata": {"annotations":
        {"sim.rkube.io/cpu": cpu}}}}})
    .to_string();
    let rolled = k
        .run(&["patch", "deployment", "web", "-p", &patch])
        .await
        .ok();
    assert!(rolled.contains("patched"), "{rolled}");
}

/// `(replicas, TARGETS)` of `kubectl get hpa web`.
async fn hpa_row(k: &Kubectl) -> (String, String) {
    let t = words(&k.run(&["get", "hpa", "web"]).await.ok());
    assert_eq!(
        t[0],
        [
            "NAME",
            "REFERENCE",
            "TARGETS",
            "MINPODS",
            "MAXPODS",
            "REPLICAS",
            "AGE"
        ]
    );
    // TARGETS is two words: "cpu:" and "20%/50%".
    (t[1][6].clone(), format!("{} {}", t[1][2], t[1][3]))
}

async fn wait_replicas(k: &Kubectl, want: &str, timeout: Duration) {
    wait_for(
        &format!("deployment web at {want} replicas, all available"),
        timeout,
        || async {
            let got = jsonpath(
                k,
                &["deployment", "web"],
                "{.spec.replicas} {.status.availableReplicas} {.status.updatedReplicas}",
            )
            .await;
            (got == format!("{want} {want} {want}")).then_some(())
        },
    )
    .await;
}

/// "<status> <reason>" of HPA `hpa`'s condition `ty`.
async fn condition(k: &Kubectl, hpa: &str, ty: &str) -> String {
    let pick = |field: &str| format!("{{.status.conditions[?(@.type==\"{ty}\")].{field}}}");
    let path = format!("{} {}", pick("status"), pick("reason"));
    jsonpath(k, &["hpa", hpa], &path).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_modelled_usage_and_an_autoscaler_scales_a_deployment_up_and_down() {
    let (_c, k) = cluster(1, &[]).await;
    let applied = k
        .run_with_input(&["apply", "-f", "-"], &web("10m"))
        .await
        .ok();
    assert!(applied.contains("deployment.apps/web created"), "{applied}");
    wait_replicas(&k, "1", Duration::from_secs(60)).await;

    // metrics.k8s.io is discovered as metrics-server's is.
    let resources = words(
        &k.run(&["api-resources", "--api-group=metrics.k8s.io"])
            .await
            .ok(),
    );
    assert_eq!(
        resources[1],
        ["nodes", "metrics.k8s.io/v1beta1", "false", "NodeMetrics"]
    );
    assert_eq!(
        resources[2],
        ["pods", "metrics.k8s.io/v1beta1", "true", "PodMetrics"]
    );

    // kubectl top: the node, the pod (two containers of 10m and 32Mi each), its containers.
    let nodes = rows_when_listed(&k, &["top", "nodes"], "kubectl top nodes").await;
    assert_eq!(
        nodes[0],
        ["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)"]
    );
    assert_eq!(nodes[1][0], "agent1");
    let pods = rows_when_listed(&k, &["top", "pods"], "kubectl top pods").await;
    assert_eq!(pods[0], ["NAME", "CPU(cores)", "MEMORY(bytes)"]);
    assert!(pods[1][0].starts_with("web-"), "{pods:?}");
    let cpu = millicores(&pods[1][1]);
    assert!((19..=21).contains(&cpu), "two containers at 10m: {pods:?}");
    assert_eq!(pods[1][2], "64Mi");
    let containers =
        rows_when_listed(&k, &["top", "pods", "--containers"], "top --containers").await;
    assert_eq!(
        containers[0],
        ["POD", "NAME", "CPU(cores)", "MEMORY(bytes)"]
    );
    let mut names: Vec<&str> = containers[1..].iter().map(|r| r[1].as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["sidecar", "web"]);
    assert!(
        containers[1..].iter().all(|r| r[3] == "32Mi"),
        "{containers:?}"
    );
    let missing = k.run(&["top", "pod", "nope"]).await.err();
    assert!(
        missing.contains("podmetrics.metrics.k8s.io \"default/nope\" not found"),
        "{missing}"
    );
    let missing = k.run(&["top", "node", "nope"]).await.err();
    assert!(
        missing.contains("nodemetrics.metrics.k8s.io \"nope\" not found"),
        "{missing}"
    );
    // Label selectors select.
    let none = k.run(&["top", "pods", "-l", "app=other"]).await;
    assert!(!none.stdout.contains("web-"), "{}", none.stdout);
    // Reading metrics is part of view, as with metrics-server's aggregated role.
    let view = jsonpath(&k, &["clusterrole", "view"], "{.rules[*].apiGroups}").await;
    assert!(view.contains("metrics.k8s.io"), "{view}");

    // kubectl autoscale makes an autoscaling/v2 HPA with Kubernetes' defaults.
    let made = k
        .run(&[
            "autoscale",
            "deployment",
            "web",
            "--cpu-percent=50",
            "--min=1",
            "--max=5",
        ])
        .await
        .ok();
    assert!(
        made.contains("horizontalpodautoscaler.autoscaling/web autoscaled"),
        "{made}"
    );
    let patched = k
        .run(&[
            "patch",
            "hpa",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"behavior":{"scaleDown":{"stabilizationWindowSeconds":5}}}}"#,
        ])
        .await
        .ok();
    assert!(patched.contains("patched"), "{patched}");
    let defaults = jsonpath(
        &k,
        &["hpa", "web"],
        "{.spec.behavior.scaleUp.selectPolicy} {.spec.behavior.scaleUp.policies[*].type} {.spec.behavior.scaleDown.policies[0].value}",
    )
    .await;
    assert_eq!(defaults, "Max Pods Percent 100");

    // 20m of 200m requested: 10% of the 50% target, one replica.
    wait_for("the HPA at 10%", Duration::from_secs(60), || async {
        let (replicas, targets) = hpa_row(&k).await;
        (replicas == "1" && targets == "cpu: 10%/50%").then_some(())
    })
    .await;
    let active = condition(&k, "web", "ScalingActive").await;
    assert_eq!(active, "True ValidMetricFound");

    // Pods that request no CPU have no utilization: the autoscaler says why, and waits.
    let idle = k
        .run(&["create", "deployment", "idle", "--image=nginx:1.27"])
        .await
        .ok();
    assert!(idle.contains("created"), "{idle}");
    k.run(&[
        "autoscale",
        "deployment",
        "idle",
        "--cpu-percent=50",
        "--max=2",
    ])
    .await
    .ok();
    let message = wait_for(
        "idle's autoscaler inactive",
        Duration::from_secs(60),
        || async {
            let message = jsonpath(
                &k,
                &["hpa", "idle"],
                "{.status.conditions[?(@.type==\"ScalingActive\")].message}",
            )
            .await;
            (condition(&k, "idle", "ScalingActive").await == "False FailedGetResourceMetric"
                && message.contains("missing request"))
            .then_some(message)
        },
    )
    .await;
    assert!(
        message.starts_with("the HPA was unable to compute the replica count: failed to get cpu utilization: missing request for cpu in container nginx of Pod idle-"),
        "{message}"
    );

    let t = words(&k.run(&["get", "hpa", "idle"]).await.ok());
    assert_eq!(t[1][2..4], ["cpu:", "<unknown>/50%"], "{t:?}");

    // A Pods metric needs a custom metrics API, which nothing here registers: the autoscaler
    // says so in kube-controller-manager's words.
    let custom = r#"{"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "custom"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "idle"},
                 "minReplicas": 1, "maxReplicas": 2,
                 "metrics": [{"type": "Pods", "pods": {"metric": {"name": "packets-per-second"},
                              "target": {"type": "AverageValue", "averageValue": "1k"}}}]}}"#;
    k.run_with_input(&["apply", "-f", "-"], custom).await.ok();
    let unregistered = "unable to get metric packets-per-second: unable to fetch metrics from custom metrics API: no custom metrics API (custom.metrics.k8s.io) registered";
    let message = wait_for(
        "the custom-metric autoscaler inactive",
        Duration::from_secs(60),
        || async {
            let message = jsonpath(
                &k,
                &["hpa", "custom"],
                "{.status.conditions[?(@.type==\"ScalingActive\")].message}",
            )
            .await;
            (condition(&k, "custom", "ScalingActive").await == "False FailedGetPodsMetric")
                .then_some(message)
        },
    )
    .await;
    assert_eq!(
        message,
        format!("the HPA was unable to compute the replica count: {unregistered}")
    );
    let events = wait_for(
        "the custom-metric autoscaler's events",
        Duration::from_secs(30),
        || async {
            let failed = event_messages(&k, "custom", "FailedGetPodsMetric").await;
            let computed = event_messages(&k, "custom", "FailedComputeMetricsReplicas").await;
            (!failed.is_empty() && !computed.is_empty()).then_some((failed, computed))
        },
    )
    .await;
    assert_eq!(events.0[0], unregistered);
    assert_eq!(
        events.1[0],
        format!("invalid metrics (1 invalid out of 1), first error is: failed to get pods metric value: {unregistered}")
    );
    // Kubernetes' validation.
    let refused = k
        .run_with_input(
            &["apply", "-f", "-"],
            r#"{"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "bad"},
                "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                            "name": "web"},
                         "minReplicas": 0, "maxReplicas": 1}}"#,
        )
        .await
        .err();
    assert!(
        refused.contains("spec.minReplicas: Invalid value: 0: must be greater than or equal to 1"),
        "{refused}"
    );

    // The pods' usage rises to 150% of their requests: up to the maximum of five.
    set_cpu(&k, "150m").await;
    wait_replicas(&k, "5", Duration::from_secs(120)).await;
    let ups = event_messages(&k, "web", "SuccessfulRescale").await;
    assert!(
        ups.iter().any(|m| m.starts_with("New size: ")
            && m.ends_with(
                "; reason: cpu resource utilization (percentage of request) above target"
            )),
        "{ups:?}"
    );
    wait_for(
        "the HPA limited at five",
        Duration::from_secs(30),
        || async {
            let (replicas, targets) = hpa_row(&k).await;
            let limited = condition(&k, "web", "ScalingLimited").await;
            (replicas == "5" && targets == "cpu: 150%/50%" && limited == "True TooManyReplicas")
                .then_some(())
        },
    )
    .await;

    // It falls back to 10m: after the five-second stabilization window, down to one.
    set_cpu(&k, "10m").await;
    wait_replicas(&k, "1", Duration::from_secs(120)).await;
    let downs = event_messages(&k, "web", "SuccessfulRescale").await;
    assert!(
        downs
            .iter()
            .any(|m| m.starts_with("New size: ")
                && m.ends_with("; reason: All metrics below target")),
        "{downs:?}"
    );
    let last = jsonpath(&k, &["hpa", "web"], "{.status.lastScaleTime}").await;
    assert!(!last.is_empty());
}

/// A container that keeps one CPU as busy as its 100m limit lets it, requesting 50m.
const BURN: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: burn
spec:
  replicas: 1
  selector:
    matchLabels:
      app: burn
  template:
    metadata:
      labels:
        app: burn
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: loop
        image: rkube.local/busybox:1
        imagePullPolicy: Never
        command: ["sh", "-c", "while :; do :; done"]
        resources:
          requests:
            cpu: 50m
          limits:
            cpu: 100m
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoscaler_scales_a_statefulset_through_its_scale_subresource() {
    let (_c, k) = cluster(1, &[]).await;
    // One pod using 150m of the 100m it requests: 150% of a 50% target.
    let db = r#"{"apiVersion":"apps/v1","kind":"StatefulSet","metadata":{"name":"db"},
      "spec":{"replicas":1,"serviceName":"db","selector":{"matchLabels":{"app":"db"}},
        "template":{"metadata":{"labels":{"app":"db"},
            "annotations":{"sim.rkube.io/cpu":"150m","sim.rkube.io/memory":"32Mi"}},
          "spec":{"containers":[{"name":"db","image":"nginx:1.27",
            "resources":{"requests":{"cpu":"100m"}}}]}}}}"#;
    k.run_with_input(&["apply", "-f", "-"], db).await.ok();
    // The scale subresource an autoscaler reads.
    let scale: serde_json::Value = serde_json::from_str(
        &k.run(&[
            "get",
            "--raw",
            "/apis/apps/v1/namespaces/default/statefulsets/db/scale",
        ])
        .await
        .ok(),
    )
    .expect("a Scale");
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!(scale["spec"]["replicas"], 1);
    assert_eq!(scale["status"]["selector"], "app=db");

    let made = k
        .run(&[
            "autoscale",
            "statefulset",
            "db",
            "--cpu-percent=50",
            "--min=1",
            "--max=3",
        ])
        .await
        .ok();
    assert!(
        made.contains("horizontalpodautoscaler.autoscaling/db autoscaled"),
        "{made}"
    );
    let reference = jsonpath(
        &k,
        &["hpa", "db"],
        "{.spec.scaleTargetRef.apiVersion} {.spec.scaleTargetRef.kind} {.spec.scaleTargetRef.name}",
    )
    .await;
    assert_eq!(reference, "apps/v1 StatefulSet db");
    // Scaled up to its maximum; the StatefulSet runs the three ordinals.
    wait_for(
        "statefulset db at 3 ready replicas",
        Duration::from_secs(120),
        || async {
            let got = jsonpath(
                &k,
                &["statefulset", "db"],
                "{.spec.replicas} {.status.readyReplicas}",
            )
            .await;
            (got == "3 3").then_some(())
        },
    )
    .await;
    let pods = jsonpath(
        &k,
        &["pods", "-l", "app=db"],
        "{range .items[*]}{.metadata.name} {end}",
    )
    .await;
    assert_eq!(pods, "db-0 db-1 db-2 ");
    let rescaled = event_messages(&k, "db", "SuccessfulRescale").await;
    assert!(
        rescaled.iter().any(|m| m.starts_with("New size: ")
            && m.ends_with(
                "reason: cpu resource utilization (percentage of request) above target"
            )),
        "{rescaled:?}"
    );
    wait_for(
        "db's autoscaler limited",
        Duration::from_secs(60),
        || async {
            (condition(&k, "db", "ScalingLimited").await == "True TooManyReplicas").then_some(())
        },
    )
    .await;

    // A ContainerResource metric counts the named container only; a container the pods do not
    // have fails as kube-controller-manager reports it.
    k.run(&["delete", "hpa", "db"]).await.ok();
    let by_container = |container: &str| {
        json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
               "metadata": {"name": "db"},
               "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                           "name": "db"},
                        "minReplicas": 1, "maxReplicas": 3,
                        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
                        "metrics": [{"type": "ContainerResource",
                                     "containerResource": {"name": "cpu", "container": container,
                                       "target": {"type": "Utilization",
                                                  "averageUtilization": 300}}}]}})
        .to_string()
    };
    k.run_with_input(&["apply", "-f", "-"], &by_container("nope"))
        .await
        .ok();
    wait_for(
        "the autoscaler failing on a container the pods lack",
        Duration::from_secs(60),
        || async {
            (condition(&k, "db", "ScalingActive").await == "False FailedGetContainerResourceMetric")
                .then_some(())
        },
    )
    .await;
    let message = jsonpath(
        &k,
        &["hpa", "db"],
        "{.status.conditions[?(@.type==\"ScalingActive\")].message}",
    )
    .await;
    assert!(
        message.contains("failed to get container metrics: container nope not present in metrics for pod default/db-"),
        "{message}"
    );
    // 150m of the container's 100m request is half of a 300% target: down to one replica.
    k.run_with_input(&["apply", "-f", "-"], &by_container("db"))
        .await
        .ok();
    wait_for(
        "statefulset db scaled down to 1 on its container's usage",
        Duration::from_secs(120),
        || async {
            let got = jsonpath(&k, &["statefulset", "db"], "{.spec.replicas}").await;
            (got == "1").then_some(())
        },
    )
    .await;
    let current = jsonpath(
        &k,
        &["hpa", "db"],
        "{.status.currentMetrics[0].type} {.status.currentMetrics[0].containerResource.container} {.status.currentMetrics[0].containerResource.current.averageUtilization}",
    )
    .await;
    // The modelled usage is 150m of a 100m request, give or take its sampling.
    let utilization = current
        .strip_prefix("ContainerResource db ")
        .and_then(|u| u.parse::<i64>().ok());
    assert!(
        utilization.is_some_and(|u| (140..=160).contains(&u)),
        "{current}"
    );
    let rescaled = event_messages(&k, "db", "SuccessfulRescale").await;
    assert!(
        rescaled
            .iter()
            .any(|m| m.ends_with("reason: All metrics below target")),
        "{rescaled:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_container_shows_in_top_and_is_scaled_on() {
    let images = tempfile::tempdir().unwrap();
    cluster_tests::build_images(images.path());
    let (c, k) = cluster(1, &["--runtime", "cri"]).await;
    crate::common::load_image(&c, &images.path().join("busybox.tar"));
    k.run_with_input(&["apply", "-f", "-"], BURN).await.ok();

    // The runtime's stats: the loop uses about its 100m limit, well above its 50m request.
    let busy = wait_for(
        "the loop's CPU in kubectl top",
        Duration::from_secs(120),
        || async {
            let out = k.run(&["top", "pods", "--containers"]).await;
            words(&out.stdout)
                .into_iter()
                .find(|r| r.len() == 4 && r[0].starts_with("burn-") && r[1] == "loop")
                .filter(|r| millicores(&r[2]) >= 60)
        },
    )
    .await;
    assert!(millicores(&busy[2]) <= 150, "{busy:?}");
    let nodes = rows_when_listed(&k, &["top", "nodes"], "kubectl top nodes").await;
    assert_eq!(nodes[1][0], "agent1");

    // At about 200% of its request against a 50% target, the autoscaler goes to its maximum.
    let made = k
        .run(&[
            "autoscale",
            "deployment",
            "burn",
            "--cpu-percent=50",
            "--min=1",
            "--max=2",
        ])
        .await
        .ok();
    assert!(made.contains("autoscaled"), "{made}");
    wait_for("burn scaled to two", Duration::from_secs(120), || async {
        let got = jsonpath(&k, &["deployment", "burn"], "{.spec.replicas}").await;
        (got == "2").then_some(())
    })
    .await;
    let ups = event_messages(&k, "burn", "SuccessfulRescale").await;
    assert!(
        ups.iter().any(|m| {
            m
            == "New size: 2; reason: cpu resource utilization (percentage of request) above target"
        }),
        "{ups:?}"
    );
}
