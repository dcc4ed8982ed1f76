//! The Watch service: one bidirectional stream multiplexes many watchers, as etcd's does.
//!
//! Each stream is one task with one [`WatchGroup`] in the engine for all its watchers. It
//! creates and cancels watchers as the client asks, and waits for either the client's next
//! request or a wake-up from the engine (the group has deliveries queued); then it drains the
//! group's queue into the stream. A revision taken alike by many of the stream's watchers is
//! one delivery naming them all, so it costs one queue operation and one encoding, however
//! many watchers it goes to; each gets its own response, in its [`wire`] form. A client slower
//! than the writes fills the group's bounded queue, and its watchers stop being fed and catch
//! up from history later: writers never wait for a watcher.

pub mod wire;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use cairn_engine::{WatchGroup, WatchResponse as EngineResponse};
use tokio::sync::Notify;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::api::convert;
use crate::api::node::Node;
use crate::pb::etcdserverpb as pb;
use crate::pb::watch_wire::watch_server::Watch as WatchApi;
use wire::WireResponse;

/// The reason a watch on an empty range is refused (etcd's text).
const EMPTY_RANGE: &str = "mvcc: watcher range is empty";
/// The reason a watch ID already in use on the stream is refused.
const DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";
/// How often a waiting progress request looks again at whether every watcher caught up.
const PROGRESS_RECHECK: std::time::Duration = std::time::Duration::from_millis(10);
/// The watch ID of a response to a progress request, and of a refused duplicate (etcd's
/// `InvalidWatchID`).
const PROGRESS_ID: i64 = -1;
/// Largest events response when the client asked for fragments (etcd's default
/// `--max-request-bytes` plus its gRPC overhead allowance).
const FRAGMENT_BYTES: usize = (1536 << 10) + (512 << 10);

/// The Watch service over a [`Node`].
#[derive(Debug, Clone)]
pub struct WatchService {
    node: Arc<Node>,
}

impl WatchService {
    /// The service for `node`, served with [`crate::pb::watch_wire`]'s server, which sends
    /// its [`WireResponse`]s as they are; each stream it serves is a task of its own.
    pub fn new(node: Arc<Node>) -> WatchService {
        WatchService { node }
    }
}

type WatchStream = super::ResponseStream<WireResponse>;

#[tonic::async_trait]
impl WatchApi for WatchService {
    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<Streaming<pb::WatchRequest>>) -> Result<Response<WatchStream>, Status> {
        let metadata = request.metadata().clone();
        // Who created the stream: each watch it creates is checked against the auth store
        // of that moment, as etcd checks them.
        let identity = (metadata.clone(), request.extensions().clone());
        let requests = request.into_inner();
        let node = self.node.clone();
        // Responses go to the transport a drain at a time: one hand-off per batch, not per
        // response. Two batches in flight bound what a slow client makes the stream hold.
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move {
            let wake = Arc::new(Notify::new());
            let signal = wake.clone();
            let group = node.engine.watch_group(Some(Arc::new(move || signal.notify_one())));
            let mut s = StreamState {
                node,
                tx,
                group,
                watchers: BTreeMap::new(),
                routes: BTreeMap::new(),
                drains: 0,
                next_id: 0,
                wake,
                progress_wanted: false,
                identity,
            };
            s.run(requests).await;
        });
        let stream: WatchStream = Box::pin(Batches {
            rx,
            pending: Vec::new().into_iter(),
        });
        Ok(Response::new(super::leader_bound(&self.node, &metadata, stream)))
    }
}

/// The response stream: the batches a stream's task sends, a response at a time.
struct Batches {
    rx: tokio::sync::mpsc::Receiver<Result<Vec<WireResponse>, Status>>,
    pending: std::vec::IntoIter<WireResponse>,
}

impl Stream for Batches {
    type Item = Result<WireResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Self::Item>> {
        loop {
            if let Some(response) = self.pending.next() {
                return std::task::Poll::Ready(Some(Ok(response)));
            }
            match std::task::ready!(self.rx.poll_recv(cx)) {
                Some(Ok(batch)) => self.pending = batch.into_iter(),
                Some(Err(status)) => return std::task::Poll::Ready(Some(Err(status))),
                None => return std::task::Poll::Ready(None),
            }
        }
    }
}

/// Where the engine's deliveries for one watcher go.
#[derive(Debug)]
struct Route {
    /// The watch ID the client knows.
    id: i64,
    fragment: bool,
    /// The watcher's response of events still open to more revisions.
    open: Option<OpenResponse>,
}

/// A response of events in a drain's batch that later revisions may still join.
#[derive(Debug, Clone, Copy)]
struct OpenResponse {
    /// The drain it was made in.
    drain: u64,
    /// Its place in that drain's batch.
    at: usize,
    /// The bytes of events it carries.
    carried: usize,
}

/// One client stream.
struct StreamState {
    node: Arc<Node>,
    /// The stream's metadata (its token) and connection (its certificate).
    identity: (tonic::metadata::MetadataMap, tonic::Extensions),
    tx: tokio::sync::mpsc::Sender<Result<Vec<WireResponse>, Status>>,
    /// Every watcher of the stream, in the engine.
    group: WatchGroup,
    /// The engine's ID of each watcher, by the watch ID the client knows.
    watchers: BTreeMap<i64, u64>,
    /// Each watcher's route, by the engine's ID (what deliveries name).
    routes: BTreeMap<u64, Route>,
    /// Drains so far.
    drains: u64,
    /// The next watch ID the server picks (etcd starts at 0).
    next_id: i64,
    /// Signalled by the engine when the group has deliveries queued.
    wake: Arc<Notify>,
    /// A progress request waits until every watcher has caught up.
    progress_wanted: bool,
}

impl StreamState {
    async fn run(&mut self, mut requests: Streaming<pb::WatchRequest>) {
        loop {
            let wake = self.wake.clone();
            tokio::select! {
                next = requests.next() => match next {
                    Some(Ok(request)) => {
                        if !self.handle(request).await {
                            return;
                        }
                    }
                    // The client closed the stream, or it broke: the watchers go with it.
                    Some(Err(_)) | None => return,
                },
                () = wake.notified() => {}
                // A progress request waits for watchers that catch up without sending anything.
                () = tokio::time::sleep(PROGRESS_RECHECK), if self.progress_wanted => {}
            }
            if !self.drain().await {
                return;
            }
        }
    }

    async fn send(&self, response: pb::WatchResponse) -> bool {
        self.send_wire(WireResponse::Message(response)).await
    }

    async fn send_wire(&self, response: WireResponse) -> bool {
        self.send_batch(vec![response]).await
    }

    async fn send_batch(&self, responses: Vec<WireResponse>) -> bool {
        self.tx.send(Ok(responses)).await.is_ok()
    }

    fn header(&self, revision: i64) -> Option<pb::ResponseHeader> {
        Some(self.node.header(revision))
    }

    /// Handles one client request; false once the client is gone.
    async fn handle(&mut self, request: pb::WatchRequest) -> bool {
        use pb::watch_request::RequestUnion;
        match request.request_union {
            Some(RequestUnion::CreateRequest(create)) => self.create(create).await,
            Some(RequestUnion::CancelRequest(cancel)) => {
                let Some(engine_id) = self.watchers.remove(&cancel.watch_id) else {
                    return true; // unknown: etcd says nothing
                };
                self.group.cancel(engine_id);
                self.routes.remove(&engine_id);
                let response = pb::WatchResponse {
                    header: self.header(self.node.engine.current_revision()),
                    watch_id: cancel.watch_id,
                    canceled: true,
                    ..pb::WatchResponse::default()
                };
                self.send(response).await
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                self.progress_wanted = true;
                true
            }
            None => true,
        }
    }

    /// Whether the stream's caller may read what `create` watches (an empty key is `"\0"`,
    /// the first key, as in etcd).
    async fn permitted(&self, create: &pb::WatchCreateRequest) -> Result<(), Status> {
        let (metadata, extensions) = &self.identity;
        let engine = &self.node.engine;
        let caller = crate::api::access::caller_of(engine, &self.node.access, metadata, extensions).await?;
        let key: &[u8] = if create.key.is_empty() { &[0] } else { &create.key };
        crate::api::access::check(
            engine,
            caller.as_ref(),
            &[crate::api::access::Need::Read(key, &create.range_end)],
        )
    }

    async fn create(&mut self, create: pb::WatchCreateRequest) -> bool {
        use pb::watch_create_request::FilterType;
        let id = if create.watch_id != 0 {
            create.watch_id
        } else {
            while self.watchers.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id
        };
        let current = self.node.engine.current_revision();
        let refuse = |reason: &str| pb::WatchResponse {
            header: Some(self.node.header(current)),
            watch_id: id,
            created: true,
            canceled: true,
            cancel_reason: reason.to_string(),
            ..pb::WatchResponse::default()
        };
        if let Err(status) = self.permitted(&create).await {
            // etcd 3.6+ answers with the invalid watch ID, and the gRPC error's text (Go's
            // rendering of a status) as the reason.
            let reason = format!("rpc error: code = {:?} desc = {}", status.code(), status.message());
            let response = pb::WatchResponse {
                watch_id: PROGRESS_ID,
                ..refuse(&reason)
            };
            return self.send(response).await;
        }
        if self.watchers.contains_key(&id) {
            // etcd answers a duplicate with the invalid watch ID, not the one asked for.
            let response = pb::WatchResponse {
                watch_id: PROGRESS_ID,
                ..refuse(DUPLICATE_ID)
            };
            return self.send(response).await;
        }
        // etcd: an empty range end is the key alone, "\0" every key from it on; an end at or
        // before the key is an empty range.
        let all_from = create.range_end.as_ref() == [0];
        if !create.range_end.is_empty() && !all_from && create.key >= create.range_end {
            // etcd answers with the invalid watch ID here too.
            let response = pb::WatchResponse {
                watch_id: PROGRESS_ID,
                ..refuse(EMPTY_RANGE)
            };
            return self.send(response).await;
        }
        let filters: Vec<FilterType> = create
            .filters
            .iter()
            .filter_map(|f| FilterType::try_from(*f).ok())
            .collect();
        let request = cairn_engine::WatchRequest {
            key: create.key.to_vec(),
            range_end: create.range_end.to_vec(),
            start_revision: create.start_revision,
            prev_kv: create.prev_kv,
            no_put: filters.contains(&FilterType::Noput),
            no_delete: filters.contains(&FilterType::Nodelete),
            progress_notify: create.progress_notify,
        };
        let engine_id = match self.group.watch(&request) {
            Ok(engine_id) => engine_id,
            Err(e) => {
                let _ = self.tx.send(Err(crate::errors::status(&e))).await;
                return false;
            }
        };
        if create.watch_id == 0 {
            self.next_id += 1;
        }
        self.watchers.insert(id, engine_id);
        self.routes.insert(
            engine_id,
            Route {
                id,
                fragment: create.fragment,
                open: None,
            },
        );
        let created = pb::WatchResponse {
            header: Some(self.node.header(current)),
            watch_id: id,
            created: true,
            ..pb::WatchResponse::default()
        };
        self.send(created).await
    }

    /// Sends what the group has queued, each watcher's responses in order, then answers a
    /// waiting progress request if every watcher has caught up; false once the client is gone.
    async fn drain(&mut self) -> bool {
        self.drains += 1;
        let mut batch = Batch {
            // A drain answers each watcher about once: one response each when the stream
            // keeps up, one run each when it fell behind.
            out: Vec::with_capacity(self.routes.len()),
            drain: self.drains,
        };
        let mut cancelled = Vec::new();
        while let Some(delivery) = self.group.try_recv() {
            // Routes of watchers cancelled since the delivery was queued are gone: they get
            // nothing more.
            let routes = named(&mut self.routes, &delivery.watchers);
            match delivery.response {
                EngineResponse::Events { events, revision } => {
                    let header = self.node.header(revision);
                    // Encoded once, for every watcher it names that takes it whole.
                    let mut encoded = None;
                    for route in routes {
                        if route.fragment {
                            let parts = cairn_engine::fragment_events(events.to_vec(), FRAGMENT_BYTES);
                            let count = parts.len();
                            for (i, part) in parts.into_iter().enumerate() {
                                let response = pb::WatchResponse {
                                    header: Some(header),
                                    watch_id: route.id,
                                    fragment: i + 1 < count,
                                    events: part.into_iter().map(convert::event).collect(),
                                    ..pb::WatchResponse::default()
                                };
                                batch.message(route, response);
                            }
                        } else {
                            let bytes = encoded.get_or_insert_with(|| wire::encode_events(&events));
                            batch.events(route, header, bytes);
                        }
                    }
                }
                EngineResponse::Progress { revision } => {
                    let header = Some(self.node.header(revision));
                    for route in routes {
                        let response = pb::WatchResponse {
                            header,
                            watch_id: route.id,
                            ..pb::WatchResponse::default()
                        };
                        batch.message(route, response);
                    }
                }
                EngineResponse::Compacted { compact_revision } => {
                    // As etcd: no revision in the header and no reason (clients read the
                    // compact revision).
                    let header = Some(self.node.header(0));
                    for route in routes {
                        let response = pb::WatchResponse {
                            header,
                            watch_id: route.id,
                            canceled: true,
                            compact_revision,
                            ..pb::WatchResponse::default()
                        };
                        batch.message(route, response);
                        cancelled.push(route.id);
                    }
                }
            }
        }
        for id in cancelled {
            if let Some(engine_id) = self.watchers.remove(&id) {
                self.routes.remove(&engine_id);
            }
        }
        if !batch.out.is_empty() && !self.send_batch(batch.out).await {
            return false;
        }
        if self.progress_wanted {
            if let Some(revision) = self.group.progress() {
                self.progress_wanted = false;
                let response = pb::WatchResponse {
                    header: Some(self.node.header(revision)),
                    watch_id: PROGRESS_ID,
                    ..pb::WatchResponse::default()
                };
                return self.send(response).await;
            }
        }
        true
    }
}

/// The routes of the watchers `ids` names (ascending, as a delivery names them), found in one
/// walk over the routes between the first and the last.
fn named<'a>(routes: &'a mut BTreeMap<u64, Route>, ids: &'a [u64]) -> impl Iterator<Item = &'a mut Route> + 'a {
    let first = ids.first().copied().unwrap_or(0);
    let last = ids.last().copied().unwrap_or(0).max(first);
    let mut wanted = ids.iter().peekable();
    routes.range_mut(first..=last).filter_map(move |(id, route)| {
        while wanted.next_if(|&&w| w < *id).is_some() {}
        wanted.next_if(|&&w| w == *id).map(|_| route)
    })
}

/// The most bytes of events one response carries when a watcher's revisions are merged (a run
/// longer than this goes out as several).
const COALESCE_BYTES: usize = FRAGMENT_BYTES;

/// The responses of one drain, in order. A watcher's revisions queued one after another go as
/// one response carrying all their events (with the last one's header), as a catch-up from
/// history does, up to [`COALESCE_BYTES`] each. Revisions queue up only when the stream fell
/// behind its watchers (they came faster than it sent them), so merging delays nothing, and
/// fewer, larger messages are cheaper to send and to decode; a stream that keeps up sends one
/// response per revision, as etcd's. Progress notices, cancellations and fragmented responses
/// are never merged, nor merged across.
struct Batch {
    out: Vec<WireResponse>,
    drain: u64,
}

impl Batch {
    /// Events of one revision (encoded) for the watcher of `route`.
    fn events(&mut self, route: &mut Route, header: pb::ResponseHeader, encoded: &bytes::Bytes) {
        let size = encoded.len();
        if let Some(open) = route.open.as_mut() {
            if open.drain == self.drain && open.carried + size <= COALESCE_BYTES {
                if let Some(WireResponse::Events {
                    header: last, events, ..
                }) = self.out.get_mut(open.at)
                {
                    *last = header;
                    if events.len() == events.capacity() {
                        // A run grows to many revisions at once when a stream fell behind:
                        // fewer, larger steps than doubling.
                        events.reserve(events.len() * 3);
                    }
                    events.push(encoded.clone());
                    open.carried += size;
                    return;
                }
            }
        }
        route.open = Some(OpenResponse {
            drain: self.drain,
            at: self.out.len(),
            carried: size,
        });
        self.out.push(WireResponse::Events {
            header,
            watch_id: route.id,
            events: smallvec::smallvec![encoded.clone()],
        });
    }

    /// Any other response for the watcher of `route`; what follows it is not merged into what
    /// went before.
    fn message(&mut self, route: &mut Route, response: pb::WatchResponse) {
        route.open = None;
        self.out.push(WireResponse::Message(response));
    }
}

#[cfg(test)]
mod tests {
    // Test code: a panic is a test failure, with the message to debug it.
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use bytes::Bytes;
    use cairn_engine::{Event, EventKind, KeyValue};
    use prost::Message;

    use super::*;

    fn header(revision: i64) -> pb::ResponseHeader {
        pb::ResponseHeader {
            revision,
            ..pb::ResponseHeader::default()
        }
    }

    fn encoded_at(revision: i64) -> Bytes {
        let event = Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key: Bytes::from_static(b"k"),
                create_revision: 2,
                mod_revision: revision,
                version: 1,
                value: Bytes::new(),
                lease: 0,
            },
            prev_kv: None,
        };
        wire::encode_events(&[event])
    }

    fn route(id: i64) -> Route {
        Route {
            id,
            fragment: false,
            open: None,
        }
    }

    fn progress(watch_id: i64, revision: i64) -> pb::WatchResponse {
        pb::WatchResponse {
            header: Some(header(revision)),
            watch_id,
            ..pb::WatchResponse::default()
        }
    }

    /// Each response as a client decodes it: (its watch ID, the revisions of its events, its
    /// header's revision).
    fn shape(responses: &[WireResponse]) -> Vec<(i64, Vec<i64>, i64)> {
        responses
            .iter()
            .map(|r| {
                let decoded = pb::WatchResponse::decode(r.encode_to_vec().as_slice()).unwrap();
                let revisions = decoded.events.iter().map(|e| e.kv.as_ref().unwrap().mod_revision);
                (decoded.watch_id, revisions.collect(), decoded.header.unwrap().revision)
            })
            .collect()
    }

    #[test]
    fn a_stream_behind_gets_runs_of_revisions_in_one_response_and_one_keeping_up_does_not() {
        let (mut a, mut b) = (route(1), route(2));
        let mut batch = Batch {
            out: Vec::new(),
            drain: 1,
        };
        batch.events(&mut a, header(2), &encoded_at(2));
        assert_eq!(shape(&batch.out), vec![(1, vec![2], 2)], "one revision, one response");
        // Two watchers, interleaved as deliveries name them; progress notices break a run.
        for r in 3..12 {
            batch.events(&mut a, header(r), &encoded_at(r));
            batch.events(&mut b, header(r), &encoded_at(r));
        }
        batch.message(&mut a, progress(1, 11));
        batch.events(&mut a, header(12), &encoded_at(12));
        batch.events(&mut a, header(13), &encoded_at(13));
        batch.events(&mut b, header(12), &encoded_at(12));
        assert_eq!(
            shape(&batch.out),
            vec![
                (1, (2..12).collect(), 11),
                (2, (3..13).collect(), 12),
                (1, vec![], 11),
                (1, vec![12, 13], 13),
            ],
            "each watcher's runs merged, in its order; the progress notice untouched"
        );
        // The next drain starts new responses.
        let mut next = Batch {
            out: Vec::new(),
            drain: 2,
        };
        next.events(&mut b, header(14), &encoded_at(14));
        assert_eq!(shape(&next.out), vec![(2, vec![14], 14)]);
    }

    #[test]
    fn a_merged_response_carries_at_most_coalesce_bytes_of_events() {
        let mut a = route(1);
        let mut batch = Batch {
            out: Vec::new(),
            drain: 1,
        };
        let big = Bytes::from(vec![0u8; COALESCE_BYTES / 3 + 1]);
        for r in 2..9 {
            batch.events(&mut a, header(r), &big);
        }
        let sizes: Vec<Vec<usize>> = batch
            .out
            .iter()
            .map(|r| match r {
                WireResponse::Events { events, .. } => events.iter().map(Bytes::len).collect(),
                WireResponse::Message(_) => vec![],
            })
            .collect();
        // Two fit under the cap, three do not: seven revisions go out as 2 + 2 + 2 + 1.
        assert_eq!(sizes.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2, 2, 1]);
        assert!(sizes.iter().all(|s| s.iter().sum::<usize>() <= COALESCE_BYTES));
    }

    #[test]
    fn a_delivery_reaches_the_routes_it_names_and_no_other() {
        let mut routes: BTreeMap<u64, Route> = [3, 5, 8, 9, 12]
            .into_iter()
            .map(|e| (e, route(e as i64 * 10)))
            .collect();
        let ids = |routes: &mut BTreeMap<u64, Route>, named: &[u64]| -> Vec<i64> {
            super::named(routes, named).map(|r| r.id).collect()
        };
        assert_eq!(ids(&mut routes, &[3, 5, 8, 9, 12]), vec![30, 50, 80, 90, 120]);
        assert_eq!(ids(&mut routes, &[5, 9]), vec![50, 90]);
        assert_eq!(ids(&mut routes, &[1, 4, 9, 13]), vec![90], "cancelled ones are skipped");
        assert_eq!(ids(&mut routes, &[12]), vec![120]);
        assert_eq!(ids(&mut routes, &[]), Vec::<i64>::new());
    }
}
