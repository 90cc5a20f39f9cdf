//! A new DIR's layout: the agents' runtime, and each server's ports counted from
//! `--base-port`, the control-plane endpoint's after the first server's.

use anyhow::{bail, Result};

use super::layout::{LocalCluster, LocalEndpoint, LocalMember, DEFAULT_QUOTA_BYTES};
use super::UpArgs;
use rkube_store::server::snapshot_schedule::DEFAULT_RETAIN;

/// The agents' runtime for a new DIR: the containerd hosts' network, or None (simulated).
fn choose_runtime(args: &UpArgs) -> Result<Option<crate::hosts::HostNetwork>> {
    if args.store_only || args.agents == 0 || args.runtime.as_deref() == Some("sim") {
        return Ok(None);
    }
    match crate::hosts::cri_unavailable() {
        Some(why) => {
            println!("the agents use the simulated runtime (sim): the containerd runtime (cri) cannot run here, {why}");
            Ok(None)
        }
        None => Ok(Some(crate::hosts::HostNetwork::choose()?)),
    }
}

pub(super) fn create(args: &UpArgs) -> Result<LocalCluster> {
    if args.servers == 0 {
        bail!("--servers must be at least 1");
    }
    let network = choose_runtime(args)?;
    // With containerd hosts, the API listens on the bridge's address, which both this machine
    // and the agents' namespaces reach.
    let api_host = network
        .as_ref()
        .map(|n| n.host_ip())
        .unwrap_or_else(|| "127.0.0.1".into());
    let members = (1..=args.servers)
        .map(|i| {
            let base = args.base_port as usize + 10 * (i - 1);
            if base + 3 > u16::MAX as usize {
                bail!(
                    "--base-port {} leaves no room for {} servers",
                    args.base_port,
                    args.servers
                );
            }
            Ok(LocalMember {
                name: format!("n{i}"),
                client: format!("127.0.0.1:{base}"),
                peer: format!("127.0.0.1:{}", base + 1),
                metrics: format!("127.0.0.1:{}", base + 2),
                api: format!("{api_host}:{}", base + 3),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // The endpoint takes the two ports after the first server's DNS port, on the API's host.
    let endpoint = LocalEndpoint {
        client: format!("{api_host}:{}", args.base_port as usize + 5),
        api: (!args.store_only).then(|| format!("{api_host}:{}", args.base_port as usize + 6)),
    };
    Ok(LocalCluster {
        token: format!("rkube-{:016x}", rand::random::<u64>()),
        members,
        endpoint: Some(endpoint),
        snapshot_count: args.snapshot_count,
        snapshot_catchup_entries: args.snapshot_catchup_entries,
        heartbeat_interval: args.heartbeat_interval,
        election_timeout: args.election_timeout,
        quota_backend_bytes: args.quota_backend_bytes.unwrap_or(DEFAULT_QUOTA_BYTES),
        snapshot_interval_ms: 0,
        snapshot_retain: DEFAULT_RETAIN,
        snapshot_compress: false,
        snapshot_dir: None,
        store_only: args.store_only,
        controller_flags: Vec::new(),
        agents: if args.store_only { 0 } else { args.agents },
        unsafe_no_fsync: args.unsafe_no_fsync,
        agent_flags: args.agent_args.clone(),
        network,
    })
}
