//! `rkube status`: every member with its role, term, indexes, revision and database size.

use std::time::Duration;

use anyhow::Result;
use rkube_store::proto::etcdserverpb as pb;
use serde::Serialize;

use crate::client::Target;

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub id: String,
    pub name: String,
    pub endpoint: String,
    pub role: String,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub revision: i64,
    pub db_size: i64,
    pub error: Option<String>,
}

impl Row {
    /// A member that gave no status (yet): only what the member list says, and why.
    fn unanswered(id: String, name: String, endpoint: String, role: &str) -> Row {
        Row {
            id,
            name,
            endpoint,
            role: role.into(),
            term: 0,
            commit_index: 0,
            applied_index: 0,
            revision: 0,
            db_size: 0,
            error: None,
        }
    }
}

/// Asks every reachable member for its status; unreachable members are listed with the error.
pub async fn collect(target: &Target) -> Vec<Row> {
    let mut endpoints: Vec<(String, String, String)> = Vec::new(); // (id, name, endpoint)
    for e in &target.endpoints {
        let Ok(ch) = target.channel_to(e) else {
            continue;
        };
        let mut cluster = pb::cluster_client::ClusterClient::new(ch);
        let mut req = tonic::Request::new(pb::MemberListRequest {
            linearizable: false,
        });
        req.set_timeout(Duration::from_secs(2));
        if let Ok(Ok(resp)) =
            tokio::time::timeout(Duration::from_secs(3), cluster.member_list(req)).await
        {
            for m in resp.into_inner().members {
                let endpoint = m.client_ur_ls.first().cloned().unwrap_or_default();
                endpoints.push((format!("{:x}", m.id), m.name.clone(), endpoint));
            }
            break;
        }
    }
    if endpoints.is_empty() {
        // No member answered the list: report each endpoint on its own.
        endpoints = target
            .endpoints
            .iter()
            .map(|e| (String::new(), String::new(), e.clone()))
            .collect();
    }
    let mut rows = Vec::new();
    for (id, name, endpoint) in endpoints {
        if endpoint.is_empty() {
            // A member added to the membership that has not started yet publishes no client
            // address (etcd lists it as unstarted): there is nothing to ask.
            rows.push(Row::unanswered(id, name, endpoint, "unstarted"));
            continue;
        }
        let mut row = Row::unanswered(id, name, endpoint.clone(), "unreachable");
        let status = async {
            let ch = target.channel_to(&endpoint)?;
            let mut m = pb::maintenance_client::MaintenanceClient::new(ch);
            let mut req = tonic::Request::new(pb::StatusRequest {});
            req.set_timeout(Duration::from_secs(2));
            let answer = tokio::time::timeout(Duration::from_secs(3), m.status(req)).await;
            let answer = answer.map_err(|_| anyhow::anyhow!("no answer within 3 s"))?;
            anyhow::Ok(
                answer
                    .map_err(|s| anyhow::anyhow!("{}", s.message()))?
                    .into_inner(),
            )
        }
        .await;
        match status {
            Ok(s) => {
                let header = s.header.unwrap_or_default();
                if row.id.is_empty() {
                    row.id = format!("{:x}", header.member_id);
                }
                row.role = if s.is_learner {
                    "learner".into()
                } else if s.leader != 0 && s.leader == header.member_id {
                    "leader".into()
                } else {
                    "follower".into()
                };
                row.term = s.raft_term;
                row.commit_index = s.raft_index;
                row.applied_index = s.raft_applied_index;
                row.revision = header.revision;
                row.db_size = s.db_size;
                if !s.errors.is_empty() {
                    row.error = Some(s.errors.join("; "));
                }
            }
            Err(e) => row.error = Some(e.to_string()),
        }
        rows.push(row);
    }
    rows
}

pub fn print_table(rows: &[Row]) {
    println!(
        "{:<18} {:<6} {:<26} {:<11} {:>5} {:>8} {:>8} {:>9} {:>9}  ERRORS",
        "ID", "NAME", "ENDPOINT", "ROLE", "TERM", "COMMIT", "APPLIED", "REVISION", "DB SIZE"
    );
    for r in rows {
        println!(
            "{:<18} {:<6} {:<26} {:<11} {:>5} {:>8} {:>8} {:>9} {:>9}  {}",
            r.id,
            r.name,
            r.endpoint,
            r.role,
            r.term,
            r.commit_index,
            r.applied_index,
            r.revision,
            human_bytes(r.db_size),
            r.error.as_deref().unwrap_or("")
        );
    }
}

fn human_bytes(n: i64) -> String {
    const UNITS: [&str; 4] = ["B", "kB", "MB", "GB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

pub async fn run(target: &Target, json: bool) -> Result<()> {
    let rows = collect(target).await;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print_table(&rows);
    }
    if rows.iter().all(|r| r.role == "unreachable") {
        anyhow::bail!("no member answered");
    }
    Ok(())
}
