//! Segment files: their names and their 40-byte header.
//!
//! A segment is named `{seq:016x}-{first_index:016x}.wal`: its sequence number and the index
//! the next entry was expected to have when the segment was created. Files named `*.tmp` are
//! preallocated segments not yet in use; recovery deletes them. Files named `*.broken` are
//! copies kept by a repair; recovery ignores them.
//!
//! ```text
//! offset  size  field
//! 0       8     magic "CAIRNWAL"
//! 8       4     format version, u32 LE (1)
//! 12      4     crc seed, u32 LE: the stored crc of the previous segment's last record
//! 16      8     sequence number, u64 LE (matches the name)
//! 24      8     first index, u64 LE (matches the name)
//! 32      4     crc32 of bytes 0..32
//! 36      4     zero
//! ```
//!
//! A header is written and fdatasynced under the temporary name before the rename that makes
//! the segment part of the log, so a segment with a bad header is corruption, never a crash.

use crate::error::CorruptionReason;
use crate::types::{LogIndex, SegmentSeq};

/// The first eight bytes of every segment file.
pub const MAGIC: [u8; 8] = *b"CAIRNWAL";
/// The on-disk format version this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the segment header; the first frame starts at this offset, which is 8-aligned.
pub const HEADER_LEN: usize = 40;
const SUFFIX: &str = ".wal";
const TMP_SUFFIX: &str = ".tmp";
/// Suffix of a damaged segment's copy, kept by a repair.
pub const BROKEN_SUFFIX: &str = ".broken";

/// The decoded header of a segment file. `seq` and `first_index` repeat the file name;
/// recovery checks that they match it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The segment's sequence number.
    pub seq: SegmentSeq,
    /// The index the next entry was expected to have when the segment was created.
    pub first_index: LogIndex,
    /// The crc the first record is chained from: the stored crc of the previous segment's last
    /// record, or 0 for the first segment of a new log.
    pub crc_seed: u32,
}

impl SegmentHeader {
    /// The header's 40 bytes, header crc included.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        let mut w = Vec::with_capacity(HEADER_LEN);
        w.extend_from_slice(&MAGIC);
        w.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        w.extend_from_slice(&self.crc_seed.to_le_bytes());
        w.extend_from_slice(&self.seq.0.to_le_bytes());
        w.extend_from_slice(&self.first_index.0.to_le_bytes());
        let crc = crc32fast::hash(&w);
        w.extend_from_slice(&crc.to_le_bytes());
        w.resize(HEADER_LEN, 0);
        out.copy_from_slice(&w);
        out
    }

    /// Decodes the header at the start of `buf`, checking its length, magic, crc and format
    /// version. It does not compare `seq` or `first_index` with the file name.
    pub fn decode(buf: &[u8]) -> Result<SegmentHeader, CorruptionReason> {
        let h = buf
            .get(..HEADER_LEN)
            .ok_or(CorruptionReason::Header("shorter than a header"))?;
        let u32_at = |at: usize| {
            h.get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
        };
        let u64_at = |at: usize| {
            h.get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
        };
        if h.get(0..8) != Some(&MAGIC[..]) {
            return Err(CorruptionReason::Header("bad magic"));
        }
        let stored_crc = u32_at(32).unwrap_or_default();
        if crc32fast::hash(h.get(..32).unwrap_or_default()) != stored_crc {
            return Err(CorruptionReason::Header("header crc mismatch"));
        }
        if u32_at(8) != Some(FORMAT_VERSION) {
            return Err(CorruptionReason::Header("unsupported format version"));
        }
        Ok(SegmentHeader {
            crc_seed: u32_at(12).unwrap_or_default(),
            seq: SegmentSeq(u64_at(16).unwrap_or_default()),
            first_index: LogIndex(u64_at(24).unwrap_or_default()),
        })
    }
}

/// The file name of a segment.
pub fn segment_name(seq: SegmentSeq, first_index: LogIndex) -> String {
    format!("{:016x}-{:016x}{SUFFIX}", seq.0, first_index.0)
}

/// Parses a segment file name; `None` for anything that is not one.
pub fn parse_segment_name(name: &str) -> Option<(SegmentSeq, LogIndex)> {
    let stem = name.strip_suffix(SUFFIX)?;
    let (seq, first) = stem.split_once('-')?;
    let hex16 = |s: &str| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex16(seq) || !hex16(first) {
        return None;
    }
    let seq = u64::from_str_radix(seq, 16).ok()?;
    let first = u64::from_str_radix(first, 16).ok()?;
    Some((SegmentSeq(seq), LogIndex(first)))
}

/// The file name of the `n`th preallocated, not yet used segment.
pub fn tmp_name(n: u64) -> String {
    format!("{n:016x}{TMP_SUFFIX}")
}

/// Whether `name` is a preallocated segment not yet in use.
pub fn is_tmp_name(name: &str) -> bool {
    name.ends_with(TMP_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_roundtrip_and_sort_by_sequence() {
        let a = segment_name(SegmentSeq(2), LogIndex(0x10));
        let b = segment_name(SegmentSeq(10), LogIndex(0x5));
        assert_eq!(a, "0000000000000002-0000000000000010.wal");
        assert_eq!(parse_segment_name(&a), Some((SegmentSeq(2), LogIndex(0x10))));
        assert!(a < b, "fixed-width hex sorts like the numbers");
    }

    #[test]
    fn foreign_names_are_not_segments() {
        for name in [
            "0000000000000002-0000000000000010.wal.broken",
            "0000000000000002.tmp",
            "2-10.wal",
            "+000000000000001-0000000000000010.wal",
            "zzzzzzzzzzzzzzzz-0000000000000010.wal",
            "LOCK",
            "",
        ] {
            assert_eq!(parse_segment_name(name), None, "{name}");
        }
    }

    #[test]
    fn header_roundtrip_and_damage() {
        let h = SegmentHeader {
            seq: SegmentSeq(7),
            first_index: LogIndex(1000),
            crc_seed: 0xdead_beef,
        };
        let bytes = h.encode();
        assert_eq!(SegmentHeader::decode(&bytes), Ok(h));
        for i in 0..36 {
            let mut bad = bytes;
            bad[i] ^= 0x40;
            assert!(SegmentHeader::decode(&bad).is_err(), "flip at byte {i} must be caught");
        }
        assert!(SegmentHeader::decode(&bytes[..39]).is_err());
    }
}
