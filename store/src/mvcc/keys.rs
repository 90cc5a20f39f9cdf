//! Byte encodings of the MVCC trees: a revision is `main` and `sub` (the index of a change
//! inside one write transaction), both big-endian so that byte order is revision order.

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
        Self::first_of_rev(main).to_bytes()
    }

    /// The first possible revision of a main revision, as a revision.
    pub fn first_of_rev(main: i64) -> Revision {
        Revision { main, sub: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_order_as_bytes() {
        let a = Revision { main: 1, sub: 5 }.to_bytes();
        let b = Revision { main: 2, sub: 0 }.to_bytes();
        assert!(a < b);
        assert_eq!(Revision::from_bytes(&b), Some(Revision { main: 2, sub: 0 }));
    }
}
