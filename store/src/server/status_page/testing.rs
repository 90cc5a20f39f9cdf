//! The report the tests render: three members (one unreachable), a node, events and half an
//! hour of samples.

use chrono::{DateTime, Utc};

use super::report::{MemberRow, MemberStatus, NodeCondition, NodeSummary, Nodes, Report, Role};
use crate::server::history::{Event, EventKind, Latency, Sample};

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .expect("test time")
        .with_timezone(&Utc)
}

struct MemberBuilder(MemberRow);

impl MemberBuilder {
    fn new(name: &str, id: u64) -> Self {
        Self(MemberRow {
            id: format!("{id:x}"),
            name: name.into(),
            peer_url: format!("https://127.0.0.1:{}", 2380 + id),
            client_url: Some(format!("https://127.0.0.1:{}", 2379 + id)),
            role: Role::Follower,
            this_member: false,
            status: Some(MemberStatus {
                term: 3,
                commit_index: 120,
                applied_index: 119,
                revision: 57,
                db_size_bytes: 3 << 20,
                leader: "1".into(),
                errors: Vec::new(),
            }),
            error: None,
            last_contact_seconds: Some(4.0),
            matched_index: None,
        })
    }
    fn leader(mut self) -> Self {
        self.0.role = Role::Leader;
        self
    }
    fn this(mut self) -> Self {
        self.0.this_member = true;
        self
    }
    fn unreachable(mut self, error: &str) -> Self {
        self.0.status = None;
        self.0.error = Some(error.into());
        self
    }
    fn build(self) -> MemberRow {
        self.0
    }
}

pub(super) fn report() -> Report {
    let now = at("2024-05-01T12:00:00Z");
    Report {
        member: "n1".into(),
        member_id: "1".into(),
        cluster_id: "c1".into(),
        generated_at: now,
        term: 3,
        leader: Some("1".into()),
        members: vec![
            MemberBuilder::new("n1", 1).leader().this().build(),
            MemberBuilder::new("n2", 2).build(),
            MemberBuilder::new("n3", 3)
                .unreachable("transport error")
                .build(),
        ],
        nodes: Nodes::Listed {
            items: vec![NodeSummary {
                name: "agent1".into(),
                unschedulable: false,
                conditions: vec![
                    NodeCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        reason: "KubeletReady".into(),
                        message: "kubelet is posting ready status".into(),
                        last_heartbeat_time: Some("2024-05-01T11:59:50Z".into()),
                    },
                    NodeCondition {
                        type_: "MemoryPressure".into(),
                        status: "False".into(),
                        reason: "KubeletHasSufficientMemory".into(),
                        message: String::new(),
                        last_heartbeat_time: Some("2024-05-01T11:59:50Z".into()),
                    },
                ],
            }],
        },
        events: vec![
            Event {
                at: at("2024-05-01T11:00:00Z"),
                kind: EventKind::Leader { leader: 1, term: 3 },
            },
            Event {
                at: at("2024-05-01T11:30:00Z"),
                kind: EventKind::ScheduledSnapshot {
                    file: "rkube-snapshot-x.snap".into(),
                    revision: 50,
                    bytes: 2048,
                },
            },
        ],
        samples: (0..30)
            .map(|i| Sample {
                at: now - chrono::Duration::seconds(10 * (30 - i)),
                proposals_per_second: i as f64,
                entries_per_second: 1.0,
                commit: (i % 10 != 5).then_some(Latency {
                    mean_ms: 2.0,
                    p99_ms: 8.0,
                }),
                fsync: Some(Latency {
                    mean_ms: 0.5,
                    p99_ms: 1.0,
                }),
            })
            .collect(),
        sample_interval_seconds: 10,
    }
}
