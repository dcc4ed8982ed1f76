//! etcd's distributed tracing (`--enable-distributed-tracing`; etcd 3.5's
//! `--experimental-enable-distributed-tracing`): OpenTelemetry spans sent over OTLP/gRPC to
//! `--distributed-tracing-address`, as etcd's otelgrpc interceptors send them.
//!
//! Every gRPC call on a client URL is one span ([`grpc_layer`]), named after its method as
//! otelgrpc names it (`etcdserverpb.KV/Put`), of kind server, with `rpc.system`,
//! `rpc.service`, `rpc.method` and, once the call ends, `rpc.grpc.status_code`. A call that
//! carries a W3C `traceparent` continues the caller's trace. The spans are `tracing` spans:
//! the [`Exporter`]'s layer in the logging registry turns them, and cairn's spans and events
//! at info and above inside them, into OpenTelemetry spans and span events. A call's span
//! ends with the call: for a stream (Watch, LeaseKeepAlive) when the stream does.
//!
//! Exporting never holds up a request: an ended span goes into a bounded queue
//! ([`QUEUE_SPANS`]) and is dropped when the queue is full; a thread of the OpenTelemetry
//! SDK sends batches from it, on a runtime of its own. A collector that cannot be reached
//! costs the spans, not the member: it starts and serves all the same, as etcd does. What is
//! queued is sent when the member stops, for at most [`FLUSH_PATIENCE`]. Nothing is written
//! to disk: a crash loses the spans not sent yet.

use std::time::Duration;

use crate::config::Tracing as Settings;
use crate::transport::grpc_body::{trailers_only_status, Observed, Observer};
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::response::Response;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider};
use tracing::{Instrument, Level, Metadata, Span, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::dynamic_filter_fn;
use tracing_subscriber::layer::Filter;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Ended spans waiting to be sent; more are dropped.
pub const QUEUE_SPANS: usize = 2048;
/// How long a stopping member waits for its queued spans to be sent.
pub const FLUSH_PATIENCE: Duration = Duration::from_secs(5);
/// etcd's sampling rates are samples per million.
const PER_MILLION: u32 = 1_000_000;

/// Why spans cannot be exported as asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// `--distributed-tracing-address` is not an address a gRPC client can dial.
    #[error("--distributed-tracing-address {address:?}: {reason}")]
    Address {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The exporter's runtime could not be started.
    #[error("cannot start the span exporter: {0}")]
    Runtime(#[source] std::io::Error),
}

/// The OTLP exporter and what feeds it. Dropping it sends what is queued (for at most
/// [`FLUSH_PATIENCE`]) and stops it.
pub struct Exporter {
    settings: Settings,
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// Where the gRPC client's connection to the collector lives, apart from the server's
    /// runtime, so that a slow collector takes none of its threads. `None` only once dropped.
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Exporter {
    /// Sets up the export `settings` ask for. The collector is dialed when there is
    /// something to send, not here: one that is down fails nothing now.
    pub fn start(settings: Settings) -> Result<Exporter, ExportError> {
        let endpoint = endpoint(&settings.address)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("cairn-otlp")
            .enable_all()
            .build()
            .map_err(ExportError::Runtime)?;
        // tonic's channel starts its worker on the runtime it is built in.
        let exporter = {
            let _in = runtime.enter();
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .build()
                .map_err(|e| ExportError::Address {
                    address: settings.address.clone(),
                    reason: e.to_string(),
                })?
        };
        let batches = BatchSpanProcessor::builder(exporter)
            .with_batch_config(BatchConfigBuilder::default().with_max_queue_size(QUEUE_SPANS).build())
            .build();
        let mut resource =
            opentelemetry_sdk::Resource::builder_empty().with_service_name(settings.service_name.clone());
        if !settings.instance_id.is_empty() {
            resource = resource.with_attribute(opentelemetry::KeyValue::new(
                "service.instance.id",
                settings.instance_id.clone(),
            ));
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batches)
            .with_resource(resource.build())
            .with_sampler(sampler(settings.sampling_rate))
            .build();
        let tracer = provider.tracer("cairn");
        EXPORTING.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(Exporter {
            settings,
            provider,
            tracer,
            runtime: Some(runtime),
        })
    }

    /// What is exported where.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The layer that turns cairn's spans into OpenTelemetry spans, for the logging
    /// registry; it takes what [`exported`] lets through.
    pub fn layer<S>(&self) -> impl Layer<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.tracer.clone())
            .with_threads(false)
            .with_filter(exported())
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown_with_timeout(FLUSH_PATIENCE) {
            tracing::warn!(error = %e, "distributed tracing: not every span was sent");
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// What the exporter takes: a call's span, and cairn's spans and events at info and above
/// inside one (an event becomes an event of its span). Not a span that only names a member
/// for the log lines (the engine's `member`, open as long as the member runs: it would be a
/// trace lasting the whole run, gathering every line its threads log), nor what is logged
/// outside a call; nor a dependency's spans, the exporter's own gRPC client among them, which
/// would feed the export back into itself.
fn exported<S>() -> impl Filter<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let cairns = |meta: &Metadata<'_>| meta.target().starts_with("cairn") && *meta.level() <= Level::INFO;
    // The context is this filter's: its current span is the innermost one the filter took.
    dynamic_filter_fn(move |meta, cx| is_call_span(meta) || (cairns(meta) && cx.lookup_current().is_some()))
        // Decided once per call site for all the others (a dependency's, a debug line).
        .with_callsite_filter(move |meta| match cairns(meta) || is_call_span(meta) {
            true => tracing::subscriber::Interest::sometimes(),
            false => tracing::subscriber::Interest::never(),
        })
}

/// Whether `meta` is a gRPC call's span: the log lines leave it out (etcd's lines have no
/// such field), only the exporter takes it.
pub fn is_call_span(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.target() == module_path!()
}

/// The URI the gRPC client dials for `address`: etcd takes `host:port`, spoken to without
/// TLS.
fn endpoint(address: &str) -> Result<String, ExportError> {
    let bad = |reason: &str| ExportError::Address {
        address: address.to_string(),
        reason: reason.to_string(),
    };
    let uri = match address.split_once("://") {
        None => format!("http://{address}"),
        Some(("http", _)) => address.to_string(),
        Some(_) => return Err(bad("only host:port is taken (the collector is spoken to without TLS)")),
    };
    let parsed: axum::http::Uri = uri.parse().map_err(|_| bad("not host:port"))?;
    match parsed.host() {
        Some(host) if !host.is_empty() => Ok(uri),
        _ => Err(bad("not host:port")),
    }
}

/// etcd's sampler: a trace started here is kept at `per_million` (none at 0); a call that
/// continues a caller's trace follows the caller's decision.
fn sampler(per_million: u32) -> Sampler {
    let root = match per_million {
        0 => Sampler::AlwaysOff,
        n => Sampler::TraceIdRatioBased(f64::from(n.min(PER_MILLION)) / f64::from(PER_MILLION)),
    };
    Sampler::ParentBased(Box::new(root))
}

/// Whether this process started an exporter: until one is, no call is a span. A span made
/// for nothing to export still cost the log layers' registry an allocation and a release per
/// call (5 to 8 % of a put's server CPU, measured with perf).
static EXPORTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Answers `request` with `call`, inside a span of the call when an exporter takes spans (one
/// was started); otherwise only `call`, with no span made.
pub async fn traced<F>(request: Request, call: impl FnOnce(Request) -> F) -> Response
where
    F: std::future::Future<Output = Response>,
{
    let span = match EXPORTING.load(std::sync::atomic::Ordering::Relaxed) {
        true => call_span(request.uri().path(), request.headers()),
        false => None,
    };
    let Some(span) = span else {
        return call(request).await;
    };
    let response = call(request).instrument(span.clone()).await;
    if let Some(status) = trailers_only_status(response.headers()) {
        finish(&span, status, response.headers());
        return response;
    }
    response.map(|inner| Observed::response(inner, CallSpan(span)))
}

/// The span of a call to `path`, continuing the trace in the `traceparent` of `headers` if
/// any; `None` for what is not a gRPC call, or when nothing takes the span.
fn call_span(path: &str, headers: &HeaderMap) -> Option<Span> {
    let grpc = headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    let name = path.strip_prefix('/').filter(|_| grpc)?;
    let (service, method) = name.split_once('/')?;
    let span = tracing::info_span!(
        "grpc",
        otel.name = name,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    );
    if span.is_disabled() {
        return None;
    }
    let caller = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&Carrier(headers));
    if caller.span().span_context().is_valid() {
        // Fails only when no exporter takes the span, which is_disabled ruled out.
        let _ = span.set_parent(caller);
    }
    Some(span)
}

/// A request's headers, read by the W3C trace context propagator.
struct Carrier<'a>(&'a HeaderMap);

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Records the call's status (`grpc-status` and `grpc-message` in `headers`, trailers or a
/// trailers-only answer) on its span. As otelgrpc marks a server's span, the codes that say
/// the server failed mark it an error; the others (NotFound, InvalidArgument...) are the
/// caller's.
fn finish(span: &Span, status: &[u8], headers: &HeaderMap) {
    let code = tonic::Code::from_bytes(status);
    span.record("rpc.grpc.status_code", code as i64);
    if server_failed(code) {
        span.record("otel.status_code", "ERROR");
        if let Some(message) = headers.get("grpc-message").and_then(|m| m.to_str().ok()) {
            span.record("otel.status_description", message);
        }
    }
}

fn server_failed(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        Unknown | DeadlineExceeded | Unimplemented | Internal | Unavailable | DataLoss
    )
}

/// A call's span, held by its response's body until the call ends.
struct CallSpan(Span);

impl Observer for CallSpan {
    fn ended(&mut self, status: &[u8], headers: &HeaderMap) {
        finish(&self.0, status, headers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_is_host_and_port_spoken_to_without_tls_as_etcd_takes_it() {
        for (address, uri) in [
            ("localhost:4317", Some("http://localhost:4317")),
            ("127.0.0.1:4317", Some("http://127.0.0.1:4317")),
            ("[::1]:4317", Some("http://[::1]:4317")),
            ("http://collector:4317", Some("http://collector:4317")),
            ("https://collector:4317", None),
            ("unix:///run/otel.sock", None),
            ("", None),
            ("a b:1", None),
        ] {
            assert_eq!(endpoint(address).ok().as_deref(), uri, "{address:?}");
        }
    }

    #[test]
    fn sampling_is_etcds_parent_based_ratio_per_million() {
        use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceFlags, TraceId, TraceState};
        use opentelemetry_sdk::trace::{SamplingDecision, ShouldSample};
        let decide = |rate: u32, parent: Option<bool>, trace: u128| {
            let cx = match parent {
                None => opentelemetry::Context::new(),
                Some(sampled) => opentelemetry::Context::new().with_remote_span_context(SpanContext::new(
                    TraceId::from(trace),
                    SpanId::from(1),
                    if sampled {
                        TraceFlags::SAMPLED
                    } else {
                        TraceFlags::default()
                    },
                    true,
                    TraceState::default(),
                )),
            };
            let result =
                sampler(rate).should_sample(Some(&cx), TraceId::from(trace), "call", &SpanKind::Server, &[], &[]);
            result.decision == SamplingDecision::RecordAndSample
        };
        // A trace started here: none at 0, all at a million, about the rate in between
        // (the ratio sampler keeps the trace IDs whose low 8 bytes are below rate x 2^63).
        let ids = (0..1000u128).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835));
        assert_eq!(ids.clone().filter(|id| decide(0, None, *id)).count(), 0);
        assert_eq!(ids.clone().filter(|id| decide(PER_MILLION, None, *id)).count(), 1000);
        let half = ids.filter(|id| decide(PER_MILLION / 2, None, *id)).count();
        assert!((300..700).contains(&half), "{half}");
        // A caller's trace: its decision, whatever the rate.
        assert!(decide(0, Some(true), 7));
        assert!(!decide(PER_MILLION, Some(false), 7));
    }

    #[test]
    fn only_the_codes_that_say_the_server_failed_mark_a_span_an_error_as_otelgrpc_marks_it() {
        use tonic::Code;
        for (code, failed) in [
            (Code::Ok, false),
            (Code::Cancelled, false),
            (Code::InvalidArgument, false),
            (Code::NotFound, false),
            (Code::OutOfRange, false),
            (Code::PermissionDenied, false),
            (Code::FailedPrecondition, false),
            (Code::Unknown, true),
            (Code::DeadlineExceeded, true),
            (Code::Unimplemented, true),
            (Code::Internal, true),
            (Code::Unavailable, true),
            (Code::DataLoss, true),
        ] {
            assert_eq!(server_failed(code), failed, "{code:?}");
        }
    }

    /// Records the names of the spans and the messages of the events it is given.
    #[derive(Clone, Default)]
    struct Seen(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Seen {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            self.0.lock().unwrap().push(attrs.metadata().name().to_string());
        }

        fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                    if field.name() == "message" {
                        self.0 = format!("{value:?}");
                    }
                }
            }
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0.lock().unwrap().push(message.0);
        }
    }

    #[test]
    fn the_exporter_takes_a_calls_span_and_what_happens_in_it_and_nothing_else() {
        use tracing_subscriber::layer::SubscriberExt;
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry().with(seen.clone().with_filter(exported()));
        tracing::subscriber::with_default(subscriber, || {
            // The engine's span naming its member, and what its threads log.
            let member = tracing::info_span!("member", id = "8e9e05c52164694d");
            member.in_scope(|| tracing::info!("became leader"));
            tracing::info!("outside any span");
            let mut headers = HeaderMap::new();
            headers.insert("content-type", "application/grpc".parse().unwrap());
            assert!(
                call_span("/etcdserverpb.KV/Put", &HeaderMap::new()).is_none(),
                "not gRPC"
            );
            let call = call_span("/etcdserverpb.KV/Put", &headers).unwrap();
            call.in_scope(|| {
                tracing::info!("applied");
                tracing::debug!("below info");
                tracing::info!(target: "h2", "a dependency's");
                tracing::info_span!("apply").in_scope(|| tracing::warn!("slow apply"));
            });
            // A call made while the member's span is current is a call all the same.
            member.in_scope(|| call_span("/etcdserverpb.KV/Range", &headers).unwrap());
        });
        let seen = seen.0.lock().unwrap().clone();
        assert_eq!(seen, ["grpc", "applied", "apply", "slow apply", "grpc"]);
    }

    #[test]
    fn a_traceparent_header_is_read_as_the_callers_context() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&Carrier(&headers));
        let span = cx.span();
        let caller = span.span_context();
        assert!(caller.is_valid() && caller.is_remote() && caller.is_sampled());
        assert_eq!(caller.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(caller.span_id().to_string(), "00f067aa0ba902b7");
        let none = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&Carrier(&HeaderMap::new()));
        assert!(!none.span().span_context().is_valid());
    }
}
