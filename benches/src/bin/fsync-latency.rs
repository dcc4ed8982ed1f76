//! `fsync-latency`: etcd's disk check ("is fdatasync fast enough to carry a WAL?") run against
//! the bare disk and against cairn's WAL in the same run, so the WAL's overhead and its
//! group-commit gain come out as ratios to a baseline measured on the same disk, minutes apart.
//!
//! Phase `raw`: pwrite `--record-size` bytes at the next offset of a preallocated file, then
//! fdatasync, one at a time. This is the floor for one durable append. Phase `wal N`: N threads
//! each append one record durably and wait for it, in a loop. Group commit should let the N
//! threads share each fdatasync, so records/s grows with N while fsyncs/s stays near the raw
//! rate.
//!
//! ```text
//! cargo run --release -p cairn-benches --bin fsync-latency -- --dir /var/lib/cairn --seconds 2
//! ```
//!
//! Every file lives in a new `fsync-latency-<pid>` directory under `--dir`. The tool removes it
//! at the end, also after an error. Killed mid-run, it leaves that directory behind and nothing
//! else.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_benches::{
    dedup_in_order, exit_code, histogram, merge, micros, parse_count, parse_seconds, payload, per_sec, preallocate,
    ratio, ratio_json, rounded, sleep_unless_stopped, times_cell, us_cell, Context, Failure, Percentiles, WorkDir,
    WorkerResult, MEASURING, STOPPED, WARMING,
};
use cairn_wal::{Config, Durability, Record, Replay, Ticket, Wal};
use clap::Parser;
use hdrhistogram::Histogram;
use serde_json::{Map, Value};

/// Names the work directory and prefixes every message.
const TOOL: &str = "fsync-latency";

/// Measures fdatasync latency in a directory, raw and through cairn's WAL.
#[derive(Debug, Parser)]
#[command(name = "fsync-latency", version)]
struct Args {
    /// An existing directory on the disk to measure (the WAL's future home).
    #[arg(long)]
    dir: PathBuf,
    /// How long each phase is measured, in seconds (fractions allowed, e.g. 0.5).
    #[arg(long, default_value_t = 5.0, value_parser = parse_seconds, allow_negative_numbers = true)]
    seconds: f64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Numbers of concurrent appender threads to measure the WAL with, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256", value_parser = parse_appenders)]
    appenders: Vec<usize>,
    /// Payload bytes per record (and per raw write).
    #[arg(long, default_value_t = 256, value_parser = parse_record_size)]
    record_size: usize,
    /// What an appender is: an OS thread blocking on `Ticket::wait`, a task on a 2-thread
    /// tokio runtime awaiting the ticket (as the server's request handlers do), or an OS thread
    /// appending with `Wal::append_here`, which writes and syncs on the appender's own thread
    /// when the WAL's is idle (as a sole member's node thread does; its records are state
    /// records, framed as entries are, so that appenders need no shared index).
    #[arg(long, value_enum, default_value_t = AppenderKind::Threads)]
    appender_kind: AppenderKind,
}

impl Args {
    /// How long each phase is measured.
    fn window(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }

    /// The unmeasured warm-up before it.
    fn warmup(&self) -> Duration {
        WARMUP.min(self.window())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AppenderKind {
    Threads,
    Tasks,
    Here,
}

/// Most appender threads accepted; the WAL's queue holds 4096 requests by default.
const MAX_APPENDERS: usize = 4096;
/// Largest accepted record: 16 MiB, well inside the WAL's default 64 MiB limit.
const MAX_RECORD_SIZE: usize = 16 << 20;
/// Unmeasured warm-up before each phase (capped at the phase length).
const WARMUP: Duration = Duration::from_millis(300);
/// The raw file grows by this much at a time, preallocated like a WAL segment of default size.
const RAW_CHUNK: u64 = 64 << 20;
/// Latencies are recorded up to an hour (as the WAL's own histograms).
const LATENCY_CEILING: Duration = Duration::from_secs(3600);

fn parse_appenders(s: &str) -> Result<usize, String> {
    parse_count(s, MAX_APPENDERS, "threads")
}

fn parse_record_size(s: &str) -> Result<usize, String> {
    parse_count(s, MAX_RECORD_SIZE, "bytes")
}

fn main() -> ExitCode {
    let args = Args::parse();
    exit_code(TOOL, run(&args))
}

fn run(args: &Args) -> Result<(), Failure> {
    let mut appenders = args.appenders.clone();
    dedup_in_order(&mut appenders);

    let work = WorkDir::create(&args.dir, TOOL)?;
    eprintln!(
        "fsync-latency: measuring in {} ({} s per phase, {}-byte records)",
        work.path().display(),
        args.seconds,
        args.record_size
    );
    eprintln!("  raw pwrite + fdatasync ...");
    let raw = measure_raw(work.path(), args)?;
    let mut wal = Vec::with_capacity(appenders.len());
    for &n in &appenders {
        eprintln!("  wal, {n} appender(s) ...");
        wal.push(measure_wal(work.path(), n, args)?);
    }
    work.remove()?;

    let report = Report { raw, wal };
    if args.json {
        let json = serde_json::to_string_pretty(&report.to_json(args)).context(|| "encode JSON".to_string())?;
        println!("{json}");
    } else {
        report.print_table(args);
    }
    Ok(())
}

/// The raw phase's outcome.
#[derive(Debug)]
struct RawResult {
    latency: Percentiles,
    syncs: u64,
    elapsed: Duration,
}

impl RawResult {
    fn syncs_per_sec(&self) -> f64 {
        per_sec(self.syncs, self.elapsed)
    }
}

/// An append-only file written and fdatasynced one small record at a time.
#[derive(Debug)]
struct RawLog {
    file: File,
    path: PathBuf,
    buf: Vec<u8>,
    offset: u64,
    allocated: u64,
}

impl RawLog {
    /// Writes the next record and fdatasyncs; returns how long those two calls took (growing
    /// the file, when due, is not timed: the WAL does it ahead of need on another thread).
    fn append(&mut self) -> Result<Duration, Failure> {
        let len = self.buf.len() as u64;
        if self.offset + len > self.allocated {
            preallocate(&self.file, self.allocated, RAW_CHUNK)
                .context(|| format!("preallocate {}", self.path.display()))?;
            self.allocated += RAW_CHUNK;
        }
        let started = Instant::now();
        self.file
            .write_all_at(&self.buf, self.offset)
            .context(|| format!("write {}", self.path.display()))?;
        self.file
            .sync_data()
            .context(|| format!("fdatasync {}", self.path.display()))?;
        let took = started.elapsed();
        self.offset += len;
        Ok(took)
    }
}

/// Measures raw writes of `args`'s record size, each fdatasynced, for as long as it says.
fn measure_raw(dir: &Path, args: &Args) -> Result<RawResult, Failure> {
    let (record_size, warmup, window) = (args.record_size, args.warmup(), args.window());
    let path = dir.join("raw.log");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .context(|| format!("create {}", path.display()))?;
    let mut log = RawLog {
        file,
        path,
        buf: payload(record_size),
        offset: 0,
        allocated: 0,
    };
    let mut latency = histogram(LATENCY_CEILING)?;

    let started = Instant::now();
    while started.elapsed() < warmup {
        log.append()?;
    }
    let mut syncs = 0u64;
    let started = Instant::now();
    while started.elapsed() < window {
        let took = log.append()?;
        latency.saturating_record(micros(took));
        syncs += 1;
    }
    let elapsed = started.elapsed();

    let RawLog { file, path, .. } = log;
    drop(file);
    fs::remove_file(&path).context(|| format!("remove {}", path.display()))?;
    Ok(RawResult {
        latency: Percentiles::of(&latency),
        syncs,
        elapsed,
    })
}

/// One WAL phase's outcome.
#[derive(Debug)]
struct WalResult {
    appenders: usize,
    latency: Percentiles,
    /// Appends completed inside the measured window.
    records: u64,
    /// fdatasyncs the WAL made during the window.
    fsyncs: u64,
    /// The WAL's own timing of those fdatasyncs (its stats), to split append latency into the
    /// fsync and everything around it.
    fsync_latency: Percentiles,
    elapsed: Duration,
}

impl WalResult {
    fn records_per_sec(&self) -> f64 {
        per_sec(self.records, self.elapsed)
    }

    fn fsyncs_per_sec(&self) -> f64 {
        per_sec(self.fsyncs, self.elapsed)
    }

    fn records_per_fsync(&self) -> Option<f64> {
        ratio(self.records as f64, self.fsyncs as f64)
    }
}

/// One appender's latency histogram and appends completed inside the window.
struct Tally {
    latency: Histogram<u64>,
    completed: u64,
}

impl Tally {
    fn new() -> Result<Tally, Failure> {
        Ok(Tally {
            latency: histogram(LATENCY_CEILING)?,
            completed: 0,
        })
    }

    /// Counts one append that took `took`; a failed append stops every appender.
    fn count(
        &mut self,
        wal: &Wal,
        phase: &AtomicU8,
        took: Duration,
        outcome: cairn_wal::Result<()>,
    ) -> Result<(), Failure> {
        if let Err(e) = outcome {
            phase.store(STOPPED, Ordering::SeqCst);
            return Err(Failure(format!(
                "durable append to the wal in {}: {e}",
                wal.dir().display()
            )));
        }
        if phase.load(Ordering::SeqCst) == MEASURING {
            self.latency.saturating_record(micros(took));
            self.completed += 1;
        }
        Ok(())
    }

    fn finish(self) -> WorkerResult {
        Ok((self.latency, self.completed))
    }
}

/// An appender thread: appends one record durably and blocks on its ticket, until the phase is
/// `STOPPED`.
fn appender(wal: &Wal, phase: &AtomicU8, payload: &Bytes) -> WorkerResult {
    let mut tally = Tally::new()?;
    while phase.load(Ordering::SeqCst) != STOPPED {
        let started = Instant::now();
        let appended = wal
            .append_next(vec![payload.clone()], Durability::Durable)
            .and_then(Ticket::wait);
        tally.count(wal, phase, started.elapsed(), appended.map(drop))?;
    }
    tally.finish()
}

/// An appender thread appending on its own thread when the WAL's is idle.
fn appender_here(wal: &Wal, phase: &AtomicU8, payload: &Bytes) -> WorkerResult {
    let mut tally = Tally::new()?;
    while phase.load(Ordering::SeqCst) != STOPPED {
        let started = Instant::now();
        let appended = wal
            .append_here(vec![Record::State(payload.clone())], Durability::Durable)
            .and_then(Ticket::wait);
        tally.count(wal, phase, started.elapsed(), appended.map(drop))?;
    }
    tally.finish()
}

/// An appender task: the same, awaiting the ticket instead of blocking.
async fn appender_task(wal: Arc<Wal>, phase: Arc<AtomicU8>, payload: Bytes) -> WorkerResult {
    let mut tally = Tally::new()?;
    while phase.load(Ordering::SeqCst) != STOPPED {
        let started = Instant::now();
        let appended = match wal.append_next(vec![payload.clone()], Durability::Durable) {
            Ok(ticket) => ticket.await.map(drop),
            Err(e) => Err(e),
        };
        tally.count(&wal, &phase, started.elapsed(), appended)?;
    }
    tally.finish()
}

/// The running appenders of a phase.
enum Appenders {
    Threads(Vec<JoinHandle<WorkerResult>>),
    Tasks(tokio::runtime::Runtime, Vec<tokio::task::JoinHandle<WorkerResult>>),
}

impl Appenders {
    fn join(self) -> Vec<WorkerResult> {
        let panicked = || Err(Failure("an appender panicked".to_string()));
        match self {
            Appenders::Threads(threads) => threads
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|_| panicked()))
                .collect(),
            Appenders::Tasks(runtime, tasks) => runtime.block_on(async {
                let mut results = Vec::with_capacity(tasks.len());
                for t in tasks {
                    results.push(t.await.unwrap_or_else(|_| panicked()));
                }
                results
            }),
        }
    }
}

/// Measures the WAL with `appenders` appenders, of the kind and record size `args` gives, for
/// as long as it says.
fn measure_wal(dir: &Path, appenders: usize, args: &Args) -> Result<WalResult, Failure> {
    let (record_size, kind) = (args.record_size, args.appender_kind);
    let (warmup, window) = (args.warmup(), args.window());
    let wal_dir = dir.join(format!("wal-{appenders}"));
    fs::create_dir(&wal_dir).context(|| format!("create {}", wal_dir.display()))?;
    let wal = Wal::open(&wal_dir, Config::default())
        .and_then(Replay::finish)
        .context(|| format!("open a wal in {}", wal_dir.display()))?;
    let wal = Arc::new(wal);
    let phase = Arc::new(AtomicU8::new(WARMING));
    let payload = Bytes::from(payload(record_size));

    // Appenders start right away; the warm-up is timed from the last one's start.
    let mut spawn_error = None;
    let running = match kind {
        AppenderKind::Threads | AppenderKind::Here => {
            let work = if kind == AppenderKind::Here {
                appender_here
            } else {
                appender
            };
            let mut threads: Vec<JoinHandle<WorkerResult>> = Vec::with_capacity(appenders);
            for i in 0..appenders {
                let (wal, their_phase, payload) = (wal.clone(), phase.clone(), payload.clone());
                let spawned = thread::Builder::new()
                    .name(format!("appender-{i}"))
                    .stack_size(256 << 10)
                    .spawn(move || work(&wal, &their_phase, &payload));
                match spawned {
                    Ok(t) => threads.push(t),
                    Err(e) => {
                        phase.store(STOPPED, Ordering::SeqCst);
                        spawn_error = Some(Failure(format!("spawn appender thread {i} of {appenders}: {e}")));
                        break;
                    }
                }
            }
            Appenders::Threads(threads)
        }
        AppenderKind::Tasks => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .build()
                .context(|| "start a tokio runtime".to_string())?;
            let tasks = (0..appenders)
                .map(|_| runtime.spawn(appender_task(wal.clone(), phase.clone(), payload.clone())))
                .collect();
            Appenders::Tasks(runtime, tasks)
        }
    };

    let mut window_fsyncs = 0;
    let mut fsync_latency = cairn_wal::Distribution::default();
    let mut elapsed = Duration::ZERO;
    if spawn_error.is_none() {
        sleep_unless_stopped(&phase, warmup);
        let before = wal.stats();
        if phase
            .compare_exchange(WARMING, MEASURING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            let started = Instant::now();
            sleep_unless_stopped(&phase, window);
            phase.store(STOPPED, Ordering::SeqCst);
            elapsed = started.elapsed();
            let after = wal.stats();
            window_fsyncs = after.fsyncs.saturating_sub(before.fsyncs);
            // Only the window's fsyncs.
            fsync_latency = after.fsync_latency_us.since(&before.fsync_latency_us);
        }
    }

    // A failure to spawn is reported before any appender's.
    let outcomes = spawn_error.into_iter().map(Err).chain(running.join());
    let (latency, records) = merge(outcomes, LATENCY_CEILING)?;

    // Every thread is joined, so this is the last handle: close syncs and stops the writer.
    if let Ok(wal) = Arc::try_unwrap(wal) {
        wal.close()
            .context(|| format!("close the wal in {}", wal_dir.display()))?;
    }
    fs::remove_dir_all(&wal_dir).context(|| format!("remove {}", wal_dir.display()))?;
    Ok(WalResult {
        appenders,
        latency: Percentiles::of(&latency),
        records,
        fsyncs: window_fsyncs,
        fsync_latency: Percentiles::of_distribution(&fsync_latency),
        elapsed,
    })
}

/// Everything measured, ready to print.
#[derive(Debug)]
struct Report {
    raw: RawResult,
    wal: Vec<WalResult>,
}

impl Report {
    fn wal(&self, appenders: usize) -> Option<&WalResult> {
        self.wal.iter().find(|w| w.appenders == appenders)
    }

    /// WAL p50 with one appender over raw p50: the cost of the log's machinery per append.
    fn wal_1_p50_over_raw_p50(&self) -> Option<f64> {
        let wal = self.wal(1)?.latency.p50?;
        ratio(wal as f64, self.raw.latency.p50? as f64)
    }

    /// Records/s with 64 appenders over 1: what group commit buys.
    fn wal_64_records_over_wal_1_records(&self) -> Option<f64> {
        ratio(self.wal(64)?.records_per_sec(), self.wal(1)?.records_per_sec())
    }

    /// The WAL's fsyncs/s with 64 appenders over raw syncs/s: how close the writer keeps the
    /// disk to its fdatasync rate.
    fn wal_64_fsyncs_over_raw_syncs(&self) -> Option<f64> {
        ratio(self.wal(64)?.fsyncs_per_sec(), self.raw.syncs_per_sec())
    }

    fn to_json(&self, args: &Args) -> Value {
        let mut m = Map::new();
        m.insert("seconds".into(), Value::from(args.seconds));
        m.insert("record_size".into(), Value::from(args.record_size));
        let kind = match args.appender_kind {
            AppenderKind::Threads => "threads",
            AppenderKind::Tasks => "tasks",
            AppenderKind::Here => "here",
        };
        m.insert("appender_kind".into(), Value::from(kind));
        m.insert("raw_p50_us".into(), Value::from(self.raw.latency.p50));
        m.insert("raw_p99_us".into(), Value::from(self.raw.latency.p99));
        m.insert("raw_p999_us".into(), Value::from(self.raw.latency.p999));
        m.insert("raw_syncs".into(), Value::from(self.raw.syncs));
        m.insert(
            "raw_syncs_per_sec".into(),
            Value::from(rounded(self.raw.syncs_per_sec(), 2)),
        );
        for w in &self.wal {
            let n = w.appenders;
            m.insert(format!("wal_{n}_p50_us"), Value::from(w.latency.p50));
            m.insert(format!("wal_{n}_p99_us"), Value::from(w.latency.p99));
            m.insert(format!("wal_{n}_p999_us"), Value::from(w.latency.p999));
            m.insert(format!("wal_{n}_records"), Value::from(w.records));
            m.insert(format!("wal_{n}_fsyncs"), Value::from(w.fsyncs));
            m.insert(
                format!("wal_{n}_records_per_sec"),
                Value::from(rounded(w.records_per_sec(), 2)),
            );
            m.insert(
                format!("wal_{n}_fsyncs_per_sec"),
                Value::from(rounded(w.fsyncs_per_sec(), 2)),
            );
            m.insert(format!("wal_{n}_records_per_fsync"), ratio_json(w.records_per_fsync()));
            m.insert(format!("wal_{n}_fsync_p50_us"), Value::from(w.fsync_latency.p50));
            m.insert(format!("wal_{n}_fsync_p99_us"), Value::from(w.fsync_latency.p99));
        }
        m.insert(
            "wal_1_p50_over_raw_p50".into(),
            ratio_json(self.wal_1_p50_over_raw_p50()),
        );
        m.insert(
            "wal_64_records_over_wal_1_records".into(),
            ratio_json(self.wal_64_records_over_wal_1_records()),
        );
        m.insert(
            "wal_64_fsyncs_over_raw_syncs".into(),
            ratio_json(self.wal_64_fsyncs_over_raw_syncs()),
        );
        Value::Object(m)
    }

    fn print_table(&self, args: &Args) {
        println!(
            "fdatasync latency, {} s per phase, {}-byte records, in {}; wal appenders are {:?}",
            args.seconds,
            args.record_size,
            args.dir.display(),
            args.appender_kind
        );
        println!();
        println!(
            "{:<22} {:>8} {:>8} {:>9} {:>10} {:>9} {:>9} {:>10} {:>10}",
            "phase", "p50 us", "p99 us", "p99.9 us", "records/s", "fsyncs/s", "rec/fsync", "fsync p50", "fsync p99"
        );
        let raw = &self.raw;
        println!(
            "{:<22} {:>8} {:>8} {:>9} {:>10.0} {:>9.0} {:>9.1} {:>10} {:>10}",
            "raw pwrite+fdatasync",
            us_cell(raw.latency.p50),
            us_cell(raw.latency.p99),
            us_cell(raw.latency.p999),
            raw.syncs_per_sec(),
            raw.syncs_per_sec(),
            1.0,
            "-",
            "-"
        );
        for w in &self.wal {
            let label = match w.appenders {
                1 => "wal, 1 appender".to_string(),
                n => format!("wal, {n} appenders"),
            };
            println!(
                "{:<22} {:>8} {:>8} {:>9} {:>10.0} {:>9.0} {:>9} {:>10} {:>10}",
                label,
                us_cell(w.latency.p50),
                us_cell(w.latency.p99),
                us_cell(w.latency.p999),
                w.records_per_sec(),
                w.fsyncs_per_sec(),
                w.records_per_fsync()
                    .map_or_else(|| "-".to_string(), |v| format!("{v:.1}")),
                us_cell(w.fsync_latency.p50),
                us_cell(w.fsync_latency.p99),
            );
        }
        println!("(fsync p50/p99: the wal's own timing of its fdatasync calls, from its stats)");
        println!();
        println!(
            "{:<44} {:>8}",
            "wal p50 (1 appender) / raw p50",
            times_cell(self.wal_1_p50_over_raw_p50())
        );
        println!(
            "{:<44} {:>8}",
            "wal records/s, 64 appenders / 1 appender",
            times_cell(self.wal_64_records_over_wal_1_records())
        );
        println!(
            "{:<44} {:>8}",
            "wal fsyncs/s (64 appenders) / raw syncs/s",
            times_cell(self.wal_64_fsyncs_over_raw_syncs())
        );
    }
}
