//! The HTTP endpoints beside gRPC, on the same client port, as etcd serves them: `/health`,
//! `/livez`, `/readyz`, `/version` and `/metrics` (Prometheus text, etcd's metric names).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use cairn_engine::Alarm;

use crate::metrics::Metrics;
use crate::node::{Node, API_VERSION};

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
        .route("/readyz", get(readyz))
        .route("/version", get(version))
        .route("/metrics", get(metrics_text))
        .with_state(Http { node, metrics })
}

/// The checks etcd's health endpoints run, with the names its `exclude` option takes.
async fn failed_checks(node: &Arc<Node>, params: &HashMap<String, String>, ready: bool) -> Vec<String> {
    let excluded: Vec<&str> = params
        .iter()
        .filter(|(k, _)| k.as_str() == "exclude")
        .flat_map(|(_, v)| v.split(','))
        .collect();
    let mut failed = Vec::new();
    let alarms = node.engine.alarms();
    for alarm in alarms {
        let name = match alarm {
            Alarm::NoSpace => "NOSPACE",
            Alarm::Corrupt => "CORRUPT",
        };
        if !excluded.contains(&name) && !excluded.contains(&"alarm") {
            failed.push(format!("alarm {name}"));
        }
    }
    if !ready {
        return failed;
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
    let failed = failed_checks(&h.node, &params, true).await;
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

/// Plain-text check results, as etcd's `/livez` and `/readyz` give them.
fn checks_text(failed: &[String], verbose: bool) -> Response {
    if failed.is_empty() {
        let body = if verbose { "[+]all checks passed\nok\n" } else { "ok\n" };
        return (StatusCode::OK, body).into_response();
    }
    let mut body: String = failed.iter().map(|f| format!("[-]{f} failed\n")).collect();
    body.push_str("health check failed\n");
    (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
}

/// `/livez`: the process serves (the engine has not failed).
async fn livez(State(h): State<Http>, Query(params): Query<HashMap<String, String>>) -> Response {
    let failed = failed_checks(&h.node, &params, false).await;
    // Alarms do not make a member dead; only a stopped engine does.
    let failed: Vec<String> = failed.into_iter().filter(|f| !f.starts_with("alarm")).collect();
    checks_text(&failed, params.contains_key("verbose"))
}

/// `/readyz`: the member can serve linearizable requests.
async fn readyz(State(h): State<Http>, Query(params): Query<HashMap<String, String>>) -> Response {
    let failed = failed_checks(&h.node, &params, true).await;
    checks_text(&failed, params.contains_key("verbose"))
}

async fn version() -> Response {
    Json(serde_json::json!({ "etcdserver": API_VERSION, "etcdcluster": API_VERSION })).into_response()
}

async fn metrics_text(State(h): State<Http>) -> Response {
    match h.metrics.render(&h.node) {
        Ok(text) => (StatusCode::OK, [("content-type", "text/plain; version=0.0.4")], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    }
}
