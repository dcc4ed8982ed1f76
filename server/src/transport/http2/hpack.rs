//! An HPACK decoder (RFC 7541) for the header blocks a client sends: its dynamic table kept
//! as the client's encoder keeps it, each header handed to a callback as borrowed bytes.
//!
//! Written here rather than taken from a crate because this layer decodes every request of
//! every client, beside h2: the HPACK crates on the registry either build their Huffman
//! tables anew for each string (loona-hpack, hpack: a third of the server's CPU under load)
//! or shift the block at each field and allocate each header (httlib-hpack, quadratic on a
//! hostile block). Huffman strings are decoded by the httlib-huffman crate, whose tables are
//! built once; representations, integers and the tables are below. What it accepts and
//! refuses follows h2's decoder: a size update only before the first field and within the
//! limit, no index 0, integers of at most 5 continuation bytes.

use std::collections::VecDeque;

/// What makes a block unreadable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The block ends inside a representation.
    #[error("the header block ends inside a field")]
    Truncated,
    /// An integer longer than any HPACK uses.
    #[error("an integer too large")]
    Overflow,
    /// An index of no entry.
    #[error("an index of no table entry")]
    Index,
    /// A Huffman string that does not decode.
    #[error("a Huffman string that does not decode")]
    Huffman,
    /// A table size update after a field, or above the limit.
    #[error("a table size update out of place or above the limit")]
    SizeUpdate,
}

/// HPACK's static table (RFC 7541, appendix A): index 1 is the first.
const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// Bytes an entry counts for beyond its name and value (RFC 7541, section 4.1).
const ENTRY_OVERHEAD: usize = 32;

/// A dynamic table entry: a name and a value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// The decoder of one connection's client.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first: index 62 is `dynamic[0]`.
    dynamic: VecDeque<Entry>,
    size: usize,
    /// The table's size, as the client's last size update set it.
    max_size: usize,
    /// The largest size the client may set (SETTINGS_HEADER_TABLE_SIZE).
    allowed: usize,
    /// Huffman strings decoded, reused: a field's name and value.
    name: Vec<u8>,
    value: Vec<u8>,
}

impl Decoder {
    /// A decoder whose client may use a table of up to `allowed` bytes.
    pub fn new(allowed: usize) -> Decoder {
        Decoder {
            dynamic: VecDeque::new(),
            size: 0,
            max_size: allowed,
            allowed,
            name: Vec::new(),
            value: Vec::new(),
        }
    }

    /// Decodes `block`, calling `field(name, value)` for each header in order.
    pub fn decode(&mut self, block: &[u8], mut field: impl FnMut(&[u8], &[u8])) -> Result<(), Error> {
        let mut pos = 0;
        let mut fields_seen = false;
        while let Some(&first) = block.get(pos) {
            if first & 0x80 != 0 {
                let index = integer(block, &mut pos, 7)?;
                let (name, value) = self.entry(index)?;
                field(name, value);
                fields_seen = true;
            } else if first & 0xe0 == 0x20 {
                let size = integer(block, &mut pos, 5)?;
                if fields_seen || size > self.allowed {
                    return Err(Error::SizeUpdate);
                }
                self.max_size = size;
                self.evict(0);
            } else {
                let (prefix, indexing) = match first {
                    f if f & 0xc0 == 0x40 => (6, true),
                    _ => (4, false),
                };
                let name_index = integer(block, &mut pos, prefix)?;
                let mut name = std::mem::take(&mut self.name);
                let mut value = std::mem::take(&mut self.value);
                let read = (|| {
                    let name: &[u8] = if name_index == 0 {
                        string(block, &mut pos, &mut name)?
                    } else {
                        // Copied: inserting below may evict the entry it names.
                        let n = self.entry(name_index)?.0;
                        name.clear();
                        name.extend_from_slice(n);
                        &name
                    };
                    let value = string(block, &mut pos, &mut value)?;
                    field(name, value);
                    if indexing {
                        self.insert(name, value);
                    }
                    Ok(())
                })();
                self.name = name;
                self.value = value;
                read?;
                fields_seen = true;
            }
        }
        Ok(())
    }

    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), Error> {
        match index {
            0 => Err(Error::Index),
            1..=61 => STATIC.get(index - 1).copied().ok_or(Error::Index),
            _ => self
                .dynamic
                .get(index - 62)
                .map(|(n, v)| (&n[..], &v[..]))
                .ok_or(Error::Index),
        }
    }

    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = ENTRY_OVERHEAD + name.len() + value.len();
        if size > self.max_size {
            // An entry larger than the table empties it, and is not added.
            self.dynamic.clear();
            self.size = 0;
            return;
        }
        self.evict(size);
        self.dynamic.push_front((name.into(), value.into()));
        self.size += size;
    }

    /// Evicts the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            let Some((n, v)) = self.dynamic.pop_back() else {
                self.size = 0;
                return;
            };
            self.size -= ENTRY_OVERHEAD + n.len() + v.len();
        }
    }
}

/// An integer with an `n`-bit prefix at `block[*pos]` (RFC 7541, section 5.1), moving `pos`
/// past it.
fn integer(block: &[u8], pos: &mut usize, n: u32) -> Result<usize, Error> {
    let mask = (1usize << n) - 1;
    let first = usize::from(*block.get(*pos).ok_or(Error::Truncated)?);
    *pos += 1;
    let mut value = first & mask;
    if value < mask {
        return Ok(value);
    }
    // h2 takes at most 5 continuation bytes: 2^28 and more is no size or index here.
    for shift in (0..35).step_by(7) {
        let byte = usize::from(*block.get(*pos).ok_or(Error::Truncated)?);
        *pos += 1;
        value += (byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(Error::Overflow)
}

/// Writes `value` as an integer with an `n`-bit prefix, the byte's other bits `high`.
pub fn encode_integer(out: &mut Vec<u8>, value: usize, n: u32, high: u8) {
    let mask = (1usize << n) - 1;
    if value < mask {
        out.push(high | value as u8);
        return;
    }
    out.push(high | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// A string literal at `block[*pos]` (section 5.2), moving `pos` past it: borrowed from the
/// block, or Huffman-decoded into `scratch`.
fn string<'a>(block: &'a [u8], pos: &mut usize, scratch: &'a mut Vec<u8>) -> Result<&'a [u8], Error> {
    let huffman = block.get(*pos).ok_or(Error::Truncated)? & 0x80 != 0;
    let len = integer(block, pos, 7)?;
    let end = pos.checked_add(len).ok_or(Error::Truncated)?;
    let raw = block.get(*pos..end).ok_or(Error::Truncated)?;
    *pos = end;
    if !huffman {
        return Ok(raw);
    }
    scratch.clear();
    httlib_huffman::decode(raw, scratch, httlib_huffman::DecoderSpeed::FourBits).map_err(|_| Error::Huffman)?;
    Ok(scratch)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    fn decode_all(d: &mut Decoder, block: &[u8]) -> Result<Fields, Error> {
        let mut out = Vec::new();
        d.decode(block, |n, v| out.push((n.to_vec(), v.to_vec())))?;
        Ok(out)
    }

    #[test]
    fn the_rfcs_examples_with_huffman_decode_across_three_requests() {
        // RFC 7541, C.4: three requests, Huffman-coded, sharing a dynamic table.
        let blocks = [
            &[
                0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
            ][..],
            &[0x82, 0x86, 0x84, 0xbe, 0x58, 0x86, 0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf][..],
            &[
                0x82, 0x87, 0x85, 0xbf, 0x40, 0x88, 0x25, 0xa8, 0x49, 0xe9, 0x5b, 0xa9, 0x7d, 0x7f, 0x89, 0x25, 0xa8,
                0x49, 0xe9, 0x5b, 0xb8, 0xe8, 0xb4, 0xbf,
            ][..],
        ];
        let mut d = Decoder::new(4096);
        let third: Fields = blocks.iter().map(|b| decode_all(&mut d, b).unwrap()).last().unwrap();
        let expected: Fields = [
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ]
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
        assert_eq!(third, expected);
        assert_eq!(d.size, 164, "the table's size after C.4.3");
    }

    #[test]
    fn it_reads_what_an_indexing_encoder_writes_as_another_decoder_does() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut reference = loona_hpack::Decoder::new();
        let mut d = Decoder::new(4096);
        for i in 0..200 {
            let value = format!("value-{}", i % 37).repeat(i % 5 + 1);
            let headers = [
                (&b":authority"[..], value.as_bytes()),
                (b"x-a", b"b"),
                (b":path", b"/p"),
            ];
            let block = encoder.encode(headers);
            assert_eq!(
                decode_all(&mut d, &block).unwrap(),
                reference.decode(&block).unwrap(),
                "block {i}"
            );
        }
    }

    #[test]
    fn integers_are_written_as_they_are_read() {
        for n in [4, 5, 6, 7] {
            for value in [0, 1, 14, 15, 16, 30, 31, 62, 63, 126, 127, 128, 1337, 4096, 1 << 20] {
                let mut out = Vec::new();
                encode_integer(&mut out, value, n, 0);
                let mut pos = 0;
                assert_eq!(integer(&out, &mut pos, n), Ok(value));
                assert_eq!(pos, out.len());
            }
        }
    }

    #[test]
    fn malformed_blocks_are_errors() {
        let mut d = Decoder::new(4096);
        assert_eq!(decode_all(&mut d, &[0x80]), Err(Error::Index));
        assert_eq!(decode_all(&mut d, &[0xbe]), Err(Error::Index), "an empty dynamic table");
        assert_eq!(decode_all(&mut d, &[0x40, 0x05, b'a']), Err(Error::Truncated));
        assert_eq!(
            decode_all(&mut d, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
            Err(Error::Overflow)
        );
        assert_eq!(
            decode_all(&mut d, &[0x82, 0x20]),
            Err(Error::SizeUpdate),
            "after a field"
        );
        assert_eq!(
            decode_all(&mut d, &[0x3f, 0xe2, 0x1f]),
            Err(Error::SizeUpdate),
            "4097 > 4096"
        );
        assert_eq!(
            decode_all(&mut d, &[0x00, 0x81, 0xff, 0x00]),
            Err(Error::Huffman),
            "EOS padding too long"
        );
    }

    #[test]
    fn a_size_update_evicts_and_an_entry_too_large_empties_the_table() {
        let mut d = Decoder::new(4096);
        decode_all(&mut d, &[0x40, 0x01, b'a', 0x01, b'b']).unwrap();
        assert_eq!(d.size, 34);
        decode_all(&mut d, &[0x20]).unwrap();
        assert_eq!((d.size, d.dynamic.len()), (0, 0));
        decode_all(&mut d, &[0x3f, 0x0b]).unwrap();
        assert_eq!(d.max_size, 42);
        decode_all(&mut d, &[0x40, 0x01, b'a', 0x01, b'b']).unwrap();
        decode_all(
            &mut d,
            &[
                0x40, 0x02, b'a', b'b', 0x09, b'c', b'c', b'c', b'c', b'c', b'c', b'c', b'c', b'c',
            ],
        )
        .unwrap();
        assert_eq!((d.size, d.dynamic.len()), (0, 0), "43 bytes in a table of 42");
    }
}
