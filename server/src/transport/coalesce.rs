//! Answers that are ready together leave in one write.
//!
//! hyper runs each request of an HTTP/2 connection as a task of its own, and the connection as
//! another. A request's task that answers wakes the connection's task, and tokio runs a task
//! just woken next (its LIFO slot), before the other requests' tasks already queued. So the
//! connection wrote each answer alone, as it came: with ten requests in flight on a
//! connection, ten `writev` calls, one per answer. The kernel's send path was a fifth of the
//! server's CPU on a serializable range.
//!
//! [`Coalesced`] sits between h2 and the connection. The first write of each flush hands the
//! turn back once: the connection's task wakes itself and returns `Pending`, which puts it at
//! the back of the worker's queue, behind the tasks that were ready. Those answer meanwhile,
//! h2 buffers their frames beside the first, and the write that follows carries them all.
//! Nothing waits for an event that might not come: the task is queued again at once, so a
//! lone answer leaves one trip through the scheduler's queue later, a microsecond or two.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection whose writes wait for the tasks already ready to run first, once per flush.
#[derive(Debug)]
pub struct Coalesced<IO> {
    io: IO,
    /// This flush has handed the turn back already: its writes go through.
    yielded: bool,
}

impl<IO> Coalesced<IO> {
    /// `io`, its writes coalesced.
    pub fn new(io: IO) -> Coalesced<IO> {
        Coalesced { io, yielded: false }
    }

    /// Pending once per flush, with the task woken so that it is queued behind the ready ones.
    fn poll_turn(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Coalesced<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Coalesced<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_turn(cx));
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_turn(cx));
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.io).poll_flush(cx);
        if flushed.is_ready() {
            self.yielded = false;
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    /// Counts the writes that reach it, and what they carried.
    #[derive(Default)]
    struct Sink {
        writes: usize,
        bytes: Vec<u8>,
    }

    impl AsyncWrite for Sink {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            self.writes += 1;
            self.bytes.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_first_write_of_a_flush_hands_the_turn_back_once_and_wakes_the_task() {
        let wakes = Arc::new(Wakes::default());
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let mut io = Coalesced::new(Sink::default());

        assert!(Pin::new(&mut io).poll_write(&mut cx, b"ab").is_pending());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "the task is queued again at once");
        assert_eq!(io.io.writes, 0);
        assert!(matches!(
            Pin::new(&mut io).poll_write(&mut cx, b"ab"),
            Poll::Ready(Ok(2))
        ));
        assert!(matches!(
            Pin::new(&mut io).poll_write(&mut cx, b"cd"),
            Poll::Ready(Ok(2))
        ));
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_ready());
        assert_eq!((io.io.writes, &io.io.bytes[..]), (2, &b"abcd"[..]));

        // The next flush hands the turn back again.
        assert!(Pin::new(&mut io).poll_write(&mut cx, b"ef").is_pending());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
        assert!(matches!(
            Pin::new(&mut io).poll_write(&mut cx, b"ef"),
            Poll::Ready(Ok(2))
        ));
        assert_eq!(&io.io.bytes[..], b"abcdef");
    }
}
