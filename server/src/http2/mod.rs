//! A client connection's HTTP/2 frames, watched between the socket (or its TLS session) and
//! hyper, for what grpc-go's server does that hyper does not: it enforces the client's ping
//! policy (`pings`, etcd's `--grpc-keepalive-min-time`).
//!
//! [`Watched`] reads the frames' headers as the bytes pass, both ways, and never changes a
//! byte of them. A connection that does not open with HTTP/2's preface (HTTP/1.1) is passed
//! through unwatched. When the client has pinged too often, the layer writes its own GOAWAY
//! between two of hyper's frames, never inside one, then ends the connection: hyper's reads
//! see the end of the stream and its writes fail.

pub mod frame;
pub mod pings;

use std::collections::HashSet;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use frame::{kind, Header, Splitter, ACK, END_STREAM, ENHANCE_YOUR_CALM, PREFACE};
use pings::{PingPolicy, Verdict, TOO_MANY_PINGS};

/// Where the connection is.
#[derive(Debug)]
enum State {
    /// The client's first bytes, `n` of them so far, match HTTP/2's preface.
    Preface(usize),
    /// HTTP/2, watched.
    Frames,
    /// Not HTTP/2: passed through.
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
    inbound: Splitter,
    outbound: Splitter,
    /// Streams the client opened that are not yet ended by the server or reset.
    open: HashSet<u32>,
    /// The highest stream the client opened.
    last_stream: u32,
    /// `None`: the client's pings are not policed, and nothing is watched.
    pings: Option<PingPolicy>,
    /// What hyper wrote while the client's preface was still coming (nothing, from hyper's
    /// server, which reads the preface first), for the outbound count once it is HTTP/2.
    early: Vec<u8>,
}

/// Bytes written before the preface is read that are kept for the count; more, and the
/// connection is not watched.
const EARLY_LIMIT: usize = 64 * 1024;

impl<IO> Watched<IO> {
    /// `io` watched, with the client's pings policed by `pings` if given.
    pub fn new(io: IO, pings: Option<PingPolicy>) -> Watched<IO> {
        Watched {
            io,
            state: if pings.is_some() {
                State::Preface(0)
            } else {
                State::Other
            },
            inbound: Splitter::default(),
            outbound: Splitter::default(),
            open: HashSet::new(),
            last_stream: 0,
            pings,
            early: Vec::new(),
        }
    }

    /// Takes bytes the client sent.
    fn received(&mut self, mut bytes: &[u8]) {
        if let State::Preface(seen) = self.state {
            let n = (PREFACE.len() - seen).min(bytes.len());
            let expected = PREFACE.get(seen..seen + n).unwrap_or_default();
            if bytes.get(..n) != Some(expected) {
                self.state = State::Other;
                return;
            }
            bytes = bytes.get(n..).unwrap_or_default();
            if seen + n < PREFACE.len() {
                self.state = State::Preface(seen + n);
                return;
            }
            self.state = State::Frames;
            let early = std::mem::take(&mut self.early);
            self.sent(&early);
        }
        if !matches!(self.state, State::Frames) {
            return;
        }
        let mut headers = Vec::new();
        self.inbound.take(bytes, |h| headers.push(h));
        for h in headers {
            self.client_frame(h);
        }
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
        if let State::Preface(_) = self.state {
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
    io::Error::new(io::ErrorKind::BrokenPipe, "closed: the client pinged too often")
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_go_away(cx))?;
        if matches!(this.state, State::Closed) {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        if let Some(new) = buf.filled().get(before..) {
            this.received(new);
        }
        // A GOAWAY earned by what was just read goes out now if hyper is between frames;
        // the bytes read still reach hyper, which answers the ping first if it can.
        if this.poll_go_away(cx).is_ready() && matches!(this.state, State::Closed) {
            buf.set_filled(before);
        }
        Poll::Ready(Ok(()))
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
        if !matches!(self.state, State::Preface(_) | State::Frames | State::Other) {
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
