//! DaemonSets on simulated agents, through kubectl: one pod per node, a nodeSelector honoured
//! as node labels change, a node that joins gets its pod, a template change rolls out
//! (`kubectl rollout status` returns), `rollout history` lists the ControllerRevisions and
//! `rollout undo` puts the first template back, and skips an undo to the current revision as
//! kubectl skips it against kube-apiserver.

use std::collections::BTreeMap;
use std::time::Duration;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::{rkube_bin, wait_for, Cluster, Options};

use super::common::{rollout_history, NODE_AGENT};

const BOUND: Duration = Duration::from_secs(90);

const SSD_CACHE: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: ssd-cache
spec:
  selector:
    matchLabels:
      app: ssd-cache
  template:
    metadata:
      labels:
        app: ssd-cache
    spec:
      terminationGracePeriodSeconds: 0
      nodeSelector:
        disk: ssd
      containers:
      - name: cache
        image: rkube.local/busybox:1
"#;

/// The DaemonSet's pods that are not being deleted, by node: (pod, image) on each.
async fn pods_by_node(k: &Kubectl, app: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let selector = format!("app={app}");
    let out = k
        .run(&["get", "pods", "-l", &selector, "-o",
               "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.spec.containers[0].image} {.metadata.deletionTimestamp}{\"\\n\"}{end}"])
        .await
        .ok();
    let mut by_node: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for line in out.lines() {
        if let [pod, node, image] = line.split_whitespace().collect::<Vec<_>>()[..] {
            by_node
                .entry(node.to_string())
                .or_default()
                .push((pod.to_string(), image.to_string()));
        }
    }
    by_node
}

/// Waits until the DaemonSet runs one pod of `image` on each of `nodes` and none elsewhere.
async fn wait_placed(k: &Kubectl, app: &str, nodes: &[&str], image: &str) {
    let what = format!("{app}: one pod of {image} on each of {nodes:?}");
    let mut last = BTreeMap::new();
    let placed = tokio::time::timeout(BOUND, async {
        loop {
            let by_node = pods_by_node(k, app).await;
            let ok = by_node.keys().map(String::as_str).eq(nodes.iter().copied())
                && by_node
                    .values()
                    .all(|pods| pods.len() == 1 && pods[0].1 == image);
            if ok {
                return;
            }
            last = by_node;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        placed.is_ok(),
        "timed out waiting for {what}; last seen {last:?}"
    );
}

async fn rollout_status(k: &Kubectl, ds: &str) {
    let out = k
        .run(&[
            "rollout",
            "status",
            &format!("daemonset/{ds}"),
            "--timeout=50s",
        ])
        .await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("successfully rolled out"),
        "{}",
        out.stdout
    );
}

/// `kubectl set image daemonset/<ds> <container=image>`, rolled out.
async fn set_image(k: &Kubectl, ds: &str, image: &str) {
    let target = format!("daemonset/{ds}");
    k.run(&["set", "image", &target, image]).await.ok();
    rollout_status(k, ds).await;
}

/// A simulated agent joining as `rkube token create --print-join-command` tells.
async fn join_agent(c: &Cluster, name: &str) -> tokio::process::Child {
    let out = wait_for("a join command", BOUND, || async {
        let out = tokio::process::Command::new(rkube_bin())
            .args(["token", "create", "--print-join-command", "--dir"])
            .arg(c.path())
            .output()
            .await
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).to_string())
    })
    .await;
    let words: Vec<&str> = out.split_whitespace().collect();
    let arg = |flag: &str| {
        let at = words.iter().position(|w| *w == flag);
        at.map(|i| words[i + 1].to_string())
            .unwrap_or_else(|| panic!("no {flag} in the join command {out:?}"))
    };
    tokio::process::Command::new(rkube_bin())
        .args(["agent", "--sim", "--name", name, "--port", "0"])
        .args(["--server", &arg("--server"), "--token", &arg("--token")])
        .args([
            "--discovery-token-ca-cert-hash",
            &arg("--discovery-token-ca-cert-hash"),
        ])
        .arg("--dir")
        .arg(c.path().join("joins").join(name))
        .stderr(std::fs::File::create(c.path().join(format!("{name}.log"))).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("rkube agent runs")
}

#[tokio::test]
async fn a_daemonset_runs_on_every_eligible_node_and_rolls_out_through_revisions() {
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

    // One pod per node, each pinned to its node by affinity and labelled with its revision.
    k.run_with_input(&["apply", "-f", "-"], NODE_AGENT)
        .await
        .ok();
    rollout_status(&k, "node-agent").await;
    wait_placed(
        &k,
        "node-agent",
        &["agent1", "agent2"],
        "rkube.local/busybox:1",
    )
    .await;
    let table = k.run(&["get", "daemonset", "node-agent"]).await.ok();
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "NAME",
            "DESIRED",
            "CURRENT",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "NODE",
            "SELECTOR",
            "AGE"
        ],
        "{table}"
    );
    assert_eq!(
        lines[1][..7],
        ["node-agent", "2", "2", "2", "2", "2", "<none>"],
        "{table}"
    );
    let pod = k
        .run(&["get", "pods", "-l", "app=node-agent", "-o", "json"])
        .await
        .ok();
    let pod: serde_json::Value = serde_json::from_str(&pod).unwrap();
    let first = &pod["items"][0];
    let node = first["spec"]["nodeName"].as_str().unwrap();
    assert_eq!(
        first["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchFields"][0],
        serde_json::json!({"key": "metadata.name", "operator": "In", "values": [node]})
    );
    let tolerations = first["spec"]["tolerations"].to_string();
    assert!(
        tolerations.contains("node.kubernetes.io/unreachable")
            && tolerations.contains("node.kubernetes.io/unschedulable"),
        "{tolerations}"
    );
    let hash = first["metadata"]["labels"]["controller-revision-hash"]
        .as_str()
        .expect("the revision's hash label")
        .to_string();
    let revisions = k.run(&["get", "controllerrevisions"]).await.ok();
    assert!(
        revisions.contains(&format!("node-agent-{hash}"))
            && revisions.contains("daemonset.apps/node-agent"),
        "{revisions}"
    );

    // A nodeSelector: pods only where the label is, following the labels as they change.
    k.run(&["label", "node", "agent1", "disk=ssd"]).await.ok();
    k.run_with_input(&["apply", "-f", "-"], SSD_CACHE)
        .await
        .ok();
    wait_placed(&k, "ssd-cache", &["agent1"], "rkube.local/busybox:1").await;
    let table = k.run(&["get", "daemonset", "ssd-cache"]).await.ok();
    assert!(table.contains("disk=ssd"), "{table}");
    k.run(&["label", "node", "agent2", "disk=ssd"]).await.ok();
    wait_placed(
        &k,
        "ssd-cache",
        &["agent1", "agent2"],
        "rkube.local/busybox:1",
    )
    .await;
    k.run(&["label", "node", "agent1", "disk-"]).await.ok();
    wait_placed(&k, "ssd-cache", &["agent2"], "rkube.local/busybox:1").await;

    // A node that joins gets its daemon pod (and no ssd-cache pod: it has no such label).
    let _agent3 = join_agent(&c, "agent3").await;
    k.wait_nodes_ready(&["agent3"]).await;
    wait_placed(
        &k,
        "node-agent",
        &["agent1", "agent2", "agent3"],
        "rkube.local/busybox:1",
    )
    .await;
    rollout_status(&k, "node-agent").await;
    wait_placed(&k, "ssd-cache", &["agent2"], "rkube.local/busybox:1").await;

    // A new template rolls out node by node; the history lists both revisions.
    set_image(&k, "node-agent", "agent=rkube.local/busybox:2").await;
    wait_placed(
        &k,
        "node-agent",
        &["agent1", "agent2", "agent3"],
        "rkube.local/busybox:2",
    )
    .await;
    assert_eq!(
        rollout_history(&k, "daemonset/node-agent").await,
        ["1", "2"]
    );
    let first = k
        .run(&["rollout", "history", "daemonset/node-agent", "--revision=1"])
        .await
        .ok();
    assert!(first.contains("rkube.local/busybox:1"), "{first}");
    let explained = k
        .run(&["explain", "daemonset.spec.updateStrategy.rollingUpdate"])
        .await
        .ok();
    assert!(explained.contains("maxSurge"), "{explained}");

    // Undo goes back to the first template, which becomes revision 3.
    let undo = k
        .run(&["rollout", "undo", "daemonset/node-agent"])
        .await
        .ok();
    assert!(undo.contains("rolled back"), "{undo}");
    rollout_status(&k, "node-agent").await;
    wait_placed(
        &k,
        "node-agent",
        &["agent1", "agent2", "agent3"],
        "rkube.local/busybox:1",
    )
    .await;
    assert_eq!(
        rollout_history(&k, "daemonset/node-agent").await,
        ["2", "3"]
    );

    // The controller's events, in Kubernetes' words.
    wait_for("the DaemonSet's events", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=node-agent",
                "-o",
                "jsonpath={.items[*].reason}",
            ])
            .await
            .ok();
        (out.contains("SuccessfulCreate") && out.contains("SuccessfulDelete")).then_some(())
    })
    .await;
    // `kubectl describe` (terminating pods of the undo may linger a moment in its counts).
    let wanted = [
        "Desired Number of Nodes Scheduled: 3",
        "Number of Nodes Scheduled with Up-to-date Pods: 3",
        "Pods Status:  3 Running / 0 Waiting / 0 Succeeded / 0 Failed",
        "SuccessfulDelete",
    ];
    let mut described = String::new();
    let seen = tokio::time::timeout(BOUND, async {
        loop {
            described = k.run(&["describe", "daemonset", "node-agent"]).await.ok();
            if wanted.iter().all(|w| described.contains(w)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(seen.is_ok(), "{wanted:?} not all in:\n{described}");
}

/// A DaemonSet of `app` whose template adds `spec` (YAML lines under the pod spec, indented
/// by six spaces) and whose DaemonSet spec adds `ds_spec` (indented by two).
fn daemonset(app: &str, ds_spec: &str, spec: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: {app}\nspec:\n{ds_spec}  \
         selector:\n    matchLabels:\n      app: {app}\n  template:\n    metadata:\n      \
         labels:\n        app: {app}\n    spec:\n{spec}      terminationGracePeriodSeconds: 0\n      \
         containers:\n      - name: c\n        image: rkube.local/busybox:1\n"
    )
}

/// Waits until the DaemonSet's status has caught up with its spec.
async fn wait_observed(k: &Kubectl, ds: &str) {
    wait_for(
        &format!("{ds}'s status to observe its generation"),
        BOUND,
        || async {
            let out = k
                .run(&[
                    "get",
                    "daemonset",
                    ds,
                    "-o",
                    "jsonpath={.metadata.generation} {.status.observedGeneration}",
                ])
                .await
                .ok();
            let parts: Vec<&str> = out.split_whitespace().collect();
            (parts.len() == 2 && parts[0] == parts[1]).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn taints_cordons_surge_on_delete_and_cascading_deletion() {
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
    let busybox = |n: u8| format!("rkube.local/busybox:{n}");

    // The control-plane taint keeps daemon pods off, unless they tolerate it.
    k.run(&[
        "taint",
        "node",
        "agent2",
        "node-role.kubernetes.io/control-plane:NoSchedule",
    ])
    .await
    .ok();
    let tolerating =
        "      tolerations:\n      - key: node-role.kubernetes.io/control-plane\n        \
                      operator: Exists\n        effect: NoSchedule\n";
    let apply = |manifest: String| {
        let k = k.clone();
        async move {
            k.run_with_input(&["apply", "-f", "-"], &manifest)
                .await
                .ok()
        }
    };
    apply(daemonset("plain", "", "")).await;
    apply(daemonset("everywhere", "", tolerating)).await;
    wait_placed(&k, "plain", &["agent1"], &busybox(1)).await;
    wait_placed(&k, "everywhere", &["agent1", "agent2"], &busybox(1)).await;

    // A cordoned node keeps its daemon pods and gets new ones (they tolerate unschedulable).
    k.run(&["cordon", "agent1"]).await.ok();
    apply(daemonset("late", "", "")).await;
    wait_placed(&k, "late", &["agent1"], &busybox(1)).await;
    wait_placed(&k, "plain", &["agent1"], &busybox(1)).await;
    k.run(&["uncordon", "agent1"]).await.ok();

    // maxSurge: the new pod starts beside the old one, which goes once the new one is up.
    let surge = "  updateStrategy:\n    type: RollingUpdate\n    rollingUpdate:\n      \
                 maxSurge: 1\n      maxUnavailable: 0\n";
    apply(daemonset("surging", surge, tolerating)).await;
    wait_placed(&k, "surging", &["agent1", "agent2"], &busybox(1)).await;
    k.run(&[
        "set",
        "image",
        "daemonset/surging",
        &format!("c={}", busybox(2)),
    ])
    .await
    .ok();
    rollout_status(&k, "surging").await;
    wait_placed(&k, "surging", &["agent1", "agent2"], &busybox(2)).await;

    // OnDelete: a new template waits until a pod is deleted by hand.
    let on_delete = "  updateStrategy:\n    type: OnDelete\n";
    apply(daemonset("manual", on_delete, tolerating)).await;
    wait_placed(&k, "manual", &["agent1", "agent2"], &busybox(1)).await;
    k.run(&[
        "set",
        "image",
        "daemonset/manual",
        &format!("c={}", busybox(2)),
    ])
    .await
    .ok();
    wait_observed(&k, "manual").await;
    wait_placed(&k, "manual", &["agent1", "agent2"], &busybox(1)).await;
    let on_agent1 = pods_by_node(&k, "manual").await["agent1"][0].0.clone();
    k.run(&["delete", "pod", &on_agent1, "--wait=false"])
        .await
        .ok();
    let mixed = tokio::time::timeout(BOUND, async {
        loop {
            let by_node = pods_by_node(&k, "manual").await;
            let image = |node: &str| {
                by_node
                    .get(node)
                    .and_then(|p| p.first())
                    .map(|p| p.1.clone())
            };
            if image("agent1") == Some(busybox(2)) && image("agent2") == Some(busybox(1)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(mixed.is_ok(), "{:?}", pods_by_node(&k, "manual").await);

    // An untolerated NoExecute taint takes the daemon pods off the node.
    k.run(&["taint", "node", "agent1", "dedicated=db:NoExecute"])
        .await
        .ok();
    wait_placed(&k, "everywhere", &["agent2"], &busybox(1)).await;
    wait_placed(&k, "plain", &[], &busybox(1)).await;

    // Deleting a DaemonSet deletes its pods and its revisions.
    k.run(&["delete", "daemonset", "everywhere"]).await.ok();
    wait_for("everywhere's pods and revisions to go", BOUND, || async {
        let pods = pods_by_node(&k, "everywhere").await;
        let revisions = k
            .run(&["get", "controllerrevisions", "-o", "name"])
            .await
            .ok();
        (pods.is_empty() && !revisions.contains("everywhere-")).then_some(())
    })
    .await;
}

/// The DaemonSet's pods that run and are Ready, not being deleted, as (node, pod, image of
/// its running container).
async fn running_daemon_pods(k: &Kubectl, app: &str) -> Vec<(String, String, String)> {
    let selector = format!("app={app}");
    let out = k
        .run(&["get", "pods", "-l", &selector, "-o",
               "jsonpath={range .items[*]}{.spec.nodeName} {.metadata.name} {.status.containerStatuses[0].image} {.status.phase} {.status.conditions[?(@.type==\"Ready\")].status} {.metadata.deletionTimestamp}{\"\\n\"}{end}"])
        .await
        .ok();
    let mut pods: Vec<(String, String, String)> = out
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [node, pod, image, "Running", "True"] => {
                Some((node.to_string(), pod.to_string(), image.to_string()))
            }
            _ => None,
        })
        .collect();
    pods.sort();
    pods
}

/// On real containers (`rkube up --runtime cri`, two agents, busybox built here): a pod Running
/// on each node whose process says where it runs, then `kubectl set image` rolls the new image
/// out node by node (never both nodes without a Ready pod, maxUnavailable 1) until each node
/// runs a container of the new image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemonset_runs_real_containers_on_every_node_and_rolls_its_image() {
    let (_c, k) = super::common::cri_cluster(2).await;
    k.run_with_input(&["apply", "-f", "-"], &super::common::node_agent_process())
        .await
        .ok();
    rollout_status(&k, "node-agent").await;
    let pods = wait_for(
        "a Running, Ready daemon pod on each node",
        BOUND,
        || async {
            let pods = running_daemon_pods(&k, "node-agent").await;
            let nodes: Vec<&str> = pods.iter().map(|(n, _, _)| n.as_str()).collect();
            (nodes == ["agent1", "agent2"]).then_some(pods)
        },
    )
    .await;
    for (node, pod, image) in &pods {
        assert_eq!(image, "rkube.local/busybox:1");
        let said = wait_for(&format!("{pod}'s log"), BOUND, || async {
            let out = k.run(&["logs", pod]).await;
            out.stdout.contains("node-agent on").then_some(out.stdout)
        })
        .await;
        assert_eq!(said.trim(), format!("node-agent on {node}"));
    }
    let table = k.run(&["get", "daemonset", "node-agent"]).await.ok();
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(row[..6], ["node-agent", "2", "2", "2", "2", "2"], "{table}");

    // The image rolls out: the old pods' containers stop, the new ones run the new image.
    k.run(&[
        "set",
        "image",
        "daemonset/node-agent",
        "agent=rkube.local/busybox:2",
    ])
    .await
    .ok();
    // What the pods looked like during the rollout, sampled.
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let watcher = {
        let (k, samples) = (k.clone(), samples.clone());
        tokio::spawn(async move {
            loop {
                let pods = running_daemon_pods(&k, "node-agent").await;
                let raw = k.run(&["get", "pods", "-l", "app=node-agent", "-o",
               "jsonpath={range .items[*]}{.spec.nodeName} {.metadata.name} {.status.containerStatuses[0].image} {.status.phase} {.status.conditions[?(@.type==\"Ready\")]} {.metadata.deletionTimestamp}{\"\\n\"}{end}"]).await.stdout;
                samples.lock().unwrap().push((pods, raw));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    rollout_status(&k, "node-agent").await;
    let rolled = wait_for(
        "a Running pod of the new image on each node",
        BOUND,
        || async {
            let pods = running_daemon_pods(&k, "node-agent").await;
            let nodes: Vec<&str> = pods.iter().map(|(n, _, _)| n.as_str()).collect();
            (nodes == ["agent1", "agent2"]
                && pods
                    .iter()
                    .all(|(_, _, image)| image == "rkube.local/busybox:2"))
            .then_some(pods)
        },
    )
    .await;
    watcher.abort();
    let samples = samples.lock().unwrap().clone();
    assert!(
        samples.iter().all(|(pods, _)| !pods.is_empty()),
        "both nodes were without a Ready daemon pod during the rollout: {samples:#?}"
    );
    for ((_, old, _), (_, new, _)) in pods.iter().zip(&rolled) {
        assert_ne!(old, new, "a pod was updated in place");
    }
    // The old pods are gone for good: their agents stopped their containers.
    wait_for("the old pods gone", BOUND, || async {
        let out = k
            .run(&["get", "pods", "-l", "app=node-agent", "-o", "name"])
            .await
            .ok();
        pods.iter()
            .all(|(_, old, _)| !out.contains(old.as_str()))
            .then_some(())
    })
    .await;
    assert_eq!(
        rollout_history(&k, "daemonset/node-agent").await,
        ["1", "2"]
    );
}

/// `kubectl rollout undo --to-revision=N` compares revision N's data with the DaemonSet it
/// reads, byte for byte, before it patches anything: the revisions hold the template as
/// Kubernetes' Go types write it, so asking for the current one is skipped as
/// kube-apiserver's revisions are, even with characters that JSON writers escape differently.
#[tokio::test]
async fn undo_to_the_current_revision_is_skipped() {
    let (_c, k) = super::common::sim_cluster(1).await;
    let keeper = NODE_AGENT.replace(
        "        image: rkube.local/busybox:1\n",
        "        image: rkube.local/busybox:1\n        \
         command: [\"sh\", \"-c\", \"sleep 3600 & wait; test 1 -lt 2 && echo '<done>'\"]\n        \
         env:\n        - name: MODE\n          value: a&b\n",
    );
    k.run_with_input(&["apply", "-f", "-"], &keeper).await.ok();
    rollout_status(&k, "node-agent").await;
    let skipped = k
        .run(&["rollout", "undo", "daemonset/node-agent", "--to-revision=1"])
        .await
        .ok();
    assert_eq!(
        skipped.trim(),
        "daemonset.apps/node-agent skipped rollback (current template already matches revision 1)"
    );
    set_image(&k, "node-agent", "agent=rkube.local/busybox:2").await;
    assert_eq!(
        rollout_history(&k, "daemonset/node-agent").await,
        ["1", "2"]
    );
    let skipped = k
        .run(&["rollout", "undo", "daemonset/node-agent", "--to-revision=2"])
        .await
        .ok();
    assert_eq!(
        skipped.trim(),
        "daemonset.apps/node-agent skipped rollback (current template already matches revision 2)"
    );
    // Another revision is put back, and becomes the newest.
    let undone = k
        .run(&["rollout", "undo", "daemonset/node-agent", "--to-revision=1"])
        .await
        .ok();
    assert_eq!(undone.trim(), "daemonset.apps/node-agent rolled back");
    rollout_status(&k, "node-agent").await;
    wait_for("revision 1 renumbered 3", BOUND, || async {
        (rollout_history(&k, "daemonset/node-agent").await == ["2", "3"]).then_some(())
    })
    .await;
    let skipped = k
        .run(&["rollout", "undo", "daemonset/node-agent", "--to-revision=3"])
        .await
        .ok();
    assert_eq!(
        skipped.trim(),
        "daemonset.apps/node-agent skipped rollback (current template already matches revision 3)"
    );
}
