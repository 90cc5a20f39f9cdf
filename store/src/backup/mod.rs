//! Snapshot files (`rkube snapshot save|status|restore`, `Maintenance.Snapshot`, scheduled
//! snapshots): a consistent copy of a member's MVCC state — keys, values, history since the
//! last compaction, leases, revisions.
//!
//! rkube writes them in etcd 3.4's snapshot format ([`etcd`]: a bbolt database and its
//! SHA-256), so that `etcdctl snapshot status|restore` read rkube's backups and a real etcd
//! starts from them, and it reads the same format from etcd (`etcdctl snapshot save`, a
//! migration into rkube). It also reads its first format ([`legacy`], `RKUBE-SNAPSHOT`), and
//! either one zipped as k3s zips its snapshots ([`compress`]: one entry, deflated).
//!
//! Every read checks what the format allows: the SHA-256 (a database copied out of a data dir
//! has none, and is read only when asked to skip the check, as etcdctl does), the database's
//! page structure, the zip's CRC-32.

pub mod etcd;
pub mod legacy;

use std::io::{Read, Write};

use crate::error::StorageError;
use crate::mvcc::store::Dump;
use crate::mvcc::MvccStore;

/// How a snapshot file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// etcd 3.4's snapshot: a bbolt database and its SHA-256.
    Etcd,
    /// rkube's first format (`RKUBE-SNAPSHOT`, format version 1).
    RkubeV1,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Etcd => "etcd",
            Format::RkubeV1 => "rkube-v1",
        })
    }
}

/// What `etcdctl snapshot status` shows for a file in etcd's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdStatus {
    /// CRC-32C of every bucket's name, keys and values.
    pub hash: u32,
    /// The revision of the last entry of the `key` bucket.
    pub revision: i64,
    /// Entries in all buckets.
    pub total_key: u64,
    /// The database's size (without the SHA-256).
    pub total_size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupInfo {
    pub format: Format,
    /// Zipped (k3s's `--etcd-snapshot-compress`, `rkube snapshot save --compress`).
    pub compressed: bool,
    /// The store revision a restore starts from (before any bump).
    pub revision: i64,
    pub compact_revision: i64,
    /// Live keys.
    pub keys: u64,
    /// Equal to HashKV at `revision` on the cluster it was taken from.
    pub hash: u32,
    /// For etcd's format: what etcdctl reports for the file.
    pub etcd: Option<EtcdStatus>,
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("not a snapshot file (neither etcd's snapshot format, a bbolt database, nor rkube's)")]
    NotASnapshot,
    #[error("a bbolt database, but not etcd's: it has no key bucket")]
    NotEtcd,
    #[error("snapshot format version {0} is not supported by this rkube (it reads version 1)")]
    UnsupportedFormat(u32),
    #[error("the snapshot file is truncated or corrupted: {0}")]
    Corrupt(String),
    #[error(
        "the database has no SHA-256 at its end (a copy of a data dir's member/snap/db, not a \
         saved snapshot), so its integrity cannot be checked; restore it with --skip-hash-check \
         (as etcdctl snapshot restore --skip-hash-check) if that is what it is"
    )]
    MissingHash,
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("cannot read the snapshot file: {0}")]
    Io(#[from] std::io::Error),
}

/// A zip file starts with a local file header.
const ZIP_MAGIC: &[u8] = b"PK\x03\x04";

/// A snapshot file (etcd's format) of the store's current state.
pub fn encode(store: &MvccStore) -> Result<(BackupInfo, Vec<u8>), StorageError> {
    etcd::encode(&store.dump()?)
}

/// Checks and parses a snapshot file of any format rkube reads.
pub fn decode(bytes: &[u8]) -> Result<(BackupInfo, Dump), BackupError> {
    decode_with(bytes, false)
}

/// [`decode`], reading a database without its SHA-256 when `skip_hash_check`.
pub fn decode_with(bytes: &[u8], skip_hash_check: bool) -> Result<(BackupInfo, Dump), BackupError> {
    if bytes.starts_with(ZIP_MAGIC) {
        let inner = decompress(bytes)?;
        if inner.starts_with(ZIP_MAGIC) {
            return Err(BackupError::Corrupt(
                "a zip archive inside a zip archive".into(),
            ));
        }
        let (mut info, dump) = decode_with(&inner, skip_hash_check)?;
        info.compressed = true;
        return Ok((info, dump));
    }
    if bytes.starts_with(legacy::MAGIC) {
        return legacy::decode(bytes);
    }
    etcd::decode(bytes, skip_hash_check)
}

/// Checks a snapshot file and tells what it holds.
pub fn inspect(bytes: &[u8]) -> Result<BackupInfo, BackupError> {
    decode(bytes).map(|(info, _)| info)
}

/// A zip archive holding `bytes` as its one file `name`, deflated (as k3s compresses etcd
/// snapshots).
pub fn compress(name: &str, bytes: &[u8]) -> Result<Vec<u8>, BackupError> {
    let zip_err = |e: zip::result::ZipError| BackupError::Io(std::io::Error::other(e));
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(bytes.len() as u64 >= u64::from(u32::MAX));
    w.start_file(name, options).map_err(zip_err)?;
    w.write_all(bytes)?;
    Ok(w.finish().map_err(zip_err)?.into_inner())
}

/// The one file of a zip archive, its CRC-32 checked.
fn decompress(bytes: &[u8]) -> Result<Vec<u8>, BackupError> {
    let damaged = |e: zip::result::ZipError| {
        BackupError::Corrupt(format!("the zip archive cannot be read: {e}"))
    };
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(damaged)?;
    let files: Vec<usize> = (0..archive.len())
        .filter(|&i| archive.by_index_raw(i).is_ok_and(|f| f.is_file()))
        .collect();
    let [index] = files[..] else {
        return Err(BackupError::Corrupt(format!(
            "the zip archive holds {} files; a compressed snapshot holds one",
            files.len()
        )));
    };
    let mut file = archive.by_index(index).map_err(damaged)?;
    let mut out = Vec::with_capacity(file.size().min(1 << 30) as usize);
    // Reading to the end checks the entry's CRC-32.
    file.read_to_end(&mut out)
        .map_err(|e| BackupError::Corrupt(format!("the zip archive is damaged: {e}")))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::{Command, DeleteRequest, KeyRange, Op, RangeRequest};

    use crate::mvcc::test_ops::{put, txn};

    fn empty_store() -> MvccStore {
        let db = sled::Config::new().temporary(true).open().expect("db");
        MvccStore::open(&db).expect("store")
    }

    /// Several revisions of a key, a deletion, a leased key, a compaction.
    fn store_with_history() -> MvccStore {
        let store = empty_store();
        store
            .apply(&Command::LeaseGrant { id: 0x42, ttl: 600 }, vec![])
            .expect("grant");
        txn(&store, vec![put("a", "1", 0), put("b", "x", 0)]);
        txn(&store, vec![put("a", "2", 0)]);
        txn(&store, vec![put("c", "leased", 0x42)]);
        txn(
            &store,
            vec![Op::Delete(DeleteRequest {
                range: KeyRange::single("b"),
                ..Default::default()
            })],
        );
        store
            .apply(&Command::Compact { revision: 2 }, vec![])
            .expect("compact");
        txn(&store, vec![put("a", "3", 0), put("d", "dd", 0)]);
        store
    }

    fn get(store: &MvccStore, key: &str) -> Option<crate::mvcc::KeyValue> {
        let req = RangeRequest {
            range: KeyRange::single(key),
            ..Default::default()
        };
        store.range(&req).expect("read").0.kvs.into_iter().next()
    }

    #[test]
    fn etcd_format_round_trip_keeps_keys_revisions_leases_and_hash() {
        let store = store_with_history();
        let (info, bytes) = encode(&store).expect("encode");
        assert_eq!(info.format, Format::Etcd);
        assert_eq!((info.revision, info.compact_revision, info.keys), (5, 2, 3));
        assert_eq!(info.hash, store.hash_kv(5).expect("hash").0);
        let etcd = info.etcd.expect("etcd status");
        assert_eq!(etcd.revision, 5);
        assert_eq!(etcd.total_size + 32, bytes.len() as u64);
        assert!(etcd::has_hash(&bytes));

        let (back, dump) = decode(&bytes).expect("decode");
        assert_eq!(back, info, "what was written is what is read");
        let target = empty_store();
        target.restore_for_new_cluster(dump, 0).expect("restore");
        assert_eq!(target.revision(), 5);
        assert_eq!(target.compact_revision(), 2);
        assert_eq!(target.hash_kv(5).expect("hash").0, info.hash);
        for key in ["a", "c", "d"] {
            assert_eq!(get(&target, key), get(&store, key), "{key}");
        }
        assert_eq!(get(&target, "b"), None);
        assert_eq!(get(&target, "a").expect("a").version, 3);
        assert_eq!(
            target.lease_keys(0x42).expect("lease keys"),
            vec![b"c".to_vec()]
        );
        assert_eq!(
            target.leases().expect("leases"),
            store.leases().expect("leases")
        );
    }

    #[test]
    fn compressed_and_legacy_files_read_alike() {
        let store = store_with_history();
        let (info, bytes) = encode(&store).expect("encode");
        let zipped = compress("backup.snap", &bytes).expect("zip");
        assert!(zipped.len() < bytes.len());
        let (zinfo, _) = decode(&zipped).expect("zip decodes");
        assert_eq!(
            zinfo,
            BackupInfo {
                compressed: true,
                ..info.clone()
            }
        );

        let old = legacy::encode(&store.dump().expect("dump"));
        let (linfo, dump) = decode(&old).expect("legacy decodes");
        assert_eq!(linfo.format, Format::RkubeV1);
        assert_eq!(
            (linfo.revision, linfo.keys, linfo.hash),
            (info.revision, info.keys, info.hash)
        );
        let target = empty_store();
        target.restore_for_new_cluster(dump, 1000).expect("restore");
        assert_eq!(target.revision(), 1005);
    }

    #[test]
    fn refuses_other_files_truncation_and_corruption() {
        let store = store_with_history();
        let (_, bytes) = encode(&store).expect("encode");
        let zipped = compress("s.snap", &bytes).expect("zip");
        let old = legacy::encode(&store.dump().expect("dump"));
        let not = |r: Result<(BackupInfo, Dump), BackupError>| {
            matches!(r, Err(BackupError::NotASnapshot))
        };
        let corrupt =
            |r: Result<(BackupInfo, Dump), BackupError>| matches!(r, Err(BackupError::Corrupt(_)));
        assert!(not(decode(b"SQLite format 3\0......")));
        assert!(not(decode(&vec![7u8; 4096 + 32])));
        for (what, file) in [("etcd", &bytes), ("zip", &zipped), ("legacy", &old)] {
            assert!(
                corrupt(decode(&file[..file.len() - 10])),
                "{what}: truncated"
            );
            assert!(corrupt(decode(&file[..file.len() / 2])), "{what}: half");
            // A flipped byte anywhere fails a checksum (or, in a zip's directory, its parse).
            let mut places = vec![file.len() / 3, file.len() / 2];
            if what != "zip" {
                places.push(file.len() - 40);
            }
            for at in places {
                let mut flipped = file.clone();
                flipped[at] ^= 0xff;
                assert!(decode(&flipped).is_err(), "{what}: byte {at} flipped");
            }
        }
        let mut flipped = bytes.clone();
        flipped[bytes.len() / 2] ^= 1;
        match decode(&flipped).map(|(info, _)| info) {
            Err(BackupError::Corrupt(e)) => assert!(e.contains("SHA-256"), "{e}"),
            other => panic!("{other:?}"),
        }
        // A database without its SHA-256 (copied from a data dir) needs the check skipped.
        let raw = &bytes[..bytes.len() - 32];
        assert!(matches!(decode(raw), Err(BackupError::MissingHash)));
        assert_eq!(
            decode_with(raw, true).expect("skip").0.revision,
            store.revision()
        );
        let other_bolt = crate::bolt::write(&crate::bolt::Bucket::default()).expect("bolt");
        assert!(matches!(
            decode_with(&other_bolt, true),
            Err(BackupError::NotEtcd)
        ));
    }
}
