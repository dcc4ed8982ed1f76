//! The `k8s` workload: the load a Kubernetes control plane puts on its etcd, compressed in time.
//!
//! The model, after what kube-apiserver's etcd3 storage sends:
//! - Node heartbeats. Each of `--nodes` kubelets renews its Lease object
//!   (`registry/leases/kube-node-lease/node-NNNNNN`, `--lease-size` bytes) every `--lease-period`
//!   seconds (10, the kubelet's), the nodes' renewals spread evenly over the period. A renewal is
//!   the apiserver's optimistic update: a Txn `MOD(key) == <the revision it last saw>` that puts
//!   the new object, or else reads the key; after a failed compare (a conflict, counted) it
//!   retries with the fresh revision, at most 3 times.
//! - Pod churn. Pods arrive at `--pod-rate` per second (`--nodes` / 25 by default; `--arrivals`
//!   poisson or even) and live `--pod-lifetime` seconds, through 7 writes of their object
//!   (`registry/pods/ns-NN/<name>`, `--pod-size` bytes) spread evenly over the lifetime: create
//!   (a Txn `MOD == 0` put), bind to a node, three status updates (ContainerCreating, Running,
//!   Ready), the graceful delete (deletionTimestamp set), each a Txn `MOD == rev` put, and the
//!   final delete, a Txn `MOD == rev` delete. Conflicts are retried as for leases.
//! - The apiserver's watch cache: one watch stream, on a connection of its own, with a watch of
//!   the pods prefix and one of the leases prefix, both with prev_kv; `--watchers` adds watches
//!   of the pods prefix (other consumers) to the same stream. A canceled watch (it fell behind a
//!   compaction) is counted, not re-created.
//! - Compaction the apiserver's way, every `--compact-interval` seconds: a Txn on
//!   `compact_rev_key` (its Version tells whether another apiserver compacted meanwhile) whose
//!   header gives the current revision, then a Compact (not physical) to the revision the round
//!   before saw. The first round, at the start, only notes the revision.
//!
//! Writes are open-loop: each is sent when due by the task of its object (one per node, one per
//! pod), whatever the other writes' answers, at most `--max-in-flight` at once, round-robin over
//! the `--conns` connections (`--clients` is not used). Latency runs from sending a write to its
//! answer; a write sent more than [`BEHIND_SLACK`] after it was due (no free slot, its object's
//! previous write still unanswered, a busy runtime) is behind schedule, and the `send-delay` row
//! has how late the writes went out. `--latency-log` has a line for each measured write's answer
//! (the `write` row: renewals and pod writes, each attempt after a conflict too). Watch events are
//! timed from their write's send time, which the value carries; deletes carry no value and are
//! counted only.
//!
//! Before the clock starts, untimed: the Lease objects are created, and so are the pods that would
//! be alive had pods been arriving for a lifetime already (so the pod writes are at their steady
//! rate from the start); the watches start after that. Then the schedule runs `--warmup` seconds
//! unmeasured (default 2) and `--seconds` measured (default 30): a write counts when it is sent
//! in that window.
//!
//! Compressed: pod lifetimes (minutes to days in a real cluster) to seconds, and the compaction
//! interval (the apiserver's 5 minutes) 20 times. Left out: the standing pod population (tens per
//! node) and the database size it brings, Event objects (and their etcd leases), Endpoints and
//! EndpointSlices, node status updates, other controllers' objects and leader-election leases,
//! list calls (paginated ranges) and the re-list and re-watch after a canceled watch, and more
//! than one apiserver.
//!
//! Keys start with `--key-prefix` (`--key-prefix /` gives the apiserver's own `/registry/...`).
//! Nothing is cleaned up: the leases, the pods alive at the end and `compact_rev_key` stay (a
//! later run on the same keys picks up their revisions; its pods have names of their own).
//!
//! The parts: this file has the flags, the run (setup, the tasks, the drain) and its report, and
//! the run's keys; `schedule` when each write is due (the kubelets, the pods' lives and
//! arrivals); `apiserver` how a write is made (the optimistic update, its tallies and counters);
//! `watch_cache` the watch stream and its reader; `compactor` the compaction rounds.

mod apiserver;
mod compactor;
mod schedule;
mod watch_cache;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use cairn_benches::{parse_count, parse_seconds, payload, per_sec, ratio, rounded, Context, Failure, Percentiles};
use clap::ValueEnum;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use self::apiserver::{create_all, Apiserver, Counts, Kind, Object, Tallies};
use self::compactor::compactor;
use self::schedule::{renew_loop, ArrivalClock, Pods};
use self::watch_cache::{open_watch_cache, read_watch_cache, watch_create};
use crate::drive::*;
use crate::report::*;
use crate::*;

#[derive(Debug, clap::Args)]
pub(crate) struct K8sArgs {
    /// Nodes, each renewing its Lease object every --lease-period.
    #[arg(long, default_value_t = 1000, value_parser = parse_nodes)]
    pub(crate) nodes: u64,
    /// Seconds between a node's renewals (the kubelet's 10).
    #[arg(long, default_value_t = 10.0, value_parser = parse_seconds)]
    pub(crate) lease_period: f64,
    /// Pods created (and later deleted) per second (default: --nodes / 25).
    #[arg(long, value_parser = parse_rate)]
    pub(crate) pod_rate: Option<f64>,
    /// Seconds from a pod's creation to its deletion; its 7 writes are spread evenly over them.
    #[arg(long, default_value_t = 6.0, value_parser = parse_seconds)]
    pub(crate) pod_lifetime: f64,
    /// How pods arrive: exponential gaps (`poisson`) or `even`ly spaced.
    #[arg(long, value_enum, default_value_t = Arrivals::Poisson)]
    pub(crate) arrivals: Arrivals,
    /// Watches of the pods prefix besides the watch cache's own (on its stream).
    #[arg(long, default_value_t = 0, value_parser = parse_watchers)]
    pub(crate) watchers: usize,
    /// Seconds between compactions (the apiserver's 5 minutes, compressed 20 times).
    #[arg(long, default_value_t = 15.0, value_parser = parse_seconds)]
    pub(crate) compact_interval: f64,
    /// Seconds the schedule runs unmeasured before the measured --seconds (0: none).
    #[arg(long, default_value_t = 2.0, value_parser = parse_warmup)]
    pub(crate) warmup: f64,
    /// Most writes in flight at once; a write due while all are out waits for one to end.
    #[arg(long, default_value_t = 1000, value_parser = parse_clients)]
    pub(crate) max_in_flight: usize,
    /// Bytes of a Lease object (at least 8: the send time).
    #[arg(long, default_value_t = 300, value_parser = parse_stamped_size)]
    pub(crate) lease_size: usize,
    /// Bytes of a Pod object (at least 8: the send time).
    #[arg(long, default_value_t = 2048, value_parser = parse_stamped_size)]
    pub(crate) pod_size: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Arrivals {
    /// A Poisson process: exponentially distributed gaps.
    Poisson,
    /// Evenly spaced.
    Even,
}

/// Most nodes accepted (the largest Kubernetes clusters run about 15,000).
pub(crate) const MAX_NODES: u64 = 1_000_000;
/// Most pods alive at once (`--pod-rate` times `--pod-lifetime`) accepted.
pub(crate) const MAX_LIVE_PODS: f64 = 1e7;
/// Measured seconds when `--seconds` is not given.
pub(crate) const K8S_DEFAULT_SECONDS: f64 = 30.0;
/// Writes of a pod's life: create, bind, three status updates, graceful delete, delete.
pub(crate) const POD_WRITES: u32 = 7;
/// Namespaces the pods are spread over.
pub(crate) const NAMESPACES: u64 = 100;
/// A write sent later than this after it was due is behind schedule.
pub(crate) const BEHIND_SLACK: Duration = Duration::from_millis(10);
/// Retries of a write after its compare failed, each with the revision just read.
pub(crate) const MAX_CONFLICT_RETRIES: u32 = 3;

pub(crate) fn parse_nodes(s: &str) -> Result<u64, String> {
    parse_count(s, MAX_NODES, "nodes")
}

/// Parses a count that may be 0, up to [`MAX_CLIENTS`].
pub(crate) fn parse_watchers(s: &str) -> Result<usize, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    parse_count(s, MAX_CLIENTS, "watchers")
}

/// Parses `--warmup`: 0, or what `--seconds` accepts.
pub(crate) fn parse_warmup(s: &str) -> Result<f64, String> {
    if s.trim().parse::<f64>() == Ok(0.0) {
        return Ok(0.0);
    }
    parse_seconds(s)
}

pub(crate) async fn k8s(g: &Global, b: &Bench, a: &K8sArgs) -> Result<Report, Failure> {
    if g.rate.is_some() || g.total.is_some() {
        return Err(Failure(
            "k8s: the schedule sets the rate and --seconds the length; --rate and --total do not apply".to_string(),
        ));
    }
    let seconds = g.seconds.unwrap_or(K8S_DEFAULT_SECONDS);
    let pod_rate = a.pod_rate.unwrap_or(a.nodes as f64 / 25.0);
    if pod_rate * a.pod_lifetime > MAX_LIVE_PODS {
        return Err(Failure(format!(
            "k8s: --pod-rate {pod_rate} times --pod-lifetime {} is more than {MAX_LIVE_PODS} pods alive at once",
            a.pod_lifetime
        )));
    }
    let names = Names::new(&g.key_prefix);
    let lease_value = Bytes::from(payload(a.lease_size));
    let pod_value = Bytes::from(payload(a.pod_size));
    let mut arrivals = ArrivalClock::new(0x5eed, pod_rate, a.arrivals);

    // The pods alive at the start: those that arrived during the lifetime before it.
    let mut next_arrival = -a.pod_lifetime;
    let mut alive = Vec::new();
    loop {
        next_arrival += arrivals.gap();
        if next_arrival >= 0.0 {
            break;
        }
        alive.push(next_arrival);
    }
    let mut objects: Vec<(Bytes, Bytes)> = (0..a.nodes).map(|i| (names.lease(i), lease_value.clone())).collect();
    objects.extend((0..alive.len() as u64).map(|p| (names.pod(p), pod_value.clone())));
    eprintln!("{TOOL}: creating {} node leases and {} pods ...", a.nodes, alive.len());
    let setup_started = Instant::now();
    let (revisions, setup_errors) = create_all(b, &objects, a.max_in_flight).await?;
    let setup = setup_started.elapsed();
    if setup_errors.failed() == objects.len() as u64 {
        return Err(Failure(format!(
            "k8s: creating the objects: none created{}",
            setup_errors.errors_text()
        )));
    }

    let mut creates = vec![watch_create(&names.pods_prefix()), watch_create(&names.leases_prefix())];
    creates.extend((0..a.watchers).map(|_| watch_create(&names.pods_prefix())));
    let stream = open_watch_cache(connect_to(g, 0).await?, b.timeout, creates).await?;

    let warmup = Duration::from_secs_f64(a.warmup);
    let window = Duration::from_secs_f64(seconds);
    let run = Run::start(None, Some(warmup + window), None);
    let start = run.started;
    let api = Arc::new(Apiserver {
        channels: b.channels.clone(),
        next_channel: AtomicUsize::new(0),
        in_flight: Semaphore::new(a.max_in_flight),
        timeout: b.timeout,
        epoch: start,
        measured_from: start + warmup,
        deadline: start + warmup + window,
        tallies: Mutex::new(Tallies::new()?),
        counts: Counts::default(),
        lease_value,
        run: Arc::clone(&run),
    });
    let bar = progress_bar("k8s", &run, b.shown);
    let ticker = tokio::spawn(tick(bar.clone(), Arc::clone(&run)));
    let received = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = watch::channel(false);
    let reader = tokio::spawn(read_watch_cache(
        stream,
        Arc::clone(&api),
        Arc::clone(&received),
        stopped,
    ));
    let interval = Duration::from_secs_f64(a.compact_interval);
    let compactions = tokio::spawn(compactor(Arc::clone(&api), names.compact_rev_key(), interval));

    let period = Duration::from_secs_f64(a.lease_period);
    let lifetime = Duration::from_secs_f64(a.pod_lifetime);
    let mut writers = JoinSet::new();
    let mut revisions = revisions.into_iter();
    for i in 0..a.nodes {
        let first = start + period.mul_f64(i as f64 / a.nodes as f64);
        let lease = Object {
            kind: Kind::Lease,
            key: names.lease(i),
            rev: revisions.next().unwrap_or(0),
        };
        writers.spawn(renew_loop(Arc::clone(&api), lease, first, period));
    }
    let pods = Arc::new(Pods {
        api: Arc::clone(&api),
        names: names.clone(),
        lifetime,
        value: pod_value,
    });
    for (p, &arrival) in alive.iter().enumerate() {
        let pod = Object {
            kind: Kind::Pod,
            key: names.pod(p as u64),
            rev: revisions.next().unwrap_or(0),
        };
        writers.spawn(Arc::clone(&pods).life(pod, arrival));
    }
    let spawner = tokio::spawn(pods.arrivals(arrivals, next_arrival, alive.len() as u64));
    let mut panicked = None;
    while let Some(done) = writers.join_next().await {
        if let Err(e) = done {
            panicked = Some(e);
        }
    }
    let spawned = spawner.await;
    if let Some(e) = panicked {
        return Err(Failure(format!("a k8s writer failed: {e}")));
    }
    let pods_started = spawned.context(|| "the pod arrivals failed".to_string())?;
    let (compact, compacted_to) = compactions.await.context(|| "the compactor failed".to_string())??;
    let written = run.started.elapsed();
    ticker.abort();
    bar.finish_and_clear();

    // Every change since the watches started is an event of the leases watch or of every pods watch.
    let counts = &api.counts;
    let lease_changes = counts.lease_changes.load(Ordering::SeqCst);
    let pod_changes = counts.pod_changes.load(Ordering::SeqCst);
    let expected = lease_changes + pod_changes * (1 + a.watchers as u64);
    let drain_started = Instant::now();
    while received.load(Ordering::SeqCst) < expected && drain_started.elapsed() < DRAIN_PATIENCE {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let drained = drain_started.elapsed();
    // The reader may be gone already (its stream failed); it is joined either way.
    let _ = stop.send(true);
    let events = reader.await.context(|| "the watch reader failed".to_string())??;
    let received = received.load(Ordering::SeqCst);
    let missing = expected.saturating_sub(received);

    let tallies = std::mem::replace(&mut *api.tallies.lock(), Tallies::new()?);
    let sent = counts.sent.load(Ordering::SeqCst);
    let behind = counts.behind.load(Ordering::SeqCst);
    let gave_up = counts.gave_up.load(Ordering::SeqCst);
    let writes = &tallies.write;
    let wanted_rate = a.nodes as f64 / a.lease_period + f64::from(POD_WRITES) * pod_rate;
    let window_events = events.ok + events.hits;

    let mut report = Report::new("k8s", g);
    report.param("nodes", a.nodes);
    report.param("lease_period", a.lease_period);
    report.param("pod_rate", rounded(pod_rate, 3));
    report.param("pod_lifetime", a.pod_lifetime);
    report.param(
        "arrivals",
        if a.arrivals == Arrivals::Poisson {
            "poisson"
        } else {
            "even"
        },
    );
    report.param("watchers", a.watchers);
    report.param("compact_interval", a.compact_interval);
    report.param("warmup", a.warmup);
    report.param("seconds", seconds);
    report.param("max_in_flight", a.max_in_flight);
    report.param("lease_size", a.lease_size);
    report.param("pod_size", a.pod_size);
    report.extra("write_p99_us", Percentiles::of(&writes.latency).p99);
    report.extra("writes_per_sec", rounded(per_sec(writes.ok, window), 2));
    report.extra("writes_per_sec_scheduled", rounded(wanted_rate, 2));
    report.extra("writes_sent", sent);
    report.extra("behind_schedule", behind);
    report.extra(
        "behind_schedule_fraction",
        ratio(behind as f64, sent as f64).map_or(Value::Null, |v| Value::from(rounded(v, 5))),
    );
    report.extra("lease_conflicts", tallies.lease.hits);
    report.extra("pod_conflicts", tallies.pod.hits);
    report.extra("conflicts_unresolved", gave_up);
    report.extra("events_expected", expected);
    report.extra("events_received", received);
    report.extra("events_missing", missing);
    report.extra("watch_events_per_sec", rounded(per_sec(window_events, window), 2));
    report.extra("compactions", compact.ok);
    report.extra("compacted_to", compacted_to);
    report.extra("pods_started", pods_started);
    report.extra("pods_at_start", alive.len());
    report.extra("setup_s", rounded(setup.as_secs_f64(), 3));
    report.extra("setup_failed", setup_errors.failed());
    report.note(format!(
        "writes: {:.0}/s of {wanted_rate:.0}/s scheduled ({:.0} renewals/s of {} nodes, {:.0} pod writes/s \
         of {pod_rate:.1} pods/s); {behind} of {sent} ({:.2}%) sent more than {BEHIND_SLACK:?} late",
        per_sec(writes.ok, window),
        per_sec(tallies.lease.ok, window),
        a.nodes,
        per_sec(tallies.pod.ok, window),
        ratio(behind as f64, sent as f64).unwrap_or(0.0) * 100.0,
    ));
    report.note(format!(
        "conflicts (compare failed, retried with the fresh revision): {} renewals, {} pod writes; \
         {gave_up} writes gave up after {MAX_CONFLICT_RETRIES} retries",
        tallies.lease.hits, tallies.pod.hits
    ));
    report.note(format!(
        "watch events: {received} of {expected} expected since the watches started ({lease_changes} lease \
         changes, {pod_changes} pod changes x {} pod watches), {missing} missing, waited {:.3} s after the \
         writes; in the window {window_events} ({:.0}/s), {} of them deletes (not timed)",
        1 + a.watchers,
        drained.as_secs_f64(),
        per_sec(window_events, window),
        events.hits
    ));
    report.note(format!(
        "compactions: {}, the last to revision {compacted_to}; {:.2} s of writes in all",
        compact.ok,
        written.as_secs_f64()
    ));
    report.note(format!(
        "setup (untimed): {} objects ({} leases, {} pods) created in {:.2} s, {} failed{}",
        objects.len(),
        a.nodes,
        alive.len(),
        setup.as_secs_f64(),
        setup_errors.failed(),
        setup_errors.errors_text()
    ));
    report.row("write", tallies.write, window);
    report.row("lease-renew", tallies.lease, window);
    report.row("pod-write", tallies.pod, window);
    report.row("watch-events", events, window);
    report.row("compact", compact, warmup + window);
    report.row("send-delay", tallies.delay, window);
    Ok(report.require_success())
}

/// The keys of a run.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    prefix: String,
    /// Tells this run's pods from an earlier run's (pods alive at its end are left behind).
    run: String,
}

impl Names {
    pub(crate) fn new(prefix: &str) -> Names {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        Names {
            prefix: prefix.to_string(),
            run: format!("{millis:x}"),
        }
    }

    pub(crate) fn leases_prefix(&self) -> String {
        format!("{}registry/leases/", self.prefix)
    }

    pub(crate) fn pods_prefix(&self) -> String {
        format!("{}registry/pods/", self.prefix)
    }

    pub(crate) fn lease(&self, node: u64) -> Bytes {
        Bytes::from(format!("{}kube-node-lease/node-{node:06}", self.leases_prefix()))
    }

    pub(crate) fn pod(&self, pod: u64) -> Bytes {
        Bytes::from(format!(
            "{}ns-{:02}/pod-{}-{pod:08}",
            self.pods_prefix(),
            pod % NAMESPACES,
            self.run
        ))
    }

    pub(crate) fn compact_rev_key(&self) -> Bytes {
        Bytes::from(format!("{}compact_rev_key", self.prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// --warmup takes 0; --watchers takes 0; --nodes does not.
    #[test]
    fn zero_where_it_means_none() {
        assert_eq!(parse_warmup("0"), Ok(0.0));
        assert_eq!(parse_warmup("2.5"), Ok(2.5));
        assert!(parse_warmup("-1").is_err());
        assert_eq!(parse_watchers("0"), Ok(0));
        assert_eq!(parse_watchers("3"), Ok(3));
        assert!(parse_nodes("0").is_err());
        assert!(parse_nodes("1000001").is_err());
    }

    /// Keys are the apiserver's under the prefix, and a pod's name is unique to the run.
    #[test]
    fn keys_follow_the_registry_layout() {
        let names = Names {
            prefix: "/".to_string(),
            run: "abc".to_string(),
        };
        assert_eq!(&names.lease(7)[..], b"/registry/leases/kube-node-lease/node-000007");
        assert_eq!(&names.pod(123)[..], b"/registry/pods/ns-23/pod-abc-00000123");
        assert!(names.pod(123).starts_with(names.pods_prefix().as_bytes()));
        assert_eq!(&names.compact_rev_key()[..], b"/compact_rev_key");
    }
}
