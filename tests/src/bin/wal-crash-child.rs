//! `wal-crash-child <dir> <threads> [--validate]`: the process `tests/wal_crash.rs` kills with
//! SIGKILL while it appends.
//!
//! It opens the log in `<dir>` with [`crash_config`] and replays it (with `--validate`, checking
//! every record with [`check_crash_log`], as the parent does), which also truncates a torn tail
//! left by the previous kill. It prints `ready <last index, or 0>`, then runs `<threads>`
//! appender threads until it is killed. Each appender takes the next index under a mutex and,
//! still holding it, queues the entry `crash_payload(index)` durably: queueing is quick, and
//! doing it under the lock keeps queue order equal to index order. It waits for the ticket
//! outside the lock, and once the entry is fdatasynced prints `ack <index>`. Every `ack` line
//! is a durability promise the parent checks after the kill.
//!
//! Exit codes (the parent fails on any exit other than its own SIGKILL): 1 for an error of the
//! log or of stdout, 2 for a log that fails `--validate`, 3 for bad arguments.

use std::convert::Infallible;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{mpsc, Arc, Mutex};

use cairn_tests::{check_crash_log, crash_config, crash_payload};
use cairn_wal::{Durability, LogIndex, Record, Wal};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (dir, threads, validate) = match args.as_slice() {
        [dir, threads] => (dir, threads, false),
        [dir, threads, flag] if flag == "--validate" => (dir, threads, true),
        _ => {
            eprintln!("usage: wal-crash-child <dir> <threads> [--validate]");
            return ExitCode::from(3);
        }
    };
    let Ok(threads) = threads.parse::<usize>() else {
        eprintln!("wal-crash-child: bad thread count {threads:?}");
        return ExitCode::from(3);
    };
    let Err((code, message)) = run(PathBuf::from(dir), threads.max(1), validate);
    eprintln!("wal-crash-child: {message}");
    ExitCode::from(code)
}

/// Runs until killed; returns only on a failure, with the exit code and message.
fn run(dir: PathBuf, threads: usize, validate: bool) -> Result<Infallible, (u8, String)> {
    let mut replay = Wal::open(&dir, crash_config()).map_err(|e| (1, format!("open: {e}")))?;
    let last = if validate {
        check_crash_log(replay.by_ref())
            .map_err(|e| (2, format!("invalid log: {e}")))?
            .last
    } else {
        let mut last = None;
        for record in replay.by_ref() {
            match record.map_err(|e| (1, format!("replay: {e}")))? {
                Record::Entry { index, .. } => last = Some(index.get()),
                Record::Truncate { from } => last = from.get().checked_sub(1),
                Record::State(_) => {}
            }
        }
        last
    };
    let wal = Arc::new(replay.finish().map_err(|e| (1, format!("finish: {e}")))?);
    print_line(&format!("ready {}", last.unwrap_or(0))).map_err(|e| (1, format!("stdout: {e}")))?;

    let next = Arc::new(Mutex::new(last.map_or(1, |l| l + 1)));
    let (failed, first_failure) = mpsc::channel();
    for _ in 0..threads {
        let (wal, next, failed) = (wal.clone(), next.clone(), failed.clone());
        std::thread::spawn(move || {
            let Err(message) = append_forever(&wal, &next);
            let _ = failed.send(message);
        });
    }
    // Appenders stop only on an error; the first one ends the process.
    let message = first_failure
        .recv()
        .unwrap_or_else(|_| "every appender stopped".to_string());
    Err((1, message))
}

fn append_forever(wal: &Wal, next: &Mutex<u64>) -> Result<Infallible, String> {
    loop {
        let (index, ticket) = {
            let mut next = next.lock().map_err(|_| "index lock poisoned".to_string())?;
            let index = *next;
            let entry = Record::Entry {
                index: LogIndex(index),
                payload: crash_payload(index),
            };
            let ticket = wal
                .append(vec![entry], Durability::Durable)
                .map_err(|e| format!("append {index}: {e}"))?;
            *next += 1;
            (index, ticket)
        };
        ticket.wait().map_err(|e| format!("wait for {index}: {e}"))?;
        print_line(&format!("ack {index}")).map_err(|e| format!("stdout: {e}"))?;
    }
}

/// Writes one whole line to stdout and flushes it, so the parent reads it even if the next
/// instruction is the kill.
fn print_line(line: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}
