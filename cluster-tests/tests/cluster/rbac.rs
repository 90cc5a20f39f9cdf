//! Authentication and authorization as kubectl users meet them: `auth can-i` and `auth whoami`,
//! RBAC bindings to the default roles, a user bound only to view refused every write, service
//! account tokens from `kubectl create token` (revoked with their service account),
//! impersonation with `--as`, and ClusterRole aggregation.

use std::path::Path;
use std::time::Duration;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::{wait_for, Cluster};

const BOUND: Duration = Duration::from_secs(30);

async fn cluster() -> (Cluster, Kubectl) {
    cluster_tests::kubectl::api_cluster().await
}

/// `kubectl auth can-i ARGS` until it answers `want` ("yes" or "no"): bindings reach every
/// member's authorizer through a watch, a moment after the write.
async fn can_i(k: &Kubectl, args: &[&str], want: &str) {
    let mut full = vec!["auth", "can-i"];
    full.extend_from_slice(args);
    wait_for(&format!("can-i {args:?} = {want}"), BOUND, || async {
        let out = k.run(&full).await;
        // kubectl exits 0 for yes and 1 for no.
        let answer = out.stdout.trim().to_string();
        (answer == want && out.success == (want == "yes")).then_some(())
    })
    .await;
}

/// A kubeconfig of its own for a user: the admin's cluster entry (server and CA) with other
/// credentials.
async fn kubeconfig_for(admin: &Kubectl, dir: &Path, name: &str, creds: &[&str]) -> Kubectl {
    let path = dir.join(format!("{name}.kubeconfig"));
    let server = admin
        .run(&[
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ])
        .await
        .ok();
    let ca = dir.join("pki").join("ca.crt");
    let kc = path.display().to_string();
    let run = |args: Vec<String>| async move {
        let out = tokio::process::Command::new("kubectl")
            .args(&args)
            .output()
            .await
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(vec![
        "--kubeconfig".into(),
        kc.clone(),
        "config".into(),
        "set-cluster".into(),
        "rkube".into(),
        format!("--server={server}"),
        format!("--certificate-authority={}", ca.display()),
        "--embed-certs".into(),
    ])
    .await;
    let mut set_creds = vec![
        "--kubeconfig".into(),
        kc.clone(),
        "config".into(),
        "set-credentials".into(),
        name.to_string(),
    ];
    set_creds.extend(creds.iter().map(|s| s.to_string()));
    run(set_creds).await;
    run(vec![
        "--kubeconfig".into(),
        kc.clone(),
        "config".into(),
        "set-context".into(),
        name.to_string(),
        "--cluster=rkube".into(),
        format!("--user={name}"),
    ])
    .await;
    run(vec![
        "--kubeconfig".into(),
        kc.clone(),
        "config".into(),
        "use-context".into(),
        name.to_string(),
    ])
    .await;
    let env = dir.join(format!("{name}.env"));
    std::fs::write(&env, format!("export KUBECONFIG={kc}\n")).expect("env file");
    Kubectl::from_env_file(&env, &dir.join(format!("home-{name}"))).expect("kubectl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_tokens_and_impersonation_with_kubectl() {
    let (c, k) = cluster().await;

    // The admin (system:masters) may do anything, and says who it is.
    can_i(&k, &["create", "pods"], "yes").await;
    can_i(&k, &["*", "*"], "yes").await;
    let me = k.run(&["auth", "whoami"]).await.ok();
    assert!(me.contains("kubernetes-admin"), "{me}");
    assert!(me.contains("system:masters"), "{me}");

    // The default roles exist, as Kubernetes names them.
    let roles = k.run(&["get", "clusterroles", "-o", "name"]).await.ok();
    for r in [
        "cluster-admin",
        "admin",
        "edit",
        "view",
        "system:discovery",
        "system:basic-user",
    ] {
        assert!(
            roles
                .lines()
                .any(|l| l == format!("clusterrole.rbac.authorization.k8s.io/{r}")),
            "{r} missing:\n{roles}"
        );
    }

    // A user bound only to view, by impersonation: reads yes, writes no.
    k.run(&[
        "create",
        "clusterrolebinding",
        "jane-view",
        "--clusterrole=view",
        "--user=jane",
    ])
    .await
    .ok();
    can_i(&k, &["list", "pods", "-A", "--as=jane"], "yes").await;
    can_i(&k, &["create", "deployments", "--as=jane"], "no").await;
    can_i(&k, &["list", "nodes", "--as=jane"], "no").await;
    k.run(&["get", "pods", "-A", "--as=jane"]).await.ok();
    let err = k
        .run(&["create", "deployment", "web", "--image=nginx", "--as=jane"])
        .await
        .err();
    assert!(
        err.contains("deployments.apps is forbidden: User \"jane\" cannot create resource \"deployments\" in API group \"apps\" in the namespace \"default\""),
        "{err}"
    );

    // The same with a client certificate of the cluster CA (CN=jane), no impersonation.
    let pki = c.path().join("pki");
    rkube_pki::issue(&pki, "jane", "jane", Some("dev-team"), &[], false, true)
        .expect("jane's certificate");
    let jane = kubeconfig_for(
        &k,
        c.path(),
        "jane",
        &[
            &format!("--client-certificate={}", pki.join("jane.crt").display()),
            &format!("--client-key={}", pki.join("jane.key").display()),
        ],
    )
    .await;
    let who = jane.run(&["auth", "whoami"]).await.ok();
    assert!(who.contains("jane") && who.contains("dev-team"), "{who}");
    jane.run(&["get", "configmaps", "-n", "kube-system"])
        .await
        .ok();
    let err = jane.run(&["delete", "namespace", "default"]).await.err();
    assert!(
        err.contains("namespaces \"default\" is forbidden: User \"jane\" cannot delete resource \"namespaces\" in API group \"\" at the cluster scope"),
        "{err}"
    );
    let err = jane.run(&["get", "pods", "--as=someone-else"]).await.err();
    assert!(
        err.contains("users \"someone-else\" is forbidden: User \"jane\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"),
        "{err}"
    );

    // Aggregation: a ClusterRole labelled aggregate-to-view adds its rules to view (and so to
    // edit and admin, which aggregate view's).
    k.run_with_input(
        &["apply", "-f", "-"],
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: node-reader\n  labels:\n    rbac.authorization.k8s.io/aggregate-to-view: \"true\"\nrules:\n- apiGroups: [\"\"]\n  resources: [\"nodes\"]\n  verbs: [\"get\", \"list\", \"watch\"]\n",
    )
    .await
    .ok();
    can_i(&k, &["list", "nodes", "--as=jane"], "yes").await;
    wait_for("admin to aggregate node-reader", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "clusterrole",
                "admin",
                "-o",
                "jsonpath={.rules[*].resources}",
            ])
            .await;
        (out.success && out.stdout.contains("nodes")).then_some(())
    })
    .await;

    // A service account with a RoleBinding in its namespace, and a token for it.
    k.run(&["create", "namespace", "team"]).await.ok();
    k.run(&["create", "serviceaccount", "ci", "-n", "team"])
        .await
        .ok();
    k.run(&[
        "create",
        "rolebinding",
        "ci-edit",
        "--clusterrole=edit",
        "--serviceaccount=team:ci",
        "-n",
        "team",
    ])
    .await
    .ok();
    let sa = "--as=system:serviceaccount:team:ci";
    can_i(&k, &["create", "configmaps", "-n", "team", sa], "yes").await;
    can_i(&k, &["create", "configmaps", "-n", "default", sa], "no").await;
    let rules = k
        .run(&["auth", "can-i", "--list", "-n", "team", sa])
        .await
        .ok();
    assert!(
        rules
            .lines()
            .any(|l| l.starts_with("configmaps ") && l.contains("create")),
        "{rules}"
    );
    assert!(
        rules
            .lines()
            .any(|l| l.starts_with("selfsubjectaccessreviews.authorization.k8s.io")),
        "{rules}"
    );

    let err = k
        .run(&["create", "token", "ci", "-n", "team", "--duration=1m"])
        .await
        .err();
    assert!(
        err.contains("may not specify a duration less than 10 minutes"),
        "{err}"
    );
    let token = k
        .run(&["create", "token", "ci", "-n", "team"])
        .await
        .ok()
        .trim()
        .to_string();
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    let ci = kubeconfig_for(&k, c.path(), "ci", &[&format!("--token={token}")]).await;
    let who = ci.run(&["auth", "whoami"]).await.ok();
    assert!(who.contains("system:serviceaccount:team:ci"), "{who}");
    assert!(who.contains("system:serviceaccounts:team"), "{who}");
    ci.run(&[
        "create",
        "configmap",
        "built",
        "-n",
        "team",
        "--from-literal=a=b",
    ])
    .await
    .ok();
    let err = ci
        .run(&[
            "create",
            "configmap",
            "built",
            "-n",
            "default",
            "--from-literal=a=b",
        ])
        .await
        .err();
    assert!(
        err.contains("configmaps is forbidden: User \"system:serviceaccount:team:ci\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"default\""),
        "{err}"
    );
    // A token is checked against its service account: deleting the account revokes it.
    k.run(&["delete", "serviceaccount", "ci", "-n", "team"])
        .await
        .ok();
    wait_for(
        "the deleted account's token to stop working",
        BOUND,
        || async {
            let out = ci.run(&["get", "configmaps", "-n", "team"]).await;
            (!out.success && out.stderr.contains("You must be logged in to the server"))
                .then_some(())
        },
    )
    .await;
    // A token that was never signed by the cluster is refused the same way.
    let bad = kubeconfig_for(
        &k,
        c.path(),
        "forger",
        &["--token=eyJhbGciOiJFUzI1NiJ9.e30.AAAA"],
    )
    .await;
    let err = bad.run(&["get", "pods"]).await.err();
    assert!(err.contains("You must be logged in to the server"), "{err}");
}
