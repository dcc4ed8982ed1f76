//! What the client sends, frame by frame, on its way to hyper: every frame passes as it came,
//! but header blocks, which are gathered whole (a HEADERS frame and its CONTINUATIONs) and
//! read by [`Authorities`], and rewritten when it says so. No I/O here: bytes go in with
//! [`Inbound::push`], come out with [`Inbound::pop`], and each frame's header is shown to
//! the caller as it is taken (for the ping policy).
//!
//! Frames other than header blocks are passed on as their bytes arrive, without waiting for
//! the whole frame. What breaks HTTP/2's rules around header blocks (another frame between a
//! HEADERS and its CONTINUATION, a frame larger than h2 accepts, a block larger than
//! [`MAX_BLOCK`], a block the decoder cannot read) is h2's to answer: while blocks pass
//! unchanged the layer stops reading them and passes everything on as it came; once they
//! are rewritten it ends the connection instead ([`Inbound::broken`]), since h2 could no
//! longer be kept in step.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use super::authority::{Authorities, Block};
use super::frame::{kind, Header, HEADER_LEN, PREFACE};

/// The largest frame h2 accepts (HTTP/2's default SETTINGS_MAX_FRAME_SIZE, which hyper's
/// server keeps), and so the largest this layer sends.
pub const MAX_FRAME: usize = 16_384;
/// The largest header block gathered, compressed. h2 refuses a header list over 16 KiB
/// (hyper's default), and HPACK rarely shrinks headers by more than half.
pub const MAX_BLOCK: usize = 256 * 1024;

/// Room made for each read from the client.
const RECEIVE: usize = 16 * 1024;

/// On HEADERS and CONTINUATION: the block's last frame.
const END_HEADERS: u8 = 0x4;
/// On HEADERS: a pad length byte first, padding last.
const PADDED: u8 = 0x8;
/// On HEADERS: a stream dependency and weight (5 bytes) before the fragment.
const PRIORITY: u8 = 0x20;
/// On HEADERS: the stream's last frame from the client.
const END_STREAM: u8 = 0x1;
/// Frame type of a header block's later frames.
const CONTINUATION: u8 = 0x9;

/// A header block being gathered.
#[derive(Debug)]
struct Gathering {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The block's frames as they came.
    frames: Vec<Bytes>,
    size: usize,
}

/// The client's side of one connection.
#[derive(Debug)]
pub struct Inbound {
    /// Bytes received and not yet looked at.
    raw: BytesMut,
    /// Bytes for hyper, in order.
    ready: VecDeque<Bytes>,
    /// Bytes to pass on unread before the next frame header: the rest of the preface, then of
    /// the payload of the frame being passed on.
    passing: usize,
    gathering: Option<Gathering>,
    /// `None` once header blocks are passed unread.
    authorities: Option<Authorities>,
    broken: bool,
}

impl Default for Inbound {
    fn default() -> Self {
        Inbound {
            raw: BytesMut::new(),
            ready: VecDeque::new(),
            passing: PREFACE.len(),
            gathering: None,
            authorities: Some(Authorities::default()),
            broken: false,
        }
    }
}

impl Inbound {
    /// Takes bytes the client sent, from its first (the preface, which the caller has
    /// matched, and which is passed on too), and shows `on_frame` each frame header taken.
    #[cfg(any(test, feature = "internals"))]
    pub fn push(&mut self, bytes: &[u8], on_frame: impl FnMut(Header)) {
        self.raw.extend_from_slice(bytes);
        self.process(on_frame);
    }

    /// Where bytes from the client are read to, before [`Inbound::process`].
    pub fn receive_buffer(&mut self) -> &mut BytesMut {
        self.raw.reserve(RECEIVE);
        &mut self.raw
    }

    /// What was received and not yet processed.
    pub fn unread(&self) -> &[u8] {
        &self.raw
    }

    /// Everything received and not yet processed, taken away.
    pub fn take_unread(&mut self) -> Bytes {
        self.raw.split().freeze()
    }

    /// Bytes for hyper, up to `max`; `None` when there are none yet.
    pub fn pop(&mut self, max: usize) -> Option<Bytes> {
        let front = self.ready.front_mut()?;
        if front.len() > max {
            return Some(front.split_to(max));
        }
        self.ready.pop_front()
    }

    /// Whether nothing is ready for hyper.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_empty(&self) -> bool {
        self.ready.is_empty()
    }

    /// Whether the connection must end: the client broke HTTP/2's rules after its blocks
    /// began to be rewritten. Nothing more is ready then.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Takes what was received since, and shows `on_frame` each frame header taken.
    pub fn process(&mut self, mut on_frame: impl FnMut(Header)) {
        loop {
            if self.broken {
                return;
            }
            if self.passing > 0 {
                let n = self.passing.min(self.raw.len());
                if n == 0 {
                    return;
                }
                self.ready.push_back(self.raw.split_to(n).freeze());
                self.passing -= n;
                continue;
            }
            let Some(head) = self
                .raw
                .get(..HEADER_LEN)
                .and_then(|h| <&[u8; HEADER_LEN]>::try_from(h).ok())
            else {
                return;
            };
            let h = Header::parse(head);
            let in_block = h.kind == kind::HEADERS || h.kind == CONTINUATION;
            if self.authorities.is_none() || !in_block {
                if self.gathering.is_some() {
                    // Another frame inside a header block: h2's PROTOCOL_ERROR.
                    self.give_up();
                    continue;
                }
                on_frame(h);
                self.ready.push_back(self.raw.split_to(HEADER_LEN).freeze());
                self.passing = h.length as usize;
                continue;
            }
            let length = h.length as usize;
            if length > MAX_FRAME {
                self.give_up();
                continue;
            }
            if self.raw.len() < HEADER_LEN + length {
                self.raw.reserve(HEADER_LEN + length - self.raw.len());
                return;
            }
            on_frame(h);
            let frame = self.raw.split_to(HEADER_LEN + length).freeze();
            self.block_frame(h, frame);
        }
    }

    /// A HEADERS or CONTINUATION frame, whole.
    fn block_frame(&mut self, h: Header, frame: Bytes) {
        let payload = frame.get(HEADER_LEN..).unwrap_or_default();
        if h.kind == kind::HEADERS {
            if self.gathering.is_some() {
                self.give_up();
                self.pass(frame);
                return;
            }
            let Some((priority, fragment)) = headers_payload(h.flags, payload) else {
                self.give_up();
                self.pass(frame);
                return;
            };
            self.gathering = Some(Gathering {
                stream: h.stream,
                end_stream: h.flags & END_STREAM != 0,
                priority,
                fragment: fragment.to_vec(),
                size: frame.len(),
                frames: vec![frame],
            });
        } else {
            match &mut self.gathering {
                Some(g) if g.stream == h.stream && g.size + frame.len() <= MAX_BLOCK => {
                    g.fragment.extend_from_slice(payload);
                    g.size += frame.len();
                    g.frames.push(frame);
                }
                _ => {
                    // A CONTINUATION out of place, or a block too large.
                    self.give_up();
                    self.pass(frame);
                    return;
                }
            }
        }
        if h.flags & END_HEADERS == 0 {
            return;
        }
        let Some(g) = self.gathering.take() else {
            return;
        };
        let read = self.authorities.as_mut().map(|a| a.block(&g.fragment));
        match read {
            Some(Ok(Block::Rewritten(block))) => self.send_block(&g, &block),
            Some(Ok(Block::Unchanged)) | None => self.ready.extend(g.frames),
            Some(Err(e)) => {
                tracing::debug!(error = %e, "a client's header block could not be read");
                self.gathering = Some(g);
                self.give_up();
            }
        }
    }

    /// Sends `block` for the gathered one, as a HEADERS frame and as many CONTINUATIONs as
    /// it needs, with the original's stream, end of stream and priority, without padding.
    fn send_block(&mut self, g: &Gathering, block: &[u8]) {
        let mut out = BytesMut::with_capacity(block.len() + 5 + HEADER_LEN * (1 + block.len() / MAX_FRAME));
        let first_room = MAX_FRAME - if g.priority.is_some() { 5 } else { 0 };
        let (first, mut rest) = block.split_at(first_room.min(block.len()));
        let mut flags = if g.end_stream { END_STREAM } else { 0 };
        if g.priority.is_some() {
            flags |= PRIORITY;
        }
        if rest.is_empty() {
            flags |= END_HEADERS;
        }
        let priority = g.priority.as_ref().map_or(&[][..], |p| &p[..]);
        let header = Header {
            length: (priority.len() + first.len()) as u32,
            kind: kind::HEADERS,
            flags,
            stream: g.stream,
        };
        out.extend_from_slice(&header.encode());
        out.extend_from_slice(priority);
        out.extend_from_slice(first);
        while !rest.is_empty() {
            let (chunk, after) = rest.split_at(MAX_FRAME.min(rest.len()));
            rest = after;
            let header = Header {
                length: chunk.len() as u32,
                kind: CONTINUATION,
                flags: if rest.is_empty() { END_HEADERS } else { 0 },
                stream: g.stream,
            };
            out.extend_from_slice(&header.encode());
            out.extend_from_slice(chunk);
        }
        self.ready.push_back(out.freeze());
    }

    /// `frame` for hyper as it came, unless the connection is to end.
    fn pass(&mut self, frame: Bytes) {
        if !self.broken {
            self.ready.push_back(frame);
        }
    }

    /// The client broke a rule around header blocks: h2 answers it. While blocks pass
    /// unchanged, whatever was gathered goes on as it came and blocks are no longer read;
    /// once they are rewritten, the connection must end.
    fn give_up(&mut self) {
        if self.authorities.as_ref().is_some_and(Authorities::rewriting) {
            self.broken = true;
            self.ready.clear();
            return;
        }
        self.authorities = None;
        if let Some(g) = self.gathering.take() {
            self.ready.extend(g.frames);
        }
    }
}

/// A HEADERS frame's priority fields and block fragment, without its padding; `None` when
/// the lengths do not fit (h2's PROTOCOL_ERROR).
fn headers_payload(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let mut rest = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        let (&n, after) = rest.split_first()?;
        pad = usize::from(n);
        rest = after;
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        let (p, after) = rest.split_at_checked(5)?;
        priority = Some(<[u8; 5]>::try_from(p).ok()?);
        rest = after;
    }
    let fragment = rest.get(..rest.len().checked_sub(pad)?)?;
    Some((priority, fragment))
}

#[cfg(test)]
mod tests {
    use super::super::frame::frame;
    use super::*;

    fn block(authority: &str) -> Vec<u8> {
        let mut e = loona_hpack::Encoder::new();
        e.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":path", b"/p"),
            (b":authority", authority.as_bytes()),
        ])
    }

    /// Everything ready for hyper, one byte asked at a time or all at once.
    fn drain(i: &mut Inbound) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(b) = i.pop(7) {
            out.extend_from_slice(&b);
        }
        out
    }

    fn after_preface() -> Inbound {
        let mut i = Inbound::default();
        i.push(PREFACE, |_| {});
        assert_eq!(drain(&mut i), PREFACE);
        i
    }

    #[test]
    fn frames_pass_as_they_came_however_the_bytes_arrive() {
        let mut stream = frame(kind::HEADERS, END_HEADERS | PADDED, 1, &{
            let mut p = vec![3];
            p.extend(block("127.0.0.1:2379"));
            p.extend([0, 0, 0]);
            p
        });
        stream.extend(frame(kind::DATA, END_STREAM, 1, &[1, 2, 3, 4, 5]));
        stream.extend(frame(kind::PING, 0, 0, &[9; 8]));
        for cut in 0..stream.len() {
            let mut i = after_preface();
            let mut kinds = Vec::new();
            i.push(&stream[..cut], |h| kinds.push(h.kind));
            let mut out = drain(&mut i);
            i.push(&stream[cut..], |h| kinds.push(h.kind));
            out.extend(drain(&mut i));
            assert_eq!(out, stream, "cut at {cut}");
            assert_eq!(kinds, [kind::HEADERS, kind::DATA, kind::PING]);
        }
    }

    #[test]
    fn a_block_with_an_invalid_authority_is_rewritten_with_its_stream_priority_and_end() {
        let mut i = after_preface();
        let b = block("#initially=[http://a:1]");
        let (one, two) = b.split_at(4);
        let mut payload = vec![0x80, 0, 0, 3, 16];
        payload.extend_from_slice(one);
        let mut sent = frame(kind::HEADERS, PRIORITY | END_STREAM, 5, &payload);
        sent.extend(frame(CONTINUATION, END_HEADERS, 5, two));
        i.push(&sent, |_| {});
        let out = drain(&mut i);
        let h = Header::parse(out[..9].try_into().unwrap());
        assert_eq!((h.kind, h.stream), (kind::HEADERS, 5));
        assert_eq!(h.flags, PRIORITY | END_STREAM | END_HEADERS);
        assert_eq!(&out[9..14], &[0x80, 0, 0, 3, 16]);
        assert_eq!(out.len(), 9 + h.length as usize);
        let headers = loona_hpack::Decoder::new().decode(&out[14..]).unwrap();
        let names: Vec<&[u8]> = headers.iter().map(|(n, _)| &n[..]).collect();
        assert_eq!(names, [&b":method"[..], b":path"]);
    }

    #[test]
    fn a_frame_between_headers_and_continuation_passes_everything_on_unread() {
        let mut i = after_preface();
        let b = block("127.0.0.1:1");
        let mut sent = frame(kind::HEADERS, 0, 1, &b[..3]);
        sent.extend(frame(kind::PING, 0, 0, &[0; 8]));
        sent.extend(frame(CONTINUATION, END_HEADERS, 1, &b[3..]));
        i.push(&sent, |_| {});
        assert_eq!(drain(&mut i), sent);
        assert!(!i.broken());
    }

    #[test]
    fn once_rewriting_a_broken_rule_ends_the_connection() {
        let mut i = after_preface();
        i.push(&frame(kind::HEADERS, END_HEADERS, 1, &block("")), |_| {});
        drain(&mut i);
        i.push(&frame(CONTINUATION, END_HEADERS, 1, &[0x82]), |_| {});
        assert!(i.broken());
        assert!(i.pop(100).is_none());
    }

    #[test]
    fn a_rewritten_block_larger_than_a_frame_is_split_into_continuations() {
        let mut i = after_preface();
        let mut e = loona_hpack::Encoder::new();
        let big = vec![b'x'; 40_000];
        let b = e.encode([(&b":authority"[..], &b""[..]), (b"x-big", &big[..])]);
        let mut sent = Vec::new();
        let chunks: Vec<&[u8]> = b.chunks(MAX_FRAME).collect();
        for (n, c) in chunks.iter().enumerate() {
            let kind = if n == 0 { kind::HEADERS } else { CONTINUATION };
            let flags = if n + 1 == chunks.len() { END_HEADERS } else { 0 };
            sent.extend(frame(kind, flags, 3, c));
        }
        i.push(&sent, |_| {});
        let out = drain(&mut i);
        let mut at = 0;
        let mut fragment = Vec::new();
        let mut kinds = Vec::new();
        while at < out.len() {
            let h = Header::parse(out[at..at + 9].try_into().unwrap());
            assert!(h.length as usize <= MAX_FRAME);
            kinds.push((h.kind, h.flags & END_HEADERS != 0));
            fragment.extend_from_slice(&out[at + 9..at + 9 + h.length as usize]);
            at += 9 + h.length as usize;
        }
        assert_eq!(
            kinds,
            [(kind::HEADERS, false), (CONTINUATION, false), (CONTINUATION, true)]
        );
        let headers = loona_hpack::Decoder::new().decode(&fragment).unwrap();
        assert_eq!(headers, [(b"x-big".to_vec(), big)]);
    }
}
