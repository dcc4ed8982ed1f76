//! What a client URL serves: the gRPC services (with etcd's `hasleader` and learner
//! checks), the HTTP endpoints, the JSON gateway, and etcd's answer to an unknown path.

use std::sync::Arc;

use tonic::service::Routes;

use crate::api;
use crate::api::metrics::Metrics;
use crate::api::node::Node;
use crate::config::{self};
use crate::pb::etcdserverpb as pb;

/// Bytes a gRPC message may exceed `--max-request-bytes` by before the transport refuses it
/// (etcd's allowance for gRPC framing): up to it, the server answers etcd's "request is too
/// large" itself.
pub(super) const GRPC_OVERHEAD: usize = 512 << 10;

/// What a client listener serves: the gRPC services, the HTTP endpoints (with the JSON
/// gateway unless `--enable-grpc-gateway=false`), or both.
#[derive(Clone)]
pub(super) struct ClientRoutes {
    pub(super) grpc: axum::Router,
    pub(super) http: axum::Router,
    pub(super) access: config::HttpAccess,
}

impl ClientRoutes {
    /// A listener's router: gRPC if `grpc`, HTTP if `http` (behind the access checks, the
    /// Host check only where `secure` is false), and `unknown_path` for the rest.
    pub(super) fn router(&self, grpc: bool, http: bool, secure: bool) -> axum::Router {
        let mut router = axum::Router::new();
        if grpc {
            router = router.merge(self.grpc.clone());
        }
        if http {
            router = router.merge(crate::transport::http_access::layer(
                self.http.clone(),
                self.access.clone(),
                secure,
            ));
        }
        router.fallback(unknown_path)
    }
}

/// The gRPC services (with etcd's `hasleader` check) and the HTTP endpoints.
pub(super) fn client_routes(
    node: Arc<Node>,
    metrics: Arc<Metrics>,
    token: String,
    gateway: bool,
    pprof: bool,
    access: config::HttpAccess,
) -> ClientRoutes {
    use crate::pb::v3electionpb::election_server::ElectionServer;
    use crate::pb::v3lockpb::lock_server::LockServer;
    use crate::pb::watch_wire::watch_server::WatchServer;
    use pb::auth_server::AuthServer;
    use pb::cluster_server::ClusterServer;
    use pb::kv_server::KvServer;
    use pb::lease_server::LeaseServer;
    use pb::maintenance_server::MaintenanceServer;
    let limit = node.limits.request.max_request_bytes.saturating_add(GRPC_OVERHEAD);
    let leader_check = {
        let node = node.clone();
        move |request: tonic::Request<()>| {
            if api::wants_leader(request.metadata()) && node.engine.leader().is_none() {
                return Err(crate::errors::Refusal::NoLeader.into());
            }
            Ok(request)
        }
    };
    macro_rules! service {
        ($server:ident, $svc:expr) => {
            tonic::service::interceptor::InterceptedService::new(
                $server::new($svc)
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(usize::MAX),
                leader_check.clone(),
            )
        };
    }
    let (health_reporter, health) = tonic_health::server::health_reporter();
    drop(health_reporter);
    let routes = Routes::new(health)
        .add_service(service!(KvServer, api::kv::KvService::new(node.clone())))
        .add_service(service!(WatchServer, api::watch::WatchService::new(node.clone())))
        .add_service(service!(LeaseServer, api::lease::LeaseService::new(node.clone())))
        .add_service(service!(
            ClusterServer,
            api::cluster::ClusterService::new(node.clone(), token)
        ))
        .add_service(service!(
            MaintenanceServer,
            api::maintenance::MaintenanceService::new(node.clone())
        ))
        .add_service(service!(AuthServer, api::auth::AuthService::new(node.clone())))
        .add_service(service!(
            ElectionServer,
            api::concurrency::election::ElectionService::new(node.clone())
        ))
        .add_service(service!(
            LockServer,
            api::concurrency::lock::LockService::new(node.clone())
        ));
    let member = node.clone();
    let grpc = routes.into_axum_router().layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let refused = member.engine.is_learner() && !LEARNER_METHODS.contains(&request.uri().path());
            async move {
                if refused {
                    return tonic::Status::from(crate::errors::Refusal::NotForLearner).into_http();
                }
                next.run(request).await
            }
        },
    ));
    // Counted outermost, so that a learner's refusal is counted too, as etcd's interceptors
    // count it.
    let grpc = api::metrics::grpc_layer(grpc, metrics.grpc.clone());
    // A span per call, around everything else, as otelgrpc's stats handler sees each call.
    let grpc = crate::run::tracing_export::grpc_layer(grpc);
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

/// The gRPC methods a learner serves, as etcd's learners do (a Range only if serializable,
/// which the KV service checks): every other call on a learner is refused.
pub(super) const LEARNER_METHODS: [&str; 3] = [
    "/etcdserverpb.Maintenance/Status",
    "/etcdserverpb.Maintenance/Snapshot",
    "/etcdserverpb.KV/Range",
];

/// An unknown path: a gRPC call to a method cairn does not have is `Unimplemented` (clients
/// such as kube-apiserver fall back on that code); any other request is 404, as with etcd.
pub(super) async fn unknown_path(request: axum::extract::Request) -> axum::response::Response {
    let grpc = request
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        tonic::Status::unimplemented("unknown service or method").into_http()
    } else {
        axum::response::IntoResponse::into_response(axum::http::StatusCode::NOT_FOUND)
    }
}
