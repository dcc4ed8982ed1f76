//! Running a member: the engine opened from the flags, the gRPC services and HTTP endpoints on
//! every client URL, the peer transport on every peer URL, the HTTP endpoints alone on every
//! metrics URL (each over TLS where its URL is https), auto-compaction, and a graceful stop on
//! SIGTERM or SIGINT (in-flight requests finish, then the engine checkpoints and closes).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cairn_engine::{Config, Engine};
use tonic::service::Routes;

use crate::api;
use crate::api::metrics::Metrics;
use crate::api::node::{Limits, Node};
use crate::config::{self, BadFlag, ClusterState, CompactionMode, Flags};
use crate::pb::etcdserverpb as pb;
use crate::transport::peer::PeerNetwork;
use crate::transport::tls::{Connector, Tls, TlsError, TlsListener};

/// Bytes a gRPC message may exceed `--max-request-bytes` by before the transport refuses it
/// (etcd's allowance for gRPC framing): up to it, the server answers etcd's "request is too
/// large" itself.
const GRPC_OVERHEAD: usize = 512 << 10;
/// How long requests in flight may take to finish once a stop is asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// How long a member joining an existing cluster keeps asking its peers who it is.
const JOIN_PATIENCE: Duration = Duration::from_secs(30);

/// Why a member could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A flag's value does not make sense, alone or with the others.
    #[error(transparent)]
    Flag(#[from] BadFlag),
    /// The engine could not open (or create) its files in the data directory.
    #[error("cannot open data dir {dir}: {source}")]
    Open {
        /// The data directory (`--data-dir`).
        dir: PathBuf,
        /// Why the engine failed to open.
        source: cairn_engine::Error,
    },
    /// Discovery (DNS SRV or v3) did not give this member its initial cluster.
    #[error(transparent)]
    Discovery(#[from] crate::transport::discovery::DiscoveryError),
    /// A client, peer or metrics URL could not be bound, or its TLS listener set up.
    #[error("cannot listen on {url}: {source}")]
    Listen {
        /// The URL, as the flags give it.
        url: String,
        /// The socket's error.
        source: std::io::Error,
    },
    /// A port's TLS could not be set up: a certificate, key, CA or CRL file, or a TLS flag.
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// Anything else, as its message: a URL that cannot be served, a failed join, a data
    /// directory that cannot be written, an error closing the engine.
    #[error("{0}")]
    Other(String),
}

/// Everything the flags decide, checked.
struct Plan {
    dir: PathBuf,
    config: Config,
    member_id: u64,
    /// A new cluster's members, with the names and peer URLs `--initial-cluster` gives them.
    initial_members: Vec<cairn_engine::Peer>,
    /// `--initial-cluster-state existing`: the member joins a running cluster.
    join_existing: bool,
    /// `--force-new-cluster`: a member with data becomes a cluster of one.
    force_new_cluster: bool,
    cluster_id: u64,
    client_urls: Vec<String>,
    advertise_client_urls: Vec<String>,
    peer_urls: Vec<String>,
    /// Peer URLs of the initial members, by ID (where to reach them before the log says).
    initial_peers: Vec<(u64, Vec<String>)>,
    limits: Limits,
    metrics_urls: Vec<String>,
    /// How callers are identified and passwords hashed.
    access: api::access::Settings,
    /// The client port's TLS (also for https metrics URLs, and for dialing the leader).
    client_tls: Option<Tls>,
    /// The peer port's TLS (also for dialing peers).
    peer_tls: Option<Tls>,
    /// The corruption checks asked for.
    checks: config::CorruptionChecks,
    /// How often the leader asks the members' releases (--downgrade-check-time).
    version_checks: Duration,
    /// `--listen-client-http-urls`: when any, the client URLs serve gRPC alone.
    client_http_urls: Vec<String>,
    /// `--enable-grpc-gateway`.
    gateway: bool,
    /// `--enable-pprof`.
    pprof: bool,
    /// `--cors` and `--host-whitelist`.
    http_access: config::HttpAccess,
    /// `--socket-reuse-port` and `--socket-reuse-address`.
    sockets: crate::transport::listen::SocketOptions,
    /// `--max-concurrent-streams` and the gRPC keep-alive flags.
    http2: crate::transport::listen::Http2,
}

/// The plan for a member, with the initial cluster `found` by discovery if any (else the
/// flags', or etcd's temporary cluster of this member alone when discovery is still to run).
fn plan(f: &Flags, found: Option<&crate::transport::discovery::Found>) -> Result<Plan, ServeError> {
    f.removed.check()?;
    f.check_timing()?;
    f.compat.check()?;
    f.transport.check()?;
    f.cluster.check()?;
    crate::transport::discovery::check(f)?;
    f.observability.check(&f.log_outputs)?;
    f.storage.check()?;
    let client_urls = config::url_list("listen-client-urls", &f.listen_client_urls)?;
    let advertise_client_urls = config::url_list("advertise-client-urls", &f.advertise_client_urls)?;
    let peer_urls = config::url_list("listen-peer-urls", &f.listen_peer_urls)?;
    let advertise_peer_urls = config::url_list("initial-advertise-peer-urls", &f.initial_advertise_peer_urls)?;
    let cluster = match (found, &f.initial_cluster) {
        (Some(d), _) => d.initial_cluster.clone(),
        (None, Some(c)) => c.clone(),
        (None, None) => format!("{}={}", f.name, advertise_peer_urls.join(&format!(",{}=", f.name))),
    };
    let token = match found {
        Some(d) => d.token.clone(),
        None => crate::transport::discovery::cluster_token(f)?,
    };
    let members = config::initial_cluster(&cluster, &token)?;
    let me = members.iter().find(|m| m.name == f.name).ok_or_else(|| BadFlag {
        flag: "initial-cluster",
        reason: format!("has no member named {:?} (--name)", f.name),
    })?;
    let mut mine = me.peer_urls.clone();
    let mut advertised = advertise_peer_urls.clone();
    mine.sort();
    advertised.sort();
    // DNS SRV discovery recognised this member by address already.
    if mine != advertised && !found.is_some_and(|d| d.by_address) {
        return Err(BadFlag {
            flag: "initial-advertise-peer-urls",
            reason: format!(
                "{advertised:?} differs from --initial-cluster's {mine:?} for {}",
                f.name
            ),
        }
        .into());
    }
    let retention_ok = match f.auto_compaction_mode {
        CompactionMode::Periodic => config::retention_period(&f.auto_compaction_retention).map(|_| ()),
        CompactionMode::Revision => f
            .auto_compaction_retention
            .trim()
            .parse::<u64>()
            .map(|_| ())
            .map_err(|_| BadFlag {
                flag: "auto-compaction-retention",
                reason: format!("{:?} is not a revision count", f.auto_compaction_retention),
            }),
    };
    retention_ok?;
    let metrics_urls = match f.security.listen_metrics_urls.trim() {
        "" => Vec::new(),
        urls => config::url_list("listen-metrics-urls", urls)?,
    };
    let client_http_urls = match f.transport.listen_client_http_urls.trim() {
        "" => Vec::new(),
        urls => config::url_list("listen-client-http-urls", urls)?,
    };
    let max_request_bytes = usize::try_from(f.max_request_bytes).map_err(|_| BadFlag {
        flag: "max-request-bytes",
        reason: "too large".into(),
    })?;
    let quota = match f.quota_backend_bytes {
        // etcd: a negative quota turns it off, 0 is the default of 2 GiB.
        q if q < 0 => 0,
        0 => 2u64 << 30,
        q => q.unsigned_abs(),
    };
    let tick = Duration::from_millis(f.heartbeat_interval);
    let election_ticks = usize::try_from(f.election_timeout / f.heartbeat_interval).unwrap_or(10);
    let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
    let initial_attributes = config::initial_attributes(&members);
    let dir = f.data_dir();
    let protocols = crate::transport::tls::Protocols::new(
        &f.security.cipher_suites,
        &f.security.tls_min_version,
        &f.security.tls_max_version,
    )?;
    let sec = &f.security;
    let client_tls = port_tls(
        PortTls {
            port: "client",
            files: sec.client_files(),
            auto: sec.auto_tls,
            fixtures: dir.join("fixtures").join("client"),
            validity: sec.self_signed_cert_validity,
        },
        &[&client_urls, &advertise_client_urls, &metrics_urls, &client_http_urls],
        &protocols,
    )?;
    let peer_tls = port_tls(
        PortTls {
            port: "peer",
            files: sec.peer_files(),
            auto: sec.peer_auto_tls,
            fixtures: dir.join("fixtures").join("peer"),
            validity: sec.self_signed_cert_validity,
        },
        &[
            &peer_urls,
            &advertise_peer_urls,
            &members.iter().flat_map(|m| m.peer_urls.clone()).collect::<Vec<_>>(),
        ],
        &protocols,
    )?;
    let initial_members = ids
        .iter()
        .map(|id| cairn_engine::Peer {
            id: *id,
            attributes: initial_attributes.get(id).cloned(),
        })
        .collect();
    let config = Config {
        wal: cairn_engine::wal::Config {
            unsafe_no_fsync: f.storage.unsafe_no_fsync,
            ..cairn_engine::wal::Config::default()
        },
        pre_vote: f.cluster.pre_vote,
        advance_election_ticks: f.cluster.initial_election_tick_advance,
        wal_dir: f.wal_dir(),
        checkpoint_entries: f.snapshot_count,
        snapshot_catch_up_entries: f.compat.snapshot_catchup_entries(),
        watch_progress_interval: f.compat.watch_progress_interval()?,
        raft_tick: tick,
        election_ticks,
        heartbeat_ticks: 1,
        max_txn_ops: usize::try_from(f.max_txn_ops).unwrap_or(usize::MAX),
        quota_backend_bytes: quota,
        // etcd's minimum lease TTL: 1.5 election timeouts, in whole seconds, rounded up.
        min_lease_ttl: i64::try_from((f.election_timeout * 3).div_ceil(2000))
            .unwrap_or(2)
            .max(1),
        request_timeout: Duration::from_millis(5000 + 2 * f.election_timeout),
        simple_token_ttl: Duration::from_secs(f.security.auth_token_ttl.max(1)),
        ..Config::default()
    };
    Ok(Plan {
        dir,
        config,
        member_id: me.id,
        initial_members,
        join_existing: f.initial_cluster_state == ClusterState::Existing,
        force_new_cluster: f.cluster.force_new_cluster,
        cluster_id: crate::ids::cluster_id(&ids),
        client_urls,
        advertise_client_urls,
        peer_urls,
        initial_peers: members.iter().map(|m| (m.id, m.peer_urls.clone())).collect(),
        limits: Limits {
            request: api::validate::Limits {
                max_request_bytes,
                max_txn_ops: usize::try_from(f.max_txn_ops).unwrap_or(usize::MAX),
            },
            quota_backend_bytes: quota,
            slow_request: f.compat.warning_apply_duration()?,
            reconfig: api::cluster::reconfig::Reconfig {
                strict: f.cluster.strict_reconfig_check,
                max_learners: f.cluster.max_learners()?,
            },
        },
        metrics_urls,
        access: access_settings(&f.security)?,
        client_tls,
        peer_tls,
        checks: f.compat.corruption_checks()?,
        version_checks: f.compat.downgrade_check_time()?,
        client_http_urls,
        gateway: f.transport.enable_grpc_gateway,
        pprof: f.observability.enable_pprof,
        http_access: f.transport.http_access()?,
        sockets: crate::transport::listen::SocketOptions {
            reuse_port: f.transport.socket_reuse_port,
            reuse_address: f.transport.socket_reuse_address,
        },
        http2: crate::transport::listen::Http2 {
            max_concurrent_streams: f.transport.max_concurrent_streams,
            keep_alive: f.transport.keep_alive()?,
        },
    })
}

/// The settings in effect, logged once at startup as etcd logs them.
fn log_settings(f: &Flags, plan: &Plan) {
    let c = &plan.config;
    tracing::info!(
        cairn_version = env!("CARGO_PKG_VERSION"),
        etcd_api_version = crate::pb::API_VERSION,
        name = %f.name,
        data_dir = %plan.dir.display(),
        wal_dir = %c.wal_dir.as_ref().map_or(String::new(), |d| d.display().to_string()),
        member_initialized = plan.dir.join("member").exists(),
        listen_client_urls = ?plan.client_urls,
        advertise_client_urls = ?plan.advertise_client_urls,
        listen_peer_urls = ?plan.peer_urls,
        listen_metrics_urls = ?plan.metrics_urls,
        initial_cluster = %f.initial_cluster.clone().unwrap_or_default(),
        initial_cluster_state = ?f.initial_cluster_state,
        initial_cluster_token = %f.initial_cluster_token,
        heartbeat_interval = ?c.raft_tick,
        election_timeout = ?c.raft_tick.saturating_mul(u32::try_from(c.election_ticks).unwrap_or(u32::MAX)),
        snapshot_count = c.checkpoint_entries,
        snapshot_catchup_entries = c.snapshot_catch_up_entries,
        quota_backend_bytes = c.quota_backend_bytes,
        max_request_bytes = plan.limits.request.max_request_bytes,
        max_txn_ops = c.max_txn_ops,
        auto_compaction_mode = ?f.auto_compaction_mode,
        auto_compaction_retention = %f.auto_compaction_retention,
        warning_apply_duration = ?plan.limits.slow_request,
        client_tls = plan.client_tls.is_some(),
        peer_tls = plan.peer_tls.is_some(),
        auth_token = %f.security.auth_token.split(',').next().unwrap_or_default(),
        auto_promote_learners = f.auto_promote_learners,
        log_level = ?f.log_level,
        "starting a cairn server"
    );
}

/// `--auth-token`, `--bcrypt-cost` and `--client-cert-auth`, checked.
fn access_settings(sec: &config::Security) -> Result<api::access::Settings, ServeError> {
    let jwt = match sec.auth_token.split_once(',') {
        _ if sec.auth_token == "simple" => None,
        Some(("jwt", options)) => Some(api::jwt::Jwt::from_options(options).map_err(|reason| BadFlag {
            flag: "auth-token",
            reason,
        })?),
        _ => {
            return Err(BadFlag {
                flag: "auth-token",
                reason: format!("{:?} is neither simple nor jwt,<options>", sec.auth_token),
            }
            .into())
        }
    };
    let bcrypt_cost = if (4..=31).contains(&sec.bcrypt_cost) {
        sec.bcrypt_cost
    } else {
        tracing::warn!(cost = sec.bcrypt_cost, "invalid --bcrypt-cost; using the default, 10");
        10
    };
    Ok(api::access::Settings {
        bcrypt_cost,
        client_cert_auth: sec.client_cert_auth,
        jwt,
    })
}

/// One port's TLS flags.
struct PortTls {
    port: &'static str,
    files: crate::transport::tls::Files,
    /// `--auto-tls` or `--peer-auto-tls`.
    auto: bool,
    /// Where a self-signed certificate is kept.
    fixtures: PathBuf,
    /// Its validity, in years.
    validity: u32,
}

/// A port's TLS, if it has a certificate (its own, or self-signed with auto TLS) or a CA to
/// dial out with; an https URL among `url_lists` without a certificate is an error.
fn port_tls(
    mut p: PortTls,
    url_lists: &[&[String]],
    protocols: &crate::transport::tls::Protocols,
) -> Result<Option<Tls>, ServeError> {
    let port = p.port;
    let https = url_lists
        .iter()
        .flat_map(|l| l.iter())
        .any(|u| u.starts_with("https://"));
    if p.files.cert.is_some() != p.files.key.is_some() {
        return Err(TlsError::Config(format!("the {port} certificate and key files must be given together")).into());
    }
    if !p.files.allowed_cns.is_empty() && !p.files.allowed_hostnames.is_empty() {
        return Err(TlsError::Config(format!(
            "the allowed {port} CNs and allowed {port} hostnames are mutually exclusive"
        ))
        .into());
    }
    if p.auto && p.files.has_cert() {
        tracing::warn!(port, "ignoring auto TLS since certificates are given");
    } else if p.auto {
        let hosts: Vec<String> = url_lists
            .first()
            .into_iter()
            .flat_map(|l| l.iter())
            .filter_map(|u| socket_of(u).ok().map(|(host, _)| host))
            .collect();
        let (cert, key) = crate::transport::tls::self_signed::ensure(&p.fixtures, &hosts, p.validity)?;
        p.files.cert = Some(cert);
        p.files.key = Some(key);
        p.files.self_signed = true;
    }
    if !p.files.has_cert() {
        if https {
            let flags = if port == "client" {
                "--cert-file and --key-file, or --auto-tls"
            } else {
                "--peer-cert-file and --peer-key-file, or --peer-auto-tls"
            };
            return Err(TlsError::Config(format!("an https {port} URL needs a certificate: set {flags}")).into());
        }
        if p.files.trusted_ca.is_none() {
            return Ok(None);
        }
    }
    Ok(Some(Tls::new(p.files, protocols.clone())?))
}

/// `host:port` of a URL the flags accepted.
fn socket_of(url: &str) -> Result<(String, u16), ServeError> {
    let uri: tonic::codegen::http::Uri = url.parse().map_err(|e| ServeError::Other(format!("{url}: {e}")))?;
    let host = uri.host().unwrap_or("127.0.0.1").trim_matches(['[', ']']).to_string();
    let port = uri
        .port_u16()
        .ok_or_else(|| ServeError::Other(format!("{url} has no port")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(ServeError::Other(format!(
            "{url}: only http:// and https:// URLs are served"
        )));
    }
    Ok((host, port))
}

/// A listener bound to a URL's address, not yet serving.
struct Bound {
    url: String,
    tcp: tokio::net::TcpListener,
}

async fn bind(url: &str, options: crate::transport::listen::SocketOptions) -> Result<Bound, ServeError> {
    let (host, port) = socket_of(url)?;
    let tcp = crate::transport::listen::bind(&host, port, options)
        .await
        .map_err(|source| ServeError::Listen {
            url: url.to_string(),
            source,
        })?;
    Ok(Bound {
        url: url.to_string(),
        tcp,
    })
}

async fn bind_all(urls: &[String], options: crate::transport::listen::SocketOptions) -> Result<Vec<Bound>, ServeError> {
    let mut bound = Vec::new();
    for url in urls {
        bound.push(bind(url, options).await?);
    }
    Ok(bound)
}

type Serving = tokio::task::JoinHandle<std::io::Result<()>>;

/// Serves `router` on a bound listener, through `tls` if its URL is https, with `http2`'s
/// settings, until `stop`.
fn serve_on(
    bound: Bound,
    tls: Option<&Tls>,
    port: &'static str,
    router: axum::Router,
    http2: crate::transport::listen::Http2,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<Serving, ServeError> {
    use crate::transport::listen::{ClientCert, Plain};
    if !bound.url.starts_with("https://") {
        let serving = crate::transport::listen::serve(Plain(bound.tcp), router, http2, ClientCert::plain, stop);
        return Ok(tokio::spawn(serving));
    }
    let tls = tls.ok_or_else(|| {
        TlsError::Config(format!(
            "{} is https, but the {port} port has no certificate",
            bound.url
        ))
    })?;
    let listener = TlsListener::new(bound.tcp, tls.clone(), port).map_err(|source| ServeError::Listen {
        url: bound.url.clone(),
        source,
    })?;
    Ok(tokio::spawn(crate::transport::listen::serve(
        listener,
        router,
        http2,
        ClientCert::of_tls,
        stop,
    )))
}

/// What a client listener serves: the gRPC services, the HTTP endpoints (with the JSON
/// gateway unless `--enable-grpc-gateway=false`), or both.
#[derive(Clone)]
struct ClientRoutes {
    grpc: axum::Router,
    http: axum::Router,
    access: config::HttpAccess,
}

impl ClientRoutes {
    /// A listener's router: gRPC if `grpc`, HTTP if `http` (behind the access checks, the
    /// Host check only where `secure` is false), and `unknown_path` for the rest.
    fn router(&self, grpc: bool, http: bool, secure: bool) -> axum::Router {
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
fn client_routes(
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
const LEARNER_METHODS: [&str; 3] = [
    "/etcdserverpb.Maintenance/Status",
    "/etcdserverpb.Maintenance/Snapshot",
    "/etcdserverpb.KV/Range",
];

/// An unknown path: a gRPC call to a method cairn does not have is `Unimplemented` (clients
/// such as kube-apiserver fall back on that code); any other request is 404, as with etcd.
async fn unknown_path(request: axum::extract::Request) -> axum::response::Response {
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

/// Resolves on SIGTERM or SIGINT.
async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

/// Runs a member until SIGTERM or SIGINT.
pub async fn serve(f: Flags) -> Result<(), ServeError> {
    let mut plan = plan(&f, None)?;
    log_settings(&f, &plan);
    if plan.pprof {
        // Before the data is loaded, so that the heap profile shows what holds it.
        api::pprof::start_heap_sampling();
    }
    if let Some(found) = crate::transport::discovery::run(&f, plan.member_id, &plan.dir.join("member")).await? {
        plan = self::plan(&f, Some(&found))?;
    }
    let member_dir = plan.dir.join("member");
    let (member_id, cluster_id) = identity(&plan, &member_dir).await?;
    plan.member_id = member_id;
    let cluster = Arc::new(crate::transport::peer::ClusterId::new(cluster_id));
    let extensive = f.observability.metrics == config::MetricsLevel::Extensive;
    let metrics = Arc::new(Metrics::new(extensive).map_err(|e| ServeError::Other(e.to_string()))?);
    let peers = PeerNetwork::new(
        member_id,
        cluster.clone(),
        &plan.initial_peers,
        Connector::new(plan.peer_tls.clone()),
        metrics.peers.clone(),
    );
    // Bind first: a port in use is reported before anything is opened.
    let client_listeners = bind_all(&plan.client_urls, plan.sockets).await?;
    let client_http_listeners = bind_all(&plan.client_http_urls, plan.sockets).await?;
    let peer_listeners = bind_all(&plan.peer_urls, plan.sockets).await?;
    let metrics_listeners = bind_all(&plan.metrics_urls, plan.sockets).await?;
    // A new member of an existing cluster starts hearing from the leader only once its peer
    // listener is up: serve peers before opening the engine, which waits to catch up.
    let inbox = peers.inbox_slot();
    let kept = Arc::new(crate::transport::peer::Kept::default());
    for bound in peer_listeners {
        let router =
            crate::transport::peer::router(inbox.clone(), cluster.clone(), kept.clone(), metrics.peers.clone());
        let serving = serve_on(
            bound,
            plan.peer_tls.as_ref(),
            "peer",
            router,
            crate::transport::listen::Http2::default(),
            std::future::pending(),
        )?;
        tokio::spawn(async move {
            if let Ok(Err(e)) = serving.await {
                tracing::error!(error = %e, "the peer listener failed");
            }
        });
    }
    let engine = {
        let mut builder = Engine::builder(&member_dir)
            .config(plan.config.clone())
            .member(member_id)
            .transport(peers.transport());
        if plan.force_new_cluster {
            builder = builder.force_new_cluster();
        }
        builder = if plan.join_existing {
            // It learns the members, and everything else, from the cluster's log.
            builder.join_existing()
        } else {
            builder.peers(plan.initial_members.clone())
        };
        tokio::task::spawn_blocking(move || builder.open())
            .await
            .map_err(|e| ServeError::Other(e.to_string()))?
            .map_err(|source| ServeError::Open {
                dir: plan.dir.clone(),
                source,
            })?
    };
    let engine = Arc::new(engine);
    let engine_inbox = engine.inbox().map_err(|e| ServeError::Other(e.to_string()))?;
    peers.attach(&engine, engine_inbox);
    let node = Arc::new(Node {
        engine: engine.clone(),
        cluster: cluster.clone(),
        member_id,
        limits: plan.limits,
        forward: crate::transport::forward::Forwarder::new(Connector::new(plan.client_tls.clone())),
        access: plan.access.clone(),
        leaderless: tokio::sync::watch::channel(0).0,
    });
    let peer_connector = Connector::new(plan.peer_tls.clone());
    if plan.checks.initial {
        crate::job::corruption::initial_check(&node, &peer_connector)
            .await
            .map_err(ServeError::Other)?;
    }
    let (auto_promote, promoting) = (f.auto_promote_learners, node.clone());
    let every = Duration::from_millis(f.heartbeat_interval.saturating_mul(5));
    let background = [
        tokio::spawn(publish(
            node.clone(),
            f.name.clone(),
            plan.advertise_client_urls.clone(),
        )),
        tokio::spawn(crate::job::compactor::run(
            node.clone(),
            f.auto_compaction_mode,
            f.auto_compaction_retention.clone(),
        )),
        tokio::spawn(api::node::watch_leader(
            node.clone(),
            Duration::from_millis(f.election_timeout),
        )),
        tokio::spawn(async move {
            if auto_promote {
                crate::job::promoter::run(promoting, every).await;
            }
        }),
        tokio::spawn(crate::job::versions::run(
            node.clone(),
            peer_connector.clone(),
            plan.version_checks,
        )),
        tokio::spawn(crate::job::corruption::run(
            node.clone(),
            peer_connector,
            plan.checks,
            kept,
        )),
    ];
    let http_only = api::http::router(node.clone(), metrics.clone());
    let routes = client_routes(
        node.clone(),
        metrics,
        f.initial_cluster_token.clone(),
        plan.gateway,
        plan.pprof,
        plan.http_access.clone(),
    );
    tracing::info!(
        name = %f.name,
        member = format_args!("{member_id:x}"),
        cluster = format_args!("{:x}", cluster.get()),
        clients = ?plan.client_urls,
        data_dir = %plan.dir.display(),
        release = cairn_engine::version::RELEASE,
        cluster_version = %engine.versions().cluster(),
        storage_version = %engine.versions().cluster(),
        "serving"
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut servers = Vec::new();
    let stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // With --listen-client-http-urls, HTTP moves off the client URLs onto those.
    let http_apart = !plan.client_http_urls.is_empty();
    let listeners = client_listeners
        .into_iter()
        .map(|b| (b, true, !http_apart))
        .chain(client_http_listeners.into_iter().map(|b| (b, false, true)));
    for (bound, grpc, http) in listeners {
        let tls = plan.client_tls.as_ref();
        let router = routes.router(grpc, http, bound.url.starts_with("https://"));
        servers.push(serve_on(
            bound,
            tls,
            "client",
            router,
            plan.http2,
            stop(stop_rx.clone()),
        )?);
    }
    for bound in metrics_listeners {
        let tls = plan.client_tls.as_ref();
        servers.push(serve_on(
            bound,
            tls,
            "metrics",
            http_only.clone(),
            plan.http2,
            stop(stop_rx.clone()),
        )?);
    }
    crate::run::systemd::ready();
    let watchdog =
        crate::run::systemd::watchdog_period().map(|period| tokio::spawn(crate::run::systemd::keep_alive(period)));
    stop_signal().await;
    crate::run::systemd::stopping();
    if let Some(w) = watchdog {
        w.abort();
    }
    // A leader hands its leadership over first, as etcd does on shutdown: the others go on
    // without waiting out an election timeout, and the writes in flight carry over to the
    // new leader (the node holds what raft cannot take during the handover).
    let leaving = engine.clone();
    match tokio::task::spawn_blocking(move || leaving.step_down()).await {
        Ok(Ok(Some(to))) => tracing::info!(leader = %format!("{to:x}"), "stopping: handed the leadership over"),
        Ok(Ok(None)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "stopping: could not hand the leadership over"),
        Err(e) => tracing::warn!(error = %e, "stopping: could not hand the leadership over"),
    }
    tracing::info!("stopping: finishing requests in flight");
    let _ = stop_tx.send(true);
    // Requests in flight finish; streams that would outlive the grace period (a watch never
    // ends by itself) are cut when it is over.
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
    for mut s in servers {
        match tokio::time::timeout_at(deadline, &mut s).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "a client listener stopped with an error"),
            Ok(_) => {}
            Err(_) => {
                tracing::info!("closing the streams still open");
                s.abort();
            }
        }
    }
    for task in background {
        task.abort();
        let _ = task.await;
    }
    drop(routes);
    peers.detach();
    drop(node);
    let closed = tokio::task::spawn_blocking(move || match Arc::try_unwrap(engine) {
        Ok(engine) => engine.close(),
        // Something still holds it (a stream that outlived its listener): its drop closes it.
        Err(_) => Ok(()),
    })
    .await
    .map_err(|e| ServeError::Other(e.to_string()))?;
    closed.map_err(|e| ServeError::Other(format!("closing the engine: {e}")))?;
    tracing::info!("stopped");
    Ok(())
}

/// This member's ID and its cluster's: recorded in `member_dir` once known; derived from the
/// flags for a new cluster's member; asked of the peers by a member joining an existing one.
async fn identity(plan: &Plan, member_dir: &std::path::Path) -> Result<(u64, u64), ServeError> {
    use crate::transport::peer::{discover, load_cluster_id, load_member_id, store_cluster_id, store_member_id};
    let write_error = |e: std::io::Error| ServeError::Other(format!("cannot write to {}: {e}", member_dir.display()));
    if let Some(cluster) = load_cluster_id(member_dir) {
        return Ok((load_member_id(member_dir).unwrap_or(plan.member_id), cluster));
    }
    if !plan.join_existing {
        store_cluster_id(member_dir, plan.cluster_id).map_err(write_error)?;
        return Ok((plan.member_id, plan.cluster_id));
    }
    let others: Vec<String> = plan
        .initial_peers
        .iter()
        .filter(|(id, _)| *id != plan.member_id)
        .flat_map(|(_, urls)| urls.iter().cloned())
        .collect();
    let mine = plan
        .initial_peers
        .iter()
        .find(|(id, _)| *id == plan.member_id)
        .map(|(_, urls)| urls.clone())
        .unwrap_or_default();
    let connector = Connector::new(plan.peer_tls.clone());
    let (member, cluster) = discover(&connector, &others, &mine, JOIN_PATIENCE)
        .await
        .map_err(|e| ServeError::Other(format!("cannot join the existing cluster: {e}")))?;
    tracing::info!(
        member = format_args!("{member:x}"),
        cluster = format_args!("{cluster:x}"),
        "joining the existing cluster"
    );
    store_member_id(member_dir, member).map_err(write_error)?;
    store_cluster_id(member_dir, cluster).map_err(write_error)?;
    Ok((member, cluster))
}

/// Records this member's name and client URLs in the cluster once it can (etcd's publish),
/// retrying until it is applied.
async fn publish(node: Arc<Node>, name: String, client_urls: Vec<String>) {
    loop {
        let already = node
            .engine
            .member_list()
            .into_iter()
            .any(|m| m.id == node.member_id && m.name == name && m.client_urls == client_urls);
        if already {
            return;
        }
        let (n, urls) = (name.clone(), client_urls.clone());
        match node.blocking(move |e| e.member_publish(n, urls)).await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(error = %e.message(), "publishing this member's attributes; will retry");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}
