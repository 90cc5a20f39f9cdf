//! Persistent storage on simulated agents, through kubectl: the default StorageClass
//! `local-path`, a hand-made volume bound to the claim it fits (Retain keeps it Released once
//! the claim goes), a claim of no class that finds no volume, a claim of the default class
//! that waits for its first consumer and then follows the node the scheduler chose (its
//! volume provisioned there, pinned by node affinity, deleted with the claim), a pod whose
//! claim of an Immediate class is unbound, a claim in use kept by pvc-protection, and a claim
//! made while no class was default given the default class marked later.

use std::time::Duration;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::wait_for;

use super::common::{jsonpath, words};

const BOUND: Duration = Duration::from_secs(90);

const MANUAL: &str = r#"
apiVersion: v1
kind: PersistentVolume
metadata:
  name: manual-small
  labels:
    tier: gold
spec:
  storageClassName: manual
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce]
  hostPath:
    path: /srv/manual-small
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: manual-big
spec:
  storageClassName: manual
  capacity:
    storage: 5Gi
  accessModes: [ReadWriteOnce, ReadOnlyMany]
  hostPath:
    path: /srv/manual-big
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: manual-claim
spec:
  storageClassName: manual
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 500Mi
"#;

const NO_CLASS: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: no-class
spec:
  storageClassName: ""
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
"#;

const DEFAULT_CLAIM: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 2Gi
"#;

const CONSUMER: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: consumer
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: app
    image: rkube.local/busybox:1
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: data
"#;

const IMMEDIATE: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: remote
provisioner: example.com/remote
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: remote-claim
spec:
  storageClassName: remote
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
apiVersion: v1
kind: Pod
metadata:
  name: remote-user
spec:
  containers:
  - name: app
    image: rkube.local/busybox:1
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: remote-claim
"#;

/// Waits until `jsonpath` of an object reads `want`.
async fn wait_value(k: &Kubectl, what: &[&str], path: &str, want: &str) {
    let label = format!("{what:?} {path} = {want:?}");
    let mut last = String::new();
    let got = tokio::time::timeout(BOUND, async {
        loop {
            last = jsonpath(k, what, path).await;
            if last == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(got.is_ok(), "timed out waiting for {label}; last {last:?}");
}

/// Waits for an event about `object` with `reason` and returns its message.
async fn wait_event(k: &Kubectl, object: &str, reason: &str) -> String {
    let selector = format!("involvedObject.name={object},reason={reason}");
    wait_for(
        &format!("a {reason} event about {object}"),
        BOUND,
        || async {
            let out = k
                .run(&[
                    "get",
                    "events",
                    "--field-selector",
                    &selector,
                    "-o",
                    "jsonpath={.items[0].message}",
                ])
                .await
                .stdout;
            (!out.is_empty()).then_some(out)
        },
    )
    .await
}

async fn wait_gone(k: &Kubectl, what: &[&str]) {
    let label = format!("{what:?} to be gone");
    wait_for(&label, BOUND, || async {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        let out = k.run(&args).await;
        (!out.success && out.stderr.contains("NotFound")).then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_bind_wait_for_consumers_follow_their_node_and_are_reclaimed() {
    let (_c, k) = super::common::sim_cluster(2).await;

    // The default class, as k3s ships it.
    let sc = wait_for("the default StorageClass", BOUND, || async {
        let out = k.run(&["get", "sc"]).await;
        out.stdout.contains("local-path").then_some(out.stdout)
    })
    .await;
    let t = words(&sc);
    assert_eq!(
        t[0],
        [
            "NAME",
            "PROVISIONER",
            "RECLAIMPOLICY",
            "VOLUMEBINDINGMODE",
            "ALLOWVOLUMEEXPANSION",
            "AGE"
        ],
        "{sc}"
    );
    assert_eq!(
        t[1][..6],
        [
            "local-path",
            "(default)",
            "rancher.io/local-path",
            "Delete",
            "WaitForFirstConsumer",
            "false"
        ],
        "{sc}"
    );

    // A hand-made volume: the smallest that fits binds; Retain is its default.
    k.run_with_input(&["apply", "-f", "-"], MANUAL).await.ok();
    wait_value(&k, &["pvc", "manual-claim"], "{.status.phase}", "Bound").await;
    wait_value(&k, &["pv", "manual-small"], "{.status.phase}", "Bound").await;
    wait_value(&k, &["pv", "manual-big"], "{.status.phase}", "Available").await;
    let annotations = jsonpath(&k, &["pvc", "manual-claim"], "{.metadata.annotations}").await;
    assert!(
        annotations.contains(r#""pv.kubernetes.io/bind-completed":"yes""#)
            && annotations.contains(r#""pv.kubernetes.io/bound-by-controller":"yes""#),
        "{annotations}"
    );
    let pvc = k.run(&["get", "pvc", "manual-claim"]).await.ok();
    let t = words(&pvc);
    assert_eq!(
        t[0],
        [
            "NAME",
            "STATUS",
            "VOLUME",
            "CAPACITY",
            "ACCESS",
            "MODES",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "AGE"
        ],
        "{pvc}"
    );
    assert_eq!(
        t[1][..7],
        [
            "manual-claim",
            "Bound",
            "manual-small",
            "1Gi",
            "RWO",
            "manual",
            "<unset>"
        ],
        "{pvc}"
    );
    let pv = k
        .run(&["get", "pv", "manual-small", "-o", "wide"])
        .await
        .ok();
    let t = words(&pv);
    assert_eq!(
        t[0],
        [
            "NAME",
            "CAPACITY",
            "ACCESS",
            "MODES",
            "RECLAIM",
            "POLICY",
            "STATUS",
            "CLAIM",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "REASON",
            "AGE",
            "VOLUMEMODE"
        ],
        "{pv}"
    );
    assert_eq!(
        t[1][..8],
        [
            "manual-small",
            "1Gi",
            "RWO",
            "Retain",
            "Bound",
            "default/manual-claim",
            "manual",
            "<unset>"
        ],
        "{pv}"
    );
    assert_eq!(t[1].last().map(String::as_str), Some("Filesystem"), "{pv}");

    // Retain: the claim goes, the volume stays Released with its claimRef.
    k.run(&["delete", "pvc", "manual-claim", "--wait=false"])
        .await
        .ok();
    wait_value(&k, &["pv", "manual-small"], "{.status.phase}", "Released").await;
    wait_gone(&k, &["pvc", "manual-claim"]).await;
    assert_eq!(
        jsonpath(&k, &["pv", "manual-small"], "{.spec.claimRef.name}").await,
        "manual-claim"
    );

    // No class and no volume that fits: Pending with the binder's reason.
    k.run_with_input(&["apply", "-f", "-"], NO_CLASS).await.ok();
    let msg = wait_event(&k, "no-class", "FailedBinding").await;
    assert_eq!(
        msg,
        "no persistent volumes available for this claim and no storage class is set"
    );
    assert_eq!(
        jsonpath(&k, &["pvc", "no-class"], "{.status.phase}").await,
        "Pending"
    );

    // The default class is filled in; the claim waits for its first consumer.
    k.run_with_input(&["apply", "-f", "-"], DEFAULT_CLAIM)
        .await
        .ok();
    assert_eq!(
        jsonpath(&k, &["pvc", "data"], "{.spec.storageClassName}").await,
        "local-path"
    );
    let msg = wait_event(&k, "data", "WaitForFirstConsumer").await;
    assert_eq!(
        msg,
        "waiting for first consumer to be created before binding"
    );
    assert_eq!(
        jsonpath(&k, &["pvc", "data"], "{.status.phase}").await,
        "Pending"
    );

    // A consumer: the scheduler picks a node, the claim follows it, then the pod is bound.
    k.run_with_input(&["apply", "-f", "-"], CONSUMER).await.ok();
    wait_value(&k, &["pvc", "data"], "{.status.phase}", "Bound").await;
    let node = wait_for("the consumer to be scheduled", BOUND, || async {
        let n = jsonpath(&k, &["pod", "consumer"], "{.spec.nodeName}").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(
        jsonpath(
            &k,
            &["pvc", "data"],
            "{.metadata.annotations.volume\\.kubernetes\\.io/selected-node}"
        )
        .await,
        node
    );
    let volume = jsonpath(&k, &["pvc", "data"], "{.spec.volumeName}").await;
    let uid = jsonpath(&k, &["pvc", "data"], "{.metadata.uid}").await;
    assert_eq!(volume, format!("pvc-{uid}"));
    assert_eq!(
        jsonpath(
            &k,
            &["pv", &volume],
            "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}"
        )
        .await,
        node
    );
    assert_eq!(
        jsonpath(
            &k,
            &["pv", &volume],
            "{.metadata.annotations.pv\\.kubernetes\\.io/provisioned-by}"
        )
        .await,
        "rancher.io/local-path"
    );
    assert_eq!(
        jsonpath(
            &k,
            &["pv", &volume],
            "{.spec.persistentVolumeReclaimPolicy}"
        )
        .await,
        "Delete"
    );
    let msg = wait_event(&k, "data", "ProvisioningSucceeded").await;
    assert_eq!(msg, format!("Successfully provisioned volume {volume}"));
    wait_value(&k, &["pod", "consumer"], "{.status.phase}", "Running").await;
    // local-path does not allow expansion: a larger request is refused.
    let grow = k
        .run(&[
            "patch",
            "pvc",
            "data",
            "-p",
            r#"{"spec":{"resources":{"requests":{"storage":"3Gi"}}}}"#,
        ])
        .await
        .err();
    assert!(
        grow.contains(r#"persistentvolumeclaims "data" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"#),
        "{grow}"
    );

    // pvc-protection: a claim in use waits for its pod.
    k.run(&["delete", "pvc", "data", "--wait=false"]).await.ok();
    wait_for("the claim to be Terminating", BOUND, || async {
        let out = k.run(&["get", "pvc", "data"]).await.stdout;
        out.contains("Terminating").then_some(())
    })
    .await;
    assert_eq!(
        jsonpath(&k, &["pvc", "data"], "{.metadata.finalizers}").await,
        r#"["kubernetes.io/pvc-protection"]"#
    );
    // Delete: with the pod gone the claim goes, and its volume with it.
    k.run(&["delete", "pod", "consumer", "--wait=false"])
        .await
        .ok();
    wait_gone(&k, &["pvc", "data"]).await;
    wait_gone(&k, &["pv", &volume]).await;

    // An unbound claim of an Immediate class keeps its pod from every node.
    k.run_with_input(&["apply", "-f", "-"], IMMEDIATE)
        .await
        .ok();
    let msg = wait_event(&k, "remote-user", "FailedScheduling").await;
    assert_eq!(
        msg,
        "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    );
    let msg = wait_event(&k, "remote-claim", "ExternalProvisioning").await;
    assert!(msg.contains("'example.com/remote'"), "{msg}");

    // Retroactive default class: a claim made while no class is default gets the one
    // marked default later.
    let mark = "storageclass.kubernetes.io/is-default-class";
    k.run(&["annotate", "sc", "local-path", &format!("{mark}-")])
        .await
        .ok();
    // As created (the binder may look at it at once): no class.
    let created = k
        .run_with_input(
            &[
                "create",
                "-f",
                "-",
                "-o",
                "jsonpath={.spec.storageClassName}",
            ],
            &DEFAULT_CLAIM.replace("name: data", "name: late"),
        )
        .await
        .ok();
    assert_eq!(created, "");
    k.run(&["annotate", "sc", "local-path", &format!("{mark}=true")])
        .await
        .ok();
    wait_value(
        &k,
        &["pvc", "late"],
        "{.spec.storageClassName}",
        "local-path",
    )
    .await;
}

const WRITER: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: notes
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 100Mi
---
apiVersion: v1
kind: Pod
metadata:
  name: writer
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: app
    image: rkube.local/busybox:1
    command: ["sh", "-c", "echo kept > /data/note && sleep 3600"]
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: notes
"#;

const READER: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: reader
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: app
    image: rkube.local/busybox:1
    command: ["sh", "-c", "cat /data/note && sleep 3600"]
    volumeMounts:
    - name: data
      mountPath: /data
      readOnly: true
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: notes
"#;

/// The same with real containers (`rkube up --runtime cri`, busybox built here): a pod writes
/// into a local-path claim, is deleted, and a new pod on the node reads what it wrote; the
/// directory is on the node under the agent's dir, and deleting the claim removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_path_volume_keeps_its_data_across_pods_on_real_containers() {
    let (c, k) = super::common::cri_cluster(1).await;

    k.run_with_input(&["apply", "-f", "-"], WRITER).await.ok();
    wait_value(&k, &["pod", "writer"], "{.status.phase}", "Running").await;
    let volume = jsonpath(&k, &["pvc", "notes"], "{.spec.volumeName}").await;
    let dir =
        std::path::PathBuf::from(jsonpath(&k, &["pv", &volume], "{.spec.hostPath.path}").await);
    assert!(
        dir.starts_with(c.path().canonicalize().unwrap()) || dir.starts_with(c.path()),
        "the volume lives under the agent's dir: {}",
        dir.display()
    );
    wait_for("the note on the node", BOUND, || async {
        let note = std::fs::read_to_string(dir.join("note")).ok()?;
        (note == "kept\n").then_some(())
    })
    .await;

    k.run(&["delete", "pod", "writer"]).await.ok();
    wait_gone(&k, &["pod", "writer"]).await;
    k.run_with_input(&["apply", "-f", "-"], READER).await.ok();
    wait_value(&k, &["pod", "reader"], "{.status.phase}", "Running").await;
    let read = wait_for("the reader's log", BOUND, || async {
        let out = k.run(&["logs", "reader"]).await;
        (out.success && !out.stdout.is_empty()).then_some(out.stdout)
    })
    .await;
    assert_eq!(read, "kept\n");

    k.run(&["delete", "pod", "reader"]).await.ok();
    k.run(&["delete", "pvc", "notes"]).await.ok();
    wait_gone(&k, &["pv", &volume]).await;
    assert!(
        !dir.exists(),
        "{} is removed with its volume",
        dir.display()
    );
}
