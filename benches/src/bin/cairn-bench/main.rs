//! `cairn-bench`: a load generator for any etcd-compatible endpoint (a cairn member, or etcd
//! itself), after etcd's own `benchmark` tool. It speaks the v3 gRPC API and measures, per
//! workload, how many requests succeed per second and their latency, in HDR histograms:
//! p50, p90, p99, p99.9 and max, in microseconds.
//!
//! Workloads (subcommands):
//! - `put`: puts `--val-size`-byte values at `--key-size`-byte keys picked at random (or in
//!   order, `--sequential-keys`) from `--key-space-size` keys.
//! - `range`: linearizable or serializable (`--consistency l|s`) reads of one key of the key
//!   space, or of the whole `--key-prefix` (`--prefix`, with `--limit`; `--paged` walks it in
//!   pages of `--limit` at one revision, as kube-apiserver lists); `--load N` puts N keys
//!   first.
//! - `txn-put`: a Txn comparing the key's MOD revision (`--compare absent`: MOD = 0;
//!   `present`: MOD > 0), with one put in its success branch.
//! - `delete`: puts `--keys` keys, then deletes each once.
//! - `watch`: `--watchers` watchers of the prefix over `--streams` watch streams (spread over
//!   the `--conns`) while `--clients` writers put at `--put-rate` (or as fast as answered) over
//!   a connection of their own; events delivered per second, and put-to-event latency (each
//!   value carries its send time).
//! - `lease-keepalive`: grants `--leases` leases, then `--clients` keep-alive streams renew
//!   them as fast as they are answered.
//! - `lease-expiry`: grants `--leases` leases of `--ttl` seconds with `--keys-per-lease` keys
//!   each, then times how long after the TTL the keys are all gone (a count-only range every
//!   20 ms, over a connection of its own), while `--clients` probe writers put one at a time.
//!   Probes sent from the last count that found every key until the one that found none are
//!   "expiring", the earlier ones "before"; their latencies side by side (and as ratios) say
//!   whether mass expiry stalls writes.
//! - `k8s`: a Kubernetes control plane's load, open-loop and compressed in time: `--nodes`
//!   renewing their Lease objects every `--lease-period`, pods arriving at `--pod-rate` and
//!   making 7 writes each over `--pod-lifetime` (all as the apiserver's Txns on the MOD
//!   revision), watches of the pods and leases prefixes, a compaction every
//!   `--compact-interval`; write latency, writes behind schedule, event lag (see `k8s/mod.rs`).
//!
//! Like etcd's tool, it opens `--conns` gRPC connections (round-robin over `--endpoints`) and
//! runs `--clients` concurrent requesters spread over them, each with one request in flight.
//! A run stops after `--total` requests or `--seconds` (10000 requests when neither is given);
//! `--rate` caps the requests sent per second. Latency is measured from sending a request to
//! its answer (a requester behind the `--rate` schedule sends at once, so it is the service
//! time, not the time since the request was due). Failed requests are counted per gRPC code;
//! the run fails only when none succeeded. A progress bar shows on a terminal; `--json` prints
//! one JSON object instead of the table. `--latency-log FILE` writes every successful request
//! of the workload (for watch, every event; for lease-expiry, every probe write; for k8s, every
//! write) as `<answered µs since the run started>,<latency µs>` lines after a `#` line giving
//! the run's start as Unix time, for windowed percentiles and plots.
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
//! cairn-bench --seconds 30 k8s --nodes 5000 --watchers 2
//! ```
//!
//! Every key it writes starts with `--key-prefix` (default `bench/`): put, range, txn-put and
//! delete use it directly, watch adds `watch/`, lease-expiry adds `expiry/` and `probe/`, k8s
//! adds `registry/` (and `compact_rev_key`). Only delete and the lease workloads clean up after
//! themselves (leases are revoked or expire).

mod drive;
mod fanout;
mod k8s;
mod keys;
mod kv;
mod lease;
mod report;
mod request;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use cairn_benches::{exit_code, parse_count, parse_seconds, Context, Failure};
use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::lease_client::LeaseClient;
use clap::{Parser, Subcommand, ValueEnum};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::drive::*;
use crate::fanout::*;
use crate::k8s::*;
use crate::kv::*;
use crate::lease::*;
use crate::report::*;
use crate::request::*;

/// Prefixes every message.
pub(crate) const TOOL: &str = "cairn-bench";

/// Drives an etcd-compatible endpoint with one workload and reports throughput and latency.
#[derive(Debug, Parser)]
#[command(name = "cairn-bench", version)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) workload: Workload,
}

/// Options every workload takes, before or after the subcommand.
#[derive(Debug, clap::Args)]
pub(crate) struct Global {
    /// Client endpoints, `host:port` or URLs, comma-separated; connections go round-robin over them.
    #[arg(long, global = true, value_delimiter = ',', default_value = "127.0.0.1:2379")]
    pub(crate) endpoints: Vec<String>,
    /// gRPC connections to open.
    #[arg(long, global = true, default_value_t = 1, value_parser = parse_conns)]
    pub(crate) conns: usize,
    /// Concurrent requesters, spread over the connections, each with one request in flight.
    #[arg(long, global = true, default_value_t = 1, value_parser = parse_clients)]
    pub(crate) clients: usize,
    /// Stop after this many requests (10000 when neither this nor --seconds is given).
    #[arg(long, global = true, value_parser = parse_total)]
    pub(crate) total: Option<u64>,
    /// Stop after this many seconds (fractions allowed).
    #[arg(long, global = true, value_parser = parse_seconds, allow_negative_numbers = true)]
    pub(crate) seconds: Option<f64>,
    /// Send at most this many requests per second over all clients (default: no limit).
    #[arg(long, global = true, value_parser = parse_rate)]
    pub(crate) rate: Option<f64>,
    /// Give up waiting for an answer after this many seconds (counted as DeadlineExceeded).
    #[arg(long, global = true, default_value_t = 10.0, value_parser = parse_seconds)]
    pub(crate) timeout: f64,
    /// Every key written starts with this.
    #[arg(long, global = true, default_value = "bench/")]
    pub(crate) key_prefix: String,
    /// Print one JSON object instead of a table (and no progress bar).
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// Write each successful request of the workload to this file, one `<answered>,<latency>`
    /// line: when its answer came, in microseconds since the run started, and its latency in
    /// microseconds (kept in memory until the end, 16 bytes a request).
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) latency_log: Option<std::path::PathBuf>,
    /// Trust the server certificates this CA signs (PEM), for https endpoints.
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) cacert: Option<std::path::PathBuf>,
    /// Present this client certificate (PEM), with --key.
    #[arg(long, global = true, value_name = "FILE", requires = "key")]
    pub(crate) cert: Option<std::path::PathBuf>,
    /// The key of --cert (PEM).
    #[arg(long, global = true, value_name = "FILE", requires = "cert")]
    pub(crate) key: Option<std::path::PathBuf>,
    /// Authenticate as `name:password` once, and send the token with every request.
    #[arg(long, global = true, value_name = "NAME:PASSWORD")]
    pub(crate) user: Option<String>,
}

/// A connection to a member: a gRPC channel whose requests carry the auth token, if any.
pub(crate) type Conn = InterceptedService<Channel, Token>;

/// Adds the auth token (`--user`) to every request.
#[derive(Clone, Debug, Default)]
pub(crate) struct Token(Option<tonic::metadata::AsciiMetadataValue>);

impl tonic::service::Interceptor for Token {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request.metadata_mut().insert("token", token.clone());
        }
        Ok(request)
    }
}

/// How connections are made: TLS for https endpoints, and the token, settled once.
pub(crate) struct Dialer {
    connector: cairn_server::internals::tls::Connector,
    token: Token,
}

static DIALER: std::sync::OnceLock<Dialer> = std::sync::OnceLock::new();

/// Sets up TLS from --cacert/--cert/--key and authenticates --user, once per run.
pub(crate) async fn dialer(g: &Global) -> Result<&'static Dialer, Failure> {
    if let Some(d) = DIALER.get() {
        return Ok(d);
    }
    let tls = if g.cacert.is_some() || g.cert.is_some() {
        let files = cairn_server::internals::tls::Files {
            client_cert: g.cert.clone(),
            client_key: g.key.clone(),
            trusted_ca: g.cacert.clone(),
            ..Default::default()
        };
        let protocols =
            cairn_server::internals::tls::Protocols::new("", "TLS1.2", "").map_err(|e| Failure(e.to_string()))?;
        Some(cairn_server::internals::tls::Tls::new(files, protocols).map_err(|e| Failure(format!("TLS: {e}")))?)
    } else {
        None
    };
    let connector = cairn_server::internals::tls::Connector::new(tls);
    let token = match &g.user {
        None => Token::default(),
        Some(user) => {
            let (name, password) = user
                .split_once(':')
                .ok_or_else(|| Failure(format!("--user {user:?} is not name:password")))?;
            let url = endpoint_url(g, 0)?;
            let channel = connector.channel(&url).await.map_err(Failure)?;
            let answer = cairn_server::pb::etcdserverpb::auth_client::AuthClient::new(channel)
                .authenticate(cairn_server::pb::etcdserverpb::AuthenticateRequest {
                    name: name.to_string(),
                    password: password.to_string(),
                })
                .await
                .map_err(|s| Failure(format!("authenticate as {name}: {}", s.message())))?;
            let token = answer.into_inner().token.parse().context(|| "the token".to_string())?;
            Token(Some(token))
        }
    };
    Ok(DIALER.get_or_init(|| Dialer { connector, token }))
}

#[derive(Debug, Subcommand)]
pub(crate) enum Workload {
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
    /// A Kubernetes control plane's load: node lease renewals, pod churn, watches, compaction.
    K8s(K8sArgs),
}

/// Which keys a workload's requests pick.
#[derive(Debug, clap::Args)]
pub(crate) struct KeyArgs {
    /// Bytes of each key, `--key-prefix` included (the rest is the key's number, zero-padded).
    #[arg(long, default_value_t = 16, value_parser = parse_key_size)]
    pub(crate) key_size: usize,
    /// Distinct keys requests pick from (default 1; for `range`, the `--load`ed keys).
    #[arg(long, value_parser = parse_key_space)]
    pub(crate) key_space_size: Option<u64>,
    /// Pick keys in order (0, 1, 2, ..., wrapping) instead of at random.
    #[arg(long)]
    pub(crate) sequential_keys: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct PutArgs {
    #[command(flatten)]
    pub(crate) keys: KeyArgs,
    /// Bytes of each value.
    #[arg(long, default_value_t = 8, value_parser = parse_val_size)]
    pub(crate) val_size: usize,
}

#[derive(Debug, clap::Args)]
pub(crate) struct RangeArgs {
    #[command(flatten)]
    pub(crate) keys: KeyArgs,
    /// `l`: linearizable (through the leader's read index); `s`: serializable (local).
    #[arg(long, value_enum, default_value_t = Consistency::L)]
    pub(crate) consistency: Consistency,
    /// Read the whole `--key-prefix` instead of one key.
    #[arg(long)]
    pub(crate) prefix: bool,
    /// Most keys one read returns (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub(crate) limit: u32,
    /// With `--prefix` and `--limit`: each client walks the whole prefix in pages, as
    /// kube-apiserver's paged lists do: the first page at the current revision, the next ones
    /// from the key after the last one returned, at the first page's revision; then again.
    #[arg(long, requires_all = ["prefix", "limit"])]
    pub(crate) paged: bool,
    /// Ask for the keys without their values.
    #[arg(long)]
    pub(crate) keys_only: bool,
    /// Ask for the count of keys only.
    #[arg(long)]
    pub(crate) count_only: bool,
    /// First put this many keys (0 to N-1 of the key space), unmeasured.
    #[arg(long, default_value_t = 0)]
    pub(crate) load: u64,
    /// Bytes of each `--load`ed value.
    #[arg(long, default_value_t = 8, value_parser = parse_val_size)]
    pub(crate) val_size: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Consistency {
    /// Linearizable.
    L,
    /// Serializable.
    S,
}

#[derive(Debug, clap::Args)]
pub(crate) struct TxnPutArgs {
    #[command(flatten)]
    pub(crate) keys: KeyArgs,
    /// Bytes of each value.
    #[arg(long, default_value_t = 8, value_parser = parse_val_size)]
    pub(crate) val_size: usize,
    /// The put happens if the key is `absent` (MOD = 0) or `present` (MOD > 0).
    #[arg(long, value_enum, default_value_t = TxnCompare::Absent)]
    pub(crate) compare: TxnCompare,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TxnCompare {
    /// MOD(key) = 0.
    Absent,
    /// MOD(key) > 0.
    Present,
}

#[derive(Debug, clap::Args)]
pub(crate) struct DeleteArgs {
    /// Keys to put and then delete (the deletes stop earlier at --total or --seconds).
    #[arg(long, default_value_t = 10_000, value_parser = parse_key_space)]
    pub(crate) keys: u64,
    /// Bytes of each key, `--key-prefix` included.
    #[arg(long, default_value_t = 16, value_parser = parse_key_size)]
    pub(crate) key_size: usize,
    /// Bytes of each value.
    #[arg(long, default_value_t = 8, value_parser = parse_val_size)]
    pub(crate) val_size: usize,
    /// Do not put the keys first (they are there from an earlier run).
    #[arg(long)]
    pub(crate) skip_load: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct WatchArgs {
    /// Watchers, each of the whole `<key-prefix>watch/` prefix.
    #[arg(long, default_value_t = 100, value_parser = parse_clients)]
    pub(crate) watchers: usize,
    /// Watch streams the watchers are spread over (streams go round-robin over the connections).
    #[arg(long, default_value_t = 10, value_parser = parse_clients)]
    pub(crate) streams: usize,
    /// Puts per second, over all writers (the --clients); left off, each writer puts as fast
    /// as it is answered.
    #[arg(long, value_parser = parse_rate)]
    pub(crate) put_rate: Option<f64>,
    /// Distinct keys the writers cycle through.
    #[arg(long, default_value_t = 100, value_parser = parse_key_space)]
    pub(crate) key_space_size: u64,
    /// Bytes of each value (at least 8: the send time).
    #[arg(long, default_value_t = 16, value_parser = parse_stamped_size)]
    pub(crate) val_size: usize,
}

#[derive(Debug, clap::Args)]
pub(crate) struct KeepAliveArgs {
    /// Leases to grant and renew.
    #[arg(long, default_value_t = 100, value_parser = parse_key_space)]
    pub(crate) leases: u64,
    /// Their TTL in seconds (long enough not to expire between renewals).
    #[arg(long, default_value_t = 60, value_parser = parse_ttl)]
    pub(crate) ttl: i64,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ExpiryArgs {
    /// Leases to grant.
    #[arg(long, default_value_t = 100, value_parser = parse_key_space)]
    pub(crate) leases: u64,
    /// Their TTL in seconds; granting and attaching the keys must take less.
    #[arg(long, default_value_t = 5, value_parser = parse_ttl)]
    pub(crate) ttl: i64,
    /// Keys attached to each lease.
    #[arg(long, default_value_t = 10, value_parser = parse_key_space)]
    pub(crate) keys_per_lease: u64,
    /// Bytes of each value (of the attached keys and the probes').
    #[arg(long, default_value_t = 8, value_parser = parse_val_size)]
    pub(crate) val_size: usize,
}

/// Most connections accepted.
pub(crate) const MAX_CONNS: usize = 1024;
/// Most concurrent clients (and watchers, and watch streams) accepted.
pub(crate) const MAX_CLIENTS: usize = 100_000;
/// Largest key accepted (etcd's default request limit is 1.5 MiB).
pub(crate) const MAX_KEY_SIZE: usize = 1 << 20;
/// Largest value accepted.
pub(crate) const MAX_VAL_SIZE: usize = 1 << 20;
/// Most keys a key space (or `--keys`, `--leases`) may have.
pub(crate) const MAX_KEYS: u64 = 1 << 40;
/// Requests run when neither `--total` nor `--seconds` is given.
pub(crate) const DEFAULT_TOTAL: u64 = 10_000;
/// Latencies are recorded up to a minute.
pub(crate) const LATENCY_CEILING: Duration = Duration::from_secs(60);
/// How long to wait for connections to open.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long watchers may take to deliver the last puts' events once the writers stopped.
pub(crate) const DRAIN_PATIENCE: Duration = Duration::from_secs(10);
/// How often lease-expiry counts the keys left.
pub(crate) const EXPIRY_POLL: Duration = Duration::from_millis(20);
/// How long after the last lease's TTL lease-expiry waits for the keys to go.
pub(crate) const EXPIRY_PATIENCE: Duration = Duration::from_secs(60);
/// How often the progress bar is redrawn.
pub(crate) const PROGRESS_TICK: Duration = Duration::from_millis(100);

pub(crate) fn parse_conns(s: &str) -> Result<usize, String> {
    parse_count(s, MAX_CONNS, "connections")
}

pub(crate) fn parse_clients(s: &str) -> Result<usize, String> {
    parse_count(s, MAX_CLIENTS, "clients")
}

pub(crate) fn parse_total(s: &str) -> Result<u64, String> {
    parse_count(s, u64::MAX, "requests")
}

pub(crate) fn parse_key_size(s: &str) -> Result<usize, String> {
    parse_count(s, MAX_KEY_SIZE, "bytes")
}

pub(crate) fn parse_key_space(s: &str) -> Result<u64, String> {
    parse_count(s, MAX_KEYS, "keys")
}

pub(crate) fn parse_val_size(s: &str) -> Result<usize, String> {
    let v: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number of bytes"))?;
    if v > MAX_VAL_SIZE {
        return Err(format!("must be at most {MAX_VAL_SIZE} bytes"));
    }
    Ok(v)
}

pub(crate) fn parse_stamped_size(s: &str) -> Result<usize, String> {
    let v = parse_val_size(s)?;
    if v < 8 {
        return Err("must be at least 8 bytes: a value carries its send time".to_string());
    }
    Ok(v)
}

pub(crate) fn parse_ttl(s: &str) -> Result<i64, String> {
    let v = parse_count(s, 9_000_000_000i64, "seconds")?;
    if v < 2 {
        return Err("must be at least 2 seconds (etcd's shortest lease with default timing)".to_string());
    }
    Ok(v)
}

/// Parses a rate: a positive number per second.
pub(crate) fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number per second"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err("must be a positive number per second".to_string());
    }
    Ok(v)
}

pub(crate) fn main() -> ExitCode {
    let args = Args::parse();
    exit_code(TOOL, run(&args))
}

pub(crate) fn run(args: &Args) -> Result<(), Failure> {
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

pub(crate) async fn run_workload(args: &Args) -> Result<Report, Failure> {
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
        Workload::K8s(a) => k8s(g, &bench, a).await,
    }
}

/// What every phase of a run uses: the connections, the per-request timeout, and whether
/// progress bars are drawn.
#[derive(Debug)]
pub(crate) struct Bench {
    /// Invariant: not empty.
    pub(crate) channels: Vec<Conn>,
    pub(crate) timeout: Duration,
    pub(crate) shown: bool,
}

impl Bench {
    /// The connection of client (or stream) `c`: clients go round-robin over connections.
    pub(crate) fn channel(&self, c: usize) -> Conn {
        self.channels[c % self.channels.len()].clone()
    }

    /// A requester for client `c`, sending `op`s over its connection.
    pub(crate) fn requester(&self, c: usize, op: &Arc<Op>) -> Requester {
        let channel = self.channel(c);
        Requester {
            // A whole prefix read keys-only can be far larger than tonic's 4 MiB default.
            kv: KvClient::new(channel.clone()).max_decoding_message_size(usize::MAX),
            lease: LeaseClient::new(channel),
            op: Arc::clone(op),
            rng: StdRng::seed_from_u64(0x5eed ^ c as u64),
            timeout: self.timeout,
            page: None,
        }
    }

    /// Runs `clients` requesters of `op` until `run` ends; the merged tally and the time taken.
    pub(crate) async fn drive_op(
        &self,
        label: &str,
        run: &Arc<Run>,
        clients: usize,
        op: Op,
    ) -> Result<(Tally, Duration), Failure> {
        let op = Arc::new(op);
        self.drive(label, run, clients, |c, tally| {
            request_loop(self.requester(c, &op), Arc::clone(run), tally)
        })
        .await
    }
}

/// Opens `--conns` connections, round-robin over `--endpoints`.
pub(crate) async fn connect(g: &Global) -> Result<Vec<Conn>, Failure> {
    let mut channels = Vec::with_capacity(g.conns);
    for i in 0..g.conns {
        channels.push(connect_to(g, i).await?);
    }
    Ok(channels)
}

/// Opens a connection to endpoint `i` (wrapping around the list).
pub(crate) async fn connect_to(g: &Global, i: usize) -> Result<Conn, Failure> {
    connect_url(g, endpoint_url(g, i)?).await
}

/// The URL of endpoint `i` (wrapping around the list).
pub(crate) fn endpoint_url(g: &Global, i: usize) -> Result<String, Failure> {
    let endpoint = g
        .endpoints
        .get(i % g.endpoints.len().max(1))
        .ok_or_else(|| Failure("no --endpoints given".to_string()))?;
    Ok(if endpoint.contains("://") {
        endpoint.clone()
    } else {
        format!("http://{endpoint}")
    })
}

/// Opens a connection to `url` (with TLS if it is https, and the token if there is one).
pub(crate) async fn connect_url(g: &Global, url: String) -> Result<Conn, Failure> {
    dial(dialer(g).await?, url).await
}

/// Opens a connection to `url` with `dialer`'s TLS and token.
pub(crate) async fn dial(dialer: &'static Dialer, url: String) -> Result<Conn, Failure> {
    let channel = Endpoint::from_shared(url.clone())
        .context(|| format!("bad endpoint `{url}`"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .connect_with_connector(dialer.connector.clone())
        .await
        .map_err(|e| Failure(format!("connect to {url}: {}", with_sources(&e))))?;
    Ok(InterceptedService::new(channel, dialer.token.clone()))
}

/// `e` and its sources, `: `-separated (tonic's transport errors say little by themselves).
pub(crate) fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}
