//! `--enable-pprof`: profiles under `/debug/pprof/` on the client URLs, in the format
//! `go tool pprof` reads (gzipped protobuf), as etcd serves Go's.
//!
//! - `/debug/pprof/profile?seconds=N` samples the whole process's CPU for N seconds (30 by
//!   default, 100 samples a second). One CPU profile runs at a time, as in Go; a second is
//!   refused with 500 while it does.
//! - `/debug/pprof/heap` is jemalloc's heap profile: the bytes still allocated, by the stack
//!   that allocated them (one sample type, `inuse_space`), with function names. The `cairn`
//!   binary's allocator is jemalloc with its profiler built in; [`start_heap_sampling`],
//!   called when the flag is given, has it sample an allocation every 512 KiB on average
//!   from then on, as Go's runtime does (`src/main.rs`). jemalloc
//!   writes the profile to a temporary file in `$TMPDIR` (else `/tmp`), which jemalloc_pprof
//!   reads back and deletes; a crash in between leaves that file behind, nothing else. One
//!   heap profile is dumped at a time. Where the profiler is off (the static musl builds,
//!   another binary's allocator, or `_RJEM_MALLOC_CONF` turning it off) or the file cannot
//!   be written, the answer is 500 saying why.

use std::io::Write;
use std::sync::Arc;
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

/// Has jemalloc's profiler sample allocations from now on (`--enable-pprof`); where it is not
/// built in (the static musl builds, another binary), says so once.
pub fn start_heap_sampling() {
    let Some(ctl) = jemalloc_pprof::PROF_CTL.as_ref() else {
        tracing::warn!(
            "--enable-pprof: no heap profile in this build (jemalloc's profiler is off); CPU profiles are served"
        );
        return;
    };
    // Nothing else holds the lock before the HTTP endpoints serve.
    let activated = match ctl.try_lock() {
        Ok(mut ctl) => ctl.activate().map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = activated {
        tracing::warn!(error = %e, "--enable-pprof: jemalloc's heap sampling could not be started");
    }
}

async fn index() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "/debug/pprof/\n\nprofile: CPU profile (?seconds=N, default 30), for go tool pprof\nheap: live allocations, sampled every 512 KiB on average, for go tool pprof\n",
    )
        .into_response()
}

async fn heap() -> Response {
    let Some(ctl) = jemalloc_pprof::PROF_CTL.as_ref().map(Arc::clone) else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "Could not take a heap profile: jemalloc's profiler is off in this process (the cairn binary turns it on, except in its static musl builds; _RJEM_MALLOC_CONF=prof:false turns it off)\n",
        )
            .into_response();
    };
    // Dumping writes and reads a file and symbolizes every address: not on the runtime's
    // threads. The lock keeps one dump at a time.
    let dumped = tokio::task::spawn_blocking(move || {
        let mut ctl = ctl.blocking_lock();
        if !ctl.activated() {
            return Err("jemalloc's profiler is not sampling (prof_active is false)".to_string());
        }
        ctl.dump_pprof().map_err(|e| {
            let dir = std::env::temp_dir();
            format!("{e:#} (jemalloc dumps into a temporary file in {})", dir.display())
        })
    })
    .await;
    let dumped = dumped.map(|d| d.map_err(|e| format!("Could not take a heap profile: {e}")));
    answer("heap", dumped)
}

/// A profile's answer: the gzipped protobuf, named `name`, or 500 saying why there is none.
fn answer(name: &str, taken: Result<Result<Vec<u8>, String>, tokio::task::JoinError>) -> Response {
    match taken {
        Ok(Ok(bytes)) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}\"")),
            ],
            bytes,
        )
            .into_response(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
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
    answer("profile", encoded)
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
