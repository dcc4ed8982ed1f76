//! Record framing: how one record is laid out in a segment, and its chained checksum.
//!
//! ```text
//! offset  size  field
//! 0       4     payload length, u32 little-endian
//! 4       4     crc32 (IEEE, crc32fast), chained: seeded with the previous record's stored crc
//! 8       1     record type (1 entry, 2 state, 3 truncate, 4 carried state); 0 never occurs
//! 9       7     reserved, zero
//! 16      8     index, u64 little-endian (entry index, truncation point, or 0)
//! 24      len   payload
//! ..      0..7  zero padding to the next multiple of 8
//! ```
//!
//! The checksum covers the length field and bytes 8..24+len, and starts from the previous
//! record's stored crc (the segment header's seed for the first record). A record copied from
//! another position, another segment or another log therefore fails its check.
//!
//! Frames start at 8-byte aligned offsets, so the 4-byte length never straddles a sector and is
//! never half old, half new after a torn write. An all-zero header is not a valid frame (type 0
//! does not exist), which is how the unwritten, zero-filled part of a preallocated segment reads.

use crate::error::FrameError;

/// Bytes before the payload.
pub const FRAME_HEADER_LEN: usize = 24;
/// Frames start and end on multiples of this.
pub const FRAME_ALIGN: usize = 8;

/// The type byte of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A [`crate::Record::Entry`]; the frame's index is the entry's index.
    Entry = 1,
    /// A [`crate::Record::State`] the caller appended; the frame's index is 0.
    State = 2,
    /// A [`crate::Record::Truncate`]; the frame's index is the truncation point and the payload
    /// is empty.
    Truncate = 3,
    /// The latest state, repeated by the log at the head of a new segment.
    CarriedState = 4,
}

impl FrameKind {
    fn from_byte(b: u8) -> Result<FrameKind, FrameError> {
        match b {
            1 => Ok(FrameKind::Entry),
            2 => Ok(FrameKind::State),
            3 => Ok(FrameKind::Truncate),
            4 => Ok(FrameKind::CarriedState),
            other => Err(FrameError::UnknownType(other)),
        }
    }
}

/// A decoded frame borrowing its payload from the buffer it was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// What the frame holds.
    pub kind: FrameKind,
    /// The entry index or truncation point, per `kind`; 0 for state frames.
    pub index: u64,
    /// The payload, without padding.
    pub payload: &'a [u8],
    /// The stored checksum; the next frame's seed.
    pub crc: u32,
}

/// The number of bytes a frame with a payload of `payload_len` bytes occupies, padding included.
pub fn framed_len(payload_len: usize) -> usize {
    (FRAME_HEADER_LEN + payload_len).next_multiple_of(FRAME_ALIGN)
}

fn checksum(seed: u32, len_bytes: &[u8], rest: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(seed);
    h.update(len_bytes);
    h.update(rest);
    h.finalize()
}

impl FrameKind {
    /// Appends a frame of this kind to `out` and returns its crc (the seed for the next frame).
    ///
    /// `out.len()` must be a multiple of [`FRAME_ALIGN`] for the frame to be aligned; the log's
    /// buffers always are. The payload must fit in a u32; the log checks this before encoding.
    pub fn encode(self, out: &mut Vec<u8>, index: u64, payload: &[u8], seed: u32) -> u32 {
        let start = out.len();
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.push(self as u8);
        out.extend_from_slice(&[0; 7]);
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(payload);
        out.resize(start + framed_len(payload.len()), 0);
        let frame = out.get_mut(start..).unwrap_or_default();
        let (len_bytes, rest) = frame.split_at_mut(4);
        let body_end = FRAME_HEADER_LEN - 8 + payload.len();
        let crc = checksum(seed, len_bytes, rest.get(4..4 + body_end).unwrap_or_default());
        if let Some(slot) = rest.get_mut(0..4) {
            slot.copy_from_slice(&crc.to_le_bytes());
        }
        crc
    }
}

/// Whether the frame header at the start of `buf` is all zeros: the clean, unwritten end of a
/// preallocated segment (or, mid-file, a lost write).
pub fn is_zero_header(buf: &[u8]) -> bool {
    buf.iter().take(FRAME_HEADER_LEN).all(|b| *b == 0)
}

fn le_u32(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

fn le_u64(buf: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(buf.get(at..at + 8)?.try_into().ok()?))
}

/// The extent a damaged frame at the start of `buf` claims, capped at `buf.len()`: used by
/// recovery to decide whether damage is confined to the tail.
pub fn claimed_extent(buf: &[u8]) -> usize {
    match le_u32(buf, 0) {
        Some(len) => framed_len(len as usize).min(buf.len()),
        None => buf.len(),
    }
}

/// Decodes the frame at the start of `buf`, checking it against `seed`.
///
/// Returns the frame and the number of bytes it occupies. Never panics and never allocates,
/// whatever `buf` holds: a length field larger than the buffer is [`FrameError::Truncated`].
pub fn decode_frame(buf: &[u8], seed: u32) -> Result<(Frame<'_>, usize), FrameError> {
    let available = buf.len() as u64;
    let truncated = |needed: u64| FrameError::Truncated { needed, available };
    let len = le_u32(buf, 0).ok_or(truncated(FRAME_HEADER_LEN as u64))? as usize;
    let total = framed_len(len);
    let frame = buf.get(..total).ok_or(truncated(total as u64))?;
    let stored = le_u32(frame, 4).ok_or(truncated(total as u64))?;
    let body = frame.get(8..FRAME_HEADER_LEN + len).ok_or(truncated(total as u64))?;
    let computed = checksum(seed, frame.get(0..4).unwrap_or_default(), body);
    if computed != stored {
        return Err(FrameError::Crc { stored, computed });
    }
    let kind = FrameKind::from_byte(frame.get(8).copied().unwrap_or(0))?;
    let reserved = frame.get(9..16).unwrap_or_default();
    let padding = frame.get(FRAME_HEADER_LEN + len..).unwrap_or_default();
    if reserved.iter().chain(padding).any(|b| *b != 0) {
        return Err(FrameError::NonZeroPadding);
    }
    let index = le_u64(frame, 16).ok_or(truncated(total as u64))?;
    let payload = frame.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len).unwrap_or_default();
    Ok((
        Frame {
            kind,
            index,
            payload,
            crc: stored,
        },
        total,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_alignment() {
        // Every frame is 8-aligned so its length field never straddles a sector (wal-format.md).
        for len in [0usize, 1, 7, 8, 9, 255, 256, 4096] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut buf = Vec::new();
            let crc = FrameKind::Entry.encode(&mut buf, 42, &payload, 7);
            assert_eq!(buf.len(), framed_len(len));
            assert_eq!(buf.len() % FRAME_ALIGN, 0);
            let (frame, used) = decode_frame(&buf, 7).unwrap();
            assert_eq!(used, buf.len());
            assert_eq!(frame.kind, FrameKind::Entry);
            assert_eq!(frame.index, 42);
            assert_eq!(frame.payload, &payload[..]);
            assert_eq!(frame.crc, crc);
        }
    }

    #[test]
    fn chained_crc_rejects_wrong_seed() {
        // The chain detects a record moved from another position or log.
        let mut buf = Vec::new();
        FrameKind::State.encode(&mut buf, 0, b"hello", 1);
        assert!(matches!(decode_frame(&buf, 2), Err(FrameError::Crc { .. })));
    }

    #[test]
    fn damage_is_detected() {
        let mut good = Vec::new();
        FrameKind::Entry.encode(&mut good, 3, b"payload bytes", 0);
        type Case = (&'static str, Box<dyn Fn(&mut Vec<u8>)>, fn(&FrameError) -> bool);
        let cases: Vec<Case> = vec![
            ("flipped payload bit", Box::new(|b| b[30] ^= 1), |e| {
                matches!(e, FrameError::Crc { .. })
            }),
            ("flipped length", Box::new(|b| b[0] ^= 2), |e| {
                matches!(e, FrameError::Crc { .. } | FrameError::Truncated { .. })
            }),
            ("huge length", Box::new(|b| b[3] = 0xff), |e| {
                matches!(e, FrameError::Truncated { .. })
            }),
            ("short buffer", Box::new(|b| b.truncate(20)), |e| {
                matches!(e, FrameError::Truncated { .. })
            }),
            ("zeroed", Box::new(|b| b.iter_mut().for_each(|x| *x = 0)), |e| {
                matches!(e, FrameError::Crc { .. })
            }),
        ];
        for (name, damage, expected) in cases {
            let mut buf = good.clone();
            damage(&mut buf);
            let err = decode_frame(&buf, 0).expect_err(name);
            assert!(expected(&err), "{name}: {err:?}");
        }
    }

    #[test]
    fn zero_header_is_not_a_frame() {
        let zeros = [0u8; 64];
        assert!(is_zero_header(&zeros));
        assert!(decode_frame(&zeros, 0).is_err());
    }

    #[test]
    fn nonzero_padding_is_rejected_even_with_valid_crc() {
        // Padding is outside the crc, so it is checked separately.
        let mut buf = Vec::new();
        FrameKind::Entry.encode(&mut buf, 1, b"abc", 0);
        let last = buf.len() - 1;
        buf[last] = 1;
        assert_eq!(decode_frame(&buf, 0).unwrap_err(), FrameError::NonZeroPadding);
    }
}
