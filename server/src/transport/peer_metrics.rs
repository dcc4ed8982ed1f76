//! The peer transport's metrics, with etcd's rafthttp names: bytes sent to and received from
//! each peer, messages that could not be sent, and the round trip of a probe to each peer
//! (`etcd_network_peer_round_trip_time_seconds`, which etcd's mixin alerts on). Peers are
//! labelled by their member ID in hex, as etcd labels them.

use std::time::Duration;

use prometheus::{exponential_buckets, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// How often each peer is probed for its round trip (etcd probes every read timeout less a
/// second: 4 s by default).
pub const PROBE_EVERY: Duration = Duration::from_secs(4);

/// The counters, in the member's registry.
#[derive(Debug, Clone)]
pub struct PeerMetrics {
    sent_bytes: IntCounterVec,
    received_bytes: IntCounterVec,
    sent_failures: IntCounterVec,
    received_failures: IntCounterVec,
    round_trip: HistogramVec,
}

fn id(member: u64) -> String {
    format!("{member:x}")
}

impl PeerMetrics {
    /// Registers the metrics in `r`.
    pub fn new(r: &Registry) -> Result<PeerMetrics, prometheus::Error> {
        let counter = |name: &str, help: &str, label: &str| -> Result<IntCounterVec, prometheus::Error> {
            let c = IntCounterVec::new(Opts::new(name, help), &[label])?;
            r.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let round_trip = HistogramVec::new(
            HistogramOpts::new(
                "etcd_network_peer_round_trip_time_seconds",
                "Seconds a probe takes to reach each peer and come back.",
            )
            .buckets(exponential_buckets(0.0001, 2.0, 16)?),
            &["To"],
        )?;
        r.register(Box::new(round_trip.clone()))?;
        Ok(PeerMetrics {
            sent_bytes: counter(
                "etcd_network_peer_sent_bytes_total",
                "Bytes written to each peer.",
                "To",
            )?,
            received_bytes: counter(
                "etcd_network_peer_received_bytes_total",
                "Bytes read from each peer.",
                "From",
            )?,
            sent_failures: counter(
                "etcd_network_peer_sent_failures_total",
                "Failures sending messages to each peer.",
                "To",
            )?,
            received_failures: counter(
                "etcd_network_peer_received_failures_total",
                "Failures reading messages from each peer.",
                "From",
            )?,
            round_trip,
        })
    }

    /// The counter of bytes sent to member `to`, looked up once for a call's stream of
    /// messages.
    pub fn sent_to(&self, to: u64) -> prometheus::IntCounter {
        self.sent_bytes.with_label_values(&[&id(to)])
    }

    /// `bytes` received from member `from`.
    pub fn received(&self, from: u64, bytes: usize) {
        self.received_bytes.with_label_values(&[&id(from)]).inc_by(bytes as u64);
    }

    /// `messages` that could not be sent to member `to`.
    pub fn send_failed(&self, to: u64, messages: u64) {
        self.sent_failures.with_label_values(&[&id(to)]).inc_by(messages);
    }

    /// A stream from member `from` that broke off.
    pub fn receive_failed(&self, from: u64) {
        self.received_failures.with_label_values(&[&id(from)]).inc();
    }

    /// A probe's round trip to member `to`.
    pub fn round_trip(&self, to: u64, took: Duration) {
        self.round_trip
            .with_label_values(&[&id(to)])
            .observe(took.as_secs_f64());
    }
}
