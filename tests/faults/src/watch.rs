//! Watchers, one on every member, on the workload's keys: each reconnects to its member
//! after an error from the revision after the last event it saw, as a client resuming a
//! watch does. Every connection's events are kept, to be checked against the history (a
//! recorder's, checked in turn against the members' once healed): strictly ordered, no gap
//! while connected, each event equal to the history's at its revision.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_server::pb::etcdserverpb::watch_client::WatchClient;
use cairn_server::pb::etcdserverpb::watch_request::RequestUnion;
use cairn_server::pb::etcdserverpb::{WatchCreateRequest, WatchRequest};
use cairn_server::pb::mvccpb::event::EventType;
use tonic::transport::Channel;

/// A change as a watcher sees it: a put's value, or `None` for a delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub revision: i64,
    pub key: String,
    pub value: Option<String>,
}

/// One connection of a watcher: the revision it asked to start at, and what it got.
#[derive(Debug, Default)]
pub struct Segment {
    pub from: i64,
    pub events: Vec<Event>,
}

/// The prefix's end: the key after every key that starts with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

/// Where a watch starts: the keys under `prefix`, from revision `from`.
#[derive(Debug, Clone, Copy)]
struct WatchStart<'a> {
    prefix: &'a str,
    from: i64,
}

/// Watches on `channel` from `start`, handing each event to `each` until it returns false,
/// the stream ends or fails, or `stop` is set (checked every half second).
async fn watch_once(channel: &Channel, start: WatchStart<'_>, stop: &AtomicBool, mut each: impl FnMut(Event) -> bool) {
    let WatchStart { prefix, from } = start;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: prefix.as_bytes().to_vec().into(),
            range_end: prefix_end(prefix).into(),
            start_revision: from,
            ..Default::default()
        })),
    };
    if tx.send(create).await.is_err() {
        return;
    }
    let mut client = WatchClient::new(channel.clone());
    let opened = tokio::time::timeout(
        Duration::from_secs(2),
        client.watch(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
    .await;
    let Ok(Ok(stream)) = opened else { return };
    let mut stream = stream.into_inner();
    while !stop.load(Ordering::Relaxed) {
        let message = match tokio::time::timeout(Duration::from_millis(500), stream.message()).await {
            Err(_) => continue,
            Ok(Ok(Some(message))) => message,
            Ok(_) => return,
        };
        if message.canceled {
            return;
        }
        for e in message.events {
            let Some(kv) = e.kv else { continue };
            let event = Event {
                revision: kv.mod_revision,
                key: String::from_utf8_lossy(&kv.key).into_owned(),
                value: (e.r#type != EventType::Delete as i32).then(|| String::from_utf8_lossy(&kv.value).into_owned()),
            };
            if !each(event) {
                return;
            }
        }
    }
}

/// A watcher on `channel`, reconnecting until `stop`: its connections. `seen` is the
/// revision of the last event it saw (the compactor stays at or below it).
pub async fn watcher(channel: Channel, prefix: String, stop: Arc<AtomicBool>, seen: Arc<AtomicI64>) -> Vec<Segment> {
    let mut segments = Vec::new();
    let mut next = 1;
    while !stop.load(Ordering::Relaxed) {
        let mut segment = Segment {
            from: next,
            events: Vec::new(),
        };
        let start = WatchStart {
            prefix: &prefix,
            from: next,
        };
        watch_once(&channel, start, &stop, |event| {
            next = event.revision + 1;
            seen.store(event.revision, Ordering::Relaxed);
            segment.events.push(event);
            true
        })
        .await;
        segments.push(segment);
        if !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    segments
}

/// Every event under `prefix` after revision `after`, up to and including the event of key
/// `last` (written after everything else), from one member.
pub async fn history(channel: &Channel, prefix: &str, after: i64, last: &str) -> Vec<Event> {
    let mut events = Vec::new();
    let stop = AtomicBool::new(false);
    let start = WatchStart {
        prefix,
        from: after + 1,
    };
    watch_once(channel, start, &stop, |event| {
        let done = event.key == last;
        events.push(event);
        !done
    })
    .await;
    events
}

/// The history the watchers are checked against, recorded as it happens, since the
/// compactor drops it from the members: a watch from the first revision, moving to the next
/// member whenever its connection fails and resuming after the last event, until the event
/// of key `last`. `seen` as for [`watcher`].
pub async fn recorder(channels: Vec<Channel>, prefix: String, last: String, seen: Arc<AtomicI64>) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    let never = AtomicBool::new(false);
    for channel in channels.iter().cycle() {
        let next = events.last().map_or(1, |e| e.revision + 1);
        let mut done = false;
        let start = WatchStart {
            prefix: &prefix,
            from: next,
        };
        watch_once(channel, start, &never, |event| {
            done = event.key == last;
            seen.store(event.revision, Ordering::Relaxed);
            events.push(event);
            !done
        })
        .await;
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    events
}

/// Checks each watcher's connections against `history`: within a connection, events come
/// in revision order, none is missing between its start and its last event, and each equals
/// the history's; a reconnection starts after the last event seen. Returns how many events
/// were checked, or the first discrepancy.
pub fn check(watchers: &[Vec<Segment>], history: &[Event]) -> Result<usize, String> {
    let mut checked = 0;
    for (member, segments) in watchers.iter().enumerate() {
        let mut seen_up_to = 0;
        for (n, segment) in segments.iter().enumerate() {
            if segment.from <= seen_up_to {
                return Err(format!(
                    "member {member}, connection {n}: resumed at {} after {seen_up_to}",
                    segment.from
                ));
            }
            let Some(last) = segment.events.last() else { continue };
            let expected: Vec<&Event> = history
                .iter()
                .filter(|e| e.revision >= segment.from && e.revision <= last.revision)
                .collect();
            let got: Vec<&Event> = segment.events.iter().collect();
            if got != expected {
                let at = got
                    .iter()
                    .zip(&expected)
                    .position(|(g, e)| g != e)
                    .unwrap_or(got.len().min(expected.len()));
                return Err(format!(
                    "member {member}, connection {n} (from revision {}): event {at} is {:?}, the history has {:?} ({} events seen, {} expected)",
                    segment.from,
                    got.get(at),
                    expected.get(at),
                    got.len(),
                    expected.len()
                ));
            }
            checked += got.len();
            seen_up_to = last.revision;
        }
    }
    Ok(checked)
}
