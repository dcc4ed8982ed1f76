//! The gRPC services of a client URL, and what every call passes on its way to one: the span
//! (with an exporter), the metrics, the learner's refusal and the `hasleader` check.
//!
//! A call is dispatched by its path: the unary calls of the KV and Lease services, the ones a
//! busy member serves most, to their methods through cairn's own framing
//! (`transport::grpc_unary`); the others by their service's name to tonic's server for it.
//! The services once sat in an axum router, behind two middlewares and tonic's interceptor:
//! each call then cloned and boxed every layer, and perf put a sixth of a serializable range's
//! server CPU in those layers. Here a call costs one box for its future.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::response::Response;
use tonic::codegen::BoxFuture;
use tonic::server::NamedService;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tower_service::Service;

use crate::api;
use crate::api::metrics::GrpcMetrics;
use crate::api::node::Node;
use crate::errors::Refusal;
use crate::pb::etcdserverpb::auth_server::AuthServer;
use crate::pb::etcdserverpb::cluster_server::ClusterServer;
use crate::pb::etcdserverpb::kv_server::{Kv, KvServer};
use crate::pb::etcdserverpb::lease_server::{Lease, LeaseServer};
use crate::pb::etcdserverpb::maintenance_server::MaintenanceServer;
use crate::pb::v3electionpb::election_server::ElectionServer;
use crate::pb::v3lockpb::lock_server::LockServer;
use crate::pb::watch_wire::watch_server::WatchServer;
use crate::transport::grpc_unary;

/// What a tonic server answers.
type Answer = axum::http::Response<tonic::body::Body>;

/// The methods a learner serves (etcd's `isRPCSupportedForLearner`); it refuses the others.
const LEARNER_METHODS: [&str; 3] = [
    "/etcdserverpb.Maintenance/Status",
    "/etcdserverpb.Maintenance/Snapshot",
    "/etcdserverpb.KV/Range",
];

/// The member's gRPC services, cheap to clone (one per connection and call).
#[derive(Clone)]
pub(super) struct GrpcServices(Arc<Services>);

struct Services {
    node: Arc<Node>,
    metrics: Arc<GrpcMetrics>,
    /// The largest request message, in bytes.
    limit: usize,
    /// The services whose unary calls cairn frames itself.
    kv_unary: api::kv::KvService,
    lease_unary: api::lease::LeaseService,
    kv: KvServer<api::kv::KvService>,
    watch: WatchServer<api::watch::WatchService>,
    lease: LeaseServer<api::lease::LeaseService>,
    cluster: ClusterServer<api::cluster::ClusterService>,
    maintenance: MaintenanceServer<api::maintenance::MaintenanceService>,
    auth: AuthServer<api::auth::AuthService>,
    election: ElectionServer<api::concurrency::election::ElectionService>,
    lock: LockServer<api::concurrency::lock::LockService>,
    health: HealthServer<HealthService>,
}

impl GrpcServices {
    /// The services of `node`, refusing a message larger than `limit` bytes; `token` is the
    /// cluster's (`--initial-cluster-token`), for the Cluster service.
    pub(super) fn new(node: Arc<Node>, metrics: Arc<GrpcMetrics>, limit: usize, token: String) -> GrpcServices {
        macro_rules! server {
            ($server:ident, $svc:expr) => {
                $server::new($svc)
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(usize::MAX)
            };
        }
        let kv = api::kv::KvService::new(node.clone());
        let lease = api::lease::LeaseService::new(node.clone());
        GrpcServices(Arc::new(Services {
            limit,
            kv: server!(KvServer, kv.clone()),
            kv_unary: kv,
            watch: server!(WatchServer, api::watch::WatchService::new(node.clone())),
            lease: server!(LeaseServer, lease.clone()),
            lease_unary: lease,
            cluster: server!(ClusterServer, api::cluster::ClusterService::new(node.clone(), token)),
            maintenance: server!(
                MaintenanceServer,
                api::maintenance::MaintenanceService::new(node.clone())
            ),
            auth: server!(AuthServer, api::auth::AuthService::new(node.clone())),
            election: server!(
                ElectionServer,
                api::concurrency::election::ElectionService::new(node.clone())
            ),
            lock: server!(LockServer, api::concurrency::lock::LockService::new(node.clone())),
            health: HealthServer::new(HealthService::from_health_reporter(HealthReporter::new())),
            node,
            metrics,
        }))
    }
}

impl Services {
    /// A call counted in the metrics: started, its messages each way, and handled.
    async fn counted(&self, request: Request) -> Response {
        let (request, counting) = self.metrics.count(request);
        let response = match Unary::of(request.uri().path()) {
            Some(method) => match self.admit(&request, true) {
                Ok(()) => self.unary(method, request).await,
                Err(refused) => refused.answer(),
            },
            None => match self.dispatch(request) {
                Ok(answer) => match answer.await {
                    Ok(answer) => answer.map(axum::body::Body::new),
                    Err(never) => match never {},
                },
                Err(refused) => refused.answer(),
            },
        };
        match counting {
            Some(counting) => counting.answered(response),
            None => response,
        }
    }

    /// The answer of `method` to `request`.
    async fn unary(&self, method: Unary, request: Request) -> Response {
        let (kv, lease, limit) = (&self.kv_unary, &self.lease_unary, self.limit);
        match method {
            Unary::Range => grpc_unary::serve(request, limit, |r| kv.range(r)).await,
            Unary::Put => grpc_unary::serve(request, limit, |r| kv.put(r)).await,
            Unary::DeleteRange => grpc_unary::serve(request, limit, |r| kv.delete_range(r)).await,
            Unary::Txn => grpc_unary::serve(request, limit, |r| kv.txn(r)).await,
            Unary::Compact => grpc_unary::serve(request, limit, |r| kv.compact(r)).await,
            Unary::LeaseGrant => grpc_unary::serve(request, limit, |r| lease.lease_grant(r)).await,
            Unary::LeaseRevoke => grpc_unary::serve(request, limit, |r| lease.lease_revoke(r)).await,
            Unary::LeaseTimeToLive => grpc_unary::serve(request, limit, |r| lease.lease_time_to_live(r)).await,
            Unary::LeaseLeases => grpc_unary::serve(request, limit, |r| lease.lease_leases(r)).await,
        }
    }

    /// The service's answer to `request`, or the refusal a learner or the `hasleader` check
    /// gives before any service sees it, or gRPC's answer to an unknown service.
    fn dispatch(&self, request: Request) -> Result<BoxFuture<Answer, Infallible>, Refused> {
        let path = request.uri().path();
        let service = path
            .strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .map_or("", |(s, _)| s);
        macro_rules! to {
            ($server:expr) => {{
                self.admit(&request, true)?;
                $server.clone().call(request)
            }};
        }
        Ok(match service {
            KvServer::<api::kv::KvService>::NAME => to!(self.kv),
            WatchServer::<api::watch::WatchService>::NAME => to!(self.watch),
            LeaseServer::<api::lease::LeaseService>::NAME => to!(self.lease),
            ClusterServer::<api::cluster::ClusterService>::NAME => to!(self.cluster),
            MaintenanceServer::<api::maintenance::MaintenanceService>::NAME => to!(self.maintenance),
            AuthServer::<api::auth::AuthService>::NAME => to!(self.auth),
            ElectionServer::<api::concurrency::election::ElectionService>::NAME => to!(self.election),
            LockServer::<api::concurrency::lock::LockService>::NAME => to!(self.lock),
            HealthServer::<HealthService>::NAME => {
                self.admit(&request, false)?;
                self.health.clone().call(request)
            }
            _ => return Err(Refused::UnknownService),
        })
    }

    /// The refusal of `request` if the member is a learner and the method not one it serves,
    /// or, where the `hasleader` check applies (etcd's services), if the call asked for a
    /// leader and the member knows none.
    fn admit(&self, request: &Request, leader_check: bool) -> Result<(), Refused> {
        let engine = &self.node.engine;
        if engine.server().is_learner() && !LEARNER_METHODS.contains(&request.uri().path()) {
            return Err(Refused::Learner);
        }
        if leader_check && wants_leader(request) && engine.leader().is_none() {
            return Err(Refused::NoLeader);
        }
        Ok(())
    }
}

/// The unary methods cairn frames itself.
#[derive(Debug, Clone, Copy)]
enum Unary {
    Range,
    Put,
    DeleteRange,
    Txn,
    Compact,
    LeaseGrant,
    LeaseRevoke,
    LeaseTimeToLive,
    LeaseLeases,
}

impl Unary {
    /// The method a call's `path` names, if it is one of these.
    fn of(path: &str) -> Option<Unary> {
        Some(match path {
            "/etcdserverpb.KV/Range" => Unary::Range,
            "/etcdserverpb.KV/Put" => Unary::Put,
            "/etcdserverpb.KV/DeleteRange" => Unary::DeleteRange,
            "/etcdserverpb.KV/Txn" => Unary::Txn,
            "/etcdserverpb.KV/Compact" => Unary::Compact,
            "/etcdserverpb.Lease/LeaseGrant" => Unary::LeaseGrant,
            "/etcdserverpb.Lease/LeaseRevoke" => Unary::LeaseRevoke,
            "/etcdserverpb.Lease/LeaseTimeToLive" => Unary::LeaseTimeToLive,
            "/etcdserverpb.Lease/LeaseLeases" => Unary::LeaseLeases,
            _ => return None,
        })
    }
}

/// Why a call reached no service.
#[derive(Debug, Clone, Copy)]
enum Refused {
    /// The member is a learner, and the method not one it serves.
    Learner,
    /// The call asked for a leader, and the member knows none.
    NoLeader,
    /// No such service.
    UnknownService,
}

impl Refused {
    /// The call's answer: a trailers-only gRPC error, as etcd gives it.
    fn answer(self) -> Response {
        let status = match self {
            Refused::Learner => tonic::Status::from(Refusal::NotForLearner),
            Refused::NoLeader => tonic::Status::from(Refusal::NoLeader),
            Refused::UnknownService => unknown_method(),
        };
        status.into_http()
    }
}

/// gRPC's answer to a call of a method cairn does not have (clients such as kube-apiserver
/// fall back on its code, Unimplemented).
pub(super) fn unknown_method() -> tonic::Status {
    tonic::Status::unimplemented("unknown service or method")
}

/// Whether the call asked to be refused when the member has no leader.
fn wants_leader(request: &Request) -> bool {
    api::asks_for_leader(request.headers().get(api::HASLEADER).map(|v| v.as_bytes()))
}

impl Service<Request> for GrpcServices {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let services = self.0.clone();
        Box::pin(async move {
            let answer = crate::run::tracing_export::traced(request, |r| async move { services.counted(r).await });
            Ok(answer.await)
        })
    }
}
