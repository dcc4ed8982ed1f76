//! The record: one change of one key at one revision, as the data files hold it.
//!
//! ```text
//! offset  size  field (little-endian)
//! 0       4     len: header + key + value, u32 (the record is padded to 8 bytes after it)
//! 4       4     crc32 of bytes 8..len
//! 8       8     revision main, i64
//! 16      8     revision sub, i64
//! 24      8     create revision main, i64   (0 for a tombstone)
//! 32      8     create revision sub, i64
//! 40      8     version, i64                (0 for a tombstone: a delete)
//! 48      8     lease, i64                  (0 for none)
//! 56      4     key length, u32
//! 60      4     value length, u32
//! 64      ...   key, then value
//! ```
//!
//! A record carries its create revision and version, not only its value, so the key index can
//! be rebuilt from the records that survive compaction and defragmentation: the versions of
//! the puts dropped before them are not there to count.

use crate::revision::Revision;

/// Bytes before the key.
pub(crate) const HEADER_LEN: usize = 64;

/// A record to write, or one read back (borrowing its key and value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub(crate) rev: Revision,
    /// The revision that created the key in its current generation; zero for a tombstone.
    pub(crate) created: Revision,
    /// Puts since creation, 1 on create; 0 marks a tombstone.
    pub(crate) version: i64,
    pub(crate) lease: i64,
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
}

/// Why bytes are not a valid record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RecordError {
    #[error("record header cut short")]
    ShortHeader,
    #[error("record length {0} does not match its key and value")]
    BadLength(u32),
    #[error("record cut short")]
    ShortBody,
    #[error("record checksum mismatch")]
    Checksum,
}

impl Record<'_> {
    pub(crate) fn is_tombstone(&self) -> bool {
        self.version == 0
    }

    /// Length without padding.
    pub(crate) fn len(&self) -> usize {
        HEADER_LEN + self.key.len() + self.value.len()
    }

    /// What the record takes in a data file, padding included.
    pub(crate) fn padded_len(&self) -> usize {
        padded(self.len())
    }

    /// Writes the record into the start of `out`, which must hold [`Record::padded_len`]
    /// bytes; the padding is zeroed.
    pub(crate) fn encode_into(&self, out: &mut [u8]) -> Option<()> {
        let len = self.len();
        let out = out.get_mut(..padded(len))?;
        let fields = [
            self.rev.main,
            self.rev.sub,
            self.created.main,
            self.created.sub,
            self.version,
            self.lease,
        ];
        for (i, f) in fields.iter().enumerate() {
            out.get_mut(8 + 8 * i..16 + 8 * i)?.copy_from_slice(&f.to_le_bytes());
        }
        out.get_mut(56..60)?
            .copy_from_slice(&u32::try_from(self.key.len()).ok()?.to_le_bytes());
        out.get_mut(60..64)?
            .copy_from_slice(&u32::try_from(self.value.len()).ok()?.to_le_bytes());
        out.get_mut(HEADER_LEN..HEADER_LEN + self.key.len())?
            .copy_from_slice(self.key);
        out.get_mut(HEADER_LEN + self.key.len()..len)?
            .copy_from_slice(self.value);
        out.get_mut(len..)?.fill(0);
        out.get_mut(0..4)?
            .copy_from_slice(&u32::try_from(len).ok()?.to_le_bytes());
        let crc = crc32fast::hash(out.get(8..len)?);
        out.get_mut(4..8)?.copy_from_slice(&crc.to_le_bytes());
        Some(())
    }

    /// The record as a fresh byte vector, padded.
    #[cfg(test)]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![0; self.padded_len()];
        // The buffer has exactly the padded length, so this cannot fail.
        let _ = self.encode_into(&mut out);
        out
    }
}

/// `len` rounded up to a multiple of 8.
pub(crate) fn padded(len: usize) -> usize {
    len.div_ceil(8) * 8
}

/// The little-endian u32 at `at` of `b` (0 if `b` is shorter).
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, i64::from_le_bytes)
}

/// Decodes and verifies the record at the start of `bytes`; returns it and its padded length.
pub(crate) fn decode(bytes: &[u8]) -> Result<(Record<'_>, usize), RecordError> {
    let header = bytes.get(..HEADER_LEN).ok_or(RecordError::ShortHeader)?;
    let len = u32_at(header, 0);
    let (key_len, value_len) = (u32_at(header, 56) as usize, u32_at(header, 60) as usize);
    if len as usize != HEADER_LEN + key_len + value_len {
        return Err(RecordError::BadLength(len));
    }
    let body = bytes.get(..len as usize).ok_or(RecordError::ShortBody)?;
    if crc32fast::hash(body.get(8..).unwrap_or_default()) != u32_at(header, 4) {
        return Err(RecordError::Checksum);
    }
    let record = Record {
        rev: Revision::new(i64_at(header, 8), i64_at(header, 16)),
        created: Revision::new(i64_at(header, 24), i64_at(header, 32)),
        version: i64_at(header, 40),
        lease: i64_at(header, 48),
        key: body.get(HEADER_LEN..HEADER_LEN + key_len).unwrap_or_default(),
        value: body.get(HEADER_LEN + key_len..).unwrap_or_default(),
    };
    Ok((record, padded(len as usize)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record<'static> {
        Record {
            rev: Revision::new(7, 2),
            created: Revision::new(3, 0),
            version: 4,
            lease: 99,
            key: b"key",
            value: b"value!",
        }
    }

    #[test]
    fn records_round_trip_padded_to_eight_bytes() {
        let bytes = sample().encode();
        assert_eq!(bytes.len(), 80, "64 + 3 + 6 = 73, padded to 80");
        let (back, used) = decode(&bytes).unwrap();
        assert_eq!((back, used), (sample(), 80));
        let tomb = Record {
            version: 0,
            created: Revision::default(),
            lease: 0,
            value: b"",
            ..sample()
        };
        assert!(decode(&tomb.encode()).unwrap().0.is_tombstone());
    }

    #[test]
    fn every_damage_is_detected() {
        let bytes = sample().encode();
        assert_eq!(decode(&bytes[..40]), Err(RecordError::ShortHeader));
        assert_eq!(decode(&bytes[..70]), Err(RecordError::ShortBody));
        for i in 0..73 {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad).is_err(), "a flipped bit at byte {i} is caught");
        }
        assert_eq!(decode(&[0; 64]), Err(RecordError::BadLength(0)), "zeros are no record");
    }
}
