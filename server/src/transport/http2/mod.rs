//! A client connection's HTTP/2 frames, watched between the socket (or its TLS session) and
//! hyper, for what Go's HTTP/2 server and grpc-go do that hyper and h2 do not:
//!
//! - any `:authority` is accepted (`authority`; h2 resets a request whose authority is not a
//!   URI authority, and etcd's clients send such ones);
//! - the client's ping policy is enforced (`pings`, etcd's `--grpc-keepalive-min-time`).
//!
//! [`Watched`] reads the frames' headers as the bytes pass, both ways. What the client sends
//! goes through [`inbound::Inbound`], which passes every frame on as it came except header
//! blocks it must rewrite; what hyper sends is never changed. A connection that does not open
//! with HTTP/2's preface (HTTP/1.1) is passed through unwatched. When the client has pinged
//! too often, the layer writes its own GOAWAY between two of hyper's frames, never inside one,
//! then ends the connection: hyper's reads see the end of the stream and its writes fail.
//!
//! Why here and not in h2: h2 has no option for it, and its maintainers declined one (h2
//! #525); hyper and tonic hand the connection to h2 before any layer of theirs sees a request.
//! Below h2, the one thing that must hold is that h2's HPACK decoder and the client's encoder
//! stay in step, which `authority` explains.

pub mod authority;
pub mod frame;
pub mod hpack;
pub mod inbound;
pub mod pings;

use std::collections::HashSet;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use frame::{kind, Header, Splitter, ACK, END_STREAM, ENHANCE_YOUR_CALM, PREFACE};
use inbound::Inbound;
use pings::{PingPolicy, Verdict, TOO_MANY_PINGS};

/// Where the connection is.
#[derive(Debug)]
enum State {
    /// The client's first bytes, if any, match HTTP/2's preface so far.
    Preface,
    /// HTTP/2, watched.
    Frames,
    /// Not HTTP/2, or not watched: passed through.
    Other,
    /// A GOAWAY to write, and how much of it is written.
    GoingAway(Vec<u8>, usize),
    /// The GOAWAY is written; flushing it.
    Flushing,
    /// Ended.
    Closed,
}

/// A client connection with its HTTP/2 frames watched.
#[derive(Debug)]
pub struct Watched<IO> {
    io: IO,
    state: State,
    inbound: Inbound,
    /// What the client sent before it was known not to speak HTTP/2, for hyper first.
    plain: Bytes,
    outbound: Splitter,
    /// Streams the client opened that are not yet ended by the server or reset.
    open: HashSet<u32>,
    /// The highest stream the client opened.
    last_stream: u32,
    /// `None`: the client's pings are not policed, and nothing is watched.
    pings: Option<PingPolicy>,
    /// Frame headers the client sent, taken from `inbound`, kept for their allocation.
    seen: Vec<Header>,
    /// What hyper wrote while the client's preface was still coming (nothing, from hyper's
    /// server, which reads the preface first), for the outbound count once it is HTTP/2.
    early: Vec<u8>,
}

/// Bytes written before the preface is read that are kept for the count; more, and the
/// connection is not watched.
const EARLY_LIMIT: usize = 64 * 1024;

impl<IO> Watched<IO> {
    /// A client's connection `io`, watched, with its pings policed by `pings`; `None` for a
    /// connection passed through untouched (the peers').
    pub fn new(io: IO, pings: Option<PingPolicy>) -> Watched<IO> {
        Watched {
            io,
            state: if pings.is_some() { State::Preface } else { State::Other },
            inbound: Inbound::default(),
            plain: Bytes::new(),
            outbound: Splitter::default(),
            open: HashSet::new(),
            last_stream: 0,
            pings,
            seen: Vec::new(),
            early: Vec::new(),
        }
    }

    /// Looks at what the client sent, just received.
    fn received(&mut self) {
        if let State::Preface = self.state {
            let got = self.inbound.unread();
            let n = got.len().min(PREFACE.len());
            if got.get(..n) != PREFACE.get(..n) {
                self.state = State::Other;
                self.plain = self.inbound.take_unread();
                return;
            }
            if n < PREFACE.len() {
                return;
            }
            self.state = State::Frames;
            let early = std::mem::take(&mut self.early);
            self.sent(&early);
        }
        if !matches!(self.state, State::Frames) {
            return;
        }
        let mut seen = std::mem::take(&mut self.seen);
        self.inbound.process(|h| seen.push(h));
        for h in seen.drain(..) {
            self.client_frame(h);
        }
        self.seen = seen;
    }

    fn client_frame(&mut self, h: Header) {
        match h.kind {
            kind::HEADERS if h.stream % 2 == 1 && h.stream > self.last_stream => {
                self.last_stream = h.stream;
                self.open.insert(h.stream);
            }
            kind::RST_STREAM => {
                self.open.remove(&h.stream);
            }
            kind::PING if h.flags & ACK == 0 && matches!(self.state, State::Frames) => {
                let open = self.open.len();
                let verdict = self.pings.as_mut().map(|p| p.ping(Instant::now(), open));
                if verdict == Some(Verdict::TooManyPings) {
                    tracing::warn!(
                        "a client pinged more often than --grpc-keepalive-min-time allows: closing its connection (GOAWAY too_many_pings)"
                    );
                    let goaway = frame::goaway(self.last_stream, ENHANCE_YOUR_CALM, TOO_MANY_PINGS);
                    self.state = State::GoingAway(goaway, 0);
                }
            }
            _ => {}
        }
    }

    /// Takes bytes hyper sent.
    fn sent(&mut self, bytes: &[u8]) {
        if let State::Preface = self.state {
            if self.early.len() + bytes.len() > EARLY_LIMIT {
                self.state = State::Other;
            } else {
                self.early.extend_from_slice(bytes);
            }
            return;
        }
        if !matches!(self.state, State::Frames | State::GoingAway(..)) {
            return;
        }
        let mut headers = Vec::new();
        self.outbound.take(bytes, |h| headers.push(h));
        for h in headers {
            match h.kind {
                kind::HEADERS | kind::DATA => {
                    if let Some(p) = &mut self.pings {
                        p.server_sent();
                    }
                    if h.flags & END_STREAM != 0 {
                        self.open.remove(&h.stream);
                    }
                }
                kind::RST_STREAM => {
                    self.open.remove(&h.stream);
                }
                _ => {}
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> Watched<IO> {
    /// Writes the GOAWAY if hyper is between frames, and flushes it: Ready once the
    /// connection is closed, or at once when there is no GOAWAY to write or hyper is inside
    /// a frame.
    fn poll_go_away(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            match &mut self.state {
                State::GoingAway(frame, written) => {
                    if self.outbound.to_boundary() > 0 {
                        return Poll::Ready(Ok(()));
                    }
                    let rest = frame.get(*written..).unwrap_or_default();
                    let n = ready!(Pin::new(&mut self.io).poll_write(cx, rest))?;
                    if n == 0 {
                        return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                    }
                    *written += n;
                    if *written >= frame.len() {
                        self.state = State::Flushing;
                    }
                }
                State::Flushing => {
                    ready!(Pin::new(&mut self.io).poll_flush(cx))?;
                    self.state = State::Closed;
                }
                _ => return Poll::Ready(Ok(())),
            }
        }
    }
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "closed: the client pinged too often, or broke HTTP/2's rules",
    )
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_go_away(cx))?;
        loop {
            match this.state {
                State::Closed => return Poll::Ready(Ok(())),
                State::Other if this.plain.is_empty() => return Pin::new(&mut this.io).poll_read(cx, buf),
                State::Other => {
                    let n = this.plain.len().min(buf.remaining());
                    buf.put_slice(this.plain.get(..n).unwrap_or_default());
                    this.plain.advance(n);
                    return Poll::Ready(Ok(()));
                }
                _ => {}
            }
            if this.inbound.broken() {
                // The end of the stream for hyper, which then ends the connection.
                this.state = State::Closed;
                return Poll::Ready(Ok(()));
            }
            if let Some(bytes) = this.inbound.pop(buf.remaining()) {
                buf.put_slice(&bytes);
                return Poll::Ready(Ok(()));
            }
            let n = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut this.io),
                cx,
                this.inbound.receive_buffer()
            ))?;
            if n == 0 {
                // The client is gone; a frame it left half sent is of no use to hyper.
                return Poll::Ready(Ok(()));
            }
            this.received();
            // A GOAWAY earned by what was just read goes out now if hyper is between frames.
            ready!(this.poll_go_away(cx))?;
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_go_away(cx))?;
        let mut buf = buf;
        match this.state {
            State::Closed => return Poll::Ready(Err(closed())),
            // Only the rest of hyper's frame may go before the GOAWAY.
            State::GoingAway(..) => {
                buf = buf
                    .get(..this.outbound.to_boundary().min(buf.len()))
                    .unwrap_or_default();
            }
            _ => {}
        }
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        if let Some(written) = buf.get(..n) {
            this.sent(written);
        }
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if !matches!(self.state, State::Preface | State::Frames | State::Other) {
            let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| &**b);
            return self.poll_write(cx, first);
        }
        let this = &mut *self;
        let n = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        let mut left = n;
        for b in bufs {
            if left == 0 {
                break;
            }
            let k = left.min(b.len());
            this.sent(b.get(..k).unwrap_or_default());
            left -= k;
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_go_away(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // A GOAWAY half written is finished first, so that the client reads a whole frame.
        if matches!(this.state, State::GoingAway(..) | State::Flushing) && this.outbound.to_boundary() == 0 {
            ready!(this.poll_go_away(cx))?;
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}
