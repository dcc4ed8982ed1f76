//! The HTTP endpoints beside gRPC, on the same client port, as etcd serves them: `/health`,
//! `/livez` and `/readyz` (etcd 3.6's named checks, each also at `/readyz/<check>`, with
//! `?exclude=<check>` and `?verbose`), `/version` and `/metrics` (Prometheus text, etcd's
//! metric names).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use cairn_engine::Alarm;

use crate::api::metrics::Metrics;
use crate::api::node::Node;
use crate::pb::API_VERSION;

/// How long the health check's linearizable read may take (etcd's 2 s deadline less a margin).
const HEALTH_READ_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
struct Http {
    node: Arc<Node>,
    metrics: Arc<Metrics>,
}

/// The HTTP routes over `node`.
pub fn router(node: Arc<Node>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/livez", get(livez))
        .route("/livez/{check}", get(livez_one))
        .route("/readyz", get(readyz))
        .route("/readyz/{check}", get(readyz_one))
        .route("/version", get(version))
        .route("/metrics", get(metrics_text))
        .with_state(Http { node, metrics })
}

/// The checks etcd's `/health` runs, with the names its `exclude` option takes.
async fn failed_checks(node: &Arc<Node>, params: &HashMap<String, String>) -> Vec<String> {
    let excluded: Vec<&str> = params
        .iter()
        .filter(|(k, _)| k.as_str() == "exclude")
        .flat_map(|(_, v)| v.split(','))
        .collect();
    let mut failed = Vec::new();
    let alarms = node.engine.maintenance().alarms();
    for (_, alarm) in alarms {
        let name = match alarm {
            Alarm::NoSpace => "NOSPACE",
            Alarm::Corrupt => "CORRUPT",
        };
        if !excluded.contains(&name) && !excluded.contains(&"alarm") {
            failed.push(format!("alarm {name}"));
        }
    }
    if node.engine.leader().is_none() && !excluded.contains(&"leader") {
        failed.push("no leader".into());
    }
    let serializable = params.get("serializable").is_some_and(|v| v == "true");
    if !serializable && !excluded.contains(&"linearizable_read") {
        let read = {
            let node = node.clone();
            tokio::task::spawn_blocking(move || node.engine.read_barrier())
        };
        match tokio::time::timeout(HEALTH_READ_TIMEOUT, read).await {
            Ok(Ok(Ok(()))) => {}
            _ => failed.push("linearizable read failed".into()),
        }
    }
    failed
}

/// etcd's `/health`: `{"health":"true","reason":""}`, or 503 with the reason.
async fn health(State(h): State<Http>, Query(params): Query<HashMap<String, String>>) -> Response {
    let failed = failed_checks(&h.node, &params).await;
    let healthy = failed.is_empty();
    let body = serde_json::json!({
        "health": if healthy { "true" } else { "false" },
        "reason": failed.join(", "),
    });
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// `/livez`'s checks: the member serves reads from its own state.
const LIVEZ: &[&str] = &["serializable_read"];
/// `/readyz`'s checks, in the order they are reported.
const READYZ: &[&str] = &[
    "data_corruption",
    "serializable_read",
    "linearizable_read",
    "non_learner",
];

/// Runs one of etcd's named checks: `Err` says why it failed.
async fn check(node: &Arc<Node>, name: &str) -> Result<(), String> {
    match name {
        "data_corruption" => match node
            .engine
            .maintenance()
            .alarms()
            .iter()
            .any(|(_, a)| *a == Alarm::Corrupt)
        {
            true => Err("alarm activated: CORRUPT".into()),
            false => Ok(()),
        },
        "serializable_read" | "linearizable_read" => {
            // etcd's probe: one key of the whole key space, keys only.
            let probe = cairn_engine::RangeRequest {
                key: vec![0],
                range_end: vec![0],
                limit: 1,
                keys_only: true,
                serializable: name == "serializable_read",
                ..cairn_engine::RangeRequest::default()
            };
            node.bounded(node.engine.range_async(&probe))
                .await
                .map(|_| ())
                .map_err(|status| status.message().to_string())
        }
        "non_learner" => match node.engine.status().is_learner {
            true => Err("not supported for learner".into()),
            false => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Runs `checks` but those named by `exclude` parameters (names it does not have are
/// ignored, as etcd ignores them), and answers as etcd does: 200 `ok` (after each check's
/// line with `?verbose`), or 503 with every check's line.
async fn run_checks(node: &Arc<Node>, checks: &[&str], params: &[(String, String)]) -> Response {
    let excluded = |name: &str| params.iter().any(|(k, v)| k == "exclude" && v == name);
    let verbose = params.iter().any(|(k, _)| k == "verbose");
    let mut lines = String::new();
    let mut healthy = true;
    for name in checks.iter().copied().filter(|c| !excluded(c)) {
        match check(node, name).await {
            Ok(()) => lines.push_str(&format!("[+]{name} ok\n")),
            Err(why) => {
                healthy = false;
                lines.push_str(&format!("[-]{name} failed: {why}\n"));
            }
        }
    }
    let text = [("content-type", "text/plain; charset=utf-8")];
    if !healthy {
        lines.push('\n');
        return (StatusCode::SERVICE_UNAVAILABLE, text, lines).into_response();
    }
    let body = if verbose { lines + "ok\n" } else { "ok\n".to_string() };
    (StatusCode::OK, text, body).into_response()
}

/// `/livez`: the process serves reads from its own state.
async fn livez(State(h): State<Http>, Query(params): Query<Vec<(String, String)>>) -> Response {
    run_checks(&h.node, LIVEZ, &params).await
}

/// `/readyz`: no corruption alarm, reads served locally and through the leader, and a
/// voting member.
async fn readyz(State(h): State<Http>, Query(params): Query<Vec<(String, String)>>) -> Response {
    run_checks(&h.node, READYZ, &params).await
}

/// `/livez/<check>`: that check alone.
async fn livez_one(
    State(h): State<Http>,
    Path(name): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    one_check(&h.node, LIVEZ, &name, &params).await
}

/// `/readyz/<check>`: that check alone.
async fn readyz_one(
    State(h): State<Http>,
    Path(name): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    one_check(&h.node, READYZ, &name, &params).await
}

async fn one_check(node: &Arc<Node>, checks: &[&str], name: &str, params: &[(String, String)]) -> Response {
    match checks.iter().find(|c| **c == name) {
        Some(c) => run_checks(node, &[c], params).await,
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// etcd's `/version` (the etcd API served, which clients check), and beside it cairn's own
/// versions: this build's release, the agreed cluster version and the storage version
/// (`cairn_engine::version`).
async fn version(State(h): State<Http>) -> Response {
    let agreed = h.node.engine.server().versions();
    Json(serde_json::json!({
        "etcdserver": API_VERSION,
        "etcdcluster": API_VERSION,
        "cairn": cairn_engine::version::RELEASE,
        "cairncluster": agreed.cluster().to_string(),
        "cairnstorage": agreed.cluster().to_string(),
    }))
    .into_response()
}

async fn metrics_text(State(h): State<Http>) -> Response {
    match h.metrics.render(&h.node) {
        Ok(text) => (StatusCode::OK, [("content-type", "text/plain; version=0.0.4")], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    }
}
