//! `/metrics` as etcd's monitoring mixin, its runbooks and `etcdctl check` read it: etcd's
//! names, types and labels for the gRPC calls (by method and code), the quota, the peers, the
//! counters that are counters, and the process; and the quota gauges reach the mixin's 95%
//! before NOSPACE refuses a write.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::time::{Duration, Instant};

mod common;

use common::Member;

/// Every sample of `name` (with any labels) and its value.
fn samples(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let bare = series.split('{').next()?;
            let value: f64 = value.parse().ok()?;
            (bare == name).then(|| (series.to_string(), value))
        })
        .collect()
}

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn grpc_calls_quota_counters_and_process_are_exported_as_etcd_exports_them() {
    let m = Member::start("metrics", &["--metrics=extensive", "--quota-backend-bytes=1073741824"]);
    m.ok(&["put", "k", "v"]);
    m.ok(&["put", "k", "v2"]);
    m.ok(&["compaction", "3"]);
    // A read of a compacted revision: OutOfRange, which the mixin counts as failed.
    m.fails(&["get", "k", "--rev=1"], "required revision has been compacted");
    let (_, text) = m.get("/metrics");
    for (name, kind) in [
        ("grpc_server_started_total", "counter"),
        ("grpc_server_handled_total", "counter"),
        ("grpc_server_msg_received_total", "counter"),
        ("grpc_server_msg_sent_total", "counter"),
        ("grpc_server_handling_seconds", "histogram"),
        ("etcd_network_client_grpc_received_bytes_total", "counter"),
        ("etcd_network_client_grpc_sent_bytes_total", "counter"),
        ("etcd_server_leader_changes_seen_total", "counter"),
        ("etcd_server_proposals_failed_total", "counter"),
        ("etcd_server_quota_backend_bytes", "gauge"),
        ("etcd_mvcc_db_total_size_in_bytes", "gauge"),
        ("etcd_disk_wal_fsync_duration_seconds", "histogram"),
        ("etcd_disk_backend_commit_duration_seconds", "histogram"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_cpu_seconds_total", "counter"),
        ("process_open_fds", "gauge"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} is not a {kind}"
        );
    }
    let ok_puts = r#"grpc_server_handled_total{grpc_code="OK",grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"}"#;
    assert_eq!(value(&text, ok_puts), Some(2.0), "two puts answered OK");
    let out_of_range = r#"grpc_server_handled_total{grpc_code="OutOfRange",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"}"#;
    assert_eq!(value(&text, out_of_range), Some(1.0));
    let received =
        r#"grpc_server_msg_received_total{grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"}"#;
    assert_eq!(value(&text, received), Some(2.0));
    assert_eq!(value(&text, "etcd_server_quota_backend_bytes"), Some(1073741824.0));
    assert_eq!(value(&text, "etcd_server_leader_changes_seen_total"), Some(1.0));
    assert!(value(&text, "process_resident_memory_bytes").is_some_and(|v| v > 0.0));
    assert!(!samples(&text, "grpc_server_handling_seconds_bucket").is_empty());
    // Without --metrics=extensive, as in etcd, no handling-time histogram.
    let basic = Member::start("basic", &[]);
    assert!(!basic.get("/metrics").1.contains("grpc_server_handling_seconds"));
    // A negative quota turns it off, as in etcd.
    let unbounded = Member::start("unbounded", &["--quota-backend-bytes=-1"]);
    assert_eq!(
        value(&unbounded.get("/metrics").1, "etcd_server_quota_backend_bytes"),
        Some(0.0)
    );
    // Past etcd's suggested 8 GiB, as the largest control planes run it (20 GB).
    let large = Member::start("large", &["--quota-backend-bytes=21474836480"]);
    large.ok(&["put", "k", "v"]);
    assert_eq!(
        value(&large.get("/metrics").1, "etcd_server_quota_backend_bytes"),
        Some(21474836480.0)
    );
}

#[test]
fn the_size_gauge_reaches_95_percent_of_the_quota_before_nospace() {
    const QUOTA: f64 = 2.0 * 1024.0 * 1024.0;
    let m = Member::start("quota", &["--quota-backend-bytes=2097152"]);
    let big = "x".repeat(64 * 1024);
    let mut refused = false;
    for i in 0..200 {
        let out = m.etcdctl(&["put", &format!("k{i}"), &big]);
        if !out.status.success() {
            assert!(String::from_utf8_lossy(&out.stderr).contains("database space exceeded"));
            refused = true;
            break;
        }
    }
    assert!(refused, "NOSPACE within 200 writes of 64 KiB");
    let (_, text) = m.get("/metrics");
    let total = value(&text, "etcd_mvcc_db_total_size_in_bytes").unwrap();
    let quota = value(&text, "etcd_server_quota_backend_bytes").unwrap();
    assert_eq!(quota, QUOTA);
    // The mixin's etcdDatabaseQuotaLowSpace: total / quota > 95%.
    assert!(total / quota > 0.95, "{total} of {quota} when NOSPACE came");
}

#[test]
fn peers_traffic_failures_and_round_trips_are_exported_per_peer() {
    let mut members = Member::start_cluster(&["p1", "p2", "p3"], &[], |_, _, _| {});
    members[0].ok(&["put", "k", "v"]);
    // The probe runs every 4 s: wait for one round trip to each peer.
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let (_, text) = members[0].get("/metrics");
        if samples(&text, "etcd_network_peer_round_trip_time_seconds_count").len() == 2 {
            break text;
        }
        assert!(Instant::now() < deadline, "no round trip to both peers:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    };
    // A follower sends Raft messages to the leader alone; the leader to both.
    let sent = samples(&text, "etcd_network_peer_sent_bytes_total");
    assert!(!sent.is_empty(), "{text}");
    assert!(
        sent.iter().all(|(series, v)| series.contains("To=\"") && *v > 0.0),
        "{sent:?}"
    );
    let received = samples(&text, "etcd_network_peer_received_bytes_total");
    assert!(
        received.iter().any(|(series, _)| series.contains("From=\"")),
        "{received:?}"
    );
    // A peer gone: sends to it fail and are counted (by the leader's heartbeats to it, or the
    // others' votes once it was the leader).
    members[2].kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let failures: f64 = members[..2]
            .iter()
            .flat_map(|m| samples(&m.get("/metrics").1, "etcd_network_peer_sent_failures_total"))
            .map(|(_, v)| v)
            .sum();
        if failures > 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "no failed send counted");
        std::thread::sleep(Duration::from_millis(100));
    }
}
