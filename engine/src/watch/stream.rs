//! What a watcher holds: a [`Watch`] per request, read blocking or as a stream, and a
//! [`WatchGroup`], many watchers with one queue (a gRPC stream's).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crossbeam_channel::{Receiver, TryRecvError};
use parking_lot::{Mutex, RwLock};

use super::hub::{Delivery, Wake, WatchHub, WatchRequest, WatchResponse};
use crate::engine::state::State;
use crate::error::{Error, Result};

/// A watcher: the responses for one [`WatchRequest`], blocking ([`Watch::recv`], or
/// `for response in &watch`) or async (a [`futures_core::Stream`]: `watch.next().await` with
/// `StreamExt`). Dropping it cancels the watch.
#[derive(Debug)]
pub struct Watch {
    group: WatchGroup,
    /// The task to wake when a response is queued, while one is waiting on the stream.
    waker: Arc<Mutex<Option<Waker>>>,
}

impl Watch {
    /// A watch of `request` on the engine whose watchers and state these are.
    pub(crate) fn new(hub: &Arc<Mutex<WatchHub>>, state: &Arc<RwLock<State>>, request: &WatchRequest) -> Result<Watch> {
        let waker: Arc<Mutex<Option<Waker>>> = Arc::default();
        let wakes = StreamWaker(waker.clone());
        let group = WatchGroup::new(hub, state, Some(Arc::new(move || wakes.wake())));
        group.watch(request)?;
        Ok(Watch { group, waker })
    }

    /// The next response, waiting for it; `None` once the engine is closed.
    pub fn recv(&self) -> Option<WatchResponse> {
        self.group.rx.recv().ok().map(|d| d.response)
    }

    /// The next response if one arrives within `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<WatchResponse> {
        self.group.rx.recv_timeout(timeout).ok().map(|d| d.response)
    }

    /// The next response if one is waiting.
    pub fn try_recv(&self) -> Option<WatchResponse> {
        self.group.try_recv().map(|d| d.response)
    }
}

/// A watch as a blocking iterator of its responses (`for response in &watch`): it ends when
/// the engine closes (or the watch is canceled), as [`Watch::recv`] does. The iterator is
/// `&Watch`, as `Read` is `&File`, so that `watch.next()` is the stream's, unambiguously.
impl Iterator for &Watch {
    type Item = WatchResponse;

    fn next(&mut self) -> Option<WatchResponse> {
        self.recv()
    }
}

/// Wakes the task waiting on a [`Watch`]'s stream when a response is queued, and once more when
/// the engine drops the watch's queue (closing), so that the stream sees its end.
struct StreamWaker(Arc<Mutex<Option<Waker>>>);

impl StreamWaker {
    fn wake(&self) {
        if let Some(waker) = self.0.lock().take() {
            waker.wake();
        }
    }
}

impl Drop for StreamWaker {
    fn drop(&mut self) {
        self.wake();
    }
}

/// A watch as an async stream of its responses, ending when the engine closes (or the watch is
/// canceled). No thread waits: the engine wakes the task when a response is queued.
impl futures_core::Stream for Watch {
    type Item = WatchResponse;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WatchResponse>> {
        let this = self.get_mut();
        let next = |rx: &Receiver<Delivery>| match rx.try_recv() {
            Ok(delivery) => Some(Poll::Ready(Some(delivery.response))),
            Err(TryRecvError::Disconnected) => Some(Poll::Ready(None)),
            Err(TryRecvError::Empty) => None,
        };
        if let Some(ready) = next(&this.group.rx) {
            return ready;
        }
        *this.waker.lock() = Some(cx.waker().clone());
        // A response queued between the first look and the waker's registration woke nobody:
        // look again.
        next(&this.group.rx).unwrap_or(Poll::Pending)
    }
}

/// Many watchers with one queue, for a consumer that serves them all (a gRPC stream): each
/// revision comes as one [`Delivery`] per distinct set of events, naming the watchers it is
/// for, instead of one response per watcher. Dropping it cancels its watchers.
#[derive(Debug)]
pub struct WatchGroup {
    sink: u64,
    rx: Receiver<Delivery>,
    hub: std::sync::Weak<Mutex<WatchHub>>,
    state: std::sync::Weak<RwLock<State>>,
}

impl WatchGroup {
    /// An empty group on the engine whose watchers and state these are.
    pub(crate) fn new(hub: &Arc<Mutex<WatchHub>>, state: &Arc<RwLock<State>>, wake: Option<Wake>) -> WatchGroup {
        let (sink, rx) = hub.lock().sink(wake);
        WatchGroup {
            sink,
            rx,
            hub: Arc::downgrade(hub),
            state: Arc::downgrade(state),
        }
    }

    /// Adds a watcher to this group, as [`Engine::watch`](crate::Engine::watch)(crate::Engine::watch) makes one; returns the ID its
    /// deliveries name. [`Error::Closed`] once the engine is closed.
    pub fn watch(&self, request: &WatchRequest) -> Result<u64> {
        let (Some(state), Some(hub)) = (self.state.upgrade(), self.hub.upgrade()) else {
            return Err(Error::Closed);
        };
        let owned;
        let request = if request.key.is_empty() {
            owned = WatchRequest {
                key: vec![0],
                ..request.clone()
            };
            &owned
        } else {
            request
        };
        // The engine's lock order: the state first, then the watchers.
        let st = state.read();
        let id = hub.lock().watch(
            self.sink,
            request,
            st.store.current_revision(),
            st.store.compacted_revision(),
        );
        Ok(id)
    }

    /// etcd's progress-request rule: the current revision if every watcher of this group has
    /// received everything up to it (nothing left in its queue), else `None` (ask again
    /// later, or the engine is closed). A stream answers a progress request only when this
    /// says so; kube-apiserver relies on it for consistent reads from its watch cache.
    pub fn progress(&self) -> Option<i64> {
        let (state, hub) = (self.state.upgrade()?, self.hub.upgrade()?);
        let st = state.read();
        let current = st.store.current_revision();
        let caught_up = hub.lock().caught_up(self.sink, current);
        caught_up.then_some(current)
    }

    /// The next delivery if one is waiting.
    pub fn try_recv(&self) -> Option<Delivery> {
        self.rx.try_recv().ok()
    }

    /// The next delivery if one arrives within `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Delivery> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Cancels watcher `id` of this group; deliveries already queued may still name it.
    pub fn cancel(&self, id: u64) {
        if let Some(hub) = self.hub.upgrade() {
            hub.lock().cancel(self.sink, id);
        }
    }
}

impl Drop for WatchGroup {
    fn drop(&mut self) {
        if let Some(hub) = self.hub.upgrade() {
            hub.lock().drop_sink(self.sink);
        }
    }
}
