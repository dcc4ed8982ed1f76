//! Loads N keys into a fresh engine and reports memory, restart cost and maintenance under
//! load (issue #3):
//!
//! ```sh
//! cargo run --release -p cairn-benches --bin engine-load -- --dir /tmp/load --keys 1000000 --maintenance
//! ```
//!
//! Keys are 8 bytes, values 256 bytes, written by `--writers` threads keeping writes in
//! flight (`write_async`), so the WAL's group commit batches them. It prints the load rate, the
//! process's resident memory after loading, the data and WAL sizes, and the time `close`
//! takes. Reopening runs in a fresh process (this binary with `--reopen`), so its resident
//! memory is what a restarted member uses, not this process's leftover heap.
//!
//! With `--maintenance`, it also measures what compaction and defragmentation cost writers:
//! probe threads put one key at a time (each waits for its write to be durable) and record
//! latencies. First for `--probe-seconds` with nothing else running (the baseline); then while
//! every key is overwritten once more is compacted away (N revisions) until the sweep is
//! done; then while the engine defragments. It reports each phase's p50 and p99, and the p99
//! as a ratio of the baseline's, measured in the same run.
//!
//! With `--expiry-leases L --keys-per-lease K`, it then grants L leases, attaches K keys to
//! each, moves the engine's (manual) clock past their TTL, and revokes them all in rounds, as
//! the lease checker does, while the probes write: how long mass expiry takes and what it
//! costs other writes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use std::sync::Arc;

use cairn_engine::{Config, Engine, ManualClock, PutRequest, RequestOp, TxnRequest};
use clap::Parser;
use hdrhistogram::Histogram;

#[derive(Debug, Parser)]
#[command(name = "engine-load")]
struct Args {
    /// A directory to create the engine in (must not exist yet).
    #[arg(long)]
    dir: PathBuf,
    /// Keys to load.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Writer threads.
    #[arg(long, default_value_t = 4)]
    writers: u64,
    /// Writes each writer keeps in flight.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// Also measure write latency during compaction and defragmentation.
    #[arg(long)]
    maintenance: bool,
    /// Seconds of the baseline probe.
    #[arg(long, default_value_t = 5)]
    probe_seconds: u64,
    /// Probe threads.
    #[arg(long, default_value_t = 2)]
    probes: u64,
    /// Also measure mass lease expiry: this many leases, expiring at once...
    #[arg(long, default_value_t = 0)]
    expiry_leases: u64,
    /// ...with this many keys each.
    #[arg(long, default_value_t = 100)]
    keys_per_lease: u64,
    /// Internal: only reopen `--dir` and print the time and resident memory.
    #[arg(long, hide = true)]
    reopen: bool,
}

/// A line of /proc/self/status, in MiB.
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Resident memory: the total, then its heap (anonymous) and mapped-file parts.
fn rss() -> String {
    format!(
        "{:.0} MiB (heap {:.0}, mapped files {:.0})",
        status_mib("VmRSS"),
        status_mib("RssAnon"),
        status_mib("RssFile") + status_mib("RssShmem")
    )
}

fn dir_mib(dir: &Path) -> f64 {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total as f64 / (1 << 20) as f64
}

fn config(clock: &ManualClock) -> Config {
    Config {
        lease_check_interval: None,
        clock: Arc::new(clock.clone()),
        ..Config::default()
    }
}

fn key(i: u64) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

/// Puts every key once, `writers` threads with `in_flight` writes each.
fn load(engine: &Engine, args: &Args, value: &Bytes) -> Result<Duration, String> {
    let started = Instant::now();
    std::thread::scope(|s| -> Result<(), String> {
        let handles: Vec<_> = (0..args.writers)
            .map(|w| {
                s.spawn(move || -> Result<(), String> {
                    let mut pending = std::collections::VecDeque::new();
                    for i in (w..args.keys).step_by(args.writers as usize) {
                        let req = PutRequest {
                            key: key(i),
                            value: value.clone(),
                            ..PutRequest::default()
                        };
                        pending.push_back(engine.write_async(req).map_err(|e| format!("put: {e}"))?);
                        if pending.len() >= args.in_flight {
                            if let Some(p) = pending.pop_front() {
                                p.wait().map_err(|e| format!("put: {e}"))?;
                            }
                        }
                    }
                    for p in pending {
                        p.wait().map_err(|e| format!("put: {e}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "a writer panicked".to_string())??;
        }
        Ok(())
    })?;
    Ok(started.elapsed())
}

/// Runs `work` while `probes` threads put keys one at a time; returns its result, how long
/// it took and the probes' latencies in microseconds.
fn probed<T>(
    engine: &Engine,
    args: &Args,
    work: impl FnOnce() -> Result<T, String>,
) -> Result<(T, Duration, Histogram<u64>), String> {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let probes: Vec<_> = (0..args.probes)
            .map(|p| {
                let done = &done;
                s.spawn(move || -> Result<Histogram<u64>, String> {
                    let mut h = Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
                    let mut i = p;
                    while !done.load(Ordering::Relaxed) {
                        let req = PutRequest {
                            key: key(i % args.keys.max(1)),
                            value: Bytes::from_static(b"probe"),
                            ..PutRequest::default()
                        };
                        let t = Instant::now();
                        engine.write(req).map_err(|e| format!("probe put: {e}"))?;
                        h.saturating_record(t.elapsed().as_micros() as u64);
                        i += args.probes * 7919;
                    }
                    Ok(h)
                })
            })
            .collect();
        let started = Instant::now();
        let result = work();
        let took = started.elapsed();
        done.store(true, Ordering::Relaxed);
        let mut all = Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
        for p in probes {
            let h = p.join().map_err(|_| "a probe panicked".to_string())??;
            all.add(&h).map_err(|e| e.to_string())?;
        }
        Ok((result?, took, all))
    })
}

fn latency_line(name: &str, took: Duration, h: &Histogram<u64>, baseline_p99: Option<u64>) {
    let ratio = baseline_p99.map_or(String::new(), |b| {
        format!(
            ", p99/baseline {:.2}x",
            h.value_at_quantile(0.99) as f64 / b.max(1) as f64
        )
    });
    println!(
        "{name:<24}{:.2} s, {} writes, p50 {} us, p99 {} us{ratio}",
        took.as_secs_f64(),
        h.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
    );
}

/// The probes' p99 with nothing else running.
fn baseline(engine: &Engine, args: &Args) -> Result<u64, String> {
    let window = Duration::from_secs(args.probe_seconds);
    let ((), took, base) = probed(engine, args, || {
        std::thread::sleep(window);
        Ok(())
    })?;
    latency_line("baseline", took, &base, None);
    Ok(base.value_at_quantile(0.99))
}

fn maintenance(engine: &Engine, args: &Args, value: &Bytes, base_p99: u64) -> Result<(), String> {
    let overwrite = load(engine, args, value)?;
    println!("overwrite               {:.1} s", overwrite.as_secs_f64());
    let ((), took, h) = probed(engine, args, || {
        engine
            .compact(engine.current_revision())
            .map_err(|e| format!("compact: {e}"))?;
        engine
            .maintenance()
            .wait_compacted()
            .map_err(|e| format!("compact: {e}"))
    })?;
    latency_line("compaction", took, &h, Some(base_p99));

    let (sizes, took, h) = probed(engine, args, || {
        engine
            .maintenance()
            .defragment()
            .map_err(|e| format!("defragment: {e}"))
    })?;
    latency_line("defragment", took, &h, Some(base_p99));
    println!(
        "data files              {:.0} MiB before defragment, {:.0} MiB after",
        sizes.before as f64 / (1 << 20) as f64,
        sizes.after as f64 / (1 << 20) as f64
    );
    Ok(())
}

/// Grants the leases, attaches their keys (a txn of 100 puts at a time), expires them all at
/// once and revokes them in rounds while the probes write.
fn mass_expiry(engine: &Engine, clock: &ManualClock, args: &Args, base_p99: u64) -> Result<(), String> {
    let started = Instant::now();
    let value = Bytes::from(vec![0x4c; 64]);
    for l in 0..args.expiry_leases {
        let lease = engine
            .leases()
            .grant(0, 60)
            .map_err(|e| format!("grant: {e}"))?
            .response
            .id;
        let mut k = 0;
        while k < args.keys_per_lease {
            let ops = (k..(k + 100).min(args.keys_per_lease))
                .map(|k| {
                    RequestOp::Put(PutRequest {
                        key: format!("lease/{l}/{k}").into_bytes(),
                        value: value.clone(),
                        lease,
                        ..PutRequest::default()
                    })
                })
                .collect();
            engine
                .txn(TxnRequest {
                    success: ops,
                    ..TxnRequest::default()
                })
                .map_err(|e| format!("leased puts: {e}"))?;
            k += 100;
        }
    }
    println!(
        "leases                  {} with {} keys each, attached in {:.1} s",
        args.expiry_leases,
        args.keys_per_lease,
        started.elapsed().as_secs_f64()
    );
    clock.advance(Duration::from_secs(61));
    let (revoked, took, h) = probed(engine, args, || {
        let mut revoked = 0;
        loop {
            match engine.leases().expire_now() {
                0 => return Ok(revoked),
                n => revoked += n,
            }
        }
    })?;
    latency_line("mass expiry", took, &h, Some(base_p99));
    if revoked as u64 != args.expiry_leases || !engine.leases().list().is_empty() {
        return Err(format!("revoked {revoked} of {} leases", args.expiry_leases));
    }
    Ok(())
}

fn reopen(dir: &Path) -> Result<(), String> {
    let opening = Instant::now();
    let engine = Engine::open(dir, config(&ManualClock::new())).map_err(|e| format!("reopen: {e}"))?;
    let took = opening.elapsed();
    println!(
        "reopen                  {:.2} s (revision {}, {} keys), RSS {}",
        took.as_secs_f64(),
        engine.current_revision(),
        engine.status().keys,
        rss()
    );
    engine.close().map_err(|e| format!("close: {e}"))
}

fn run(args: &Args) -> Result<(), String> {
    if args.reopen {
        return reopen(&args.dir);
    }
    if args.dir.exists() {
        return Err(format!("{} exists; give a new directory", args.dir.display()));
    }
    let clock = ManualClock::new();
    let engine = Engine::open(&args.dir, config(&clock)).map_err(|e| format!("open: {e}"))?;
    let value = Bytes::from(vec![0x5a; 256]);
    let took = load(&engine, args, &value)?;
    println!("keys                    {}", args.keys);
    println!(
        "load                    {:.1} s ({:.0} puts/s)",
        took.as_secs_f64(),
        args.keys as f64 / took.as_secs_f64()
    );
    println!("RSS after loading       {}", rss());
    println!(
        "on disk                 data {:.0} MiB, WAL {:.0} MiB",
        dir_mib(&args.dir.join("data")),
        dir_mib(&args.dir.join("wal"))
    );
    if args.maintenance || args.expiry_leases > 0 {
        let base_p99 = baseline(&engine, args)?;
        if args.maintenance {
            maintenance(&engine, args, &value, base_p99)?;
        }
        if args.expiry_leases > 0 {
            mass_expiry(&engine, &clock, args, base_p99)?;
        }
    }
    let closing = Instant::now();
    engine.close().map_err(|e| format!("close: {e}"))?;
    println!("close (checkpoint)      {:.2} s", closing.elapsed().as_secs_f64());
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = std::process::Command::new(me)
        .arg("--dir")
        .arg(&args.dir)
        .arg("--reopen")
        .status()
        .map_err(|e| format!("run the reopen: {e}"))?;
    if !status.success() {
        return Err(format!("the reopen failed: {status}"));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("engine-load: {e}");
            ExitCode::FAILURE
        }
    }
}
