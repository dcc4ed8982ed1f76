//! The watch hub: every watcher, and how each is fed.
//!
//! A watcher is *synced* when it has seen everything up to the current revision: the apply
//! thread hands it each new revision's events as they are applied, all of one revision in one
//! response. A watcher whose buffer is full, or that starts in the past, is *unsynced*: it gets
//! nothing live, and the catch-up pass (the watch thread, every `watch_sync_interval`) reads its
//! next revisions from the store's history, a bounded batch at a time, until it is synced
//! again. So a slow consumer never blocks writers and its memory is bounded by its buffer; if
//! history is compacted past where it stands, it is cancelled with the compact revision.
//!
//! Guarantees, per watcher: events in revision order, none twice, none missed, whole
//! revisions per response.

use std::collections::BTreeMap;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

use crate::mvcc::index::KeyRange;
use crate::mvcc::store::{Event, EventKind, Store};

/// What to watch (etcd's `WatchCreateRequest`, less the stream-level options).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchRequest {
    /// The key watched, or the first key of the range; empty means `"\0"`, so with
    /// `range_end` `"\0"` every key is watched.
    pub key: Vec<u8>,
    /// The end of the range, exclusive: empty watches `key` alone, `"\0"` every key from
    /// `key` on.
    pub range_end: Vec<u8>,
    /// The first revision to report; 0 for "from the next one".
    pub start_revision: i64,
    /// Include the key-value before each change, in [`Event::prev_kv`].
    pub prev_kv: bool,
    /// Leave out put events.
    pub no_put: bool,
    /// Leave out delete events.
    pub no_delete: bool,
    /// Send [`WatchResponse::Progress`] on every periodic tick with no events since the last
    /// (etcd's `progress_notify`).
    pub progress_notify: bool,
}

/// One message to a watcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchResponse {
    /// The events of one or more whole revisions, ascending; `revision` is the newest
    /// revision the watcher has now seen.
    Events {
        /// The changes that match the watch's range and filters, in revision order, and in
        /// change order within a revision; never empty.
        events: Vec<Event>,
        /// The newest revision seen, at or after the last event's: the watch resumes after it.
        revision: i64,
    },
    /// The watcher fell behind a compaction: it is cancelled (etcd's `compact_revision`).
    Compacted {
        /// The store's compacted revision; a new watch must start at or after it.
        compact_revision: i64,
    },
    /// Nothing new for this watcher up to `revision` (etcd's progress notification: a
    /// response with no events).
    Progress {
        /// The current revision: the watcher has been sent every event up to it.
        revision: i64,
    },
}

/// What an event takes on the wire, roughly: its keys and values plus field overhead.
fn wire_size(e: &Event) -> usize {
    const OVERHEAD: usize = 48;
    let kv = |kv: &crate::mvcc::store::KeyValue| OVERHEAD + kv.key.len() + kv.value.len();
    kv(&e.kv) + e.prev_kv.as_ref().map_or(0, kv)
}

/// Splits the events of one response into fragments of at most `max_bytes` each (etcd's
/// `fragment` watch option, for responses larger than the request size limit); an event
/// larger than the limit is a fragment of its own. Every fragment but the last is sent with
/// `fragment` set.
pub fn fragment(events: Vec<Event>, max_bytes: usize) -> Vec<Vec<Event>> {
    let mut out: Vec<Vec<Event>> = Vec::new();
    let mut size = 0;
    for e in events {
        let n = wire_size(&e);
        match out.last_mut() {
            Some(last) if !last.is_empty() && size + n <= max_bytes => {
                size += n;
                last.push(e);
            }
            _ => {
                size = n;
                out.push(vec![e]);
            }
        }
    }
    out
}

#[derive(Debug)]
struct Watcher {
    range: KeyRange,
    /// The next revision this watcher needs. Invariant: every revision before it was sent.
    next_rev: i64,
    synced: bool,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    progress_notify: bool,
    /// Nothing sent since the last progress tick.
    quiet: bool,
    out: Outbox,
}

/// Called after a response is queued for a watcher, so a consumer that serves many watchers
/// (a gRPC stream) can wait for all of them at once instead of blocking on each.
pub type Wake = std::sync::Arc<dyn Fn() + Send + Sync>;

/// Where a watcher's responses go.
struct Outbox {
    tx: Sender<WatchResponse>,
    wake: Option<Wake>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("queued", &self.tx.len())
            .field("wakes", &self.wake.is_some())
            .finish()
    }
}

impl Outbox {
    fn send(&self, response: WatchResponse) -> Sent {
        match self.tx.try_send(response) {
            Ok(()) => {
                if let Some(wake) = &self.wake {
                    wake();
                }
                Sent::Delivered
            }
            Err(TrySendError::Full(_)) => Sent::Full,
            Err(TrySendError::Disconnected(_)) => Sent::Gone,
        }
    }
}

impl Watcher {
    fn wants(&self, e: &Event) -> bool {
        self.range.contains(&e.kv.key)
            && !(self.no_put && e.kind == EventKind::Put)
            && !(self.no_delete && e.kind == EventKind::Delete)
    }

    fn shape(&self, events: &[Event]) -> Vec<Event> {
        events
            .iter()
            .filter(|e| self.wants(e))
            .map(|e| Event {
                prev_kv: if self.prev_kv { e.prev_kv.clone() } else { None },
                ..e.clone()
            })
            .collect()
    }
}

/// What happened to a send.
enum Sent {
    Delivered,
    Full,
    Gone,
}

#[derive(Debug)]
pub(crate) struct WatchHub {
    watchers: BTreeMap<u64, Watcher>,
    next_id: u64,
    /// Responses a watcher may have waiting before it falls behind.
    buffer: usize,
    /// Events read from history per catch-up step.
    batch: usize,
}

impl WatchHub {
    pub(crate) fn new(buffer: usize, batch: usize) -> WatchHub {
        WatchHub {
            watchers: BTreeMap::new(),
            next_id: 1,
            buffer: buffer.max(1),
            batch: batch.max(1),
        }
    }

    /// Registers a watcher; call with the store locked so no revision slips between. A start
    /// below the compacted revision gets the compacted answer at once and no watcher.
    pub(crate) fn watch(
        &mut self,
        req: &WatchRequest,
        current: i64,
        compacted: i64,
        wake: Option<Wake>,
    ) -> (u64, Receiver<WatchResponse>) {
        let (tx, rx) = bounded(self.buffer);
        let out = Outbox { tx, wake };
        let next_rev = if req.start_revision <= 0 {
            current + 1
        } else {
            req.start_revision
        };
        if next_rev < compacted {
            let _ = out.send(WatchResponse::Compacted {
                compact_revision: compacted,
            });
            return (0, rx);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.watchers.insert(
            id,
            Watcher {
                range: KeyRange::new(&req.key, &req.range_end),
                next_rev,
                synced: next_rev > current,
                prev_kv: req.prev_kv,
                no_put: req.no_put,
                no_delete: req.no_delete,
                progress_notify: req.progress_notify,
                quiet: true,
                out,
            },
        );
        (id, rx)
    }

    pub(crate) fn cancel(&mut self, id: u64) {
        self.watchers.remove(&id);
    }

    /// Hands the events of newly applied revision `revision` to synced watchers.
    pub(crate) fn notify(&mut self, revision: i64, events: &[Event]) {
        self.watchers.retain(|_, w| {
            if !w.synced || w.next_rev > revision {
                return true; // catching up, or starting later
            }
            let mine = w.shape(events);
            if mine.is_empty() {
                w.next_rev = revision + 1;
                return true;
            }
            match w.out.send(WatchResponse::Events { events: mine, revision }) {
                Sent::Delivered => {
                    w.next_rev = revision + 1;
                    w.quiet = false;
                    true
                }
                Sent::Full => {
                    // Falls behind; catch-up will resend this revision from history.
                    w.synced = false;
                    true
                }
                Sent::Gone => false,
            }
        });
    }

    /// Moves every unsynced watcher forward by up to a batch of history.
    pub(crate) fn catch_up(&mut self, store: &Store) {
        let current = store.current_revision();
        let compacted = store.compacted_revision();
        let batch = self.batch;
        let mut gone = Vec::new();
        for (id, w) in self.watchers.iter_mut().filter(|(_, w)| !w.synced) {
            if w.next_rev < compacted {
                // Cancelled once the consumer can take the news; until then it stays here.
                let news = WatchResponse::Compacted {
                    compact_revision: compacted,
                };
                if !matches!(w.out.send(news), Sent::Full) {
                    gone.push(*id);
                }
                continue;
            }
            if w.next_rev > current {
                w.synced = true;
                continue;
            }
            let events = match store.events(w.next_rev, current, &w.range, batch) {
                Ok(events) => events,
                Err(e) => {
                    // One watcher's trouble must not stall the others.
                    tracing::error!(error = %e, from = w.next_rev, "watch catch-up cannot read history");
                    continue;
                }
            };
            let last = events.last().map_or(current, |e| e.kv.mod_revision);
            // If the batch stopped early, `last` is its final revision; else the watcher has
            // seen everything up to `current`.
            let seen = if events.len() >= batch { last } else { current };
            let mine = w.shape(&events);
            let has_events = !mine.is_empty();
            let delivered = mine.is_empty() || {
                match w.out.send(WatchResponse::Events {
                    events: mine,
                    revision: seen,
                }) {
                    Sent::Delivered => true,
                    Sent::Full => false,
                    Sent::Gone => {
                        gone.push(*id);
                        false
                    }
                }
            };
            if delivered {
                w.quiet &= !has_events;
                w.next_rev = seen + 1;
                w.synced = w.next_rev > current;
            }
        }
        for id in gone {
            self.watchers.remove(&id);
        }
    }

    /// Every watcher catches up from history again (the state was replaced by a snapshot:
    /// what it will be notified of next may not follow what it saw).
    pub(crate) fn unsync_all(&mut self) {
        for w in self.watchers.values_mut() {
            w.synced = false;
        }
    }

    /// Whether watcher `id` has been handed every revision up to `current` (synced, and
    /// nothing older still in its buffer). A cancelled watcher counts as caught up.
    pub(crate) fn caught_up(&self, id: u64, current: i64) -> bool {
        self.watchers
            .get(&id)
            .is_none_or(|w| w.synced && w.next_rev > current && w.out.tx.is_empty())
    }

    /// The periodic progress tick: each synced watcher that asked for progress notifications
    /// and was sent nothing since the last tick is told it has seen everything up to
    /// `current`. A full buffer skips the notice (the watcher has news queued anyway).
    pub(crate) fn progress(&mut self, current: i64) {
        for w in self.watchers.values_mut().filter(|w| w.progress_notify) {
            if w.quiet && w.synced && w.next_rev > current {
                let _ = w.out.send(WatchResponse::Progress { revision: current });
            }
            w.quiet = true;
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.watchers.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.watchers.is_empty()
    }
}
