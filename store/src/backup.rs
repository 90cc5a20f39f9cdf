//! Backup files (`rkube snapshot save|status|restore`): a consistent copy of a member's MVCC
//! state — keys, values, history, leases, revisions — with a header and a checksum.
//!
//! Layout: the magic line, a little-endian u32 header length, the bincode header
//! ([`BackupInfo`]), the bincode dump of the MVCC trees, zeros up to a multiple of 512 bytes (as
//! etcdctl expects of a snapshot stream), and the SHA-256 of everything before it.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::StorageError;
use crate::mvcc::store::Dump;
use crate::mvcc::MvccStore;

pub const MAGIC: &[u8] = b"RKUBE-SNAPSHOT\n";
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupInfo {
    pub format: u32,
    pub revision: i64,
    pub compact_revision: i64,
    pub keys: u64,
    /// Equal to HashKV at `revision` on the cluster it was taken from.
    pub hash: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("not an rkube snapshot file (it does not start with the rkube snapshot header)")]
    NotASnapshot,
    #[error("snapshot format version {0} is not supported by this rkube (it reads version {FORMAT_VERSION})")]
    UnsupportedFormat(u32),
    #[error("the snapshot file is truncated or corrupted: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("cannot read the snapshot file: {0}")]
    Io(#[from] std::io::Error),
}

/// Serializes the store's current state into a backup file's bytes.
pub fn encode(store: &MvccStore) -> Result<(BackupInfo, Vec<u8>), StorageError> {
    let dump = store.dump()?;
    let info = BackupInfo {
        format: FORMAT_VERSION,
        revision: dump.revision(),
        compact_revision: dump.compact_revision(),
        keys: dump.key_count() as u64,
        hash: dump.hash_kv(),
    };
    let header = bincode::serialize(&info)?;
    let body = bincode::serialize(&dump)?;
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + header.len() + body.len() + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&body);
    // `etcdctl snapshot save` accepts a stream only when it ends with a SHA-256 after a whole
    // number of 512-byte blocks: zeros before the checksum make it so; decoding ignores them.
    out.resize(out.len().div_ceil(512) * 512, 0);
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    Ok((info, out))
}

/// Checks a backup file's bytes — magic, checksum, header and format — without parsing the
/// dump (what listing many files needs).
pub fn inspect(bytes: &[u8]) -> Result<BackupInfo, BackupError> {
    check(bytes).map(|(info, _)| info)
}

/// Checks and parses a backup file's bytes.
pub fn decode(bytes: &[u8]) -> Result<(BackupInfo, Dump), BackupError> {
    let (info, body) = check(bytes)?;
    let dump: Dump = bincode::deserialize(body).map_err(|e| BackupError::Corrupt(e.to_string()))?;
    Ok((info, dump))
}

/// The checked header and the bytes of the dump.
fn check(bytes: &[u8]) -> Result<(BackupInfo, &[u8]), BackupError> {
    if !bytes.starts_with(MAGIC) {
        return Err(BackupError::NotASnapshot);
    }
    if bytes.len() < MAGIC.len() + 4 + 32 {
        return Err(BackupError::Corrupt("the file is too short".into()));
    }
    let (content, sum) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(content).as_slice() != sum {
        return Err(BackupError::Corrupt(
            "its SHA-256 checksum does not match".into(),
        ));
    }
    let rest = &content[MAGIC.len()..];
    let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
    let rest = &rest[4..];
    if rest.len() < len {
        return Err(BackupError::Corrupt("the header is cut short".into()));
    }
    let info: BackupInfo =
        bincode::deserialize(&rest[..len]).map_err(|e| BackupError::Corrupt(e.to_string()))?;
    if info.format != FORMAT_VERSION {
        return Err(BackupError::UnsupportedFormat(info.format));
    }
    Ok((info, &rest[len..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{Command, Op, PutRequest, TxnRequest};

    fn store_with(keys: &[&str]) -> MvccStore {
        let db = sled::Config::new().temporary(true).open().expect("db");
        let store = MvccStore::open(&db).expect("store");
        for k in keys {
            let put = Op::Put(PutRequest {
                key: k.as_bytes().to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            });
            store
                .apply(
                    &Command::Txn(TxnRequest {
                        compare: vec![],
                        success: vec![put],
                        failure: vec![],
                    }),
                    vec![],
                )
                .expect("apply");
        }
        store
    }

    #[test]
    fn round_trip_keeps_revision_keys_and_hash() {
        let store = store_with(&["a", "b", "c"]);
        let (info, bytes) = encode(&store).expect("encode");
        assert_eq!(info.revision, 3);
        assert_eq!(info.keys, 3);
        assert_eq!(info.hash, store.hash_kv(3).expect("hash").0);
        let (back, dump) = decode(&bytes).expect("decode");
        assert_eq!(back, info);
        assert_eq!(inspect(&bytes).expect("inspect"), info);
        let target = store_with(&[]);
        target.restore_for_new_cluster(dump, 0).expect("restore");
        assert_eq!(target.revision(), 3);
        assert_eq!(target.hash_kv(3).expect("hash").0, info.hash);
    }

    #[test]
    fn refuses_other_files_truncation_and_corruption() {
        let (_, bytes) = encode(&store_with(&["a"])).expect("encode");
        assert!(matches!(
            decode(b"SQLite format 3\0......"),
            Err(BackupError::NotASnapshot)
        ));
        assert!(matches!(
            decode(&bytes[..bytes.len() - 10]),
            Err(BackupError::Corrupt(_))
        ));
        let mut flipped = bytes.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0xff;
        assert!(matches!(decode(&flipped), Err(BackupError::Corrupt(_))));
        assert!(matches!(inspect(&flipped), Err(BackupError::Corrupt(_))));
    }

    #[test]
    fn bumped_restore_marks_old_history_compacted() {
        let (_, bytes) = encode(&store_with(&["a", "b"])).expect("encode");
        let (_, dump) = decode(&bytes).expect("decode");
        let target = store_with(&[]);
        target.restore_for_new_cluster(dump, 1000).expect("restore");
        assert_eq!(target.revision(), 1002);
        assert_eq!(target.compact_revision(), 1002);
        let old = crate::mvcc::RangeRequest {
            range: crate::mvcc::KeyRange::single("a"),
            revision: 1,
            ..Default::default()
        };
        assert!(matches!(
            target.range(&old),
            Err(crate::error::MvccError::Compacted { .. })
        ));
        let now = crate::mvcc::RangeRequest {
            range: crate::mvcc::KeyRange::single("a"),
            ..Default::default()
        };
        assert_eq!(target.range(&now).expect("read").0.kvs.len(), 1);
    }
}
