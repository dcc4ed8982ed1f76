//! How the load tools measure: what they write, latency histograms and their percentiles, the
//! phases a measured worker (an appender, a proposer) goes through, and rates.
//!
//! A phase runs its workers through an unmeasured warm-up, then a measured window: work counts
//! when it completes while the phase is [`MEASURING`]. A worker that fails sets [`STOPPED`], which
//! ends the phase for every other worker and wakes [`sleep_unless_stopped`] early.
//!
//! Nothing here keeps state on disk, except that [`preallocate`] grows the file it is given.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::tool::{Context, Failure};

/// Record or value contents: not all zeros, so no layer can shortcut them.
pub fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ 0xA5).collect()
}

/// Allocates `offset..offset + len` of `file` the way the WAL preallocates a segment: fallocate
/// (a sized sparse file where unsupported), then fsync, so the size change is not paid for by
/// the first timed fdatasync.
pub fn preallocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), offset, len) {
        Ok(()) => {}
        Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {
            let end = offset.saturating_add(len);
            if file.metadata()?.len() < end {
                file.set_len(end)?;
            }
        }
        Err(e) => return Err(e.into()),
    }
    file.sync_all()
}

/// A latency histogram in microseconds: 1 µs up to `highest`, 3 significant digits.
pub fn histogram(highest: Duration) -> Result<Histogram<u64>, Failure> {
    Histogram::new_with_bounds(1, micros(highest), 3).context(|| "create a histogram".to_string())
}

/// `d` in whole microseconds, at least 1 (a histogram's lowest value).
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Latency percentiles, in microseconds; `None` when nothing completed.
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    pub p50: Option<u64>,
    pub p99: Option<u64>,
    pub p999: Option<u64>,
}

impl Percentiles {
    /// The percentiles of a distribution the WAL or the engine kept.
    pub fn of_distribution(d: &cairn_wal::Distribution) -> Percentiles {
        let at = |q| (!d.is_empty()).then(|| d.quantile(q));
        Percentiles {
            p50: at(0.5),
            p99: at(0.99),
            p999: at(0.999),
        }
    }

    pub fn of(h: &Histogram<u64>) -> Percentiles {
        let at = |q| (!h.is_empty()).then(|| h.value_at_quantile(q));
        Percentiles {
            p50: at(0.5),
            p99: at(0.99),
            p999: at(0.999),
        }
    }
}

/// `count` over `elapsed`, per second; 0 when no time passed.
pub fn per_sec(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        count as f64 / secs
    } else {
        0.0
    }
}

/// The phase workers are in, kept in an `AtomicU8`.
pub const WARMING: u8 = 0;
pub const MEASURING: u8 = 1;
pub const STOPPED: u8 = 2;

/// What one worker measured: its latency histogram and the work it completed inside the window.
pub type WorkerResult = Result<(Histogram<u64>, u64), Failure>;

/// Sleeps for `d`, waking early if a worker failed and stopped the phase.
pub fn sleep_unless_stopped(phase: &AtomicU8, d: Duration) {
    let until = Instant::now() + d;
    while phase.load(Ordering::SeqCst) != STOPPED {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// Adds up the workers' results into one histogram (1 µs up to `highest`) and one count, or
/// returns the first failure among them.
pub fn merge(
    outcomes: impl IntoIterator<Item = WorkerResult>,
    highest: Duration,
) -> Result<(Histogram<u64>, u64), Failure> {
    let mut latency = histogram(highest)?;
    let mut completed = 0u64;
    let mut first_error = None;
    for outcome in outcomes {
        match outcome {
            Ok((h, n)) => {
                latency.add(&h).context(|| "merge latency histograms".to_string())?;
                completed += n;
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok((latency, completed)),
    }
}
