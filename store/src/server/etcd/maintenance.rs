//! etcd's Maintenance service: Status, Hash, HashKV, Alarm, Defragment, MoveLeader and Snapshot
//! (in etcd's snapshot format, `crate::backup`). Downgrade is not provided and answers
//! `Unimplemented` saying so.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tonic::{Request, Response, Status};

use super::status;
use crate::mvcc::{Alarm, AlarmKind, Command, Output};
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::maintenance_server::Maintenance;
use crate::server::node::Node;

/// The etcd API version rkube's store speaks.
pub const ETCD_API_VERSION: &str = "3.5.0";

pub struct MaintenanceService(pub Arc<Node>);

/// Bytes per snapshot stream message.
const SNAPSHOT_CHUNK: usize = 64 * 1024;

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<pb::SnapshotResponse, Status>> + Send>>;

fn not_yet(what: &str) -> Status {
    Status::unimplemented(format!("etcdserver: {what} is not supported by rkube yet"))
}

fn alarm_kind_to_pb(kind: AlarmKind) -> pb::AlarmType {
    match kind {
        AlarmKind::NoSpace => pb::AlarmType::Nospace,
        AlarmKind::Corrupt => pb::AlarmType::Corrupt,
    }
}

fn alarm_name(kind: AlarmKind) -> &'static str {
    alarm_kind_to_pb(kind).as_str_name()
}

fn alarm_to_pb(a: &Alarm) -> pb::AlarmMember {
    pb::AlarmMember {
        member_id: a.member,
        alarm: alarm_kind_to_pb(a.kind) as i32,
    }
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(
        &self,
        request: Request<pb::AlarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        use pb::alarm_request::AlarmAction;
        let req = request.into_inner();
        let node = &self.0;
        let action = AlarmAction::try_from(req.action)
            .map_err(|_| Status::invalid_argument("etcdserver: unknown alarm action"))?;
        let kind = match pb::AlarmType::try_from(req.alarm) {
            Ok(pb::AlarmType::None) => None,
            Ok(pb::AlarmType::Nospace) => Some(AlarmKind::NoSpace),
            Ok(pb::AlarmType::Corrupt) => Some(AlarmKind::Corrupt),
            Err(_) => return Err(Status::invalid_argument("etcdserver: unknown alarm type")),
        };
        let alarms = match (action, kind) {
            (AlarmAction::Get, _) => node
                .mvcc
                .alarms()
                .into_iter()
                .filter(|a| kind.is_none_or(|k| a.kind == k))
                .collect(),
            // Changing "no alarm" changes nothing, as in etcd.
            (_, None) => Vec::new(),
            (action, Some(alarm)) => {
                let applied = node
                    .propose(Command::Alarm {
                        activate: action == AlarmAction::Activate,
                        member: req.member_id,
                        alarm,
                    })
                    .await
                    .map_err(status)?;
                match applied.output {
                    Ok(Output::Alarms(changed)) => changed,
                    Ok(other) => {
                        return Err(Status::internal(format!(
                            "unexpected result of an alarm change: {other:?}"
                        )))
                    }
                    Err(e) => return Err(status(e.into())),
                }
            }
        };
        Ok(Response::new(pb::AlarmResponse {
            header: node.header(node.mvcc.revision()),
            alarms: alarms.iter().map(alarm_to_pb).collect(),
        }))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let node = &self.0;
        let m = node.raft.metrics().borrow().clone();
        let is_learner = !m.membership_config.voter_ids().any(|id| id == node.id);
        let db_size = node.db_size.load(std::sync::atomic::Ordering::Relaxed) as i64;
        let mut errors = Vec::new();
        if m.current_leader.is_none() {
            errors.push("etcdserver: no leader".to_string());
        }
        // As etcd does, active alarms show among the member's errors.
        for a in node.mvcc.alarms() {
            errors.push(format!(
                "memberID:{} alarm:{}",
                a.member,
                alarm_name(a.kind)
            ));
        }
        Ok(Response::new(pb::StatusResponse {
            header: node.header(node.mvcc.revision()),
            version: ETCD_API_VERSION.to_string(),
            db_size,
            leader: m.current_leader.unwrap_or(0),
            raft_index: super::super::node::committed_index(&node.committed),
            raft_term: m.current_term,
            raft_applied_index: m.last_applied.map_or(0, |l| l.index),
            errors,
            db_size_in_use: db_size,
            is_learner,
            ..Default::default()
        }))
    }

    /// sled has no offline compaction to run: it rewrites its segments in the background and
    /// reuses the space of compacted revisions as it goes. Defragment makes everything durable
    /// and reads the size on disk afresh (so the quota check sees freed space at once).
    async fn defragment(
        &self,
        _request: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        let mvcc = self.0.mvcc.clone();
        tokio::task::spawn_blocking(move || mvcc.sync())
            .await
            .map_err(|e| status(crate::error::StorageError::Io(std::io::Error::other(e)).into()))?
            .map_err(|e| status(e.into()))?;
        self.0.refresh_db_size();
        Ok(Response::new(pb::DefragmentResponse {
            header: self.0.header(self.0.mvcc.revision()),
        }))
    }

    async fn hash(
        &self,
        _request: Request<pb::HashRequest>,
    ) -> Result<Response<pb::HashResponse>, Status> {
        let (hash, _) = self.0.mvcc.hash_kv(0).map_err(|e| status(e.into()))?;
        Ok(Response::new(pb::HashResponse {
            header: self.0.header(self.0.mvcc.revision()),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<pb::HashKvRequest>,
    ) -> Result<Response<pb::HashKvResponse>, Status> {
        let revision = request.into_inner().revision;
        let at = if revision > 0 {
            revision
        } else {
            self.0.mvcc.revision()
        };
        let (hash, compact_revision) = self.0.mvcc.hash_kv(at).map_err(|e| status(e.into()))?;
        Ok(Response::new(pb::HashKvResponse {
            header: self.0.header(self.0.mvcc.revision()),
            hash,
            compact_revision,
            hash_revision: at,
        }))
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        _request: Request<pb::SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        // A consistent copy of this member's state as etcd streams it: its bbolt database, then
        // the SHA-256 of it, which `etcdctl snapshot restore` checks.
        let mvcc = self.0.mvcc.clone();
        let (info, bytes) = tokio::task::spawn_blocking(move || crate::backup::encode(&mvcc))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| status(e.into()))?;
        let header = self.0.header(info.revision);
        let total = bytes.len();
        let chunks: Vec<Result<pb::SnapshotResponse, Status>> = bytes
            .chunks(SNAPSHOT_CHUNK)
            .enumerate()
            .map(|(i, blob)| pb::SnapshotResponse {
                header,
                remaining_bytes: (total - (i * SNAPSHOT_CHUNK + blob.len())) as u64,
                blob: blob.to_vec(),
                version: ETCD_API_VERSION.to_string(),
            })
            .map(Ok)
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    async fn move_leader(
        &self,
        request: Request<pb::MoveLeaderRequest>,
    ) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        let to = request.into_inner().target_id;
        self.0.move_leader(to).await.map_err(status)?;
        Ok(Response::new(pb::MoveLeaderResponse {
            header: self.0.header(self.0.mvcc.revision()),
        }))
    }

    async fn downgrade(
        &self,
        _request: Request<pb::DowngradeRequest>,
    ) -> Result<Response<pb::DowngradeResponse>, Status> {
        Err(not_yet("downgrade"))
    }
}
