//! etcd's Watch service on the engine: a [`Watch`] per request, fed by the apply thread as
//! revisions are applied, and the watch thread, which catches lagging watchers up from history
//! and sends periodic progress notifications.

use std::sync::Arc;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use parking_lot::{Mutex, RwLock};

use super::{Engine, State};
use crate::error::Result;
use crate::watch::hub::{Wake, WatchHub, WatchRequest, WatchResponse};

/// Catches lagging watchers up every `every`, and sends progress notifications every
/// `progress_every`, until told to stop.
pub(super) fn watch_loop(
    state: Arc<RwLock<State>>,
    hub: Arc<Mutex<WatchHub>>,
    stop: Receiver<()>,
    every: std::time::Duration,
    progress_every: Option<std::time::Duration>,
) {
    let mut last_progress = std::time::Instant::now();
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(every) {
        let st = state.read();
        let mut hub = hub.lock();
        hub.catch_up(&st.store);
        if progress_every.is_some_and(|p| last_progress.elapsed() >= p) {
            last_progress = std::time::Instant::now();
            hub.progress(st.store.current_revision());
        }
    }
}

/// A watcher: the responses for one [`WatchRequest`]. Dropping it cancels the watch.
#[derive(Debug)]
pub struct Watch {
    id: u64,
    rx: Receiver<WatchResponse>,
    hub: std::sync::Weak<Mutex<WatchHub>>,
}

impl Watch {
    /// The next response, waiting for it; `None` once the engine is closed.
    pub fn recv(&self) -> Option<WatchResponse> {
        self.rx.recv().ok()
    }

    /// The next response if one arrives within `timeout`.
    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Option<WatchResponse> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// The next response if one is waiting.
    pub fn try_recv(&self) -> Option<WatchResponse> {
        self.rx.try_recv().ok()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(hub) = self.hub.upgrade() {
            hub.lock().cancel(self.id);
        }
    }
}

impl Engine {
    /// Watches a key or range from `start_revision` (etcd's `Watch`). Past revisions are
    /// replayed from history, then changes follow as they are applied.
    /// An empty key means `"\0"`, as in etcd (with `range_end` `"\0"`: every key).
    pub fn watch(&self, request: &WatchRequest) -> Result<Watch> {
        self.watch_waking(request, None)
    }

    /// [`Engine::watch`], calling `wake` after each response is queued for the watcher (for a
    /// consumer that serves many watchers and waits for any of them, such as a gRPC stream).
    /// `wake` runs on the engine's threads, under its locks: it must only signal, never block.
    pub fn watch_waking(&self, request: &WatchRequest, wake: Option<Wake>) -> Result<Watch> {
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
        let st = self.inner.state.read();
        let (id, rx) = self.inner.hub.lock().watch(
            request,
            st.store.current_revision(),
            st.store.compacted_revision(),
            wake,
        );
        Ok(Watch {
            id,
            rx,
            hub: Arc::downgrade(&self.inner.hub),
        })
    }

    /// Sends progress notifications now, as the periodic tick
    /// (`Config::watch_progress_interval`) does: every synced watcher that asked for them and
    /// was sent nothing since the last tick gets [`WatchResponse::Progress`].
    pub fn notify_progress(&self) {
        let st = self.inner.state.read();
        self.inner.hub.lock().progress(st.store.current_revision());
    }

    /// etcd's progress-request rule: the current revision if every one of `watches` has
    /// received everything up to it, else `None` (ask again later). A stream answers a
    /// progress request only when this says so; kube-apiserver relies on it for consistent
    /// reads from its watch cache.
    pub fn watch_progress(&self, watches: &[&Watch]) -> Option<i64> {
        let st = self.inner.state.read();
        let current = st.store.current_revision();
        let hub = self.inner.hub.lock();
        watches.iter().all(|w| hub.caught_up(w.id, current)).then_some(current)
    }
}
