//! `--enable-pprof`: profiles under `/debug/pprof/` on the client URLs, in the format
//! `go tool pprof` reads, as etcd serves Go's: `/debug/pprof/profile?seconds=N` samples the
//! whole process's CPU for N seconds (30 by default, 100 samples a second) and answers the
//! gzipped protobuf profile. One CPU profile runs at a time, as in Go; a second is refused
//! with 500 while it does. `/debug/pprof/heap` is answered 501: cairn has no heap profile
//! (Rust's allocator keeps no sampled stacks).

use std::io::Write;
use std::time::Duration;

use axum::extract::Query;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The longest CPU profile asked for (Go's net/http/pprof refuses one longer than the
/// server's write timeout; etcd has none, so this bounds a forgotten request).
const MAX_SECONDS: u64 = 600;

/// The routes, mounted where etcd mounts Go's.
pub fn router() -> Router {
    Router::new()
        .route("/debug/pprof/", get(index))
        .route("/debug/pprof/profile", get(cpu))
        .route("/debug/pprof/heap", get(heap))
}

async fn index() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "/debug/pprof/\n\nprofile: CPU profile (?seconds=N, default 30), for go tool pprof\nheap: not available in cairn\n",
    )
        .into_response()
}

async fn heap() -> Response {
    (
        StatusCode::NOT_IMPLEMENTED,
        "heap profiles are not available in cairn: its allocator keeps no sampled stacks\n",
    )
        .into_response()
}

#[derive(serde::Deserialize)]
struct CpuParams {
    seconds: Option<u64>,
}

async fn cpu(Query(params): Query<CpuParams>) -> Response {
    let seconds = params.seconds.unwrap_or(30).clamp(1, MAX_SECONDS);
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(100)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
    {
        Ok(guard) => guard,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Could not enable CPU profiling: {e}\n"),
            )
                .into_response()
        }
    };
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let encoded = tokio::task::spawn_blocking(move || encode(&guard)).await;
    match encoded {
        Ok(Ok(bytes)) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (header::CONTENT_DISPOSITION, "attachment; filename=\"profile\""),
            ],
            bytes,
        )
            .into_response(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// The profile as `go tool pprof` reads it: protobuf, gzipped.
fn encode(guard: &pprof::ProfilerGuard<'_>) -> Result<Vec<u8>, String> {
    use pprof::protos::Message;
    let profile = guard
        .report()
        .build()
        .and_then(|report| report.pprof())
        .map_err(|e| e.to_string())?;
    let raw = profile.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw).map_err(|e| e.to_string())?;
    gz.finish().map_err(|e| e.to_string())
}
