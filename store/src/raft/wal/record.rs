//! A record's encoding: its length and the CRC-32 checksum of its payload, then the payload
//! (bincode); and reading one back, checked.

use serde::{Deserialize, Serialize};

use super::WalError;
use crate::raft::{Entry, LogId, Vote};

pub(super) const HEADER: usize = 8;
/// Largest record accepted when reading: anything longer is a torn or garbage length.
pub(super) const MAX_RECORD: u32 = 512 * 1024 * 1024;

/// What a record says. The borrowed twin [`RecordRef`] encodes the same bytes.
#[derive(Deserialize)]
pub(super) enum Record {
    Entry(Entry),
    Vote(Vote),
    Committed(Option<LogId>),
    Truncate { since: u64 },
    Purge(LogId),
}

#[derive(Serialize)]
pub(super) enum RecordRef<'a> {
    Entry(&'a Entry),
    Vote(&'a Vote),
    Committed(&'a Option<LogId>),
    Truncate { since: u64 },
    Purge(&'a LogId),
}

pub(super) fn encode_into(buf: &mut Vec<u8>, record: &RecordRef<'_>) -> Result<(), WalError> {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; HEADER]);
    bincode::serialize_into(&mut *buf, record)?;
    let payload = &buf[start + HEADER..];
    let len = payload.len() as u32;
    let crc = crc32fast::hash(payload);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

pub(super) fn decode(rec: &[u8]) -> Result<Record, String> {
    if rec.len() < HEADER {
        return Err("short record".into());
    }
    let len = u32::from_le_bytes(rec[0..4].try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(rec[4..8].try_into().unwrap_or_default());
    let payload = rec.get(HEADER..HEADER + len).ok_or("short record")?;
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch".into());
    }
    bincode::deserialize(payload).map_err(|e| format!("cannot decode: {e}"))
}
