//! PodDisruptionBudgets and evictions on simulated agents, through kubectl: a budget's status
//! follows its pods and its workload's scale, an eviction that would break it is refused
//! with Kubernetes' 429 and message, a pod under two budgets cannot be evicted, and
//! `kubectl drain` of a node with a Deployment's pods, a DaemonSet's pod and a budget
//! cordons, evicts as the budget allows while replacements become Ready on the other node,
//! leaves the daemon pod, and says the node is drained.

use std::time::Duration;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::{wait_for, Cluster, Options};

use super::common::NODE_AGENT;

const BOUND: Duration = Duration::from_secs(90);

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: web
        image: rkube.local/busybox:1
"#;

fn budget(name: &str, bound: &str) -> String {
    format!(
        r#"
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {name}
spec:
  {bound}
  selector:
    matchLabels:
      app: web
"#
    )
}

async fn cluster() -> (Cluster, Kubectl) {
    let c = Cluster::start(Options {
        kubernetes_api: true,
        agents: 2,
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    let k = Kubectl::from_env_file(&c.path().join("env"), &c.path().join("home")).expect("env");
    k.wait_nodes_ready(&["agent1", "agent2"]).await;
    (c, k)
}

/// The budget's status as "expected desired current allowed".
async fn numbers(k: &Kubectl, pdb: &str) -> String {
    k.run(&["get", "pdb", pdb, "-o",
            "jsonpath={.status.expectedPods} {.status.desiredHealthy} {.status.currentHealthy} {.status.disruptionsAllowed}"])
        .await
        .stdout
}

async fn wait_numbers(k: &Kubectl, pdb: &str, want: &str) {
    let mut last = String::new();
    let seen = tokio::time::timeout(BOUND, async {
        loop {
            last = numbers(k, pdb).await;
            if last == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        seen.is_ok(),
        "timed out waiting for pdb/{pdb} to count {want:?} (expected desired current allowed); last {last:?}"
    );
}

/// The web pods not being deleted and Ready, as (pod, node).
async fn ready_web_pods(k: &Kubectl) -> Vec<(String, String)> {
    let out = k
        .run(&["get", "pods", "-l", "app=web", "-o",
               "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.conditions[?(@.type==\"Ready\")].status} {.metadata.deletionTimestamp}{\"\\n\"}{end}"])
        .await
        .stdout;
    out.lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [pod, node, "True"] => Some((pod.to_string(), node.to_string())),
            _ => None,
        })
        .collect()
}

async fn evict(k: &Kubectl, pod: &str) -> cluster_tests::kubectl::KubectlOutput {
    let eviction = format!(
        r#"{{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {{"name": "{pod}", "namespace": "default"}}}}"#
    );
    let path = format!("/api/v1/namespaces/default/pods/{pod}/eviction");
    k.run_with_input(&["create", "--raw", &path, "-f", "-"], &eviction)
        .await
}

#[tokio::test]
async fn a_budget_follows_its_pods_and_refuses_evictions_that_would_break_it() {
    let (_c, k) = cluster().await;
    k.run_with_input(&["apply", "-f", "-"], WEB).await.ok();
    k.run_with_input(&["apply", "-f", "-"], &budget("web", "minAvailable: 2"))
        .await
        .ok();
    wait_numbers(&k, "web", "2 2 2 0").await;

    // kubectl's columns, and the condition the controller keeps.
    let table = k.run(&["get", "pdb", "web"]).await.ok();
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "NAME",
            "MIN",
            "AVAILABLE",
            "MAX",
            "UNAVAILABLE",
            "ALLOWED",
            "DISRUPTIONS",
            "AGE"
        ]
    );
    assert_eq!(lines[1][..4], ["web", "2", "N/A", "0"]);
    let condition = k
        .run(&["get", "pdb", "web", "-o",
               "jsonpath={.status.conditions[0].type} {.status.conditions[0].status} {.status.conditions[0].reason} {.status.observedGeneration}"])
        .await
        .ok();
    assert_eq!(condition, "DisruptionAllowed False InsufficientPods 1");
    let described = k.run(&["describe", "pdb", "web"]).await.ok();
    for line in [
        "Min available:  2",
        "Selector:       app=web",
        "Allowed disruptions:  0",
    ] {
        assert!(described.contains(line), "{described}");
    }

    // An eviction now would leave one pod of the two the budget needs.
    let pods = ready_web_pods(&k).await;
    let refused = evict(&k, &pods[0].0).await.err();
    assert!(
        refused.contains("Error from server (TooManyRequests)")
            && refused
                .contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{refused}"
    );
    assert_eq!(
        ready_web_pods(&k).await.len(),
        2,
        "the refused eviction deleted nothing"
    );

    // A third replica makes room for one disruption, which an eviction takes; the
    // Deployment replaces the evicted pod and the budget allows one disruption again.
    k.run(&["scale", "deployment", "web", "--replicas=3"])
        .await
        .ok();
    wait_numbers(&k, "web", "3 2 3 1").await;
    let pods = ready_web_pods(&k).await;
    let evicted = pods[0].0.clone();
    let out = evict(&k, &evicted).await.ok();
    assert!(out.contains("Success"), "{out}");
    wait_for("the evicted pod to go", BOUND, || async {
        let pods = ready_web_pods(&k).await;
        (!pods.iter().any(|(p, _)| *p == evicted)).then_some(())
    })
    .await;
    wait_numbers(&k, "web", "3 2 3 1").await;

    // maxUnavailable as a percentage is resolved against the Deployment's scale.
    k.run_with_input(&["apply", "-f", "-"], &budget("web", "maxUnavailable: 50%"))
        .await
        .ok();
    wait_numbers(&k, "web", "3 1 3 2").await;
    let table = k.run(&["get", "pdb", "web", "--no-headers"]).await.ok();
    assert_eq!(
        table.split_whitespace().take(4).collect::<Vec<_>>(),
        ["web", "N/A", "50%", "2"]
    );

    // A pod under two budgets: Kubernetes' eviction does not choose between them.
    k.run_with_input(&["apply", "-f", "-"], &budget("web-too", "minAvailable: 1"))
        .await
        .ok();
    let pods = ready_web_pods(&k).await;
    let refused = evict(&k, &pods[0].0).await.err();
    assert!(
        refused.contains(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
        ),
        "{refused}"
    );

    // Kubernetes' validation, in its words.
    let invalid = k
        .run_with_input(
            &["apply", "-f", "-"],
            &budget("both", "minAvailable: 1\n  maxUnavailable: 1"),
        )
        .await
        .err();
    assert!(
        invalid.contains("minAvailable and maxUnavailable cannot be both set"),
        "{invalid}"
    );

    // An evicted pod carries the condition kube-apiserver writes before it deletes it (a
    // finalizer keeps this one to be read).
    k.run_with_input(&["apply", "-f", "-"], HELD).await.ok();
    let out = evict(&k, "held").await.ok();
    assert!(out.contains("Success"), "{out}");
    let condition =
        |field: &str| format!("{{.status.conditions[?(@.type==\"DisruptionTarget\")].{field}}}");
    let jsonpath = format!(
        "jsonpath={{.metadata.finalizers[0]}} {} {} {}",
        condition("status"),
        condition("reason"),
        condition("message")
    );
    let marked = k.run(&["get", "pod", "held", "-o", &jsonpath]).await.ok();
    assert_eq!(
        marked,
        "example.com/hold True EvictionByEvictionAPI Eviction API: evicting"
    );
    k.run(&[
        "patch",
        "pod",
        "held",
        "--type=json",
        "-p",
        r#"[{"op": "remove", "path": "/metadata/finalizers"}]"#,
    ])
    .await
    .ok();
}

const HELD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: held
  finalizers: [example.com/hold]
spec:
  containers:
  - name: app
    image: rkube.local/busybox:1
"#;

#[tokio::test]
async fn drain_evicts_within_the_budget_and_leaves_daemon_pods() {
    let (_c, k) = cluster().await;
    // Both web pods on agent1: agent2 is cordoned while they are placed.
    k.run(&["cordon", "agent2"]).await.ok();
    k.run_with_input(&["apply", "-f", "-"], WEB).await.ok();
    k.run_with_input(&["apply", "-f", "-"], NODE_AGENT)
        .await
        .ok();
    k.run_with_input(&["apply", "-f", "-"], &budget("web", "minAvailable: 1"))
        .await
        .ok();
    wait_for("both web pods Ready on agent1", BOUND, || async {
        let pods = ready_web_pods(&k).await;
        (pods.len() == 2 && pods.iter().all(|(_, n)| n == "agent1")).then_some(())
    })
    .await;
    k.run(&["uncordon", "agent2"]).await.ok();
    wait_numbers(&k, "web", "2 1 2 1").await;
    wait_for("a daemon pod on each node", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "pods",
                "-l",
                "app=node-agent",
                "-o",
                "jsonpath={.items[*].spec.nodeName}",
            ])
            .await
            .stdout;
        let mut nodes: Vec<&str> = out.split_whitespace().collect();
        nodes.sort();
        (nodes == ["agent1", "agent2"]).then_some(())
    })
    .await;

    // A server-side dry run decides every eviction and changes nothing.
    let dry = k
        .run(&["drain", "agent1", "--ignore-daemonsets", "--dry-run=server"])
        .await
        .ok();
    assert!(
        dry.contains("node/agent1 drained (server dry run)"),
        "{dry}"
    );
    let unschedulable = k
        .run(&[
            "get",
            "node",
            "agent1",
            "-o",
            "jsonpath={.spec.unschedulable}",
        ])
        .await
        .ok();
    assert_eq!(unschedulable, "", "a dry run cordoned the node");
    assert_eq!(ready_web_pods(&k).await.len(), 2, "a dry run evicted a pod");
    wait_numbers(&k, "web", "2 1 2 1").await;

    // The budget allows one eviction at a time: the second waits (kubectl retries on 429)
    // until the first pod's replacement is Ready on agent2.
    let drained = k
        .run(&[
            "drain",
            "agent1",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=50s",
        ])
        .await;
    let all = format!("{}{}", drained.stdout, drained.stderr);
    assert!(drained.success, "{all}");
    assert!(all.contains("node/agent1 cordoned"), "{all}");
    assert!(all.contains("ignoring DaemonSet-managed Pods"), "{all}");
    assert!(all.contains("node/agent1 drained"), "{all}");
    // The second eviction had to wait for the first pod's replacement.
    assert!(
        all.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{all}"
    );
    let unschedulable = k
        .run(&[
            "get",
            "node",
            "agent1",
            "-o",
            "jsonpath={.spec.unschedulable}",
        ])
        .await
        .ok();
    assert_eq!(unschedulable, "true");

    // The Deployment's pods run on agent2 now; the daemon pod stayed on agent1.
    wait_for("both web pods Ready on agent2", BOUND, || async {
        let pods = ready_web_pods(&k).await;
        (pods.len() == 2 && pods.iter().all(|(_, n)| n == "agent2")).then_some(())
    })
    .await;
    let daemon = k
        .run(&[
            "get",
            "pods",
            "-l",
            "app=node-agent",
            "--field-selector",
            "spec.nodeName=agent1",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .await
        .ok();
    assert!(!daemon.is_empty(), "the daemon pod left agent1");
    wait_numbers(&k, "web", "2 1 2 1").await;

    k.run(&["uncordon", "agent1"]).await.ok();
    let unschedulable = k
        .run(&[
            "get",
            "node",
            "agent1",
            "-o",
            "jsonpath={.spec.unschedulable}",
        ])
        .await
        .ok();
    assert_eq!(unschedulable, "");
}

/// [`WEB`] for real containers: busybox's httpd, Ready when it answers.
const WEB_HTTPD: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: rkube.local/busybox:1
        command: ["sh", "-c", "echo hello from $(hostname) > /www/index.html; exec httpd -f -p 8080 -h /www"]
        readinessProbe:
          httpGet:
            path: /
            port: 8080
          periodSeconds: 1
"#;

/// The same drain on a node of real containers (`rkube up --runtime cri`, two agents): the
/// evicted pods' containers are stopped and the pods gone, their replacements serve on the
/// other node, the budget is kept throughout, and the daemon pod keeps running on the drained
/// node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_of_a_node_running_real_containers() {
    let (_c, k) = super::common::cri_cluster(2).await;
    k.run(&["cordon", "agent2"]).await.ok();
    k.run_with_input(&["apply", "-f", "-"], WEB_HTTPD)
        .await
        .ok();
    k.run_with_input(&["apply", "-f", "-"], &super::common::node_agent_process())
        .await
        .ok();
    k.run_with_input(&["apply", "-f", "-"], &budget("web", "minAvailable: 1"))
        .await
        .ok();
    let before = wait_for("both web pods Ready on agent1", BOUND, || async {
        let pods = ready_web_pods(&k).await;
        (pods.len() == 2 && pods.iter().all(|(_, n)| n == "agent1")).then_some(pods)
    })
    .await;
    k.run(&["uncordon", "agent2"]).await.ok();
    wait_numbers(&k, "web", "2 1 2 1").await;
    let daemon_on_agent1 = || async {
        k.run(&[
            "get",
            "pods",
            "-l",
            "app=node-agent",
            "--field-selector",
            "spec.nodeName=agent1,status.phase=Running",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .await
        .ok()
    };
    let daemon = wait_for("the daemon pod Running on agent1", BOUND, || async {
        let name = daemon_on_agent1().await;
        (!name.is_empty()).then_some(name)
    })
    .await;

    let drained = k
        .run(&["drain", "agent1", "--ignore-daemonsets", "--timeout=80s"])
        .await;
    let all = format!("{}{}", drained.stdout, drained.stderr);
    assert!(drained.success, "{all}");
    assert!(all.contains("node/agent1 cordoned"), "{all}");
    assert!(
        all.contains(&format!(
            "Warning: ignoring DaemonSet-managed Pods: default/{daemon}"
        )),
        "{all}"
    );
    for (pod, _) in &before {
        assert!(all.contains(&format!("pod/{pod} evicted")), "{all}");
    }
    assert!(all.contains("node/agent1 drained"), "{all}");

    // drain returned once the evicted pods were gone: their containers stopped on agent1.
    let names = k
        .run(&["get", "pods", "-l", "app=web", "-o", "name"])
        .await
        .ok();
    for (pod, _) in &before {
        assert!(
            !names.contains(pod.as_str()),
            "{pod} is still there: {names}"
        );
    }
    let after = wait_for("both web pods Ready on agent2", BOUND, || async {
        let pods = ready_web_pods(&k).await;
        (pods.len() == 2 && pods.iter().all(|(_, n)| n == "agent2")).then_some(pods)
    })
    .await;
    for (pod, _) in &after {
        let ip = k
            .run(&["get", "pod", pod, "-o", "jsonpath={.status.podIP}"])
            .await
            .ok();
        let body = wait_for(&format!("{pod} answering"), BOUND, || async {
            cluster_tests::http_get(&format!("{ip}:8080")).await
        })
        .await;
        assert!(body.contains(&format!("hello from {pod}")), "{body}");
    }
    assert_eq!(
        daemon_on_agent1().await,
        daemon,
        "the daemon pod left agent1"
    );
    wait_numbers(&k, "web", "2 1 2 1").await;
}
