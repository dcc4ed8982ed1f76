//! Fuzzes `decode_frame`, the first thing recovery runs on bytes read back from a segment.
//!
//! Input: a crc seed and arbitrary bytes, or a valid frame encoded from arbitrary fields and
//! then edited (without it the fuzzer rarely gets a frame past its crc and type checks at
//! once). The decoder must never panic, and a frame it accepts must be canonical: it occupies
//! a multiple of 8 bytes within the buffer, and encoding the decoded fields again with the same
//! seed gives back exactly the bytes it was decoded from (so there is one encoding per record,
//! and the reserved bytes and padding are really zero). An unedited frame decodes to what was
//! encoded.

#![no_main]

use arbitrary::Arbitrary;
use cairn_wal::{decode_frame, framed_len, FrameError, FrameKind, FRAME_ALIGN, FRAME_HEADER_LEN};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Input<'a> {
    Raw {
        seed: u32,
        data: &'a [u8],
    },
    Edited {
        seed: u32,
        kind: u8,
        index: u64,
        payload: &'a [u8],
        /// (offset, xor) pairs applied to the encoded frame.
        edits: Vec<(u16, u8)>,
        /// Bytes after the frame: the next frame, or garbage.
        after: &'a [u8],
    },
}

fn kind(b: u8) -> FrameKind {
    match b % 4 {
        0 => FrameKind::Entry,
        1 => FrameKind::State,
        2 => FrameKind::Truncate,
        _ => FrameKind::CarriedState,
    }
}

fn check(data: &[u8], seed: u32) {
    match decode_frame(data, seed) {
        Ok((frame, used)) => {
            assert!(used <= data.len(), "used {used} > buffer {}", data.len());
            assert_eq!(used % FRAME_ALIGN, 0, "frame length {used} is not aligned");
            assert!(
                used >= FRAME_HEADER_LEN,
                "frame of {used} bytes is shorter than its header"
            );
            assert_eq!(
                used,
                framed_len(frame.payload.len()),
                "used does not match the payload length"
            );

            let mut buf = Vec::with_capacity(used);
            let crc = frame.kind.encode(&mut buf, frame.index, frame.payload, seed);
            assert_eq!(crc, frame.crc, "re-encoding gives a different crc");
            assert_eq!(&buf[..], &data[..used], "re-encoding gives different bytes");

            // What follows the frame does not change how it decodes.
            let alone = decode_frame(&data[..used], seed);
            assert_eq!(alone, Ok((frame, used)), "decoding depends on bytes after the frame");
        }
        Err(FrameError::Truncated { needed, available }) => {
            assert_eq!(available, data.len() as u64, "`available` is not the buffer length");
            assert!(
                needed > available,
                "truncated, yet {needed} needed <= {available} available"
            );
        }
        Err(_) => {}
    }
}

fuzz_target!(|input: Input<'_>| {
    match input {
        Input::Raw { seed, data } => check(data, seed),
        Input::Edited {
            seed,
            kind: k,
            index,
            payload,
            edits,
            after,
        } => {
            let mut data = Vec::new();
            let crc = kind(k).encode(&mut data, index, payload, seed);
            let len = data.len();
            if edits.is_empty() {
                let decoded = decode_frame(&data, seed).map(|(f, used)| (f.kind, f.index, f.payload, f.crc, used));
                assert_eq!(
                    decoded,
                    Ok((kind(k), index, payload, crc, len)),
                    "an encoded frame does not decode to its fields"
                );
            }
            for (at, xor) in edits.iter().take(8) {
                if let Some(b) = data.get_mut(usize::from(*at) % len) {
                    *b ^= *xor;
                }
            }
            data.extend_from_slice(after);
            check(&data, seed);
        }
    }
});
