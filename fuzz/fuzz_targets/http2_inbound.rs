//! Fuzzes what a client sends through `cairn_server::internals::http2::inbound::Inbound`, the layer that
//! rewrites header blocks with an `:authority` h2 would refuse, on frame sequences cut into
//! arbitrary reads.
//!
//! Each input is a list of frames: header blocks a client's HPACK encoder makes (indexing or
//! not, with table size updates, padded, with priority, split into CONTINUATIONs, with
//! authorities valid, invalid and empty), raw HPACK bytes in HEADERS frames, and frames of any
//! type, flags and payload. For every input: nothing panics, and nothing is passed to h2 once
//! the layer says the connection must end. When every frame is well formed, what comes out,
//! read by a fresh HPACK decoder as h2's, is the same header lists in the same order, each
//! without an authority h2 would refuse, and every other frame byte for byte: the layer
//! never falls out of step with h2's decoder.

#![no_main]

use arbitrary::Arbitrary;
use cairn_server::internals::http2::authority::is_valid;
use cairn_server::internals::http2::frame::{frame, Header, PREFACE};
use cairn_server::internals::http2::inbound::{Inbound, MAX_FRAME};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Value {
    Valid,
    Initially,
    Url,
    Empty,
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Name {
    Authority,
    Path,
    Method,
    Other(u8),
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A well formed header block from the client's encoder.
    Block {
        fields: Vec<(Name, Value)>,
        /// The client's encoder sets its table to this size first (up to 4096).
        table_size: Option<u16>,
        pad: Option<u8>,
        priority: bool,
        /// Where the block is cut into CONTINUATIONs.
        cuts: Vec<u16>,
        end_stream: bool,
    },
    /// A HEADERS frame with these bytes as its block: rarely HPACK.
    RawBlock(Vec<u8>),
    /// Any frame.
    Frame {
        kind: u8,
        flags: u8,
        stream: u8,
        payload: Vec<u8>,
    },
    /// DATA on the last stream.
    Data(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Input {
    ops: Vec<Op>,
    /// How the bytes are cut into reads.
    reads: Vec<u16>,
}

fn value(v: &Value) -> Vec<u8> {
    match v {
        Value::Valid => b"127.0.0.1:2379".to_vec(),
        Value::Initially => b"#initially=[http://127.0.0.1:2379;http://127.0.0.1:22379]".to_vec(),
        Value::Url => b"http://127.0.0.1:2379".to_vec(),
        Value::Empty => Vec::new(),
        Value::Bytes(b) => b.clone(),
    }
}

fn name(n: &Name) -> Vec<u8> {
    match n {
        Name::Authority => b":authority".to_vec(),
        Name::Path => b":path".to_vec(),
        Name::Method => b":method".to_vec(),
        Name::Other(i) => format!("x-{}", i % 8).into_bytes(),
    }
}

/// A table size update, HPACK's `001` prefix and a 5-bit integer.
fn size_update(size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = loona_hpack::encoder::encode_integer_into(size, 5, 0x20, &mut out);
    out
}

fuzz_target!(|input: Input| {
    let mut encoder = loona_hpack::Encoder::new();
    let mut reference = loona_hpack::Decoder::new();
    let mut wire = PREFACE.to_vec();
    // What h2 must see: per frame, a header list or the frame's bytes.
    let mut expected: Vec<Result<Vec<(Vec<u8>, Vec<u8>)>, Vec<u8>>> = Vec::new();
    let mut well_formed = true;
    let mut stream = 1u32;
    for op in input.ops.iter().take(64) {
        match op {
            Op::Block {
                fields,
                table_size,
                pad,
                priority,
                cuts,
                end_stream,
            } => {
                let fields: Vec<(Vec<u8>, Vec<u8>)> =
                    fields.iter().take(16).map(|(n, v)| (name(n), value(v))).collect();
                let mut block = Vec::new();
                // A block of a size update alone is refused (loona-hpack: SizeUpdateAtEnd).
                if let Some(size) = table_size.as_ref().filter(|_| !fields.is_empty()) {
                    let size = usize::from(*size).min(4096);
                    encoder.set_max_table_size(size);
                    block.extend(size_update(size));
                }
                block.extend(encoder.encode(fields.iter().map(|(n, v)| (&n[..], &v[..]))));
                let mut want = reference.decode(&block).expect("the encoder's own block");
                want.retain(|(n, v)| n != b":authority" || is_valid(v));
                expected.push(Ok(want));
                let mut cuts: Vec<usize> = cuts
                    .iter()
                    .take(4)
                    .map(|c| usize::from(*c) % (block.len() + 1))
                    .collect();
                cuts.push(block.len());
                cuts.sort_unstable();
                cuts.dedup();
                let mut at = 0;
                for (i, cut) in cuts.iter().enumerate() {
                    let piece = &block[at..*cut];
                    at = *cut;
                    let last = i + 1 == cuts.len();
                    let end_headers = if last { 0x4 } else { 0 };
                    if i == 0 {
                        let mut flags = end_headers | if *end_stream { 0x1 } else { 0 };
                        let mut payload = Vec::new();
                        if let Some(p) = pad {
                            flags |= 0x8;
                            payload.push(*p);
                        }
                        if *priority {
                            flags |= 0x20;
                            payload.extend([0, 0, 0, 0, 16]);
                        }
                        payload.extend_from_slice(piece);
                        payload.extend(std::iter::repeat_n(0, pad.map_or(0, usize::from)));
                        if payload.len() > MAX_FRAME {
                            well_formed = false;
                        }
                        wire.extend(frame(0x1, flags, stream, &payload));
                    } else {
                        if piece.len() > MAX_FRAME {
                            well_formed = false;
                        }
                        wire.extend(frame(0x9, end_headers, stream, piece));
                    }
                }
                stream += 2;
            }
            Op::RawBlock(bytes) => {
                well_formed = false;
                wire.extend(frame(0x1, 0x4, stream, bytes));
                stream += 2;
            }
            Op::Frame {
                kind,
                flags,
                stream: s,
                payload,
            } => {
                if matches!(kind, 0x1 | 0x9) {
                    well_formed = false;
                }
                let f = frame(*kind, *flags, u32::from(*s), payload);
                expected.push(Err(f.clone()));
                wire.extend(f);
            }
            Op::Data(bytes) => {
                let f = frame(0x0, 0, stream.saturating_sub(2).max(1), bytes);
                expected.push(Err(f.clone()));
                wire.extend(f);
            }
        }
    }

    let mut inbound = Inbound::default();
    let mut out = Vec::new();
    let mut at = 0;
    let mut reads = input.reads.iter().map(|r| usize::from(*r) % 4096 + 1);
    while at < wire.len() {
        let n = reads.next().unwrap_or(wire.len()).min(wire.len() - at);
        inbound.push(&wire[at..at + n], |_| {});
        at += n;
        while let Some(bytes) = inbound.pop(1 + at % 1000) {
            assert!(!inbound.broken(), "bytes ready on a connection that must end");
            out.extend_from_slice(&bytes);
        }
    }
    if inbound.broken() || !well_formed {
        return;
    }

    // h2's side: the preface, then frames; header blocks read by a decoder of its own.
    assert_eq!(&out[..PREFACE.len()], PREFACE);
    let mut h2 = loona_hpack::Decoder::new();
    let mut pos = PREFACE.len();
    let mut seen = Vec::new();
    let mut block = Vec::new();
    while pos < out.len() {
        let h = Header::parse(out[pos..pos + 9].try_into().unwrap());
        let end = pos + 9 + h.length as usize;
        let payload = &out[pos + 9..end];
        match h.kind {
            0x1 | 0x9 => {
                let mut p = payload;
                if h.kind == 0x1 {
                    if h.flags & 0x8 != 0 {
                        let pad = usize::from(p[0]);
                        p = &p[1..p.len() - pad];
                    }
                    if h.flags & 0x20 != 0 {
                        p = &p[5..];
                    }
                }
                assert!(h.length as usize <= MAX_FRAME);
                block.extend_from_slice(p);
                if h.flags & 0x4 != 0 {
                    seen.push(Ok(h2.decode(&block).expect("h2 reads every block passed")));
                    block.clear();
                }
            }
            _ => seen.push(Err(out[pos..end].to_vec())),
        }
        pos = end;
    }
    assert_eq!(seen, expected);
});
