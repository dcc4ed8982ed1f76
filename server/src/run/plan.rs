//! What the flags decide for a member, checked before anything starts: its directories,
//! engine configuration, identity, URLs, limits, TLS and access settings; logged once at
//! startup.

use std::path::PathBuf;
use std::time::Duration;

use cairn_engine::Config;

use crate::api;
use crate::api::node::Limits;
use crate::config::{self, BadFlag, ClusterState, CompactionMode, Flags};
use crate::transport::tls::{Tls, TlsError};

use super::error::ServeError;
use super::listeners::socket_of;

/// Everything the flags decide, checked.
pub(super) struct Plan {
    pub(super) dir: PathBuf,
    pub(super) config: Config,
    pub(super) member_id: u64,
    /// A new cluster's members, with the names and peer URLs `--initial-cluster` gives them.
    pub(super) initial_members: Vec<cairn_engine::Peer>,
    /// `--initial-cluster-state existing`: the member joins a running cluster.
    pub(super) join_existing: bool,
    /// `--force-new-cluster`: a member with data becomes a cluster of one.
    pub(super) force_new_cluster: bool,
    pub(super) cluster_id: u64,
    pub(super) client_urls: Vec<String>,
    pub(super) advertise_client_urls: Vec<String>,
    pub(super) peer_urls: Vec<String>,
    /// Peer URLs of the initial members, by ID (where to reach them before the log says).
    pub(super) initial_peers: Vec<(u64, Vec<String>)>,
    pub(super) limits: Limits,
    pub(super) metrics_urls: Vec<String>,
    /// How callers are identified and passwords hashed.
    pub(super) access: api::access::Settings,
    /// The client port's TLS (also for https metrics URLs, and for dialing the leader).
    pub(super) client_tls: Option<Tls>,
    /// The peer port's TLS (also for dialing peers).
    pub(super) peer_tls: Option<Tls>,
    /// The corruption checks asked for.
    pub(super) checks: config::CorruptionChecks,
    /// How often the leader asks the members' releases (--downgrade-check-time).
    pub(super) version_checks: Duration,
    /// `--listen-client-http-urls`: when any, the client URLs serve gRPC alone.
    pub(super) client_http_urls: Vec<String>,
    /// `--enable-grpc-gateway`.
    pub(super) gateway: bool,
    /// `--enable-pprof`.
    pub(super) pprof: bool,
    /// `--cors` and `--host-whitelist`.
    pub(super) http_access: config::HttpAccess,
    /// `--socket-reuse-port` and `--socket-reuse-address`.
    pub(super) sockets: crate::transport::listen::SocketOptions,
    /// `--max-concurrent-streams` and the gRPC keep-alive flags.
    pub(super) http2: crate::transport::listen::Http2,
}

/// The plan for a member, with the initial cluster `found` by discovery if any (else the
/// flags', or etcd's temporary cluster of this member alone when discovery is still to run).
pub(super) fn plan(f: &Flags, found: Option<&crate::transport::discovery::Found>) -> Result<Plan, ServeError> {
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
pub(super) fn log_settings(f: &Flags, plan: &Plan) {
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
pub(super) fn access_settings(sec: &config::Security) -> Result<api::access::Settings, ServeError> {
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
pub(super) struct PortTls {
    pub(super) port: &'static str,
    pub(super) files: crate::transport::tls::Files,
    /// `--auto-tls` or `--peer-auto-tls`.
    pub(super) auto: bool,
    /// Where a self-signed certificate is kept.
    pub(super) fixtures: PathBuf,
    /// Its validity, in years.
    pub(super) validity: u32,
}

/// A port's TLS, if it has a certificate (its own, or self-signed with auto TLS) or a CA to
/// dial out with; an https URL among `url_lists` without a certificate is an error.
pub(super) fn port_tls(
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
