//! etcd's Lease service. Grant and revoke go through the log; keep-alive and time-to-live are
//! answered by the leader, whose clock decides expiry.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::status;
use crate::error::{MvccError, StoreError};
use crate::mvcc::{Command, Output, MAX_LEASE_TTL};
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::lease_server::Lease;
use crate::server::node::Node;

pub struct LeaseService {
    pub node: Arc<Node>,
    /// Shortest TTL granted; shorter requests are raised to it (etcd: 1.5 election timeouts).
    pub min_ttl: i64,
}

/// etcd's answer to a TTL above the maximum (its `ErrGRPCLeaseTTLTooLarge`): clients such as
/// etcdctl recognise the error by this code and text.
fn ttl_too_large() -> Status {
    Status::out_of_range("etcdserver: too large lease TTL")
}

type KeepAliveStream =
    Pin<Box<dyn Stream<Item = Result<pb::LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        let req = request.into_inner();
        if req.ttl > MAX_LEASE_TTL {
            return Err(ttl_too_large());
        }
        let ttl = req.ttl.max(self.min_ttl);
        let id = if req.id != 0 {
            req.id
        } else {
            rand::random::<i64>().checked_abs().unwrap_or(1).max(1)
        };
        let applied = self
            .node
            .propose(Command::LeaseGrant { id, ttl })
            .await
            .map_err(status)?;
        let output = applied.output.map_err(|e| match e {
            MvccError::LeaseTtlTooLarge => ttl_too_large(),
            e => status(e.into()),
        })?;
        match output {
            Output::LeaseGranted { id, ttl } => Ok(Response::new(pb::LeaseGrantResponse {
                header: self.node.header(applied.revision),
                id,
                ttl,
                error: String::new(),
            })),
            other => Err(status(StoreError::Unavailable(format!(
                "unexpected apply result {other:?}"
            )))),
        }
    }

    async fn lease_revoke(
        &self,
        request: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let id = request.into_inner().id;
        let applied = self
            .node
            .propose(Command::LeaseRevoke { id })
            .await
            .map_err(status)?;
        applied.output.map_err(|e| status(e.into()))?;
        Ok(Response::new(pb::LeaseRevokeResponse {
            header: self.node.header(applied.revision),
        }))
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let node = self.node.clone();
        tokio::spawn(async move {
            while let Some(Ok(req)) = incoming.next().await {
                let reply = match node.lease_keep_alive(req.id).await {
                    Ok(ttl) => Ok(pb::LeaseKeepAliveResponse {
                        header: node.header(node.mvcc.revision()),
                        id: req.id,
                        ttl,
                    }),
                    // etcd answers a keep-alive of an unknown lease with TTL 0 rather than an error.
                    Err(StoreError::Mvcc(MvccError::LeaseNotFound)) => {
                        Ok(pb::LeaseKeepAliveResponse {
                            header: node.header(node.mvcc.revision()),
                            id: req.id,
                            ttl: 0,
                        })
                    }
                    Err(e) => Err(status(e)),
                };
                let failed = reply.is_err();
                if tx.send(reply).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        let req = request.into_inner();
        let (ttl, granted) = match self.node.lease_time_to_live(req.id).await {
            Ok(t) => t,
            // etcdctl prints "lease ... already expired" for TTL -1.
            Err(StoreError::Mvcc(MvccError::LeaseNotFound)) => {
                return Ok(Response::new(pb::LeaseTimeToLiveResponse {
                    header: self.node.header(self.node.mvcc.revision()),
                    id: req.id,
                    ttl: -1,
                    granted_ttl: 0,
                    keys: vec![],
                }))
            }
            Err(e) => return Err(status(e)),
        };
        let keys = if req.keys {
            // The keys are read here: first catch up with the leader's commit (a key attached
            // a moment ago through another member counts).
            self.node.linearizable_barrier().await.map_err(status)?;
            self.node
                .mvcc
                .lease_keys(req.id)
                .map_err(|e| status(e.into()))?
        } else {
            Vec::new()
        };
        Ok(Response::new(pb::LeaseTimeToLiveResponse {
            header: self.node.header(self.node.mvcc.revision()),
            id: req.id,
            ttl,
            granted_ttl: granted,
            keys,
        }))
    }

    async fn lease_leases(
        &self,
        _request: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        let leases = self.node.mvcc.leases().map_err(|e| status(e.into()))?;
        Ok(Response::new(pb::LeaseLeasesResponse {
            header: self.node.header(self.node.mvcc.revision()),
            leases: leases
                .into_iter()
                .map(|l| pb::LeaseStatus { id: l.id })
                .collect(),
        }))
    }
}
