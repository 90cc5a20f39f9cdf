//! Services that carry traffic, on `rkube up --runtime cri` (each agent a host of its own): the
//! agents' service proxy and the control plane's cluster DNS, tried with kubectl, the articles'
//! NodePort Service and locally built busybox images.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use cluster_tests::{http_get, wait_for, Cluster};

const BOUND: Duration = Duration::from_secs(60);

/// The pod names that answered `n` requests to `addr` (each page names its pod).
async fn answered_by(addr: &str, n: usize) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for _ in 0..n {
        if let Some(body) = http_get(addr).await {
            if let Some(name) = body
                .lines()
                .last()
                .and_then(|l| l.strip_prefix("hello from "))
            {
                seen.insert(name.trim().to_string());
            }
        }
    }
    seen
}

/// The rkube chains and jumps in a node's nat table (its network namespace, made by `up`).
fn nat_rules(c: &Cluster, agent: &str) -> Vec<String> {
    let layout: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.path().join("cluster.json")).unwrap()).unwrap();
    let ns = format!("{}-{agent}", layout["network"]["bridge"].as_str().unwrap());
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, "iptables-save", "-t", "nat"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("RKUBE"))
        .map(|l| {
            // Packet counters change; the rules do not.
            match l.split_once(" [") {
                Some((head, _)) if l.starts_with(':') => head.to_string(),
                _ => l.to_string(),
            }
        })
        .collect()
}

#[tokio::test]
async fn services_carry_traffic_through_every_node_and_resolve_by_name() {
    let (c, k) = super::common::cri_cluster(2).await;

    // The articles' NodePort Service (port 80, targetPort 80, nodePort 30008) in front of
    // three httpd pods, each page naming its pod; ready while /tmp/ready exists.
    let app = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"myapp-deployment"},
      "spec":{"replicas":3,"selector":{"matchLabels":{"app":"myapp"}},
      "template":{"metadata":{"labels":{"app":"myapp","type":"front-end"}},"spec":{
        "terminationGracePeriodSeconds":1,
        "containers":[{"name":"web","image":"rkube.local/busybox:1","command":["sh","-c",
          "touch /tmp/ready; echo hello from $(hostname) > /www/index.html; exec httpd -f -p 80 -h /www"],
          "readinessProbe":{"exec":{"command":["test","-f","/tmp/ready"]},"periodSeconds":1,"failureThreshold":1}}]}}}}"#;
    k.run_with_input(&["apply", "-f", "-"], app).await.ok();
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests");
    k.run(&[
        "apply",
        "-f",
        &manifests
            .join("service-nodeport.yaml")
            .display()
            .to_string(),
    ])
    .await
    .ok();
    let status = k
        .run(&[
            "rollout",
            "status",
            "deployment/myapp-deployment",
            "--timeout=90s",
        ])
        .await;
    assert!(status.success, "{}{}", status.stdout, status.stderr);
    let pods = || async {
        let out = k
            .run(&["get", "pods", "-l", "app=myapp", "-o",
                   "jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{\"\\n\"}{end}"])
            .await
            .ok();
        out.lines()
            .filter(|l| l.split(' ').nth(1).is_some_and(str::is_empty))
            .map(|l| l.split(' ').next().unwrap().to_string())
            .collect::<BTreeSet<String>>()
    };
    let all = pods().await;
    assert_eq!(all.len(), 3);
    let nodes = k
        .run(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[*].status.addresses[0].address}",
        ])
        .await
        .ok();
    let nodes: Vec<String> = nodes
        .split_whitespace()
        .map(|n| format!("{n}:30008"))
        .collect();
    assert_eq!(nodes.len(), 2);
    for node in &nodes {
        let seen = wait_for(
            &format!("all 3 pods answering at {node}"),
            BOUND,
            || async {
                let seen = answered_by(node, 30).await;
                (seen == all).then_some(seen)
            },
        )
        .await;
        assert_eq!(seen, all);
    }

    // A deleted pod's traffic goes to its replacement.
    let gone = all.iter().next().unwrap().clone();
    k.run(&["delete", "pod", &gone]).await.ok();
    let now = wait_for("the replacement answering instead", BOUND, || async {
        let live = pods().await;
        if live.len() != 3 || live.contains(&gone) {
            return None;
        }
        let seen = answered_by(&nodes[0], 30).await;
        (seen == live).then_some(live)
    })
    .await;
    assert!(!now.contains(&gone));

    // A pod failing its readiness probe stops receiving traffic.
    let unready = now.iter().next().unwrap().clone();
    k.run(&["exec", &unready, "--", "rm", "/tmp/ready"])
        .await
        .ok();
    wait_for("the unready pod out of the rotation", BOUND, || async {
        let seen = answered_by(&nodes[1], 30).await;
        (seen.len() == 2 && !seen.contains(&unready)).then_some(())
    })
    .await;

    // The articles' LoadBalancer Service gets an address of the pool `up` gave the servers,
    // which one node answers for; its pods answer there.
    k.run(&[
        "apply",
        "-f",
        &manifests
            .join("service-loadbalancer.yaml")
            .display()
            .to_string(),
    ])
    .await
    .ok();
    let voting = app
        .replace("myapp-deployment", "voting-app")
        .replace("\"app\":\"myapp\"", "\"app\":\"voting-app\"");
    k.run_with_input(&["apply", "-f", "-"], &voting).await.ok();
    let lb = wait_for("a load-balancer address", BOUND, || async {
        let ip = k
            .run(&[
                "get",
                "service",
                "voting-app-service",
                "-o",
                "jsonpath={.status.loadBalancer.ingress[0].ip}",
            ])
            .await
            .stdout;
        (!ip.is_empty()).then_some(ip)
    })
    .await;
    let layout: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.path().join("cluster.json")).unwrap()).unwrap();
    let octet = layout["network"]["octet"].as_u64().unwrap();
    assert!(
        lb.starts_with(&format!("10.{octet}.0.2")),
        "{lb} is in the pool"
    );
    let body = wait_for("the load-balancer address answering", BOUND, || async {
        http_get(&format!("{lb}:80")).await
    })
    .await;
    assert!(body.contains("hello from voting-app-"), "{body}");

    // A ClusterIP Service by name: from a pod of its namespace by its short name and its full
    // name, from another namespace by its full name only.
    k.run(&[
        "apply",
        "-f",
        &manifests
            .join("service-clusterip.yaml")
            .display()
            .to_string(),
    ])
    .await
    .ok();
    let backend = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"backend"},
      "spec":{"replicas":2,"selector":{"matchLabels":{"app":"myapp","type":"backend"}},
      "template":{"metadata":{"labels":{"app":"myapp","type":"backend"}},"spec":{
        "terminationGracePeriodSeconds":1,
        "containers":[{"name":"web","image":"rkube.local/busybox:1","command":["sh","-c",
          "echo backend $(hostname) > /www/index.html; exec httpd -f -p 80 -h /www"]}]}}}}"#;
    k.run_with_input(&["apply", "-f", "-"], backend).await.ok();
    k.run(&["create", "namespace", "dev"]).await.ok();
    for ns in ["default", "dev"] {
        k.run(&[
            "run",
            "client",
            "-n",
            ns,
            "--image=rkube.local/busybox:1",
            "--",
            "sleep",
            "3600",
        ])
        .await
        .ok();
    }
    for ns in ["default", "dev"] {
        let ready = k
            .run(&[
                "wait",
                "-n",
                ns,
                "--for=condition=Ready",
                "pod/client",
                "--timeout=90s",
            ])
            .await;
        assert!(ready.success, "{}", ready.stderr);
    }
    let status = k
        .run(&["rollout", "status", "deployment/backend", "--timeout=90s"])
        .await;
    assert!(status.success, "{}{}", status.stdout, status.stderr);
    // busybox's wget (Debian's static build) crashes with -T; `timeout` bounds it instead.
    let fetch = |ns: &'static str, url: &'static str| {
        let k = &k;
        async move {
            k.run(&[
                "exec", "-n", ns, "client", "--", "timeout", "10", "wget", "-qO-", url,
            ])
            .await
        }
    };
    for (ns, url) in [
        ("default", "http://backend"),
        ("default", "http://backend.default.svc.cluster.local"),
        ("dev", "http://backend.default.svc.cluster.local"),
    ] {
        let out = wait_for(&format!("{url} from {ns}"), BOUND, || async {
            let out = fetch(ns, url).await;
            out.stdout.starts_with("backend ").then_some(out.stdout)
        })
        .await;
        assert!(out.starts_with("backend backend-"), "{out}");
    }
    let short = fetch("dev", "http://backend").await;
    assert!(!short.success);
    assert!(
        short.stderr.contains("bad address 'backend'"),
        "{}",
        short.stderr
    );
    let resolv = k
        .run(&[
            "exec",
            "-n",
            "dev",
            "client",
            "--",
            "cat",
            "/etc/resolv.conf",
        ])
        .await
        .ok();
    assert!(
        resolv.contains("search dev.svc.cluster.local svc.cluster.local cluster.local")
            && resolv.contains("nameserver 10.96.0.10"),
        "{resolv}"
    );

    // A Service with no ready endpoints refuses connections at once (no hanging).
    k.run(&["create", "service", "clusterip", "nobody", "--tcp=81:81"])
        .await
        .ok();
    let refused = wait_for("a refused connection to nobody", BOUND, || async {
        let out = k
            .run(&["exec", "client", "--", "nc", "-w", "10", "nobody", "81"])
            .await;
        out.stderr
            .contains("Connection refused")
            .then_some(out.stderr)
    })
    .await;
    assert!(refused.contains("can't connect"), "{refused}");

    // A restarted agent keeps Services reachable while it is down and leaves no stale rules.
    let before = nat_rules(&c, "agent1");
    assert!(
        before.iter().any(|r| r.contains("-j RKUBE-SERVICES")),
        "{before:#?}"
    );
    c.kill_agent("agent1").await;
    let seen = answered_by(&nodes[0], 10).await;
    assert!(!seen.is_empty(), "the rules stay while the agent is down");
    c.restart_missing().await.expect("rkube up restarts agent1");
    wait_for("agent1's rules again, once each", BOUND, || async {
        (nat_rules(&c, "agent1") == before).then_some(())
    })
    .await;
    // A Service that goes takes its chains with it.
    k.run(&["delete", "service", "backend"]).await.ok();
    wait_for("backend's rules removed", BOUND, || async {
        let rules = nat_rules(&c, "agent1");
        (!rules.iter().any(|r| r.contains("default/backend")) && rules.len() < before.len())
            .then_some(())
    })
    .await;
}
