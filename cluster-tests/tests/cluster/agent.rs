//! Node agents as an operator meets them: `rkube up` joins its agents with a bootstrap token
//! (CA pinned, client certificate from an auto-approved CSR), the nodes are Ready and run the
//! seed Deployment; a node's certificate reaches only what the Node authorizer gives it; a join
//! with a wrong CA pin or an expired or deleted token is refused; a killed agent's node goes
//! NotReady and its pods move, and the restarted agent comes back with its certificate; one
//! process simulates many nodes.

use std::path::Path;
use std::time::Duration;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::{rkube_bin, wait_for, Cluster, Options};

const BOUND: Duration = Duration::from_secs(60);

async fn cluster_with(agents: usize, up_args: &[&str]) -> (Cluster, Kubectl) {
    let c = Cluster::start(Options {
        kubernetes_api: true,
        agents,
        up_args: up_args.iter().map(|s| s.to_string()).collect(),
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    let k = Kubectl::from_env_file(&c.path().join("env"), &c.path().join("home")).expect("env");
    (c, k)
}

/// kubectl acting with a node's own client certificate (what its agent holds).
fn as_node(admin: &Kubectl, dir: &Path, node: &str) -> Kubectl {
    let pem = dir
        .join("agents")
        .join(node)
        .join("kubelet-client-current.pem");
    let ca = dir.join("pki").join("ca.crt");
    let kc = dir.join(format!("{node}.kubeconfig"));
    let server = std::fs::read_to_string(admin.kubeconfig())
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_string))
        .unwrap();
    let b64 = |p: &Path| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(p).unwrap())
    };
    let doc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(&ca),
        b64(&pem),
        b64(&pem)
    );
    std::fs::write(&kc, doc).unwrap();
    let env = dir.join(format!("{node}.env"));
    std::fs::write(&env, format!("export KUBECONFIG={}\n", kc.display())).unwrap();
    Kubectl::from_env_file(&env, &dir.join(format!("home-{node}"))).unwrap()
}

#[tokio::test]
async fn agents_join_with_a_bootstrap_token_and_run_the_seed_deployment() {
    let (c, k) = cluster_with(2, &[]).await;
    k.wait_nodes_ready(&["agent1", "agent2"]).await;
    // Each joined through a CSR approved for its bootstrap token and signed by the CA.
    let csrs = k.run(&["get", "csr", "--no-headers"]).await.ok();
    assert_eq!(csrs.lines().count(), 2, "{csrs}");
    for line in csrs.lines() {
        assert!(
            line.contains("kubernetes.io/kube-apiserver-client-kubelet"),
            "{line}"
        );
        assert!(line.contains("system:bootstrap:"), "{line}");
        assert!(line.contains("Approved,Issued"), "{line}");
    }
    let nodes = k
        .run(&["get", "nodes", "-o", "wide", "--no-headers"])
        .await
        .ok();
    assert!(nodes.contains("sim://"), "{nodes}");

    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/deployment.yaml"),
    )
    .unwrap();
    k.run_with_input(&["apply", "-f", "-"], &manifest)
        .await
        .ok();
    let status = k
        .run(&[
            "rollout",
            "status",
            "deployment/myapp-deployment",
            "--timeout=60s",
        ])
        .await;
    assert!(status.success, "{}{}", status.stdout, status.stderr);
    let pods = k
        .run(&["get", "pods", "-l", "app=myapp", "-o",
               "jsonpath={range .items[*]}{.status.phase} {.status.podIP} {.spec.nodeName}{\"\\n\"}{end}"])
        .await
        .ok();
    let lines: Vec<&str> = pods.lines().collect();
    assert_eq!(lines.len(), 3, "{pods}");
    for l in &lines {
        let parts: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(parts[0], "Running", "{l}");
        assert!(parts[1].starts_with("10.244."), "{l}");
    }

    // Simulated containers are not processes: logs and exec say so in a sentence.
    let pod = k
        .run(&[
            "get",
            "pods",
            "-l",
            "app=myapp",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ])
        .await
        .ok();
    let logs = k.run(&["logs", pod.trim()]).await;
    assert!(!logs.success);
    assert!(logs.stderr.contains("simulated runtime"), "{}", logs.stderr);

    // The Node authorizer: a node reads pods, but only the secrets its own pods use, and it
    // changes only its own Node.
    let agent1 = as_node(&k, c.path(), "agent1");
    let agent2 = as_node(&k, c.path(), "agent2");
    let who = agent1
        .run(&[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .await
        .ok();
    assert_eq!(who.trim(), "system:node:agent1");
    k.run(&["create", "secret", "generic", "s2", "--from-literal=k=v"])
        .await
        .ok();
    let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"uses-s2"},
        "spec":{"nodeName":"agent2","containers":[{"name":"c","image":"busybox",
        "env":[{"name":"K","valueFrom":{"secretKeyRef":{"name":"s2","key":"k"}}}]}]}}"#;
    k.run_with_input(&["create", "-f", "-"], pod).await.ok();
    let denied = agent1.run(&["get", "secret", "s2"]).await;
    assert!(!denied.success);
    assert!(
        denied
            .stderr
            .contains("no relationship found between node 'agent1' and this object"),
        "{}",
        denied.stderr
    );
    agent2.run(&["get", "secret", "s2"]).await.ok();
    assert!(!agent1.run(&["get", "secrets"]).await.success);
    agent1.run(&["get", "pods", "-A"]).await.ok();
    let other = agent1.run(&["label", "node", "agent2", "x=y"]).await;
    assert!(
        other
            .stderr
            .contains("is not allowed to modify node \"agent2\""),
        "{}",
        other.stderr
    );
    agent1.run(&["label", "node", "agent1", "x=y"]).await.ok();
    let del = agent1.run(&["delete", "pod", "uses-s2"]).await;
    assert!(!del.success, "a node deleted another node's pod");

    // `kubectl delete node` removes the object only: the running agent registers it again.
    let uid = || async {
        k.run(&["get", "node", "agent2", "-o", "jsonpath={.metadata.uid}"])
            .await
            .stdout
    };
    let before = uid().await;
    k.run(&["delete", "node", "agent2"]).await.ok();
    wait_for("agent2 registered again", BOUND, || async {
        let now = uid().await;
        (!now.is_empty() && now != before).then_some(())
    })
    .await;
    k.wait_nodes_ready(&["agent2"]).await;
}

/// `rkube token create --print-join-command --dir DIR`, retried until the API takes it: the
/// words of the printed `rkube agent ...` command.
async fn join_command(c: &Cluster) -> Vec<String> {
    let last = std::sync::Mutex::new(String::new());
    let out = wait_for_or(
        "a join command",
        Duration::from_secs(120),
        &last,
        || async {
            let out = std::process::Command::new(rkube_bin())
                .args(["token", "create", "--print-join-command", "--dir"])
                .arg(c.path())
                .output()
                .unwrap();
            if !out.status.success() {
                *last.lock().unwrap() = String::from_utf8_lossy(&out.stderr).to_string();
            }
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).to_string())
        },
    )
    .await;
    out.split_whitespace().map(str::to_string).collect()
}

/// [`wait_for`] whose timeout message carries the last failure.
async fn wait_for_or<T, F, Fut>(
    what: &str,
    bound: Duration,
    last: &std::sync::Mutex<String>,
    cond: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match tokio::time::timeout(bound, wait_for(what, bound + Duration::from_secs(5), cond)).await {
        Ok(v) => v,
        Err(_) => panic!(
            "timed out waiting for {what}; last error: {}",
            last.lock().unwrap()
        ),
    }
}

/// `rkube agent` joining by hand, as a new user would from `rkube token create
/// --print-join-command`, with the pin or the token spoiled.
async fn join(
    dir: &Path,
    name: &str,
    server: &str,
    token: &str,
    pin: &str,
) -> std::process::Output {
    tokio::process::Command::new(rkube_bin())
        .args(["agent", "--sim", "--server", server, "--token", token])
        .args(["--discovery-token-ca-cert-hash", pin, "--name", name])
        .args(["--discovery-timeout", "3s"])
        .arg("--dir")
        .arg(dir.join("joins").join(name))
        .kill_on_drop(true)
        .output()
        .await
        .expect("rkube agent runs")
}

#[tokio::test]
async fn a_join_with_a_wrong_pin_or_an_expired_or_deleted_token_is_refused() {
    let (c, k) = cluster_with(0, &[]).await;
    let token_cmd = |args: &[&str]| {
        let mut cmd = std::process::Command::new(rkube_bin());
        cmd.arg("token").args(args).arg("--dir").arg(c.path());
        cmd
    };
    let words = join_command(&c).await;
    let arg =
        |flag: &str| words[words.iter().position(|w| w.as_str() == flag).unwrap() + 1].to_string();
    let (server, token, pin) = (
        arg("--server"),
        arg("--token"),
        arg("--discovery-token-ca-cert-hash"),
    );
    assert!(pin.starts_with("sha256:") && pin.len() == 71, "{pin}");
    let listed =
        String::from_utf8_lossy(&token_cmd(&["list"]).output().unwrap().stdout).to_string();
    assert!(listed.contains(&token), "{listed}");
    assert!(listed.contains("authentication,signing"), "{listed}");

    let wrong_pin = format!("sha256:{}", "0".repeat(64));
    let out = join(c.path(), "w1", &server, &token, &wrong_pin).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("none of the public keys"), "{err}");

    // A token past its expiration neither signs cluster-info nor authenticates, and the
    // token cleaner removes it.
    let past = (chrono::Utc::now() - chrono::Duration::minutes(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let expired = format!(
        r#"{{"apiVersion":"v1","kind":"Secret","type":"bootstrap.kubernetes.io/token",
        "metadata":{{"name":"bootstrap-token-exp123","namespace":"kube-system"}},
        "stringData":{{"token-id":"exp123","token-secret":"0123456789abcdef","expiration":"{past}",
        "usage-bootstrap-authentication":"true","usage-bootstrap-signing":"true"}}}}"#
    );
    k.run_with_input(&["create", "-f", "-"], &expired)
        .await
        .ok();
    let out = join(c.path(), "w2", &server, "exp123.0123456789abcdef", &pin).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no JWS signed token") || err.contains("Unauthorized"),
        "{err}"
    );
    wait_for(
        "the token cleaner to delete the expired token",
        BOUND,
        || async {
            let out = k
                .run(&[
                    "get",
                    "secret",
                    "-n",
                    "kube-system",
                    "bootstrap-token-exp123",
                ])
                .await;
            out.stderr.contains("NotFound").then_some(())
        },
    )
    .await;

    let id = token.split('.').next().unwrap();
    let deleted = token_cmd(&["delete", id]).output().unwrap();
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    let out = join(c.path(), "w3", &server, &token, &pin).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no JWS signed token"), "{err}");

    // And a good token with the right pin joins.
    let words = join_command(&c).await;
    let mut child = tokio::process::Command::new(rkube_bin())
        .args(&words[1..])
        .args(["--sim", "--name", "w4"])
        .arg("--dir")
        .arg(c.path().join("joins").join("w4"))
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    k.wait_nodes_ready(&["w4"]).await;
    child.kill().await.ok();
}

#[tokio::test]
async fn a_killed_agent_s_node_goes_not_ready_its_pods_move_and_it_comes_back() {
    let (c, k) = cluster_with(
        2,
        &[
            "--node-monitor-period",
            "500ms",
            "--node-monitor-grace-period",
            "4s",
            "--node-eviction-rate",
            "100",
            "--agent-args=--lease-interval=1s",
        ],
    )
    .await;
    k.wait_nodes_ready(&["agent1", "agent2"]).await;
    let deploy = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web"},
      "spec":{"replicas":4,"selector":{"matchLabels":{"app":"web"}},
      "template":{"metadata":{"labels":{"app":"web"}},"spec":{
        "tolerations":[{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":2},
                       {"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":2}],
        "containers":[{"name":"c","image":"busybox"}]}}}}"#;
    k.run_with_input(&["apply", "-f", "-"], deploy).await.ok();
    // (node, phase, terminating) of every pod of the Deployment.
    let placement = || async {
        let out = k
            .run(&["get", "pods", "-l", "app=web", "-o",
                   "jsonpath={range .items[*]}{.spec.nodeName},{.status.phase},{.metadata.deletionTimestamp}{\"\\n\"}{end}"])
            .await
            .ok();
        out.lines()
            .map(|l| {
                let p: Vec<&str> = l.split(',').collect();
                (p[0].to_string(), p[1].to_string(), !p[2].is_empty())
            })
            .collect::<Vec<_>>()
    };
    wait_for("4 pods running", BOUND, || async {
        let p = placement().await;
        (p.iter().filter(|(_, phase, _)| phase == "Running").count() == 4).then_some(())
    })
    .await;
    let p = placement().await;
    assert!(
        p.iter().any(|(n, _, _)| n == "agent1"),
        "the scheduler spreads over both nodes: {p:?}"
    );

    c.kill_agent("agent1").await;
    wait_for("agent1 NotReady", BOUND, || async {
        let out = k.run(&["get", "node", "agent1", "--no-headers"]).await.ok();
        out.contains("NotReady").then_some(())
    })
    .await;
    // Evicted pods stay Terminating on the unreachable node (nobody can confirm they
    // stopped); their replacements run on agent2.
    wait_for("replacements running on agent2", BOUND, || async {
        let p = placement().await;
        let live: Vec<_> = p
            .iter()
            .filter(|(_, _, terminating)| !terminating)
            .collect();
        (live.len() == 4
            && live
                .iter()
                .all(|(n, phase, _)| n == "agent2" && phase == "Running"))
        .then_some(())
    })
    .await;
    let p = placement().await;
    assert!(
        p.iter().any(|(n, _, t)| n == "agent1" && *t),
        "evicted pods are terminating: {p:?}"
    );

    // `rkube up` again starts the missing agent; it keeps its certificate (no new CSR).
    c.restart_missing()
        .await
        .expect("rkube up restarts the agent");
    k.wait_nodes_ready(&["agent1"]).await;
    let csrs = k.run(&["get", "csr", "--no-headers"]).await.ok();
    assert_eq!(csrs.lines().count(), 2, "{csrs}");
    // Back, it finishes the terminating pods: stopped (a Killing event) and removed.
    wait_for("agent1's terminating pods gone", BOUND, || async {
        let p = placement().await;
        (p.len() == 4 && p.iter().all(|(n, _, _)| n == "agent2")).then_some(())
    })
    .await;
    let events = k
        .run(&[
            "get",
            "events",
            "--field-selector=reason=Killing",
            "--no-headers",
        ])
        .await
        .ok();
    assert!(events.contains("Stopping container c"), "{events}");
}

#[tokio::test]
async fn one_agent_process_simulates_many_nodes() {
    let (c, k) = cluster_with(0, &[]).await;
    let words = join_command(&c).await;
    let (_turn, metrics_port) = cluster_tests::exclusive_ports(1);
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut child = tokio::process::Command::new(rkube_bin())
        .args(&words[1..])
        .args([
            "--sim",
            "--nodes",
            "40",
            "--name",
            "sim",
            "--pod-cidr",
            "10.250.0.0/16",
            "--listen-metrics",
            &metrics,
        ])
        .arg("--dir")
        .arg(c.path().join("sim"))
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for("40 Ready nodes", Duration::from_secs(120), || async {
        let out = k.run(&["get", "nodes", "--no-headers"]).await.ok();
        (out.lines().filter(|l| l.contains(" Ready ")).count() == 40).then_some(())
    })
    .await;
    k.run(&[
        "create",
        "deployment",
        "many",
        "--image=busybox",
        "--replicas=400",
    ])
    .await
    .ok();
    wait_for("400 pods Running", Duration::from_secs(180), || async {
        let out = k
            .run(&[
                "get",
                "pods",
                "-l",
                "app=many",
                "--field-selector=status.phase=Running",
                "--no-headers",
            ])
            .await
            .ok();
        (out.lines().count() == 400).then_some(())
    })
    .await;
    let nodes = k
        .run(&[
            "get",
            "pods",
            "-l",
            "app=many",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ])
        .await
        .ok();
    let distinct: std::collections::BTreeSet<&str> = nodes.split_whitespace().collect();
    assert_eq!(distinct.len(), 40, "every simulated node got pods");
    // Simulated nodes program no service rules, but their metrics say what they would be.
    k.run(&["expose", "deployment", "many", "--port=80"])
        .await
        .ok();
    let text = wait_for(
        "the proxy's metrics with the Service's 400 endpoints",
        BOUND,
        || async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(&metrics).await.ok()?;
            s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.ok()?;
            let mut text = String::new();
            s.read_to_string(&mut text).await.ok()?;
            let endpoints: i64 = text
                .lines()
                .find_map(|l| l.strip_prefix("rkube_proxy_endpoints "))?
                .trim()
                .parse()
                .ok()?;
            (endpoints >= 400).then_some(text)
        },
    )
    .await;
    assert!(text.contains("rkube_proxy_programmed 0"), "{text}");
    assert!(text.contains("rkube_proxy_rules "), "{text}");
    child.kill().await.ok();
}

/// Kills the processes a test started by hand when it ends, however it ends.
struct Procs(Vec<tokio::process::Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.start_kill();
        }
    }
}

#[tokio::test]
async fn a_control_plane_built_host_by_host_with_init_and_join() {
    let (_turn, base) = cluster_tests::exclusive_ports(3);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ports = |i: u16| {
        let b = base + 10 * i;
        (
            format!("127.0.0.1:{b}"),
            format!("127.0.0.1:{}", b + 1),
            format!("127.0.0.1:{}", b + 3),
        )
    };
    let server = |name: &str, i: u16, extra: &[String]| {
        let (client, peer, api) = ports(i);
        let log = std::fs::File::create(d.join(format!("{name}.log"))).unwrap();
        tokio::process::Command::new(rkube_bin())
            .args([
                "server",
                "--name",
                name,
                "--listen-client",
                &client,
                "--listen-peer",
                &peer,
            ])
            .args(["--listen-api", &api])
            .arg("--data-dir")
            .arg(d.join(name))
            .arg("--pki")
            .arg(d.join(format!("{name}-pki")))
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    let mut first = server("a", 0, &["--init".to_string()]);
    let stdout = first.stdout.take().unwrap();
    let mut procs = Procs(vec![first]);
    // The join commands, as `--init` prints them.
    let printed = {
        use tokio::io::AsyncReadExt;
        let mut out = String::new();
        let mut stdout = stdout;
        let mut buf = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + BOUND;
        while !out.contains("rkube agent --server") || !out.contains("--dir <dir>") {
            let n = tokio::time::timeout_at(deadline, stdout.read(&mut buf))
                .await
                .expect("--init prints the join commands")
                .unwrap();
            assert!(n > 0, "--init ended early: {out}");
            out.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        out
    };
    let word_after = |flag: &str| {
        let words: Vec<&str> = printed.split_whitespace().collect();
        words[words.iter().position(|w| *w == flag).expect(flag) + 1].to_string()
    };
    let (token, pin, key) = (
        word_after("--token"),
        word_after("--discovery-token-ca-cert-hash"),
        word_after("--certificate-key"),
    );
    let join_url = word_after("--join");
    // A wrong certificate key is refused with a sentence, before anything joins.
    let bad = tokio::process::Command::new(rkube_bin())
        .args([
            "server",
            "--name",
            "x",
            "--listen-client",
            "127.0.0.1:1",
            "--listen-peer",
            "127.0.0.1:2",
        ])
        .args([
            "--listen-api",
            "127.0.0.1:3",
            "--join",
            &join_url,
            "--token",
            &token,
        ])
        .args([
            "--discovery-token-ca-cert-hash",
            &pin,
            "--certificate-key",
            &"ab".repeat(32),
        ])
        .arg("--data-dir")
        .arg(d.join("x"))
        .arg("--pki")
        .arg(d.join("x-pki"))
        .output()
        .await
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("certificate key does not decrypt"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let join_args = |_: ()| {
        vec![
            "--join".to_string(),
            join_url.clone(),
            "--token".into(),
            token.clone(),
            "--discovery-token-ca-cert-hash".into(),
            pin.clone(),
            "--certificate-key".into(),
            key.clone(),
        ]
    };
    procs.0.push(server("b", 1, &join_args(())));
    // One at a time, as with etcd: the second joins once the first is a voter.
    let kubeconfig = d.join("a-pki").join("admin.kubeconfig");
    let env = d.join("a.env");
    std::fs::write(
        &env,
        format!("export KUBECONFIG={}\n", kubeconfig.display()),
    )
    .unwrap();
    let k = Kubectl::from_env_file(&env, &d.join("home")).unwrap();
    let members = || async {
        let (client, _, _) = ports(0);
        let out = tokio::process::Command::new(rkube_bin())
            .args([
                "member",
                "list",
                "--endpoints",
                &format!("https://{client}"),
            ])
            .arg("--cacert")
            .arg(d.join("a-pki/ca.crt"))
            .arg("--cert")
            .arg(d.join("a-pki/admin.crt"))
            .arg("--key")
            .arg(d.join("a-pki/admin.key"))
            .output()
            .await
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let voters = |list: &str, n: usize| {
        list.lines()
            .filter(|l| l.trim_end().ends_with("false"))
            .count()
            == n
    };
    wait_for("b a voter", BOUND, || async {
        voters(&members().await, 2).then_some(())
    })
    .await;
    procs.0.push(server("c", 2, &join_args(())));
    wait_for("c a voter", BOUND, || async {
        voters(&members().await, 3).then_some(())
    })
    .await;
    // Every member serves the API with the same CA and keys: a token signed by one verifies on
    // another, and kubectl works through the joined member's own admin kubeconfig.
    let env_c = d.join("c.env");
    std::fs::write(
        &env_c,
        format!(
            "export KUBECONFIG={}\n",
            d.join("c-pki/admin.kubeconfig").display()
        ),
    )
    .unwrap();
    let kc = Kubectl::from_env_file(&env_c, &d.join("home-c")).unwrap();
    wait_for("the default namespace through c", BOUND, || async {
        kc.run(&["get", "ns", "default", "-o", "name"])
            .await
            .success
            .then_some(())
    })
    .await;
    k.run(&["create", "serviceaccount", "robot"]).await.ok();
    let sa_token = k.run(&["create", "token", "robot"]).await.ok();
    let (_, _, api_c) = ports(2);
    let who = tokio::process::Command::new("kubectl")
        .env("HOME", d.join("home-robot"))
        .args([
            "--kubeconfig",
            "/dev/null",
            "--server",
            &format!("https://{api_c}"),
        ])
        .arg("--certificate-authority")
        .arg(d.join("c-pki/ca.crt"))
        .args([
            "--token",
            sa_token.trim(),
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .output()
        .await
        .unwrap();
    let who_out = String::from_utf8_lossy(&who.stdout);
    assert!(
        who_out.contains("system:serviceaccount:default:robot"),
        "{who_out}{}",
        String::from_utf8_lossy(&who.stderr)
    );
    // And a worker joins through the printed command, against the joined members.
    let agent = tokio::process::Command::new(rkube_bin())
        .args([
            "agent",
            "--sim",
            "--name",
            "w1",
            "--token",
            &token,
            "--discovery-token-ca-cert-hash",
            &pin,
        ])
        .args(["--server", &format!("https://{api_c},{join_url}")])
        .arg("--dir")
        .arg(d.join("w1"))
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    procs.0.push(agent);
    k.wait_nodes_ready(&["w1"]).await;

    // Late: the keys `--init` uploaded are re-uploaded under a new certificate key (kubeadm's
    // `init phase upload-certs`); the first key no longer decrypts them, the new one lets a
    // fourth member join.
    let uploaded = tokio::process::Command::new(rkube_bin())
        .arg("upload-certs")
        .arg("--pki")
        .arg(d.join("a-pki"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&uploaded.stdout).into_owned();
    assert!(
        uploaded.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&uploaded.stderr)
    );
    let new_key = said
        .lines()
        .find(|l| l.len() == 64 && l.chars().all(|c| c.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("upload-certs prints the key: {said}"))
        .to_string();
    assert_ne!(new_key, key);
    let join_with = |certificate_key: &str| {
        let mut args = join_args(());
        let at = args.len() - 1;
        args[at] = certificate_key.to_string();
        args
    };
    let old = server("x", 3, &join_with(&key))
        .wait_with_output()
        .await
        .unwrap();
    assert!(
        !old.status.success(),
        "the old certificate key still decrypts the keys"
    );
    let err = std::fs::read_to_string(d.join("x.log")).unwrap_or_default();
    assert!(err.contains("certificate key does not decrypt"), "{err}");
    std::fs::remove_dir_all(d.join("x")).ok();
    std::fs::remove_dir_all(d.join("x-pki")).ok();
    procs.0.push(server("e", 3, &join_with(&new_key)));
    wait_for("e a voter", BOUND, || async {
        voters(&members().await, 4).then_some(())
    })
    .await;
}

/// A containerd of the test's own (root, state and socket in a temporary directory, never the
/// system's), with the CRI plugin set up for rkube's locally built images, and the test's CNI
/// bridge; everything it made is removed when dropped.
struct Containerd {
    dir: tempfile::TempDir,
    child: Option<std::process::Child>,
    bridge: String,
}

impl Containerd {
    fn socket(&self) -> std::path::PathBuf {
        self.dir.path().join("c.sock")
    }

    fn cni_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("cni")
    }

    async fn start() -> Containerd {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("cni")).unwrap();
        let config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n[grpc]\n  address = \"{sock}\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"rkube.local/pause:1\"\n  \
             restrict_oom_score_adj = true\n  [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    \
             bin_dir = \"/usr/lib/cni\"\n    conf_dir = \"{cni}\"\n",
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = d.join("c.sock").display(),
            cni = d.join("cni").display(),
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        let mut me = Containerd {
            bridge: format!("rkt{:x}", rand::random::<u32>() & 0xfffff),
            dir,
            child: None,
        };
        me.run();
        let images = me.dir.path().join("images");
        cluster_tests::build_images(&images);
        let sock = me.socket();
        wait_for("containerd's socket", BOUND, || async {
            sock.exists().then_some(())
        })
        .await;
        for image in ["busybox.tar", "pause.tar"] {
            let out = std::process::Command::new("ctr")
                .args(["-n", "k8s.io", "--address"])
                .arg(me.socket())
                .args(["images", "import"])
                .arg(images.join(image))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "ctr import: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        me
    }

    /// Starts containerd (again) on the same state.
    fn run(&mut self) {
        let d = self.dir.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("containerd.log"))
            .unwrap();
        let child = std::process::Command::new("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("containerd runs (Debian's containerd package)");
        self.child = Some(child);
    }

    /// Stops containerd (its containers' shims keep running, as on a real host).
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn containers(&self) -> usize {
        let out = std::process::Command::new("ctr")
            .args(["-n", "k8s.io", "--address"])
            .arg(self.socket())
            .args(["containers", "ls", "-q"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // The shims outlive containerd: stop them by the socket they name.
        let _ = std::process::Command::new("pkill")
            .arg("-f")
            .arg(self.socket())
            .status();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
        // Mounts of the snapshots and the sandboxes' network namespaces.
        if let Ok(mounts) = std::fs::read_to_string("/proc/mounts") {
            let root = self.dir.path().display().to_string();
            let mut points: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split_whitespace().nth(1))
                .filter(|p| p.starts_with(&root))
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for p in points {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(p)
                    .status();
            }
        }
    }
}

#[tokio::test]
async fn an_agent_runs_real_containers_through_containerd() {
    let mut ctd = Containerd::start().await;
    let (c, k) = cluster_with(0, &[]).await;
    let words = join_command(&c).await;
    let pod_cidr = format!("10.251.{}.0/24", rand::random::<u8>());
    let agent = tokio::process::Command::new(rkube_bin())
        .args(&words[1..])
        .args([
            "--name",
            "cri1",
            "--pod-cidr",
            &pod_cidr,
            "--cni-bridge",
            &ctd.bridge,
            // This agent shares the test machine's network: its rules are not the agent's.
            "--proxy-mode",
            "none",
        ])
        .arg("--container-runtime-endpoint")
        .arg(ctd.socket())
        .arg("--cni-conf-dir")
        .arg(ctd.cni_dir())
        .arg("--dir")
        .arg(c.path().join("cri1"))
        .stderr(std::fs::File::create(c.path().join("cri1.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let _procs = Procs(vec![agent]);
    k.wait_nodes_ready(&["cri1"]).await;
    let runtime = k
        .run(&[
            "get",
            "node",
            "cri1",
            "-o",
            "jsonpath={.status.nodeInfo.containerRuntimeVersion}",
        ])
        .await
        .ok();
    assert!(runtime.starts_with("containerd://"), "{runtime}");
    // Capacity is the host's, not a default; the pressure conditions are measured.
    let capacity = k
        .run(&[
            "get",
            "node",
            "cri1",
            "-o",
            "jsonpath={.status.capacity.cpu} {.status.capacity.memory} {.status.capacity.ephemeral-storage} {.status.conditions[*].type}",
        ])
        .await
        .ok();
    let cpus = std::thread::available_parallelism().unwrap().get();
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("MemTotal:")
                .map(|v| v.trim().trim_end_matches(" kB").to_string())
        })
        .unwrap();
    let parts: Vec<&str> = capacity.split_whitespace().collect();
    assert_eq!(parts[0], cpus.to_string(), "{capacity}");
    assert_eq!(parts[1], format!("{mem_kib}Ki"), "{capacity}");
    assert!(
        parts[2].ends_with("Ki") && parts[2] != "100Gi",
        "{capacity}"
    );
    for t in ["MemoryPressure", "DiskPressure", "Ready"] {
        assert!(parts[3..].contains(&t), "{t} is missing: {capacity}");
    }

    let deploy = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web"},
      "spec":{"replicas":2,"selector":{"matchLabels":{"app":"web"}},
      "template":{"metadata":{"labels":{"app":"web"}},"spec":{
        "terminationGracePeriodSeconds":2,
        "containers":[{"name":"httpd","image":"rkube.local/busybox:1","command":["sh","-c",
          "echo hello from $(hostname) > /www/index.html; echo serving as $(hostname); exec httpd -f -p 8080 -h /www"]}]}}}}"#;
    k.run_with_input(&["apply", "-f", "-"], deploy).await.ok();
    let status = k
        .run(&["rollout", "status", "deployment/web", "--timeout=90s"])
        .await;
    assert!(status.success, "{}{}", status.stdout, status.stderr);
    let pods = k
        .run(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.podIP}{\"\\n\"}{end}",
        ])
        .await
        .ok();
    for line in pods.lines() {
        let (name, ip) = line.split_once(' ').unwrap();
        let net = &pod_cidr[..pod_cidr.len() - 4];
        assert!(ip.starts_with(net), "{ip} is not in {pod_cidr}");
        let body = wait_for(&format!("{name} answering"), BOUND, || async {
            cluster_tests::http_get(&format!("{ip}:8080")).await
        })
        .await;
        assert!(body.contains(&format!("hello from {name}")), "{body}");
        // kubectl logs reaches the agent through the API server.
        let logs = wait_for(&format!("{name}'s log"), BOUND, || async {
            let out = k.run(&["logs", name]).await;
            out.stdout.contains("serving as").then_some(out.stdout)
        })
        .await;
        assert_eq!(logs.trim(), format!("serving as {name}"));
        // kubectl exec runs a command in it (a WebSocket with v5.channel.k8s.io, which the
        // agent translates to SPDY toward containerd).
        let out = k
            .run(&["exec", name, "--", "cat", "/www/index.html"])
            .await
            .ok();
        assert_eq!(out.trim(), format!("hello from {name}"));
    }
    let first = pods.lines().next().unwrap().split(' ').next().unwrap();
    // Standard input reaches the command; its exit code comes back.
    let out = k
        .run_with_input(
            &[
                "exec",
                "-i",
                first,
                "--",
                "sh",
                "-c",
                "read x; echo got $x; exit 7",
            ],
            "abc\n",
        )
        .await;
    assert!(!out.success);
    assert_eq!(out.stdout.trim(), "got abc");
    assert!(
        out.stderr.contains("command terminated with exit code 7"),
        "{}",
        out.stderr
    );
    // kubectl took the WebSocket (v5), not its SPDY fallback: the agent translated it.
    let agent_log = std::fs::read_to_string(c.path().join("cri1.log")).unwrap_or_default();
    assert!(
        agent_log.contains("translated to SPDY toward the runtime"),
        "kubectl exec did not arrive as a v5 WebSocket; the agent logged:\n{agent_log}"
    );
    let missing = k
        .run(&["exec", first, "-c", "nope", "--", "true"])
        .await
        .err();
    assert!(
        missing.contains("container nope is not valid for pod"),
        "{missing}"
    );
    // kubectl port-forward: a local port reaches the pod's 8080.
    let body = super::common::port_forward_get(&k, &format!("pod/{first}"), 8080).await;
    assert!(body.contains(&format!("hello from {first}")), "{body}");
    websocket_streams(&c, first).await;
    let image_id = k
        .run(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[0].status.containerStatuses[0].imageID}",
        ])
        .await
        .ok();
    assert!(image_id.starts_with("sha256:"), "{image_id}");

    // Volumes (configMap, emptyDir) and environment from a Secret and the downward API.
    k.run(&[
        "create",
        "configmap",
        "settings",
        "--from-literal=greeting=hi",
    ])
    .await
    .ok();
    k.run(&[
        "create",
        "secret",
        "generic",
        "creds",
        "--from-literal=password=s3cret",
    ])
    .await
    .ok();
    let wired = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"wired"},
      "spec":{"terminationGracePeriodSeconds":1,"containers":[{"name":"c","image":"rkube.local/busybox:1",
        "command":["sh","-c","touch /scratch/ok; echo cm=$(cat /cfg/greeting) pw=$PASSWORD pod=$POD ns=$NS ip=$IP $(ls /scratch); sleep 3600"],
        "env":[{"name":"PASSWORD","valueFrom":{"secretKeyRef":{"name":"creds","key":"password"}}},
               {"name":"POD","valueFrom":{"fieldRef":{"fieldPath":"metadata.name"}}},
               {"name":"NS","valueFrom":{"fieldRef":{"fieldPath":"metadata.namespace"}}},
               {"name":"IP","valueFrom":{"fieldRef":{"fieldPath":"status.podIP"}}}],
        "volumeMounts":[{"name":"cfg","mountPath":"/cfg"},{"name":"scratch","mountPath":"/scratch"}]}],
        "volumes":[{"name":"cfg","configMap":{"name":"settings"}},{"name":"scratch","emptyDir":{}}]}}"#;
    k.run_with_input(&["create", "-f", "-"], wired).await.ok();
    let line = wait_for("wired's log", BOUND, || async {
        let out = k.run(&["logs", "wired"]).await;
        out.stdout.contains("cm=").then_some(out.stdout)
    })
    .await;
    let ip = k
        .run(&["get", "pod", "wired", "-o", "jsonpath={.status.podIP}"])
        .await
        .ok();
    assert_eq!(
        line.trim(),
        format!("cm=hi pw=s3cret pod=wired ns=default ip={ip} ok")
    );
    let orphan = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"orphan"},
      "spec":{"terminationGracePeriodSeconds":1,"containers":[{"name":"c","image":"rkube.local/busybox:1",
        "command":["sleep","3600"],"envFrom":[{"configMapRef":{"name":"missing"}}]}]}}"#;
    k.run_with_input(&["create", "-f", "-"], orphan).await.ok();
    wait_for("orphan waiting on its ConfigMap", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "pod",
                "orphan",
                "-o",
                "jsonpath={.status.containerStatuses[0].state.waiting.reason}",
            ])
            .await
            .stdout;
        (out == "CreateContainerConfigError").then_some(())
    })
    .await;

    // Probes: ready once its readiness probe passes; restarted when its liveness probe fails.
    let probed = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"probed"},
      "spec":{"terminationGracePeriodSeconds":1,"containers":[{"name":"c","image":"rkube.local/busybox:1",
        "command":["sh","-c","touch /tmp/alive; (sleep 3; echo ok > /www/ready; sleep 4; rm /tmp/alive) & exec httpd -f -p 8080 -h /www"],
        "readinessProbe":{"httpGet":{"path":"/ready","port":8080},"periodSeconds":1,"failureThreshold":1},
        "livenessProbe":{"exec":{"command":["test","-f","/tmp/alive"]},"periodSeconds":1,"failureThreshold":1}}]}}"#;
    k.run_with_input(&["create", "-f", "-"], probed).await.ok();
    let probed_state = || async {
        k.run(&["get", "pod", "probed", "-o",
                "jsonpath={.status.containerStatuses[0].ready} {.status.containerStatuses[0].restartCount}"])
            .await
            .stdout
    };
    wait_for("probed running but not ready", BOUND, || async {
        let st = k
            .run(&["get", "pod", "probed", "-o", "jsonpath={.status.phase}"])
            .await
            .stdout;
        (st == "Running" && probed_state().await.starts_with("false")).then_some(())
    })
    .await;
    wait_for("probed ready", BOUND, || async {
        (probed_state().await == "true 0").then_some(())
    })
    .await;
    wait_for(
        "probed restarted by its liveness probe",
        Duration::from_secs(90),
        || async {
            let st = probed_state().await;
            let restarts: u32 = st
                .split_whitespace()
                .nth(1)
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            (restarts >= 1).then_some(())
        },
    )
    .await;
    let events = k
        .run(&[
            "get",
            "events",
            "--field-selector=involvedObject.name=probed,reason=Unhealthy",
        ])
        .await
        .ok();
    assert!(events.contains("Liveness probe failed"), "{events}");

    // A crashing container is restarted with back-off; an image that cannot be pulled waits.
    k.run(&[
        "run",
        "crash",
        "--image=rkube.local/busybox:1",
        "--command",
        "--",
        "sh",
        "-c",
        "echo bye; exit 3",
    ])
    .await
    .ok();
    k.run(&["run", "nowhere", "--image=127.0.0.1:1/none:1"])
        .await
        .ok();
    wait_for("crash in CrashLoopBackOff after a restart", BOUND, || async {
        let out = k
            .run(&["get", "pod", "crash", "-o",
                   "jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].state.waiting.reason} {.status.containerStatuses[0].lastState.terminated.exitCode}"])
            .await
            .stdout;
        let parts: Vec<&str> = out.split_whitespace().collect();
        (parts.len() == 3
            && parts[0].parse::<u32>().unwrap_or(0) >= 1
            && parts[1] == "CrashLoopBackOff"
            && parts[2] == "3")
            .then_some(())
    })
    .await;
    let previous = k.run(&["logs", "crash", "--previous"]).await.ok();
    assert_eq!(previous.trim(), "bye");
    wait_for("nowhere waiting on its image", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "pod",
                "nowhere",
                "-o",
                "jsonpath={.status.containerStatuses[0].state.waiting.reason}",
            ])
            .await
            .stdout;
        (out == "ErrImagePull" || out == "ImagePullBackOff").then_some(())
    })
    .await;
    // `kubectl describe` says why, with the kubelet's events.
    let described = wait_for("nowhere's image events", BOUND, || async {
        let out = k.run(&["describe", "pod", "nowhere"]).await.stdout;
        (out.contains("Back-off pulling image")).then_some(out)
    })
    .await;
    for want in [
        "Pulling image \"127.0.0.1:1/none:1\"",
        "Failed to pull image \"127.0.0.1:1/none:1\"",
        "Error: ErrImagePull",
        "Error: ImagePullBackOff",
    ] {
        assert!(described.contains(want), "{want:?} is not in:\n{described}");
    }
    let present = k.run(&["describe", "pod", "crash"]).await.ok();
    assert!(
        present.contains("Container image \"rkube.local/busybox:1\" already present on machine"),
        "{present}"
    );

    // Init containers run in order before the app; resources become cgroup limits; a named
    // port serves a startup probe, which holds the container's `started` back; preStop runs
    // before the container is stopped.
    let data = tempfile::tempdir().unwrap();
    let staged = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"staged"},
      "spec":{"terminationGracePeriodSeconds":5,
       "initContainers":[
         {"name":"one","image":"rkube.local/busybox:1","command":["sh","-c","echo one >> /data/order"],
          "volumeMounts":[{"name":"data","mountPath":"/data"}]},
         {"name":"two","image":"rkube.local/busybox:1","command":["sh","-c","sleep 2; echo two >> /data/order"],
          "volumeMounts":[{"name":"data","mountPath":"/data"}]}],
       "containers":[{"name":"app","image":"rkube.local/busybox:1",
         "command":["sh","-c","echo app >> /data/order; cat /data/order; sleep 3; exec httpd -f -p 8080 -h /www"],
         "ports":[{"name":"web","containerPort":8080}],
         "resources":{"requests":{"cpu":"100m"},"limits":{"cpu":"500m","memory":"64Mi"}},
         "startupProbe":{"tcpSocket":{"port":"web"},"periodSeconds":1,"failureThreshold":30},
         "lifecycle":{"preStop":{"exec":{"command":["sh","-c","echo stopping > /data/prestop"]}}},
         "volumeMounts":[{"name":"data","mountPath":"/data"}]}],
       "volumes":[{"name":"data","hostPath":{"path":"DATA","type":"DirectoryOrCreate"}}]}}"#
        .replace("DATA", &data.path().display().to_string());
    k.run_with_input(&["create", "-f", "-"], &staged).await.ok();
    let staged_state = || async {
        k.run(&["get", "pod", "staged", "-o",
                "jsonpath={.status.phase} {.status.initContainerStatuses[*].state.terminated.reason} {.status.containerStatuses[0].started}"])
            .await
            .stdout
    };
    wait_for("staged's init containers done", BOUND, || async {
        staged_state()
            .await
            .starts_with("Running Completed Completed")
            .then_some(())
    })
    .await;
    let logs = k.run(&["logs", "staged"]).await.ok();
    assert_eq!(logs.trim(), "one\ntwo\napp");
    wait_for(
        "staged started (its startup probe passed)",
        BOUND,
        || async { (staged_state().await == "Running Completed Completed true").then_some(()) },
    )
    .await;
    let limits = k
        .run(&["exec", "staged", "--", "sh", "-c",
               "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes; \
                cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us"])
        .await
        .ok();
    let limits: Vec<&str> = limits.lines().collect();
    assert_eq!(limits[0], (64 << 20).to_string(), "{limits:?}");
    assert!(limits[1].starts_with("50000"), "{limits:?}");
    k.run(&["delete", "pod", "staged", "--wait=false"])
        .await
        .ok();
    let said = wait_for("the preStop hook's file", BOUND, || async {
        std::fs::read_to_string(data.path().join("prestop")).ok()
    })
    .await;
    assert_eq!(said.trim(), "stopping");
    // A failing init container of a pod that never restarts fails the pod; a container over
    // its memory limit is OOMKilled.
    let failing = r#"{"apiVersion":"v1","kind":"List","items":[
      {"apiVersion":"v1","kind":"Pod","metadata":{"name":"badinit"},
       "spec":{"restartPolicy":"Never","terminationGracePeriodSeconds":1,
        "initContainers":[{"name":"setup","image":"rkube.local/busybox:1","command":["sh","-c","exit 4"]}],
        "containers":[{"name":"app","image":"rkube.local/busybox:1","command":["sleep","3600"]}]}},
      {"apiVersion":"v1","kind":"Pod","metadata":{"name":"hog"},
       "spec":{"restartPolicy":"Never","terminationGracePeriodSeconds":1,
        "containers":[{"name":"hog","image":"rkube.local/busybox:1","command":["tail","/dev/zero"],
          "resources":{"limits":{"memory":"16Mi"}}}]}}]}"#;
    k.run_with_input(&["create", "-f", "-"], failing).await.ok();
    wait_for("badinit failed with Init:Error", BOUND, || async {
        let out = k.run(&["get", "pod", "badinit", "--no-headers"]).await.stdout;
        let phase = k
            .run(&["get", "pod", "badinit", "-o", "jsonpath={.status.phase} {.status.initContainerStatuses[0].state.terminated.exitCode}"])
            .await
            .stdout;
        (out.contains("Init:Error") && phase == "Failed 4").then_some(())
    })
    .await;
    wait_for("hog OOMKilled", BOUND, || async {
        let out = k
            .run(&[
                "get",
                "pod",
                "hog",
                "-o",
                "jsonpath={.status.containerStatuses[0].state.terminated.reason}",
            ])
            .await
            .stdout;
        (out == "OOMKilled").then_some(())
    })
    .await;

    // Deleted pods are stopped and removed from the runtime.
    k.run(&["delete", "deployment", "web"]).await.ok();
    k.run(&[
        "delete",
        "pod",
        "crash",
        "nowhere",
        "wired",
        "orphan",
        "probed",
        "badinit",
        "hog",
        "--grace-period=1",
    ])
    .await
    .ok();
    wait_for("no pods left", BOUND, || async {
        let out = k.run(&["get", "pods", "--no-headers"]).await.stdout;
        out.trim().is_empty().then_some(())
    })
    .await;
    wait_for("no containers left in containerd", BOUND, || async {
        (ctd.containers() == 0).then_some(())
    })
    .await;

    // A node whose runtime is down is NotReady, with the runtime's reason, and Ready again
    // once it is back.
    let ready = || async {
        k.run(&[
            "get",
            "node",
            "cri1",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} {.status.conditions[?(@.type==\"Ready\")].message}",
        ])
        .await
        .stdout
    };
    ctd.kill();
    let down = wait_for("cri1 NotReady with containerd stopped", BOUND, || async {
        let out = ready().await;
        out.starts_with("False ").then_some(out)
    })
    .await;
    assert!(down.contains("container runtime is down"), "{down}");
    ctd.run();
    wait_for("cri1 Ready again with containerd back", BOUND, || async {
        (ready().await.starts_with("True ")).then_some(())
    })
    .await;
}

/// Containers in the containerd of a `rkube up --runtime cri` agent (sandboxes and exited
/// containers kept for `logs --previous` included), and how many of them run.
fn host_containers(c: &Cluster, agent: &str) -> (usize, usize) {
    let ctr = |what: &str| {
        let out = std::process::Command::new("ctr")
            .args(["-n", "k8s.io", "--address"])
            .arg(
                c.path()
                    .join("agents")
                    .join(format!("{agent}-containerd"))
                    .join("c.sock"),
            )
            .args([what, "ls"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let all = ctr("containers").lines().skip(1).count();
    let running = ctr("tasks")
        .lines()
        .filter(|l| l.contains("RUNNING"))
        .count();
    (all, running)
}

/// SIGKILL to the pod's main process, found on this machine by the HOSTNAME the runtime gives
/// it (the test's own containers).
fn kill_pod_process(pod: &str, comm: &str) -> bool {
    let mut killed = false;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let marker = format!("HOSTNAME={pod}\0");
        if name.trim() == comm
            && environ
                .windows(marker.len())
                .any(|w| w == marker.as_bytes())
        {
            killed |= unsafe { libc::kill(pid, libc::SIGKILL) } == 0;
        }
    }
    killed
}

/// The issue's acceptance, as a new user meets it: `rkube up --runtime cri` makes each agent a
/// host of its own (namespace, address, containerd, pod CIDR); an image built here is loaded
/// with `rkube image load`; a Deployment's pods answer HTTP from this machine and from each
/// other across nodes; logs and exec work; a killed container is restarted; a failing readiness
/// probe takes a pod out of its Service's endpoints; a restarted agent adopts its containers; a
/// killed agent's pods move and, when it is back, its old containers are removed.
#[tokio::test]
async fn up_with_the_containerd_runtime_runs_pods_on_hosts_of_their_own() {
    let images = tempfile::tempdir().unwrap();
    cluster_tests::build_images(images.path());
    let (c, k) = cluster_with(
        2,
        &[
            "--runtime",
            "cri",
            "--node-monitor-period",
            "500ms",
            "--node-monitor-grace-period",
            "4s",
            "--node-eviction-rate",
            "100",
            "--agent-args=--lease-interval=1s",
        ],
    )
    .await;
    k.wait_nodes_ready(&["agent1", "agent2"]).await;
    let nodes = k
        .run(&["get", "nodes", "-o",
               "jsonpath={range .items[*]}{.status.addresses[0].address} {.status.nodeInfo.containerRuntimeVersion}{\"\\n\"}{end}"])
        .await
        .ok();
    let lines: Vec<&str> = nodes.lines().collect();
    assert_eq!(lines.len(), 2, "{nodes}");
    assert_ne!(
        lines[0].split(' ').next(),
        lines[1].split(' ').next(),
        "an address each: {nodes}"
    );
    for l in &lines {
        assert!(
            l.contains(" containerd://") && !l.starts_with("127."),
            "{nodes}"
        );
    }
    let load = std::process::Command::new(rkube_bin())
        .args(["image", "load", "--dir"])
        .arg(c.path())
        .arg(images.path().join("busybox.tar"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&load.stdout).to_string();
    assert!(
        load.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&load.stderr)
    );
    assert!(
        said.contains("agent1: loaded rkube.local/busybox:1"),
        "{said}"
    );
    assert!(
        said.contains("agent2: loaded rkube.local/busybox:1"),
        "{said}"
    );

    let app = r#"{"apiVersion":"v1","kind":"List","items":[
      {"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web"},
       "spec":{"replicas":3,"selector":{"matchLabels":{"app":"web"}},
       "template":{"metadata":{"labels":{"app":"web"}},"spec":{
         "terminationGracePeriodSeconds":2,
         "tolerations":[{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":2},
                        {"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":2}],
         "containers":[{"name":"httpd","image":"rkube.local/busybox:1","command":["sh","-c",
           "echo hello from $(hostname) > /www/index.html; echo ok > /www/ready; echo serving as $(hostname); exec httpd -f -p 8080 -h /www"],
           "readinessProbe":{"httpGet":{"path":"/ready","port":8080},"periodSeconds":1,"failureThreshold":1}}]}}}},
      {"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},
       "spec":{"selector":{"app":"web"},"ports":[{"port":80,"targetPort":8080}]}}]}"#;
    k.run_with_input(&["apply", "-f", "-"], app).await.ok();
    let status = k
        .run(&["rollout", "status", "deployment/web", "--timeout=90s"])
        .await;
    assert!(status.success, "{}{}", status.stdout, status.stderr);
    // (name, ip, node, restarts, containerID) of the live pods.
    let pods = || async {
        k.run(&["get", "pods", "-l", "app=web", "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.podIP} {.spec.nodeName} {.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].containerID} {.metadata.deletionTimestamp}{\"\\n\"}{end}"])
            .await
            .ok()
            .lines()
            .map(|l| l.split(' ').map(str::to_string).collect::<Vec<_>>())
            .filter(|p| p.len() == 6 && p[5].is_empty())
            .map(|p| p[..5].to_vec())
            .collect::<Vec<_>>()
    };
    let running = pods().await;
    assert_eq!(running.len(), 3, "{running:?}");
    for p in &running {
        let (name, ip) = (&p[0], &p[1]);
        let body = wait_for(&format!("{name} answering at {ip}"), BOUND, || async {
            cluster_tests::http_get(&format!("{ip}:8080")).await
        })
        .await;
        assert!(body.contains(&format!("hello from {name}")), "{body}");
        let logs = k.run(&["logs", name]).await.ok();
        assert_eq!(logs.trim(), format!("serving as {name}"));
        let out = k.run(&["exec", name, "--", "hostname"]).await.ok();
        assert_eq!(out.trim(), *name);
    }
    // Pods on different nodes reach each other at their own addresses.
    let a = running
        .iter()
        .find(|p| p[2] == "agent1")
        .expect("a pod on agent1");
    let b = running
        .iter()
        .find(|p| p[2] == "agent2")
        .expect("a pod on agent2");
    let across = k
        .run(&[
            "exec",
            &a[0],
            "--",
            "sh",
            "-c",
            &format!(
                "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {} 8080",
                b[1]
            ),
        ])
        .await
        .ok();
    assert!(across.contains(&format!("hello from {}", b[0])), "{across}");

    // A failing readiness probe: NotReady, out of the Service's endpoints.
    let endpoints = || async {
        let out = k
            .run(&[
                "get",
                "endpoints",
                "web",
                "-o",
                "jsonpath={.subsets[*].addresses[*].ip}",
            ])
            .await
            .stdout;
        let mut ips: Vec<String> = out.split_whitespace().map(str::to_string).collect();
        ips.sort();
        ips
    };
    wait_for("3 endpoints", BOUND, || async {
        (endpoints().await.len() == 3).then_some(())
    })
    .await;
    k.run(&["exec", &a[0], "--", "rm", "/www/ready"]).await.ok();
    wait_for("the unready pod out of the endpoints", BOUND, || async {
        let ips = endpoints().await;
        (ips.len() == 2 && !ips.contains(&a[1])).then_some(())
    })
    .await;
    let ready = k
        .run(&[
            "get",
            "pod",
            &a[0],
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ])
        .await
        .ok();
    assert_eq!(ready, "False");

    // A killed container process is restarted by the agent.
    assert!(kill_pod_process(&b[0], "httpd"), "found {}'s httpd", b[0]);
    wait_for("the killed container restarted", BOUND, || async {
        let p = pods().await;
        p.iter().any(|p| p[0] == b[0] && p[3] == "1").then_some(())
    })
    .await;

    // An agent restarted at once adopts its containers: same IDs, none made twice.
    let before: Vec<Vec<String>> = pods()
        .await
        .into_iter()
        .filter(|p| p[2] == "agent2")
        .collect();
    let containers = host_containers(&c, "agent2");
    assert_eq!(
        containers.1,
        2 * before.len(),
        "a sandbox and a container run per pod"
    );
    c.kill_agent("agent2").await;
    c.restart_missing().await.expect("rkube up restarts agent2");
    k.wait_nodes_ready(&["agent2"]).await;
    let after: Vec<Vec<String>> = pods()
        .await
        .into_iter()
        .filter(|p| p[2] == "agent2")
        .collect();
    assert_eq!(before, after);
    assert_eq!(host_containers(&c, "agent2"), containers);

    // A killed agent's node goes NotReady, its pods run again on the other node; back, it
    // removes its old containers.
    c.kill_agent("agent1").await;
    wait_for("agent1 NotReady", BOUND, || async {
        let out = k.run(&["get", "node", "agent1", "--no-headers"]).await.ok();
        out.contains("NotReady").then_some(())
    })
    .await;
    wait_for("3 pods running on agent2", BOUND, || async {
        let p = pods().await;
        (p.len() == 3 && p.iter().all(|p| p[2] == "agent2")).then_some(())
    })
    .await;
    c.restart_missing().await.expect("rkube up restarts agent1");
    k.wait_nodes_ready(&["agent1"]).await;
    wait_for("agent1's old containers removed", BOUND, || async {
        (host_containers(&c, "agent1") == (0, 0)).then_some(())
    })
    .await;
    wait_for("agent2 running 3 pods", BOUND, || async {
        (host_containers(&c, "agent2").1 == 6).then_some(())
    })
    .await;
    for p in pods().await {
        let body = wait_for(&format!("{} answering", p[0]), BOUND, || async {
            cluster_tests::http_get(&format!("{}:8080", p[1])).await
        })
        .await;
        assert!(body.contains(&format!("hello from {}", p[0])), "{body}");
    }
}

/// An agent renews its client certificate once 80% of its life has passed, with the certificate
/// it holds (a `selfnodeclient` request), and goes on with the new one. Started here with a
/// certificate from the cluster CA that is already past that point (30 s, backdated five minutes
/// as every certificate the CA signs), instead of waiting out the shortest signing duration.
#[tokio::test]
async fn an_agent_renews_its_client_certificate_before_it_expires() {
    let (c, k) = cluster_with(0, &[]).await;
    let words = join_command(&c).await;
    let server = words
        .iter()
        .position(|w| w == "--server")
        .map(|i| words[i + 1].clone())
        .expect("the join command names a server");
    let pki = c.path().join("pki");
    let dir = c.path().join("rot1");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(pki.join("ca.crt"), dir.join("ca.crt")).unwrap();
    let (csr, key) = rkube_pki::new_csr("system:node:rot1", &["system:nodes"]).unwrap();
    let cert = rkube_pki::CsrSigner::load(&pki)
        .unwrap()
        .sign(&csr, Duration::from_secs(30), true, false)
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    let (_, not_after) = rkube_pki::validity(cert.as_bytes()).unwrap();
    assert!(not_after < now + 60, "a certificate about to expire");
    std::fs::write(
        dir.join("kubelet-client-current.pem"),
        format!("{cert}{key}"),
    )
    .unwrap();
    // No token: the agent has a certificate.
    let agent = tokio::process::Command::new(rkube_bin())
        .args([
            "agent", "--sim", "--server", &server, "--name", "rot1", "--port", "0",
        ])
        .args(["--lease-interval", "1s"])
        .arg("--dir")
        .arg(&dir)
        .stderr(std::fs::File::create(c.path().join("rot1.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let _procs = Procs(vec![agent]);
    let renewed = wait_for("the renewed certificate on disk", BOUND, || async {
        let pem = std::fs::read_to_string(dir.join("kubelet-client-current.pem")).ok()?;
        let (_, not_after) = rkube_pki::validity(pem.as_bytes()).ok()?;
        (not_after > chrono::Utc::now().timestamp() + 3600).then_some(not_after)
    })
    .await;
    assert!(
        renewed > now + 300 * 86400,
        "signed for the cluster's signing duration (a year)"
    );
    let csrs = k
        .run(&[
            "get",
            "csr",
            "-o",
            "jsonpath={range .items[*]}{.spec.username} {.status.conditions[0].type}{\"\\n\"}{end}",
        ])
        .await
        .ok();
    assert!(csrs.contains("system:node:rot1 Approved"), "{csrs}");
    k.wait_nodes_ready(&["rot1"]).await;
    // The old certificate expires; the node keeps its heartbeat with the new one.
    tokio::time::sleep(Duration::from_secs(
        (not_after - chrono::Utc::now().timestamp()).max(0) as u64 + 2,
    ))
    .await;
    let renew_time = || async {
        k.run(&[
            "get",
            "lease",
            "rot1",
            "-n",
            "kube-node-lease",
            "-o",
            "jsonpath={.spec.renewTime}",
        ])
        .await
        .ok()
    };
    let before = renew_time().await;
    wait_for(
        "a heartbeat after the old certificate expired",
        BOUND,
        || async { (renew_time().await != before).then_some(()) },
    )
    .await;
}

/// exec and port-forward over WebSocket, as a client that speaks nothing else does it (kube-rs
/// offers v5.channel.k8s.io and v4.channel.k8s.io: exec gets v5, which the agent translates to
/// SPDY, port-forward v4, which the runtime speaks): the command's output and exit status come
/// back, and a forwarded port carries an HTTP exchange. kubectl's own exec (above) asks for v5
/// only and takes the same path; a subprotocol nobody serves is refused with a sentence.
async fn websocket_streams(c: &Cluster, pod: &str) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::AttachParams;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let pods: kube::Api<Pod> =
        kube::Api::namespaced(super::kube_client::client_of(c, 0).await, "default");
    let mut run = pods
        .exec(
            pod,
            [
                "sh",
                "-c",
                "cat /www/index.html; echo to-stderr >&2; exit 3",
            ],
            &AttachParams::default().stderr(true),
        )
        .await
        .expect("exec over a WebSocket");
    let mut stdout = String::new();
    run.stdout()
        .expect("stdout")
        .read_to_string(&mut stdout)
        .await
        .expect("stdout read");
    let mut stderr = String::new();
    run.stderr()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .await
        .expect("stderr read");
    let status = run
        .take_status()
        .expect("a status channel")
        .await
        .expect("the command's status");
    assert_eq!(stdout.trim(), format!("hello from {pod}"));
    assert_eq!(stderr.trim(), "to-stderr");
    assert_eq!(status.status.as_deref(), Some("Failure"), "{status:?}");
    assert_eq!(
        status.reason.as_deref(),
        Some("NonZeroExitCode"),
        "{status:?}"
    );

    let mut forward = pods
        .portforward(pod, &[8080])
        .await
        .expect("port-forward over a WebSocket");
    let mut conn = forward.take_stream(8080).expect("the port's stream");
    conn.write_all(b"GET / HTTP/1.0\r\n\r\n")
        .await
        .expect("request written");
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.expect("answer read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.contains(&format!("hello from {pod}")), "{answer}");
    drop(conn);
    forward.abort();

    // A subprotocol nobody serves is refused before the agent is asked, with the ones that
    // work (kubectl's tunnel among them; the streams suite uses it).
    let request = http::Request::get(format!(
        "/api/v1/namespaces/default/pods/{pod}/portforward?ports=8080"
    ))
    .header("connection", "Upgrade")
    .header("upgrade", "websocket")
    .header("sec-websocket-version", "13")
    .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
    .header("sec-websocket-protocol", "v9.channel.k8s.io")
    .body(kube::client::Body::from(Vec::new()))
    .expect("a request");
    let answer = pods.into_client().send(request).await.expect("an answer");
    assert_eq!(answer.status().as_u16(), 400);
    let body = answer.into_body().collect_bytes().await.expect("a body");
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("v9.channel.k8s.io")
            && body.contains("SPDY/3.1+portforward.k8s.io")
            && body.contains("v4.channel.k8s.io"),
        "{body}"
    );
}
