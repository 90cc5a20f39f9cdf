//! What the page shows, as data: the report and its parts; `/status.json` serializes it.

use std::future::Future;
use std::pin::Pin;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::proto::etcdserverpb::StatusResponse;
use crate::server::history::{Event, Sample};

/// The nodes of the Kubernetes API this member serves, supplied by the API layer.
pub trait NodeSource: Send + Sync {
    #[allow(clippy::type_complexity)]
    fn nodes(&self) -> Pin<Box<dyn Future<Output = Result<Vec<NodeSummary>, String>> + Send + '_>>;
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    pub name: String,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    pub conditions: Vec<NodeCondition>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCondition {
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    pub reason: String,
    pub message: String,
    /// RFC 3339, as the object has it.
    pub last_heartbeat_time: Option<String>,
}

impl NodeSummary {
    pub(super) fn condition(&self, type_: &str) -> Option<&NodeCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// What the page shows of the nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum Nodes {
    /// This member serves no Kubernetes API (`--store-only`).
    NotServed,
    Listed {
        items: Vec<NodeSummary>,
    },
    Failed {
        error: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    Leader,
    Follower,
    Learner,
}

impl Role {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Learner => "learner",
        }
    }
}

/// A member's answer to etcd's `Status`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub revision: i64,
    pub db_size_bytes: i64,
    /// The leader as this member sees it (hex; empty: none).
    pub leader: String,
    /// Its errors and alarms, as `etcdctl endpoint status` shows them.
    pub errors: Vec<String>,
}

impl From<StatusResponse> for MemberStatus {
    fn from(s: StatusResponse) -> Self {
        Self {
            term: s.raft_term,
            commit_index: s.raft_index,
            applied_index: s.raft_applied_index,
            revision: s.header.map_or(0, |h| h.revision),
            db_size_bytes: s.db_size,
            leader: if s.leader == 0 {
                String::new()
            } else {
                format!("{:x}", s.leader)
            },
            errors: s.errors,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRow {
    pub id: String,
    /// Empty until the member has published its name.
    pub name: String,
    pub peer_url: String,
    pub client_url: Option<String>,
    /// Its role as this member sees the cluster.
    pub role: Role,
    pub this_member: bool,
    /// None when it did not answer; then `error` says why.
    pub status: Option<MemberStatus>,
    pub error: Option<String>,
    /// Seconds since it last answered this member (none: never since this member started).
    pub last_contact_seconds: Option<f64>,
    /// The last log index the leader knows it holds (on the leader's page only).
    pub matched_index: Option<u64>,
}

impl MemberRow {
    pub(super) fn label(&self) -> &str {
        if self.name.is_empty() {
            &self.id
        } else {
            &self.name
        }
    }
}

/// Everything the page shows; `/status.json` is this.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub member: String,
    pub member_id: String,
    pub cluster_id: String,
    #[serde(serialize_with = "rfc3339")]
    pub generated_at: DateTime<Utc>,
    pub term: u64,
    /// The leader as this member sees it (hex).
    pub leader: Option<String>,
    pub members: Vec<MemberRow>,
    pub nodes: Nodes,
    /// Leader changes and snapshots of the last hours, oldest first.
    pub events: Vec<Event>,
    /// One per `sampleIntervalSeconds` of the last hour, oldest first.
    pub samples: Vec<Sample>,
    pub sample_interval_seconds: u64,
}

fn rfc3339<S: serde::Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

#[cfg(test)]
mod tests {
    use crate::server::status_page::testing::report;

    #[test]
    fn the_report_serializes_as_json() {
        let json = serde_json::to_value(report()).expect("json");
        assert_eq!(json["members"][0]["role"], "leader");
        assert_eq!(json["members"][2]["status"], serde_json::Value::Null);
        assert_eq!(json["nodes"]["state"], "listed");
        assert_eq!(json["nodes"]["items"][0]["conditions"][0]["type"], "Ready");
        assert_eq!(json["events"][1]["kind"], "scheduledSnapshot");
        assert_eq!(json["samples"].as_array().map(Vec::len), Some(30));
        assert_eq!(json["generatedAt"], "2024-05-01T12:00:00.000Z");
    }
}
