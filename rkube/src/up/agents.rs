//! The local cluster's node agents: their names and ports, and starting them (each joined
//! with a bootstrap token the first time; with containerd hosts, each in a host of its own).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};

use super::access::KUBECONFIG_FILE;
use super::layout::LocalCluster;
use super::process::{pid_path, running_pid};

/// Agent i's HTTPS port: above the last server's ports.
fn agent_port(cluster: &LocalCluster, i: usize) -> u16 {
    let top = cluster
        .members
        .iter()
        .filter_map(|m| {
            m.api_addr()
                .rsplit(':')
                .next()
                .and_then(|p| p.parse::<u16>().ok())
        })
        .max()
        .unwrap_or(2402);
    top.saturating_add(10 + i as u16)
}

pub fn agent_name(i: usize) -> String {
    format!("agent{i}")
}

/// Starts the agents that are not running; an agent without a certificate yet joins with a
/// fresh bootstrap token (valid for an hour), as a worker on a real cluster would.
pub(super) async fn start_agents(dir: &Path, cluster: &LocalCluster) -> Result<()> {
    let abs = std::fs::canonicalize(dir)?;
    // The endpoint first: the agents fall back to the members only while it is down.
    let servers: Vec<String> = cluster
        .endpoint
        .iter()
        .filter_map(|e| e.api.clone())
        .chain(cluster.members.iter().map(|m| m.api_addr()))
        .map(|a| format!("https://{a}"))
        .collect();
    let ca_hash = rkube_pki::ca_spki_sha256(&std::fs::read(abs.join("pki").join("ca.crt"))?)?;
    let mut token = None;
    for i in 1..=cluster.agents {
        let name = agent_name(i);
        if let Some(pid) = running_pid(dir, &name) {
            println!("{name} is already running (pid {pid})");
            continue;
        }
        let agent_dir = abs.join("agents").join(&name);
        if !agent_dir.join("kubelet-client-current.pem").exists() && token.is_none() {
            token = Some(join_token(dir).await?);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.log")))?;
        let exe = std::env::current_exe().context("cannot find the rkube executable")?;
        let mut netns = None;
        let (mut command, what) = match &cluster.network {
            Some(net) => {
                // The agent's own host: its namespace, its containerd, its address.
                let containerd = crate::hosts::HostNetwork::containerd_name(&name);
                if running_pid(dir, &containerd).is_none() {
                    let pid = net.start_containerd(dir, &abs, &name)?;
                    println!(
                        "started {containerd} (pid {pid}) in network namespace {}, log {}",
                        net.netns(&name),
                        dir.join(format!("{containerd}.log")).display()
                    );
                }
                let mut c = std::process::Command::new(exe);
                netns = Some(net.enter(&mut c, &name)?);
                c.arg("agent")
                    .arg("--container-runtime-endpoint")
                    .arg(net.containerd_socket(&abs, &name))
                    .arg("--cni-conf-dir")
                    .arg(net.cni_dir(&abs, &name))
                    .args(["--node-ip", &net.node_ip(i)])
                    .args(["--pod-cidr", &net.pod_cidr(i)])
                    // kube-dns: the tenth address of the default service range.
                    .args(["--cluster-dns", "10.96.0.10"]);
                let what = format!(
                    "containerd runtime, host {} in network namespace {}, pods {}",
                    net.node_ip(i),
                    net.netns(&name),
                    net.pod_cidr(i)
                );
                (c, what)
            }
            None => {
                let mut c = std::process::Command::new(exe);
                c.arg("agent")
                    .arg("--sim")
                    .args(["--pod-cidr", &format!("10.244.{i}.0/24")])
                    // All agents share 127.0.0.1: each its own port, after the servers' ports.
                    .args(["--port", &agent_port(cluster, i).to_string()]);
                (c, "simulated runtime".to_string())
            }
        };
        command
            .args(["--server", &servers.join(",")])
            .args(["--discovery-token-ca-cert-hash", &ca_hash])
            .arg("--dir")
            .arg(&agent_dir)
            .args(["--name", &name])
            .args(&cluster.agent_flags);
        if let Some(t) = &token {
            command.env("RKUBE_JOIN_TOKEN", t);
        }
        use std::os::unix::process::CommandExt;
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        drop(netns);
        let pid = child.id() as i32;
        std::fs::write(pid_path(dir, &name), pid.to_string())?;
        println!(
            "started {name} (pid {pid}, {what}), log {}",
            dir.join(format!("{name}.log")).display()
        );
    }
    Ok(())
}

/// A bootstrap token for the local agents, made through the API with the admin's kubeconfig
/// (the API answers: `up` waited for it).
async fn join_token(dir: &Path) -> Result<String> {
    let args = crate::token::TokenArgs {
        kubeconfig: Some(dir.join(KUBECONFIG_FILE)),
        dir: Some(dir.to_path_buf()),
    };
    let (client, _) = crate::token::admin_client(&args).await?;
    crate::token::create(
        client,
        None,
        Duration::from_secs(3600),
        "signing,authentication",
        "system:bootstrappers:kubeadm:default-node-token",
        "rkube up: joins the local agents",
    )
    .await
    .context("creating a bootstrap token for the agents")
}
