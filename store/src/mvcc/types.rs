//! The data model shared by the state machine, the Raft log and the client API: key-value
//! records with etcd's revision fields, the commands that go through the log, and their results.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// One version of a key, as etcd's `mvccpb.KeyValue` describes it.
///
/// The key and value are shared buffers: a revision's events go to every watcher, and a clone
/// is a reference count, not a copy. They encode as `Vec<u8>` does ([`shared_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct KeyValue {
    #[serde(with = "shared_bytes")]
    pub key: Bytes,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    #[serde(with = "shared_bytes")]
    pub value: Bytes,
    pub lease: i64,
}

/// Serde for byte strings (`Vec<u8>` fields) as one run of bytes. serde's own `Vec<u8>` is a
/// sequence of `u8`: bincode writes the same length (u64) and bytes, but through one call per
/// byte, each way. A command's key and value cross bincode several times on each member (the
/// batch's size, the log record, the AppendEntries, the log read for replication): a profile
/// of `etcdctl check perf` (1 KiB values) put the per-byte calls at 4-5% of the members' CPU.
/// The encoding is the same, so the Raft log, snapshots and history read as they did.
pub(crate) mod byte_vec {
    use std::fmt;

    use serde::de::{self, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_byte_buf(ByteVecVisitor)
    }

    struct ByteVecVisitor;

    impl<'de> Visitor<'de> for ByteVecVisitor {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a byte array")
        }

        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }

        fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }

        // Self-describing formats (JSON) write a `Vec<u8>` as a sequence of numbers.
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(b) = seq.next_element::<u8>()? {
                v.push(b);
            }
            Ok(v)
        }
    }
}

/// Serde for [`Bytes`] fields with the encoding of a `Vec<u8>` ([`byte_vec`]), so the history
/// records on disk, the snapshots and the Raft log read and write as they did before these
/// fields were shared buffers.
mod shared_bytes {
    use bytes::Bytes;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Bytes, serializer: S) -> Result<S::Ok, S::Error> {
        super::byte_vec::serialize(bytes, serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
        super::byte_vec::deserialize(deserializer).map(Bytes::from)
    }
}

/// What a watcher is told about one changed key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub kind: EventKind,
    /// For a delete, `kv` carries the key and the deleting revision only.
    pub kv: KeyValue,
    /// The version a put replaced or a delete removed. A broadcast delete event of a
    /// DeleteRange of more than `DELETED_VERSIONS_IN_EVENTS` keys has `None` here: the watch
    /// reads it from the history for watchers that asked for it.
    pub prev_kv: Option<KeyValue>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    Put,
    Delete,
}

/// The key selection of a range, delete or watch, with etcd's conventions for `range_end`:
/// empty means the single key, `\0` means every key from `key` on, and `key = range_end = \0`
/// means every key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct KeyRange {
    #[serde(with = "byte_vec")]
    pub key: Vec<u8>,
    #[serde(with = "byte_vec")]
    pub range_end: Vec<u8>,
}

impl KeyRange {
    pub fn single(key: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.into(),
            range_end: Vec::new(),
        }
    }

    pub fn prefix(prefix: impl Into<Vec<u8>>) -> Self {
        let key = prefix.into();
        let range_end = prefix_end(&key);
        Self { key, range_end }
    }

    pub fn is_single(&self) -> bool {
        self.range_end.is_empty()
    }

    /// Lower bound (inclusive) of the selection.
    pub fn start(&self) -> &[u8] {
        if self.key == [0] && self.range_end == [0] {
            &[]
        } else {
            &self.key
        }
    }

    /// Upper bound (exclusive) of the selection; `None` when unbounded.
    pub fn end(&self) -> Option<&[u8]> {
        if self.range_end == [0] {
            None
        } else {
            Some(&self.range_end)
        }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        if self.is_single() {
            return key == self.key.as_slice();
        }
        key >= self.start() && self.end().is_none_or(|end| key < end)
    }
}

/// The smallest key greater than every key with this prefix (etcd's `GetPrefixRangeEnd`).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All bytes were 0xff (or the prefix was empty): every key from the prefix on.
    vec![0]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum SortOrder {
    #[default]
    None,
    Ascend,
    Descend,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum SortTarget {
    #[default]
    Key,
    Version,
    Create,
    Mod,
    Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RangeRequest {
    pub range: KeyRange,
    pub limit: i64,
    /// Read at this revision; zero or less means the newest.
    pub revision: i64,
    pub sort_order: SortOrder,
    pub sort_target: SortTarget,
    pub keys_only: bool,
    pub count_only: bool,
    pub min_mod_revision: i64,
    pub max_mod_revision: i64,
    pub min_create_revision: i64,
    pub max_create_revision: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PutRequest {
    #[serde(with = "byte_vec")]
    pub key: Vec<u8>,
    #[serde(with = "byte_vec")]
    pub value: Vec<u8>,
    pub lease: i64,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DeleteRequest {
    pub range: KeyRange,
    pub prev_kv: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    Range(RangeRequest),
    Put(PutRequest),
    Delete(DeleteRequest),
    Txn(TxnRequest),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareResult {
    Equal,
    Greater,
    Less,
    NotEqual,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    Version(i64),
    CreateRevision(i64),
    ModRevision(i64),
    Value(#[serde(with = "byte_vec")] Vec<u8>),
    Lease(i64),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    pub range: KeyRange,
    pub result: CompareResult,
    pub target: CompareTarget,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

/// A command carried by the Raft log and applied by every member in the same order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Txn(TxnRequest),
    Compact {
        revision: i64,
    },
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke {
        id: i64,
    },
    /// A member publishes its name and client address (etcd's member attributes).
    MemberAttrs {
        id: u64,
        name: String,
        client_urls: Vec<String>,
    },
    /// Raises (or clears) an alarm of a member; every member then refuses or accepts writes
    /// alike.
    Alarm {
        activate: bool,
        member: u64,
        alarm: AlarmKind,
    },
    /// Commands proposed together as one log entry (one fsync, one replication message), each
    /// applied in order as if it were an entry of its own: its own revision, its own result.
    Batch(Vec<Command>),
}

impl Command {
    /// Whether applying the command touches a bounded number of keys: single-key puts, reads
    /// and deletes (nested transactions included), lease grants, member attributes and alarms.
    /// A range read or delete, a lease revoke (which deletes every key of the lease) and a
    /// compaction can take seconds on a large store.
    pub fn is_small(&self) -> bool {
        fn ops_small(ops: &[Op]) -> bool {
            ops.iter().all(|op| match op {
                Op::Put(_) => true,
                Op::Range(r) => r.range.is_single(),
                Op::Delete(d) => d.range.is_single(),
                Op::Txn(t) => {
                    t.compare.iter().all(|c| c.range.is_single())
                        && ops_small(&t.success)
                        && ops_small(&t.failure)
                }
            })
        }
        match self {
            Command::Txn(t) => {
                t.compare.iter().all(|c| c.range.is_single())
                    && ops_small(&t.success)
                    && ops_small(&t.failure)
            }
            Command::LeaseGrant { .. } | Command::MemberAttrs { .. } | Command::Alarm { .. } => {
                true
            }
            Command::Batch(cmds) => cmds.iter().all(Command::is_small),
            Command::LeaseRevoke { .. } | Command::Compact { .. } => false,
        }
    }

    /// Whether applying the command can make the database grow: puts (in either branch of a
    /// transaction, as etcd's quota counts them) and lease grants. Deletes, revokes and
    /// compaction free space and are always accepted.
    pub fn takes_space(&self) -> bool {
        fn ops_put(ops: &[Op]) -> bool {
            ops.iter().any(|op| match op {
                Op::Put(_) => true,
                Op::Txn(t) => ops_put(&t.success) || ops_put(&t.failure),
                Op::Range(_) | Op::Delete(_) => false,
            })
        }
        match self {
            Command::Txn(t) => ops_put(&t.success) || ops_put(&t.failure),
            Command::LeaseGrant { .. } => true,
            Command::Batch(cmds) => cmds.iter().any(Command::takes_space),
            _ => false,
        }
    }
}

/// etcd's alarm types, with its wire numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AlarmKind {
    /// The member's database passed its space quota.
    NoSpace = 1,
    Corrupt = 2,
}

/// An active alarm: which member raised it, and what kind it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Alarm {
    pub member: u64,
    pub kind: AlarmKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RangeResult {
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    pub count: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PutResult {
    pub prev_kv: Option<KeyValue>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DeleteResult {
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpResult {
    Range(RangeResult),
    Put(PutResult),
    Delete(DeleteResult),
    Txn(TxnResult),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TxnResult {
    pub succeeded: bool,
    pub responses: Vec<OpResult>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Output {
    Txn(TxnResult),
    Compacted,
    LeaseGranted {
        id: i64,
        ttl: i64,
    },
    LeaseRevoked,
    MemberAttrs,
    /// The alarms the command raised or cleared (none when there was nothing to change).
    Alarms(Vec<Alarm>),
    /// What each command of a batch produced, in order.
    Batch(Vec<Applied>),
    /// Raft's own entries (blank, membership) carry no command.
    None,
}

/// The state machine's answer to one applied log entry: the store revision after it, and what
/// the command produced or why it was refused (refusals change nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub revision: i64,
    pub output: Result<Output, crate::error::MvccError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub id: i64,
    pub ttl: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout of `KeyValue` when its key and value were `Vec<u8>`: what the history on
    /// disk, snapshots and the Raft log hold.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct VecKeyValue {
        key: Vec<u8>,
        create_revision: i64,
        mod_revision: i64,
        version: i64,
        value: Vec<u8>,
        lease: i64,
    }

    #[test]
    fn a_key_value_encodes_as_with_vec_fields() {
        for (key, value) in [
            (&b""[..], &b""[..]),
            (b"k", b"v"),
            (b"/registry/pods/default/web", &[0u8, 255, 7][..]),
            (b"big", &[9u8; 70_000][..]),
        ] {
            let shared = KeyValue {
                key: Bytes::copy_from_slice(key),
                create_revision: 2,
                mod_revision: 5,
                version: 3,
                value: Bytes::copy_from_slice(value),
                lease: -7,
            };
            let old = VecKeyValue {
                key: key.to_vec(),
                create_revision: 2,
                mod_revision: 5,
                version: 3,
                value: value.to_vec(),
                lease: -7,
            };
            same(&shared, &old);
        }
    }

    /// `new` encodes as `old` does in bincode and JSON, and reads back from `old`'s encodings.
    fn same<A, B>(new: &A, old: &B)
    where
        A: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
        B: Serialize,
    {
        let bytes = bincode::serialize(old).expect("encode");
        assert_eq!(bincode::serialize(new).expect("encode"), bytes);
        assert_eq!(&bincode::deserialize::<A>(&bytes).expect("decode"), new);
        let json = serde_json::to_string(old).expect("json");
        assert_eq!(serde_json::to_string(new).expect("json"), json);
        assert_eq!(&serde_json::from_str::<A>(&json).expect("json"), new);
    }

    /// `PutRequest` (bincode writes a struct as the tuple of its fields) and `KeyRange` as they
    /// were before their byte strings were encoded as one run ([`byte_vec`]).
    type VecPut = (Vec<u8>, Vec<u8>, i64, bool, bool, bool);

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct VecRange {
        key: Vec<u8>,
        range_end: Vec<u8>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum VecTarget {
        Version(i64),
        CreateRevision(i64),
        ModRevision(i64),
        Value(Vec<u8>),
        Lease(i64),
    }

    /// The Raft log, snapshots and history written by a build without [`byte_vec`] read the
    /// same, and the other way round, in bincode and in JSON.
    #[test]
    fn byte_strings_in_commands_encode_as_vec_fields_did() {
        for (key, value) in [
            (&b""[..], &b""[..]),
            (b"/registry/pods/default/web", &[0u8, 255, 7][..]),
            (b"big", &[9u8; 70_000][..]),
        ] {
            let put = PutRequest {
                key: key.to_vec(),
                value: value.to_vec(),
                lease: 3,
                prev_kv: true,
                ignore_value: false,
                ignore_lease: true,
            };
            let old: VecPut = (key.to_vec(), value.to_vec(), 3, true, false, true);
            let bytes = bincode::serialize(&old).expect("encode");
            assert_eq!(bincode::serialize(&put).expect("encode"), bytes);
            assert_eq!(
                bincode::deserialize::<PutRequest>(&bytes).expect("decode"),
                put
            );
            let json = serde_json::to_value(&put).expect("json");
            assert_eq!(json["key"], serde_json::json!(key));
            assert_eq!(json["value"], serde_json::json!(value));
            assert_eq!(
                serde_json::from_value::<PutRequest>(json).expect("json"),
                put
            );
            let range = KeyRange {
                key: key.to_vec(),
                range_end: value.to_vec(),
            };
            let old = VecRange {
                key: key.to_vec(),
                range_end: value.to_vec(),
            };
            same(&range, &old);
            same(
                &CompareTarget::Value(value.to_vec()),
                &VecTarget::Value(value.to_vec()),
            );
        }
    }
}
