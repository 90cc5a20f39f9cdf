//! The etcd v3 gRPC API on the client port, wire-compatible with etcd 3.5 so that etcdctl and
//! etcd client libraries work. Conversions between the wire messages and the store's own types
//! live here; each service has its own module.

pub mod auth;
pub mod cluster;
pub mod kv;
pub mod lease;
pub mod maintenance;
pub mod watch;

use tonic::{Code, Status};

use super::node::Node;
use crate::error::{MvccError, StoreError};
use crate::mvcc::{self, KeyRange};
use crate::proto::etcdserverpb as pb;
use crate::proto::mvccpb;

/// etcd refuses requests above this size ("etcdserver: request is too large").
pub const MAX_REQUEST_BYTES: usize = 1536 * 1024;

impl Node {
    pub fn header(&self, revision: i64) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.id,
            revision,
            raft_term: self.term(),
        })
    }
}

/// The gRPC status etcd answers with, so that clients' retry logic works.
impl From<StoreError> for Status {
    fn from(e: StoreError) -> Status {
        status(e)
    }
}

pub fn status(e: StoreError) -> Status {
    let msg = e.to_string();
    match e {
        StoreError::Mvcc(m) => match m {
            MvccError::Compacted { .. } | MvccError::FutureRevision => {
                Status::new(Code::OutOfRange, msg)
            }
            MvccError::LeaseNotFound => Status::new(Code::NotFound, msg),
            MvccError::LeaseExists => Status::new(Code::FailedPrecondition, msg),
            MvccError::NoSpace => Status::new(Code::ResourceExhausted, msg),
            _ => Status::new(Code::InvalidArgument, msg),
        },
        StoreError::Unavailable(_)
        | StoreError::Timeout
        | StoreError::Stopped
        | StoreError::Storage(_) => Status::new(Code::Unavailable, msg),
        StoreError::InvalidArgument(_) => Status::new(Code::InvalidArgument, msg),
        StoreError::FailedPrecondition(_) => Status::new(Code::FailedPrecondition, msg),
        StoreError::NotFound(_) => Status::new(Code::NotFound, msg),
    }
}

pub fn kv_to_pb(kv: mvcc::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    }
}

pub fn event_to_pb(e: mvcc::Event) -> mvccpb::Event {
    mvccpb::Event {
        r#type: match e.kind {
            mvcc::EventKind::Put => mvccpb::event::EventType::Put as i32,
            mvcc::EventKind::Delete => mvccpb::event::EventType::Delete as i32,
        },
        kv: Some(kv_to_pb(e.kv)),
        prev_kv: e.prev_kv.map(kv_to_pb),
    }
}

fn range_of(key: Vec<u8>, range_end: Vec<u8>) -> KeyRange {
    KeyRange { key, range_end }
}

fn empty_key() -> StoreError {
    invalid("key is not provided")
}

/// A request etcd refuses as it reads it: InvalidArgument, "etcdserver: <what>".
fn invalid(what: &str) -> StoreError {
    StoreError::InvalidArgument(what.to_string())
}

pub fn range_from_pb(r: pb::RangeRequest) -> Result<mvcc::RangeRequest, StoreError> {
    if r.key.is_empty() {
        return Err(empty_key());
    }
    use pb::range_request::{SortOrder as O, SortTarget as T};
    let sort_order = match O::try_from(r.sort_order).map_err(|_| invalid("invalid sort option"))? {
        O::None => mvcc::SortOrder::None,
        O::Ascend => mvcc::SortOrder::Ascend,
        O::Descend => mvcc::SortOrder::Descend,
    };
    let sort_target =
        match T::try_from(r.sort_target).map_err(|_| invalid("invalid sort option"))? {
            T::Key => mvcc::SortTarget::Key,
            T::Version => mvcc::SortTarget::Version,
            T::Create => mvcc::SortTarget::Create,
            T::Mod => mvcc::SortTarget::Mod,
            T::Value => mvcc::SortTarget::Value,
        };
    Ok(mvcc::RangeRequest {
        range: range_of(r.key, r.range_end),
        limit: r.limit,
        revision: r.revision,
        sort_order,
        sort_target,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    })
}

pub fn put_from_pb(p: pb::PutRequest) -> Result<mvcc::PutRequest, StoreError> {
    if p.key.is_empty() {
        return Err(empty_key());
    }
    if p.key.len() + p.value.len() > MAX_REQUEST_BYTES {
        return Err(invalid("request is too large"));
    }
    Ok(mvcc::PutRequest {
        key: p.key,
        value: p.value,
        lease: p.lease,
        prev_kv: p.prev_kv,
        ignore_value: p.ignore_value,
        ignore_lease: p.ignore_lease,
    })
}

pub fn delete_from_pb(d: pb::DeleteRangeRequest) -> Result<mvcc::DeleteRequest, StoreError> {
    if d.key.is_empty() {
        return Err(empty_key());
    }
    Ok(mvcc::DeleteRequest {
        range: range_of(d.key, d.range_end),
        prev_kv: d.prev_kv,
    })
}

pub fn txn_from_pb(t: pb::TxnRequest) -> Result<mvcc::TxnRequest, StoreError> {
    if prost::Message::encoded_len(&t) > MAX_REQUEST_BYTES {
        return Err(invalid("request is too large"));
    }
    let mut compare = Vec::with_capacity(t.compare.len());
    for c in t.compare {
        use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
        let result = match R::try_from(c.result).map_err(|_| invalid("invalid compare result"))? {
            R::Equal => mvcc::CompareResult::Equal,
            R::Greater => mvcc::CompareResult::Greater,
            R::Less => mvcc::CompareResult::Less,
            R::NotEqual => mvcc::CompareResult::NotEqual,
        };
        let declared = T::try_from(c.target).map_err(|_| invalid("invalid compare target"))?;
        // The oneof is authoritative; an absent one means the zero value of the declared target.
        let target = match (c.target_union, declared) {
            (Some(U::Version(v)), _) => mvcc::CompareTarget::Version(v),
            (Some(U::CreateRevision(v)), _) => mvcc::CompareTarget::CreateRevision(v),
            (Some(U::ModRevision(v)), _) => mvcc::CompareTarget::ModRevision(v),
            (Some(U::Value(v)), _) => mvcc::CompareTarget::Value(v),
            (Some(U::Lease(v)), _) => mvcc::CompareTarget::Lease(v),
            (None, T::Version) => mvcc::CompareTarget::Version(0),
            (None, T::Create) => mvcc::CompareTarget::CreateRevision(0),
            (None, T::Mod) => mvcc::CompareTarget::ModRevision(0),
            (None, T::Value) => mvcc::CompareTarget::Value(Vec::new()),
            (None, T::Lease) => mvcc::CompareTarget::Lease(0),
        };
        if c.key.is_empty() {
            return Err(empty_key());
        }
        compare.push(mvcc::Compare {
            range: range_of(c.key, c.range_end),
            result,
            target,
        });
    }
    let ops = |ops: Vec<pb::RequestOp>| -> Result<Vec<mvcc::Op>, StoreError> {
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            use pb::request_op::Request as Q;
            out.push(match op.request {
                Some(Q::RequestRange(r)) => mvcc::Op::Range(range_from_pb(r)?),
                Some(Q::RequestPut(p)) => mvcc::Op::Put(put_from_pb(p)?),
                Some(Q::RequestDeleteRange(d)) => mvcc::Op::Delete(delete_from_pb(d)?),
                Some(Q::RequestTxn(t)) => mvcc::Op::Txn(txn_from_pb(t)?),
                None => return Err(invalid("request op is empty")),
            });
        }
        Ok(out)
    };
    let txn = mvcc::TxnRequest {
        compare,
        success: ops(t.success)?,
        failure: ops(t.failure)?,
    };
    mvcc::validate_txn(&txn)?;
    Ok(txn)
}

pub fn range_to_pb(node: &Node, r: mvcc::RangeResult, revision: i64) -> pb::RangeResponse {
    pb::RangeResponse {
        header: node.header(revision),
        kvs: r.kvs.into_iter().map(kv_to_pb).collect(),
        more: r.more,
        count: r.count,
    }
}

pub fn txn_to_pb(node: &Node, t: mvcc::TxnResult, revision: i64) -> pb::TxnResponse {
    use pb::response_op::Response as P;
    let responses = t
        .responses
        .into_iter()
        .map(|r| pb::ResponseOp {
            response: Some(match r {
                mvcc::OpResult::Range(r) => P::ResponseRange(range_to_pb(node, r, revision)),
                mvcc::OpResult::Put(p) => P::ResponsePut(pb::PutResponse {
                    header: node.header(revision),
                    prev_kv: p.prev_kv.map(kv_to_pb),
                }),
                mvcc::OpResult::Delete(d) => P::ResponseDeleteRange(pb::DeleteRangeResponse {
                    header: node.header(revision),
                    deleted: d.deleted,
                    prev_kvs: d.prev_kvs.into_iter().map(kv_to_pb).collect(),
                }),
                mvcc::OpResult::Txn(t) => P::ResponseTxn(txn_to_pb(node, t, revision)),
            }),
        })
        .collect();
    pb::TxnResponse {
        header: node.header(revision),
        succeeded: t.succeeded,
        responses,
    }
}
