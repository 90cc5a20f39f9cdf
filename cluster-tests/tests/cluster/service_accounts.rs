//! Pods that talk to the API, on real containers (`rkube up --runtime cri`): a pod gets its
//! ServiceAccount's bound token, the cluster CA and its namespace in the projected
//! `kube-api-access-*` volume and the `kubernetes` Service's address in its environment, so a
//! kubectl inside it (the host's static kubectl in an image built here) finds the API with its
//! in-cluster config, through the Service's ClusterIP, and may do what its Role allows and
//! nothing else; the agent renews the token when it is due. `kube-root-ca.crt` is in every
//! namespace and comes back when deleted; the `kubernetes` Service has an address per member in
//! its core Endpoints, which a member leaves while it is down and when it is removed from the
//! cluster; a node's agent gets tokens only bound to its pods; the pod's token stops working
//! once the pod is gone.

use std::path::Path;
use std::time::Duration;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::{rkube_bin, wait_for, Cluster, ClusterClient, Options};
use rkube_store::proto::etcdserverpb as pb;

const BOUND: Duration = Duration::from_secs(90);
const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The API server's URL in the admin's kubeconfig.
fn server_url(k: &Kubectl) -> String {
    std::fs::read_to_string(k.kubeconfig())
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_string))
        .expect("the kubeconfig names a server")
}

/// kubectl's flags to reach the cluster with `credential` flags instead of the kubeconfig's.
fn as_other(k: &Kubectl, dir: &Path, credential: &[String]) -> Vec<String> {
    let mut args = vec![
        "--kubeconfig=/dev/null".into(),
        format!("--server={}", server_url(k)),
        format!(
            "--certificate-authority={}",
            dir.join("pki").join("ca.crt").display()
        ),
    ];
    args.extend_from_slice(credential);
    args
}

/// kubectl on this machine with only a bearer token.
fn with_token(k: &Kubectl, dir: &Path, token: &str) -> Vec<String> {
    as_other(k, dir, &[format!("--token={token}")])
}

/// kubectl on this machine as a node's agent (its client certificate).
fn as_node(k: &Kubectl, dir: &Path, node: &str) -> Vec<String> {
    let pem = dir
        .join("agents")
        .join(node)
        .join("kubelet-client-current.pem");
    as_other(
        k,
        dir,
        &[
            format!("--client-certificate={}", pem.display()),
            format!("--client-key={}", pem.display()),
        ],
    )
}

/// The addresses (ip:port) in the kubernetes Service's core Endpoints.
async fn kubernetes_endpoints(k: &Kubectl) -> Vec<String> {
    k.run(&[
        "get",
        "endpoints",
        "kubernetes",
        "-o",
        "jsonpath={range .subsets[*]}{.addresses[0].ip}:{.ports[0].port}{\" \"}{end}",
    ])
    .await
    .stdout
    .split_whitespace()
    .map(str::to_string)
    .collect()
}

#[tokio::test]
async fn a_pod_uses_the_api_with_its_service_account_and_only_as_its_role_allows() {
    let images = tempfile::tempdir().unwrap();
    cluster_tests::build_images(images.path());
    let image = images.path().join("kubectl.tar");
    assert!(
        image.exists(),
        "the kubectl image is built from a static kubectl on PATH (`file -L $(command -v kubectl)`)"
    );
    let c = Cluster::start(Options {
        kubernetes_api: true,
        agents: 1,
        up_args: vec!["--runtime".into(), "cri".into()],
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    let k = Kubectl::from_env_file(&c.path().join("env"), &c.path().join("home")).expect("env");
    k.wait_nodes_ready(&["agent1"]).await;
    let load = std::process::Command::new(rkube_bin())
        .args(["image", "load", "--dir"])
        .arg(c.path())
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        load.status.success(),
        "{}{}",
        String::from_utf8_lossy(&load.stdout),
        String::from_utf8_lossy(&load.stderr)
    );
    let ca = std::fs::read_to_string(c.path().join("pki").join("ca.crt")).unwrap();

    // The kubernetes Service: its ClusterIP, and an address per member in its Endpoints.
    let cluster_ip = k
        .run(&[
            "get",
            "service",
            "kubernetes",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .await
        .ok();
    assert_eq!(cluster_ip, "10.96.0.1");
    wait_for("an endpoint per member", BOUND, || async {
        (kubernetes_endpoints(&k).await.len() == 3).then_some(())
    })
    .await;
    // The members renew their Leases; their slices are written only when they change.
    let slice_versions = || async {
        k.run(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=kubernetes",
            "-o",
            "jsonpath={.items[*].metadata.resourceVersion}",
        ])
        .await
        .ok()
    };
    let lease_version = || async {
        k.run(&[
            "get",
            "lease",
            "-n",
            "kube-system",
            "kube-apiserver-n1",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
        .await
        .stdout
    };
    let slices_before = slice_versions().await;
    let mut lease = lease_version().await;
    for renewal in ["a renewal of n1's Lease", "another renewal of n1's Lease"] {
        lease = wait_for(renewal, BOUND, || async {
            let now = lease_version().await;
            (!now.is_empty() && now != lease).then_some(now)
        })
        .await;
    }
    assert_eq!(slice_versions().await, slices_before);

    // A namespace with a ServiceAccount that may read ConfigMaps there, and nothing else.
    let setup = r#"{"apiVersion":"v1","kind":"List","items":[
      {"apiVersion":"v1","kind":"Namespace","metadata":{"name":"team"}},
      {"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"reader","namespace":"team"}},
      {"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"hello","namespace":"team"},"data":{"a":"b"}},
      {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{"name":"cm-reader","namespace":"team"},
       "rules":[{"apiGroups":[""],"resources":["configmaps"],"verbs":["get","list","watch"]}]},
      {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":"reader","namespace":"team"},
       "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"cm-reader"},
       "subjects":[{"kind":"ServiceAccount","name":"reader","namespace":"team"}]},
      {"apiVersion":"v1","kind":"Pod","metadata":{"name":"client","namespace":"team"},
       "spec":{"serviceAccountName":"reader","terminationGracePeriodSeconds":1,
               "containers":[{"name":"c","image":"rkube.local/kubectl:1","command":["sleep","3600"]}]}}]}"#;
    k.run_with_input(&["apply", "-f", "-"], setup).await.ok();

    // The cluster CA is published in every namespace, and comes back when deleted.
    let published = |ns: &'static str| {
        let k = &k;
        async move {
            k.run(&[
                "get",
                "configmap",
                "kube-root-ca.crt",
                "-n",
                ns,
                "-o",
                "jsonpath={.data.ca\\.crt}",
            ])
            .await
            .stdout
        }
    };
    for ns in ["default", "team"] {
        wait_for(&format!("kube-root-ca.crt in {ns}"), BOUND, || async {
            (published(ns).await.trim() == ca.trim()).then_some(())
        })
        .await;
    }
    k.run(&["delete", "configmap", "kube-root-ca.crt", "-n", "team"])
        .await
        .ok();
    wait_for("kube-root-ca.crt made again", BOUND, || async {
        (published("team").await.trim() == ca.trim()).then_some(())
    })
    .await;

    // The pod as admission made it: the projected volume, mounted read-only.
    let spec = k
        .run(&[
            "get",
            "pod",
            "client",
            "-n",
            "team",
            "-o",
            "jsonpath={.spec.volumes[0].name} {.spec.volumes[0].projected.sources[0].serviceAccountToken.expirationSeconds} {.spec.containers[0].volumeMounts[0].mountPath} {.spec.containers[0].volumeMounts[0].readOnly}",
        ])
        .await
        .ok();
    let words: Vec<&str> = spec.split(' ').collect();
    assert!(
        words[0].starts_with("kube-api-access-") && words[0].len() == 21,
        "{spec}"
    );
    assert_eq!(words[1..], ["3607", TOKEN_DIR, "true"], "{spec}");
    let ready = k
        .run(&[
            "wait",
            "--for=condition=Ready",
            "pod/client",
            "-n",
            "team",
            "--timeout=90s",
        ])
        .await;
    assert!(ready.success, "{}{}", ready.stdout, ready.stderr);
    let exec = |args: &[&str]| {
        let mut all = vec!["exec", "-n", "team", "client", "--"];
        all.extend_from_slice(args);
        let all: Vec<String> = all.into_iter().map(str::to_string).collect();
        let k = &k;
        async move {
            let refs: Vec<&str> = all.iter().map(String::as_str).collect();
            k.run(&refs).await
        }
    };
    let files = exec(&["sh", "-c", &format!("cat {TOKEN_DIR}/namespace; echo; cat {TOKEN_DIR}/ca.crt; echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT $KUBERNETES_PORT_443_TCP")])
        .await
        .ok();
    assert!(files.starts_with("team\n"), "{files}");
    assert!(files.contains(ca.trim()), "{files}");
    assert!(
        files
            .trim_end()
            .ends_with("10.96.0.1:443 tcp://10.96.0.1:443"),
        "{files}"
    );

    // kubectl in the pod, with the in-cluster config: what the Role allows...
    let allowed = exec(&["kubectl", "get", "configmaps", "-o", "name"]).await;
    assert!(
        allowed.success,
        "in-cluster kubectl: {}{}",
        allowed.stdout, allowed.stderr
    );
    for cm in ["configmap/hello", "configmap/kube-root-ca.crt"] {
        assert!(allowed.stdout.contains(cm), "{}", allowed.stdout);
    }
    // ...and nothing else, in Kubernetes' words.
    let secrets = exec(&["kubectl", "get", "secrets"]).await.err();
    assert!(
        secrets.contains(r#"Error from server (Forbidden): secrets is forbidden: User "system:serviceaccount:team:reader" cannot list resource "secrets" in API group "" in the namespace "team""#),
        "{secrets}"
    );
    let elsewhere = exec(&["kubectl", "get", "configmaps", "-n", "default"])
        .await
        .err();
    assert!(
        elsewhere.contains(r#"configmaps is forbidden: User "system:serviceaccount:team:reader" cannot list resource "configmaps" in API group "" in the namespace "default""#),
        "{elsewhere}"
    );

    // A node gets tokens only bound to a pod it runs (NodeRestriction).
    let uid = k
        .run(&[
            "get",
            "pod",
            "client",
            "-n",
            "team",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .await
        .ok();
    let node_token = |extra: &[&str]| {
        let mut args = as_node(&k, c.path(), "agent1");
        args.extend(["create", "token", "reader", "-n", "team"].map(String::from));
        args.extend(extra.iter().map(|s| s.to_string()));
        let k = &k;
        async move {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            k.run(&refs).await
        }
    };
    let unbound = node_token(&[]).await.err();
    assert!(
        unbound.contains(
            r#"serviceaccounts "reader" is forbidden: node requested token not bound to a pod"#
        ),
        "{unbound}"
    );
    let bound = node_token(&[
        "--bound-object-kind=Pod",
        "--bound-object-name=client",
        &format!("--bound-object-uid={uid}"),
    ])
    .await
    .ok();
    assert_eq!(bound.trim().split('.').count(), 3, "a JWT: {bound}");

    // The agent renews a token once 80% of its life has passed. A token file that says it was
    // issued an hour ago (its claims only: the agent reads them to time the renewal) is
    // replaced by a fresh token within the agent's check, and the container sees the new one.
    let volume = c
        .path()
        .join("agents/agent1/volumes")
        .join(&uid)
        .join("volumes")
        .join(words[0]);
    let current = volume.join("..data").join("token");
    assert!(current.exists(), "{}", current.display());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let b64 = |v: &str| {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v)
    };
    let aged = format!(
        "{}.{}.old",
        b64(r#"{"alg":"ES256","typ":"JWT"}"#),
        b64(&format!(r#"{{"iat":{},"exp":{}}}"#, now - 3600, now + 7))
    );
    std::fs::write(&current, &aged).unwrap();
    assert_eq!(
        exec(&["cat", &format!("{TOKEN_DIR}/token")]).await.ok(),
        aged
    );
    wait_for("the aged token renewed", BOUND, || async {
        let seen = exec(&["cat", &format!("{TOKEN_DIR}/token")]).await.stdout;
        (!seen.is_empty() && seen != aged).then_some(())
    })
    .await;

    // The token is bound to the pod: it works from here too, until the pod is gone.
    let token = exec(&["cat", &format!("{TOKEN_DIR}/token")]).await.ok();
    let mut args = with_token(&k, c.path(), token.trim());
    args.extend(["get", "configmap", "hello", "-n", "team", "-o", "name"].map(String::from));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(k.run(&refs).await.ok().trim(), "configmap/hello");
    k.run(&[
        "delete",
        "pod",
        "client",
        "-n",
        "team",
        "--wait=true",
        "--timeout=60s",
    ])
    .await
    .ok();
    let refused = k.run(&refs).await.err();
    assert!(
        refused.contains("error: You must be logged in to the server (Unauthorized)"),
        "{refused}"
    );

    // A member that stops is taken out of the endpoints once its Lease runs out (15 s), and
    // is back when it is.
    let leader = c.wait_leader().await;
    let victim = if leader == 0 { 1 } else { 0 };
    c.kill(victim).await;
    wait_for("the stopped member out of the endpoints", BOUND, || async {
        (kubernetes_endpoints(&k).await.len() == 2).then_some(())
    })
    .await;
    c.restart_missing().await.expect("the member restarts");
    wait_for("the member back in the endpoints", BOUND, || async {
        (kubernetes_endpoints(&k).await.len() == 3).then_some(())
    })
    .await;

    // A member removed from the cluster (a follower: the kubeconfig's endpoint stays where it
    // is) is no longer an endpoint of the kubernetes Service.
    let leader = c.wait_leader().await;
    let gone = (0..3).rev().find(|i| *i != leader).expect("a follower");
    let removed = c.members[gone].name.clone();
    ClusterClient::new(c.channel(leader))
        .member_remove(pb::MemberRemoveRequest { id: c.id_of(gone) })
        .await
        .expect("member remove");
    wait_for(
        &format!("{removed} out of the kubernetes Service's endpoints"),
        BOUND,
        || async {
            let slices = k
                .run(&[
                    "get",
                    "endpointslices",
                    "-l",
                    "kubernetes.io/service-name=kubernetes",
                    "-o",
                    "name",
                ])
                .await
                .stdout;
            (kubernetes_endpoints(&k).await.len() == 2
                && slices.lines().count() == 2
                && !slices.contains(&format!("kubernetes-{removed}")))
            .then_some(())
        },
    )
    .await;
}
