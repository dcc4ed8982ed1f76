//! etcd's distributed tracing (`--enable-distributed-tracing`): a member sends a span per gRPC
//! call over OTLP/gRPC, named and attributed as etcd's otelgrpc interceptors name them, with
//! the resource attributes the flags give, continuing a caller's W3C trace; it sends what is
//! queued when it stops (SIGTERM); the sampling rate decides the traces it starts; and a
//! collector that is down does not keep it from serving. Each test runs an OTLP collector of
//! its own (opentelemetry-proto's TraceService) on a free port, and reads what it received
//! once the member has stopped, when every span must have been sent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Instant;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;

mod common;

use common::{Member, PATIENCE};

/// A caller's trace, as a client that traces sends it (sampled).
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN_ID: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{CALLER_SPAN_ID}-01")
}

/// One span as the collector received it, with its resource's attributes.
#[derive(Debug, Clone)]
struct Received {
    name: String,
    kind: i32,
    trace_id: String,
    parent_span_id: String,
    attributes: HashMap<String, Value>,
    resource: HashMap<String, Value>,
}

impl Received {
    fn text(&self, key: &str) -> Option<&str> {
        match self.attributes.get(key) {
            Some(Value::StringValue(s)) => Some(s),
            _ => None,
        }
    }

    fn int(&self, key: &str) -> Option<i64> {
        match self.attributes.get(key) {
            Some(Value::IntValue(n)) => Some(*n),
            _ => None,
        }
    }
}

fn attributes(list: Vec<KeyValue>) -> HashMap<String, Value> {
    list.into_iter()
        .filter_map(|kv| Some((kv.key, kv.value?.value?)))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The collector: each span it receives goes down the channel.
struct Collector(mpsc::Sender<Received>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for batch in request.into_inner().resource_spans {
            let resource = attributes(batch.resource.map(|r| r.attributes).unwrap_or_default());
            for span in batch.scope_spans.into_iter().flat_map(|s| s.spans) {
                let _ = self.0.send(Received {
                    name: span.name,
                    kind: span.kind,
                    trace_id: hex(&span.trace_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: attributes(span.attributes),
                    resource: resource.clone(),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A collector on a free port of 127.0.0.1, served by `runtime`: its port, and the spans it
/// receives.
fn collector(runtime: &tokio::runtime::Runtime) -> (u16, mpsc::Receiver<Received>) {
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(tx)))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    (port, rx)
}

/// Spans received until `enough` holds of them, or the patience is over: all received.
fn receive_until(rx: &mpsc::Receiver<Received>, enough: impl Fn(&[Received]) -> bool) -> Vec<Received> {
    let deadline = Instant::now() + PATIENCE;
    let mut spans = Vec::new();
    while !enough(&spans) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(span) => spans.push(span),
            Err(_) => break,
        }
    }
    spans.extend(rx.try_iter());
    spans
}

fn tracing_flags(port: u16, rate: u32) -> Vec<String> {
    vec![
        "--enable-distributed-tracing".into(),
        format!("--distributed-tracing-address=127.0.0.1:{port}"),
        format!("--distributed-tracing-sampling-rate={rate}"),
        "--distributed-tracing-service-name=cairn-test".into(),
        "--distributed-tracing-instance-id=n1".into(),
    ]
}

fn start(flags: &[String]) -> Member {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Member::start("traced", &flags)
}

/// A Put through cairn's own gRPC client, carrying the caller's `traceparent`.
fn put_in_callers_trace(runtime: &tokio::runtime::Runtime, member: &Member, key: &'static str) {
    use cairn_server::pb::etcdserverpb::kv_client::KvClient;
    use cairn_server::pb::etcdserverpb::PutRequest;
    runtime.block_on(async {
        let mut kv = KvClient::connect(member.client_url()).await.unwrap();
        let mut request = tonic::Request::new(PutRequest {
            key: key.into(),
            value: "v".into(),
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert("traceparent", traceparent().parse().unwrap());
        kv.put(request).await.unwrap();
    });
}

#[test]
fn each_call_is_a_span_named_as_otelgrpc_names_it_with_the_resource_and_the_callers_trace() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (port, rx) = collector(&runtime);
    let mut member = start(&tracing_flags(port, 1_000_000));
    member.ok(&["put", "a", "1"]);
    member.ok(&["get", "a"]);
    // A future revision: OutOfRange, answered trailers-only.
    member.fails(&["compact", "100000"], "future revision");
    put_in_callers_trace(&runtime, &member, "traced");
    assert!(member.stop().success(), "{}", member.log_text());

    let named = |spans: &[Received], name: &str| spans.iter().filter(|s| s.name == name).count();
    let spans = receive_until(&rx, |spans| {
        named(spans, "etcdserverpb.KV/Put") >= 2
            && named(spans, "etcdserverpb.KV/Range") >= 1
            && named(spans, "etcdserverpb.KV/Compact") >= 1
    });
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(named(&spans, "etcdserverpb.KV/Put"), 2, "{names:?}");
    assert_eq!(named(&spans, "etcdserverpb.KV/Range"), 1, "{names:?}");
    assert_eq!(named(&spans, "etcdserverpb.KV/Compact"), 1, "{names:?}");

    let calls: Vec<&Received> = spans.iter().filter(|s| s.name.starts_with("etcdserverpb.")).collect();
    for span in &calls {
        let (service, method) = span.name.split_once('/').unwrap();
        assert_eq!(span.kind, SpanKind::Server as i32, "{span:?}");
        assert_eq!(span.text("rpc.system"), Some("grpc"), "{span:?}");
        assert_eq!(span.text("rpc.service"), Some(service), "{span:?}");
        assert_eq!(span.text("rpc.method"), Some(method), "{span:?}");
        assert_eq!(
            span.resource.get("service.name"),
            Some(&Value::StringValue("cairn-test".into())),
            "{span:?}"
        );
        assert_eq!(
            span.resource.get("service.instance.id"),
            Some(&Value::StringValue("n1".into())),
            "{span:?}"
        );
        let code = if span.name.ends_with("/Compact") { 11 } else { 0 };
        assert_eq!(span.int("rpc.grpc.status_code"), Some(code), "{span:?}");
    }

    // The Put that carried a traceparent continues the caller's trace, as the caller's
    // span's child; the calls that carried none each start a trace of their own.
    let continued: Vec<&&Received> = calls.iter().filter(|s| s.trace_id == TRACE_ID).collect();
    assert_eq!(continued.len(), 1, "{calls:?}");
    assert_eq!(continued[0].name, "etcdserverpb.KV/Put");
    assert_eq!(continued[0].parent_span_id, CALLER_SPAN_ID);
    for span in calls.iter().filter(|s| s.trace_id != TRACE_ID) {
        assert!(span.parent_span_id.is_empty(), "{span:?}");
    }
}

#[test]
fn at_sampling_rate_0_no_trace_is_started_and_a_callers_sampled_trace_is_followed() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (port, rx) = collector(&runtime);
    let mut member = start(&tracing_flags(port, 0));
    for i in 0..5 {
        member.ok(&["put", &format!("k{i}"), "v"]);
        member.ok(&["get", &format!("k{i}")]);
    }
    // etcd's sampler is parent-based: a caller's sampled trace is kept whatever the rate.
    put_in_callers_trace(&runtime, &member, "traced");
    assert!(member.stop().success(), "{}", member.log_text());

    let spans = receive_until(&rx, |spans| spans.iter().any(|s| s.trace_id == TRACE_ID));
    let calls: Vec<&Received> = spans.iter().filter(|s| s.name.starts_with("etcdserverpb.")).collect();
    assert_eq!(calls.len(), 1, "only the caller's trace: {calls:?}");
    assert_eq!(calls[0].name, "etcdserverpb.KV/Put");
    assert_eq!(calls[0].trace_id, TRACE_ID);
}

#[test]
fn a_collector_that_is_down_does_not_keep_the_member_from_serving_or_stopping() {
    // A port nobody listens on any more.
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut member = start(&tracing_flags(down, 1_000_000));
    for i in 0..20 {
        member.ok(&["put", &format!("k{i}"), &format!("v{i}")]);
    }
    let read = member.ok(&["get", "k", "--prefix", "--keys-only"]);
    assert_eq!(read.lines().filter(|l| !l.is_empty()).count(), 20, "{read}");
    assert!(member.is_running());
    // The spans it could not send are given up after the flush's patience, not waited for.
    assert!(member.stop().success(), "{}", member.log_text());
}
