//! StatefulSets on simulated agents, through kubectl: OrderedReady creates web-1 only once
//! web-0 is Running and Ready while Parallel creates every pod at once; pods have stable names,
//! hostnames and DNS names through the governing headless Service (asked of the cluster DNS);
//! `kubectl scale` down removes the highest ordinal first; a RollingUpdate with a partition
//! updates only the ordinals at or above it, `rollout status|history|undo|restart` follow the
//! ControllerRevisions; OnDelete leaves pods until they are deleted; the spec fields that may
//! not change are refused with Kubernetes' message; a set made again adopts its pods. Claim templates give each pod its
//! PersistentVolumeClaim, made before it; the retention policy has the scaled-down pod's claim
//! and, once asked, the set's remaining claims deleted with them. `maxUnavailable` is dropped
//! as 1.32 drops it, and a Service that publishes not-ready addresses lists and resolves a pod
//! that is not Ready. On real containers (`rkube up --runtime cri`), issue 19's story: three
//! pods write to local-path volumes and a deleted one comes back to its data.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use cluster_tests::kubectl::Kubectl;

use super::common::rollout_history;
use cluster_tests::{wait_for, Cluster, Options};
use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinEncodable};
use serde_json::Value;

const BOUND: Duration = Duration::from_secs(90);

const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: nginx
spec:
  clusterIP: None
  selector:
    app: web
  ports:
  - name: web
    port: 80
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: nginx
  replicas: 3
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
      - name: nginx
        image: rkube.local/busybox:1
"#;

const PAR: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: par
spec:
  serviceName: par
  podManagementPolicy: Parallel
  replicas: 3
  selector:
    matchLabels:
      app: par
  template:
    metadata:
      labels:
        app: par
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: c
        image: rkube.local/busybox:1
"#;

const DB: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: db
spec:
  serviceName: db
  podManagementPolicy: Parallel
  replicas: 2
  persistentVolumeClaimRetentionPolicy:
    whenScaled: Delete
  selector:
    matchLabels:
      app: db
  template:
    metadata:
      labels:
        app: db
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: db
        image: rkube.local/busybox:1
        volumeMounts:
        - name: data
          mountPath: /var/lib/db
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      accessModes: ["ReadWriteOnce"]
      resources:
        requests:
          storage: 1Gi
"#;

/// The claim, or None when it is gone or being deleted.
async fn live_claim(k: &Kubectl, name: &str) -> Option<Value> {
    let out = k
        .run(&["get", "pvc", name, "-o", "json", "--ignore-not-found"])
        .await
        .ok();
    let claim: Value = serde_json::from_str(&out).ok()?;
    claim["metadata"]["deletionTimestamp"]
        .is_null()
        .then_some(claim)
}

/// The kinds of the claim's owners.
fn owner_kinds(claim: &Value) -> Vec<String> {
    claim["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            format!(
                "{}/{}",
                r["kind"].as_str().unwrap_or(""),
                r["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// The set's pods that are not being deleted: name -> the pod.
async fn pods(k: &Kubectl, app: &str) -> std::collections::BTreeMap<String, Value> {
    let out = k
        .run(&["get", "pods", "-l", &format!("app={app}"), "-o", "json"])
        .await
        .ok();
    let list: Value = serde_json::from_str(&out).unwrap_or_default();
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                p.clone(),
            )
        })
        .collect()
}

/// When the pod became Ready ("" when it has no Ready condition with a time).
fn ready_at(pod: &Value) -> String {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["lastTransitionTime"].as_str())
        .unwrap_or("")
        .to_string()
}

/// Waits until the three pods of `sts` (labelled `app={app}`) are rolled out, checks that
/// each was made once the one before it was Ready, and returns them.
async fn rolled_out_in_order(
    k: &Kubectl,
    sts: &str,
    app: &str,
) -> std::collections::BTreeMap<String, Value> {
    let done = rollout_status(k, sts).await;
    // kubectl words every RollingUpdate's end as a partitioned one (the partition defaults to 0).
    assert!(
        done.contains("partitioned roll out complete: 3 new pods have been updated"),
        "{done}"
    );
    let all = pods(k, app).await;
    for i in 1..3 {
        let (before, next) = (format!("{sts}-{}", i - 1), format!("{sts}-{i}"));
        let at = ready_at(&all[&before]);
        assert!(!at.is_empty(), "{before}'s Ready condition has its time");
        let created = all[&next]["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap_or("");
        assert!(
            created >= at.as_str(),
            "{next} made before {before} was Ready"
        );
    }
    all
}

async fn names(k: &Kubectl, app: &str) -> BTreeSet<String> {
    pods(k, app).await.into_keys().collect()
}

async fn sts_field(k: &Kubectl, sts: &str, path: &str) -> String {
    k.run(&[
        "get",
        "statefulset",
        sts,
        "-o",
        &format!("jsonpath={{{path}}}"),
    ])
    .await
    .ok()
}

/// Waits until the controller has written the status of the set's current spec with
/// `replicas` pods counted.
async fn observed(k: &Kubectl, sts: &str, replicas: &str) {
    wait_for(
        &format!("{sts}'s status to count {replicas} pods"),
        BOUND,
        || async {
            let generation = sts_field(k, sts, ".metadata.generation").await;
            let seen = sts_field(k, sts, ".status.observedGeneration").await;
            let counted = sts_field(k, sts, ".status.replicas").await;
            (generation == seen && counted == replicas).then_some(())
        },
    )
    .await;
}

async fn rollout_status(k: &Kubectl, sts: &str) -> String {
    let out = k
        .run(&[
            "rollout",
            "status",
            &format!("statefulset/{sts}"),
            "--timeout=80s",
        ])
        .await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    out.stdout
}

async fn images(k: &Kubectl, app: &str) -> Vec<(String, String)> {
    pods(k, app)
        .await
        .into_iter()
        .map(|(n, p)| {
            let image = p["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or("")
                .to_string();
            (n, image)
        })
        .collect()
}

async fn wait_images(k: &Kubectl, app: &str, want: &[(&str, &str)]) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    wait_for(&format!("{app}'s pods at {want:?}"), BOUND, || async {
        (images(k, app).await == want).then_some(())
    })
    .await;
}

/// Asks the DNS server at `server` for the A records of `name`: the response code and the
/// addresses.
async fn resolve(server: SocketAddr, name: &str) -> (ResponseCode, Vec<String>) {
    let mut query = Message::new();
    query
        .set_id(rand::random())
        .set_message_type(MessageType::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket
        .send_to(&query.to_bytes().unwrap(), server)
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut buf))
        .await
        .expect("the cluster DNS answers")
        .unwrap();
    let answer = Message::from_bytes(&buf[..n]).unwrap();
    let ips = answer
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            Some(RData::A(a)) => Some(a.0.to_string()),
            _ => None,
        })
        .collect();
    (answer.response_code(), ips)
}

#[tokio::test]
async fn statefulsets_keep_order_identity_and_revisions() {
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

    // With every node cordoned no pod can run: OrderedReady stops at web-0, Parallel makes all.
    k.run(&["cordon", "agent1", "agent2"]).await.ok();
    k.run_with_input(&["apply", "-f", "-"], WEB).await.ok();
    k.run_with_input(&["apply", "-f", "-"], PAR).await.ok();
    observed(&k, "web", "1").await;
    observed(&k, "par", "3").await;
    assert_eq!(
        names(&k, "web").await,
        BTreeSet::from(["web-0".to_string()])
    );
    assert_eq!(
        names(&k, "par").await,
        BTreeSet::from(["par-0", "par-1", "par-2"].map(String::from))
    );
    let defaults = sts_field(&k, "web", ".spec").await;
    let defaults: Value = serde_json::from_str(&defaults).unwrap();
    assert_eq!(defaults["podManagementPolicy"], "OrderedReady");
    assert_eq!(
        defaults["updateStrategy"],
        serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
    );
    assert_eq!(
        defaults["persistentVolumeClaimRetentionPolicy"],
        serde_json::json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
    );
    assert_eq!(defaults["revisionHistoryLimit"], 10);

    // Once web-0 can run, web-1 and then web-2 follow, each made after the one before is Ready.
    k.run(&["uncordon", "agent1", "agent2"]).await.ok();
    let all = rolled_out_in_order(&k, "web", "web").await;
    let web1 = &all["web-1"];
    assert_eq!(web1["spec"]["hostname"], "web-1");
    assert_eq!(web1["spec"]["subdomain"], "nginx");
    assert_eq!(
        web1["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"],
        "web-1"
    );
    assert_eq!(
        web1["metadata"]["labels"]["apps.kubernetes.io/pod-index"],
        "1"
    );
    let revision = web1["metadata"]["labels"]["controller-revision-hash"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        sts_field(&k, "web", ".status.updateRevision").await,
        revision
    );
    assert_eq!(
        sts_field(&k, "web", ".status.currentRevision").await,
        revision
    );
    let table = k.run(&["get", "statefulset", "web"]).await.ok();
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["NAME", "READY", "AGE"], "{table}");
    assert_eq!(lines[1][..2], ["web", "3/3"], "{table}");
    let described = k.run(&["describe", "statefulset", "web"]).await.ok();
    let words = described.split_whitespace().collect::<Vec<_>>().join(" ");
    for part in [
        "Replicas: 3 desired | 3 total",
        "Update Strategy: RollingUpdate Partition: 0",
        "Pods Status: 3 Running / 0 Waiting / 0 Succeeded / 0 Failed",
        "SuccessfulCreate",
    ] {
        assert!(words.contains(part), "{part} in {described}");
    }

    // web-0.nginx resolves to web-0's address in the cluster DNS, through its endpoint's
    // hostname in the Service's EndpointSlice.
    let layout: Value =
        serde_json::from_slice(&std::fs::read(c.path().join("cluster.json")).unwrap()).unwrap();
    let api: SocketAddr = layout["members"][0]["api"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let dns = SocketAddr::new(api.ip(), api.port() + 1);
    let ip = all["web-0"]["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_string();
    let name = "web-0.nginx.default.svc.cluster.local.";
    let answer = wait_for("web-0.nginx to resolve", BOUND, || async {
        let (code, ips) = resolve(dns, name).await;
        (code == ResponseCode::NoError && !ips.is_empty()).then_some(ips)
    })
    .await;
    assert_eq!(answer, [ip]);
    let (code, _) = resolve(dns, "web-7.nginx.default.svc.cluster.local.").await;
    assert_eq!(code, ResponseCode::NXDomain);

    // Scaling down removes the highest ordinal first: web-1 never goes while web-2 is there.
    let scaled = k
        .run(&["scale", "statefulset", "web", "--replicas=1"])
        .await
        .ok();
    assert_eq!(scaled.trim(), "statefulset.apps/web scaled");
    let mut seen = Vec::new();
    let done = tokio::time::timeout(BOUND, async {
        loop {
            let now = names(&k, "web").await;
            if seen.last() != Some(&now) {
                seen.push(now.clone());
            }
            if now == BTreeSet::from(["web-0".to_string()]) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(done.is_ok(), "scaled down: {seen:?}");
    for state in &seen {
        assert!(
            !state.contains("web-2") || state.contains("web-1"),
            "{seen:?}"
        );
    }
    observed(&k, "web", "1").await;
    let events = k
        .run(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=web",
            "-o",
            "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
        ])
        .await
        .ok();
    for line in [
        "SuccessfulCreate: create Pod web-0 in StatefulSet web successful",
        "SuccessfulCreate: create Pod web-2 in StatefulSet web successful",
        "SuccessfulDelete: delete Pod web-2 in StatefulSet web successful",
        "SuccessfulDelete: delete Pod web-1 in StatefulSet web successful",
    ] {
        assert!(events.lines().any(|l| l == line), "{line} in {events}");
    }

    // A partitioned rolling update: only the ordinals at or above the partition change.
    k.run(&["scale", "statefulset", "web", "--replicas=3"])
        .await
        .ok();
    rollout_status(&k, "web").await;
    k.run(&[
        "patch",
        "statefulset",
        "web",
        "-p",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":2}}}}"#,
    ])
    .await
    .ok();
    k.run(&[
        "set",
        "image",
        "statefulset/web",
        "nginx=rkube.local/busybox:2",
    ])
    .await
    .ok();
    let partial = rollout_status(&k, "web").await;
    assert!(
        partial.contains("partitioned roll out complete: 1 new pods have been updated"),
        "{partial}"
    );
    let (one, two) = ("rkube.local/busybox:1", "rkube.local/busybox:2");
    wait_images(&k, "web", &[("web-0", one), ("web-1", one), ("web-2", two)]).await;
    assert_eq!(sts_field(&k, "web", ".status.updatedReplicas").await, "1");
    assert_eq!(sts_field(&k, "web", ".status.currentReplicas").await, "2");
    k.run(&[
        "patch",
        "statefulset",
        "web",
        "-p",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}"#,
    ])
    .await
    .ok();
    let done = rollout_status(&k, "web").await;
    assert!(
        done.contains("partitioned roll out complete: 3 new pods have been updated"),
        "{done}"
    );
    wait_images(&k, "web", &[("web-0", two), ("web-1", two), ("web-2", two)]).await;
    assert_eq!(rollout_history(&k, "statefulset/web").await, ["1", "2"]);
    let first = k
        .run(&["rollout", "history", "statefulset/web", "--revision=1"])
        .await
        .ok();
    assert!(first.contains(one), "{first}");

    // Undo puts the first template back, as revision 3.
    let undo = k.run(&["rollout", "undo", "statefulset/web"]).await.ok();
    assert!(undo.contains("rolled back"), "{undo}");
    rollout_status(&k, "web").await;
    wait_images(&k, "web", &[("web-0", one), ("web-1", one), ("web-2", one)]).await;
    assert_eq!(rollout_history(&k, "statefulset/web").await, ["2", "3"]);
    // kubectl compares the revision with the set it reads, and skips the undo to it.
    let skipped = k
        .run(&["rollout", "undo", "statefulset/web", "--to-revision=3"])
        .await
        .ok();
    assert_eq!(
        skipped.trim(),
        "statefulset.apps/web skipped rollback (current template already matches revision 3)"
    );

    // `rollout restart` stamps the template: every pod is made again, highest ordinal first.
    let before = pods(&k, "web").await;
    k.run(&["rollout", "restart", "statefulset/web"]).await.ok();
    rollout_status(&k, "web").await;
    wait_for("every web pod made again", BOUND, || async {
        let now = pods(&k, "web").await;
        let renewed = now.len() == 3
            && now.iter().all(|(n, p)| {
                p["metadata"]["uid"] != before[n]["metadata"]["uid"]
                    && p["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"].is_string()
            });
        renewed.then_some(())
    })
    .await;
    assert_eq!(
        rollout_history(&k, "statefulset/web").await,
        ["2", "3", "4"]
    );

    // OnDelete: a new template waits until a pod is deleted; that pod comes back with it.
    k.run(&[
        "patch",
        "statefulset",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"updateStrategy":{"type":"OnDelete","rollingUpdate":null}}}"#,
    ])
    .await
    .ok();
    k.run(&[
        "set",
        "image",
        "statefulset/web",
        "nginx=rkube.local/busybox:3",
    ])
    .await
    .ok();
    wait_for("the OnDelete set's update revision", BOUND, || async {
        let current = sts_field(&k, "web", ".status.currentRevision").await;
        let update = sts_field(&k, "web", ".status.updateRevision").await;
        let generation = sts_field(&k, "web", ".metadata.generation").await;
        let seen = sts_field(&k, "web", ".status.observedGeneration").await;
        (current != update && generation == seen).then_some(())
    })
    .await;
    assert_eq!(
        images(&k, "web")
            .await
            .iter()
            .filter(|(_, i)| i == one)
            .count(),
        3
    );
    k.run(&["delete", "pod", "web-1"]).await.ok();
    let three = "rkube.local/busybox:3";
    wait_images(
        &k,
        "web",
        &[("web-0", one), ("web-1", three), ("web-2", one)],
    )
    .await;
    let status = k.run(&["rollout", "status", "statefulset/web"]).await;
    assert!(
        status
            .stderr
            .contains("rollout status is only available for RollingUpdate strategy type"),
        "{}{}",
        status.stdout,
        status.stderr
    );

    // Only some spec fields may change.
    let refused = k
        .run(&[
            "patch",
            "statefulset",
            "web",
            "-p",
            r#"{"spec":{"serviceName":"other"}}"#,
        ])
        .await
        .err();
    assert!(
        refused.contains(
            "spec: Forbidden: updates to statefulset spec for fields other than 'replicas', \
             'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' \
             and 'minReadySeconds' are forbidden"
        ),
        "{refused}"
    );

    // A set made again adopts the pods it names and puts back the labels that name them; it
    // adopts its revisions too, so the pods are not replaced.
    let uids = |pods: std::collections::BTreeMap<String, Value>| -> Vec<String> {
        pods.values()
            .map(|p| p["metadata"]["uid"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let before = uids(pods(&k, "par").await);
    k.run(&["delete", "statefulset", "par", "--cascade=orphan"])
        .await
        .ok();
    k.run(&["label", "pod", "par-0", "apps.kubernetes.io/pod-index-"])
        .await
        .ok();
    k.run_with_input(&["apply", "-f", "-"], PAR).await.ok();
    wait_for("par-0 adopted and labelled again", BOUND, || async {
        let pod = pods(&k, "par").await.remove("par-0")?;
        let owner = pod["metadata"]["ownerReferences"][0]["name"].as_str() == Some("par");
        let index = pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"].as_str() == Some("0");
        (owner && index).then_some(())
    })
    .await;
    observed(&k, "par", "3").await;
    assert_eq!(uids(pods(&k, "par").await), before);
    let revisions = k
        .run(&["get", "controllerrevisions", "-l", "app=par", "-o", "name"])
        .await
        .ok();
    assert_eq!(revisions.lines().count(), 1, "{revisions}");

    // Claims from the templates, made before their pods, named <template>-<set>-<ordinal>.
    k.run_with_input(&["apply", "-f", "-"], DB).await.ok();
    observed(&k, "db", "2").await;
    for ordinal in ["0", "1"] {
        let pod = &pods(&k, "db").await[&format!("db-{ordinal}")];
        let volume = pod["spec"]["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == "data"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            volume["persistentVolumeClaim"]["claimName"],
            format!("data-db-{ordinal}"),
            "{pod}"
        );
        let claim = live_claim(&k, &format!("data-db-{ordinal}"))
            .await
            .expect("the claim");
        assert_eq!(claim["metadata"]["labels"]["app"], "db");
        assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1Gi");
        assert!(
            claim["metadata"]["creationTimestamp"].as_str()
                <= pod["metadata"]["creationTimestamp"].as_str()
        );
        assert_eq!(owner_kinds(&claim), Vec::<String>::new(), "{claim}");
    }
    let events = k
        .run(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=db",
            "-o",
            "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
        ])
        .await
        .ok();
    assert!(
        events
            .lines()
            .any(|l| l == "create Claim data-db-1 Pod db-1 in StatefulSet db success"),
        "{events}"
    );

    // whenScaled Delete: the scaled-down pod's claim goes with it; the others stay.
    k.run(&["scale", "statefulset", "db", "--replicas=1"])
        .await
        .ok();
    wait_for("data-db-1 to be deleted", BOUND, || async {
        live_claim(&k, "data-db-1").await.is_none().then_some(())
    })
    .await;
    assert_eq!(names(&k, "db").await, BTreeSet::from(["db-0".to_string()]));
    let kept = live_claim(&k, "data-db-0")
        .await
        .expect("data-db-0 is kept");
    assert_eq!(owner_kinds(&kept), Vec::<String>::new());

    // whenDeleted Delete: the set owns its claims, which go with it.
    k.run(&[
        "patch",
        "statefulset",
        "db",
        "-p",
        r#"{"spec":{"persistentVolumeClaimRetentionPolicy":{"whenDeleted":"Delete"}}}"#,
    ])
    .await
    .ok();
    wait_for("data-db-0 to be owned by the set", BOUND, || async {
        let claim = live_claim(&k, "data-db-0").await?;
        (owner_kinds(&claim) == ["StatefulSet/db"]).then_some(())
    })
    .await;
    k.run(&["delete", "statefulset", "db"]).await.ok();
    wait_for("data-db-0 to be deleted with its set", BOUND, || async {
        live_claim(&k, "data-db-0").await.is_none().then_some(())
    })
    .await;
}

/// A set whose pods keep what they write: each writes its hostname into `name` on its claim
/// the first time it starts (never again), counts its starts in `starts`, and serves the
/// claim's files over HTTP, Ready once `name` is served.
const KEEPER: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: keeper
spec:
  clusterIP: None
  selector:
    app: keeper
  ports:
  - name: http
    port: 80
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: keeper
  replicas: 3
  selector:
    matchLabels:
      app: keeper
  template:
    metadata:
      labels:
        app: keeper
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: rkube.local/busybox:1
        command: ["sh", "-c", "test -s /data/name || hostname > /data/name; hostname >> /data/starts; exec httpd -f -p 80 -h /data"]
        readinessProbe:
          httpGet:
            path: /name
            port: 80
          periodSeconds: 1
        volumeMounts:
        - name: data
          mountPath: /data
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      accessModes: ["ReadWriteOnce"]
      resources:
        requests:
          storage: 100Mi
"#;

/// `kubectl exec <pod> -- <command>`'s output, once it succeeds.
async fn exec_ok(k: &Kubectl, pod: &str, command: &[&str]) -> String {
    wait_for(&format!("{command:?} in {pod}"), BOUND, || async {
        let mut args = vec!["exec", pod, "--"];
        args.extend_from_slice(command);
        let out = k.run(&args).await;
        out.success.then_some(out.stdout)
    })
    .await
}

/// The story of issue 19 on real containers (`rkube up --runtime cri`, two nodes): a
/// three-replica set writes to volumes of the default local-path class, its pods Ready one
/// after the other; web-0 is reached by its stable DNS name from web-2; web-1 deleted comes
/// back with its name, its claim, its volume and what it wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_keeps_its_data_across_a_pod_deletion_on_real_containers() {
    let (_c, k) = super::common::cri_cluster(2).await;
    k.run_with_input(&["apply", "-f", "-"], KEEPER).await.ok();
    // Made in order: each pod only once the one before it was Ready.
    let all = rolled_out_in_order(&k, "web", "keeper").await;

    // Each pod has its own claim, bound to a volume of the default class on its node.
    let mut volumes = BTreeSet::new();
    for ordinal in 0..3 {
        let pod = format!("web-{ordinal}");
        let claim = live_claim(&k, &format!("data-{pod}"))
            .await
            .expect("the claim");
        assert_eq!(claim["status"]["phase"], "Bound", "{claim}");
        assert_eq!(claim["spec"]["storageClassName"], "local-path", "{claim}");
        volumes.insert(claim["spec"]["volumeName"].as_str().unwrap().to_string());
        let name = exec_ok(&k, &pod, &["cat", "/data/name"]).await;
        assert_eq!(name, format!("{pod}\n"));
    }
    assert_eq!(volumes.len(), 3, "{volumes:?}");

    // web-0 by its stable name in the cluster DNS, from inside web-2.
    let page = wait_for("web-0.keeper from web-2", BOUND, || async {
        let out = k
            .run(&[
                "exec",
                "web-2",
                "--",
                "timeout",
                "10",
                "wget",
                "-qO-",
                "http://web-0.keeper/name",
            ])
            .await;
        out.success.then_some(out.stdout)
    })
    .await;
    assert_eq!(page, "web-0\n");

    // web-1 deleted: the set makes it again, with the same name, claim and volume; what the
    // first web-1 wrote is still there, and the second one started on top of it.
    let before = all["web-1"].clone();
    let claim_before = live_claim(&k, "data-web-1").await.expect("data-web-1");
    k.run(&["delete", "pod", "web-1"]).await.ok();
    let again = wait_for("web-1 made again and Ready", BOUND, || async {
        let pod = pods(&k, "keeper").await.remove("web-1")?;
        let renewed = pod["metadata"]["uid"] != before["metadata"]["uid"];
        (renewed && !ready_at(&pod).is_empty() && is_ready(&pod)).then_some(pod)
    })
    .await;
    assert_eq!(
        again["spec"]["nodeName"], before["spec"]["nodeName"],
        "a local volume keeps its pod on its node"
    );
    let claim = live_claim(&k, "data-web-1").await.expect("data-web-1");
    assert_eq!(claim["metadata"]["uid"], claim_before["metadata"]["uid"]);
    assert_eq!(
        claim["spec"]["volumeName"],
        claim_before["spec"]["volumeName"]
    );
    assert_eq!(
        exec_ok(&k, "web-1", &["cat", "/data/name"]).await,
        "web-1\n"
    );
    assert_eq!(
        exec_ok(&k, "web-1", &["cat", "/data/starts"]).await,
        "web-1\nweb-1\n"
    );
    rollout_status(&k, "web").await;
    assert_eq!(sts_field(&k, "web", ".status.readyReplicas").await, "3");
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

const PEERS: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: peer
spec:
  clusterIP: None
  selector:
    app: peer
  ports:
  - name: gossip
    port: 7000
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: peer
spec:
  serviceName: peer
  podManagementPolicy: Parallel
  replicas: 2
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      partition: 0
      maxUnavailable: 2
  selector:
    matchLabels:
      app: peer
  template:
    metadata:
      labels:
        app: peer
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: c
        image: rkube.local/busybox:1
"#;

/// The addresses of the Service's Endpoints: (ready, not ready) pod names.
async fn endpoint_pods(k: &Kubectl, svc: &str) -> (String, String) {
    let names = |which: &'static str| async move {
        let path = format!("{{range .subsets[*].{which}[*]}}{{.targetRef.name}} {{end}}");
        let out = super::common::jsonpath(k, &["endpoints", svc], &path).await;
        // In a subset, addresses are in the order of their IPs (a simulated node gives its
        // pods its own).
        let sorted: BTreeSet<&str> = out.split_whitespace().collect();
        sorted.into_iter().collect::<Vec<_>>().join(" ")
    };
    (names("addresses").await, names("notReadyAddresses").await)
}

/// The DNS server of the cluster's first member (the API port's next one).
fn cluster_dns(c: &Cluster) -> SocketAddr {
    let layout: Value =
        serde_json::from_slice(&std::fs::read(c.path().join("cluster.json")).unwrap()).unwrap();
    let api: SocketAddr = layout["members"][0]["api"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    SocketAddr::new(api.ip(), api.port() + 1)
}

/// `maxUnavailable` is dropped as Kubernetes 1.32 drops it (MaxUnavailableStatefulSet is an
/// alpha gate, off); a pod that is not Ready leaves its Service's ready addresses and its DNS
/// name, until the Service publishes not-ready addresses.
#[tokio::test]
async fn not_ready_peers_are_found_once_their_service_publishes_them() {
    let (c, k) = super::common::sim_cluster(1).await;
    let applied = k.run_with_input(&["apply", "-f", "-"], PEERS).await.ok();
    assert!(
        applied.contains("statefulset.apps/peer created"),
        "{applied}"
    );
    assert_eq!(
        sts_field(&k, "peer", ".spec.updateStrategy").await,
        r#"{"rollingUpdate":{"partition":0},"type":"RollingUpdate"}"#
    );
    // Dropped before validation: a value 1.32 would refuse with the gate on is no error.
    let zero = PEERS.replace("maxUnavailable: 2", "maxUnavailable: 0");
    let applied = k.run_with_input(&["apply", "-f", "-"], &zero).await.ok();
    // kubectl sends the changed field (its last-applied annotation changes with it).
    assert!(
        applied.contains("statefulset.apps/peer configured"),
        "{applied}"
    );
    assert_eq!(
        sts_field(&k, "peer", ".spec.updateStrategy").await,
        r#"{"rollingUpdate":{"partition":0},"type":"RollingUpdate"}"#
    );
    rollout_status(&k, "peer").await;
    wait_for("both peers ready addresses", BOUND, || async {
        (endpoint_pods(&k, "peer").await == ("peer-0 peer-1".into(), String::new())).then_some(())
    })
    .await;

    // peer-1 stops being Ready (as its kubelet would report a failing readiness probe).
    let not_ready = r#"{"status":{"conditions":[{"type":"Ready","status":"False"}]}}"#;
    k.run(&[
        "patch",
        "pod",
        "peer-1",
        "--subresource=status",
        "-p",
        not_ready,
    ])
    .await
    .ok();
    wait_for("peer-1 among the not-ready addresses", BOUND, || async {
        (endpoint_pods(&k, "peer").await == ("peer-0".into(), "peer-1".into())).then_some(())
    })
    .await;
    let dns = cluster_dns(&c);
    let name = "peer-1.peer.default.svc.cluster.local.";
    let (code, _) = resolve(dns, name).await;
    assert_eq!(code, ResponseCode::NXDomain);
    let slice_ready = |pod: &'static str| {
        let k = &k;
        async move {
            let path =
                format!("{{.items[0].endpoints[?(@.targetRef.name==\"{pod}\")].conditions.ready}}");
            super::common::jsonpath(
                k,
                &["endpointslices", "-l", "kubernetes.io/service-name=peer"],
                &path,
            )
            .await
        }
    };
    assert_eq!(slice_ready("peer-1").await, "false");

    // Published: both addresses are ready, in Endpoints, in the slice and in the DNS.
    k.run(&[
        "patch",
        "service",
        "peer",
        "-p",
        r#"{"spec":{"publishNotReadyAddresses":true}}"#,
    ])
    .await
    .ok();
    wait_for("peer-1 published as ready", BOUND, || async {
        (endpoint_pods(&k, "peer").await == ("peer-0 peer-1".into(), String::new())).then_some(())
    })
    .await;
    assert_eq!(slice_ready("peer-1").await, "true");
    let ip = super::common::jsonpath(&k, &["pod", "peer-1"], "{.status.podIP}").await;
    let answer = wait_for("peer-1.peer to resolve", BOUND, || async {
        let (code, ips) = resolve(dns, name).await;
        (code == ResponseCode::NoError && !ips.is_empty()).then_some(ips)
    })
    .await;
    assert_eq!(answer, [ip]);
}
