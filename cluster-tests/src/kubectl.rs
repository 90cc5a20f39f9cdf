//! kubectl (1.32) as a user runs it against a cluster started by `rkube up`: with the
//! KUBECONFIG that `rkube up` wrote to DIR/env, its own HOME (so discovery caches never leak
//! between clusters), one-shot commands whose output a test reads, and `get -w` whose lines it
//! waits for.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, BufReader};

/// How long one kubectl command may take.
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct Kubectl {
    kubeconfig: PathBuf,
    home: PathBuf,
    extra_env: Vec<(String, String)>,
}

#[derive(Debug)]
pub struct KubectlOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl KubectlOutput {
    /// The output of a command that must have succeeded.
    pub fn ok(self) -> String {
        assert!(
            self.success,
            "kubectl failed:\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self.stdout
    }

    /// The error of a command that must have failed.
    pub fn err(self) -> String {
        assert!(
            !self.success,
            "kubectl succeeded but should have failed:\nstdout: {}",
            self.stdout
        );
        self.stderr
    }
}

impl Kubectl {
    /// kubectl with the KUBECONFIG named in an env file written by `rkube up`.
    pub fn from_env_file(env: &Path, home: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(env).with_context(|| format!("reading {}", env.display()))?;
        let Some(kubeconfig) = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("export KUBECONFIG="))
        else {
            bail!("{} sets no KUBECONFIG", env.display());
        };
        std::fs::create_dir_all(home)?;
        Ok(Kubectl {
            kubeconfig: PathBuf::from(kubeconfig),
            home: home.to_path_buf(),
            extra_env: Vec::new(),
        })
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The same kubectl with one more environment variable (EDITOR, say).
    pub fn with_env(&self, name: &str, value: &str) -> Self {
        let mut k = self.clone();
        k.extra_env.push((name.into(), value.into()));
        k
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("kubectl");
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("KUBECONFIG", &self.kubeconfig)
            .envs(self.extra_env.iter().cloned())
            .args(args)
            .kill_on_drop(true);
        cmd
    }

    pub async fn run(&self, args: &[&str]) -> KubectlOutput {
        self.run_with_input(args, "").await
    }

    pub async fn run_with_input(&self, args: &[&str], input: &str) -> KubectlOutput {
        let what = format!("kubectl {args:?}");
        let ran = crate::process::run(self.command(args), input, KUBECTL_TIMEOUT, &what).await;
        KubectlOutput {
            success: ran.success,
            stdout: ran.stdout,
            stderr: ran.stderr,
        }
    }

    /// Posts a node's status as its agent would: Ready with a fresh heartbeat, and, when
    /// given, `cpu` cores (4Gi of memory, 110 pods) of capacity.
    pub async fn report_node_ready(&self, name: &str, cpu: Option<&str>) {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let mut status = serde_json::json!({"status": {"conditions": [
            {"type": "Ready", "status": "True", "lastHeartbeatTime": now}]}});
        if let Some(cpu) = cpu {
            let resources = serde_json::json!({"cpu": cpu, "memory": "4Gi", "pods": "110"});
            status["status"]["capacity"] = resources.clone();
            status["status"]["allocatable"] = resources;
        }
        let patch = status.to_string();
        let args = [
            "patch",
            "node",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ];
        self.run(&args).await.ok();
    }

    /// For tests whose nodes are bare Node objects (no agent): does what a node's agent does
    /// for a pod being deleted, deleting it for good (grace period 0), until the returned
    /// guard is dropped.
    pub fn finish_terminating_pods(&self) -> FinishGuard {
        let k = self.clone();
        FinishGuard(tokio::spawn(async move {
            loop {
                let out = k
                    .run(&["get", "pods", "-A", "-o",
                           "jsonpath={range .items[*]}{.metadata.namespace} {.metadata.name} {.metadata.deletionTimestamp}{\"\\n\"}{end}"])
                    .await;
                for line in out.stdout.lines() {
                    let parts: Vec<&str> = line.split_whitespace().collect();
                    if let [ns, name, _stamp] = parts.as_slice() {
                        k.run(&[
                            "delete",
                            "pod",
                            "-n",
                            ns,
                            name,
                            "--grace-period=0",
                            "--force",
                            "--wait=false",
                        ])
                        .await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }))
    }

    /// Waits (a minute at most) until each named Node reports Ready.
    pub async fn wait_nodes_ready(&self, names: &[&str]) {
        for n in names {
            crate::wait_for(
                &format!("node {n} Ready"),
                Duration::from_secs(60),
                || async {
                    let out = self
                        .run(&[
                            "get",
                            "node",
                            n,
                            "-o",
                            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                        ])
                        .await;
                    (out.success && out.stdout.trim() == "True").then_some(())
                },
            )
            .await;
        }
    }

    /// Starts a command on a terminal of its own of `rows` x `cols` (`attach -it`, `run -it`).
    pub fn in_terminal(&self, args: &[&str], rows: u16, cols: u16) -> crate::pty::Terminal {
        let mut cmd = self.command(args);
        cmd.env("TERM", "xterm");
        crate::pty::Terminal::spawn(cmd, rows, cols).expect("kubectl starts on a terminal")
    }

    /// Starts a long-running command (`get -w`); its output lines arrive on the receiver.
    pub fn spawn_lines(
        &self,
        args: &[&str],
    ) -> (
        tokio::process::Child,
        tokio::sync::mpsc::UnboundedReceiver<String>,
    ) {
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl runs");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        (child, rx)
    }
}

/// Stops [`Kubectl::finish_terminating_pods`] when dropped.
pub struct FinishGuard(tokio::task::JoinHandle<()>);

impl Drop for FinishGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits for a line containing every one of `needles`; returns it.
pub async fn wait_line(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    needles: &[&str],
    timeout: Duration,
) -> String {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(line)) => {
                if needles.iter().all(|n| line.contains(n)) {
                    return line;
                }
                seen.push(line);
            }
            Ok(None) => {
                panic!("the command ended before printing {needles:?}; it printed {seen:#?}")
            }
            Err(_) => panic!("no line with {needles:?} within {timeout:?}; saw {seen:#?}"),
        }
    }
}

/// A three-server cluster with the Kubernetes API, once its leader has bootstrapped the system
/// namespaces, and kubectl configured for it as `source DIR/env` would.
pub async fn api_cluster() -> (crate::Cluster, Kubectl) {
    let c = crate::Cluster::start(crate::Options {
        kubernetes_api: true,
        ..crate::Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    let k = Kubectl::from_env_file(&c.path().join("env"), &c.path().join("home")).expect("env");
    crate::wait_for("the default namespace", Duration::from_secs(30), || async {
        let out = k.run(&["get", "ns", "default", "-o", "name"]).await;
        (out.success && out.stdout.trim() == "namespace/default").then_some(())
    })
    .await;
    (c, k)
}
