//! HTTP/2's framing (RFC 9113, section 4): the connection preface, the 9-byte frame header,
//! and a byte stream cut into frames however it arrives.

/// What a client sends first on an HTTP/2 connection.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Bytes in a frame's header.
pub const HEADER_LEN: usize = 9;

/// Frame types this layer looks at.
pub mod kind {
    /// A stream's message bytes.
    pub const DATA: u8 = 0x0;
    /// A header block; from a client, on a new stream, it opens the stream.
    pub const HEADERS: u8 = 0x1;
    /// A stream ended at once, by either side.
    pub const RST_STREAM: u8 = 0x3;
    /// A ping, or its answer.
    pub const PING: u8 = 0x6;
    /// The connection is ending.
    pub const GOAWAY: u8 = 0x7;
}

/// On DATA and HEADERS: the sender's last frame on the stream.
pub const END_STREAM: u8 = 0x1;
/// On PING: an answer, not a question.
pub const ACK: u8 = 0x1;

/// GOAWAY's code for a peer that behaves too eagerly (RFC 9113, section 7).
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// A frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Bytes of payload after the header (24 bits).
    pub length: u32,
    /// The frame's type ([`kind`]).
    pub kind: u8,
    /// Flags, whose meaning depends on the type.
    pub flags: u8,
    /// The stream, 0 for the connection (31 bits; the reserved bit is dropped).
    pub stream: u32,
}

impl Header {
    /// The header in its 9 bytes.
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        let [l0, l1, l2, kind, flags, s0, s1, s2, s3] = *b;
        Header {
            length: u32::from_be_bytes([0, l0, l1, l2]),
            kind,
            flags,
            stream: u32::from_be_bytes([s0, s1, s2, s3]) & 0x7fff_ffff,
        }
    }

    /// The header's 9 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let [_, l0, l1, l2] = self.length.to_be_bytes();
        let [s0, s1, s2, s3] = self.stream.to_be_bytes();
        [l0, l1, l2, self.kind, self.flags, s0, s1, s2, s3]
    }
}

/// A whole frame: its header, then `payload`.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let header = Header {
        length: payload.len() as u32,
        kind,
        flags,
        stream,
    };
    let mut frame = header.encode().to_vec();
    frame.extend_from_slice(payload);
    frame
}

/// A GOAWAY frame: the last stream the sender will have processed, an error code, and
/// debug data.
pub fn goaway(last_stream: u32, code: u32, debug: &[u8]) -> Vec<u8> {
    let mut payload = (last_stream & 0x7fff_ffff).to_be_bytes().to_vec();
    payload.extend_from_slice(&code.to_be_bytes());
    payload.extend_from_slice(debug);
    frame(kind::GOAWAY, 0, 0, &payload)
}

/// Finds the frame headers in a stream of frames that arrives cut anywhere.
#[derive(Debug, Default)]
pub struct Splitter {
    /// The next header's bytes seen so far.
    header: [u8; HEADER_LEN],
    have: usize,
    /// Payload bytes of the current frame still to come.
    remaining: u32,
}

impl Splitter {
    /// Takes the stream's next `bytes`, and calls `on_header` with each frame header
    /// completed in them.
    pub fn take(&mut self, mut bytes: &[u8], mut on_header: impl FnMut(Header)) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let n = bytes.len().min(self.remaining as usize);
                self.remaining -= n as u32;
                bytes = bytes.get(n..).unwrap_or_default();
                continue;
            }
            let n = (HEADER_LEN - self.have).min(bytes.len());
            if let (Some(to), Some(from)) = (self.header.get_mut(self.have..self.have + n), bytes.get(..n)) {
                to.copy_from_slice(from);
            }
            self.have += n;
            bytes = bytes.get(n..).unwrap_or_default();
            if self.have == HEADER_LEN {
                self.have = 0;
                let header = Header::parse(&self.header);
                self.remaining = header.length;
                on_header(header);
            }
        }
    }

    /// How many bytes may pass before the stream is between frames: 0 when it is; while a
    /// header is partly seen, the rest of the header (its payload's length is not known yet).
    pub fn to_boundary(&self) -> usize {
        if self.have > 0 {
            HEADER_LEN - self.have
        } else {
            self.remaining as usize
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_is_read_as_written_and_the_reserved_bit_is_dropped() {
        let h = Header {
            length: 0x01_02_03,
            kind: kind::HEADERS,
            flags: END_STREAM,
            stream: 0x7fff_fffd,
        };
        assert_eq!(Header::parse(&h.encode()), h);
        let mut raw = h.encode();
        raw[5] |= 0x80;
        assert_eq!(Header::parse(&raw).stream, 0x7fff_fffd);
    }

    #[test]
    fn frames_are_found_however_the_stream_is_cut() {
        let mut stream = Vec::new();
        let headers = [
            Header {
                length: 3,
                kind: kind::DATA,
                flags: 0,
                stream: 1,
            },
            Header {
                length: 0,
                kind: kind::PING,
                flags: ACK,
                stream: 0,
            },
            Header {
                length: 10,
                kind: kind::HEADERS,
                flags: END_STREAM,
                stream: 3,
            },
        ];
        for h in headers {
            stream.extend_from_slice(&h.encode());
            stream.extend(std::iter::repeat_n(0xaa, h.length as usize));
        }
        for cut in 0..=stream.len() {
            let mut s = Splitter::default();
            let mut seen = Vec::new();
            let (a, b) = stream.split_at(cut);
            s.take(a, |h| seen.push(h));
            s.take(b, |h| seen.push(h));
            assert_eq!(seen, headers, "cut at {cut}");
            assert_eq!(s.to_boundary(), 0);
        }
        let mut s = Splitter::default();
        let mut boundaries = Vec::new();
        for byte in &stream {
            s.take(std::slice::from_ref(byte), |_| {});
            boundaries.push(s.to_boundary());
        }
        // After the first header's fourth byte, five more complete it; after it, its payload.
        assert_eq!(boundaries[3], 5);
        assert_eq!(boundaries[8], 3);
        assert_eq!(boundaries[11], 0);
    }

    #[test]
    fn a_goaway_carries_its_stream_code_and_debug_data() {
        let f = goaway(7, ENHANCE_YOUR_CALM, b"too_many_pings");
        let h = Header::parse(f[..HEADER_LEN].try_into().unwrap());
        assert_eq!((h.kind, h.stream, h.length), (kind::GOAWAY, 0, 22));
        assert_eq!(&f[9..13], &7u32.to_be_bytes());
        assert_eq!(&f[13..17], &11u32.to_be_bytes());
        assert_eq!(&f[17..], b"too_many_pings");
    }
}
