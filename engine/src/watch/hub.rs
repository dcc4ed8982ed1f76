//! The watch hub: every watcher, and how each is fed.
//!
//! A watcher is *synced* when it has seen everything up to the newest revision handed to the
//! hub: the apply thread queues each new revision's events for the watch thread (without
//! waiting: a full queue drops the revision), which hands them to every synced watcher, all of
//! one revision in one response. A watcher whose buffer is full, that starts in the past, or
//! that was synced when a dropped revision was due, is *unsynced*: it gets nothing live, and the
//! catch-up pass (the watch thread, every `watch_sync_interval`, or at once while it makes
//! progress) reads the history every unsynced watcher needs once, a bounded batch at a time,
//! and hands each its part, until it is synced again. So neither a slow consumer nor many
//! watchers ever block writers, and a slow watcher's memory is bounded by its buffer; if
//! history is compacted past where it stands, it is cancelled with the compact revision.
//!
//! Guarantees, per watcher: events in revision order, none twice, none missed, whole
//! revisions per response.
//!
//! Watchers that take the same events share one copy of them (an `Arc<[Event]>`): with a
//! thousand watchers of one prefix, a revision's events are built once, not once per watcher,
//! and a consumer can encode them once for all of them (`Arc::ptr_eq` tells it so).
//!
//! Watchers belong to a *sink*, one queue a consumer reads: a [`Watch`](crate::Watch) is a
//! sink of one, a gRPC stream one sink for all its watchers. A revision goes to a sink as one
//! [`Delivery`] per distinct share, naming every watcher it is for: with a hundred watchers of
//! a prefix on a stream, one queue operation and one wake-up per revision, not a hundred. A
//! sink holds at most `buffer` deliveries per watcher; a revision that finds it full unsyncs
//! the watchers it was for.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{unbounded, Receiver, Sender};

use crate::mvcc::index::KeyRange;
use crate::mvcc::store::{Event, EventKind};

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

impl WatchRequest {
    /// One key.
    pub fn key(key: impl Into<Vec<u8>>) -> WatchRequest {
        WatchRequest {
            key: key.into(),
            ..WatchRequest::default()
        }
    }

    /// Every key starting with `prefix` (etcdctl's `--prefix`).
    pub fn prefix(prefix: impl AsRef<[u8]>) -> WatchRequest {
        let prefix = prefix.as_ref();
        WatchRequest {
            key: prefix.to_vec(),
            range_end: crate::mvcc::index::prefix_end(prefix),
            ..WatchRequest::default()
        }
    }

    /// Every key.
    pub fn all() -> WatchRequest {
        WatchRequest {
            key: vec![0],
            range_end: vec![0],
            ..WatchRequest::default()
        }
    }

    /// Reports changes from `revision` on (inclusive; it must not be compacted), instead of
    /// from the next one.
    pub fn from_revision(self, revision: i64) -> WatchRequest {
        WatchRequest {
            start_revision: revision,
            ..self
        }
    }

    /// With each change's previous key-value.
    pub fn with_prev_kv(self) -> WatchRequest {
        WatchRequest { prev_kv: true, ..self }
    }
}

/// One message to a watcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchResponse {
    /// The events of one or more whole revisions, ascending; `revision` is the newest
    /// revision the watcher has now seen.
    Events {
        /// The changes that match the watch's range and filters, in revision order, and in
        /// change order within a revision; never empty. Shared with every other watcher
        /// handed the same events.
        events: Arc<[Event]>,
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
}

/// Called after a delivery is queued for a sink, so a consumer that serves many watchers (a
/// gRPC stream) can wait for all of them at once instead of blocking on each.
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// One response for one or more watchers of a sink, in the order it was queued: each watcher's
/// responses arrive in revision order.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Delivery {
    /// The watchers it is for (the IDs the hub gave them), ascending.
    pub watchers: Vec<u64>,
    /// What each of them gets.
    pub response: WatchResponse,
}

/// A consumer's queue and the watchers that feed it.
struct Sink {
    tx: Sender<Delivery>,
    wake: Option<Wake>,
    watchers: BTreeMap<u64, Watcher>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("queued", &self.tx.len())
            .field("wakes", &self.wake.is_some())
            .field("watchers", &self.watchers.len())
            .finish()
    }
}

impl Sink {
    /// Whether the sink holds `buffer` deliveries per watcher already.
    fn full(&self, buffer: usize) -> bool {
        self.tx.len() >= buffer.saturating_mul(self.watchers.len().max(1))
    }

    /// Queues `delivery`, whatever the sink holds, and wakes its consumer.
    fn push(&self, delivery: Delivery) -> Sent {
        match self.tx.send(delivery) {
            Ok(()) => {
                if let Some(wake) = &self.wake {
                    wake();
                }
                Sent::Delivered
            }
            Err(_) => Sent::Gone,
        }
    }

    /// Queues `delivery` unless the sink is full.
    fn send(&self, delivery: Delivery, buffer: usize) -> Sent {
        if self.full(buffer) {
            return Sent::Full;
        }
        self.push(delivery)
    }

    /// Queues a delivery of `events` up to `revision` per group, while there is room; the
    /// watchers of a group that finds the sink full are put back as they were, unsynced
    /// (catch-up resends what they missed). `None` if the consumer is gone, else whether any
    /// group was delivered.
    fn hand_out(&mut self, groups: &mut Groups, revision: i64, buffer: usize) -> Option<bool> {
        let mut delivered = false;
        for g in groups.drain() {
            if self.full(buffer) {
                for (id, (next_rev, quiet)) in g.ids.iter().zip(g.before) {
                    if let Some(w) = self.watchers.get_mut(id) {
                        w.next_rev = next_rev;
                        w.quiet = quiet;
                        w.synced = false;
                    }
                }
                continue;
            }
            let delivery = Delivery {
                watchers: g.ids,
                response: WatchResponse::Events {
                    events: g.events,
                    revision,
                },
            };
            if matches!(self.push(delivery), Sent::Gone) {
                return None;
            }
            delivered = true;
        }
        Some(delivered)
    }
}

/// The watchers of one sink that take the same share of a batch: one delivery.
struct Group {
    events: Arc<[Event]>,
    /// The watchers' IDs, ascending.
    ids: Vec<u64>,
    /// Each one's `next_rev` and `quiet` before the delivery (restored if the sink is full).
    before: Vec<(i64, bool)>,
}

/// Watchers a shared part's group has room for from the start.
const ROOM: usize = 128;

/// One sink's deliveries of a batch, being gathered: the watchers of each share.
#[derive(Default)]
struct Groups {
    /// The shares many watchers may take (the whole batch, with or without previous values):
    /// at most two, so finding one is cheap however many watchers there are.
    shared: Vec<Group>,
    /// Parts built for one watcher alone.
    own: Vec<Group>,
    /// Watchers of the sink being gathered.
    watchers: usize,
}

impl Groups {
    /// Adds watcher `id` (with its `next_rev` and `quiet` before) to the group of its share.
    fn join(&mut self, events: Arc<[Event]>, id: u64, before: (i64, bool), shared: bool) {
        let found = if shared {
            self.shared.iter_mut().find(|g| Arc::ptr_eq(&g.events, &events))
        } else {
            None
        };
        if let Some(g) = found {
            g.ids.push(id);
            g.before.push(before);
            return;
        }
        // A shared part goes to many of the sink's watchers, often all of them: room for
        // them at once (up to `ROOM`, as a delivery may wait queued), instead of a vector
        // doubled a few times per delivery.
        let room = if shared { self.watchers.min(ROOM) } else { 1 };
        let mut group = Group {
            events,
            ids: Vec::with_capacity(room),
            before: Vec::with_capacity(room),
        };
        group.ids.push(id);
        group.before.push(before);
        if shared {
            self.shared.push(group);
        } else {
            self.own.push(group);
        }
    }

    fn drain(&mut self) -> impl Iterator<Item = Group> + '_ {
        self.shared.drain(..).chain(self.own.drain(..))
    }
}

impl Watcher {
    fn wants(&self, e: &Event) -> bool {
        self.range.contains(&e.kv.key)
            && !(self.no_put && e.kind == EventKind::Put)
            && !(self.no_delete && e.kind == EventKind::Delete)
    }

    /// Whether the watcher takes `e`: not seen yet, in its range and filters.
    fn takes(&self, e: &Event) -> bool {
        e.kv.mod_revision >= self.next_rev && self.wants(e)
    }
}

/// The watchers' parts of one batch of events, built once for every watcher that takes the
/// whole batch (the usual case: many watchers of one prefix), and for each other watcher
/// apart.
struct Shares<'a> {
    events: &'a [Event],
    /// The whole batch as it is (with previous values where the batch has them).
    whole: Option<Arc<[Event]>>,
    /// The whole batch without previous values.
    whole_bare: Option<Arc<[Event]>>,
}

impl<'a> Shares<'a> {
    fn new(events: &'a [Event]) -> Shares<'a> {
        Shares {
            events,
            whole: None,
            whole_bare: None,
        }
    }

    /// Whether `part` is one of the shares many watchers take.
    fn is_shared(&self, part: &Arc<[Event]>) -> bool {
        let same = |share: &Option<Arc<[Event]>>| share.as_ref().is_some_and(|s| Arc::ptr_eq(s, part));
        same(&self.whole) || same(&self.whole_bare)
    }

    /// Watcher `w`'s part; `None` (and nothing allocated) if it takes nothing, as most
    /// watchers of other keys do.
    fn part(&mut self, w: &Watcher) -> Option<Arc<[Event]>> {
        let bare = |e: &Event| Event {
            prev_kv: None,
            ..e.clone()
        };
        let taken = self.events.iter().filter(|e| w.takes(e)).count();
        if taken == 0 {
            return None;
        }
        if taken < self.events.len() {
            let mine = self.events.iter().filter(|e| w.takes(e));
            return Some(if w.prev_kv {
                mine.cloned().collect()
            } else {
                mine.map(bare).collect()
            });
        }
        let events = self.events;
        Some(if w.prev_kv || events.iter().all(|e| e.prev_kv.is_none()) {
            self.whole.get_or_insert_with(|| events.into()).clone()
        } else {
            self.whole_bare
                .get_or_insert_with(|| events.iter().map(bare).collect())
                .clone()
        })
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
    sinks: BTreeMap<u64, Sink>,
    next_sink: u64,
    next_id: u64,
    /// Deliveries a sink may have waiting per watcher before its watchers fall behind.
    buffer: usize,
    /// Events read from history per catch-up step.
    batch: usize,
    /// The newest revision handed to [`WatchHub::notify`] (0: none yet).
    notified: i64,
    /// How many watchers there are, readable without the hub's lock: the apply thread asks
    /// whether to build a revision's events at all.
    count: Arc<AtomicUsize>,
}

/// What history a catch-up pass reads: from the oldest revision a lagging watcher needs up
/// to the current one, with previous values if one of them wants them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CatchUp {
    pub(crate) from: i64,
    pub(crate) to: i64,
    pub(crate) with_prev: bool,
}

impl WatchHub {
    pub(crate) fn new(buffer: usize, batch: usize) -> WatchHub {
        WatchHub {
            sinks: BTreeMap::new(),
            next_sink: 1,
            next_id: 1,
            buffer: buffer.max(1),
            batch: batch.max(1),
            notified: 0,
            count: Arc::default(),
        }
    }

    /// The number of watchers, kept up to date by the hub.
    pub(crate) fn counter(&self) -> Arc<AtomicUsize> {
        self.count.clone()
    }

    fn recount(&self) {
        self.count.store(self.len(), Ordering::Relaxed);
    }

    fn all(&mut self) -> impl Iterator<Item = &mut Watcher> {
        self.sinks.values_mut().flat_map(|s| s.watchers.values_mut())
    }

    /// Events read from history per catch-up step.
    pub(crate) fn batch(&self) -> usize {
        self.batch
    }

    /// A new sink, empty; its deliveries come out of the receiver, and `wake` is called after
    /// each is queued.
    pub(crate) fn sink(&mut self, wake: Option<Wake>) -> (u64, Receiver<Delivery>) {
        let (tx, rx) = unbounded();
        let id = self.next_sink;
        self.next_sink += 1;
        self.sinks.insert(
            id,
            Sink {
                tx,
                wake,
                watchers: BTreeMap::new(),
            },
        );
        (id, rx)
    }

    /// Removes a sink and its watchers.
    pub(crate) fn drop_sink(&mut self, sink: u64) {
        self.sinks.remove(&sink);
        self.recount();
    }

    /// Registers a watcher in `sink` and returns its ID; call with the store locked so no
    /// revision slips between. A start below the compacted revision gets the compacted answer
    /// at once and no watcher; so does a sink that is gone.
    pub(crate) fn watch(&mut self, sink: u64, req: &WatchRequest, current: i64, compacted: i64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let Some(s) = self.sinks.get_mut(&sink) else {
            return id;
        };
        let next_rev = if req.start_revision <= 0 {
            current + 1
        } else {
            req.start_revision
        };
        if next_rev < compacted {
            let news = Delivery {
                watchers: vec![id],
                response: WatchResponse::Compacted {
                    compact_revision: compacted,
                },
            };
            // The sink's own limit does not apply: the watcher was never in it.
            let _ = s.push(news);
            return id;
        }
        s.watchers.insert(
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
            },
        );
        self.recount();
        id
    }

    pub(crate) fn cancel(&mut self, sink: u64, id: u64) {
        if let Some(s) = self.sinks.get_mut(&sink) {
            s.watchers.remove(&id);
        }
        self.recount();
    }

    /// Hands revision `revision`'s events to every synced watcher. Revisions come in order;
    /// one that skips some (dropped on the way here) first unsyncs every synced watcher still
    /// due one of them, to catch up from history.
    pub(crate) fn notify(&mut self, revision: i64, events: &[Event]) {
        if revision > self.notified + 1 {
            for w in self.all() {
                if w.synced && w.next_rev < revision {
                    w.synced = false;
                }
            }
        }
        self.notified = self.notified.max(revision);
        let buffer = self.buffer;
        let mut shares = Shares::new(events);
        let mut groups = Groups::default();
        self.sinks.retain(|_, sink| {
            groups.watchers = sink.watchers.len();
            for (id, w) in &mut sink.watchers {
                if !w.synced || w.next_rev > revision {
                    continue; // catching up, or starting later
                }
                let before = (w.next_rev, w.quiet);
                let mine = shares.part(w);
                w.next_rev = revision + 1;
                if let Some(mine) = mine {
                    w.quiet = false;
                    let shared = shares.is_shared(&mine);
                    groups.join(mine, *id, before, shared);
                }
            }
            sink.hand_out(&mut groups, revision, buffer).is_some()
        });
        self.recount();
    }

    /// A catch-up pass, first step (under the state lock, so `current` and `compacted` hold):
    /// settles the lagging watchers that need no history (compacted past: cancelled once they
    /// can take the news; nothing to read: synced), and says what history the others need.
    pub(crate) fn lagging(&mut self, current: i64, compacted: i64) -> Option<CatchUp> {
        let buffer = self.buffer;
        let mut need: Option<CatchUp> = None;
        for sink in self.sinks.values_mut() {
            let mut gone = Vec::new();
            for (id, w) in sink.watchers.iter_mut().filter(|(_, w)| !w.synced) {
                if w.next_rev < compacted {
                    gone.push(*id);
                } else if w.next_rev > current {
                    // Every revision it needs is yet to be applied, and will be handed to it.
                    w.synced = true;
                } else {
                    let n = need.get_or_insert(CatchUp {
                        from: w.next_rev,
                        to: current,
                        with_prev: false,
                    });
                    n.from = n.from.min(w.next_rev);
                    n.with_prev |= w.prev_kv;
                }
            }
            if gone.is_empty() {
                continue;
            }
            let news = Delivery {
                watchers: gone,
                response: WatchResponse::Compacted {
                    compact_revision: compacted,
                },
            };
            let told = news.watchers.clone();
            if !matches!(sink.send(news, buffer), Sent::Full) {
                for id in told {
                    sink.watchers.remove(&id);
                }
            }
        }
        self.recount();
        need
    }

    /// A catch-up pass, second step (under the hub's lock only): hands each lagging watcher
    /// its part of `events`, the history read for `need` up to revision `seen` (whole
    /// revisions). A watcher needing revisions before `need.from` waits for the next pass. One
    /// whose consumer took its part is synced again if that was everything up to `need.to`
    /// (the current revision when it was read), and no revision after `seen` was handed to the
    /// synced watchers meanwhile (it missed those). Returns whether any moved forward.
    pub(crate) fn deliver_history(&mut self, need: CatchUp, events: &[Event], seen: i64) -> bool {
        let notified = self.notified;
        let buffer = self.buffer;
        let mut moved = false;
        let mut shares = Shares::new(events);
        let mut groups = Groups::default();
        self.sinks.retain(|_, sink| {
            groups.watchers = sink.watchers.len();
            let due = |w: &Watcher| !w.synced && (need.from..=seen).contains(&w.next_rev);
            for (id, w) in sink.watchers.iter_mut().filter(|(_, w)| due(w)) {
                let before = (w.next_rev, w.quiet);
                let mine = shares.part(w);
                w.quiet &= mine.is_none();
                w.next_rev = seen + 1;
                w.synced = seen >= need.to && seen >= notified;
                match mine {
                    Some(mine) => {
                        let shared = shares.is_shared(&mine);
                        groups.join(mine, *id, before, shared);
                    }
                    None => moved = true,
                }
            }
            match sink.hand_out(&mut groups, seen, buffer) {
                Some(delivered) => {
                    moved |= delivered;
                    true
                }
                None => false,
            }
        });
        self.recount();
        moved
    }

    /// Whether some watcher is lagging (catching up from history).
    pub(crate) fn any_lagging(&self) -> bool {
        self.sinks.values().any(|s| s.watchers.values().any(|w| !w.synced))
    }

    /// Every watcher catches up from history again (the state was replaced by a snapshot:
    /// what it will be notified of next may not follow what it saw).
    pub(crate) fn unsync_all(&mut self) {
        for w in self.all() {
            w.synced = false;
        }
    }

    /// Whether every watcher of `sink` has been handed every revision up to `current`
    /// (synced, and nothing older still queued). A sink without watchers counts as caught up.
    pub(crate) fn caught_up(&self, sink: u64, current: i64) -> bool {
        self.sinks
            .get(&sink)
            .is_none_or(|s| s.tx.is_empty() && s.watchers.values().all(|w| w.synced && w.next_rev > current))
    }

    /// The periodic progress tick: each synced watcher that asked for progress notifications
    /// and was sent nothing since the last tick is told it has seen everything up to
    /// `current`. A full sink skips the notice (its watchers have news queued anyway).
    pub(crate) fn progress(&mut self, current: i64) {
        let buffer = self.buffer;
        for sink in self.sinks.values_mut() {
            let mut told = Vec::new();
            for (id, w) in sink.watchers.iter_mut().filter(|(_, w)| w.progress_notify) {
                if w.quiet && w.synced && w.next_rev > current {
                    told.push(*id);
                }
                w.quiet = true;
            }
            if !told.is_empty() {
                let notice = Delivery {
                    watchers: told,
                    response: WatchResponse::Progress { revision: current },
                };
                let _ = sink.send(notice, buffer);
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.sinks.values().map(|s| s.watchers.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    // Test code: a panic is a test failure, with the message to debug it.
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use bytes::Bytes;

    use super::*;
    use crate::mvcc::store::KeyValue;

    fn put(revision: i64) -> Event {
        Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key: Bytes::from_static(b"k"),
                create_revision: 2,
                mod_revision: revision,
                version: revision - 1,
                value: Bytes::from(revision.to_string()),
                lease: 0,
            },
            prev_kv: None,
        }
    }

    /// A watch of `key` alone.
    fn on(key: &[u8], prev_kv: bool) -> WatchRequest {
        WatchRequest {
            key: key.to_vec(),
            prev_kv,
            ..WatchRequest::default()
        }
    }

    /// A put of "k" at `revision` that carries its previous value.
    fn put_over(revision: i64) -> Event {
        Event {
            prev_kv: Some(put(revision - 1).kv),
            ..put(revision)
        }
    }

    /// A sink of one watcher: what it receives.
    fn alone(hub: &mut WatchHub, request: &WatchRequest, current: i64) -> Receiver<Delivery> {
        let (sink, rx) = hub.sink(None);
        hub.watch(sink, request, current, 0);
        rx
    }

    fn watch_k(hub: &mut WatchHub, start: i64, current: i64) -> Receiver<Delivery> {
        let request = WatchRequest {
            key: b"k".to_vec(),
            start_revision: start,
            ..WatchRequest::default()
        };
        alone(hub, &request, current)
    }

    /// The revisions of every event queued for a watcher, and the revision of each response.
    fn received(rx: &Receiver<Delivery>) -> (Vec<i64>, Vec<i64>) {
        let (mut events, mut responses) = (Vec::new(), Vec::new());
        while let Ok(d) = rx.try_recv() {
            let WatchResponse::Events { events: e, revision } = d.response else {
                panic!("{d:?}")
            };
            events.extend(e.iter().map(|e| e.kv.mod_revision));
            responses.push(revision);
        }
        (events, responses)
    }

    #[test]
    fn a_dropped_revision_sends_the_watchers_due_it_to_history() {
        let mut hub = WatchHub::new(16, 100);
        let rx = watch_k(&mut hub, 0, 10);
        assert_eq!(hub.lagging(10, 0), None, "a new watcher is synced");
        hub.notify(11, &[put(11)]);
        assert_eq!(received(&rx), (vec![11], vec![11]));
        // 12 never reached the hub (the apply thread's queue was full).
        hub.notify(13, &[put(13)]);
        assert_eq!(received(&rx), (vec![], vec![]), "13 is not sent before 12");
        let need = hub.lagging(13, 0).expect("the watcher lags");
        assert_eq!(
            need,
            CatchUp {
                from: 12,
                to: 13,
                with_prev: false
            }
        );
        assert!(hub.deliver_history(need, &[put(12), put(13)], 13));
        assert_eq!(received(&rx), (vec![12, 13], vec![13]));
        assert!(!hub.any_lagging());
        hub.notify(14, &[put(14)]);
        assert_eq!(received(&rx), (vec![14], vec![14]), "synced again");
    }

    #[test]
    fn a_watcher_reading_history_is_not_synced_past_what_was_handed_out_meanwhile() {
        let mut hub = WatchHub::new(16, 100);
        let rx = watch_k(&mut hub, 5, 10);
        let need = hub.lagging(10, 0).expect("it starts in the past");
        assert_eq!(
            need,
            CatchUp {
                from: 5,
                to: 10,
                with_prev: false
            }
        );
        // Revision 11 is applied and handed out while history is read without the hub's lock.
        hub.notify(11, &[put(11)]);
        let history: Vec<Event> = (5..=10).map(put).collect();
        assert!(hub.deliver_history(need, &history, 10));
        assert_eq!(received(&rx), ((5..=10).collect(), vec![10]));
        assert!(hub.any_lagging(), "it missed 11");
        let need = hub.lagging(11, 0).expect("still lagging");
        assert_eq!(need.from, 11);
        assert!(hub.deliver_history(need, &[put(11)], 11));
        hub.notify(12, &[put(12)]);
        assert_eq!(received(&rx), (vec![11, 12], vec![11, 12]), "each once, in order");
        assert!(!hub.any_lagging());
    }

    #[test]
    fn a_short_batch_does_not_sync_a_watcher() {
        let mut hub = WatchHub::new(16, 2);
        let rx = watch_k(&mut hub, 1, 4);
        let need = hub.lagging(4, 0).unwrap();
        // The batch stopped at revision 2 of 4.
        assert!(hub.deliver_history(need, &[put(1), put(2)], 2));
        assert!(hub.any_lagging());
        let need = hub.lagging(4, 0).unwrap();
        assert_eq!(need.from, 3);
        assert!(hub.deliver_history(need, &[put(3), put(4)], 4));
        assert!(!hub.any_lagging());
        assert_eq!(received(&rx), (vec![1, 2, 3, 4], vec![2, 4]));
    }

    #[test]
    fn watchers_taking_the_same_events_share_one_copy() {
        // Two plain watchers and one with prev_kv on "k"; a put of "k" with its previous value.
        let mut hub = WatchHub::new(16, 100);
        let plain: Vec<_> = (0..2).map(|_| alone(&mut hub, &on(b"k", false), 1)).collect();
        let with_prev = alone(&mut hub, &on(b"k", true), 1);
        let other = alone(&mut hub, &on(b"x", false), 1);
        hub.notify(2, &[put_over(2)]);
        let got = |rx: &Receiver<Delivery>| match rx.try_recv().map(|d| d.response) {
            Ok(WatchResponse::Events { events, .. }) => events,
            other => panic!("{other:?}"),
        };
        let (a, b, p) = (got(&plain[0]), got(&plain[1]), got(&with_prev));
        assert!(Arc::ptr_eq(&a, &b), "the plain watchers share their events");
        assert!(
            a[0].prev_kv.is_none(),
            "without the previous value they did not ask for"
        );
        assert_eq!(p[0].prev_kv.as_ref().map(|kv| kv.mod_revision), Some(1));
        assert!(other.try_recv().is_err(), "a watcher of another key gets nothing");
    }

    /// A sink's deliveries: (the watchers named, the revisions of the events) each.
    fn deliveries(rx: &Receiver<Delivery>) -> Vec<(Vec<u64>, Vec<i64>)> {
        rx.try_iter()
            .map(|d| match d.response {
                WatchResponse::Events { events, .. } => {
                    (d.watchers, events.iter().map(|e| e.kv.mod_revision).collect())
                }
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_sink_gets_one_delivery_per_share_naming_its_watchers() {
        let mut hub = WatchHub::new(16, 100);
        let (sink, rx) = hub.sink(None);
        let a = hub.watch(sink, &on(b"k", false), 1, 0);
        let b = hub.watch(sink, &on(b"k", false), 1, 0);
        let p = hub.watch(sink, &on(b"k", true), 1, 0);
        let x = hub.watch(sink, &on(b"x", false), 1, 0);
        hub.notify(2, &[put_over(2)]);
        let got = deliveries(&rx);
        // The plain watchers share a delivery; the one with previous values gets its own.
        assert_eq!(got, vec![(vec![a, b], vec![2]), (vec![p], vec![2])]);
        hub.cancel(sink, b);
        hub.notify(3, &[put(3)]);
        assert_eq!(
            deliveries(&rx),
            vec![(vec![a, p], vec![3])],
            "{x} takes nothing; {b} is gone"
        );
        // A revision of two keys: the watchers of "k" share the whole of it only if they take
        // all of it; the watcher of "x" takes a part of its own.
        let mut of_x = put(4);
        of_x.kv.key = Bytes::from_static(b"x");
        hub.notify(4, &[put(4), of_x]);
        let got: Vec<(Vec<u64>, usize)> = rx
            .try_iter()
            .map(|d| match d.response {
                WatchResponse::Events { events, .. } => (d.watchers, events.len()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![(vec![a], 1), (vec![p], 1), (vec![x], 1)],
            "three parts, one each"
        );
    }

    #[test]
    fn a_full_sink_unsyncs_the_watchers_of_the_revision_it_refused_and_they_catch_up_together() {
        // A buffer of 2 per watcher, two watchers: four deliveries fit.
        let mut hub = WatchHub::new(2, 100);
        let (sink, rx) = hub.sink(None);
        let k = on(b"k", false);
        let (a, b) = (hub.watch(sink, &k, 1, 0), hub.watch(sink, &k, 1, 0));
        for r in 2..=7 {
            hub.notify(r, &[put(r)]);
        }
        assert!(hub.any_lagging());
        assert!(!hub.caught_up(sink, 7));
        let live = deliveries(&rx);
        assert_eq!(live, (2..=5).map(|r| (vec![a, b], vec![r])).collect::<Vec<_>>());
        let need = hub.lagging(7, 0).expect("both lag");
        assert_eq!(need.from, 6, "both missed 6 and 7");
        assert!(hub.deliver_history(need, &[put(6), put(7)], 7));
        assert_eq!(deliveries(&rx), vec![(vec![a, b], vec![6, 7])], "one catch-up delivery");
        assert!(!hub.any_lagging());
        assert!(hub.caught_up(sink, 7));
        hub.notify(8, &[put(8)]);
        assert_eq!(deliveries(&rx), vec![(vec![a, b], vec![8])], "synced again");
    }

    #[test]
    fn a_full_sink_makes_no_catch_up_progress() {
        let mut hub = WatchHub::new(1, 100);
        let rx = watch_k(&mut hub, 0, 1);
        hub.notify(2, &[put(2)]);
        hub.notify(3, &[put(3)]);
        let need = hub.lagging(3, 0).expect("3 did not fit");
        assert!(!hub.deliver_history(need, &[put(3)], 3), "the sink is still full");
        assert_eq!(received(&rx), (vec![2], vec![2]));
        let need = hub.lagging(3, 0).expect("still lagging");
        assert!(hub.deliver_history(need, &[put(3)], 3));
        assert_eq!(received(&rx), (vec![3], vec![3]));
    }

    #[test]
    fn a_dropped_sink_takes_its_watchers_and_a_gone_receiver_drops_the_sink() {
        let mut hub = WatchHub::new(16, 100);
        let (sink, _rx) = hub.sink(None);
        let k = on(b"k", false);
        hub.watch(sink, &k, 1, 0);
        hub.watch(sink, &k, 1, 0);
        let gone = watch_k(&mut hub, 0, 1);
        assert_eq!(hub.len(), 3);
        hub.drop_sink(sink);
        assert_eq!(hub.len(), 1);
        drop(gone);
        hub.notify(2, &[put(2)]);
        assert_eq!(hub.len(), 0);
        assert_eq!(hub.count.load(Ordering::Relaxed), 0);
    }
}
