//! gRPC calls counted as etcd's go-grpc-prometheus interceptors count them, at the HTTP level
//! in front of every service: `grpc_server_started_total` when a call comes in,
//! `grpc_server_msg_received_total` and `grpc_server_msg_sent_total` per message each way,
//! `grpc_server_handled_total` with the call's status code once it ends, and with
//! `--metrics=extensive` `grpc_server_handling_seconds`; also etcd's own
//! `etcd_network_client_grpc_received_bytes_total` and `_sent_bytes_total`.
//!
//! A call is known by its path (`/<service>/<method>`) among etcd's methods, so a client's
//! made-up path cannot grow the label sets. Its status is the `grpc-status` of the response's
//! headers (a trailers-only answer) or trailers; a call whose response is dropped before it
//! ends (the client went away) is counted as `Canceled`, as grpc-go reports it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::transport::grpc_body::{trailers_only_status, Observed, Observer};
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::response::Response;
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry};

/// etcd's client methods, with their kinds as go-grpc-prometheus labels them.
pub const METHODS: &[(&str, &str, &str)] = &[
    ("etcdserverpb.KV", "Range", "unary"),
    ("etcdserverpb.KV", "RangeStream", "server_stream"),
    ("etcdserverpb.KV", "Put", "unary"),
    ("etcdserverpb.KV", "DeleteRange", "unary"),
    ("etcdserverpb.KV", "Txn", "unary"),
    ("etcdserverpb.KV", "Compact", "unary"),
    ("etcdserverpb.Watch", "Watch", "bidi_stream"),
    ("etcdserverpb.Lease", "LeaseGrant", "unary"),
    ("etcdserverpb.Lease", "LeaseRevoke", "unary"),
    ("etcdserverpb.Lease", "LeaseKeepAlive", "bidi_stream"),
    ("etcdserverpb.Lease", "LeaseTimeToLive", "unary"),
    ("etcdserverpb.Lease", "LeaseLeases", "unary"),
    ("etcdserverpb.Cluster", "MemberAdd", "unary"),
    ("etcdserverpb.Cluster", "MemberRemove", "unary"),
    ("etcdserverpb.Cluster", "MemberUpdate", "unary"),
    ("etcdserverpb.Cluster", "MemberList", "unary"),
    ("etcdserverpb.Cluster", "MemberPromote", "unary"),
    ("etcdserverpb.Maintenance", "Alarm", "unary"),
    ("etcdserverpb.Maintenance", "Status", "unary"),
    ("etcdserverpb.Maintenance", "Defragment", "unary"),
    ("etcdserverpb.Maintenance", "Hash", "unary"),
    ("etcdserverpb.Maintenance", "HashKV", "unary"),
    ("etcdserverpb.Maintenance", "Snapshot", "server_stream"),
    ("etcdserverpb.Maintenance", "MoveLeader", "unary"),
    ("etcdserverpb.Maintenance", "Downgrade", "unary"),
    ("etcdserverpb.Auth", "AuthEnable", "unary"),
    ("etcdserverpb.Auth", "AuthDisable", "unary"),
    ("etcdserverpb.Auth", "AuthStatus", "unary"),
    ("etcdserverpb.Auth", "Authenticate", "unary"),
    ("etcdserverpb.Auth", "UserAdd", "unary"),
    ("etcdserverpb.Auth", "UserGet", "unary"),
    ("etcdserverpb.Auth", "UserList", "unary"),
    ("etcdserverpb.Auth", "UserDelete", "unary"),
    ("etcdserverpb.Auth", "UserChangePassword", "unary"),
    ("etcdserverpb.Auth", "UserGrantRole", "unary"),
    ("etcdserverpb.Auth", "UserRevokeRole", "unary"),
    ("etcdserverpb.Auth", "RoleAdd", "unary"),
    ("etcdserverpb.Auth", "RoleGet", "unary"),
    ("etcdserverpb.Auth", "RoleList", "unary"),
    ("etcdserverpb.Auth", "RoleDelete", "unary"),
    ("etcdserverpb.Auth", "RoleGrantPermission", "unary"),
    ("etcdserverpb.Auth", "RoleRevokePermission", "unary"),
    ("v3electionpb.Election", "Campaign", "unary"),
    ("v3electionpb.Election", "Proclaim", "unary"),
    ("v3electionpb.Election", "Leader", "unary"),
    ("v3electionpb.Election", "Observe", "server_stream"),
    ("v3electionpb.Election", "Resign", "unary"),
    ("v3lockpb.Lock", "Lock", "unary"),
    ("v3lockpb.Lock", "Unlock", "unary"),
    ("grpc.health.v1.Health", "Check", "unary"),
    ("grpc.health.v1.Health", "Watch", "server_stream"),
];

/// gRPC's status codes by number, named as grpc-go names them in the `grpc_code` label.
const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// `CODES`' `Unknown`.
const UNKNOWN: usize = 2;

/// `CODES`' `Canceled`.
const CANCELED: usize = 1;

/// The code of a `grpc-status` value, an index of `CODES`; an unknown number is `Unknown`, as
/// in grpc-go.
fn code(status: &[u8]) -> usize {
    std::str::from_utf8(status)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n < CODES.len())
        .unwrap_or(UNKNOWN)
}

/// The counters, in the member's registry.
#[derive(Debug)]
pub struct GrpcMetrics {
    started: IntCounterVec,
    handled: IntCounterVec,
    received: IntCounterVec,
    sent: IntCounterVec,
    /// With `--metrics=extensive` only, as in etcd.
    handling: Option<HistogramVec>,
    received_bytes: IntCounter,
    sent_bytes: IntCounter,
    /// etcd's methods, in `METHODS`' order, each with its series once a call has made them:
    /// looking a series up by its labels hashes them under a lock, and a call counts four.
    methods: Vec<Method>,
    /// Where each method's path (`/<service>/<method>`) is in `methods`.
    paths: HashMap<String, usize>,
}

/// One method's labels, and its series, made by its first call.
#[derive(Debug)]
struct Method {
    /// Type, service, method.
    labels: [&'static str; 3],
    series: OnceLock<Series>,
    /// `grpc_server_handled_total` by code, each made the first time the method ends with it.
    handled: [OnceLock<IntCounter>; CODES.len()],
}

/// A method's series other than `handled`.
#[derive(Debug)]
struct Series {
    started: IntCounter,
    received: IntCounter,
    sent: IntCounter,
    handling: Option<Histogram>,
}

fn register<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> Result<T, prometheus::Error> {
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

impl GrpcMetrics {
    /// Registers the counters in `r`; `extensive` adds the handling-time histogram.
    pub fn new(r: &Registry, extensive: bool) -> Result<GrpcMetrics, prometheus::Error> {
        let call = ["grpc_type", "grpc_service", "grpc_method"];
        let counter =
            |name: &str, help: &str, labels: &[&str]| register(r, IntCounterVec::new(Opts::new(name, help), labels)?);
        let handling = match extensive {
            true => Some(register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "grpc_server_handling_seconds",
                        "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
                    ),
                    &call,
                )?,
            )?),
            false => None,
        };
        Ok(GrpcMetrics {
            started: counter(
                "grpc_server_started_total",
                "Total number of RPCs started on the server.",
                &call,
            )?,
            handled: counter(
                "grpc_server_handled_total",
                "Total number of RPCs completed on the server, regardless of success or failure.",
                &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
            )?,
            received: counter(
                "grpc_server_msg_received_total",
                "Total number of RPC stream messages received on the server.",
                &call,
            )?,
            sent: counter(
                "grpc_server_msg_sent_total",
                "Total number of gRPC stream messages sent by the server.",
                &call,
            )?,
            handling,
            received_bytes: register(
                r,
                IntCounter::new(
                    "etcd_network_client_grpc_received_bytes_total",
                    "Bytes of gRPC requests read from clients.",
                )?,
            )?,
            sent_bytes: register(
                r,
                IntCounter::new(
                    "etcd_network_client_grpc_sent_bytes_total",
                    "Bytes of gRPC responses written to clients.",
                )?,
            )?,
            methods: METHODS
                .iter()
                .map(|&(service, method, kind)| Method {
                    labels: [kind, service, method],
                    series: OnceLock::new(),
                    handled: std::array::from_fn(|_| OnceLock::new()),
                })
                .collect(),
            paths: METHODS
                .iter()
                .enumerate()
                .map(|(i, (service, method, _))| (format!("/{service}/{method}"), i))
                .collect(),
        })
    }

    /// Counts a request to `path` as started, if it names one of etcd's methods: the call,
    /// whose bodies then count its messages and whose end counts it handled.
    fn start(self: &Arc<Self>, path: &str) -> Option<Arc<Call>> {
        let index = *self.paths.get(path)?;
        let method = self.methods.get(index)?;
        let series = method.series.get_or_init(|| Series {
            started: self.started.with_label_values(&method.labels),
            received: self.received.with_label_values(&method.labels),
            sent: self.sent.with_label_values(&method.labels),
            handling: self.handling.as_ref().map(|h| h.with_label_values(&method.labels)),
        });
        series.started.inc();
        Some(Arc::new(Call {
            metrics: self.clone(),
            method: index,
            started: series.handling.as_ref().map(|_| Instant::now()),
            finished: AtomicBool::new(false),
        }))
    }
}

/// One gRPC call in flight.
#[derive(Debug)]
struct Call {
    metrics: Arc<GrpcMetrics>,
    /// Where the call's method is in `metrics.methods`.
    method: usize,
    /// When the call started, for the handling-time histogram (`--metrics=extensive`).
    started: Option<Instant>,
    /// Invariant: the call is counted handled once, when this turns true.
    finished: AtomicBool,
}

impl Call {
    /// The method's labels and series (made when the call started).
    fn method(&self) -> Option<(&Method, &Series)> {
        let method = self.metrics.methods.get(self.method)?;
        Some((method, method.series.get()?))
    }

    /// Counts the call handled with the status `code`, once.
    fn finish(&self, code: usize) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some((method, series)) = self.method() else {
            return;
        };
        let [kind, service, name] = method.labels;
        if let (Some(slot), Some(&code_name)) = (method.handled.get(code), CODES.get(code)) {
            slot.get_or_init(|| {
                self.metrics
                    .handled
                    .with_label_values(&[kind, service, name, code_name])
            })
            .inc();
        }
        if let (Some(h), Some(started)) = (&series.handling, self.started) {
            h.observe(started.elapsed().as_secs_f64());
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // Neither a status nor an end reached the client: it went away first.
        self.finish(CANCELED);
    }
}

/// Counts gRPC's length-prefixed messages in a byte stream split anywhere.
#[derive(Debug, Default)]
struct Framing {
    /// Bytes of the current message's 5-byte prefix seen so far, then its payload length.
    prefix: [u8; 5],
    prefix_seen: usize,
    /// Payload bytes of the current message still to come.
    remaining: u64,
}

impl Framing {
    /// Takes `chunk`; returns how many messages started in it.
    fn take(&mut self, mut chunk: &[u8]) -> u64 {
        let mut messages = 0;
        while !chunk.is_empty() {
            if self.remaining > 0 {
                let n = usize::try_from(self.remaining).unwrap_or(usize::MAX).min(chunk.len());
                self.remaining -= n as u64;
                chunk = chunk.get(n..).unwrap_or_default();
                continue;
            }
            let want = 5 - self.prefix_seen;
            let n = want.min(chunk.len());
            if let (Some(dst), Some(src)) = (
                self.prefix.get_mut(self.prefix_seen..self.prefix_seen + n),
                chunk.get(..n),
            ) {
                dst.copy_from_slice(src);
            }
            self.prefix_seen += n;
            chunk = chunk.get(n..).unwrap_or_default();
            if self.prefix_seen == 5 {
                let [_, a, b, c, d] = self.prefix;
                self.remaining = u64::from(u32::from_be_bytes([a, b, c, d]));
                self.prefix_seen = 0;
                messages += 1;
            }
        }
        messages
    }
}

/// Which way a body goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Received,
    Sent,
}

/// One way of a call: counts its messages and bytes as they pass, and the call handled when
/// its response ends.
struct Counted {
    call: Arc<Call>,
    way: Way,
    framing: Framing,
}

impl Counted {
    fn new(call: Arc<Call>, way: Way) -> Counted {
        Counted {
            call,
            way,
            framing: Framing::default(),
        }
    }
}

impl Observer for Counted {
    fn data(&mut self, chunk: &[u8]) {
        let messages = self.framing.take(chunk);
        let m = &self.call.metrics;
        let bytes = match self.way {
            Way::Received => &m.received_bytes,
            Way::Sent => &m.sent_bytes,
        };
        bytes.inc_by(chunk.len() as u64);
        if let (true, Some((_, series))) = (messages > 0, self.call.method()) {
            let counter = match self.way {
                Way::Received => &series.received,
                Way::Sent => &series.sent,
            };
            counter.inc_by(messages);
        }
    }

    fn ended(&mut self, status: &[u8], _: &HeaderMap) {
        self.call.finish(code(status));
    }
}

impl GrpcMetrics {
    /// Counts `request` as a call started, if its path names one of etcd's methods, and its
    /// body's messages as received; with the call, which counts the answer.
    pub fn count(self: &Arc<Self>, request: Request) -> (Request, Option<Counting>) {
        let Some(call) = self.start(request.uri().path()) else {
            return (request, None);
        };
        let request = request.map(|inner| Observed::request(inner, Counted::new(call.clone(), Way::Received)));
        (request, Some(Counting(call)))
    }
}

/// A call being counted.
#[derive(Debug)]
pub struct Counting(Arc<Call>);

impl Counting {
    /// `response`, its messages counted as sent and the call counted handled when it ends (at
    /// once for a trailers-only answer).
    pub fn answered(self, response: Response) -> Response {
        if let Some(status) = trailers_only_status(response.headers()) {
            self.0.finish(code(status));
        }
        response.map(|inner| Observed::response(inner, Counted::new(self.0, Way::Sent)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_counted_however_the_stream_is_split() {
        // Two messages of 3 and 0 payload bytes, then the start of a third.
        let stream = [0u8, 0, 0, 0, 3, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 1];
        for split in 0..stream.len() {
            let mut f = Framing::default();
            let (a, b) = stream.split_at(split);
            assert_eq!(f.take(a) + f.take(b), 3, "split at {split}");
        }
        let mut f = Framing::default();
        assert_eq!(stream.iter().map(|b| f.take(&[*b])).sum::<u64>(), 3, "a byte at a time");
    }

    #[test]
    fn status_codes_are_named_as_grpc_go_names_them() {
        let name = |status: &[u8]| CODES[code(status)];
        assert_eq!(name(b"0"), "OK");
        assert_eq!(name(b"9"), "FailedPrecondition");
        assert_eq!(name(b"14"), "Unavailable");
        assert_eq!(name(b"16"), "Unauthenticated");
        assert_eq!(name(b"99"), "Unknown");
        assert_eq!(name(b"x"), "Unknown");
    }

    #[test]
    fn a_call_is_counted_handled_once_and_canceled_if_dropped_unfinished() {
        let r = Registry::new();
        let m = Arc::new(GrpcMetrics::new(&r, true).unwrap());
        assert!(m.start("/made.Up/Method").is_none(), "only etcd's methods");
        let call = m.start("/etcdserverpb.KV/Put").unwrap();
        call.finish(code(b"0"));
        call.finish(code(b"2"));
        drop(call);
        drop(m.start("/etcdserverpb.Watch/Watch").unwrap());
        let text = {
            let mut out = Vec::new();
            prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert!(text.contains(
            r#"grpc_server_handled_total{grpc_code="OK",grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"} 1"#
        ));
        assert!(!text.contains(r#"grpc_code="Unknown""#), "{text}");
        assert!(text.contains(r#"grpc_code="Canceled",grpc_method="Watch""#), "{text}");
        assert!(text.contains("grpc_server_handling_seconds_bucket"), "{text}");
    }
}
