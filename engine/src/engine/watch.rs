//! etcd's Watch service on the engine: a [`Watch`] per request, and the watch thread, which
//! hands the revisions the apply thread queues to the synced watchers, catches lagging
//! watchers up from history, and sends periodic progress notifications.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};
use parking_lot::{Mutex, RwLock};

use super::{Engine, State};
use crate::error::Result;
use crate::mvcc::index::KeyRange;
use crate::mvcc::store::Event;
use crate::watch::hub::{Delivery, Wake, WatchHub, WatchRequest, WatchResponse};

/// Revisions the apply thread may queue for the watch thread before it drops them (the
/// watchers due a dropped one catch up from history).
pub(super) const FEED_DEPTH: usize = 1024;

/// Revisions the watch thread hands out under one hold of the hub's lock.
const NOTIFY_BATCH: usize = 64;

/// A newly applied revision and its events, for the watchers.
pub(super) type Fed = (i64, Vec<Event>);

/// What the watch thread works with.
pub(super) struct WatchThread {
    pub(super) state: Arc<RwLock<State>>,
    pub(super) hub: Arc<Mutex<WatchHub>>,
    /// Each applied revision and its events.
    pub(super) feed: Receiver<Fed>,
    /// How often lagging watchers are caught up.
    pub(super) every: Duration,
    /// How often progress notifications go out, if at all.
    pub(super) progress_every: Option<Duration>,
}

/// The watch thread: hands each revision the feed brings to the synced watchers, catches
/// lagging watchers up every `every` (at once again while a pass moves some forward), and
/// sends progress notifications every `progress_every`, until `stop` disconnects.
pub(super) fn watch_loop(thread: WatchThread, stop: Receiver<()>) {
    let WatchThread {
        state,
        hub,
        feed,
        every,
        progress_every,
    } = thread;
    let mut last_progress = Instant::now();
    let mut next_pass = Instant::now() + every;
    loop {
        crossbeam_channel::select! {
            recv(stop) -> _ => break,
            recv(feed) -> fed => {
                let Ok((revision, events)) = fed else { break };
                let mut hub = hub.lock();
                hub.notify(revision, &events);
                for (revision, events) in feed.try_iter().take(NOTIFY_BATCH) {
                    hub.notify(revision, &events);
                }
            },
            default(next_pass.saturating_duration_since(Instant::now())) => {}
        }
        if Instant::now() < next_pass {
            continue;
        }
        let moved = catch_up(&state, &hub);
        if progress_every.is_some_and(|p| last_progress.elapsed() >= p) {
            last_progress = Instant::now();
            let st = state.read();
            hub.lock().progress(st.store.current_revision());
        }
        let again = moved && hub.lock().any_lagging();
        next_pass = Instant::now() + if again { Duration::ZERO } else { every };
    }
}

/// One catch-up pass: reads the history the lagging watchers need once, a bounded batch,
/// under the state's read lock, then hands each its part under the hub's lock alone. Returns
/// whether any watcher moved forward.
fn catch_up(state: &RwLock<State>, hub: &Mutex<WatchHub>) -> bool {
    let st = state.read();
    let (current, compacted) = (st.store.current_revision(), st.store.compacted_revision());
    let (need, batch) = {
        let mut hub = hub.lock();
        (hub.lagging(current, compacted), hub.batch())
    };
    let Some(need) = need else { return false };
    let everything = KeyRange::new(&[0], &[0]);
    let events = match st.store.events(need.from, need.to, &everything, batch, need.with_prev) {
        Ok(events) => events,
        Err(e) => {
            tracing::error!(error = %e, from = need.from, "watch catch-up cannot read history");
            return false;
        }
    };
    drop(st);
    // A batch that stopped early ends at its last revision; else everything up to `to` is read.
    let seen = match events.last() {
        Some(last) if events.len() >= batch => last.kv.mod_revision,
        _ => need.to,
    };
    hub.lock().deliver_history(need, &events, seen)
}

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
}

impl WatchGroup {
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

impl Engine {
    /// Watches a key or range from `start_revision` (etcd's `Watch`). Past revisions are
    /// replayed from history, then changes follow as they are applied.
    /// An empty key means `"\0"`, as in etcd (with `range_end` `"\0"`: every key).
    pub fn watch(&self, request: &WatchRequest) -> Result<Watch> {
        let waker: Arc<Mutex<Option<Waker>>> = Arc::default();
        let wakes = StreamWaker(waker.clone());
        let group = self.watch_group(Some(Arc::new(move || wakes.wake())));
        self.watch_in(&group, request)?;
        Ok(Watch { group, waker })
    }

    /// A new, empty [`WatchGroup`]; `wake` is called after each delivery is queued for it.
    /// `wake` runs on the engine's threads, under its locks: it must only signal, never block.
    pub fn watch_group(&self, wake: Option<Wake>) -> WatchGroup {
        let (sink, rx) = self.core.hub.lock().sink(wake);
        WatchGroup {
            sink,
            rx,
            hub: Arc::downgrade(&self.core.hub),
        }
    }

    /// [`Engine::watch`] as a watcher of `group`; returns the ID its deliveries name.
    pub fn watch_in(&self, group: &WatchGroup, request: &WatchRequest) -> Result<u64> {
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
        let st = self.core.state.read();
        Ok(self.core.hub.lock().watch(
            group.sink,
            request,
            st.store.current_revision(),
            st.store.compacted_revision(),
        ))
    }

    /// Sends progress notifications now, as the periodic tick
    /// (`Config::watch_progress_interval`) does: every synced watcher that asked for them and
    /// was sent nothing since the last tick gets [`WatchResponse::Progress`].
    pub fn notify_progress(&self) {
        let st = self.core.state.read();
        self.core.hub.lock().progress(st.store.current_revision());
    }

    /// etcd's progress-request rule: the current revision if every watcher of `group` has
    /// received everything up to it (nothing left in its queue), else `None` (ask again
    /// later). A stream answers a progress request only when this says so; kube-apiserver
    /// relies on it for consistent reads from its watch cache.
    pub fn watch_progress(&self, group: &WatchGroup) -> Option<i64> {
        let st = self.core.state.read();
        let current = st.store.current_revision();
        let hub = self.core.hub.lock();
        hub.caught_up(group.sink, current).then_some(current)
    }
}
