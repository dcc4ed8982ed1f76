//! The watch thread: hands the revisions the apply thread queues ([`Fed`]) to the synced
//! watchers, catches lagging watchers up from history, and sends periodic progress
//! notifications.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use parking_lot::{Mutex, RwLock};

use super::hub::WatchHub;
use crate::engine::state::State;
use crate::mvcc::index::KeyRange;
use crate::mvcc::store::Event;

/// Revisions the apply thread may queue for the watch thread before it drops them (the
/// watchers due a dropped one catch up from history).
pub(crate) const FEED_DEPTH: usize = 1024;

/// Revisions the watch thread hands out under one hold of the hub's lock.
const NOTIFY_BATCH: usize = 64;

/// A newly applied revision and its events, for the watchers.
pub(crate) type Fed = (i64, Vec<Event>);

/// What the watch thread works with.
pub(crate) struct WatchThread {
    pub(crate) state: Arc<RwLock<State>>,
    pub(crate) hub: Arc<Mutex<WatchHub>>,
    /// Each applied revision and its events.
    pub(crate) feed: Receiver<Fed>,
    /// How often lagging watchers are caught up.
    pub(crate) every: Duration,
    /// How often progress notifications go out, if at all.
    pub(crate) progress_every: Option<Duration>,
}

/// The watch thread: hands each revision the feed brings to the synced watchers, catches
/// lagging watchers up every `every` (at once again while a pass moves some forward), and
/// sends progress notifications every `progress_every`, until `stop` disconnects.
pub(crate) fn watch_loop(thread: WatchThread, stop: Receiver<()>) {
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
    let events = match st.store.events(need.from..=need.to, &everything, batch, need.with_prev) {
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
