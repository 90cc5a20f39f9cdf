//! kubectl 1.32 against a three-server `rkube up` cluster, used exactly as the articles and a
//! user use it: the manifests in cluster-tests/manifests (the articles' examples), only
//! `source DIR/env`. No scheduler or node agent runs yet, so pods stay Pending.

use std::path::PathBuf;
use std::time::Duration;

use cluster_tests::kubectl::{wait_line, Kubectl};
use cluster_tests::{wait_for, Cluster};

fn manifests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("manifests")
}

fn manifest(name: &str) -> String {
    manifests().join(name).display().to_string()
}

async fn cluster() -> (Cluster, Kubectl) {
    cluster_tests::kubectl::api_cluster().await
}

/// Lines of a table without the header, split into columns.
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_discovery_and_the_articles_manifests() {
    let (_c, k) = cluster().await;

    let version = k.run(&["version"]).await.ok();
    assert!(version.contains("Server Version: v1.32"), "{version}");

    let resources = k.run(&["api-resources"]).await.ok();
    for line in [
        "pods                                po           v1                                true         Pod",
        "deployments                         deploy       apps/v1                           true         Deployment",
    ] {
        let want: Vec<&str> = line.split_whitespace().collect();
        assert!(
            resources
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == want),
            "{resources}"
        );
    }
    let versions = k.run(&["api-versions"]).await.ok();
    for gv in [
        "apps/v1",
        "v1",
        "rbac.authorization.k8s.io/v1",
        "coordination.k8s.io/v1",
    ] {
        assert!(versions.lines().any(|l| l == gv), "{versions}");
    }

    let explain = k.run(&["explain", "deployment.spec"]).await.ok();
    assert!(
        explain.contains("KIND:") && explain.contains("Deployment"),
        "{explain}"
    );
    assert!(explain.contains("replicas"), "{explain}");

    assert_eq!(
        k.run(&["create", "namespace", "dev"]).await.ok().trim(),
        "namespace/dev created"
    );
    let ns = k.run(&["get", "ns"]).await.ok();
    let names: Vec<String> = rows(&ns).into_iter().map(|r| r[0].clone()).collect();
    for n in [
        "default",
        "dev",
        "kube-node-lease",
        "kube-public",
        "kube-system",
    ] {
        assert!(names.contains(&n.to_string()), "{ns}");
    }

    // Each manifest of the articles (namespace.yaml declares dev again: AlreadyExists).
    for (file, want) in [
        ("pod.yaml", "pod/nginx created"),
        ("pod-dev.yaml", "pod/myapp-pod created"),
        (
            "replicationcontroller.yaml",
            "replicationcontroller/myapp-rc created",
        ),
        (
            "replicaset.yaml",
            "replicaset.apps/myapp-replicaset created",
        ),
        (
            "deployment.yaml",
            "deployment.apps/myapp-deployment created",
        ),
        ("service-clusterip.yaml", "service/backend created"),
        ("service-nodeport.yaml", "service/myapp-service created"),
        (
            "service-loadbalancer.yaml",
            "service/voting-app-service created",
        ),
        ("resourcequota.yaml", "resourcequota/compute-quota created"),
    ] {
        let out = k.run(&["create", "-f", &manifest(file)]).await.ok();
        assert_eq!(out.trim(), want, "{file}");
    }
    let again = k
        .run(&["create", "-f", &manifest("namespace.yaml")])
        .await
        .err();
    assert!(
        again.contains("namespaces \"dev\" already exists"),
        "{again}"
    );

    // Output formats.
    let pods = k.run(&["get", "pods"]).await.ok();
    let header: Vec<&str> = pods
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    // The Deployment's ReplicaSet controller adds its own pods beside the article's nginx pod.
    let nginx = rows(&pods)
        .into_iter()
        .find(|r| r[0] == "nginx")
        .unwrap_or_default();
    assert_eq!(nginx[..4], ["nginx", "0/1", "Pending", "0"], "{pods}");
    let wide = k.run(&["get", "pods", "-o", "wide"]).await.ok();
    assert!(
        wide.lines().next().unwrap_or("").contains("IP") && wide.contains("NODE"),
        "{wide}"
    );
    let yaml = k.run(&["get", "pod", "nginx", "-o", "yaml"]).await.ok();
    assert!(
        yaml.contains("restartPolicy: Always") && yaml.contains("dnsPolicy: ClusterFirst"),
        "{yaml}"
    );
    assert!(
        yaml.contains("uid: ") && yaml.contains("resourceVersion: "),
        "{yaml}"
    );
    let json: serde_json::Value = serde_json::from_str(
        &k.run(&["get", "deploy", "myapp-deployment", "-o", "json"])
            .await
            .ok(),
    )
    .expect("json");
    assert_eq!(json["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
    assert_eq!(json["metadata"]["generation"], 1);
    // The articles' two pods, and those the controllers make: three for the
    // ReplicationController, and the Deployment's (which adopted the article's ReplicaSet, as its
    // selector matches it, and rolls from it within maxSurge).
    wait_for("the controllers' pods", Duration::from_secs(60), || async {
        let names = k.run(&["get", "pods", "-A", "-o", "name"]).await.stdout;
        let names: Vec<&str> = names.lines().collect();
        let made_by = |prefix: &str| names.iter().filter(|n| n.starts_with(prefix)).count();
        (names.contains(&"pod/nginx")
            && names.contains(&"pod/myapp-pod")
            && made_by("pod/myapp-rc-") == 3
            && made_by("pod/myapp-deployment-") >= 1)
            .then_some(())
    })
    .await;
    let jp = k
        .run(&[
            "get",
            "svc",
            "myapp-service",
            "-o",
            "jsonpath={.spec.ports[0].nodePort}",
        ])
        .await
        .ok();
    assert_eq!(jp, "30008");
    let cc = k
        .run(&[
            "get",
            "deploy",
            "-o",
            "custom-columns=NAME:.metadata.name,REPLICAS:.spec.replicas",
        ])
        .await
        .ok();
    assert_eq!(rows(&cc), [["myapp-deployment", "3"]]);
    let labelled = k
        .run(&["get", "rs", "-l", "app=myapp", "--show-labels"])
        .await
        .ok();
    assert!(labelled.contains("app=myapp,type=front-end"), "{labelled}");
    assert!(rows(&k.run(&["get", "rs", "-l", "app!=myapp"]).await.ok()).is_empty());
    let dev = k.run(&["get", "pods", "-n", "dev"]).await.ok();
    assert_eq!(rows(&dev)[0][0], "myapp-pod");
    let all = k.run(&["get", "pods", "-A"]).await.ok();
    let namespaces: std::collections::BTreeSet<String> =
        rows(&all).into_iter().map(|r| r[0].clone()).collect();
    assert!(
        namespaces.contains("default") && namespaces.contains("dev"),
        "{all}"
    );

    let svc = k.run(&["get", "svc"]).await.ok();
    let svc_rows = rows(&svc);
    let find = |name: &str| {
        svc_rows
            .iter()
            .find(|r| r[0] == name)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        find("kubernetes")[..3],
        ["kubernetes", "ClusterIP", "10.96.0.1"]
    );
    assert_eq!(find("myapp-service")[1], "NodePort");
    assert_eq!(find("myapp-service")[4], "80:30008/TCP");
    assert_eq!(find("voting-app-service")[3], "<pending>");
    let ips: std::collections::BTreeSet<&String> = svc_rows.iter().map(|r| &r[2]).collect();
    assert_eq!(ips.len(), svc_rows.len(), "ClusterIPs are unique: {svc}");

    let described = k
        .run(&["describe", "deploy", "myapp-deployment"])
        .await
        .ok();
    assert!(
        described.contains("Replicas:") && described.contains("RollingUpdate"),
        "{described}"
    );
    let quota = k.run(&["describe", "quota", "-n", "dev"]).await.ok();
    assert!(quota.contains("pods             1     10"), "{quota}");

    // The quota of the articles: dev holds at most 10 pods and every pod must say its needs.
    let refused = k
        .run(&["run", "extra", "--image=nginx", "-n", "dev"])
        .await
        .err();
    assert!(
        refused.contains("pods \"extra\" is forbidden: failed quota: compute-quota: must specify limits.cpu for: extra"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_changes_objects_every_way_a_user_does() {
    let (_c, k) = cluster().await;
    k.run(&["create", "-f", &manifest("deployment.yaml")])
        .await
        .ok();
    k.run(&["create", "-f", &manifest("pod.yaml")]).await.ok();

    assert_eq!(
        k.run(&["label", "pod", "nginx", "stage=web"])
            .await
            .ok()
            .trim(),
        "pod/nginx labeled"
    );
    let again = k.run(&["label", "pod", "nginx", "stage=db"]).await.err();
    assert!(again.contains("already has a value (web)"), "{again}");
    k.run(&["label", "pod", "nginx", "stage=db", "--overwrite"])
        .await
        .ok();
    assert_eq!(
        k.run(&[
            "get",
            "pod",
            "nginx",
            "-o",
            "jsonpath={.metadata.labels.stage}"
        ])
        .await
        .ok(),
        "db"
    );
    k.run(&["label", "pod", "nginx", "stage-"]).await.ok();
    assert_eq!(
        k.run(&[
            "get",
            "pod",
            "nginx",
            "-o",
            "jsonpath={.metadata.labels.stage}"
        ])
        .await
        .ok(),
        ""
    );
    assert_eq!(
        k.run(&["annotate", "pod", "nginx", "note=hello"])
            .await
            .ok()
            .trim(),
        "pod/nginx annotated"
    );

    assert_eq!(
        k.run(&["scale", "deploy", "myapp-deployment", "--replicas=5"])
            .await
            .ok()
            .trim(),
        "deployment.apps/myapp-deployment scaled"
    );
    assert_eq!(
        k.run(&[
            "get",
            "deploy",
            "myapp-deployment",
            "-o",
            "jsonpath={.spec.replicas} {.metadata.generation}"
        ])
        .await
        .ok(),
        "5 2"
    );
    assert_eq!(
        k.run(&[
            "set",
            "image",
            "deploy/myapp-deployment",
            "nginx-container=nginx:1.27"
        ])
        .await
        .ok()
        .trim(),
        "deployment.apps/myapp-deployment image updated"
    );
    let image = "jsonpath={.spec.template.spec.containers[0].image}";
    assert_eq!(
        k.run(&["get", "deploy", "myapp-deployment", "-o", image])
            .await
            .ok(),
        "nginx:1.27"
    );

    for (ty, patch, want) in [
        (
            "merge",
            r#"{"metadata":{"labels":{"patched":"merge"}}}"#,
            "merge",
        ),
        (
            "json",
            r#"[{"op":"replace","path":"/metadata/labels/patched","value":"json"}]"#,
            "json",
        ),
        (
            "strategic",
            r#"{"metadata":{"labels":{"patched":"strategic"}}}"#,
            "strategic",
        ),
    ] {
        let out = k
            .run(&[
                "patch",
                "deploy",
                "myapp-deployment",
                "--type",
                ty,
                "-p",
                patch,
            ])
            .await
            .ok();
        assert_eq!(out.trim(), "deployment.apps/myapp-deployment patched");
        assert_eq!(
            k.run(&[
                "get",
                "deploy",
                "myapp-deployment",
                "-o",
                "jsonpath={.metadata.labels.patched}"
            ])
            .await
            .ok(),
            want
        );
    }
    // A strategic merge patch merges containers by name.
    k.run(&[
        "patch",
        "deploy",
        "myapp-deployment",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"sidecar","image":"busybox"}]}}}}"#,
    ])
    .await
    .ok();
    let names = k
        .run(&[
            "get",
            "deploy",
            "myapp-deployment",
            "-o",
            "jsonpath={.spec.template.spec.containers[*].name}",
        ])
        .await
        .ok();
    assert_eq!(names, "sidecar nginx-container");

    // Objects from flags.
    for (args, want) in [
        (
            vec![
                "create",
                "configmap",
                "app-config",
                "--from-literal=mode=prod",
            ],
            "configmap/app-config created",
        ),
        (
            vec![
                "create",
                "secret",
                "generic",
                "app-secret",
                "--from-literal=password=s3cret",
            ],
            "secret/app-secret created",
        ),
        (
            vec![
                "create",
                "deployment",
                "web",
                "--image=nginx",
                "--replicas=2",
                "--port=80",
            ],
            "deployment.apps/web created",
        ),
        (
            vec!["create", "service", "clusterip", "web-svc", "--tcp=80:8080"],
            "service/web-svc created",
        ),
        (
            vec![
                "expose",
                "deployment",
                "web",
                "--port=8080",
                "--name=web-exposed",
            ],
            "service/web-exposed exposed",
        ),
    ] {
        assert_eq!(k.run(&args).await.ok().trim(), want, "{args:?}");
    }
    assert_eq!(
        k.run(&[
            "get",
            "secret",
            "app-secret",
            "-o",
            "jsonpath={.data.password}"
        ])
        .await
        .ok(),
        "czNjcmV0"
    );
    assert_eq!(
        k.run(&[
            "get",
            "svc",
            "web-exposed",
            "-o",
            "jsonpath={.spec.selector.app}"
        ])
        .await
        .ok(),
        "web"
    );

    // Deletes: by file, by name, by label.
    assert_eq!(
        k.run(&["delete", "-f", &manifest("deployment.yaml")])
            .await
            .ok()
            .trim(),
        "deployment.apps \"myapp-deployment\" deleted"
    );
    assert_eq!(
        k.run(&["delete", "pod", "nginx"]).await.ok().trim(),
        "pod \"nginx\" deleted"
    );
    assert_eq!(
        k.run(&["delete", "deploy", "-l", "app=web"])
            .await
            .ok()
            .trim(),
        "deployment.apps \"web\" deleted"
    );
    let missing = k.run(&["get", "pod", "nginx"]).await.err();
    assert!(
        missing.contains("Error from server (NotFound): pods \"nginx\" not found"),
        "{missing}"
    );

    // The namespace of the current context.
    k.run(&["create", "namespace", "dev"]).await.ok();
    let set = k
        .run(&["config", "set-context", "--current", "--namespace=dev"])
        .await
        .ok();
    assert!(set.contains("modified"), "{set}");
    k.run(&["create", "configmap", "in-dev", "--from-literal=a=b"])
        .await
        .ok();
    assert_eq!(
        k.run(&[
            "get",
            "cm",
            "in-dev",
            "-o",
            "jsonpath={.metadata.namespace}"
        ])
        .await
        .ok(),
        "dev"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_replace_and_edit() {
    let (c, k) = cluster().await;
    let dir = c.path().join("app");
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("deploy.yaml");
    let write = |labels: &str, image: &str| {
        std::fs::write(
            &file,
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  labels:\n{labels}spec:\n  replicas: 2\n  selector:\n    matchLabels:\n      app: web\n  template:\n    metadata:\n      labels:\n        app: web\n    spec:\n      containers:\n      - name: c\n        image: {image}\n"
            ),
        )
        .expect("write manifest")
    };
    let f = file.display().to_string();
    write("    app: web\n    stage: beta\n", "nginx:1.26");
    assert_eq!(
        k.run(&["apply", "-f", &f]).await.ok().trim(),
        "deployment.apps/web created"
    );
    write("    app: web\n    stage: beta\n", "nginx:1.27");
    assert_eq!(
        k.run(&["apply", "-f", &f]).await.ok().trim(),
        "deployment.apps/web configured"
    );
    write("    app: web\n", "nginx:1.27");
    k.run(&["apply", "-f", &f]).await.ok();
    let live: serde_json::Value =
        serde_json::from_str(&k.run(&["get", "deploy", "web", "-o", "json"]).await.ok())
            .expect("json");
    assert!(live["metadata"]["labels"].get("stage").is_none(), "{live}");
    assert_eq!(
        live["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.27"
    );
    let last = live["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
        .as_str()
        .expect("last-applied annotation");
    assert!(!last.contains("stage"), "{last}");
    assert_eq!(
        k.run(&["apply", "-f", &f]).await.ok().trim(),
        "deployment.apps/web unchanged"
    );

    // Quantities are stored in canonical form, as kube-apiserver stores them.
    let sized = c.path().join("sized.yaml");
    std::fs::write(
        &sized,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: sized\nspec:\n  containers:\n  - name: c\n    image: nginx:1.27\n    resources:\n      requests:\n        cpu: 1000m\n        memory: 1024Mi\n      limits:\n        cpu: \"1.5\"\n        memory: 1.5Gi\n",
    )
    .expect("write");
    let sized = sized.display().to_string();
    k.run(&["apply", "-f", &sized]).await.ok();
    let resources = k
        .run(&[
            "get",
            "pod",
            "sized",
            "-o",
            "jsonpath={.spec.containers[0].resources.requests.cpu} {.spec.containers[0].resources.requests.memory} {.spec.containers[0].resources.limits.cpu} {.spec.containers[0].resources.limits.memory}",
        ])
        .await
        .ok();
    assert_eq!(resources, "1 1Gi 1500m 1536Mi");
    // kubectl's patch puts the manifest's spelling back; the same values are no change to a
    // pod's fixed spec.
    let again = k.run(&["apply", "-f", &sized]).await.ok();
    assert!(again.starts_with("pod/sized "), "{again}");

    // A directory.
    std::fs::write(
        dir.join("cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: \"1\"\n",
    )
    .expect("write");
    let out = k
        .run(&["apply", "-f", &dir.display().to_string()])
        .await
        .ok();
    assert!(
        out.contains("configmap/settings created") && out.contains("deployment.apps/web unchanged"),
        "{out}"
    );

    // Server-side apply and its conflicts.
    let ssa = dir.join("ssa.yaml");
    std::fs::write(
        &ssa,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\ndata:\n  owner: first\n",
    )
    .expect("write");
    let s = ssa.display().to_string();
    assert_eq!(
        k.run(&["apply", "--server-side", "-f", &s])
            .await
            .ok()
            .trim(),
        "configmap/shared serverside-applied"
    );
    std::fs::write(
        &ssa,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\ndata:\n  owner: second\n",
    )
    .expect("write");
    let conflict = k
        .run(&["apply", "--server-side", "--field-manager=other", "-f", &s])
        .await
        .err();
    assert!(conflict.contains("conflict"), "{conflict}");
    k.run(&[
        "apply",
        "--server-side",
        "--field-manager=other",
        "--force-conflicts",
        "-f",
        &s,
    ])
    .await
    .ok();
    assert_eq!(
        k.run(&["get", "cm", "shared", "-o", "jsonpath={.data.owner}"])
            .await
            .ok(),
        "second"
    );
    let managers = k
        .run(&[
            "get",
            "cm",
            "shared",
            "--show-managed-fields",
            "-o",
            "jsonpath={.metadata.managedFields[*].manager}",
        ])
        .await
        .ok();
    assert!(managers.contains("other"), "{managers}");

    // replace and replace --force.
    write("    app: web\n", "nginx:1.28");
    assert_eq!(
        k.run(&["replace", "-f", &f]).await.ok().trim(),
        "deployment.apps/web replaced"
    );
    let uid = k
        .run(&["get", "deploy", "web", "-o", "jsonpath={.metadata.uid}"])
        .await
        .ok();
    let forced = k.run(&["replace", "--force", "-f", &f]).await.ok();
    assert!(
        forced.contains("deployment.apps \"web\" deleted")
            && forced.contains("deployment.apps/web replaced"),
        "{forced}"
    );
    let new_uid = k
        .run(&["get", "deploy", "web", "-o", "jsonpath={.metadata.uid}"])
        .await
        .ok();
    assert_ne!(uid, new_uid);

    // edit with an editor that changes the replicas.
    let editor = dir.join("editor.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nsed -i 's/^  replicas: 2$/  replicas: 4/' \"$1\"\n",
    )
    .expect("write");
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let edited = k
        .with_env("EDITOR", &editor.display().to_string())
        .run(&["edit", "deploy", "web"])
        .await
        .ok();
    assert_eq!(edited.trim(), "deployment.apps/web edited");
    assert_eq!(
        k.run(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"])
            .await
            .ok(),
        "4"
    );

    // Optimistic concurrency: a stale replace is a Conflict.
    let mut stale: serde_json::Value =
        serde_json::from_str(&k.run(&["get", "deploy", "web", "-o", "json"]).await.ok())
            .expect("json");
    k.run(&["scale", "deploy", "web", "--replicas=1"])
        .await
        .ok();
    stale["spec"]["replicas"] = serde_json::json!(7);
    let conflict = k
        .run_with_input(&["replace", "-f", "-"], &stale.to_string())
        .await
        .err();
    assert!(conflict.contains("the object has been modified; please apply your changes to the latest version and try again"), "{conflict}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_watch_works_on_every_server_and_across_a_leader_change() {
    let (c, k) = cluster().await;
    let (mut child, mut lines) = k.spawn_lines(&["get", "pods", "-w", "--context", "rkube-n2"]);
    k.run(&["create", "-f", &manifest("pod.yaml")]).await.ok();
    wait_line(&mut lines, &["nginx", "Pending"], Duration::from_secs(30)).await;
    k.run(&["label", "pod", "nginx", "seen=yes"]).await.ok();
    // A label change is a MODIFIED event: kubectl prints the row again.
    wait_line(&mut lines, &["nginx"], Duration::from_secs(30)).await;
    let _ = child.kill().await;

    // Kill the leader; every remaining server keeps answering kubectl.
    let leader = c.wait_leader().await;
    c.kill(leader).await;
    c.wait_new_leader(leader).await;
    for i in (0..3).filter(|i| *i != leader) {
        let ctx = format!("rkube-{}", c.members[i].name);
        let name = format!("after-{i}");
        wait_for(
            "a write through a surviving server",
            Duration::from_secs(30),
            || {
                let (k, ctx, name) = (&k, &ctx, &name);
                async move {
                    k.run(&[
                        "--context",
                        ctx,
                        "create",
                        "configmap",
                        name,
                        "--from-literal=a=b",
                    ])
                    .await
                    .success
                    .then_some(())
                }
            },
        )
        .await;
        let got = k
            .run(&["--context", &ctx, "get", "cm", "-o", "name"])
            .await
            .ok();
        assert!(got.contains(&format!("configmap/{name}")), "{got}");
    }
}

/// The control-plane endpoint survives the loss of any member: kubectl with the kubeconfig
/// `rkube up` wrote, and etcdctl with DIR/env, unchanged, work again within 3 s of the new
/// leader whichever member is killed (the leader, the new leader the kubeconfig reached next,
/// a follower), as kube-vip's address moves with the leadership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_in_the_kubeconfig_survives_killing_each_member_in_turn() {
    let (c, k) = cluster().await;
    let kubeconfig = std::fs::read_to_string(k.kubeconfig()).expect("kubeconfig");
    assert!(
        kubeconfig.contains("current-context: rkube\n"),
        "the endpoint's context is current: {kubeconfig}"
    );
    let etcdctl =
        cluster_tests::etcdctl::Etcdctl::from_env_file(&c.path().join("env")).expect("DIR/env");
    assert_eq!(etcdctl.endpoints().len(), 1, "DIR/env names the endpoint");
    let ok = || async {
        let out = k
            .run(&["get", "ns", "default", "-o", "name", "--request-timeout=2s"])
            .await;
        (out.success && out.stdout.trim() == "namespace/default").then_some(())
    };
    let holders = || async {
        let mut held = Vec::new();
        for i in 0..3 {
            if c.metric(i, "rkube_endpoint_held").await == Some(1.0) {
                held.push(i);
            }
        }
        held
    };
    let mut killed = Vec::new();
    for round in 0..3 {
        let leader = c.wait_leader().await;
        wait_for(
            "the leader to hold the endpoint",
            Duration::from_secs(30),
            || async { (holders().await == vec![leader]).then_some(()) },
        )
        .await;
        // The leader twice (the second time the one the kubeconfig reached after the first
        // failover), then the member not killed yet, a follower.
        let victim = if round < 2 {
            leader
        } else {
            (0..3).find(|i| !killed.contains(i)).expect("a member left")
        };
        killed.push(victim);
        c.kill(victim).await;
        let since = if victim == leader {
            c.wait_new_leader(victim).await;
            std::time::Instant::now()
        } else {
            std::time::Instant::now()
        };
        wait_for("kubectl through the endpoint", Duration::from_secs(30), ok).await;
        let took = since.elapsed();
        eprintln!(
            "round {round}: killed n{} (leader n{}), kubectl through the endpoint after {took:?}",
            victim + 1,
            leader + 1
        );
        assert!(
            took <= Duration::from_secs(3),
            "round {round}: kubectl through the endpoint succeeded {took:?} after the new leader (killed n{})\n{}",
            victim + 1,
            c.logs()
        );
        etcdctl
            .ok(&["put", &format!("/endpoint/{round}"), "x"])
            .await;
        c.restart_missing()
            .await
            .expect("the killed member restarts");
        c.wait_converged(&[0, 1, 2]).await;
    }
    assert_eq!(
        std::fs::read_to_string(k.kubeconfig()).expect("kubeconfig"),
        kubeconfig,
        "the kubeconfig is unchanged"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/endpoint/", "--prefix", "--keys-only"])
            .await,
        "/endpoint/0\n\n/endpoint/1\n\n/endpoint/2\n\n"
    );
}

/// The (kind, namespace, name) of every document of a `rkube backup export` file.
fn exported_objects(yaml: &str) -> std::collections::BTreeSet<(String, String, String)> {
    yaml.split("\n---\n")
        .filter_map(|doc| {
            let v: serde_json::Value = serde_yaml::from_str(doc).ok()?;
            let s = |p: &str| {
                v.pointer(p)
                    .and_then(|x| x.as_str())
                    .unwrap_or("")
                    .to_string()
            };
            (!s("/kind").is_empty())
                .then(|| (s("/kind"), s("/metadata/namespace"), s("/metadata/name")))
        })
        .collect()
}

/// `rkube backup VERB --dir DIR FILE`, which must succeed; its standard error.
fn rkube_backup(verb: &str, c: &Cluster, file: &std::path::Path) -> String {
    let out = std::process::Command::new(cluster_tests::rkube_bin())
        .args(["backup", verb, "--dir"])
        .arg(c.path())
        .arg(file)
        .output()
        .expect("rkube runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "rkube backup {verb}: {stderr}");
    stderr
}

async fn pods_of(k: &Kubectl, ns: &str, selector: &str) -> usize {
    k.run(&["get", "pods", "-n", ns, "-l", selector, "--no-headers"])
        .await
        .stdout
        .lines()
        .count()
}

/// Seed article 001's lesson as a command: `rkube backup export` keeps the desired state
/// (what was declared, in an order `kubectl apply` can take), not what the cluster derived;
/// applied to a fresh cluster with kubectl, or imported with `rkube backup import`, the same
/// objects exist and the controllers bring the pods back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_desired_state_backup_recreates_the_cluster_in_a_new_one() {
    let start = |servers| async move {
        let c = Cluster::start(cluster_tests::Options {
            servers,
            kubernetes_api: true,
            agents: 1,
            ..cluster_tests::Options::default()
        })
        .await
        .expect("cluster starts");
        c.wait_leader().await;
        let k = Kubectl::from_env_file(&c.path().join("env"), &c.path().join("home")).expect("env");
        wait_for("the default namespace", Duration::from_secs(60), || async {
            k.run(&["get", "ns", "default", "-o", "name"])
                .await
                .success
                .then_some(())
        })
        .await;
        (c, k)
    };
    let (a, ka) = start(3).await;
    for m in [
        "namespace.yaml",
        "deployment.yaml",
        "pod-dev.yaml",
        "resourcequota.yaml",
        "service-clusterip.yaml",
    ] {
        ka.run(&["apply", "-f", &manifest(m)]).await.ok();
    }
    for args in [
        &[
            "create",
            "secret",
            "generic",
            "db",
            "--from-literal=password=s3cret",
        ][..],
        &["create", "serviceaccount", "ci", "-n", "dev"],
        &[
            "create",
            "role",
            "pod-reader",
            "-n",
            "dev",
            "--verb=get,list",
            "--resource=pods",
        ],
        &[
            "create",
            "rolebinding",
            "ci-reads",
            "-n",
            "dev",
            "--role=pod-reader",
            "--serviceaccount=dev:ci",
        ],
        &[
            "create",
            "clusterrole",
            "ns-viewer",
            "--verb=get,list",
            "--resource=namespaces",
        ],
    ] {
        ka.run(args).await.ok();
    }
    wait_for(
        "the deployment's 3 pods in A",
        Duration::from_secs(60),
        || async { (pods_of(&ka, "default", "app=myapp").await == 3).then_some(()) },
    )
    .await;

    // Kept apart from the clusters' directories, which go with them.
    let backups = tempfile::tempdir().expect("temp dir");
    let out = backups.path().join("desired.yaml");
    rkube_backup("export", &a, &out);
    let yaml = std::fs::read_to_string(&out).expect("the export file");
    let objects = exported_objects(&yaml);
    let want: std::collections::BTreeSet<(String, String, String)> = [
        ("Namespace", "", "dev"),
        ("ClusterRole", "", "ns-viewer"),
        ("Role", "dev", "pod-reader"),
        ("RoleBinding", "dev", "ci-reads"),
        ("ServiceAccount", "dev", "ci"),
        ("ResourceQuota", "dev", "compute-quota"),
        ("Secret", "default", "db"),
        ("Deployment", "default", "myapp-deployment"),
        ("Pod", "dev", "myapp-pod"),
        ("Service", "default", "backend"),
    ]
    .into_iter()
    .map(|(k, ns, n)| (k.to_string(), ns.to_string(), n.to_string()))
    .collect();
    assert_eq!(objects, want, "{yaml}");
    // Nothing the server set: no identities, versions, status or allocated ClusterIP.
    for field in [
        "uid:",
        "resourceVersion:",
        "creationTimestamp:",
        "managedFields:",
        "\nstatus:",
        "clusterIP: 10.",
        "nodeName:",
    ] {
        assert!(!yaml.contains(field), "the export has {field}\n{yaml}");
    }
    // Namespaces first, RBAC before the workloads, Services after them.
    let at = |kind: &str| {
        yaml.find(&format!("\nkind: {kind}\n"))
            .unwrap_or(usize::MAX)
    };
    assert!(at("Namespace") < at("Role"));
    assert!(at("RoleBinding") < at("Deployment"));
    assert!(at("Deployment") < at("Service"));
    // The quota came after the dev pod in A (which has no limits): it must come after it here.
    assert!(at("Pod") < at("ResourceQuota"));
    drop(a);

    // Into a fresh cluster with kubectl.
    let (b, kb) = start(1).await;
    kb.run(&["apply", "-f", &out.display().to_string(), "-R"])
        .await
        .ok();
    wait_for(
        "the deployment's 3 pods in B",
        Duration::from_secs(60),
        || async { (pods_of(&kb, "default", "app=myapp").await == 3).then_some(()) },
    )
    .await;
    let again = b.path().join("again.yaml");
    rkube_backup("export", &b, &again);
    assert_eq!(
        exported_objects(&std::fs::read_to_string(&again).unwrap()),
        want,
        "cluster B holds the same desired state"
    );
    assert_eq!(
        kb.run(&["get", "secret", "db", "-o", "jsonpath={.data.password}"])
            .await
            .ok(),
        "czNjcmV0"
    );
    drop(b);

    // And with `rkube backup import`, which applies server-side.
    let (c, kc) = start(1).await;
    let said = rkube_backup("import", &c, &out);
    assert!(said.contains("applied 10 objects"), "{said}");
    wait_for(
        "the deployment's 3 pods in C",
        Duration::from_secs(60),
        || async { (pods_of(&kc, "default", "app=myapp").await == 3).then_some(()) },
    )
    .await;
    kc.run(&["get", "rolebinding", "ci-reads", "-n", "dev"])
        .await
        .ok();
    // Bad input is refused with the document it is in.
    let bad = c.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ok\n---\nkind: Pod\n",
    )
    .unwrap();
    let refused = std::process::Command::new(cluster_tests::rkube_bin())
        .args(["backup", "import", "--dir"])
        .arg(c.path())
        .arg(&bad)
        .output()
        .expect("rkube runs");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("document 2 is not a Kubernetes object"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// The keys of a JSON object, in the order they were written.
fn keys_of(v: &serde_json::Value) -> Vec<&str> {
    v.as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// Whether `wanted` appear in `keys` in this order (others may sit between them).
fn in_order(keys: &[&str], wanted: &[&str]) -> bool {
    let at: Vec<Option<usize>> = wanted
        .iter()
        .map(|w| keys.iter().position(|k| k == w))
        .collect();
    at.iter().all(Option::is_some) && at.windows(2).all(|p| p[0] < p[1])
}

/// Discovery documents are Go structs too, and a managedFields entry is written as Go's
/// ManagedFieldsEntry with its field set as structured-merge-diff writes it ('.' first, then
/// fields by name, list elements by key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_and_managed_fields_come_back_in_kube_apiservers_order() {
    let (_c, k) = cluster().await;
    let raw = k.run(&["get", "--raw", "/apis/apps"]).await.ok();
    let group: serde_json::Value = serde_json::from_str(&raw).expect("an APIGroup");
    assert_eq!(
        keys_of(&group),
        ["kind", "apiVersion", "name", "versions", "preferredVersion"],
        "{raw}"
    );
    let raw = k.run(&["get", "--raw", "/apis/apps/v1"]).await.ok();
    let list: serde_json::Value = serde_json::from_str(&raw).expect("an APIResourceList");
    let scale = list["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == "deployments/scale")
        .expect("deployments/scale is listed");
    assert_eq!(
        keys_of(scale),
        [
            "name",
            "singularName",
            "namespaced",
            "group",
            "version",
            "kind",
            "verbs"
        ],
        "{raw}"
    );

    let manifest = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: ordered
  labels: {z: "1", a: "2"}
spec:
  selector: {matchLabels: {app: ordered}}
  template:
    metadata: {labels: {app: ordered}}
    spec:
      containers:
      - {name: web, image: "nginx:1.27", ports: [{containerPort: 10}, {containerPort: 9}]}
      - {name: side, image: "nginx:1.27"}
"#;
    k.run_with_input(&["apply", "--server-side", "-f", "-"], manifest)
        .await
        .ok();
    let raw = k
        .run(&[
            "get",
            "--raw",
            "/apis/apps/v1/namespaces/default/deployments/ordered",
        ])
        .await
        .ok();
    let d: serde_json::Value = serde_json::from_str(&raw).expect("a deployment");
    let entry = &d["metadata"]["managedFields"][0];
    assert_eq!(
        keys_of(entry),
        [
            "manager",
            "operation",
            "apiVersion",
            "time",
            "fieldsType",
            "fieldsV1"
        ],
        "{raw}"
    );
    let fields = &entry["fieldsV1"];
    assert_eq!(keys_of(fields), ["f:metadata", "f:spec"], "{raw}");
    assert_eq!(
        keys_of(&fields["f:metadata"]["f:labels"]),
        ["f:a", "f:z"],
        "{raw}"
    );
    assert_eq!(
        keys_of(&fields["f:spec"]),
        ["f:selector", "f:template"],
        "{raw}"
    );
    let containers = &fields["f:spec"]["f:template"]["f:spec"]["f:containers"];
    assert_eq!(
        keys_of(containers),
        [r#"k:{"name":"side"}"#, r#"k:{"name":"web"}"#],
        "{raw}"
    );
    let web = &containers[r#"k:{"name":"web"}"#];
    assert_eq!(keys_of(web), [".", "f:image", "f:name", "f:ports"], "{raw}");
    // Keyed by number and protocol (TCP when left out), as kube-apiserver keys ports.
    assert_eq!(
        keys_of(&web["f:ports"]),
        [
            r#"k:{"containerPort":9,"protocol":"TCP"}"#,
            r#"k:{"containerPort":10,"protocol":"TCP"}"#
        ],
        "{raw}"
    );

    // A Service serving port 53 over UDP and TCP keeps both ports, and dropping one from the
    // applied manifest removes that one alone.
    let dns = |ports: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: dns\nspec:\n  selector: {{app: dns}}\n  ports:\n{ports}"
        )
    };
    let both = "  - {name: dns, port: 53, protocol: UDP}\n  - {name: dns-tcp, port: 53}\n";
    k.run_with_input(&["apply", "--server-side", "-f", "-"], &dns(both))
        .await
        .ok();
    let ports = [
        "get",
        "svc",
        "dns",
        "-o",
        "jsonpath={range .spec.ports[*]}{.name}/{.port}/{.protocol} {end}",
    ];
    assert_eq!(k.run(&ports).await.ok().trim(), "dns/53/UDP dns-tcp/53/TCP");
    k.run_with_input(
        &["apply", "--server-side", "-f", "-"],
        &dns("  - {name: dns-tcp, port: 53}\n"),
    )
    .await
    .ok();
    assert_eq!(k.run(&ports).await.ok().trim(), "dns-tcp/53/TCP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_and_statuses_come_back_in_kube_apiservers_field_order() {
    let (c, k) = cluster().await;
    // Posted as it is (`create --raw`), with every object's fields in reverse order.
    let pod = r#"{"status": {},
        "spec": {"schedulerName": "default-scheduler", "restartPolicy": "Never",
                 "containers": [{"imagePullPolicy": "IfNotPresent", "image": "nginx:1.27", "name": "c"}]},
        "metadata": {"labels": {"b": "2", "a": "1"}, "namespace": "default", "name": "reversed"},
        "apiVersion": "v1", "kind": "Pod"}"#;
    // The create's answer is in order too, as kube-apiserver encodes the object it stored.
    let created = k
        .run_with_input(
            &[
                "create",
                "--raw",
                "/api/v1/namespaces/default/pods",
                "-f",
                "-",
            ],
            pod,
        )
        .await
        .ok();
    let start = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"reversed","namespace":"default","uid":""#;
    assert!(created.starts_with(start), "{created}");

    let raw = k
        .run(&["get", "--raw", "/api/v1/namespaces/default/pods/reversed"])
        .await
        .ok();
    assert!(raw.starts_with(start), "{raw}");
    // So is an update's, whatever order its body had.
    let mut sent: serde_json::Value = serde_json::from_str(&raw).expect("a pod");
    let reversed: serde_json::Map<String, serde_json::Value> = sent
        .as_object()
        .map(|m| m.clone().into_iter().rev().collect())
        .unwrap_or_default();
    sent = serde_json::Value::Object(reversed);
    sent["metadata"]["annotations"] = serde_json::json!({"y": "1", "x": "2"});
    let replaced = k
        .run_with_input(
            &[
                "replace",
                "--raw",
                "/api/v1/namespaces/default/pods/reversed",
                "-f",
                "-",
            ],
            &sent.to_string(),
        )
        .await
        .ok();
    assert!(replaced.starts_with(start), "{replaced}");
    let answer: serde_json::Value = serde_json::from_str(&replaced).expect("a pod");
    assert!(
        in_order(
            &keys_of(&answer["metadata"]),
            &[
                "name",
                "resourceVersion",
                "creationTimestamp",
                "labels",
                "annotations"
            ]
        ),
        "{replaced}"
    );
    assert_eq!(keys_of(&answer["metadata"]["annotations"]), ["x", "y"]);
    let pod: serde_json::Value = serde_json::from_str(&raw).expect("a pod");
    assert_eq!(
        keys_of(&pod),
        ["kind", "apiVersion", "metadata", "spec", "status"],
        "{raw}"
    );
    let meta = keys_of(&pod["metadata"]);
    assert_eq!(
        meta[..6],
        [
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "labels"
        ],
        "{raw}"
    );
    assert_eq!(keys_of(&pod["metadata"]["labels"]), ["a", "b"], "{raw}");
    let spec = keys_of(&pod["spec"]);
    assert!(
        in_order(
            &spec,
            &["containers", "restartPolicy", "dnsPolicy", "schedulerName"]
        ),
        "{raw}"
    );
    assert!(
        in_order(
            &keys_of(&pod["spec"]["containers"][0]),
            &["name", "image", "imagePullPolicy"]
        ),
        "{raw}"
    );

    // A list, and a watch event, copy the stored order.
    let raw = k
        .run(&["get", "--raw", "/api/v1/namespaces/default/pods"])
        .await
        .ok();
    let list: serde_json::Value = serde_json::from_str(&raw).expect("a list");
    assert_eq!(
        keys_of(&list),
        ["kind", "apiVersion", "metadata", "items"],
        "{raw}"
    );
    assert_eq!(
        keys_of(&list["items"][0])[..3],
        ["metadata", "spec", "status"],
        "a typed list's items carry no kind or apiVersion: {raw}"
    );
    assert_eq!(
        keys_of(&list["items"][0]["metadata"])[..2],
        ["name", "namespace"]
    );
    let raw = k
        .run(&[
            "get",
            "--raw",
            "/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1&fieldSelector=metadata.name=reversed",
        ])
        .await
        .ok();
    let event: serde_json::Value =
        serde_json::from_str(raw.lines().next().unwrap_or("")).expect("a watch event");
    assert_eq!(keys_of(&event), ["type", "object"], "{raw}");
    assert_eq!(
        keys_of(&event["object"]),
        ["kind", "apiVersion", "metadata", "spec", "status"],
        "{raw}"
    );

    // A 404, byte for byte as kube-apiserver 1.32 writes it.
    let client = crate::kube_client::client_of(&c, 0).await;
    let request = http::Request::get("/api/v1/namespaces/default/pods/nope")
        .body(kube::client::Body::from(Vec::new()))
        .expect("a request");
    let answer = client.send(request).await.expect("an answer");
    assert_eq!(answer.status().as_u16(), 404);
    let body = answer.into_body().collect_bytes().await.expect("a body");
    assert_eq!(
        String::from_utf8_lossy(&body),
        concat!(
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
            r#""message":"pods \"nope\" not found","reason":"NotFound","#,
            r#""details":{"name":"nope","kind":"pods"},"code":404}"#,
            "\n"
        )
    );
}
