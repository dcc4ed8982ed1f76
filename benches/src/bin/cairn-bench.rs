//! `cairn-bench`: a load generator for any etcd-compatible endpoint (a cairn member, or etcd
//! itself), after etcd's own `benchmark` tool. It speaks the v3 gRPC API and measures, per
//! workload, how many requests succeed per second and their latency, in HDR histograms:
//! p50, p90, p99, p99.9 and max, in microseconds.
//!
//! Workloads (subcommands):
//! - `put`: puts `--val-size`-byte values at `--key-size`-byte keys picked at random (or in
//!   order, `--sequential-keys`) from `--key-space-size` keys.
//! - `range`: linearizable or serializable (`--consistency l|s`) reads of one key of the key
//!   space, or of the whole `--key-prefix` (`--prefix`, with `--limit`); `--load N` puts N keys
//!   first.
//! - `txn-put`: a Txn comparing the key's MOD revision (`--compare absent`: MOD = 0;
//!   `present`: MOD > 0), with one put in its success branch.
//! - `delete`: puts `--keys` keys, then deletes each once.
//! - `watch`: `--watchers` watchers of the prefix over `--streams` watch streams (spread over
//!   the `--conns`) while `--clients` writers put at `--put-rate` over a connection of their
//!   own; events delivered per second, and put-to-event latency (each value carries its send
//!   time).
//! - `lease-keepalive`: grants `--leases` leases, then `--clients` keep-alive streams renew
//!   them as fast as they are answered.
//! - `lease-expiry`: grants `--leases` leases of `--ttl` seconds with `--keys-per-lease` keys
//!   each, then times how long after the TTL the keys are all gone (a count-only range every
//!   20 ms, over a connection of its own), while `--clients` probe writers put one at a time.
//!   Probes sent from the last count that found every key until the one that found none are
//!   "expiring", the earlier ones "before"; their latencies side by side (and as ratios) say
//!   whether mass expiry stalls writes.
//!
//! Like etcd's tool, it opens `--conns` gRPC connections (round-robin over `--endpoints`) and
//! runs `--clients` concurrent requesters spread over them, each with one request in flight.
//! A run stops after `--total` requests or `--seconds` (10000 requests when neither is given);
//! `--rate` caps the requests sent per second. Latency is measured from sending a request to
//! its answer (a requester behind the `--rate` schedule sends at once, so it is the service
//! time, not the time since the request was due). Failed requests are counted per gRPC code;
//! the run fails only when none succeeded. A progress bar shows on a terminal; `--json` prints
//! one JSON object instead of the table.
//!
//! ```text
//! cargo run --release -p cairn-benches --bin cairn-bench -- --endpoints 127.0.0.1:2379 \
//!     --conns 4 --clients 64 --total 100000 put --key-size 16 --val-size 256 --key-space-size 100000
//! cairn-bench --clients 16 --seconds 10 range --load 10000 --consistency s
//! cairn-bench --clients 16 range --load 1000 --prefix --limit 100
//! cairn-bench --clients 8 txn-put --key-space-size 1000 --compare absent
//! cairn-bench --clients 8 delete --keys 20000
//! cairn-bench --clients 4 --seconds 10 watch --watchers 1000 --streams 10 --put-rate 500
//! cairn-bench --clients 32 --seconds 10 lease-keepalive --leases 1000
//! cairn-bench --clients 4 lease-expiry --leases 1000 --ttl 5 --keys-per-lease 10 --json
//! ```
//!
//! Every key it writes starts with `--key-prefix` (default `bench/`): put, range, txn-put and
//! delete use it directly, watch adds `watch/`, lease-expiry adds `expiry/` and `probe/`. Only
//! delete and the lease workloads clean up after themselves (leases are revoked or expire).

use std::collections::BTreeMap;
use std::future::Future;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use cairn_benches::{
    exit_code, histogram, micros, parse_count, parse_seconds, payload, per_sec, ratio, ratio_json, rounded, times_cell,
    us_cell, Context, Failure, Percentiles,
};
use cairn_server::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::lease_client::LeaseClient;
use cairn_server::pb::etcdserverpb::request_op::Request;
use cairn_server::pb::etcdserverpb::watch_client::WatchClient;
use cairn_server::pb::etcdserverpb::watch_request::RequestUnion;
use cairn_server::pb::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseRevokeRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest, WatchCreateRequest, WatchRequest, WatchResponse,
};
use clap::{Parser, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Status, Streaming};

/// Prefixes every message.
const TOOL: &str = "cairn-bench";

/// Drives an etcd-compatible endpoint with one workload and reports throughput and latency.
#[derive(Debug, Parser)]
#[command(name = "cairn-bench", version)]
struct Args {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    workload: Workload,
}

/// Options every workload takes, before or after the subcommand.
#[derive(Debug, clap::Args)]
struct Global {
    /// Client endpoints, `host:port` or URLs, comma-separated; connections go round-robin over them.
    #[arg(long, global = true, value_delimiter = ',', default_value = "127.0.0.1:2379")]
    endpoints: Vec<String>,
    /// gRPC connections to open.
    #[arg(long, global = true, default_value_t = 1, value_parser = parse_conns)]
    conns: usize,
    /// Concurrent requesters, spread over the connections, each with one request in flight.
    #[arg(long, global = true, default_value_t = 1, value_parser = parse_clients)]
    clients: usize,
    /// Stop after this many requests (10000 when neither this nor --seconds is given).
    #[arg(long, global = true, value_parser = parse_total)]
    total: Option<u64>,
    /// Stop after this many seconds (fractions allowed).
    #[arg(long, global = true, value_parser = parse_seconds, allow_negative_numbers = true)]
    seconds: Option<f64>,
    /// Send at most this many requests per second over all clients (default: no limit).
    #[arg(long, global = true, value_parser = parse_rate)]
    rate: Option<f64>,
    /// Give up waiting for an answer after this many seconds (counted as DeadlineExceeded).
    #[arg(long, global = true, default_value_t = 10.0, value_parser = parse_seconds)]
    timeout: f64,
    /// Every key written starts with this.
    #[arg(long, global = true, default_value = "bench/")]
    key_prefix: String,
    /// Print one JSON object instead of a table (and no progress bar).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Workload {
    /// Put values at keys of a key space.
    Put(PutArgs),
    /// Read one key of a key space, or the whole prefix with a limit.
    Range(RangeArgs),
    /// A Txn comparing the key's MOD revision, with a put in its success branch.
    TxnPut(TxnPutArgs),
    /// Put keys, then delete each once (only the deletes are measured).
    Delete(DeleteArgs),
    /// Watchers of a prefix while writers put: events/s and put-to-event latency.
    Watch(WatchArgs),
    /// Grant leases, then renew them over keep-alive streams as fast as answered.
    LeaseKeepalive(KeepAliveArgs),
    /// Leases with keys expiring at once: time until the keys are gone, and writes meanwhile.
    LeaseExpiry(ExpiryArgs),
}

/// Which keys a workload's requests pick.
#[derive(Debug, clap::Args)]
struct KeyArgs {
    /// Bytes of each key, `--key-prefix` included (the rest is the key's number, zero-padded).
    #[arg(long, default_value_t = 16, value_parser = parse_key_size)]
    key_size: usize,
    /// Distinct keys requests pick from (default 1; for `range`, the `--load`ed keys).
    #[arg(long, value_parser = parse_key_space)]
    key_space_size: Option<u64>,
    /// Pick keys in order (0, 1, 2, ..., wrapping) instead of at random.
    #[arg(long)]
    sequential_keys: bool,
}

#[derive(Debug, clap::Args)]
struct PutArgs {
    #[command(flatten)]
    keys: KeyArgs,
    /// Bytes of each value.
    #[arg(long, default_value_t = 8, value_parser = parse_val_size)]
    val_size: usize,
}

#[derive(Debug, clap::Args)]
struct RangeArgs {
    #[command(flatten)]
    keys: KeyArgs,
    /// `l`: linearizable (through the leader's read index); `s`: serializable (local).
    #[arg(long, value_enum, default_value_t = Consistency::L)]
    consistency: Consistency,
    /// Read the whole `--key-prefix` instead of one key.
    #[arg(long)]
    prefix: bool,
    /// Most keys one read returns (0: no limit).
    #[arg(long, default_value_t = 0)]
    limit: u32,
    /// First put this many keys (0 to N-1 of the key space), unmeasured.
    #[arg(long, default_value_t = 0)]
    load: u64,
    /// Bytes of each `--load`ed value.
    #[arg(long, default_value_t = 8, value_parser = parse_val_size)]
    val_size: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Consistency {
    /// Linearizable.
    L,
    /// Serializable.
    S,
}

#[derive(Debug, clap::Args)]
struct TxnPutArgs {
    #[command(flatten)]
    keys: KeyArgs,
    /// Bytes of each value.
    #[arg(long, default_value_t = 8, value_parser = parse_val_size)]
    val_size: usize,
    /// The put happens if the key is `absent` (MOD = 0) or `present` (MOD > 0).
    #[arg(long, value_enum, default_value_t = TxnCompare::Absent)]
    compare: TxnCompare,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TxnCompare {
    /// MOD(key) = 0.
    Absent,
    /// MOD(key) > 0.
    Present,
}

#[derive(Debug, clap::Args)]
struct DeleteArgs {
    /// Keys to put and then delete (the deletes stop earlier at --total or --seconds).
    #[arg(long, default_value_t = 10_000, value_parser = parse_key_space)]
    keys: u64,
    /// Bytes of each key, `--key-prefix` included.
    #[arg(long, default_value_t = 16, value_parser = parse_key_size)]
    key_size: usize,
    /// Bytes of each value.
    #[arg(long, default_value_t = 8, value_parser = parse_val_size)]
    val_size: usize,
    /// Do not put the keys first (they are there from an earlier run).
    #[arg(long)]
    skip_load: bool,
}

#[derive(Debug, clap::Args)]
struct WatchArgs {
    /// Watchers, each of the whole `<key-prefix>watch/` prefix.
    #[arg(long, default_value_t = 100, value_parser = parse_clients)]
    watchers: usize,
    /// Watch streams the watchers are spread over (streams go round-robin over the connections).
    #[arg(long, default_value_t = 10, value_parser = parse_clients)]
    streams: usize,
    /// Puts per second, over all writers (the --clients).
    #[arg(long, default_value_t = 100.0, value_parser = parse_rate)]
    put_rate: f64,
    /// Distinct keys the writers cycle through.
    #[arg(long, default_value_t = 100, value_parser = parse_key_space)]
    key_space_size: u64,
    /// Bytes of each value (at least 8: the send time).
    #[arg(long, default_value_t = 16, value_parser = parse_stamped_size)]
    val_size: usize,
}

#[derive(Debug, clap::Args)]
struct KeepAliveArgs {
    /// Leases to grant and renew.
    #[arg(long, default_value_t = 100, value_parser = parse_key_space)]
    leases: u64,
    /// Their TTL in seconds (long enough not to expire between renewals).
    #[arg(long, default_value_t = 60, value_parser = parse_ttl)]
    ttl: i64,
}

#[derive(Debug, clap::Args)]
struct ExpiryArgs {
    /// Leases to grant.
    #[arg(long, default_value_t = 100, value_parser = parse_key_space)]
    leases: u64,
    /// Their TTL in seconds; granting and attaching the keys must take less.
    #[arg(long, default_value_t = 5, value_parser = parse_ttl)]
    ttl: i64,
    /// Keys attached to each lease.
    #[arg(long, default_value_t = 10, value_parser = parse_key_space)]
    keys_per_lease: u64,
    /// Bytes of each value (of the attached keys and the probes').
    #[arg(long, default_value_t = 8, value_parser = parse_val_size)]
    val_size: usize,
}

/// Most connections accepted.
const MAX_CONNS: usize = 1024;
/// Most concurrent clients (and watchers, and watch streams) accepted.
const MAX_CLIENTS: usize = 100_000;
/// Largest key accepted (etcd's default request limit is 1.5 MiB).
const MAX_KEY_SIZE: usize = 1 << 20;
/// Largest value accepted.
const MAX_VAL_SIZE: usize = 1 << 20;
/// Most keys a key space (or `--keys`, `--leases`) may have.
const MAX_KEYS: u64 = 1 << 40;
/// Requests run when neither `--total` nor `--seconds` is given.
const DEFAULT_TOTAL: u64 = 10_000;
/// Latencies are recorded up to a minute.
const LATENCY_CEILING: Duration = Duration::from_secs(60);
/// How long to wait for connections to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long watchers may take to deliver the last puts' events once the writers stopped.
const DRAIN_PATIENCE: Duration = Duration::from_secs(10);
/// How often lease-expiry counts the keys left.
const EXPIRY_POLL: Duration = Duration::from_millis(20);
/// How long after the last lease's TTL lease-expiry waits for the keys to go.
const EXPIRY_PATIENCE: Duration = Duration::from_secs(60);
/// How often the progress bar is redrawn.
const PROGRESS_TICK: Duration = Duration::from_millis(100);

fn parse_conns(s: &str) -> Result<usize, String> {
    parse_count(s, MAX_CONNS, "connections")
}

fn parse_clients(s: &str) -> Result<usize, String> {
    parse_count(s, MAX_CLIENTS, "clients")
}

fn parse_total(s: &str) -> Result<u64, String> {
    parse_count(s, u64::MAX, "requests")
}

fn parse_key_size(s: &str) -> Result<usize, String> {
    parse_count(s, MAX_KEY_SIZE, "bytes")
}

fn parse_key_space(s: &str) -> Result<u64, String> {
    parse_count(s, MAX_KEYS, "keys")
}

fn parse_val_size(s: &str) -> Result<usize, String> {
    let v: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number of bytes"))?;
    if v > MAX_VAL_SIZE {
        return Err(format!("must be at most {MAX_VAL_SIZE} bytes"));
    }
    Ok(v)
}

fn parse_stamped_size(s: &str) -> Result<usize, String> {
    let v = parse_val_size(s)?;
    if v < 8 {
        return Err("must be at least 8 bytes: a value carries its send time".to_string());
    }
    Ok(v)
}

fn parse_ttl(s: &str) -> Result<i64, String> {
    let v = parse_count(s, 9_000_000_000i64, "seconds")?;
    if v < 2 {
        return Err("must be at least 2 seconds (etcd's shortest lease with default timing)".to_string());
    }
    Ok(v)
}

/// Parses a rate: a positive number per second.
fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number per second"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err("must be a positive number per second".to_string());
    }
    Ok(v)
}

fn main() -> ExitCode {
    let args = Args::parse();
    exit_code(TOOL, run(&args))
}

fn run(args: &Args) -> Result<(), Failure> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context(|| "start the tokio runtime".to_string())?;
    let report = rt.block_on(run_workload(args))?;
    report.print(args)?;
    match report.failure {
        Some(f) => Err(Failure(f)),
        None => Ok(()),
    }
}

async fn run_workload(args: &Args) -> Result<Report, Failure> {
    let g = &args.global;
    let bench = Bench {
        channels: connect(g).await?,
        timeout: Duration::from_secs_f64(g.timeout),
        shown: !g.json && std::io::stdout().is_terminal(),
    };
    match &args.workload {
        Workload::Put(a) => put(g, &bench, a).await,
        Workload::Range(a) => range(g, &bench, a).await,
        Workload::TxnPut(a) => txn_put(g, &bench, a).await,
        Workload::Delete(a) => delete(g, &bench, a).await,
        Workload::Watch(a) => watch_events(g, &bench, a).await,
        Workload::LeaseKeepalive(a) => lease_keepalive(g, &bench, a).await,
        Workload::LeaseExpiry(a) => lease_expiry(g, &bench, a).await,
    }
}

/// What every phase of a run uses: the connections, the per-request timeout, and whether
/// progress bars are drawn.
#[derive(Debug)]
struct Bench {
    /// Invariant: not empty.
    channels: Vec<Channel>,
    timeout: Duration,
    shown: bool,
}

impl Bench {
    /// The connection of client (or stream) `c`: clients go round-robin over connections.
    fn channel(&self, c: usize) -> Channel {
        self.channels[c % self.channels.len()].clone()
    }

    /// A requester for client `c`, sending `op`s over its connection.
    fn requester(&self, c: usize, op: &Arc<Op>) -> Requester {
        let channel = self.channel(c);
        Requester {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel),
            op: Arc::clone(op),
            rng: StdRng::seed_from_u64(0x5eed ^ c as u64),
            timeout: self.timeout,
        }
    }

    /// Runs `clients` requesters of `op` until `run` ends; the merged tally and the time taken.
    async fn drive_op(
        &self,
        label: &str,
        run: &Arc<Run>,
        clients: usize,
        op: Op,
    ) -> Result<(Tally, Duration), Failure> {
        let op = Arc::new(op);
        drive(label, run, clients, self.shown, |c, tally| {
            request_loop(self.requester(c, &op), Arc::clone(run), tally)
        })
        .await
    }
}

/// Opens `--conns` connections, round-robin over `--endpoints`.
async fn connect(g: &Global) -> Result<Vec<Channel>, Failure> {
    let mut channels = Vec::with_capacity(g.conns);
    for i in 0..g.conns {
        channels.push(connect_to(g, i).await?);
    }
    Ok(channels)
}

/// Opens a connection to endpoint `i` (wrapping around the list).
async fn connect_to(g: &Global, i: usize) -> Result<Channel, Failure> {
    let endpoint = g
        .endpoints
        .get(i % g.endpoints.len().max(1))
        .ok_or_else(|| Failure("no --endpoints given".to_string()))?;
    let url = if endpoint.contains("://") {
        endpoint.clone()
    } else {
        format!("http://{endpoint}")
    };
    Endpoint::from_shared(url.clone())
        .context(|| format!("bad endpoint `{endpoint}`"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| Failure(format!("connect to {url}: {}", with_sources(&e))))
}

/// `e` and its sources, `: `-separated (tonic's transport errors say little by themselves).
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

// ---------------------------------------------------------------------------------------------
// Workloads.

/// `--total` and `--seconds` as a run's limits; `default_total` when neither is given.
fn limits(g: &Global, default_total: u64) -> (Option<u64>, Option<Duration>) {
    let seconds = g.seconds.map(Duration::from_secs_f64);
    match (g.total, seconds) {
        (None, None) => (Some(default_total), None),
        (total, seconds) => (total, seconds),
    }
}

async fn put(g: &Global, b: &Bench, a: &PutArgs) -> Result<Report, Failure> {
    let space = a.keys.key_space_size.unwrap_or(1);
    let keys = Keys::new(&g.key_prefix, a.keys.key_size, space, a.keys.sequential_keys)?;
    let (total, seconds) = limits(g, DEFAULT_TOTAL);
    let run = Run::start(total, seconds, g.rate);
    let op = Op::Put {
        keys,
        value: Bytes::from(payload(a.val_size)),
        stamp: None,
    };
    let (tally, elapsed) = b.drive_op("put", &run, g.clients, op).await?;
    let mut report = Report::new("put", g);
    report.param("key_size", a.keys.key_size);
    report.param("val_size", a.val_size);
    report.param("key_space_size", space);
    report.param("sequential_keys", a.keys.sequential_keys);
    report.row("put", tally, elapsed);
    Ok(report.require_success())
}

async fn range(g: &Global, b: &Bench, a: &RangeArgs) -> Result<Report, Failure> {
    let space = a.keys.key_space_size.unwrap_or(a.load.max(1));
    let keys = Keys::new(
        &g.key_prefix,
        a.keys.key_size,
        space.max(a.load),
        a.keys.sequential_keys,
    )?;
    let mut report = Report::new("range", g);
    if a.load > 0 {
        load(g, b, &keys, a.load, a.val_size, &mut report).await?;
    }
    let (total, seconds) = limits(g, DEFAULT_TOTAL);
    let run = Run::start(total, seconds, g.rate);
    let op = Op::Range {
        keys: Keys { space, ..keys },
        whole_prefix: a.prefix,
        limit: i64::from(a.limit),
        serializable: a.consistency == Consistency::S,
    };
    let (tally, elapsed) = b.drive_op("range", &run, g.clients, op).await?;
    report.param("key_size", a.keys.key_size);
    report.param("key_space_size", space);
    report.param("sequential_keys", a.keys.sequential_keys);
    report.param("consistency", if a.consistency == Consistency::S { "s" } else { "l" });
    report.param("prefix", a.prefix);
    report.param("limit", a.limit);
    report.param("load", a.load);
    let per_read = ratio(tally.hits as f64, tally.ok as f64);
    report.extra(
        "kvs_per_read",
        per_read.map_or(Value::Null, |v| Value::from(rounded(v, 2))),
    );
    report.note(format!(
        "keys returned per read: {}",
        per_read.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
    ));
    report.row("range", tally, elapsed);
    Ok(report.require_success())
}

async fn txn_put(g: &Global, b: &Bench, a: &TxnPutArgs) -> Result<Report, Failure> {
    let space = a.keys.key_space_size.unwrap_or(1);
    let keys = Keys::new(&g.key_prefix, a.keys.key_size, space, a.keys.sequential_keys)?;
    let (total, seconds) = limits(g, DEFAULT_TOTAL);
    let run = Run::start(total, seconds, g.rate);
    let op = Op::TxnPut {
        keys,
        value: Bytes::from(payload(a.val_size)),
        compare: a.compare,
    };
    let (tally, elapsed) = b.drive_op("txn-put", &run, g.clients, op).await?;
    let mut report = Report::new("txn-put", g);
    report.param("key_size", a.keys.key_size);
    report.param("val_size", a.val_size);
    report.param("key_space_size", space);
    report.param("sequential_keys", a.keys.sequential_keys);
    report.param(
        "compare",
        if a.compare == TxnCompare::Absent {
            "absent"
        } else {
            "present"
        },
    );
    report.extra("txn_succeeded", tally.hits);
    report.note(format!(
        "txns whose compare held (and put): {} of {}",
        tally.hits, tally.ok
    ));
    report.row("txn-put", tally, elapsed);
    Ok(report.require_success())
}

async fn delete(g: &Global, b: &Bench, a: &DeleteArgs) -> Result<Report, Failure> {
    let keys = Keys::new(&g.key_prefix, a.key_size, a.keys, true)?;
    let mut report = Report::new("delete", g);
    if !a.skip_load {
        load(g, b, &keys, a.keys, a.val_size, &mut report).await?;
    }
    let (total, seconds) = limits(g, a.keys);
    let run = Run::start(Some(total.unwrap_or(a.keys).min(a.keys)), seconds, g.rate);
    let (tally, elapsed) = b.drive_op("delete", &run, g.clients, Op::Delete { keys }).await?;
    report.param("keys", a.keys);
    report.param("key_size", a.key_size);
    report.param("val_size", a.val_size);
    report.param("skip_load", a.skip_load);
    report.extra("deleted", tally.hits);
    report.note(format!(
        "keys deleted: {} by {} successful deletes",
        tally.hits, tally.ok
    ));
    report.row("delete", tally, elapsed);
    Ok(report.require_success())
}

/// Puts keys 0 to `n`-1 of `keys` with all clients, unmeasured, before a workload reads or
/// deletes them. A load where some puts failed goes on, with a note.
async fn load(g: &Global, b: &Bench, keys: &Keys, n: u64, val_size: usize, report: &mut Report) -> Result<(), Failure> {
    eprintln!("{TOOL}: loading {n} keys ...");
    let run = Run::start(Some(n), None, None);
    let op = Op::Put {
        keys: Keys {
            space: n,
            sequential: true,
            ..keys.clone()
        },
        value: Bytes::from(payload(val_size)),
        stamp: None,
    };
    let (tally, elapsed) = b.drive_op("load", &run, g.clients, op).await?;
    if tally.ok == 0 {
        return Err(Failure(format!(
            "loading keys: no put succeeded{}",
            tally.errors_text()
        )));
    }
    report.extra("load_s", rounded(elapsed.as_secs_f64(), 3));
    report.note(format!(
        "loaded {} keys in {:.2} s ({:.0}/s), {} puts failed{}",
        tally.ok,
        elapsed.as_secs_f64(),
        per_sec(tally.ok, elapsed),
        tally.failed(),
        tally.errors_text()
    ));
    Ok(())
}

async fn watch_events(g: &Global, b: &Bench, a: &WatchArgs) -> Result<Report, Failure> {
    if g.rate.is_some() {
        return Err(Failure(
            "watch: the writers' rate is --put-rate, not --rate".to_string(),
        ));
    }
    let prefix = format!("{}watch/", g.key_prefix);
    let keys = Keys::new(
        &prefix,
        prefix.len() + digits(a.key_space_size - 1),
        a.key_space_size,
        true,
    )?;
    let epoch = Instant::now();
    let received = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = watch::channel(false);

    eprintln!("{TOOL}: creating {} watchers on {} streams ...", a.watchers, a.streams);
    let mut readers = Vec::with_capacity(a.streams);
    for s in 0..a.streams {
        let n = a.watchers / a.streams + usize::from(s < a.watchers % a.streams);
        if n == 0 {
            continue;
        }
        let stream = open_watchers(b, s, n, &prefix).await?;
        let reader = read_events(stream, epoch, Arc::clone(&received), stopped.clone(), Tally::new()?);
        readers.push(tokio::spawn(reader));
    }

    // The writers have a connection of their own, as in etcd's benchmark: their requests do
    // not queue behind the events on the watchers' connections.
    let writers = Bench {
        channels: vec![connect_to(g, 0).await?],
        timeout: b.timeout,
        shown: b.shown,
    };
    let (total, seconds) = limits(g, DEFAULT_TOTAL);
    let run = Run::start(total, seconds, Some(a.put_rate));
    let op = Op::Put {
        keys,
        value: Bytes::from(payload(a.val_size)),
        stamp: Some(epoch),
    };
    let (puts, put_elapsed) = writers.drive_op("watch", &run, g.clients, op).await?;

    // Every watcher sees every put that succeeded (one that timed out may still show up).
    let expected = puts.ok.saturating_mul(a.watchers as u64);
    let drain_started = Instant::now();
    while received.load(Ordering::SeqCst) < expected && drain_started.elapsed() < DRAIN_PATIENCE {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let drained = drain_started.elapsed();
    // Readers may be gone already (their streams failed); they are joined below either way.
    let _ = stop.send(true);
    let mut events = Tally::new()?;
    let mut last_event = None;
    for r in readers {
        let (tally, last) = r.await.context(|| "a watch stream reader failed".to_string())?;
        events.absorb(tally)?;
        last_event = last_event.max(last);
    }
    let events_elapsed = last_event.map_or(Duration::ZERO, |t: Instant| t.saturating_duration_since(run.started));
    let missing = expected.saturating_sub(events.ok);

    let mut report = Report::new("watch", g);
    report.param("watchers", a.watchers);
    report.param("streams", a.streams);
    report.param("put_rate", a.put_rate);
    report.param("key_space_size", a.key_space_size);
    report.param("val_size", a.val_size);
    report.extra("events_expected", expected);
    report.extra("events_missing", missing);
    report.extra("foreign_events", events.hits);
    report.extra("drain_s", rounded(drained.as_secs_f64(), 3));
    report.note(format!(
        "events: {} of {expected} expected ({} puts x {} watchers), {missing} missing; \
         waited {:.3} s for them after the writers stopped",
        events.ok,
        puts.ok,
        a.watchers,
        drained.as_secs_f64()
    ));
    let put_rate = per_sec(puts.ok, put_elapsed);
    if put_rate < 0.9 * a.put_rate {
        report.note(format!(
            "the writers reached {put_rate:.0} puts/s, not the {} asked: more --clients may help",
            a.put_rate
        ));
    }
    if events.hits > 0 {
        report.note(format!(
            "{} events carried no send time (written by someone else?)",
            events.hits
        ));
    }
    report.row("events", events, events_elapsed);
    report.row("put", puts, put_elapsed);
    Ok(report.require_success())
}

/// Opens watch stream `s` and creates `n` watchers of `prefix` on it; returns once the
/// server confirmed them all.
async fn open_watchers(b: &Bench, s: usize, n: usize, prefix: &str) -> Result<WatchStream, Failure> {
    let (tx, rx) = mpsc::channel(n + 1);
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: Bytes::copy_from_slice(prefix.as_bytes()),
            range_end: prefix_end(prefix.as_bytes()),
            ..WatchCreateRequest::default()
        })),
    };
    // Queued before the call: a Go server sends the response headers only with a first answer.
    for _ in 0..n {
        tx.send(create.clone())
            .await
            .map_err(|_| Failure(format!("watch stream {s}: its request queue closed")))?;
    }
    let mut client = WatchClient::new(b.channel(s));
    let mut responses = timed(b.timeout, client.watch(ReceiverStream::new(rx)))
        .await
        .context(|| format!("open watch stream {s}"))?;
    let mut created = 0;
    while created < n {
        let answer = tokio::time::timeout(b.timeout, responses.message()).await;
        match answer {
            Ok(Ok(Some(r))) if r.canceled => {
                return Err(Failure(format!(
                    "watch stream {s}: a watcher was canceled: {}",
                    r.cancel_reason
                )));
            }
            Ok(Ok(Some(r))) => created += usize::from(r.created),
            Ok(Ok(None)) => return Err(Failure(format!("watch stream {s}: closed by the server"))),
            Ok(Err(e)) => return Err(Failure(format!("watch stream {s}: {e}"))),
            Err(_) => {
                return Err(Failure(format!(
                    "watch stream {s}: {created} of {n} watchers created within {:?}",
                    b.timeout
                )));
            }
        }
    }
    Ok(WatchStream {
        requests: tx,
        responses,
    })
}

/// An open watch stream; the request side is kept open (a server ends the stream when the
/// client closes it).
#[derive(Debug)]
struct WatchStream {
    requests: mpsc::Sender<WatchRequest>,
    responses: Streaming<WatchResponse>,
}

/// Reads events from `stream` until `stop`: each one's put-to-event latency (from the send
/// time in its value, nanoseconds since `epoch`) goes into the tally (`hits` counts events
/// without one), and `received` counts them all. Returns when the last event came.
async fn read_events(
    mut stream: WatchStream,
    epoch: Instant,
    received: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
    mut tally: Tally,
) -> (Tally, Option<Instant>) {
    let mut last = None;
    loop {
        let answer = tokio::select! {
            biased;
            _ = stop.changed() => break,
            answer = stream.responses.message() => answer,
        };
        match answer {
            Ok(Some(r)) => {
                if r.canceled {
                    tally.error(&Status::cancelled(format!("watch canceled: {}", r.cancel_reason)));
                }
                if r.events.is_empty() {
                    continue;
                }
                let now = Instant::now();
                let since_epoch = now.saturating_duration_since(epoch);
                let mut stamped = 0;
                for event in &r.events {
                    match event.kv.as_ref().and_then(|kv| stamp_of(&kv.value)) {
                        Some(sent) => {
                            tally.record(since_epoch.saturating_sub(sent), Ok(0));
                            stamped += 1;
                        }
                        None => tally.hits += 1,
                    }
                }
                received.fetch_add(stamped, Ordering::SeqCst);
                last = Some(now);
            }
            Ok(None) => {
                tally.error(&Status::unavailable("watch stream closed by the server"));
                break;
            }
            Err(e) => {
                tally.error(&e);
                break;
            }
        }
    }
    drop(stream.requests);
    (tally, last)
}

async fn lease_keepalive(g: &Global, b: &Bench, a: &KeepAliveArgs) -> Result<Report, Failure> {
    let mut report = Report::new("lease-keepalive", g);
    let ids = grant(g, b, a.leases, a.ttl, &mut report).await?;
    let ids = Arc::new(ids);
    let (total, seconds) = limits(g, DEFAULT_TOTAL);
    let run = Run::start(total, seconds, g.rate);
    let (tally, elapsed) = drive("lease-keepalive", &run, g.clients, b.shown, |c, tally| {
        keepalive_loop(
            LeaseClient::new(b.channel(c)),
            Arc::clone(&ids),
            Arc::clone(&run),
            b.timeout,
            tally,
        )
    })
    .await?;
    revoke(g, b, &ids, &mut report).await?;
    report.param("leases", a.leases);
    report.param("ttl", a.ttl);
    report.row("keepalive", tally, elapsed);
    Ok(report.require_success())
}

/// One client of lease-keepalive: one keep-alive stream (reopened after an error), one
/// renewal in flight, each of the lease picked by the request's number.
async fn keepalive_loop(
    mut client: LeaseClient<Channel>,
    ids: Arc<Vec<i64>>,
    run: Arc<Run>,
    timeout: Duration,
    mut tally: Tally,
) -> Tally {
    let mut stream = None;
    while let Some(i) = run.next().await {
        // `ids` is not empty (grant fails otherwise).
        let Some(&id) = usize::try_from(i % ids.len() as u64).ok().and_then(|n| ids.get(n)) else {
            break;
        };
        let started = Instant::now();
        let outcome = keep_alive_once(&mut client, &mut stream, id, timeout).await;
        if outcome.is_err() {
            stream = None;
        }
        tally.record(started.elapsed(), outcome);
        run.done();
    }
    tally
}

type KeepAliveStream = (mpsc::Sender<LeaseKeepAliveRequest>, Streaming<LeaseKeepAliveResponse>);

/// Renews lease `id` over `stream`, opening it first if there is none.
async fn keep_alive_once(
    client: &mut LeaseClient<Channel>,
    stream: &mut Option<KeepAliveStream>,
    id: i64,
    timeout: Duration,
) -> Result<u64, Status> {
    let request = LeaseKeepAliveRequest { id };
    let closed = || Status::unavailable("keep-alive stream closed");
    if let Some((requests, _)) = stream.as_mut() {
        requests.send(request).await.map_err(|_| closed())?;
    } else {
        let (tx, rx) = mpsc::channel(1);
        // Queued before the call: a Go server sends the response headers with a first answer.
        tx.send(request).await.map_err(|_| closed())?;
        let responses = timed(timeout, client.lease_keep_alive(ReceiverStream::new(rx))).await?;
        *stream = Some((tx, responses));
    }
    let Some((_, responses)) = stream.as_mut() else {
        return Err(closed());
    };
    match tokio::time::timeout(timeout, responses.message()).await {
        Ok(Ok(Some(r))) if r.ttl <= 0 => Err(Status::not_found(format!("lease {id:x} not found (TTL 0)"))),
        Ok(Ok(Some(r))) if r.id != id => Err(Status::internal(format!("asked to renew {id:x}, {:x} renewed", r.id))),
        Ok(Ok(Some(_))) => Ok(0),
        Ok(Ok(None)) => Err(closed()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(deadline(timeout)),
    }
}

/// Grants `n` leases of `ttl` seconds with all clients; the IDs granted.
async fn grant(g: &Global, b: &Bench, n: u64, ttl: i64, report: &mut Report) -> Result<Vec<i64>, Failure> {
    eprintln!("{TOOL}: granting {n} leases ...");
    let granted = Arc::new(Mutex::new(Vec::new()));
    let run = Run::start(Some(n), None, None);
    let op = Op::Grant {
        ttl,
        granted: Arc::clone(&granted),
    };
    let (tally, elapsed) = b.drive_op("grant", &run, g.clients, op).await?;
    let ids = std::mem::take(&mut *granted.lock());
    if ids.is_empty() {
        return Err(Failure(format!("granting leases: none granted{}", tally.errors_text())));
    }
    report.extra("leases_granted", ids.len());
    report.extra("grant_s", rounded(elapsed.as_secs_f64(), 3));
    report.note(format!(
        "granted {} leases in {:.2} s, {} grants failed{}",
        ids.len(),
        elapsed.as_secs_f64(),
        tally.failed(),
        tally.errors_text()
    ));
    Ok(ids)
}

/// Revokes `ids` with all clients, unmeasured.
async fn revoke(g: &Global, b: &Bench, ids: &[i64], report: &mut Report) -> Result<(), Failure> {
    let run = Run::start(Some(ids.len() as u64), None, None);
    let op = Op::Revoke { leases: ids.to_vec() };
    let (tally, _) = b.drive_op("revoke", &run, g.clients, op).await?;
    if tally.failed() > 0 {
        report.note(format!(
            "revoking the leases: {} of {} failed{}",
            tally.failed(),
            ids.len(),
            tally.errors_text()
        ));
    }
    Ok(())
}

async fn lease_expiry(g: &Global, b: &Bench, a: &ExpiryArgs) -> Result<Report, Failure> {
    let mut report = Report::new("lease-expiry", g);
    report.param("leases", a.leases);
    report.param("ttl", a.ttl);
    report.param("keys_per_lease", a.keys_per_lease);
    report.param("val_size", a.val_size);
    let ttl = Duration::from_secs(a.ttl.unsigned_abs());
    let grant_started = Instant::now();
    let ids = grant(g, b, a.leases, a.ttl, &mut report).await?;
    let granted = Instant::now();
    // No lease expires before `earliest`; every one has by `latest`.
    let (earliest, latest) = (grant_started + ttl, granted + ttl);

    let prefix = format!("{}expiry/", g.key_prefix);
    let n = (ids.len() as u64).saturating_mul(a.keys_per_lease);
    eprintln!("{TOOL}: attaching {n} keys ...");
    let run = Run::start(Some(n), None, None);
    let op = Op::Attach {
        prefix: prefix.clone(),
        leases: ids,
        per_lease: a.keys_per_lease,
        value: Bytes::from(payload(a.val_size)),
    };
    let (attached, attach_elapsed) = b.drive_op("attach", &run, g.clients, op).await?;
    let attach_done = Instant::now();
    report.extra("keys_attached", attached.ok);
    report.extra("attach_s", rounded(attach_elapsed.as_secs_f64(), 3));
    report.note(format!(
        "attached {} keys in {:.2} s, {} puts failed{}",
        attached.ok,
        attach_elapsed.as_secs_f64(),
        attached.failed(),
        attached.errors_text()
    ));
    if attach_done >= earliest {
        return Err(Failure(format!(
            "granting and attaching took {:.2} s, not less than the {} s TTL: take a longer --ttl or fewer keys",
            attach_done.duration_since(grant_started).as_secs_f64(),
            a.ttl
        )));
    }
    if attached.ok == 0 {
        return Err(Failure(format!(
            "attaching keys: no put succeeded{}",
            attached.errors_text()
        )));
    }

    eprintln!("{TOOL}: probing writes until the keys expire ...");
    let stop = Arc::new(AtomicBool::new(false));
    let probe_prefix = format!("{}probe/", g.key_prefix);
    let probe = Arc::new(Op::Put {
        keys: Keys::new(&probe_prefix, probe_prefix.len() + 6, 1_000_000, true)?,
        value: Bytes::from(payload(a.val_size)),
        stamp: None,
    });
    let probes: Vec<_> = (0..g.clients)
        .map(|c| tokio::spawn(probe_loop(b.requester(c, &probe), c as u64, Arc::clone(&stop))))
        .collect();
    tokio::time::sleep_until(earliest.into()).await;
    let counter = KvClient::new(connect_to(g, 0).await?);
    let expired = count_down(counter, b, &prefix, attached.ok, latest + EXPIRY_PATIENCE).await?;
    stop.store(true, Ordering::SeqCst);
    let probing_ended = Instant::now();
    // Writes sent from the last count that found every key until none was left may have met
    // the revocations; the ones sent before are the baseline.
    let window = (
        expired.last_full.unwrap_or(earliest),
        expired.all_gone.unwrap_or(probing_ended),
    );
    let (mut before, mut during) = (Tally::new()?, Tally::new()?);
    for p in probes {
        let samples = p.await.context(|| "a probe writer failed".to_string())?;
        samples.split(window, &mut before, &mut during);
    }

    // Seconds from `from` to `t`, negative if `t` came first.
    let signed = |t: Instant, from: Instant| {
        if t >= from {
            t.duration_since(from).as_secs_f64()
        } else {
            -from.duration_since(t).as_secs_f64()
        }
    };
    let secs = |t: Option<Instant>, from: Instant| t.map_or(Value::Null, |t| Value::from(rounded(signed(t, from), 3)));
    report.extra("first_gone_after_earliest_s", secs(expired.first_gone, earliest));
    report.extra("all_gone_after_earliest_s", secs(expired.all_gone, earliest));
    report.extra("all_gone_after_latest_s", secs(expired.all_gone, latest));
    report.extra("keys_left", expired.left);
    let (d, b) = (Percentiles::of(&during.latency), Percentiles::of(&before.latency));
    let over = |d: Option<u64>, b: Option<u64>| ratio(d? as f64, b? as f64);
    let (p50_ratio, p99_ratio) = (over(d.p50, b.p50), over(d.p99, b.p99));
    report.extra("probe_p50_during_over_before", ratio_json(p50_ratio));
    report.extra("probe_p99_during_over_before", ratio_json(p99_ratio));
    let at = |t: Option<Instant>| t.map_or_else(|| "never".to_string(), |t| format!("{:+.3} s", signed(t, earliest)));
    report.note(format!(
        "leases granted between 0 and {:.3} s; TTL {} s, so they expire from +0 (\"earliest\") to {:+.3} s",
        granted.duration_since(grant_started).as_secs_f64(),
        a.ttl,
        signed(latest, earliest)
    ));
    report.note(format!(
        "keys: last all there at {}, first gone at {}, all gone at {} ({} left at the end)",
        at(expired.last_full),
        at(expired.first_gone),
        at(expired.all_gone),
        expired.left
    ));
    report.note(format!(
        "probe writes: sent in the {:.3} s from the last full count to the last one are \"expiring\", \
         those in the {:.2} s before are \"before\"; expiring over before: p50 {}, p99 {}",
        window.1.saturating_duration_since(window.0).as_secs_f64(),
        window.0.saturating_duration_since(attach_done).as_secs_f64(),
        times_cell(p50_ratio),
        times_cell(p99_ratio)
    ));
    if expired.all_gone.is_none() {
        report.failure = Some(format!(
            "{} of {} keys were still there {} s after the last lease's TTL",
            expired.left,
            attached.ok,
            EXPIRY_PATIENCE.as_secs()
        ));
    } else if before.ok + during.ok == 0 {
        report.failure = Some(format!(
            "no probe write succeeded{}{}",
            before.errors_text(),
            during.errors_text()
        ));
    }
    report.row("probe-expiring", during, window.1.saturating_duration_since(window.0));
    report.row("probe-before", before, window.0.saturating_duration_since(attach_done));
    Ok(report)
}

/// What `count_down` saw.
#[derive(Debug)]
struct Expiry {
    /// When the last count that found every key was sent.
    last_full: Option<Instant>,
    /// When the first count that found fewer was answered.
    first_gone: Option<Instant>,
    /// When the count that found none was answered.
    all_gone: Option<Instant>,
    /// Keys left at the last successful count.
    left: i64,
}

/// Counts the keys under `prefix` every `EXPIRY_POLL` until none is left or `until`, over
/// `kv` (a connection of its own, so that the probes' connections carry only their writes).
async fn count_down(
    mut kv: KvClient<Channel>,
    b: &Bench,
    prefix: &str,
    attached: u64,
    until: Instant,
) -> Result<Expiry, Failure> {
    let bar = spinner(b.shown, "keys left");
    let request = RangeRequest {
        key: Bytes::copy_from_slice(prefix.as_bytes()),
        range_end: prefix_end(prefix.as_bytes()),
        count_only: true,
        ..RangeRequest::default()
    };
    let mut expiry = Expiry {
        last_full: None,
        first_gone: None,
        all_gone: None,
        left: i64::try_from(attached).unwrap_or(i64::MAX),
    };
    let mut last_error = None;
    while Instant::now() < until {
        let sent = Instant::now();
        match timed(b.timeout, kv.range(request.clone())).await {
            Ok(r) => {
                let now = Instant::now();
                expiry.left = r.count;
                bar.set_message(format!("{} keys left", r.count));
                if u64::try_from(r.count).unwrap_or(0) >= attached {
                    expiry.last_full = Some(sent);
                } else if expiry.first_gone.is_none() {
                    expiry.first_gone = Some(now);
                }
                if r.count == 0 {
                    expiry.all_gone = Some(now);
                    break;
                }
            }
            Err(e) => last_error = Some(e),
        }
        tokio::time::sleep(EXPIRY_POLL).await;
    }
    bar.finish_and_clear();
    if expiry.all_gone.is_none() {
        if let Some(e) = last_error {
            eprintln!("{TOOL}: the last failed count of the keys left: {e}");
        }
    }
    Ok(expiry)
}

/// What a lease-expiry probe writer saw, by send time: sorted into before and during the
/// expiry once its window is known.
#[derive(Debug, Default)]
struct Samples {
    ok: Vec<(Instant, Duration)>,
    failed: Vec<(Instant, Status)>,
}

impl Samples {
    /// Adds the samples sent before `window` to `before`, those inside it to `during`.
    fn split(self, window: (Instant, Instant), before: &mut Tally, during: &mut Tally) {
        for (sent, took) in self.ok {
            if sent < window.0 {
                before.record(took, Ok(0));
            } else if sent <= window.1 {
                during.record(took, Ok(0));
            }
        }
        for (sent, e) in self.failed {
            if sent < window.0 {
                before.error(&e);
            } else if sent <= window.1 {
                during.error(&e);
            }
        }
    }
}

/// A lease-expiry probe writer: puts its own key, one at a time, until `stop`.
async fn probe_loop(mut r: Requester, c: u64, stop: Arc<AtomicBool>) -> Samples {
    let mut samples = Samples::default();
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        match r.call(c).await {
            Ok(_) => samples.ok.push((sent, sent.elapsed())),
            Err(e) => samples.failed.push((sent, e)),
        }
    }
    samples
}

// ---------------------------------------------------------------------------------------------
// Keys.

/// A key space: keys `prefix` + a zero-padded number below `space`, `digits` wide.
#[derive(Debug, Clone)]
struct Keys {
    prefix: String,
    digits: usize,
    space: u64,
    sequential: bool,
}

impl Keys {
    /// The key space of `space` keys `key_size` bytes long; fails if the prefix and the
    /// number do not fit.
    fn new(prefix: &str, key_size: usize, space: u64, sequential: bool) -> Result<Keys, Failure> {
        let need = digits(space.saturating_sub(1));
        if key_size < prefix.len() + need {
            return Err(Failure(format!(
                "--key-size {key_size} is too small for the prefix `{prefix}` and {need} digits of \
                 {space} keys: take at least {}",
                prefix.len() + need
            )));
        }
        Ok(Keys {
            prefix: prefix.to_string(),
            digits: key_size - prefix.len(),
            space,
            sequential,
        })
    }

    fn key(&self, n: u64) -> Bytes {
        Bytes::from(format!("{}{n:0width$}", self.prefix, width = self.digits))
    }

    /// The key of request `i`: in order, or at random.
    fn pick(&self, i: u64, rng: &mut StdRng) -> Bytes {
        let n = if self.sequential {
            i % self.space
        } else {
            rng.random_range(0..self.space)
        };
        self.key(n)
    }
}

/// Decimal digits of `n`.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// The end of the range of every key starting with `prefix`, as etcd's clients compute it.
fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bytes::from(end);
        }
    }
    // All 0xff (or empty): every key from `prefix` on.
    Bytes::from_static(b"\0")
}

/// `value` with its first 8 bytes replaced by the nanoseconds from `epoch` to now.
fn stamped(value: &Bytes, epoch: Instant) -> Bytes {
    let nanos = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let mut v = BytesMut::with_capacity(value.len().max(8));
    v.put_u64(nanos);
    v.extend_from_slice(value.get(8..).unwrap_or_default());
    v.freeze()
}

/// The send time a `stamped` value carries, as time since the epoch.
fn stamp_of(value: &[u8]) -> Option<Duration> {
    let nanos: [u8; 8] = value.get(..8)?.try_into().ok()?;
    Some(Duration::from_nanos(u64::from_be_bytes(nanos)))
}

// ---------------------------------------------------------------------------------------------
// Requests.

/// The request a requester sends, by workload.
#[derive(Debug)]
enum Op {
    /// A put; with `stamp`, the value carries the send time.
    Put {
        keys: Keys,
        value: Bytes,
        stamp: Option<Instant>,
    },
    /// A read of one key, or of the whole prefix.
    Range {
        keys: Keys,
        whole_prefix: bool,
        limit: i64,
        serializable: bool,
    },
    TxnPut {
        keys: Keys,
        value: Bytes,
        compare: TxnCompare,
    },
    /// Deletes key `i` (keys are sequential).
    Delete { keys: Keys },
    /// Grants a lease; its ID goes into `granted`.
    Grant { ttl: i64, granted: Arc<Mutex<Vec<i64>>> },
    /// Puts key `i`, attached to lease `i / per_lease`.
    Attach {
        prefix: String,
        leases: Vec<i64>,
        per_lease: u64,
        value: Bytes,
    },
    /// Revokes lease `i`.
    Revoke { leases: Vec<i64> },
}

/// One client: its connection's stubs and what it sends.
#[derive(Debug)]
struct Requester {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    op: Arc<Op>,
    rng: StdRng,
    timeout: Duration,
}

impl Requester {
    /// Sends request `i` and waits for the answer; `Ok` carries what the workload counts
    /// (keys read, txns succeeded, keys deleted).
    async fn call(&mut self, i: u64) -> Result<u64, Status> {
        let op = Arc::clone(&self.op);
        let t = self.timeout;
        match &*op {
            Op::Put { keys, value, stamp } => {
                let value = stamp.map_or_else(|| value.clone(), |epoch| stamped(value, epoch));
                let request = PutRequest {
                    key: keys.pick(i, &mut self.rng),
                    value,
                    ..PutRequest::default()
                };
                timed(t, self.kv.put(request)).await.map(|_| 0)
            }
            Op::Range {
                keys,
                whole_prefix,
                limit,
                serializable,
            } => {
                let (key, range_end) = if *whole_prefix {
                    let prefix = keys.prefix.as_bytes();
                    (Bytes::copy_from_slice(prefix), prefix_end(prefix))
                } else {
                    (keys.pick(i, &mut self.rng), Bytes::new())
                };
                let request = RangeRequest {
                    key,
                    range_end,
                    limit: *limit,
                    serializable: *serializable,
                    ..RangeRequest::default()
                };
                timed(t, self.kv.range(request)).await.map(|r| r.kvs.len() as u64)
            }
            Op::TxnPut { keys, value, compare } => {
                let key = keys.pick(i, &mut self.rng);
                let result = match compare {
                    TxnCompare::Absent => CompareResult::Equal,
                    TxnCompare::Present => CompareResult::Greater,
                };
                let request = TxnRequest {
                    compare: vec![Compare {
                        result: result as i32,
                        target: CompareTarget::Mod as i32,
                        key: key.clone(),
                        target_union: Some(TargetUnion::ModRevision(0)),
                        ..Compare::default()
                    }],
                    success: vec![RequestOp {
                        request: Some(Request::RequestPut(PutRequest {
                            key,
                            value: value.clone(),
                            ..PutRequest::default()
                        })),
                    }],
                    failure: Vec::new(),
                };
                timed(t, self.kv.txn(request)).await.map(|r| u64::from(r.succeeded))
            }
            Op::Delete { keys } => {
                let request = DeleteRangeRequest {
                    key: keys.pick(i, &mut self.rng),
                    ..DeleteRangeRequest::default()
                };
                timed(t, self.kv.delete_range(request))
                    .await
                    .map(|r| r.deleted.max(0).unsigned_abs())
            }
            Op::Grant { ttl, granted } => {
                let r = timed(t, self.lease.lease_grant(LeaseGrantRequest { ttl: *ttl, id: 0 })).await?;
                if !r.error.is_empty() {
                    return Err(Status::unknown(r.error));
                }
                granted.lock().push(r.id);
                Ok(0)
            }
            Op::Attach {
                prefix,
                leases,
                per_lease,
                value,
            } => {
                let n = i / per_lease;
                let lease = usize::try_from(n)
                    .ok()
                    .and_then(|n| leases.get(n))
                    .copied()
                    .ok_or_else(|| Status::internal(format!("no lease number {n}")))?;
                let request = PutRequest {
                    key: Bytes::from(format!("{prefix}{n:012}/{:08}", i % per_lease)),
                    value: value.clone(),
                    lease,
                    ..PutRequest::default()
                };
                timed(t, self.kv.put(request)).await.map(|_| 0)
            }
            Op::Revoke { leases } => {
                let id = usize::try_from(i)
                    .ok()
                    .and_then(|i| leases.get(i))
                    .copied()
                    .ok_or_else(|| Status::internal(format!("no lease number {i}")))?;
                timed(t, self.lease.lease_revoke(LeaseRevokeRequest { id }))
                    .await
                    .map(|_| 0)
            }
        }
    }
}

/// Waits for `call`'s answer at most `timeout`.
async fn timed<T>(
    timeout: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(timeout, call).await {
        Ok(answer) => answer.map(tonic::Response::into_inner),
        Err(_) => Err(deadline(timeout)),
    }
}

fn deadline(timeout: Duration) -> Status {
    Status::deadline_exceeded(format!("no answer within {timeout:?} (client-side timeout)"))
}

/// A requester's loop: sends the run's requests one at a time until it ends.
async fn request_loop(mut r: Requester, run: Arc<Run>, mut tally: Tally) -> Tally {
    while let Some(i) = run.next().await {
        let started = Instant::now();
        let outcome = r.call(i).await;
        tally.record(started.elapsed(), outcome);
        run.done();
    }
    tally
}

// ---------------------------------------------------------------------------------------------
// Runs, tallies and progress.

/// A run's limits and the requests handed out so far, shared by its clients.
#[derive(Debug)]
struct Run {
    started: Instant,
    total: Option<u64>,
    deadline: Option<Instant>,
    rate: Option<f64>,
    /// Request numbers handed out (may pass `total`: every client takes one to learn it's over).
    issued: AtomicU64,
    /// Requests answered (or failed), for the progress bar.
    completed: AtomicU64,
}

impl Run {
    fn start(total: Option<u64>, seconds: Option<Duration>, rate: Option<f64>) -> Arc<Run> {
        let started = Instant::now();
        Arc::new(Run {
            started,
            total,
            deadline: seconds.map(|s| started + s),
            rate,
            issued: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        })
    }

    fn over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// The next request's number, once the rate allows it; `None` when the run is over.
    async fn next(&self) -> Option<u64> {
        if self.over() {
            return None;
        }
        let i = self.issued.fetch_add(1, Ordering::SeqCst);
        if self.total.is_some_and(|t| i >= t) {
            return None;
        }
        if let Some(rate) = self.rate {
            let due = self.started + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
            if self.over() {
                return None;
            }
        }
        Some(i)
    }

    fn done(&self) {
        self.completed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `clients` workers (`worker(c, tally)`) until they return, with a progress bar for
/// `run`; their merged tally, and the time from the run's start until the last one returned.
async fn drive<F, Fut>(
    label: &str,
    run: &Arc<Run>,
    clients: usize,
    shown: bool,
    worker: F,
) -> Result<(Tally, Duration), Failure>
where
    F: Fn(usize, Tally) -> Fut,
    Fut: Future<Output = Tally> + Send + 'static,
{
    let tallies = (0..clients).map(|_| Tally::new()).collect::<Result<Vec<_>, _>>()?;
    let bar = progress_bar(label, run, shown);
    let ticker = tokio::spawn(tick(bar.clone(), Arc::clone(run)));
    let tasks: Vec<_> = tallies
        .into_iter()
        .enumerate()
        .map(|(c, tally)| tokio::spawn(worker(c, tally)))
        .collect();
    let mut merged = Tally::new()?;
    let mut panicked = None;
    for t in tasks {
        match t.await {
            Ok(tally) => merged.absorb(tally)?,
            Err(e) => panicked = Some(e),
        }
    }
    let elapsed = run.started.elapsed();
    ticker.abort();
    bar.finish_and_clear();
    match panicked {
        Some(e) => Err(Failure(format!("a {label} client failed: {e}"))),
        None => Ok((merged, elapsed)),
    }
}

/// A bar for `run`: requests done of `--total`, or time passed of `--seconds`.
fn progress_bar(label: &str, run: &Run, shown: bool) -> ProgressBar {
    if !shown {
        return ProgressBar::hidden();
    }
    let (len, template) = match (run.total, run.deadline) {
        (Some(total), None) => (total, "{prefix:>15} [{wide_bar}] {pos}/{len} {msg} ({eta})"),
        (_, Some(deadline)) => (
            micros(deadline.saturating_duration_since(run.started)) / 1000,
            "{prefix:>15} [{wide_bar}] {msg} ({eta})",
        ),
        (None, None) => (0, "{prefix:>15} {spinner} {msg}"),
    };
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label.to_string());
    bar
}

/// A spinner with a message, for phases without a count.
fn spinner(shown: bool, label: &str) -> ProgressBar {
    if !shown {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{prefix:>15} {spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.set_prefix(label.to_string());
    bar.enable_steady_tick(PROGRESS_TICK);
    bar
}

/// Redraws `bar` from `run`'s counters until aborted.
async fn tick(bar: ProgressBar, run: Arc<Run>) {
    let mut interval = tokio::time::interval(PROGRESS_TICK);
    loop {
        interval.tick().await;
        let done = run.completed.load(Ordering::Relaxed);
        let elapsed = run.started.elapsed();
        if run.deadline.is_some() {
            bar.set_position(micros(elapsed) / 1000);
            bar.set_message(format!("{done} requests, {:.0}/s", per_sec(done, elapsed)));
        } else {
            bar.set_position(done);
            bar.set_message(format!("{:.0}/s", per_sec(done, elapsed)));
        }
    }
}

/// Failures of one kind: how many, and the first one's message.
#[derive(Debug, Clone)]
struct Errors {
    count: u64,
    example: String,
}

/// What a client (or a whole phase) counted: latencies of the successful requests, how many
/// succeeded, what the workload counts in them, and failures by gRPC code.
#[derive(Debug)]
struct Tally {
    latency: Histogram<u64>,
    ok: u64,
    hits: u64,
    errors: BTreeMap<String, Errors>,
}

impl Tally {
    fn new() -> Result<Tally, Failure> {
        Ok(Tally {
            latency: histogram(LATENCY_CEILING)?,
            ok: 0,
            hits: 0,
            errors: BTreeMap::new(),
        })
    }

    fn record(&mut self, took: Duration, outcome: Result<u64, Status>) {
        match outcome {
            Ok(hits) => {
                self.latency.saturating_record(micros(took));
                self.ok += 1;
                self.hits += hits;
            }
            Err(e) => self.error(&e),
        }
    }

    fn error(&mut self, e: &Status) {
        let entry = self.errors.entry(format!("{:?}", e.code())).or_insert_with(|| Errors {
            count: 0,
            example: e.message().chars().take(200).collect(),
        });
        entry.count += 1;
    }

    fn failed(&self) -> u64 {
        self.errors.values().map(|e| e.count).sum()
    }

    fn absorb(&mut self, other: Tally) -> Result<(), Failure> {
        self.latency
            .add(&other.latency)
            .context(|| "merge latency histograms".to_string())?;
        self.ok += other.ok;
        self.hits += other.hits;
        for (code, e) in other.errors {
            self.errors
                .entry(code)
                .and_modify(|mine| mine.count += e.count)
                .or_insert(e);
        }
        Ok(())
    }

    /// `: Code xN ("message"), ...`, or nothing without failures.
    fn errors_text(&self) -> String {
        if self.errors.is_empty() {
            return String::new();
        }
        let list: Vec<String> = self
            .errors
            .iter()
            .map(|(code, e)| format!("{code} x{} ({:?})", e.count, e.example))
            .collect();
        format!(": {}", list.join(", "))
    }
}

// ---------------------------------------------------------------------------------------------
// Reports.

/// Latency percentiles with p90, the maximum and the mean, in microseconds.
#[derive(Debug, Clone, Copy)]
struct Summary {
    p: Percentiles,
    p90: Option<u64>,
    max: Option<u64>,
    mean: Option<f64>,
}

impl Summary {
    fn of(h: &Histogram<u64>) -> Summary {
        let some = !h.is_empty();
        Summary {
            p: Percentiles::of(h),
            p90: some.then(|| h.value_at_quantile(0.9)),
            max: some.then(|| h.max()),
            mean: some.then(|| h.mean()),
        }
    }
}

/// One measured line: a phase's tally over its time.
#[derive(Debug)]
struct Row {
    name: &'static str,
    tally: Tally,
    elapsed: Duration,
}

/// A run's outcome: its rows (the first is the workload's own), parameters, and what else
/// it found.
#[derive(Debug)]
struct Report {
    workload: &'static str,
    endpoints: Vec<String>,
    conns: usize,
    clients: usize,
    params: Map<String, Value>,
    rows: Vec<Row>,
    extras: Map<String, Value>,
    notes: Vec<String>,
    /// Set when the run must end with a failure after its report is printed.
    failure: Option<String>,
}

impl Report {
    fn new(workload: &'static str, g: &Global) -> Report {
        Report {
            workload,
            endpoints: g.endpoints.clone(),
            conns: g.conns,
            clients: g.clients,
            params: Map::new(),
            rows: Vec::new(),
            extras: Map::new(),
            notes: Vec::new(),
            failure: None,
        }
    }

    fn param(&mut self, k: &str, v: impl Into<Value>) {
        self.params.insert(k.to_string(), v.into());
    }

    fn extra(&mut self, k: &str, v: impl Into<Value>) {
        self.extras.insert(k.to_string(), v.into());
    }

    fn note(&mut self, s: String) {
        self.notes.push(s);
    }

    fn row(&mut self, name: &'static str, tally: Tally, elapsed: Duration) {
        self.rows.push(Row { name, tally, elapsed });
    }

    /// Marks the run failed if its first row has nothing that succeeded.
    fn require_success(mut self) -> Report {
        if let Some(first) = self.rows.first() {
            if first.tally.ok == 0 && self.failure.is_none() {
                self.failure = Some(format!("no {} succeeded{}", first.name, first.tally.errors_text()));
            }
        }
        self
    }

    fn print(&self, args: &Args) -> Result<(), Failure> {
        if args.global.json {
            let json = serde_json::to_string_pretty(&self.to_json()).context(|| "encode JSON".to_string())?;
            println!("{json}");
        } else {
            self.print_table();
        }
        Ok(())
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("workload".into(), Value::from(self.workload));
        m.insert("endpoints".into(), Value::from(self.endpoints.clone()));
        m.insert("conns".into(), Value::from(self.conns));
        m.insert("clients".into(), Value::from(self.clients));
        m.insert("params".into(), Value::Object(self.params.clone()));
        for (i, row) in self.rows.iter().enumerate() {
            // The workload's own row unprefixed; the others prefixed with their name.
            let p = if i == 0 {
                String::new()
            } else {
                format!("{}_", row.name.replace('-', "_"))
            };
            let t = &row.tally;
            let s = Summary::of(&t.latency);
            m.insert(format!("{p}ok"), Value::from(t.ok));
            m.insert(format!("{p}failed"), Value::from(t.failed()));
            m.insert(
                format!("{p}elapsed_s"),
                Value::from(rounded(row.elapsed.as_secs_f64(), 3)),
            );
            m.insert(
                format!("{p}ops_per_sec"),
                Value::from(rounded(per_sec(t.ok, row.elapsed), 2)),
            );
            m.insert(format!("{p}p50_us"), Value::from(s.p.p50));
            m.insert(format!("{p}p90_us"), Value::from(s.p90));
            m.insert(format!("{p}p99_us"), Value::from(s.p.p99));
            m.insert(format!("{p}p999_us"), Value::from(s.p.p999));
            m.insert(format!("{p}max_us"), Value::from(s.max));
            m.insert(
                format!("{p}mean_us"),
                s.mean.map_or(Value::Null, |v| Value::from(rounded(v, 1))),
            );
            let errors: Map<String, Value> = t
                .errors
                .iter()
                .map(|(code, e)| {
                    let mut o = Map::new();
                    o.insert("count".into(), Value::from(e.count));
                    o.insert("example".into(), Value::from(e.example.clone()));
                    (code.clone(), Value::Object(o))
                })
                .collect();
            m.insert(format!("{p}errors"), Value::Object(errors));
        }
        for (k, v) in &self.extras {
            m.insert(k.clone(), v.clone());
        }
        if let Some(f) = &self.failure {
            m.insert("failure".into(), Value::from(f.clone()));
        }
        Value::Object(m)
    }

    fn print_table(&self) {
        let params: Vec<String> = self.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "{TOOL} {} against {} ({} conns, {} clients): {}",
            self.workload,
            self.endpoints.join(","),
            self.conns,
            self.clients,
            params.join(" ")
        );
        println!(
            "{:<15} {:>9} {:>7} {:>8} {:>10} {:>8} {:>8} {:>8} {:>9} {:>8}",
            "", "ok", "failed", "seconds", "per sec", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us"
        );
        for row in &self.rows {
            let t = &row.tally;
            let s = Summary::of(&t.latency);
            println!(
                "{:<15} {:>9} {:>7} {:>8.2} {:>10.1} {:>8} {:>8} {:>8} {:>9} {:>8}",
                row.name,
                t.ok,
                t.failed(),
                row.elapsed.as_secs_f64(),
                per_sec(t.ok, row.elapsed),
                us_cell(s.p.p50),
                us_cell(s.p90),
                us_cell(s.p.p99),
                us_cell(s.p.p999),
                us_cell(s.max),
            );
        }
        for row in &self.rows {
            for (code, e) in &row.tally.errors {
                println!("errors ({}): {code} x{}, e.g. {:?}", row.name, e.count, e.example);
            }
        }
        for n in &self.notes {
            println!("{n}");
        }
    }
}
