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

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;

use cairn_engine::{WatchGroup, WatchResponse as EngineResponse};
use tokio::sync::Notify;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::convert;
use crate::node::Node;
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
    pub fn new(node: Arc<Node>) -> WatchService {
        WatchService { node }
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<WireResponse, Status>> + Send>>;

#[tonic::async_trait]
impl WatchApi for WatchService {
    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<Streaming<pb::WatchRequest>>) -> Result<Response<WatchStream>, Status> {
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
                by_engine_id: HashMap::new(),
                next_id: 0,
                wake,
                progress_wanted: false,
            };
            s.run(requests).await;
        });
        let stream: WatchStream = Box::pin(Batches {
            rx,
            pending: Vec::new().into_iter(),
        });
        Ok(Response::new(stream))
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

/// One watcher of a stream.
struct Watcher {
    /// The ID the engine's deliveries name it by.
    engine_id: u64,
    fragment: bool,
}

/// One client stream.
struct StreamState {
    node: Arc<Node>,
    tx: tokio::sync::mpsc::Sender<Result<Vec<WireResponse>, Status>>,
    /// Every watcher of the stream, in the engine.
    group: WatchGroup,
    /// By the watch ID the client knows.
    watchers: BTreeMap<i64, Watcher>,
    /// The client's watch ID of each engine watcher.
    by_engine_id: HashMap<u64, i64>,
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
                let Some(w) = self.watchers.remove(&cancel.watch_id) else {
                    return true; // unknown: etcd says nothing
                };
                self.group.cancel(w.engine_id);
                self.by_engine_id.remove(&w.engine_id);
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
            let response = refuse(EMPTY_RANGE);
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
        let engine_id = match self.node.engine.watch_in(&self.group, &request) {
            Ok(engine_id) => engine_id,
            Err(e) => {
                let _ = self.tx.send(Err(crate::errors::status(&e))).await;
                return false;
            }
        };
        if create.watch_id == 0 {
            self.next_id += 1;
        }
        self.watchers.insert(
            id,
            Watcher {
                engine_id,
                fragment: create.fragment,
            },
        );
        self.by_engine_id.insert(engine_id, id);
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
        let mut queued: BTreeMap<i64, Vec<WireResponse>> = BTreeMap::new();
        let mut cancelled = Vec::new();
        while let Some(delivery) = self.group.try_recv() {
            // Encoded once, for every watcher it names that takes it whole.
            let mut encoded = None;
            for engine_id in &delivery.watchers {
                // A watcher cancelled since the delivery was queued gets nothing more.
                let Some(&id) = self.by_engine_id.get(engine_id) else {
                    continue;
                };
                let fragment = self.watchers.get(&id).is_some_and(|w| w.fragment);
                let out = queued.entry(id).or_default();
                match &delivery.response {
                    EngineResponse::Events { events, revision } if fragment => {
                        let header = Some(self.node.header(*revision));
                        let parts = cairn_engine::fragment_events(events.to_vec(), FRAGMENT_BYTES);
                        let count = parts.len();
                        for (i, part) in parts.into_iter().enumerate() {
                            out.push(WireResponse::Message(pb::WatchResponse {
                                header,
                                watch_id: id,
                                fragment: i + 1 < count,
                                events: part.into_iter().map(convert::event).collect(),
                                ..pb::WatchResponse::default()
                            }));
                        }
                    }
                    EngineResponse::Events { events, revision } => {
                        let bytes = encoded.get_or_insert_with(|| wire::encode_events(events));
                        out.push(WireResponse::Events {
                            header: self.node.header(*revision),
                            watch_id: id,
                            events: smallvec::smallvec![bytes.clone()],
                        });
                    }
                    EngineResponse::Progress { revision } => out.push(WireResponse::Message(pb::WatchResponse {
                        header: Some(self.node.header(*revision)),
                        watch_id: id,
                        ..pb::WatchResponse::default()
                    })),
                    EngineResponse::Compacted { compact_revision } => {
                        // As etcd: no revision in the header and no reason (clients read the
                        // compact revision).
                        out.push(WireResponse::Message(pb::WatchResponse {
                            header: Some(self.node.header(0)),
                            watch_id: id,
                            canceled: true,
                            compact_revision: *compact_revision,
                            ..pb::WatchResponse::default()
                        }));
                        cancelled.push(id);
                    }
                }
            }
        }
        for id in cancelled {
            if let Some(w) = self.watchers.remove(&id) {
                self.by_engine_id.remove(&w.engine_id);
            }
        }
        let out: Vec<WireResponse> = queued.into_values().flat_map(coalesce).collect();
        if !out.is_empty() && !self.send_batch(out).await {
            return false;
        }
        if self.progress_wanted {
            if let Some(revision) = self.node.engine.watch_progress(&self.group) {
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

/// The most bytes of events [`coalesce`] puts in one response (a run longer than this goes out
/// as several).
const COALESCE_BYTES: usize = FRAGMENT_BYTES;

/// A watcher's queued responses, in order; each run of two or more responses of events becomes
/// one response carrying all its revisions' events (with the last one's header), as a catch-up
/// from history does, up to [`COALESCE_BYTES`] each. A run forms only when the stream fell
/// behind its watchers (the revisions came faster than it sent them), so merging delays
/// nothing, and fewer, larger messages are cheaper to send and to decode; a stream that keeps
/// up sends one response per revision, as etcd's. Progress notices, cancellations and
/// fragmented responses are never merged.
fn coalesce(queued: Vec<WireResponse>) -> Vec<WireResponse> {
    if queued.len() < 2 {
        return queued;
    }
    let mut out: Vec<WireResponse> = Vec::with_capacity(queued.len());
    // The response being merged into, and the bytes of events it carries.
    let mut merging: Option<(WireResponse, usize)> = None;
    for r in queued {
        let WireResponse::Events {
            header,
            watch_id,
            events,
        } = r
        else {
            out.extend(merging.take().map(|(m, _)| m));
            out.push(r);
            continue;
        };
        let size: usize = events.iter().map(bytes::Bytes::len).sum();
        match &mut merging {
            Some((
                WireResponse::Events {
                    header: last,
                    events: merged,
                    ..
                },
                carried,
            )) if *carried + size <= COALESCE_BYTES => {
                *last = header;
                merged.extend(events);
                *carried += size;
            }
            _ => {
                out.extend(merging.take().map(|(m, _)| m));
                merging = Some((
                    WireResponse::Events {
                        header,
                        watch_id,
                        events,
                    },
                    size,
                ));
            }
        }
    }
    out.extend(merging.map(|(m, _)| m));
    out
}

#[cfg(test)]
mod tests {
    // Test code: a panic is a test failure, with the message to debug it.
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use cairn_engine::{Event, EventKind, KeyValue};
    use prost::Message;

    use super::*;

    fn header(revision: i64) -> pb::ResponseHeader {
        pb::ResponseHeader {
            revision,
            ..pb::ResponseHeader::default()
        }
    }

    fn events_at(revision: i64) -> WireResponse {
        let event = Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key: bytes::Bytes::from_static(b"k"),
                create_revision: 2,
                mod_revision: revision,
                version: 1,
                value: bytes::Bytes::new(),
                lease: 0,
            },
            prev_kv: None,
        };
        WireResponse::Events {
            header: header(revision),
            watch_id: 1,
            events: smallvec::smallvec![wire::encode_events(&[event])],
        }
    }

    fn progress(revision: i64) -> WireResponse {
        WireResponse::Message(pb::WatchResponse {
            header: Some(header(revision)),
            watch_id: 1,
            ..pb::WatchResponse::default()
        })
    }

    /// Each response as a client decodes it: (the revisions of its events, its header's
    /// revision).
    fn shape(responses: &[WireResponse]) -> Vec<(Vec<i64>, i64)> {
        responses
            .iter()
            .map(|r| {
                let decoded = pb::WatchResponse::decode(r.encode_to_vec().as_slice()).unwrap();
                let revisions = decoded.events.iter().map(|e| e.kv.as_ref().unwrap().mod_revision);
                (revisions.collect(), decoded.header.unwrap().revision)
            })
            .collect()
    }

    #[test]
    fn a_stream_behind_gets_runs_of_revisions_in_one_response_and_one_keeping_up_does_not() {
        let one = vec![events_at(2)];
        assert_eq!(shape(&coalesce(one.clone())), shape(&one), "kept as it was");
        let mut many: Vec<WireResponse> = (2..12).map(events_at).collect();
        many.push(progress(11));
        many.extend((12..14).map(events_at));
        many.push(progress(13));
        many.push(events_at(14));
        assert_eq!(
            shape(&coalesce(many)),
            vec![
                ((2..12).collect(), 11),
                (vec![], 11),
                (vec![12, 13], 13),
                (vec![], 13),
                (vec![14], 14)
            ],
            "runs merged, in order; progress notices and a lone revision untouched"
        );
    }

    #[test]
    fn a_merged_response_carries_at_most_coalesce_bytes_of_events() {
        use bytes::Bytes;

        let big = |revision: i64| {
            let WireResponse::Events { header, watch_id, .. } = events_at(revision) else {
                unreachable!()
            };
            WireResponse::Events {
                header,
                watch_id,
                events: smallvec::smallvec![Bytes::from(vec![0u8; COALESCE_BYTES / 3 + 1])],
            }
        };
        let merged = coalesce((2..9).map(big).collect());
        let sizes: Vec<Vec<usize>> = merged
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
}
