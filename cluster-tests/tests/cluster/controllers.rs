//! The controllers on the Raft leader, driven by kubectl as a user drives them: the article's
//! Deployment gives one ReplicaSet and three pods; `set image` rolls within maxSurge and
//! maxUnavailable; `rollout undo` returns to the first template; scaling; `delete` removes the
//! ReplicaSets and pods (garbage collection), `--cascade=orphan` keeps them; and a leader killed
//! while a ReplicaSet scales leaves the new leader to finish without duplicates.
//!
//! No node agent runs yet, so a stand-in marks pods Running and Ready as an agent would.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::wait_for;

const BOUND: Duration = Duration::from_secs(60);

fn manifest(name: &str) -> String {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("manifests")
        .join(name)
        .display()
        .to_string()
}

/// Pod addresses the stand-in hands out.
static NEXT_IP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Marks every pod of the namespace that is not yet Running as Running and Ready with an
/// address, as the node agent will; returns how many it marked.
async fn mark_ready(client: &Client) -> usize {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let Ok(list) = pods.list(&ListParams::default()).await else {
        return 0;
    };
    let mut marked = 0;
    for p in list.items {
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if running || p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = p.metadata.name.unwrap_or_default();
        let n = NEXT_IP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ip = format!("10.244.{}.{}", n / 250, n % 250 + 1);
        let status = json!({"status": {"phase": "Running", "podIP": ip, "conditions": [{
            "type": "Ready", "status": "True",
            "lastTransitionTime": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        }]}});
        if pods
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .is_ok()
        {
            marked += 1;
        }
    }
    marked
}

/// The ReplicaSets of the namespace: name -> (spec replicas, ready replicas).
async fn replica_sets(k: &Kubectl) -> Vec<(String, i64, i64)> {
    let out = k
        .run(&[
            "get",
            "rs",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.replicas} {.status.readyReplicas}{\"\\n\"}{end}",
        ])
        .await
        .ok();
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].to_string(),
                f.get(1).and_then(|x| x.parse().ok()).unwrap_or(0),
                f.get(2).and_then(|x| x.parse().ok()).unwrap_or(0),
            )
        })
        .collect()
}

async fn pod_names(k: &Kubectl, selector: &str) -> BTreeSet<String> {
    k.run(&["get", "pods", "-l", selector, "-o", "name"])
        .await
        .ok()
        .lines()
        .map(str::to_string)
        .collect()
}

async fn rolled_out(k: &Kubectl) {
    let status = k
        .run(&[
            "rollout",
            "status",
            "deployment/myapp-deployment",
            "--timeout=30s",
        ])
        .await
        .ok();
    assert!(status.contains("successfully rolled out"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_roll_out_roll_back_scale_and_are_collected() {
    let (c, k) = cluster_tests::kubectl::api_cluster().await;
    let client = super::kube_client::client_of(&c, 0).await;

    k.run(&["apply", "-f", &manifest("deployment.yaml")])
        .await
        .ok();
    wait_for("one ReplicaSet with three pods", BOUND, || async {
        let sets = replica_sets(&k).await;
        let pods = pod_names(&k, "app=myapp").await;
        (sets.len() == 1 && sets[0].1 == 3 && pods.len() == 3).then_some(())
    })
    .await;
    let first = replica_sets(&k).await[0].0.clone();
    assert!(first.starts_with("myapp-deployment-"), "{first}");
    let owner = k
        .run(&[
            "get",
            "pods",
            "-l",
            "app=myapp",
            "-o",
            "jsonpath={.items[0].metadata.ownerReferences[0].name} {.items[0].metadata.labels.pod-template-hash}",
        ])
        .await
        .ok();
    assert_eq!(
        owner,
        format!("{first} {}", first.trim_start_matches("myapp-deployment-"))
    );
    wait_for("the pods ready", BOUND, || async {
        mark_ready(&client).await;
        let out = k
            .run(&[
                "get",
                "deploy",
                "myapp-deployment",
                "-o",
                "jsonpath={.status.availableReplicas}",
            ])
            .await;
        (out.stdout == "3").then_some(())
    })
    .await;
    rolled_out(&k).await;

    // A new template rolls out within maxSurge 1 and maxUnavailable 0 (25% of 3).
    k.run(&[
        "set",
        "image",
        "deployment/myapp-deployment",
        "nginx-container=nginx:1.27",
    ])
    .await
    .ok();
    wait_for("the rollout to finish", BOUND, || async {
        let sets = replica_sets(&k).await;
        let total: i64 = sets.iter().map(|s| s.1).sum();
        let ready: i64 = sets.iter().map(|s| s.2).sum();
        assert!(total <= 4, "more than replicas + maxSurge: {sets:?}");
        assert!(
            ready >= 3 || sets.iter().all(|s| s.2 == 0),
            "below minimum availability: {sets:?}"
        );
        mark_ready(&client).await;
        let done = sets.len() == 2
            && sets.iter().any(|s| s.0 != first && s.1 == 3 && s.2 == 3)
            && sets.iter().any(|s| s.0 == first && s.1 == 0);
        done.then_some(())
    })
    .await;
    rolled_out(&k).await;
    let history = k
        .run(&["rollout", "history", "deployment/myapp-deployment"])
        .await
        .ok();
    assert!(
        history.contains("\n1 ") && history.contains("\n2 "),
        "{history}"
    );

    // Undo puts the first template back: its ReplicaSet becomes the new one again.
    k.run(&["rollout", "undo", "deployment/myapp-deployment"])
        .await
        .ok();
    wait_for("the first ReplicaSet back at 3", BOUND, || async {
        mark_ready(&client).await;
        let sets = replica_sets(&k).await;
        (sets.len() == 2 && sets.iter().any(|s| s.0 == first && s.1 == 3 && s.2 == 3)).then_some(())
    })
    .await;
    let image = k
        .run(&[
            "get",
            "deploy",
            "myapp-deployment",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ])
        .await
        .ok();
    assert_eq!(image, "nginx");
    let revision = k
        .run(&[
            "get",
            "rs",
            &first,
            "-o",
            "jsonpath={.metadata.annotations.deployment\\.kubernetes\\.io/revision}",
        ])
        .await
        .ok();
    assert_eq!(revision, "3");

    // Scaling.
    for n in [6, 2] {
        k.run(&[
            "scale",
            "deployment/myapp-deployment",
            &format!("--replicas={n}"),
        ])
        .await
        .ok();
        wait_for(&format!("{n} pods"), BOUND, || async {
            mark_ready(&client).await;
            (pod_names(&k, "app=myapp").await.len() == n).then_some(())
        })
        .await;
    }
    let described = k
        .run(&["describe", "deployment", "myapp-deployment"])
        .await
        .ok();
    assert!(described.contains("ScalingReplicaSet"), "{described}");
    assert!(
        described.contains(&format!("Scaled down replica set {first} from 6 to 2")),
        "{described}"
    );

    // A Service over the Deployment lists the ready pods' addresses.
    k.run(&["expose", "deployment", "myapp-deployment", "--port=80"])
        .await
        .ok();
    wait_for("two endpoints", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "endpoints",
                "myapp-deployment",
                "-o",
                "jsonpath={.subsets[*].addresses[*].ip}",
            ])
            .await;
        (out.success && out.stdout.split_whitespace().count() == 2).then_some(())
    })
    .await;
    let slices = k
        .run(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=myapp-deployment",
            "-o",
            "jsonpath={.items[0].endpoints[*].conditions.ready}",
        ])
        .await
        .ok();
    assert_eq!(slices, "true true");
    let described = k
        .run(&["describe", "service", "myapp-deployment"])
        .await
        .ok();
    assert!(
        described.contains("Endpoints:") && described.contains("10.244."),
        "{described}"
    );
    k.run(&["delete", "service", "myapp-deployment"]).await.ok();

    // Deleting the Deployment deletes its ReplicaSets and their pods.
    k.run(&["delete", "deployment", "myapp-deployment"])
        .await
        .ok();
    wait_for("the ReplicaSets and pods collected", BOUND, || async {
        (replica_sets(&k).await.is_empty() && pod_names(&k, "app=myapp").await.is_empty())
            .then_some(())
    })
    .await;

    // --cascade=orphan keeps them, released from their owner.
    k.run(&["apply", "-f", &manifest("deployment.yaml")])
        .await
        .ok();
    wait_for("three pods again", BOUND, || async {
        (pod_names(&k, "app=myapp").await.len() == 3).then_some(())
    })
    .await;
    k.run(&[
        "delete",
        "deployment",
        "myapp-deployment",
        "--cascade=orphan",
    ])
    .await
    .ok();
    wait_for("the Deployment gone", BOUND, || async {
        let out = k.run(&["get", "deploy", "-o", "name"]).await;
        (out.success && out.stdout.trim().is_empty()).then_some(())
    })
    .await;
    wait_for("the ReplicaSet released", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "rs",
                "-o",
                "jsonpath={.items[*].metadata.ownerReferences}",
            ])
            .await;
        (out.success && out.stdout.trim().is_empty() && replica_sets(&k).await.len() == 1)
            .then_some(())
    })
    .await;
    assert_eq!(pod_names(&k, "app=myapp").await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_finishes_a_scale_up_without_duplicates() {
    let (c, k) = cluster_tests::kubectl::api_cluster().await;
    let leader = c.wait_leader().await;
    // kubectl talks to a member that survives.
    let other = (leader + 1) % 3;
    let ctx = format!("--context=rkube-n{}", other + 1);
    let rs = "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: web\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n      - name: c\n        image: busybox\n";
    k.run_with_input(&["apply", &ctx, "-f", "-"], rs).await.ok();
    wait_for("two pods", BOUND, || async {
        let n = k
            .run(&["get", "pods", &ctx, "-l", "app=web", "-o", "name"])
            .await
            .stdout
            .lines()
            .count();
        (n == 2).then_some(())
    })
    .await;
    k.run(&["scale", &ctx, "rs/web", "--replicas=30"])
        .await
        .ok();
    c.kill(leader).await;
    c.wait_new_leader(leader).await;
    wait_for("30 pods", BOUND, || async {
        let out = k
            .run(&["get", "pods", &ctx, "-l", "app=web", "-o", "name"])
            .await;
        (out.success && out.stdout.lines().count() == 30).then_some(())
    })
    .await;
    // And it stays there: nothing created twice by the old leader's half-done sync.
    wait_for("the ReplicaSet status to settle at 30", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "rs",
                "web",
                &ctx,
                "-o",
                "jsonpath={.status.replicas}",
            ])
            .await;
        (out.stdout == "30").then_some(())
    })
    .await;
    let n = k
        .run(&["get", "pods", &ctx, "-l", "app=web", "-o", "name"])
        .await
        .ok()
        .lines()
        .count();
    assert_eq!(n, 30);
}

/// Renews node `name`'s Lease in kube-node-lease, as its agent does.
async fn heartbeat(client: &Client, name: &str) {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                 "renewTime": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)},
    });
    let _ = leases
        .patch(
            name,
            &PatchParams::apply("test-agent").force(),
            &Patch::Apply(&lease),
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_goes_unknown_is_tainted_and_its_pods_are_evicted() {
    let c = cluster_tests::Cluster::start(cluster_tests::Options {
        kubernetes_api: true,
        up_args: [
            "--node-monitor-period",
            "200ms",
            "--node-monitor-grace-period",
            "3s",
            "--node-eviction-rate",
            "100",
        ]
        .map(String::from)
        .to_vec(),
        ..Default::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    let k = Kubectl::from_env_file(&c.path().join("env"), &c.path().join("home")).expect("env");
    let client = super::kube_client::client_of(&c, 0).await;
    let objects = "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: node-b}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: brief}\nspec:\n  nodeName: node-b\n  containers: [{name: c, image: busybox}]\n  tolerations:\n  - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 1}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: patient}\nspec:\n  nodeName: node-b\n  containers: [{name: c, image: busybox}]\n";
    wait_for("the objects created", BOUND, || async {
        k.run_with_input(&["apply", "-f", "-"], objects)
            .await
            .success
            .then_some(())
    })
    .await;
    k.report_node_ready("node-a", Some("4")).await;
    k.report_node_ready("node-b", Some("4")).await;
    // node-b's agent beats until a ReplicaSet's pod is placed there (node-a cordoned meanwhile).
    let b_beating = {
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                heartbeat(&client, "node-b").await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    k.run(&["cordon", "node-a"]).await.ok();
    let mover = "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: mover}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: mover}}\n  template:\n    metadata: {labels: {app: mover}}\n    spec:\n      containers: [{name: c, image: busybox}]\n      tolerations:\n      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 1}\n";
    k.run_with_input(&["apply", "-f", "-"], mover).await.ok();
    // Where the mover's live pods are (an evicted pod stays Terminating on its unreachable
    // node: nobody can confirm it stopped).
    let mover_nodes = || async {
        let out = k
            .run(&["get", "pods", "-l", "app=mover", "-o", "json"])
            .await
            .stdout;
        let list: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
            .map(|p| p["spec"]["nodeName"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    wait_for("the mover's pod on node-b", BOUND, || async {
        (mover_nodes().await == "node-b").then_some(())
    })
    .await;
    k.run(&["uncordon", "node-a"]).await.ok();
    b_beating.abort();
    // node-a's agent keeps renewing its Lease; node-b's falls silent.
    let beating = {
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                heartbeat(&client, "node-a").await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    heartbeat(&client, "node-b").await;
    wait_for("node-b Unknown and tainted unreachable", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "node",
                "node-b",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} {.spec.taints[*].key}",
            ])
            .await;
        (out.stdout.starts_with("Unknown") && out.stdout.contains("node.kubernetes.io/unreachable"))
            .then_some(())
    })
    .await;
    let nodes = k.run(&["get", "nodes"]).await.ok();
    let status_of = |n: &str| {
        nodes
            .lines()
            .find(|l| l.starts_with(n))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(status_of("node-a"), "Ready", "{nodes}");
    assert_eq!(status_of("node-b"), "NotReady", "{nodes}");
    // The pod that tolerates unreachability for 1 s is evicted; the one with the default
    // 300 s toleration stays.
    let deleting = |name: &'static str| {
        let k = k.clone();
        async move {
            k.run(&[
                "get",
                "pod",
                name,
                "-o",
                "jsonpath={.metadata.deletionTimestamp}",
            ])
            .await
            .stdout
            .trim()
            .to_string()
        }
    };
    wait_for("the brief pod evicted", BOUND, || async {
        (!deleting("brief").await.is_empty()).then_some(())
    })
    .await;
    assert_eq!(deleting("patient").await, "", "the patient pod stays");
    // Marked before its deletion, as Kubernetes' taint eviction controller marks it.
    let marked = k
        .run(&[
            "get",
            "pod",
            "brief",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"DisruptionTarget\")].reason}: {.status.conditions[?(@.type==\"DisruptionTarget\")].message}",
        ])
        .await
        .ok();
    assert_eq!(
        marked,
        "DeletionByTaintManager: Taint manager: deleting due to NoExecute taint"
    );
    // The ReplicaSet's pod, evicted with it, is made again and placed on the healthy node.
    wait_for("the mover's pod recreated on node-a", BOUND, || async {
        (mover_nodes().await == "node-a").then_some(())
    })
    .await;
    let events = k
        .run(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=brief",
        ])
        .await
        .ok();
    assert!(events.contains("TaintManagerEviction"), "{events}");
    let events = k
        .run(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=patient",
        ])
        .await
        .ok();
    assert!(
        events.contains("NodeNotReady") && events.contains("Node is not ready"),
        "{events}"
    );
    // The agent comes back and reports Ready again: the taints go.
    k.report_node_ready("node-b", None).await;
    let back = {
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                heartbeat(&client, "node-b").await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    wait_for("node-b untainted", BOUND, || async {
        let out = k
            .run(&["get", "node", "node-b", "-o", "jsonpath={.spec.taints}"])
            .await;
        (out.success && out.stdout.trim().is_empty()).then_some(())
    })
    .await;
    beating.abort();
    back.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_compacts_history_but_keeps_an_interval_of_it() {
    let c = cluster_tests::Cluster::start(cluster_tests::Options {
        kubernetes_api: true,
        up_args: ["--compaction-interval", "1s"].map(String::from).to_vec(),
        ..Default::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    let etcdctl = c.etcdctl();
    etcdctl.ok(&["put", "/housekeeping/a", "1"]).await;
    let err = wait_for("revision 1 compacted", BOUND, || async {
        let out = etcdctl.run(&["get", "/housekeeping/a", "--rev=1"]).await;
        (!out.success).then_some(out.stderr)
    })
    .await;
    assert!(
        err.contains("required revision has been compacted"),
        "{err}"
    );
    // What was just written stays readable at its revision for at least an interval.
    let put = etcdctl
        .ok(&["put", "/housekeeping/b", "2", "-w", "json"])
        .await;
    let rev = serde_json::from_str::<serde_json::Value>(&put).expect("json")["header"]["revision"]
        .as_i64()
        .expect("revision");
    let read = etcdctl
        .ok(&[
            "get",
            "/housekeeping/b",
            &format!("--rev={rev}"),
            "--print-value-only",
        ])
        .await;
    assert_eq!(read.trim(), "2");
}

/// A leader frozen (SIGSTOP) while its controllers have work, replaced, then thawed: nothing it
/// tries afterwards commits, so the new leader's count stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_and_deposed_leader_writes_nothing() {
    let (c, k) = cluster_tests::kubectl::api_cluster().await;
    let leader = c.wait_leader().await;
    let other = (leader + 1) % 3;
    let ctx = format!("--context=rkube-n{}", other + 1);
    let rs = "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: frozen\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {app: frozen}\n  template:\n    metadata:\n      labels: {app: frozen}\n    spec:\n      containers:\n      - name: c\n        image: busybox\n";
    k.run_with_input(&["apply", &ctx, "-f", "-"], rs).await.ok();
    let count = |k: Kubectl, ctx: String| async move {
        let out = k
            .run(&["get", "pods", &ctx, "-l", "app=frozen", "-o", "name"])
            .await;
        out.success.then(|| out.stdout.lines().count())
    };
    wait_for("one pod", BOUND, || async {
        (count(k.clone(), ctx.clone()).await == Some(1)).then_some(())
    })
    .await;
    // Frozen in the middle of its own scale-up.
    k.run(&["scale", &ctx, "rs/frozen", "--replicas=12"])
        .await
        .ok();
    c.pause(leader);
    c.wait_new_leader(leader).await;
    wait_for("12 pods, finished by the new leader", BOUND, || async {
        (count(k.clone(), ctx.clone()).await == Some(12)).then_some(())
    })
    .await;
    c.resume(leader);
    // The old leader wakes up believing it leads, with a stale view; it must commit nothing.
    wait_for("the old leader to follow", BOUND, || async {
        c.status(leader)
            .await
            .filter(|s| s.leader != 0 && Some(s.leader) != s.header.as_ref().map(|h| h.member_id))
    })
    .await;
    wait_for("the status to settle at 12", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "rs",
                "frozen",
                &ctx,
                "-o",
                "jsonpath={.status.replicas}",
            ])
            .await;
        (out.stdout == "12").then_some(())
    })
    .await;
    assert_eq!(count(k.clone(), ctx.clone()).await, Some(12));
}

/// The leader killed while a Deployment scales up: the new leader's controllers finish it, and
/// at no observed moment are there more pods than replicas + maxSurge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_scaling_through_a_leader_kill_never_overshoots() {
    let (c, k) = cluster_tests::kubectl::api_cluster().await;
    let leader = c.wait_leader().await;
    let other = (leader + 1) % 3;
    let ctx = format!("--context=rkube-n{}", other + 1);
    k.run(&[
        "create",
        "deployment",
        "grow",
        &ctx,
        "--image=nginx",
        "--replicas=2",
    ])
    .await
    .ok();
    let pods = |k: Kubectl, ctx: String| async move {
        let out = k
            .run(&["get", "pods", &ctx, "-l", "app=grow", "-o", "name"])
            .await;
        out.success.then(|| out.stdout.lines().count())
    };
    wait_for("two pods", BOUND, || async {
        (pods(k.clone(), ctx.clone()).await == Some(2)).then_some(())
    })
    .await;
    k.run(&["scale", &ctx, "deployment/grow", "--replicas=30"])
        .await
        .ok();
    c.kill(leader).await;
    c.wait_new_leader(leader).await;
    // maxSurge is 25% of 30, rounded up.
    let ceiling = 30 + 8;
    wait_for("30 pods", BOUND, || async {
        let n = pods(k.clone(), ctx.clone()).await?;
        assert!(n <= ceiling, "{n} pods: more than replicas + maxSurge");
        (n == 30).then_some(())
    })
    .await;
    wait_for("the Deployment's status at 30", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "deploy",
                "grow",
                &ctx,
                "-o",
                "jsonpath={.status.replicas}",
            ])
            .await;
        (out.stdout == "30").then_some(())
    })
    .await;
    assert_eq!(pods(k.clone(), ctx.clone()).await, Some(30));
    let sets = k
        .run(&["get", "rs", &ctx, "-l", "app=grow", "-o", "name"])
        .await
        .ok();
    assert_eq!(sets.lines().count(), 1, "one ReplicaSet: {sets}");
}
