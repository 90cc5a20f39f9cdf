//! Byte encodings of the MVCC trees.
//!
//! - A revision is `main` and `sub` (the index of a change inside one write transaction), both
//!   big-endian so that byte order is revision order.
//! - The key index orders by user key first, then revision. User keys are escaped (`0x00` becomes
//!   `0x00 0xff`) and terminated by `0x00 0x00`, which keeps lexicographic key order and makes
//!   the encoding of a key never a prefix of another key's encoding.

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Revision {
    pub main: i64,
    pub sub: i64,
}

impl Revision {
    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&(self.main as u64).to_be_bytes());
        out[8..].copy_from_slice(&(self.sub as u64).to_be_bytes());
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != 16 {
            return None;
        }
        let main = u64::from_be_bytes(bytes[..8].try_into().ok()?) as i64;
        let sub = u64::from_be_bytes(bytes[8..].try_into().ok()?) as i64;
        Some(Self { main, sub })
    }

    /// The first possible revision of a main revision.
    pub fn first_of(main: i64) -> [u8; 16] {
        Revision { main, sub: 0 }.to_bytes()
    }
}

/// The escaped, terminated form of a user key.
pub fn escape_key(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 2);
    for &b in key {
        out.push(b);
        if b == 0 {
            out.push(0xff);
        }
    }
    out.extend_from_slice(&[0, 0]);
    out
}

/// An entry of the key index: escaped key followed by the revision.
pub fn index_key(key: &[u8], rev: Revision) -> Vec<u8> {
    let mut out = escape_key(key);
    out.extend_from_slice(&rev.to_bytes());
    out
}

/// Splits an index entry back into the user key and the revision.
pub fn split_index_key(entry: &[u8]) -> Option<(Vec<u8>, Revision)> {
    if entry.len() < 18 {
        return None;
    }
    let (escaped, rev) = entry.split_at(entry.len() - 16);
    let rev = Revision::from_bytes(rev)?;
    let body = escaped.strip_suffix(&[0, 0])?;
    let mut key = Vec::with_capacity(body.len());
    let mut iter = body.iter();
    while let Some(&b) = iter.next() {
        key.push(b);
        if b == 0 && iter.next() != Some(&0xff) {
            return None;
        }
    }
    Some((key, rev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_keeps_key_order_and_round_trips() {
        let keys: Vec<&[u8]> = vec![
            b"", b"\0", b"\0\0", b"\x01", b"a", b"a\0", b"a\0b", b"a\x01", b"ab", b"b",
        ];
        let mut encoded: Vec<Vec<u8>> = keys
            .iter()
            .map(|k| index_key(k, Revision { main: 7, sub: 1 }))
            .collect();
        let sorted = encoded.clone();
        encoded.sort();
        assert_eq!(
            encoded, sorted,
            "encoding must preserve the order of the keys"
        );
        for key in keys {
            let (back, rev) =
                split_index_key(&index_key(key, Revision { main: 3, sub: 2 })).expect("decodes");
            assert_eq!(back, key);
            assert_eq!(rev, Revision { main: 3, sub: 2 });
        }
    }

    #[test]
    fn revisions_order_as_bytes() {
        let a = Revision { main: 1, sub: 5 }.to_bytes();
        let b = Revision { main: 2, sub: 0 }.to_bytes();
        assert!(a < b);
        assert_eq!(Revision::from_bytes(&b), Some(Revision { main: 2, sub: 0 }));
    }
}
