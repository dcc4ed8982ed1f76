//! Prometheus metrics with etcd's names, types, labels and buckets, so that etcd's
//! monitoring mixin (its alerts and dashboard), its runbooks and `etcdctl check` read cairn
//! as they read etcd. Most are read from the engine when scraped; the gRPC calls
//! ([`grpc`]) and the peer transport ([`peer`]) are counted as they happen; `process_*` is
//! the process collector's, as Go's client exports it.

mod grpc;

use std::sync::Arc;

use prometheus::proto::{Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, IntGauge, Opts, Registry, TextEncoder};

pub use crate::transport::peer_metrics::{PeerMetrics, PROBE_EVERY};
pub use grpc::GrpcMetrics;

use crate::api::node::Node;

/// The registry and every metric cairn exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    has_leader: IntGauge,
    is_leader: IntGauge,
    proposals_committed: IntGauge,
    proposals_applied: IntGauge,
    proposals_pending: IntGauge,
    db_total_size: IntGauge,
    db_in_use_size: IntGauge,
    quota_backend_bytes: IntGauge,
    keys_total: IntGauge,
    watchers: IntGauge,
    leases: IntGauge,
    current_revision: IntGauge,
    compact_revision: IntGauge,
    snapshots_installed: IntGauge,
    /// gRPC calls, as go-grpc-prometheus counts them.
    pub grpc: Arc<GrpcMetrics>,
    /// The peer transport's traffic.
    pub peers: PeerMetrics,
}

fn gauge(registry: &Registry, name: &str, help: &str) -> Result<IntGauge, prometheus::Error> {
    let g = IntGauge::with_opts(Opts::new(name, help))?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

impl Metrics {
    /// Every metric, registered in a registry of their own; `extensive` (`--metrics
    /// extensive`) adds the gRPC handling-time histograms. An error means a metric's name or
    /// help is invalid, or two share a name: a bug, not a condition to handle.
    pub fn new(extensive: bool) -> Result<Metrics, prometheus::Error> {
        let r = Registry::new();
        r.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
        Ok(Metrics {
            has_leader: gauge(
                &r,
                "etcd_server_has_leader",
                "1 while this member knows a Raft leader, 0 while it does not.",
            )?,
            is_leader: gauge(
                &r,
                "etcd_server_is_leader",
                "1 while this member is the Raft leader, 0 otherwise.",
            )?,
            proposals_committed: gauge(
                &r,
                "etcd_server_proposals_committed_total",
                "Raft entries known to be committed.",
            )?,
            proposals_applied: gauge(
                &r,
                "etcd_server_proposals_applied_total",
                "Raft entries applied to the state machine.",
            )?,
            proposals_pending: gauge(
                &r,
                "etcd_server_proposals_pending",
                "Proposals this member made that are not yet applied.",
            )?,
            db_total_size: gauge(
                &r,
                "etcd_mvcc_db_total_size_in_bytes",
                "Bytes the data files take on disk.",
            )?,
            db_in_use_size: gauge(
                &r,
                "etcd_mvcc_db_total_size_in_use_in_bytes",
                "Bytes of the data files that hold live data; the rest is freed space that defragmentation returns.",
            )?,
            quota_backend_bytes: gauge(
                &r,
                "etcd_server_quota_backend_bytes",
                "The --quota-backend-bytes in force: the data size at which the NOSPACE alarm is raised.",
            )?,
            keys_total: gauge(&r, "etcd_debugging_mvcc_keys_total", "Keys that currently exist.")?,
            watchers: gauge(&r, "etcd_debugging_mvcc_watcher_total", "Watchers open on this member.")?,
            leases: gauge(&r, "etcd_debugging_lease_total", "Leases that currently exist.")?,
            current_revision: gauge(
                &r,
                "etcd_debugging_mvcc_current_revision",
                "The newest revision in the key space.",
            )?,
            compact_revision: gauge(
                &r,
                "etcd_debugging_mvcc_compact_revision",
                "The revision the key space was last compacted at.",
            )?,
            snapshots_installed: gauge(
                &r,
                "etcd_network_snapshot_receive_success",
                "Snapshots received from the leader and installed since this member started.",
            )?,
            grpc: Arc::new(GrpcMetrics::new(&r, extensive)?),
            peers: PeerMetrics::new(&r)?,
            registry: r,
        })
    }

    fn set(g: &IntGauge, v: u64) {
        g.set(i64::try_from(v).unwrap_or(i64::MAX));
    }

    /// Reads the engine and renders every metric as Prometheus text.
    pub fn render(&self, node: &Node) -> Result<String, String> {
        let e = &node.engine;
        let status = e.status();
        Self::set(&self.has_leader, u64::from(status.leader.is_some()));
        Self::set(&self.is_leader, u64::from(status.leader == Some(node.member_id)));
        Self::set(&self.proposals_committed, status.commit_index);
        Self::set(&self.proposals_applied, status.applied_index);
        Self::set(&self.proposals_pending, status.proposals_pending);
        Self::set(&self.db_total_size, status.size);
        Self::set(&self.db_in_use_size, status.size_in_use);
        Self::set(&self.quota_backend_bytes, node.limits.quota_backend_bytes);
        Self::set(&self.keys_total, status.keys as u64);
        Self::set(&self.watchers, status.watchers as u64);
        Self::set(&self.leases, status.leases as u64);
        self.current_revision.set(status.current_revision);
        self.compact_revision.set(status.compacted_revision);
        Self::set(&self.snapshots_installed, status.snapshots_installed);
        let mut families = self.registry.gather();
        families.push(counter_family(
            "etcd_server_leader_changes_seen_total",
            "Times this member has seen the Raft leader change.",
            status.leader_changes,
        ));
        families.push(counter_family(
            "etcd_server_proposals_failed_total",
            "Proposals that failed or timed out before they were applied.",
            status.proposals_failed,
        ));
        families.push(info_family(
            "etcd_server_id",
            "Always 1; the server_id label holds this member's ID in hex.",
            "server_id",
            &format!("{:x}", node.member_id),
        ));
        families.push(info_family(
            "etcd_server_version",
            "Always 1; the server_version label holds the etcd API version served.",
            "server_version",
            crate::pb::API_VERSION,
        ));
        let checkpoints = e.server().checkpoint_latency_us();
        if let Ok(wal) = e.server().wal_stats() {
            families.push(histogram_family(
                "etcd_disk_wal_fsync_duration_seconds",
                "Seconds each fdatasync of the write-ahead log took.",
                &wal.fsync_latency_us,
            ));
            // etcd's backend commit is what makes applied state durable (bbolt's write and
            // fsync, every 100 ms). cairn's applied state is durable through the WAL's fsyncs
            // and, for the data files, its checkpoints: both are its backend commits, so a
            // slow disk fires the mixin's commit-duration alert as it fires on etcd.
            families.push(histogram_family(
                "etcd_disk_backend_commit_duration_seconds",
                "The latency distributions of commit called by backend: the WAL's fsyncs and the checkpoints that sync the data files.",
                &wal.fsync_latency_us.merged(&checkpoints),
            ));
        }
        families.push(histogram_family(
            "cairn_checkpoint_duration_seconds",
            "The latency distributions of checkpoints: data files synced, then the checkpoint written and synced.",
            &checkpoints,
        ));
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&families, &mut out)
            .map_err(|e| e.to_string())?;
        String::from_utf8(out).map_err(|e| e.to_string())
    }
}

/// A counter read from the engine when scraped (it counts since the engine opened).
fn counter_family(name: &str, help: &str, value: u64) -> MetricFamily {
    let mut c = Counter::default();
    c.set_value(value as f64);
    let mut m = Metric::default();
    m.set_counter(c);
    family(name, help, MetricType::COUNTER, vec![m])
}

/// A gauge of 1 whose one label names something (a version, an ID), as etcd's are.
fn info_family(name: &str, help: &str, label: &str, value: &str) -> MetricFamily {
    let mut g = Gauge::default();
    g.set_value(1.0);
    let mut pair = LabelPair::default();
    pair.set_name(label.to_string());
    pair.set_value(value.to_string());
    let mut m = Metric::default();
    m.set_gauge(g);
    m.set_label(vec![pair]);
    family(name, help, MetricType::GAUGE, vec![m])
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

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
    family(name, help, MetricType::HISTOGRAM, vec![m])
}
