//! The k8s workload's watch cache, as the apiserver keeps one: a watch stream of its own with
//! watches of the pods and leases prefixes (and `--watchers` more of the pods prefix), and the
//! reader that times each event from its write's send time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Conn;
use bytes::Bytes;
use cairn_benches::{Context, Failure};
use cairn_server::pb::etcdserverpb::watch_client::WatchClient;
use cairn_server::pb::etcdserverpb::watch_request::RequestUnion;
use cairn_server::pb::etcdserverpb::{WatchCreateRequest, WatchRequest};
use cairn_server::pb::mvccpb::event::EventType;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::apiserver::Apiserver;
use crate::drive::*;
use crate::fanout::*;
use crate::keys::*;
use crate::request::*;

/// A watch of every key under `prefix`, with the previous value, from now on.
pub(crate) fn watch_create(prefix: &str) -> WatchCreateRequest {
    WatchCreateRequest {
        key: Bytes::copy_from_slice(prefix.as_bytes()),
        range_end: prefix_end(prefix.as_bytes()),
        prev_kv: true,
        ..WatchCreateRequest::default()
    }
}

/// Opens one watch stream over `channel` with the watches `creates`; returns once the server
/// confirmed them all.
pub(crate) async fn open_watch_cache(
    channel: Conn,
    timeout: Duration,
    creates: Vec<WatchCreateRequest>,
) -> Result<WatchStream, Failure> {
    let n = creates.len();
    let (tx, rx) = mpsc::channel(n + 1);
    // Queued before the call: a Go server sends the response headers only with a first answer.
    for create in creates {
        let request = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(create)),
        };
        tx.send(request)
            .await
            .map_err(|_| Failure("the watch stream's request queue closed".to_string()))?;
    }
    let mut client = WatchClient::new(channel);
    let mut responses = timed(timeout, client.watch(ReceiverStream::new(rx)))
        .await
        .context(|| "open the watch stream".to_string())?;
    let mut created = 0;
    while created < n {
        match tokio::time::timeout(timeout, responses.message()).await {
            Ok(Ok(Some(r))) if r.canceled => {
                return Err(Failure(format!("a watch was canceled: {}", r.cancel_reason)));
            }
            Ok(Ok(Some(r))) => created += usize::from(r.created),
            Ok(Ok(None)) => return Err(Failure("the watch stream was closed by the server".to_string())),
            Ok(Err(e)) => return Err(Failure(format!("the watch stream: {e}"))),
            Err(_) => {
                return Err(Failure(format!("{created} of {n} watches created within {timeout:?}")));
            }
        }
    }
    Ok(WatchStream {
        requests: tx,
        responses,
    })
}

/// Reads events from `stream` until `stop`, counting them all in `received`. The tally has the
/// events received in the measured window: the puts' latency from their write's send time, and
/// the deletes in `hits`; a canceled watch is an error.
pub(crate) async fn read_watch_cache(
    mut stream: WatchStream,
    api: Arc<Apiserver>,
    received: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> Result<Tally, Failure> {
    let mut tally = Tally::new()?;
    loop {
        let answer = tokio::select! {
            biased;
            _ = stop.changed() => break,
            answer = stream.responses.message() => answer,
        };
        match answer {
            Ok(Some(r)) => {
                if r.canceled {
                    tally.error(&Status::cancelled(format!(
                        "watch {} canceled (compacted at {}): {}",
                        r.watch_id, r.compact_revision, r.cancel_reason
                    )));
                }
                if r.events.is_empty() {
                    continue;
                }
                received.fetch_add(r.events.len() as u64, Ordering::SeqCst);
                let now = Instant::now();
                if now < api.measured_from {
                    continue;
                }
                let since_epoch = now.saturating_duration_since(api.epoch);
                for event in &r.events {
                    let put = event.r#type == EventType::Put as i32;
                    match event.kv.as_ref().and_then(|kv| stamp_of(&kv.value)) {
                        Some(sent) if put => tally.record(since_epoch.saturating_sub(sent), Ok(0)),
                        _ => tally.hits += 1,
                    }
                }
            }
            Ok(None) => {
                tally.error(&Status::unavailable("the watch stream was closed by the server"));
                break;
            }
            Err(e) => {
                tally.error(&e);
                break;
            }
        }
    }
    drop(stream.requests);
    Ok(tally)
}
