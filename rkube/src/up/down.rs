//! `rkube down`: stops the agents (with containerd hosts also their pods, containerds and
//! network), then the servers.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;

use super::agents::agent_name;
use super::layout::LocalCluster;
use super::process::stop;
use super::DEFAULT_DIR;

#[derive(Debug, Clone, Args)]
pub struct DownArgs {
    #[arg(long, default_value = DEFAULT_DIR)]
    pub dir: PathBuf,
}

pub async fn down(args: DownArgs) -> Result<()> {
    let cluster = LocalCluster::load(&args.dir)?;
    down_dir(&args.dir, &cluster).await
}

pub(super) async fn down_dir(dir: &Path, cluster: &LocalCluster) -> Result<()> {
    let agents: Vec<String> = (1..=cluster.agents).map(agent_name).collect();
    stop(dir, &agents).await;
    if let Some(net) = &cluster.network {
        // Containers stop with their node: sandboxes first (their addresses are released),
        // then each containerd and its shims, then the namespaces and the bridge.
        let abs = std::fs::canonicalize(dir)?;
        for agent in &agents {
            match net.stop_pods(&abs, agent).await {
                Ok(0) => {}
                Ok(n) => println!("stopped {n} pod(s) on {agent}"),
                Err(e) => println!("could not stop {agent}'s pods: {e:#}"),
            }
        }
        let containerds: Vec<String> = agents
            .iter()
            .map(|a| crate::hosts::HostNetwork::containerd_name(a))
            .collect();
        stop(dir, &containerds).await;
        for agent in &agents {
            net.stop_shims(&abs, agent);
        }
        for e in net.tear_down(&agents) {
            println!("cleaning up the hosts' network: {e}");
        }
    }
    let members: Vec<String> = cluster.members.iter().map(|m| m.name.clone()).collect();
    stop(dir, &members).await;
    Ok(())
}
