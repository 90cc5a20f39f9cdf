//! etcd's KV service: Range, Put, DeleteRange, Txn, Compact.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{
    delete_from_pb, put_from_pb, range_from_pb, range_to_pb, status, txn_from_pb, txn_to_pb,
};
use crate::error::StoreError;
use crate::mvcc::{Command, Op, OpResult, Output, TxnRequest, TxnResult};
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::kv_server::Kv;
use crate::server::node::Node;

pub struct KvService(pub Arc<Node>);

impl KvService {
    /// Proposes a transaction and returns its result with the revision after it.
    async fn txn(&self, txn: TxnRequest) -> Result<(TxnResult, i64), Status> {
        let applied = self.0.propose(Command::Txn(txn)).await.map_err(status)?;
        match applied.output {
            Ok(Output::Txn(t)) => Ok((t, applied.revision)),
            Ok(other) => Err(status(StoreError::Unavailable(format!(
                "unexpected apply result {other:?}"
            )))),
            Err(e) => Err(status(e.into())),
        }
    }

    async fn single(&self, op: Op) -> Result<(OpResult, i64), Status> {
        let (mut t, rev) = self
            .txn(TxnRequest {
                compare: vec![],
                success: vec![op],
                failure: vec![],
            })
            .await?;
        t.responses
            .pop()
            .map(|r| (r, rev))
            .ok_or_else(|| Status::internal("empty transaction result"))
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(
        &self,
        request: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        let req = request.into_inner();
        let serializable = req.serializable;
        let req = range_from_pb(req)?;
        if !serializable {
            self.0.linearizable_barrier().await.map_err(status)?;
        }
        let (result, revision) = self.0.mvcc.range(&req).map_err(|e| status(e.into()))?;
        Ok(Response::new(range_to_pb(&self.0, result, revision)))
    }

    async fn put(
        &self,
        request: Request<pb::PutRequest>,
    ) -> Result<Response<pb::PutResponse>, Status> {
        let put = put_from_pb(request.into_inner())?;
        let op = Op::Put(put);
        crate::mvcc::validate_txn(&TxnRequest {
            compare: vec![],
            success: vec![op.clone()],
            failure: vec![],
        })
        .map_err(|e| status(e.into()))?;
        match self.single(op).await? {
            (OpResult::Put(p), rev) => Ok(Response::new(pb::PutResponse {
                header: self.0.header(rev),
                prev_kv: p.prev_kv.map(super::kv_to_pb),
            })),
            _ => Err(Status::internal("put produced another result")),
        }
    }

    async fn delete_range(
        &self,
        request: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        let del = delete_from_pb(request.into_inner())?;
        match self.single(Op::Delete(del)).await? {
            (OpResult::Delete(d), rev) => Ok(Response::new(pb::DeleteRangeResponse {
                header: self.0.header(rev),
                deleted: d.deleted,
                prev_kvs: d.prev_kvs.into_iter().map(super::kv_to_pb).collect(),
            })),
            _ => Err(Status::internal("delete produced another result")),
        }
    }

    async fn txn(
        &self,
        request: Request<pb::TxnRequest>,
    ) -> Result<Response<pb::TxnResponse>, Status> {
        let txn = txn_from_pb(request.into_inner())?;
        let (result, rev) = KvService::txn(self, txn).await?;
        Ok(Response::new(txn_to_pb(&self.0, result, rev)))
    }

    async fn compact(
        &self,
        request: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        let revision = request.into_inner().revision;
        let applied = self
            .0
            .propose(Command::Compact { revision })
            .await
            .map_err(status)?;
        applied.output.map_err(|e| status(e.into()))?;
        // The leader answered once it applied the compaction; a follower that forwarded it
        // waits until it has applied it too, so that a read or watch sent here next sees the
        // compacted history (etcd answers a compaction only once the member that took it has
        // applied it).
        self.0.linearizable_barrier().await.map_err(status)?;
        Ok(Response::new(pb::CompactionResponse {
            header: self.0.header(applied.revision),
        }))
    }
}
