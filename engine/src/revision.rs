//! Revisions: the logical clock of the store.
//!
//! Every change to the store happens at a revision `{main, sub}`: `main` is the store-wide
//! revision, bumped once by each write request (a Put, a DeleteRange that deletes something, a
//! Txn whose chosen branch writes), and `sub` numbers the individual changes within it, from 0,
//! in request order. So all writes of one Txn share `main`. Revisions order lexicographically,
//! never decrease; an empty store is at revision 1, so the first write gets main 2 (as in etcd).
//!
//! On disk a revision is 16 bytes, `main` then `sub`, both big-endian, so byte order is
//! revision order.

use std::fmt;

/// A point in the store's history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision {
    /// The store-wide revision of the write request.
    pub main: i64,
    /// The change's position within the request.
    pub sub: i64,
}

/// Bytes of an encoded [`Revision`].
pub const REVISION_LEN: usize = 16;

impl Revision {
    /// The revision `{main, sub}`, in a `const` context too.
    pub const fn new(main: i64, sub: i64) -> Revision {
        Revision { main, sub }
    }

    /// The 16-byte on-disk form: `main` then `sub`, big-endian, so byte order is revision
    /// order for non-negative revisions. [`Revision::decode`] reverses it.
    pub fn encode(&self) -> [u8; REVISION_LEN] {
        let mut out = [0u8; REVISION_LEN];
        let (main, sub) = out.split_at_mut(8);
        main.copy_from_slice(&self.main.to_be_bytes());
        sub.copy_from_slice(&self.sub.to_be_bytes());
        out
    }

    /// Decodes the first 16 bytes of `bytes`; `None` if there are fewer.
    pub fn decode(bytes: &[u8]) -> Option<Revision> {
        let main = i64::from_be_bytes(bytes.get(0..8)?.try_into().ok()?);
        let sub = i64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?);
        Some(Revision { main, sub })
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.main, self.sub)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_preserves_order() {
        // Byte order equals revision order, for every pair below.
        let revs = [
            Revision::new(0, 0),
            Revision::new(1, 0),
            Revision::new(1, 1),
            Revision::new(1, 255),
            Revision::new(1, 256),
            Revision::new(2, 0),
            Revision::new(256, 0),
            Revision::new(i64::MAX, i64::MAX),
        ];
        for pair in revs.windows(2) {
            assert!(pair[0] < pair[1]);
            assert!(pair[0].encode() < pair[1].encode(), "{} vs {}", pair[0], pair[1]);
            assert_eq!(Revision::decode(&pair[1].encode()), Some(pair[1]));
        }
        assert_eq!(Revision::decode(&[0; 15]), None);
    }
}
