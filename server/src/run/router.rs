//! What a client URL serves: the gRPC services (with etcd's `hasleader` and learner
//! checks), the HTTP endpoints, the JSON gateway, and etcd's answer to an unknown path.

use std::sync::Arc;

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::http;
use tokio_util::either::Either;
use tower_service::Service;

use crate::api;
use crate::api::metrics::Metrics;
use crate::api::node::Node;
use crate::config::{self};

use super::grpc::GrpcServices;
use super::plan::Plan;

/// Bytes a gRPC message may exceed `--max-request-bytes` by before the transport refuses it
/// (etcd's allowance for gRPC framing): up to it, the server answers etcd's "request is too
/// large" itself.
pub(super) const GRPC_OVERHEAD: usize = 512 << 10;

/// What a client listener serves: the gRPC services, the HTTP endpoints (with the JSON
/// gateway unless `--enable-grpc-gateway=false`), or both.
#[derive(Clone)]
pub(super) struct ClientRoutes {
    grpc: GrpcServices,
    http: axum::Router,
    access: config::HttpAccess,
}

impl ClientRoutes {
    /// A listener's service: gRPC if `grpc`, HTTP if `http` (behind the access checks, the
    /// Host check only where `secure` is false), and `unknown_path` for the rest.
    pub(super) fn router(&self, grpc: bool, http: bool, secure: bool) -> ClientService {
        let mut router = axum::Router::new();
        if http {
            router = router.merge(crate::transport::http_access::layer(
                self.http.clone(),
                self.access.clone(),
                secure,
            ));
        }
        ClientService {
            grpc: grpc.then(|| self.grpc.clone()),
            http: router.fallback(unknown_path),
        }
    }
}

/// A client listener's service: a gRPC call (by its content type, as etcd 3.7 tells them
/// apart) goes to the gRPC services, anything else to the HTTP router.
#[derive(Clone)]
pub(super) struct ClientService {
    grpc: Option<GrpcServices>,
    http: axum::Router,
}

impl<B> Service<http::Request<B>> for ClientService
where
    B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = Either<
        <GrpcServices as Service<axum::extract::Request>>::Future,
        axum::routing::future::RouteFuture<Infallible>,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match &mut self.grpc {
            Some(grpc) if is_grpc(request.headers()) => Either::Left(grpc.call(request.map(axum::body::Body::new))),
            _ => Either::Right(self.http.call(request)),
        }
    }
}

/// Whether a request is a gRPC call, by its content type.
fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The gRPC services (with etcd's `hasleader` and learner checks) and the HTTP endpoints,
/// with the gateway, pprof and the HTTP access rules as `plan` says.
pub(super) fn client_routes(node: Arc<Node>, metrics: Arc<Metrics>, token: String, plan: &Plan) -> ClientRoutes {
    let (gateway, pprof, access) = (plan.gateway, plan.pprof, plan.http_access.clone());
    let limit = node.limits.request.max_request_bytes.saturating_add(GRPC_OVERHEAD);
    let grpc = GrpcServices::new(node.clone(), metrics.grpc.clone(), limit, token);
    let mut http = api::http::router(node, metrics);
    if gateway {
        // The HTTP/JSON gateway calls the gRPC services as a gRPC client would.
        http = http.merge(api::gateway::router(grpc.clone(), limit));
    }
    if pprof {
        http = http.merge(api::pprof::router());
    }
    ClientRoutes { grpc, http, access }
}

/// An unknown path: a gRPC call to a method cairn does not have is `Unimplemented` (clients
/// such as kube-apiserver fall back on that code); any other request is 404, as with etcd.
pub(super) async fn unknown_path(request: axum::extract::Request) -> axum::response::Response {
    if is_grpc(request.headers()) {
        super::grpc::unknown_method().into_http()
    } else {
        axum::response::IntoResponse::into_response(http::StatusCode::NOT_FOUND)
    }
}
