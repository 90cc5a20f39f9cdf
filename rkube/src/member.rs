//! `rkube member list|add|promote|remove`: membership of the control plane.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Subcommand;
use rkube_store::proto::etcdserverpb as pb;
use tonic::transport::Channel;

use crate::client::Target;

#[derive(Debug, Subcommand)]
pub enum MemberCommand {
    /// List members.
    List,
    /// Add a member (start it afterwards with --initial-cluster-state existing).
    Add {
        name: String,
        /// Its peer URL, https://HOST:PORT.
        #[arg(long)]
        peer_url: String,
        /// Add as a non-voting learner (promote it once it has caught up).
        #[arg(long)]
        learner: bool,
    },
    /// Promote a learner (hex ID) to a voting member.
    Promote { id: String },
    /// Remove a member (hex ID).
    Remove {
        id: String,
        /// Remove even when the remaining voters that answer would not form a quorum.
        #[arg(long)]
        force: bool,
    },
}

fn parse_id(id: &str) -> Result<u64> {
    u64::from_str_radix(id.trim_start_matches("0x"), 16)
        .map_err(|_| anyhow::anyhow!("{id:?} is not a hex member ID"))
}

fn msg(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", s.message())
}

fn print_members(members: &[pb::Member]) {
    println!(
        "{:<18} {:<8} {:<28} {:<28} {}",
        "ID", "NAME", "PEER ADDRS", "CLIENT ADDRS", "IS LEARNER"
    );
    for m in members {
        println!(
            "{:<18x} {:<8} {:<28} {:<28} {}",
            m.id,
            if m.name.is_empty() {
                "(unstarted)"
            } else {
                &m.name
            },
            m.peer_ur_ls.join(","),
            m.client_ur_ls.join(","),
            m.is_learner
        );
    }
}

pub async fn run(target: &Target, ch: Channel, cmd: MemberCommand) -> Result<()> {
    let mut cluster = pb::cluster_client::ClusterClient::new(ch);
    match cmd {
        MemberCommand::List => {
            let r = cluster
                .member_list(pb::MemberListRequest { linearizable: true })
                .await
                .map_err(msg)?
                .into_inner();
            print_members(&r.members);
        }
        MemberCommand::Add {
            name,
            peer_url,
            learner,
        } => {
            let r = cluster
                .member_add(pb::MemberAddRequest {
                    peer_ur_ls: vec![peer_url.clone()],
                    is_learner: learner,
                })
                .await
                .map_err(msg)?
                .into_inner();
            let id = r.member.map_or(0, |m| m.id);
            println!(
                "Member {id:x} added ({name}, {peer_url}{})",
                if learner { ", learner" } else { "" }
            );
            let mut initial: Vec<String> = r
                .members
                .iter()
                .filter(|m| m.id != id)
                .map(|m| {
                    format!(
                        "{}={}",
                        m.name,
                        m.peer_ur_ls.first().cloned().unwrap_or_default()
                    )
                })
                .collect();
            initial.push(format!("{name}={peer_url}"));
            println!("Start it with: rkube server --name {name} --initial-cluster {} --initial-cluster-state existing ...", initial.join(","));
        }
        MemberCommand::Promote { id } => {
            let id = parse_id(&id)?;
            cluster
                .member_promote(pb::MemberPromoteRequest { id })
                .await
                .map_err(msg)?;
            println!("Member {id:x} promoted");
        }
        MemberCommand::Remove { id, force } => {
            let id = parse_id(&id)?;
            let list = cluster
                .member_list(pb::MemberListRequest {
                    linearizable: false,
                })
                .await
                .map_err(msg)?
                .into_inner();
            let remaining: Vec<&pb::Member> = list
                .members
                .iter()
                .filter(|m| m.id != id && !m.is_learner)
                .collect();
            if !force && list.members.iter().any(|m| m.id == id && !m.is_learner) {
                let mut answering = 0;
                for m in &remaining {
                    let Some(url) = m.client_ur_ls.first() else {
                        continue;
                    };
                    let mut maint =
                        pb::maintenance_client::MaintenanceClient::new(target.channel_to(url)?);
                    let call = maint.status(pb::StatusRequest {});
                    if matches!(
                        tokio::time::timeout(Duration::from_secs(3), call).await,
                        Ok(Ok(_))
                    ) {
                        answering += 1;
                    }
                }
                let quorum = remaining.len() / 2 + 1;
                if answering < quorum {
                    bail!(
                        "removing {id:x} would leave {} voters of which only {answering} answer, fewer than the quorum of {quorum}; \
                         bring members back first, or pass --force",
                        remaining.len()
                    );
                }
            }
            cluster
                .member_remove(pb::MemberRemoveRequest { id })
                .await
                .map_err(msg)?;
            println!("Member {id:x} removed");
        }
    }
    Ok(())
}
