//! The scheduler on the Raft leader, with Node objects the test registers (the node agent comes
//! later): pods of the article's Deployment are bound to nodes that fit; a pod asking for more
//! CPU than any node has stays Pending with Kubernetes' FailedScheduling message, and is placed
//! once a big enough node joins; nodeSelector, required node affinity and taints place pods
//! where Kubernetes would.

use std::time::Duration;

use serde_json::json;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::{wait_for, Cluster, Options};

const BOUND: Duration = Duration::from_secs(60);

/// Registers a Ready node with `cpu` cores and the given labels.
async fn add_node(k: &Kubectl, name: &str, cpu: &str, labels: &[(&str, &str)]) {
    let mut l = serde_json::Map::new();
    l.insert("kubernetes.io/hostname".into(), json!(name));
    for (key, v) in labels {
        l.insert(key.to_string(), json!(v));
    }
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": l}});
    k.run_with_input(&["apply", "-f", "-"], &node.to_string())
        .await
        .ok();
    k.report_node_ready(name, Some(cpu)).await;
}

async fn node_of(k: &Kubectl, pod: &str) -> String {
    k.run(&["get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"])
        .await
        .stdout
}

async fn wait_bound(k: &Kubectl, pod: &str) -> String {
    wait_for(&format!("{pod} bound"), BOUND, || async {
        let n = node_of(k, pod).await;
        (!n.is_empty()).then_some(n)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_placed_where_kubernetes_would_place_them() {
    let c = Cluster::start(Options {
        kubernetes_api: true,
        // The test's nodes send one heartbeat: keep them Ready for the whole test.
        up_args: ["--node-monitor-grace-period", "10m"]
            .map(String::from)
            .to_vec(),
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    let k = Kubectl::from_env_file(&c.path().join("env"), &c.path().join("home")).expect("env");
    wait_for("the default namespace", BOUND, || async {
        k.run(&["get", "ns", "default"]).await.success.then_some(())
    })
    .await;
    add_node(&k, "node-1", "2", &[("disk", "ssd")]).await;
    add_node(&k, "node-2", "2", &[("disk", "hdd")]).await;
    add_node(&k, "node-3", "2", &[("disk", "hdd")]).await;
    k.run(&["taint", "node", "node-3", "dedicated=gpu:NoSchedule"])
        .await
        .ok();

    // The article's Deployment: three pods, each bound to an untainted node.
    let manifest =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("manifests/deployment.yaml");
    k.run(&["apply", "-f", &manifest.display().to_string()])
        .await
        .ok();
    let placed = wait_for("three pods bound", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "pods",
                "-l",
                "app=myapp",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}={.spec.nodeName}{\"\\n\"}{end}",
            ])
            .await
            .stdout;
        let rows: Vec<String> = out.lines().map(str::to_string).collect();
        (rows.len() == 3 && rows.iter().all(|r| !r.ends_with('='))).then_some(rows)
    })
    .await;
    for row in &placed {
        assert!(!row.ends_with("=node-3"), "a tainted node took {row}");
    }
    let pod = placed[0].split('=').next().unwrap_or("").to_string();
    let events = k
        .run(&[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={pod},reason=Scheduled"),
        ])
        .await
        .ok();
    assert!(
        events.contains("Successfully assigned default/"),
        "{events}"
    );

    // More CPU than any node has: Pending, with the reasons counted per node.
    k.run(&["run", "big", "--image=nginx", "--overrides", r#"{"spec":{"containers":[{"name":"big","image":"nginx","resources":{"requests":{"cpu":"3"}}}]}}"#])
        .await
        .ok();
    wait_for("big's FailedScheduling event", BOUND, || async {
        let out = k.run(&["describe", "pod", "big"]).await.stdout;
        out.contains("0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 2 Insufficient cpu.")
            .then_some(())
    })
    .await;
    let scheduled = k
        .run(&[
            "get",
            "pod",
            "big",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].reason}",
        ])
        .await
        .ok();
    assert_eq!(scheduled, "Unschedulable");
    assert_eq!(node_of(&k, "big").await, "");

    // nodeSelector, required node affinity with a toleration, and a tolerated taint.
    k.run(&["run", "fast", "--image=nginx", "--overrides", r#"{"spec":{"nodeSelector":{"disk":"ssd"},"containers":[{"name":"fast","image":"nginx"}]}}"#])
        .await
        .ok();
    assert_eq!(wait_bound(&k, "fast").await, "node-1");
    let gpu = r#"{"spec":{"tolerations":[{"key":"dedicated","operator":"Equal","value":"gpu","effect":"NoSchedule"}],
        "affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[
          {"matchExpressions":[{"key":"kubernetes.io/hostname","operator":"NotIn","values":["node-1","node-2"]}]}]}}},
        "containers":[{"name":"gpu","image":"nginx"}]}}"#;
    k.run(&["run", "gpu", "--image=nginx", "--overrides", gpu])
        .await
        .ok();
    assert_eq!(wait_bound(&k, "gpu").await, "node-3");

    // A node big enough joins: the waiting pod goes there.
    add_node(&k, "node-4", "8", &[]).await;
    assert_eq!(wait_bound(&k, "big").await, "node-4");

    // Required pod anti-affinity by hostname: one replica per node, the rest Pending.
    let spread = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: spread}
spec:
  replicas: 5
  selector: {matchLabels: {app: spread}}
  template:
    metadata: {labels: {app: spread}}
    spec:
      tolerations: [{key: dedicated, operator: Exists}]
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector: {matchLabels: {app: spread}}
            topologyKey: kubernetes.io/hostname
      containers: [{name: c, image: nginx}]
"#;
    k.run_with_input(&["apply", "-f", "-"], spread).await.ok();
    let nodes = wait_for("four spread pods bound", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "pods",
                "-l",
                "app=spread",
                "-o",
                "jsonpath={.items[*].spec.nodeName}",
            ])
            .await
            .stdout;
        let bound: Vec<String> = out.split_whitespace().map(str::to_string).collect();
        (bound.len() == 4).then_some(bound)
    })
    .await;
    let distinct: std::collections::BTreeSet<&String> = nodes.iter().collect();
    assert_eq!(distinct.len(), 4, "one per node: {nodes:?}");
    wait_for("the fifth refused by anti-affinity", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "events",
                "--field-selector",
                "reason=FailedScheduling",
            ])
            .await
            .stdout;
        out.contains("4 node(s) didn't match pod anti-affinity rules")
            .then_some(())
    })
    .await;

    // Priority: a pod of a higher PriorityClass preempts a lower one when nothing else fits.
    // The victims end as pods end on a node: their agent (played here by the test, as these
    // nodes are bare Node objects) deletes them once they are marked.
    let _kubelet = k.finish_terminating_pods();
    let err = k
        .run(&["run", "nameless", "--image=nginx", "--overrides", r#"{"spec":{"priorityClassName":"missing","containers":[{"name":"c","image":"nginx"}]}}"#])
        .await
        .err();
    assert!(
        err.contains("no PriorityClass with name missing was found"),
        "{err}"
    );
    k.run(&["create", "priorityclass", "high", "--value=1000"])
        .await
        .ok();
    k.run(&["run", "vip", "--image=nginx", "--overrides", r#"{"spec":{"priorityClassName":"high","containers":[{"name":"vip","image":"nginx","resources":{"requests":{"cpu":"7"}}}]}}"#])
        .await
        .ok();
    assert_eq!(wait_bound(&k, "vip").await, "node-4");
    let priority = k
        .run(&["get", "pod", "vip", "-o", "jsonpath={.spec.priority}"])
        .await
        .ok();
    assert_eq!(priority, "1000");
    let events = k
        .run(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=big",
        ])
        .await
        .ok();
    assert!(
        events.contains("Preempted") && events.contains("on node node-4"),
        "{events}"
    );
    let gone = k.run(&["get", "pod", "big"]).await;
    assert!(!gone.success, "big was preempted");
}
