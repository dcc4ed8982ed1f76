//! Loads N keys into a fresh engine and reports memory and restart cost (issue #3):
//!
//! ```sh
//! cargo run --release -p cairn-benches --bin engine-load -- --dir /tmp/load --keys 1000000
//! ```
//!
//! Keys are 8 bytes, values 256 bytes, written by `--writers` threads keeping writes in
//! flight (`put_async`), so the WAL's group commit batches them. It prints the load rate, the
//! process's resident memory after loading, the checkpoint and WAL sizes, the time `close`
//! takes (the final checkpoint) and the time a fresh `open` takes, and the resident memory
//! after reopening in a new process is not measured here (the same process keeps its heap).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use bytes::Bytes;
use cairn_engine::{Config, Engine, PutRequest};
use clap::Parser;

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
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
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

fn run(args: &Args) -> Result<(), String> {
    if args.dir.exists() {
        return Err(format!("{} exists; give a new directory", args.dir.display()));
    }
    let config = || Config {
        lease_check_interval: None,
        checkpoint_entries: 0,
        ..Config::default()
    };
    let engine = Engine::open(&args.dir, config()).map_err(|e| format!("open: {e}"))?;
    let value = Bytes::from(vec![0x5a; 256]);
    let started = Instant::now();
    std::thread::scope(|s| -> Result<(), String> {
        let handles: Vec<_> = (0..args.writers)
            .map(|w| {
                let (engine, value) = (&engine, value.clone());
                s.spawn(move || -> Result<(), String> {
                    let mut pending = std::collections::VecDeque::new();
                    for i in (w..args.keys).step_by(args.writers as usize) {
                        let req = PutRequest {
                            key: i.to_be_bytes().to_vec(),
                            value: value.clone(),
                            ..PutRequest::default()
                        };
                        pending.push_back(engine.put_async(req).map_err(|e| format!("put: {e}"))?);
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
    let load = started.elapsed();
    let rss_loaded = rss_mib();
    let wal = dir_mib(&args.dir.join("wal"));
    let closing = Instant::now();
    engine.close().map_err(|e| format!("close: {e}"))?;
    let close = closing.elapsed();
    let checkpoint = dir_mib(&args.dir) - dir_mib(&args.dir.join("wal"));
    let opening = Instant::now();
    let engine = Engine::open(&args.dir, config()).map_err(|e| format!("reopen: {e}"))?;
    let reopen = opening.elapsed();
    let revision = engine.current_revision();
    drop(engine);
    println!("keys                    {}", args.keys);
    println!(
        "load                    {:.1} s ({:.0} puts/s)",
        load.as_secs_f64(),
        args.keys as f64 / load.as_secs_f64()
    );
    println!("RSS after loading       {rss_loaded:.0} MiB");
    println!("WAL before close        {wal:.0} MiB");
    println!(
        "close (checkpoint)      {:.2} s, checkpoint {checkpoint:.0} MiB",
        close.as_secs_f64()
    );
    println!(
        "reopen                  {:.2} s (revision {revision})",
        reopen.as_secs_f64()
    );
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
