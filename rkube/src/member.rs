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
        "{:<18} {:<8} {:<28} {:<28} IS LEARNER",
        "ID", "NAME", "PEER ADDRS", "CLIENT ADDRS"
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
            let mut members = r.members.clone();
            if !members.iter().any(|m| m.id == id) {
                members.push(pb::Member {
                    id,
                    peer_ur_ls: vec![peer_url.clone()],
                    ..Default::default()
                });
            }
            println!("Start it with: rkube server --name {name} --initial-cluster {} --initial-cluster-state existing ...", initial_cluster(&members, id, &name));
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

/// `--initial-cluster` for member `own_id`, named `own_name`, joining `members`. A member added
/// but not started yet has no name: it gets `unstarted-<id>`, so that two members added at
/// once do not both read as the joining one (a server refuses a name that appears twice).
pub(crate) fn initial_cluster(members: &[pb::Member], own_id: u64, own_name: &str) -> String {
    members
        .iter()
        .map(|m| {
            let name = if m.id == own_id {
                own_name.to_string()
            } else if m.name.is_empty() {
                format!("unstarted-{:x}", m.id)
            } else {
                m.name.clone()
            };
            format!(
                "{name}={}",
                m.peer_ur_ls.first().cloned().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, name: &str, peer: &str) -> pb::Member {
        pb::Member {
            id,
            name: name.into(),
            peer_ur_ls: vec![peer.into()],
            ..Default::default()
        }
    }

    #[test]
    fn two_members_added_at_once_get_names_of_their_own() {
        let members = [
            member(1, "s1", "https://10.0.0.1:2380"),
            member(2, "", "https://10.0.0.2:2380"),
            member(3, "", "https://10.0.0.3:2380"),
        ];
        let s2 = initial_cluster(&members, 2, "s2");
        assert_eq!(
            s2,
            "s1=https://10.0.0.1:2380,s2=https://10.0.0.2:2380,unstarted-3=https://10.0.0.3:2380"
        );
        let parsed = rkube_store::server::parse_initial_cluster(&s2).expect("parses");
        assert_eq!(parsed.len(), 3);
        // The joining member's own entry is named by it even when the cluster knows a name.
        let again = initial_cluster(&[member(2, "old", "https://10.0.0.2:2380")], 2, "s2");
        assert_eq!(again, "s2=https://10.0.0.2:2380");
    }
}
