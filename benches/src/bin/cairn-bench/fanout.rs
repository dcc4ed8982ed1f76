//! Watch fan-out: watchers over many streams, and put-to-event latency.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Conn;
use bytes::Bytes;
use cairn_benches::{payload, per_sec, rounded, Context, Failure};
use cairn_server::pb::etcdserverpb::watch_request::RequestUnion;
use cairn_server::pb::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Status, Streaming};
use tonic_prost::ProstEncoder;

use crate::drive::*;
use crate::keys::*;
use crate::kv::*;
use crate::report::*;
use crate::request::*;
use crate::*;

pub(crate) async fn watch_events(g: &Global, b: &Bench, a: &WatchArgs) -> Result<Report, Failure> {
    if g.rate.is_some() {
        return Err(Failure(
            "watch: the writers' rate is --put-rate, not --rate".to_string(),
        ));
    }
    let prefix = format!("{}watch/", g.key_prefix);
    let keys = Keys::new(
        &prefix,
        prefix.len() + digits(a.key_space_size - 1),
        a.key_space_size,
        true,
    )?;
    let epoch = Origin::now();
    // Events are logged only when asked: a watcher count times the puts can be many.
    let logged = g.latency_log.is_some().then_some(epoch);
    let received = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = watch::channel(false);

    eprintln!("{TOOL}: creating {} watchers on {} streams ...", a.watchers, a.streams);
    // The readers run on a runtime of their own, with connections of their own: decoding
    // events would otherwise delay the writers' tasks in the same run queues, and a put's
    // latency (which paces the writers) would measure the load generator as much as the server.
    let reading = Background(Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cairn-bench-reader")
            .enable_all()
            .build()
            .context(|| "start the readers' runtime".to_string())?,
    ));
    let urls = (0..b.channels.len())
        .map(|i| endpoint_url(g, i))
        .collect::<Result<Vec<_>, _>>()?;
    let dialer = dialer(g).await?;
    let connected = reading.handle().spawn(async move {
        let mut channels = Vec::with_capacity(urls.len());
        for url in urls {
            channels.push(dial(dialer, url).await?);
        }
        Ok::<_, Failure>(channels)
    });
    let watching = Arc::new(Bench {
        channels: connected
            .await
            .map_err(|e| Failure(format!("the readers' connections: {e}")))??,
        timeout: b.timeout,
        shown: false,
    });
    let mut readers = Vec::with_capacity(a.streams);
    for s in 0..a.streams {
        let n = a.watchers / a.streams + usize::from(s < a.watchers % a.streams);
        if n == 0 {
            continue;
        }
        let (watching, prefix) = (Arc::clone(&watching), prefix.clone());
        let stream = reading
            .handle()
            .spawn(async move { open_watchers(&watching, s, n, &prefix).await })
            .await
            .map_err(|e| Failure(format!("watch stream {s}: {e}")))??;
        let reader = Reader {
            epoch: epoch.at,
            logged,
            received: Arc::clone(&received),
            stop: stopped.clone(),
        };
        readers.push(reading.handle().spawn(reader.read_events(stream, Tally::new()?)));
    }

    // The writers have a connection of their own, as in etcd's benchmark: their requests do
    // not queue behind the events on the watchers' connections.
    let writers = Bench {
        channels: vec![connect_to(g, 0).await?],
        timeout: b.timeout,
        shown: b.shown,
    };
    let (total, seconds) = limits(g, DEFAULT_TOTAL);
    let run = Run::start(total, seconds, a.put_rate);
    let op = Op::Put {
        keys,
        value: Bytes::from(payload(a.val_size)),
        stamp: Some(epoch.at),
    };
    let (puts, put_elapsed) = writers.drive_op("watch", &run, g.clients, op).await?;

    // Every watcher sees every put that succeeded (one that timed out may still show up).
    let expected = puts.ok.saturating_mul(a.watchers as u64);
    let drain_started = Instant::now();
    while received.load(Ordering::SeqCst) < expected && drain_started.elapsed() < DRAIN_PATIENCE {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let drained = drain_started.elapsed();
    // Readers may be gone already (their streams failed); they are joined below either way.
    let _ = stop.send(true);
    let mut events = Tally::new()?;
    // The events' log counts from the writers' start, as every other workload's.
    events.log = AnswerLog::starting_at(run.origin());
    let mut last_event = None;
    let mut responses = 0;
    for r in readers {
        let read = r.await.context(|| "a watch stream reader failed".to_string())?;
        events.absorb(read.tally)?;
        last_event = last_event.max(read.last);
        responses += read.responses;
    }
    let events_elapsed = last_event.map_or(Duration::ZERO, |t: Instant| t.saturating_duration_since(run.started));
    let missing = expected.saturating_sub(events.ok);

    let mut report = Report::new("watch", g);
    report.param("watchers", a.watchers);
    report.param("streams", a.streams);
    report.param("put_rate", a.put_rate);
    report.param("key_space_size", a.key_space_size);
    report.param("val_size", a.val_size);
    report.extra("events_expected", expected);
    report.extra("events_missing", missing);
    report.extra("foreign_events", events.hits);
    report.extra("event_responses", responses);
    report.extra("drain_s", rounded(drained.as_secs_f64(), 3));
    report.note(format!(
        "events: {} of {expected} expected ({} puts x {} watchers), {missing} missing; \
         waited {:.3} s for them after the writers stopped",
        events.ok,
        puts.ok,
        a.watchers,
        drained.as_secs_f64()
    ));
    let put_rate = per_sec(puts.ok, put_elapsed);
    if let Some(asked) = a.put_rate.filter(|&asked| put_rate < 0.9 * asked) {
        report.note(format!(
            "the writers reached {put_rate:.0} puts/s, not the {asked} asked: more --clients may help"
        ));
    }
    if events.hits > 0 {
        report.note(format!(
            "{} events carried no send time (written by someone else?)",
            events.hits
        ));
    }
    report.row("events", events, events_elapsed);
    report.row("put", puts, put_elapsed);
    Ok(report.require_success())
}

/// A runtime run beside the main one, and stopped without waiting when dropped (a runtime
/// may not be dropped, which waits, from inside another's task).
struct Background(Option<tokio::runtime::Runtime>);

impl Background {
    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("only taken on drop").handle()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Opens watch stream `s` and creates `n` watchers of `prefix` on it; returns once the
/// server confirmed them all.
pub(crate) async fn open_watchers(
    b: &Bench,
    s: usize,
    n: usize,
    prefix: &str,
) -> Result<WatchStream<LeanResponse>, Failure> {
    let (tx, rx) = mpsc::channel(n + 1);
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: Bytes::copy_from_slice(prefix.as_bytes()),
            range_end: prefix_end(prefix.as_bytes()),
            ..WatchCreateRequest::default()
        })),
    };
    // Queued before the call: a Go server sends the response headers only with a first answer.
    for _ in 0..n {
        tx.send(create.clone())
            .await
            .map_err(|_| Failure(format!("watch stream {s}: its request queue closed")))?;
    }
    let mut responses = timed(b.timeout, watch_lean(b.channel(s), ReceiverStream::new(rx)))
        .await
        .context(|| format!("open watch stream {s}"))?;
    let mut created = 0;
    while created < n {
        let answer = tokio::time::timeout(b.timeout, responses.message()).await;
        match answer {
            Ok(Ok(Some(r))) if r.canceled => {
                return Err(Failure(format!(
                    "watch stream {s}: a watcher was canceled: {}",
                    r.cancel_reason
                )));
            }
            Ok(Ok(Some(r))) => created += usize::from(r.created),
            Ok(Ok(None)) => return Err(Failure(format!("watch stream {s}: closed by the server"))),
            Ok(Err(e)) => return Err(Failure(format!("watch stream {s}: {e}"))),
            Err(_) => {
                return Err(Failure(format!(
                    "watch stream {s}: {created} of {n} watchers created within {:?}",
                    b.timeout
                )));
            }
        }
    }
    Ok(WatchStream {
        requests: tx,
        responses,
    })
}

/// An open watch stream; the request side is kept open (a server ends the stream when the
/// client closes it). Its answers are full `WatchResponse`s, or for the fan-out's readers the
/// `LeanResponse` view of them.
#[derive(Debug)]
pub(crate) struct WatchStream<R = WatchResponse> {
    pub(crate) requests: mpsc::Sender<WatchRequest>,
    pub(crate) responses: Streaming<R>,
}

/// What the fan-out's readers look at in a `WatchResponse` (same field tags; prost skips the
/// rest: headers, watch IDs, keys, revisions). The load generator decodes as many events as
/// the server sends, on the same two cores: decoding every field of each made it spend more
/// CPU per event than the server it measured (in a pair against cairn, 0.39 µs against the
/// server's 0.35 µs), so the fan-out rate measured the client as much as the server.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeanResponse {
    #[prost(bool, tag = "3")]
    pub(crate) created: bool,
    #[prost(bool, tag = "4")]
    pub(crate) canceled: bool,
    #[prost(string, tag = "6")]
    pub(crate) cancel_reason: String,
    #[prost(message, repeated, tag = "11")]
    pub(crate) events: Vec<LeanEvent>,
}

/// An `mvccpb.Event` reduced to its key-value's value.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeanEvent {
    #[prost(message, optional, tag = "2")]
    pub(crate) kv: Option<LeanValue>,
}

/// An `mvccpb.KeyValue` reduced to its value, where the writers put their send time.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeanValue {
    #[prost(bytes = "bytes", tag = "5")]
    pub(crate) value: Bytes,
}

/// The Watch call's codec for the fan-out's readers: requests as prost writes them, answers
/// read as `LeanResponse`s from a `Bytes` view of each message. prost reading through tonic's
/// buffer itself advances a `BytesMut` field by field, which took a tenth of the load
/// generator's CPU in the fan-out (`perf`); a `Bytes` advances by moving a pointer, and hands
/// out the values as slices of itself.
#[derive(Clone, Copy, Debug, Default)]
struct LeanCodec;

impl Codec for LeanCodec {
    type Encode = WatchRequest;
    type Decode = LeanResponse;
    type Encoder = ProstEncoder<WatchRequest>;
    type Decoder = LeanDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        LeanDecoder
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct LeanDecoder;

impl Decoder for LeanDecoder {
    type Item = LeanResponse;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<LeanResponse>, Status> {
        use bytes::Buf;
        decode_lean(buf.copy_to_bytes(buf.remaining())).map(Some)
    }
}

/// One message's `LeanResponse`.
fn decode_lean(message: Bytes) -> Result<LeanResponse, Status> {
    prost::Message::decode(message).map_err(|e| Status::internal(format!("cannot decode a watch response: {e}")))
}

/// etcd's Watch call (`/etcdserverpb.Watch/Watch`), its answers decoded as `LeanResponse`s.
async fn watch_lean(
    channel: Conn,
    requests: ReceiverStream<WatchRequest>,
) -> Result<tonic::Response<Streaming<LeanResponse>>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("the connection is not ready: {e}")))?;
    let path = PathAndQuery::from_static("/etcdserverpb.Watch/Watch");
    let codec = LeanCodec;
    grpc.streaming(tonic::Request::new(requests), path, codec).await
}

/// A watch stream's reader: what it shares with the others, and when it stops.
#[derive(Debug)]
pub(crate) struct Reader {
    /// Send times in the events' values are nanoseconds since then.
    pub(crate) epoch: Instant,
    /// Where the events' log counts from, if they are logged.
    pub(crate) logged: Option<Origin>,
    /// Counts the events with a send time, of every reader.
    pub(crate) received: Arc<AtomicU64>,
    pub(crate) stop: watch::Receiver<bool>,
}

impl Reader {
    /// Reads events from `stream` until `stop`: each one's put-to-event latency (from the send
    /// time in its value, nanoseconds since `epoch`) goes into `tally` (`hits` counts events
    /// without one), and into its log counting from `logged` if given; `received` counts them
    /// all.
    pub(crate) async fn read_events(self, mut stream: WatchStream<LeanResponse>, mut tally: Tally) -> Read {
        let Reader {
            epoch,
            logged,
            received,
            mut stop,
        } = self;
        let mut last = None;
        let mut responses = 0;
        loop {
            let answer = tokio::select! {
                biased;
                _ = stop.changed() => break,
                answer = stream.responses.message() => answer,
            };
            match answer {
                Ok(Some(r)) => {
                    if r.canceled {
                        tally.error(&Status::cancelled(format!("watch canceled: {}", r.cancel_reason)));
                    }
                    if r.events.is_empty() {
                        continue;
                    }
                    let now = Instant::now();
                    let since_epoch = now.saturating_duration_since(epoch);
                    let mut stamped = 0;
                    for event in &r.events {
                        match event.kv.as_ref().and_then(|kv| stamp_of(&kv.value)) {
                            Some(sent) => {
                                let took = since_epoch.saturating_sub(sent);
                                if let Some(origin) = logged {
                                    tally.log.push(origin, now, took);
                                }
                                tally.record(took, Ok(0));
                                stamped += 1;
                            }
                            None => tally.hits += 1,
                        }
                    }
                    received.fetch_add(stamped, Ordering::SeqCst);
                    last = Some(now);
                    responses += 1;
                }
                Ok(None) => {
                    tally.error(&Status::unavailable("watch stream closed by the server"));
                    break;
                }
                Err(e) => {
                    tally.error(&e);
                    break;
                }
            }
        }
        drop(stream.requests);
        Read { tally, last, responses }
    }
}

/// What a stream's reader saw.
pub(crate) struct Read {
    pub(crate) tally: Tally,
    /// When the last event came.
    pub(crate) last: Option<Instant>,
    /// How many responses carried events: a server that batches sends fewer per event.
    pub(crate) responses: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_server::pb::etcdserverpb::ResponseHeader;
    use cairn_server::pb::mvccpb::{Event, KeyValue};
    use prost::Message;

    fn event(key: &str, value: &[u8]) -> Event {
        Event {
            r#type: 0,
            kv: Some(KeyValue {
                key: Bytes::copy_from_slice(key.as_bytes()),
                create_revision: 7,
                mod_revision: 9,
                version: 2,
                value: Bytes::copy_from_slice(value),
                lease: 5,
            }),
            prev_kv: Some(KeyValue {
                value: Bytes::from_static(b"before"),
                ..KeyValue::default()
            }),
        }
    }

    #[test]
    fn a_lean_response_reads_what_a_full_one_holds() {
        let stamp = 1_234_567_u64.to_be_bytes();
        let full = WatchResponse {
            header: Some(ResponseHeader {
                cluster_id: 1,
                member_id: 2,
                revision: 9,
                raft_term: 3,
            }),
            watch_id: 42,
            created: true,
            canceled: true,
            compact_revision: 4,
            cancel_reason: "why".to_string(),
            fragment: true,
            events: vec![event("a", &stamp), event("bb", b"")],
        };
        let lean = decode_lean(Bytes::from(full.encode_to_vec())).unwrap();
        assert!(lean.created);
        assert!(lean.canceled);
        assert_eq!(lean.cancel_reason, "why");
        let values: Vec<&[u8]> = lean
            .events
            .iter()
            .map(|e| e.kv.as_ref().unwrap().value.as_ref())
            .collect();
        assert_eq!(values, vec![&stamp[..], b""]);
        assert_eq!(
            stamp_of(&lean.events[0].kv.as_ref().unwrap().value),
            Some(Duration::from_nanos(1_234_567))
        );
    }

    #[test]
    fn a_malformed_response_is_an_error() {
        // Field 11 (events) says 100 bytes follow; 1 does.
        let e = decode_lean(Bytes::from_static(&[0x5a, 100, 0])).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal);
    }

    /// A cairn member on free loopback ports, served on a thread of its own for the rest of
    /// the test process; its client address.
    fn member(dir: &std::path::Path) -> String {
        use clap::Parser;
        let port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (client, peer) = (
            format!("http://127.0.0.1:{}", port()),
            format!("http://127.0.0.1:{}", port()),
        );
        let cli = cairn_server::config::Cli::parse_from([
            "cairn",
            "--data-dir",
            dir.to_str().unwrap(),
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ]);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(cairn_server::serve(cli.flags)).unwrap();
        });
        client
    }

    #[test]
    fn every_put_reaches_every_watcher_through_the_readers_runtime() {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let endpoint = member(dir.path());
        let args = Args::parse_from([
            "cairn-bench",
            "--endpoints",
            &endpoint,
            "--conns",
            "2",
            "--clients",
            "3",
            "--total",
            "60",
            "watch",
            "--watchers",
            "7",
            "--streams",
            "3",
        ]);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let report = runtime.block_on(async {
            // Up once a range is answered (the member opens its engine after binding).
            let ready = async {
                loop {
                    let probe = async {
                        let channel = connect_url(&args.global, endpoint.clone()).await.ok()?;
                        let mut kv = cairn_server::pb::etcdserverpb::kv_client::KvClient::new(channel);
                        let range = cairn_server::pb::etcdserverpb::RangeRequest {
                            key: Bytes::from_static(b"probe"),
                            ..Default::default()
                        };
                        kv.range(range).await.ok()
                    };
                    if probe.await.is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(60), ready).await.unwrap();
            run_workload(&args).await.unwrap()
        });
        assert_eq!(report.failure, None);
        let events = report.rows.iter().find(|r| r.name == "events").unwrap();
        let puts = report.rows.iter().find(|r| r.name == "put").unwrap();
        assert_eq!(puts.tally.ok, 60);
        assert_eq!(events.tally.ok, 60 * 7, "every watcher saw every put");
        assert_eq!(report.extras["events_missing"], 0);
    }
}
