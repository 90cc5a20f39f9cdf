//! The protobuf wire format: fields by number and wire type, strings and map entries.

use super::bad;
use crate::error::ApiError;

/// One wire-format field.
pub(super) enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ApiError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let (&b, rest) = self
                .buf
                .split_first()
                .ok_or_else(|| bad("truncated varint"))?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ApiError> {
        if self.buf.len() < n {
            return Err(bad("truncated field"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn next(&mut self) -> Result<Option<(u32, Wire<'a>)>, ApiError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let num = u32::try_from(key >> 3).map_err(|_| bad("field number out of range"))?;
        let wire = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Wire::Fixed
            }
            2 => {
                let len =
                    usize::try_from(self.varint()?).map_err(|_| bad("length out of range"))?;
                Wire::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Wire::Fixed
            }
            other => return Err(bad(&format!("wire type {other} is not used by Kubernetes"))),
        };
        Ok(Some((num, wire)))
    }
}

pub(super) fn fields(buf: &[u8]) -> Result<Vec<(u32, Wire<'_>)>, ApiError> {
    let mut r = Reader { buf };
    let mut out = Vec::new();
    while let Some(field) = r.next()? {
        out.push(field);
    }
    Ok(out)
}

/// The varints of a packed repeated field.
pub(super) fn varints(buf: &[u8]) -> Result<Vec<u64>, ApiError> {
    let mut r = Reader { buf };
    let mut out = Vec::new();
    while !r.buf.is_empty() {
        out.push(r.varint()?);
    }
    Ok(out)
}

pub(super) fn string(b: &[u8]) -> Result<String, ApiError> {
    String::from_utf8(b.to_vec()).map_err(|_| bad("a string field is not UTF-8"))
}

pub(super) fn bytes_of<'a>(w: &Wire<'a>, what: &str) -> Result<&'a [u8], ApiError> {
    match w {
        Wire::Bytes(b) => Ok(b),
        _ => Err(bad(&format!("{what} is not length-delimited"))),
    }
}

/// A map entry (key = 1, value = 2).
pub(super) fn entry(b: &[u8]) -> Result<(String, Option<&[u8]>), ApiError> {
    let mut key = String::new();
    let mut value = None;
    for (num, w) in fields(b)? {
        match num {
            1 => key = string(bytes_of(&w, "a map key")?)?,
            2 => value = Some(bytes_of(&w, "a map value")?),
            _ => {}
        }
    }
    Ok((key, value))
}
