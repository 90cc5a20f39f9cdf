//! Helpers several suites share: writers that remember what was acknowledged, the check that
//! every member has it, a started three-member cluster, and how etcdctl's JSON output reads.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use cluster_tests::{wait_for, Cluster, Options, WithLogs};
use tokio::sync::Mutex;

/// Writers that put unique keys (`prefix/<writer>/<n>`) round-robin over the members until
/// stopped, remembering every acknowledged key.
pub(crate) struct Writers {
    stop: Arc<std::sync::atomic::AtomicBool>,
    acked: Arc<Mutex<BTreeMap<String, String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    pub(crate) fn start(cluster: &Arc<Cluster>, prefix: &str, writers: usize) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(BTreeMap::new()));
        let mut tasks = Vec::new();
        for w in 0..writers {
            let (cluster, stop, acked, prefix) = (
                cluster.clone(),
                stop.clone(),
                acked.clone(),
                prefix.to_string(),
            );
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let member = (w + n as usize) % cluster.members.len();
                    let key = format!("{prefix}/{w}/{n:06}");
                    let value = format!("v{w}-{n}");
                    if cluster.put(member, &key, &value).await.is_ok() {
                        acked.lock().await.insert(key, value);
                    } else {
                        // A failed write may or may not have committed; it is not counted as
                        // acknowledged. Back off briefly while the cluster recovers.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    n += 1;
                }
            }));
        }
        Self { stop, acked, tasks }
    }

    pub(crate) async fn count(&self) -> usize {
        self.acked.lock().await.len()
    }

    pub(crate) async fn wait_count(&self, at_least: usize) {
        wait_for(
            "writes to be acknowledged",
            Duration::from_secs(60),
            || async { (self.count().await >= at_least).then_some(()) },
        )
        .await
    }

    pub(crate) async fn finish(self) -> BTreeMap<String, String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        Arc::try_unwrap(self.acked)
            .map(|m| m.into_inner())
            .unwrap_or_default()
    }
}

/// Every acknowledged write is on every listed member, and they agree on revision and hash.
pub(crate) async fn check_all_present(
    c: &Cluster,
    members: &[usize],
    prefix: &str,
    acked: &BTreeMap<String, String>,
) {
    let revision = c.wait_converged(members).await;
    let mut hashes = BTreeSet::new();
    for &i in members {
        let keys: BTreeMap<String, String> = c
            .local_keys(i, prefix)
            .await
            .logs(c)
            .expect("read keys")
            .into_iter()
            .collect();
        for (k, v) in acked {
            assert_eq!(
                keys.get(k),
                Some(v),
                "member {} lost acknowledged write {k} (it has {} keys under {prefix}, revision {revision})",
                c.members[i].name,
                keys.len()
            );
        }
        hashes.insert(c.hash_kv(i, revision).await.expect("hash"));
    }
    assert_eq!(
        hashes.len(),
        1,
        "members disagree on the hash of the keyspace at revision {revision}"
    );
}

pub(crate) fn assert_exactly_once_in_order(seen: &[(i64, String)]) {
    for w in seen.windows(2) {
        assert!(
            w[0].0 < w[1].0,
            "events out of order or repeated: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
}

/// A three-member cluster with a leader.
pub(crate) async fn started_cluster() -> Cluster {
    let c = Cluster::start(Options::default())
        .await
        .expect("cluster starts");
    c.wait_leader().await;
    c
}

/// A `-w json` document.
pub(crate) fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// How etcdctl's `-w json` writes keys and values.
pub(crate) fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A DaemonSet that every simulated node runs, as the daemonsets and disruption suites use it.
pub(crate) const NODE_AGENT: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: node-agent
spec:
  selector:
    matchLabels:
      app: node-agent
  template:
    metadata:
      labels:
        app: node-agent
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: agent
        image: rkube.local/busybox:1
"#;

/// A cluster whose `agents` agents run real containers (`rkube up --runtime cri`), with the
/// images built here (`rkube.local/busybox:1` and `:2`) loaded into every agent's containerd,
/// its nodes Ready.
pub(crate) async fn cri_cluster(agents: usize) -> (Cluster, cluster_tests::kubectl::Kubectl) {
    let images = tempfile::tempdir().unwrap();
    cluster_tests::build_images(images.path());
    let (c, k) = cluster_of(agents, vec!["--runtime".into(), "cri".into()]).await;
    for image in ["busybox.tar", "busybox2.tar"] {
        load_image(&c, &images.path().join(image));
    }
    (c, k)
}

/// [`NODE_AGENT`] for real containers: its container says which node it runs on and runs
/// until it is stopped.
pub(crate) fn node_agent_process() -> String {
    format!(
        "{NODE_AGENT}        command: [\"sh\", \"-c\", \"echo node-agent on $NODE_NAME; trap 'exit 0' TERM; sleep 3600 & wait\"]
        env:
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
"
    )
}

/// `kubectl port-forward <target> :<port>`: the page the forwarded local port serves.
pub(crate) async fn port_forward_get(
    k: &cluster_tests::kubectl::Kubectl,
    target: &str,
    port: u16,
) -> String {
    let (mut forward, mut lines) = k.spawn_lines(&["port-forward", target, &format!(":{port}")]);
    let line = cluster_tests::kubectl::wait_line(
        &mut lines,
        &["Forwarding from 127.0.0.1:"],
        Duration::from_secs(60),
    )
    .await;
    let local: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    let body = wait_for(
        "the forwarded port answering",
        Duration::from_secs(60),
        || async { cluster_tests::http_get(&format!("127.0.0.1:{local}")).await },
    )
    .await;
    let _ = forward.kill().await;
    body
}

/// The lines of kubectl's table output, split into cells.
pub(crate) fn words(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// `kubectl get WHAT -o jsonpath=PATH`.
pub(crate) async fn jsonpath(
    k: &cluster_tests::kubectl::Kubectl,
    what: &[&str],
    path: &str,
) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let jp = format!("jsonpath={path}");
    args.extend_from_slice(&["-o", &jp]);
    k.run(&args).await.ok()
}

/// A cluster of `agents` simulated agents, every node ready, and kubectl for it.
pub(crate) async fn sim_cluster(agents: usize) -> (Cluster, cluster_tests::kubectl::Kubectl) {
    cluster_of(agents, Vec::new()).await
}

/// A cluster with the Kubernetes API and `agents` agents started with `up_args`, every node
/// ready, and kubectl for it.
pub(crate) async fn cluster_of(
    agents: usize,
    up_args: Vec<String>,
) -> (Cluster, cluster_tests::kubectl::Kubectl) {
    let c = Cluster::start(Options {
        kubernetes_api: true,
        agents,
        up_args,
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    let k = cluster_tests::kubectl::Kubectl::from_env_file(
        &c.path().join("env"),
        &c.path().join("home"),
    )
    .expect("env");
    let names: Vec<String> = (1..=agents).map(|i| format!("agent{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    k.wait_nodes_ready(&names).await;
    (c, k)
}

/// The revision numbers `kubectl rollout history <target>` lists.
pub(crate) async fn rollout_history(
    k: &cluster_tests::kubectl::Kubectl,
    target: &str,
) -> Vec<String> {
    let out = k.run(&["rollout", "history", target]).await.ok();
    out.lines()
        .skip_while(|l| !l.starts_with("REVISION"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Loads an image archive into the containerd of every agent of `c` (`rkube image load`).
pub(crate) fn load_image(c: &Cluster, archive: &std::path::Path) {
    let load = std::process::Command::new(cluster_tests::rkube_bin())
        .args(["image", "load", "--dir"])
        .arg(c.path())
        .arg(archive)
        .output()
        .expect("rkube image load runs");
    assert!(
        load.status.success(),
        "{}",
        String::from_utf8_lossy(&load.stderr)
    );
}
