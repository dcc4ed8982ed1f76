//! Watch fan-out: watchers over many streams, and put-to-event latency.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_benches::{payload, per_sec, rounded, Context, Failure};
use cairn_server::pb::etcdserverpb::watch_client::WatchClient;
use cairn_server::pb::etcdserverpb::watch_request::RequestUnion;
use cairn_server::pb::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

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
    let mut readers = Vec::with_capacity(a.streams);
    for s in 0..a.streams {
        let n = a.watchers / a.streams + usize::from(s < a.watchers % a.streams);
        if n == 0 {
            continue;
        }
        let stream = open_watchers(b, s, n, &prefix).await?;
        let reader = read_events(
            stream,
            epoch.at,
            logged,
            Arc::clone(&received),
            stopped.clone(),
            Tally::new()?,
        );
        readers.push(tokio::spawn(reader));
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
    for r in readers {
        let (tally, last) = r.await.context(|| "a watch stream reader failed".to_string())?;
        events.absorb(tally)?;
        last_event = last_event.max(last);
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

/// Opens watch stream `s` and creates `n` watchers of `prefix` on it; returns once the
/// server confirmed them all.
pub(crate) async fn open_watchers(b: &Bench, s: usize, n: usize, prefix: &str) -> Result<WatchStream, Failure> {
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
    let mut client = WatchClient::new(b.channel(s));
    let mut responses = timed(b.timeout, client.watch(ReceiverStream::new(rx)))
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
/// client closes it).
#[derive(Debug)]
pub(crate) struct WatchStream {
    pub(crate) requests: mpsc::Sender<WatchRequest>,
    pub(crate) responses: Streaming<WatchResponse>,
}

/// Reads events from `stream` until `stop`: each one's put-to-event latency (from the send
/// time in its value, nanoseconds since `epoch`) goes into the tally (`hits` counts events
/// without one), and into its log counting from `logged` if given; `received` counts them
/// all. Returns when the last event came.
pub(crate) async fn read_events(
    mut stream: WatchStream,
    epoch: Instant,
    logged: Option<Origin>,
    received: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
    mut tally: Tally,
) -> (Tally, Option<Instant>) {
    let mut last = None;
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
    (tally, last)
}
