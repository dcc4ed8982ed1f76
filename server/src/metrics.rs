//! Prometheus metrics with etcd's names where etcd has them. Most are read from the engine
//! when scraped; the request counters are kept as requests happen.

use prometheus::{Encoder, IntCounter, IntGauge, Opts, Registry, TextEncoder};

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
    /// gRPC requests refused before reaching the engine (too large, too many).
    pub refused: IntCounter,
}

fn gauge(registry: &Registry, name: &str, help: &str) -> Result<IntGauge, prometheus::Error> {
    let g = IntGauge::with_opts(Opts::new(name, help))?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let r = Registry::new();
        let refused = IntCounter::with_opts(Opts::new(
            "cairn_grpc_requests_refused_total",
            "Requests refused before reaching the engine.",
        ))?;
        r.register(Box::new(refused.clone()))?;
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
            refused,
            registry: r,
        })
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
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .map_err(|e| e.to_string())?;
        String::from_utf8(out).map_err(|e| e.to_string())
    }
}
