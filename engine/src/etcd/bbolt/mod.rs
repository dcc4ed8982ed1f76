//! bbolt's file format (version 2), as go.etcd.io/bbolt writes it: what etcd keeps its state
//! in, and what its snapshots are.
//!
//! A file is pages of `page_size` bytes. Pages 0 and 1 are meta pages (the valid one with the
//! higher transaction ID wins); the meta names the root bucket's B+tree and the high-water mark
//! (pages in use). Every tree page starts with a 16-byte header; branch pages hold
//! `(key, child page)` elements, leaf pages `(flags, key, value)` elements, each element's
//! `pos` counted from the element itself. A leaf element with [`BUCKET_LEAF`] set is a
//! bucket: its value is `{root page, sequence}`, and when the root is 0 the bucket's only
//! page follows inline in the value. A page larger than `page_size` runs on into `overflow`
//! more pages. Integers are little-endian (as written on amd64 and arm64).
//!
//! ```text
//! page header   id u64 | flags u16 | count u16 | overflow u32
//! meta (at 16)  magic u32 0xED0CDAED | version u32 2 | page_size u32 | flags u32
//!               | root u64 | sequence u64 | freelist u64 | high-water mark u64 | txid u64
//!               | checksum u64: FNV-1a 64 of the 56 bytes before it
//! branch elem   pos u32 | ksize u32 | child u64
//! leaf elem     flags u32 | pos u32 | ksize u32 | vsize u32
//! ```
//!
//! - [`read`]: a strictly read-only reader that checks every page it visits against the file
//!   and the high-water mark, and refuses cycles: a damaged file is an error, never a panic.
//! - [`write`]: a writer of a fresh file from sorted buckets, as Go bbolt and `etcdutl` accept.

pub(crate) mod read;
pub(crate) mod write;

/// Page header size, and the size of a branch or leaf element.
pub(crate) const HEADER: usize = 16;
pub(crate) const ELEMENT: usize = 16;
/// Page flags.
pub(crate) const BRANCH: u16 = 0x01;
pub(crate) const LEAF: u16 = 0x02;
pub(crate) const META: u16 = 0x04;
pub(crate) const FREELIST: u16 = 0x10;
/// A leaf element that is a bucket.
pub(crate) const BUCKET_LEAF: u32 = 0x01;
pub(crate) const MAGIC: u32 = 0xED0C_DAED;
pub(crate) const VERSION: u32 = 2;
/// A bucket value's header: root page, sequence.
pub(crate) const BUCKET_HEADER: usize = 16;

/// Why a bbolt file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BoltError {
    /// Reading the file failed.
    #[error("reading the database: {0}")]
    Io(#[from] std::io::Error),
    /// Neither meta page is a valid bbolt meta (etcd: "invalid database").
    #[error("not a bbolt database: {0}")]
    NotBolt(&'static str),
    /// The file ends before the pages its meta says it holds.
    #[error("the database is truncated: its meta names {needed} bytes, the file holds {len}")]
    Truncated {
        /// Bytes the high-water mark covers.
        needed: u64,
        /// The file's length.
        len: u64,
    },
    /// A page is damaged.
    #[error("page {page} is damaged: {reason}")]
    BadPage {
        /// The page's ID.
        page: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A page is reachable twice: the tree has a cycle.
    #[error("page {0} is reached twice: the tree has a cycle")]
    Cycle(u64),
}

/// FNV-1a 64, bbolt's meta checksum.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Where a bucket's entries are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BucketRoot {
    /// A B+tree rooted at this page.
    Page(u64),
    /// A single leaf page held in the bucket's value.
    Inline(Vec<u8>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_the_reference_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
