//! The local cluster's layout, kept in DIR/cluster.json: the members' addresses, the
//! control-plane endpoint and the settings every start passes to the servers and agents.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::UpArgs;
use rkube_store::server::snapshot_schedule::DEFAULT_RETAIN;

/// etcd's default space quota.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 * 1024 * 1024 * 1024;

fn default_quota() -> u64 {
    DEFAULT_QUOTA_BYTES
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalCluster {
    pub token: String,
    pub members: Vec<LocalMember>,
    pub snapshot_count: u64,
    pub snapshot_catchup_entries: u64,
    pub heartbeat_interval: u64,
    pub election_timeout: u64,
    #[serde(default = "default_quota")]
    pub quota_backend_bytes: u64,
    /// Scheduled snapshots, 0: none. (Absent in layouts written before they existed.)
    #[serde(default)]
    pub snapshot_interval_ms: u64,
    #[serde(default = "default_retain")]
    pub snapshot_retain: usize,
    /// Scheduled snapshots are zipped.
    #[serde(default)]
    pub snapshot_compress: bool,
    /// Absolute; each member writes to its own subdirectory.
    #[serde(default)]
    pub snapshot_dir: Option<PathBuf>,
    /// Members serve only the store, no Kubernetes API.
    #[serde(default)]
    pub store_only: bool,
    /// Controller settings given to `up` (`--node-monitor-grace-period 3s`...), passed to
    /// every server.
    #[serde(default)]
    pub controller_flags: Vec<String>,
    /// Node agents (`agent1`, `agent2`...), started after the servers.
    #[serde(default)]
    pub agents: usize,
    /// `--unsafe-no-fsync` for every server.
    #[serde(default)]
    pub unsafe_no_fsync: bool,
    #[serde(default)]
    pub agent_flags: Vec<String>,
    /// The agents run containers through containerd, each a host on this network (absent: the
    /// simulated runtime).
    #[serde(default)]
    pub network: Option<crate::hosts::HostNetwork>,
    /// The control-plane endpoint, held by the leader (absent in DIRs made before it existed).
    #[serde(default)]
    pub endpoint: Option<LocalEndpoint>,
}

/// Where the leader serves the etcd API and (unless store-only) the Kubernetes API, besides
/// its own ports: one address for the kubeconfig, DIR/env and the agents that survives the
/// loss of any member while a quorum stays (`rkube server --vip-client/--vip-api`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalEndpoint {
    pub client: String,
    #[serde(default)]
    pub api: Option<String>,
}

fn default_retain() -> usize {
    DEFAULT_RETAIN
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalMember {
    pub name: String,
    pub client: String,
    pub peer: String,
    pub metrics: String,
    /// The Kubernetes API (HTTPS). Absent in DIRs made before the API existed: the port after
    /// the metrics one.
    #[serde(default)]
    pub api: String,
}

impl LocalMember {
    /// Where the member serves cluster DNS: the port after the API's.
    pub fn dns_addr(&self) -> String {
        let api = self.api_addr();
        match api.rsplit_once(':') {
            Some((host, port)) => format!(
                "{host}:{}",
                port.parse::<u16>().unwrap_or(0).saturating_add(1)
            ),
            None => api,
        }
    }

    pub fn api_addr(&self) -> String {
        if !self.api.is_empty() {
            return self.api.clone();
        }
        match self.metrics.rsplit_once(':') {
            Some((host, port)) => format!(
                "{host}:{}",
                port.parse::<u16>().unwrap_or(0).saturating_add(1)
            ),
            None => self.metrics.clone(),
        }
    }
}

impl LocalCluster {
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("cluster.json");
        let bytes = std::fs::read(&path).with_context(|| {
            format!(
                "{} is not a local cluster (no {}); start one with `rkube up --dir {}`",
                dir.display(),
                path.display(),
                dir.display()
            )
        })?;
        serde_json::from_slice(&bytes).with_context(|| format!("cannot parse {}", path.display()))
    }

    pub fn client_urls(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("https://{}", m.client))
            .collect()
    }

    /// Where member `name` writes its scheduled snapshots; `dir` is the cluster's DIR.
    pub fn snapshot_dir(&self, dir: &Path, name: &str) -> PathBuf {
        match &self.snapshot_dir {
            Some(d) => d.join(name),
            None => dir.join(name).join("snapshots"),
        }
    }

    /// Applies the snapshot and controller flags given to `up`; true when the layout changed.
    pub(super) fn apply_snapshot_flags(&mut self, args: &UpArgs) -> Result<bool> {
        let flags_before = self.controller_flags.clone();
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        for (flag, value) in [
            ("--node-monitor-period", args.node_monitor_period.map(ms)),
            (
                "--node-monitor-grace-period",
                args.node_monitor_grace_period.map(ms),
            ),
            (
                "--node-eviction-rate",
                args.node_eviction_rate.map(|r| r.to_string()),
            ),
            ("--compaction-interval", args.compaction_interval.map(ms)),
            ("--metric-resolution", args.metric_resolution.map(ms)),
            (
                "--horizontal-pod-autoscaler-sync-period",
                args.horizontal_pod_autoscaler_sync_period.map(ms),
            ),
            (
                "--terminated-pod-gc-threshold",
                args.terminated_pod_gc_threshold.map(|n| n.to_string()),
            ),
        ] {
            let Some(value) = value else { continue };
            if let Some(i) = self.controller_flags.iter().position(|f| f == flag) {
                self.controller_flags
                    .drain(i..(i + 2).min(self.controller_flags.len()));
            }
            self.controller_flags.push(flag.to_string());
            self.controller_flags.push(value);
        }
        let flags_changed = flags_before != self.controller_flags;
        let before = (
            self.snapshot_interval_ms,
            self.snapshot_retain,
            self.snapshot_dir.clone(),
            self.snapshot_compress,
        );
        self.snapshot_compress |= args.snapshot_compress;
        if let Some(interval) = args.snapshot_interval {
            self.snapshot_interval_ms = interval.as_millis() as u64;
        }
        if let Some(retain) = args.snapshot_retain {
            self.snapshot_retain = retain;
        }
        if let Some(dir) = &args.snapshot_dir {
            self.snapshot_dir = Some(
                std::path::absolute(dir)
                    .with_context(|| format!("cannot resolve --snapshot-dir {}", dir.display()))?,
            );
        }
        Ok(flags_changed
            || before
                != (
                    self.snapshot_interval_ms,
                    self.snapshot_retain,
                    self.snapshot_dir.clone(),
                    self.snapshot_compress,
                ))
    }

    pub(super) fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",")
    }
}
