//! etcdctl as a user runs it against a cluster started by `rkube up`: one-shot commands whose
//! output a test reads, and long-running ones (`watch`) whose output lines it waits for.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::Cluster;

/// etcdctl (3.4, Debian's `etcd-client` package) run the way a user runs it after
/// `source DIR/env`: with exactly the variables `rkube up` wrote there, and none of the test
/// process's own `ETCDCTL_*` settings.
#[derive(Debug, Clone)]
pub struct Etcdctl {
    env: Vec<(String, String)>,
}

/// What one etcdctl command did.
#[derive(Debug)]
pub struct EtcdctlOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl EtcdctlOutput {
    /// The `Error: ...` line etcdctl ends a failed command with, without the prefix.
    pub fn error(&self) -> Option<&str> {
        self.stderr
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("Error: "))
    }
}

/// How long one etcdctl command may take; its own timeouts (dial 2 s, command 5 s) come first.
const ETCDCTL_TIMEOUT: Duration = Duration::from_secs(30);

impl Etcdctl {
    /// Reads the `export NAME=value` lines of an env file written by `rkube up`.
    pub fn from_env_file(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let env: Vec<(String, String)> = text
            .lines()
            .filter_map(|l| {
                let (name, value) = l.trim().strip_prefix("export ")?.split_once('=')?;
                let value = value.trim();
                let value = value
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                    .unwrap_or(value);
                Some((name.trim().to_string(), value.to_string()))
            })
            .collect();
        if !env.iter().any(|(n, _)| n == "ETCDCTL_ENDPOINTS") {
            bail!("{} sets no ETCDCTL_ENDPOINTS", path.display());
        }
        Ok(Self { env })
    }

    pub fn var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The endpoints of ETCDCTL_ENDPOINTS, in order.
    pub fn endpoints(&self) -> Vec<String> {
        self.var("ETCDCTL_ENDPOINTS")
            .unwrap_or_default()
            .split(',')
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The same settings with ETCDCTL_ENDPOINTS narrowed to one endpoint (etcdctl refuses a
    /// flag that shadows a variable, so the variable itself is changed).
    pub fn with_endpoint(&self, endpoint: &str) -> Self {
        let mut env = self.env.clone();
        for (n, v) in &mut env {
            if n == "ETCDCTL_ENDPOINTS" {
                *v = endpoint.to_string();
            }
        }
        Self { env }
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("etcdctl");
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("ETCDCTL_") {
                cmd.env_remove(name);
            }
        }
        cmd.args(args)
            .envs(self.env.iter().cloned())
            .kill_on_drop(true);
        cmd
    }

    /// Runs one command with `input` on its standard input.
    pub async fn run_with_input(&self, args: &[&str], input: &str) -> EtcdctlOutput {
        let what = format!("etcdctl {args:?} (Debian package etcd-client; .ci/run installs it)");
        let ran = crate::process::run(self.command(args), input, ETCDCTL_TIMEOUT, &what).await;
        EtcdctlOutput {
            success: ran.success,
            stdout: ran.stdout,
            stderr: ran.stderr,
        }
    }

    /// Runs one command with nothing on its standard input.
    pub async fn run(&self, args: &[&str]) -> EtcdctlOutput {
        self.run_with_input(args, "").await
    }

    /// Runs a command that must succeed, and returns its standard output.
    pub async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            out.success,
            "etcdctl {args:?} failed:\n{}{}",
            out.stdout, out.stderr
        );
        out.stdout
    }

    /// Runs a command that must fail, and returns the error etcdctl printed.
    pub async fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            !out.success,
            "etcdctl {args:?} should have failed but printed:\n{}",
            out.stdout
        );
        out.error()
            .unwrap_or_else(|| panic!("etcdctl {args:?} printed no error line:\n{}", out.stderr))
            .to_string()
    }

    /// Starts a long-running command (`watch`) whose standard output is collected line by line.
    pub fn spawn(&self, args: &[&str]) -> EtcdctlChild {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcdctl runs (Debian package etcd-client; .ci/run installs it)");
        let stdout = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stderr = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        for (pipe, sink) in [
            (
                child.stdout.take().map(|p| Box::pin(p) as PipeReader),
                stdout.clone(),
            ),
            (
                child.stderr.take().map(|p| Box::pin(p) as PipeReader),
                stderr.clone(),
            ),
        ] {
            let Some(pipe) = pipe else { continue };
            readers.push(tokio::spawn(async move {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    sink.lock().expect("lines").push(line);
                }
            }));
        }
        EtcdctlChild {
            args: args.iter().map(|a| a.to_string()).collect(),
            child,
            stdout,
            stderr,
            readers,
        }
    }
}

type PipeReader = std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>;

/// A running etcdctl process; killed when dropped.
pub struct EtcdctlChild {
    args: Vec<String>,
    child: tokio::process::Child,
    stdout: Arc<std::sync::Mutex<Vec<String>>>,
    stderr: Arc<std::sync::Mutex<Vec<String>>>,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl EtcdctlChild {
    /// Every line printed on standard output so far (empty lines included).
    pub fn lines(&self) -> Vec<String> {
        self.stdout.lock().expect("lines").clone()
    }

    /// Waits until at least `n` lines were printed on standard output, for at most `timeout`,
    /// and returns every line so far.
    pub async fn wait_lines(&self, n: usize, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let lines = self.lines();
            if lines.len() >= n {
                return lines;
            }
            if Instant::now() > deadline {
                panic!(
                    "etcdctl {:?} printed {} of {n} lines within {timeout:?}:\n{}\nstderr:\n{}",
                    self.args,
                    lines.len(),
                    lines.join("\n"),
                    self.stderr.lock().expect("lines").join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the process and waits for it and its output readers.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
        for r in self.readers.drain(..) {
            let _ = r.await;
        }
    }
}

impl Cluster {
    /// etcdctl with the settings of this cluster's DIR/env, but every member's own endpoint
    /// instead of the control-plane endpoint DIR/env names (which only a leader serves): the
    /// store's tests talk to the members, through quorum loss too.
    pub fn etcdctl(&self) -> Etcdctl {
        let members = self
            .members
            .iter()
            .map(|m| format!("https://{}", m.client))
            .collect::<Vec<_>>()
            .join(",");
        Etcdctl::from_env_file(&self.path().join("env"))
            .expect("rkube up writes DIR/env")
            .with_endpoint(&members)
    }
}
