//! Prometheus metrics with etcd's names where etcd has them. Most are read from the engine
//! when scraped; the request counters are kept as requests happen.

use prometheus::proto::{Bucket, Histogram, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

use crate::node::Node;

/// The registry and every metric cairn exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    has_leader: IntGauge,
    is_leader: IntGauge,
    leader_changes: IntGauge,
    proposals_committed: IntGauge,
    proposals_applied: IntGauge,
    proposals_pending: IntGauge,
    proposals_failed: IntGauge,
    db_total_size: IntGauge,
    db_in_use_size: IntGauge,
    keys_total: IntGauge,
    watchers: IntGauge,
    leases: IntGauge,
    current_revision: IntGauge,
    compact_revision: IntGauge,
    snapshots_installed: IntGauge,
    /// gRPC requests refused before reaching the engine (too large, too many).
    pub refused: IntCounter,
    /// gRPC calls started, by type, service and method (etcd's go-grpc-prometheus name).
    grpc_started: IntCounterVec,
}

fn gauge(registry: &Registry, name: &str, help: &str) -> Result<IntGauge, prometheus::Error> {
    let g = IntGauge::with_opts(Opts::new(name, help))?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

impl Metrics {
    /// Every metric, registered in a registry of their own. An error means a metric's name or
    /// help is invalid, or two share a name: a bug, not a condition to handle.
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let r = Registry::new();
        let refused = IntCounter::with_opts(Opts::new(
            "cairn_grpc_requests_refused_total",
            "Requests refused before reaching the engine.",
        ))?;
        r.register(Box::new(refused.clone()))?;
        let grpc_started = IntCounterVec::new(
            Opts::new(
                "grpc_server_started_total",
                "Total number of RPCs started on the server.",
            ),
            &["grpc_type", "grpc_service", "grpc_method"],
        )?;
        r.register(Box::new(grpc_started.clone()))?;
        Ok(Metrics {
            has_leader: gauge(&r, "etcd_server_has_leader", "Whether a leader exists: 1 is yes, 0 no.")?,
            is_leader: gauge(&r, "etcd_server_is_leader", "Whether this member is the leader.")?,
            leader_changes: gauge(
                &r,
                "etcd_server_leader_changes_seen_total",
                "Leader changes seen by this member.",
            )?,
            proposals_committed: gauge(
                &r,
                "etcd_server_proposals_committed_total",
                "The last committed log index.",
            )?,
            proposals_applied: gauge(&r, "etcd_server_proposals_applied_total", "The last applied log index.")?,
            proposals_pending: gauge(
                &r,
                "etcd_server_proposals_pending",
                "Proposals waiting for their answer.",
            )?,
            proposals_failed: gauge(
                &r,
                "etcd_server_proposals_failed_total",
                "Proposals dropped uncommitted.",
            )?,
            db_total_size: gauge(
                &r,
                "etcd_mvcc_db_total_size_in_bytes",
                "Bytes the data files take on disk.",
            )?,
            db_in_use_size: gauge(
                &r,
                "etcd_mvcc_db_total_size_in_use_in_bytes",
                "Bytes of history kept in the data files.",
            )?,
            keys_total: gauge(&r, "etcd_debugging_mvcc_keys_total", "Keys that exist now.")?,
            watchers: gauge(&r, "etcd_debugging_mvcc_watcher_total", "Watchers open now.")?,
            leases: gauge(&r, "etcd_debugging_lease_total", "Leases that exist now.")?,
            current_revision: gauge(&r, "etcd_debugging_mvcc_current_revision", "The current revision.")?,
            compact_revision: gauge(&r, "etcd_debugging_mvcc_compact_revision", "The compacted revision.")?,
            snapshots_installed: gauge(
                &r,
                "etcd_network_snapshot_receive_success",
                "Snapshots received from the leader and installed since this member started.",
            )?,
            refused,
            grpc_started,
            registry: r,
        })
    }

    /// Counts a gRPC call to `path` (`/<service>/<method>`) as started, if it names one of
    /// etcd's methods (a client's made-up path must not grow the label set).
    pub fn grpc_call(&self, path: &str) {
        let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
            return;
        };
        if let Some((service, method, kind)) = GRPC_METHODS.iter().find(|(s, m, _)| *s == service && *m == method) {
            self.grpc_started.with_label_values(&[kind, service, method]).inc();
        }
    }

    fn set(g: &IntGauge, v: u64) {
        g.set(i64::try_from(v).unwrap_or(i64::MAX));
    }

    /// Reads the engine and renders every metric as Prometheus text.
    pub fn render(&self, node: &Node) -> Result<String, String> {
        let e = &node.engine;
        let raft = e.raft_status();
        Self::set(&self.has_leader, u64::from(raft.leader.is_some()));
        Self::set(&self.is_leader, u64::from(raft.leader == Some(node.member_id)));
        Self::set(&self.leader_changes, raft.leader_changes);
        Self::set(&self.proposals_committed, raft.commit_index);
        Self::set(&self.proposals_applied, raft.applied_index);
        Self::set(&self.proposals_pending, raft.proposals_pending);
        Self::set(&self.proposals_failed, raft.proposals_failed);
        Self::set(&self.db_total_size, e.size());
        Self::set(&self.db_in_use_size, e.size_in_use());
        Self::set(&self.keys_total, e.key_count() as u64);
        Self::set(&self.watchers, e.watcher_count() as u64);
        Self::set(&self.leases, e.leases().len() as u64);
        self.current_revision.set(e.current_revision());
        self.compact_revision.set(e.compacted_revision());
        Self::set(&self.snapshots_installed, e.snapshots_installed());
        let mut families = self.registry.gather();
        if let Ok(wal) = e.wal_stats() {
            families.push(histogram_family(
                "etcd_disk_wal_fsync_duration_seconds",
                "The latency of the WAL's fdatasync calls.",
                &wal.fsync_latency_us,
            ));
        }
        families.push(histogram_family(
            "etcd_disk_backend_commit_duration_seconds",
            "The latency of checkpoints (data files synced, checkpoint written): cairn's backend commit.",
            &e.checkpoint_latency_us(),
        ));
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&families, &mut out)
            .map_err(|e| e.to_string())?;
        String::from_utf8(out).map_err(|e| e.to_string())
    }
}

/// etcd's client methods, with their kinds as go-grpc-prometheus labels them.
const GRPC_METHODS: &[(&str, &str, &str)] = &[
    ("etcdserverpb.KV", "Range", "unary"),
    ("etcdserverpb.KV", "RangeStream", "server_stream"),
    ("etcdserverpb.KV", "Put", "unary"),
    ("etcdserverpb.KV", "DeleteRange", "unary"),
    ("etcdserverpb.KV", "Txn", "unary"),
    ("etcdserverpb.KV", "Compact", "unary"),
    ("etcdserverpb.Watch", "Watch", "bidi_stream"),
    ("etcdserverpb.Lease", "LeaseGrant", "unary"),
    ("etcdserverpb.Lease", "LeaseRevoke", "unary"),
    ("etcdserverpb.Lease", "LeaseKeepAlive", "bidi_stream"),
    ("etcdserverpb.Lease", "LeaseTimeToLive", "unary"),
    ("etcdserverpb.Lease", "LeaseLeases", "unary"),
    ("etcdserverpb.Cluster", "MemberAdd", "unary"),
    ("etcdserverpb.Cluster", "MemberRemove", "unary"),
    ("etcdserverpb.Cluster", "MemberUpdate", "unary"),
    ("etcdserverpb.Cluster", "MemberList", "unary"),
    ("etcdserverpb.Cluster", "MemberPromote", "unary"),
    ("etcdserverpb.Maintenance", "Alarm", "unary"),
    ("etcdserverpb.Maintenance", "Status", "unary"),
    ("etcdserverpb.Maintenance", "Defragment", "unary"),
    ("etcdserverpb.Maintenance", "Hash", "unary"),
    ("etcdserverpb.Maintenance", "HashKV", "unary"),
    ("etcdserverpb.Maintenance", "Snapshot", "server_stream"),
    ("etcdserverpb.Maintenance", "MoveLeader", "unary"),
    ("etcdserverpb.Maintenance", "Downgrade", "unary"),
    ("etcdserverpb.Auth", "AuthEnable", "unary"),
    ("etcdserverpb.Auth", "AuthDisable", "unary"),
    ("etcdserverpb.Auth", "AuthStatus", "unary"),
    ("etcdserverpb.Auth", "Authenticate", "unary"),
    ("etcdserverpb.Auth", "UserAdd", "unary"),
    ("etcdserverpb.Auth", "UserGet", "unary"),
    ("etcdserverpb.Auth", "UserList", "unary"),
    ("etcdserverpb.Auth", "UserDelete", "unary"),
    ("etcdserverpb.Auth", "UserChangePassword", "unary"),
    ("etcdserverpb.Auth", "UserGrantRole", "unary"),
    ("etcdserverpb.Auth", "UserRevokeRole", "unary"),
    ("etcdserverpb.Auth", "RoleAdd", "unary"),
    ("etcdserverpb.Auth", "RoleGet", "unary"),
    ("etcdserverpb.Auth", "RoleList", "unary"),
    ("etcdserverpb.Auth", "RoleDelete", "unary"),
    ("etcdserverpb.Auth", "RoleGrantPermission", "unary"),
    ("etcdserverpb.Auth", "RoleRevokePermission", "unary"),
    ("grpc.health.v1.Health", "Check", "unary"),
    ("grpc.health.v1.Health", "Watch", "server_stream"),
];

/// A Prometheus histogram, in seconds with etcd's buckets (1 ms doubling to 8.192 s), from a
/// histogram of microseconds.
fn histogram_family(name: &str, help: &str, us: &cairn_engine::wal::Distribution) -> MetricFamily {
    let mut buckets = Vec::new();
    let mut bound_s = 0.001f64;
    for _ in 0..14 {
        let bound_us = (bound_s * 1e6) as u64;
        let mut b = Bucket::default();
        b.set_upper_bound(bound_s);
        b.set_cumulative_count(us.count_at_most(bound_us));
        buckets.push(b);
        bound_s *= 2.0;
    }
    let mut h = Histogram::default();
    h.set_sample_count(us.len());
    // The mean times the count: HDR keeps no exact sum.
    h.set_sample_sum(us.mean() * us.len() as f64 / 1e6);
    h.set_bucket(buckets);
    let mut m = Metric::default();
    m.set_histogram(h);
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(MetricType::HISTOGRAM);
    f.set_metric(vec![m]);
    f
}
