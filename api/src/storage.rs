//! Objects in the replicated store: JSON values under /registry keys. An object's
//! resourceVersion is its key's mod_revision; it is not stored in the value, only set on the way
//! out. Writes are transactions through the Raft leader that compare the key's revision, which
//! is what turns a stale update into a Conflict.

use std::sync::Arc;

use rkube_store::mvcc::types::{
    Command, Compare, CompareResult, CompareTarget, DeleteRequest, KeyRange, KeyValue, Op,
    OpResult, Output, PutRequest, RangeRequest, TxnRequest,
};
use rkube_store::server::node::Node;
use serde_json::Value;

use crate::error::ApiError;

/// How fresh a read must be (Kubernetes' resourceVersion semantics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// `resourceVersion` unset: the newest state, confirmed with the leader (a quorum read).
    Latest,
    /// `resourceVersion=0`: whatever this member has applied.
    Any,
    /// At least this revision (waits for this member to apply it).
    NotOlderThan(i64),
    /// Exactly this revision (410 Gone when compacted).
    Exact(i64),
}

/// One key of a multi-key write: its expected mod_revision (0: absent) and the value to put,
/// or None to delete it.
pub struct Change {
    pub key: String,
    /// None: written whatever its state.
    pub expected: Option<i64>,
    pub write: Option<Value>,
}

pub struct Stored {
    pub object: Value,
    pub revision: i64,
}

/// The outcome of a conditional write.
pub enum Write {
    Done(Stored),
    /// The compare failed: the key's current state (None when absent).
    Lost(Option<Stored>),
}

/// Who may commit a write: whichever member leads (the write is forwarded to it), or only this
/// member while it leads one Raft term.
///
/// # Correctness
/// The controllers and the scheduler a leader runs write with [`Fence::Term`] of the term they
/// were started in, on every write they make (creates, updates, patches, status, bindings,
/// deletes): work begun in a term this member no longer leads then commits nothing
/// ([`rkube_store::server::node::Node::propose_fenced`]), where a forwarded write would.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Fence {
    /// Proposed through the leader, wherever it is: a request from the network.
    #[default]
    Any,
    /// Proposed only while this member leads this term, never forwarded.
    Term(u64),
}

#[derive(Clone)]
pub struct ObjectStore {
    pub node: Arc<Node>,
}

pub fn decode(kv: &KeyValue) -> Result<Stored, ApiError> {
    let mut object: Value = serde_json::from_slice(&kv.value).map_err(|e| {
        ApiError::internal(format!(
            "object at {} is not JSON: {e}",
            String::from_utf8_lossy(&kv.key)
        ))
    })?;
    set_resource_version(&mut object, kv.mod_revision);
    Ok(Stored {
        object,
        revision: kv.mod_revision,
    })
}

/// Sets `metadata.resourceVersion` where Kubernetes writes it: after the name, namespace and uid
/// that come before it in ObjectMeta (the rest of the object is in order already); among the
/// sorted keys of a custom resource's metadata ([`crate::order::is_unstructured`]).
pub fn set_resource_version(object: &mut Value, revision: i64) {
    const BEFORE: [&str; 5] = ["name", "generateName", "namespace", "selfLink", "uid"];
    let sorted = crate::order::is_unstructured(object);
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        let revision = Value::String(revision.to_string());
        match meta.get_mut("resourceVersion") {
            Some(rv) => *rv = revision,
            None => {
                let at = meta
                    .keys()
                    .position(|k| match sorted {
                        true => k.as_str() > "resourceVersion",
                        false => !BEFORE.contains(&k.as_str()),
                    })
                    .unwrap_or(meta.len());
                meta.shift_insert(at, "resourceVersion".into(), revision);
            }
        }
    }
}

/// The object as it is stored, and its bytes: in Kubernetes' field order
/// ([`crate::order::normalise`]), without resourceVersion (the key's revision) and selfLink.
fn encode(object: &Value) -> Result<(Value, Vec<u8>), ApiError> {
    let mut object = object.clone();
    crate::order::normalise(&mut object);
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.shift_remove("resourceVersion");
        meta.shift_remove("selfLink");
    }
    let bytes = serde_json::to_vec(&object).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok((object, bytes))
}

impl ObjectStore {
    pub fn new(node: Arc<Node>) -> Self {
        ObjectStore { node }
    }

    /// The store revision now (on this member).
    pub fn revision(&self) -> i64 {
        self.node.mvcc.revision()
    }

    pub fn compact_revision(&self) -> i64 {
        self.node.mvcc.compact_revision()
    }

    /// Brings this member up to date as `freshness` asks, and returns the revision to read at
    /// (0: the newest).
    async fn settle(&self, freshness: Freshness) -> Result<i64, ApiError> {
        match freshness {
            Freshness::Latest => {
                self.node.linearizable_barrier().await?;
                Ok(0)
            }
            Freshness::Any => Ok(0),
            Freshness::NotOlderThan(rev) => {
                self.wait_for_revision(rev).await?;
                Ok(0)
            }
            Freshness::Exact(rev) => {
                self.wait_for_revision(rev).await?;
                Ok(rev)
            }
        }
    }

    async fn wait_for_revision(&self, rev: i64) -> Result<(), ApiError> {
        if self.revision() >= rev {
            return Ok(());
        }
        let mut events = self.node.mvcc.subscribe();
        let deadline = tokio::time::Instant::now() + self.node.timing.request_timeout;
        while self.revision() < rev {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(_) => {}
                Err(_) => {
                    return Err(ApiError::timeout(format!(
                        "Too large resource version: {rev}, current: {}",
                        self.revision()
                    )))
                }
            }
        }
        Ok(())
    }

    pub async fn get(&self, key: &str, freshness: Freshness) -> Result<Option<Stored>, ApiError> {
        let revision = self.settle(freshness).await?;
        let (result, _) = self
            .node
            .mvcc
            .range(&RangeRequest {
                range: KeyRange::single(key.as_bytes().to_vec()),
                revision,
                ..Default::default()
            })
            .map_err(rkube_store::error::StoreError::from)?;
        result.kvs.first().map(decode).transpose()
    }

    /// Keys in [start, end) at a revision, at most `limit` (0: all). Returns the key-values, the
    /// revision they were read at and whether more remain.
    pub async fn range(
        &self,
        start: &str,
        end: &[u8],
        limit: i64,
        freshness: Freshness,
    ) -> Result<(Vec<KeyValue>, i64, bool), ApiError> {
        let revision = self.settle(freshness).await?;
        let (result, rev) = self
            .node
            .mvcc
            .range(&RangeRequest {
                range: KeyRange {
                    key: start.as_bytes().to_vec(),
                    range_end: end.to_vec(),
                },
                revision,
                limit,
                ..Default::default()
            })
            .map_err(rkube_store::error::StoreError::from)?;
        let read_at = if revision > 0 { revision } else { rev };
        Ok((result.kvs, read_at, result.more))
    }

    async fn txn(
        &self,
        txn: TxnRequest,
        fence: Fence,
    ) -> Result<(bool, Vec<OpResult>, i64), ApiError> {
        let applied = match fence {
            Fence::Term(term) => self.node.propose_fenced(Command::Txn(txn), term).await?,
            Fence::Any => self.node.propose(Command::Txn(txn)).await?,
        };
        match applied
            .output
            .map_err(rkube_store::error::StoreError::from)?
        {
            Output::Txn(t) => Ok((t.succeeded, t.responses, applied.revision)),
            other => Err(ApiError::internal(format!(
                "a transaction produced {other:?}"
            ))),
        }
    }

    fn current(results: Vec<OpResult>) -> Result<Option<Stored>, ApiError> {
        match results.into_iter().next() {
            Some(OpResult::Range(r)) => r.kvs.first().map(decode).transpose(),
            _ => Ok(None),
        }
    }

    /// Applies several changes at once if every key's mod_revision is what its change expects
    /// (0: absent). Returns the revision written, or None when a compare failed.
    pub async fn apply(&self, changes: &[Change], fence: Fence) -> Result<Option<i64>, ApiError> {
        let compare = changes
            .iter()
            .filter_map(|c| {
                c.expected.map(|expected| Compare {
                    range: KeyRange::single(c.key.as_bytes().to_vec()),
                    result: CompareResult::Equal,
                    target: CompareTarget::ModRevision(expected),
                })
            })
            .collect();
        let success = changes
            .iter()
            .map(|c| match &c.write {
                Some(value) => Ok(Op::Put(PutRequest {
                    key: c.key.as_bytes().to_vec(),
                    value: encode(value)?.1,
                    ..Default::default()
                })),
                None => Ok(Op::Delete(DeleteRequest {
                    range: KeyRange::single(c.key.as_bytes().to_vec()),
                    prev_kv: false,
                })),
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let (ok, _, revision) = self
            .txn(
                TxnRequest {
                    compare,
                    success,
                    failure: vec![],
                },
                fence,
            )
            .await?;
        Ok(ok.then_some(revision))
    }

    /// Puts `object` at `key` if the key's mod_revision is `expected` (0: the key is absent).
    pub async fn put_if(
        &self,
        key: &str,
        object: &Value,
        expected: i64,
        fence: Fence,
    ) -> Result<Write, ApiError> {
        let (mut object, value) = encode(object)?;
        let key = key.as_bytes().to_vec();
        let (ok, results, revision) = self
            .txn(
                TxnRequest {
                    compare: vec![Compare {
                        range: KeyRange::single(key.clone()),
                        result: CompareResult::Equal,
                        target: CompareTarget::ModRevision(expected),
                    }],
                    success: vec![Op::Put(PutRequest {
                        key: key.clone(),
                        value,
                        ..Default::default()
                    })],
                    failure: vec![Op::Range(RangeRequest {
                        range: KeyRange::single(key),
                        ..Default::default()
                    })],
                },
                fence,
            )
            .await?;
        if ok {
            set_resource_version(&mut object, revision);
            Ok(Write::Done(Stored { object, revision }))
        } else {
            Ok(Write::Lost(Self::current(results)?))
        }
    }

    /// Deletes `key` if its mod_revision is `expected`; returns the deleted object.
    pub async fn delete_if(
        &self,
        key: &str,
        expected: i64,
        fence: Fence,
    ) -> Result<Write, ApiError> {
        let key = key.as_bytes().to_vec();
        let (ok, results, revision) = self
            .txn(
                TxnRequest {
                    compare: vec![Compare {
                        range: KeyRange::single(key.clone()),
                        result: CompareResult::Equal,
                        target: CompareTarget::ModRevision(expected),
                    }],
                    success: vec![Op::Delete(DeleteRequest {
                        range: KeyRange::single(key.clone()),
                        prev_kv: true,
                    })],
                    failure: vec![Op::Range(RangeRequest {
                        range: KeyRange::single(key),
                        ..Default::default()
                    })],
                },
                fence,
            )
            .await?;
        if !ok {
            return Ok(Write::Lost(Self::current(results)?));
        }
        match results.into_iter().next() {
            Some(OpResult::Delete(d)) => match d.prev_kvs.first() {
                Some(kv) => {
                    let mut s = decode(kv)?;
                    s.revision = revision;
                    Ok(Write::Done(s))
                }
                None => Ok(Write::Lost(None)),
            },
            _ => Err(ApiError::internal("a delete produced another result")),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn metadata_keys(v: &Value) -> Vec<String> {
        v["metadata"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    #[test]
    fn the_resource_version_goes_where_kubernetes_writes_it() {
        let mut pod = json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p",
            "namespace": "default", "uid": "u", "creationTimestamp": "t", "labels": {}}});
        set_resource_version(&mut pod, 7);
        assert_eq!(
            metadata_keys(&pod),
            [
                "name",
                "namespace",
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "labels"
            ]
        );
        // A custom resource's metadata is a map with sorted keys.
        let mut widget = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"creationTimestamp": "t", "generation": 1, "name": "w",
                         "namespace": "default", "uid": "u"}});
        set_resource_version(&mut widget, 7);
        assert_eq!(
            metadata_keys(&widget),
            [
                "creationTimestamp",
                "generation",
                "name",
                "namespace",
                "resourceVersion",
                "uid"
            ]
        );
        assert_eq!(widget["metadata"]["resourceVersion"], "7");
    }
}
