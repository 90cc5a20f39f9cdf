//! rkube's first backup format (`RKUBE-SNAPSHOT`), which backups taken before snapshots were
//! in etcd's format have: read only.
//!
//! Layout: the magic line, a little-endian u32 header length, the bincode header, the bincode
//! dump of the MVCC trees, zeros up to a multiple of 512 bytes, and the SHA-256 of everything
//! before it.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{BackupError, BackupInfo, Format};
use crate::mvcc::store::Dump;

pub const MAGIC: &[u8] = b"RKUBE-SNAPSHOT\n";
const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Header {
    format: u32,
    revision: i64,
    compact_revision: i64,
    keys: u64,
    /// Equal to HashKV at `revision` on the cluster it was taken from.
    hash: u32,
}

/// Checks and parses a file of this format.
pub fn decode(bytes: &[u8]) -> Result<(BackupInfo, Dump), BackupError> {
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
    let header: Header =
        bincode::deserialize(&rest[..len]).map_err(|e| BackupError::Corrupt(e.to_string()))?;
    if header.format != FORMAT_VERSION {
        return Err(BackupError::UnsupportedFormat(header.format));
    }
    let dump: Dump =
        bincode::deserialize(&rest[len..]).map_err(|e| BackupError::Corrupt(e.to_string()))?;
    let info = BackupInfo {
        format: Format::RkubeV1,
        compressed: false,
        revision: header.revision,
        compact_revision: header.compact_revision,
        keys: header.keys,
        hash: header.hash,
        etcd: None,
    };
    Ok((info, dump))
}

/// A file of this format, as rkube wrote them: for tests that old backups still restore.
#[cfg(test)]
pub fn encode(dump: &Dump) -> Vec<u8> {
    let header = Header {
        format: FORMAT_VERSION,
        revision: dump.revision(),
        compact_revision: dump.compact_revision(),
        keys: dump.key_count() as u64,
        hash: dump.hash_kv(),
    };
    let header = bincode::serialize(&header).expect("header");
    let body = bincode::serialize(dump).expect("dump");
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&body);
    out.resize(out.len().div_ceil(512) * 512, 0);
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    out
}
