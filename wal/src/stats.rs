//! Counters and histograms the log keeps about itself, for benchmarks and the server's
//! `/metrics`. Updated by the writer thread only; read as a [`StatsSnapshot`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use parking_lot::Mutex;

#[derive(Debug)]
pub(crate) struct Stats {
    bytes: AtomicU64,
    records: AtomicU64,
    writes: AtomicU64,
    fsyncs: AtomicU64,
    /// fdatasync latency in microseconds, and records made durable per fsync.
    histograms: Mutex<Histograms>,
}

#[derive(Debug)]
struct Histograms {
    fsync_us: Histogram<u64>,
    batch_records: Histogram<u64>,
}

/// A point-in-time copy of the log's statistics.
#[derive(Debug, Clone)]
pub struct StatsSnapshot {
    /// Bytes of appended frames written to segments (segment heads not included).
    pub bytes_written: u64,
    /// Records written.
    pub records_written: u64,
    /// `write` calls made by the group-commit writer.
    pub writes: u64,
    /// fdatasync calls on segments.
    pub fsyncs: u64,
    /// fdatasync latency, in microseconds.
    pub fsync_latency_us: Histogram<u64>,
    /// Records made durable by each fsync (the group-commit batch size).
    pub batch_records: Histogram<u64>,
}

/// An empty histogram of latencies in microseconds (or counts) from 1 up to an hour, with 3
/// significant digits: the shape of every histogram the log keeps.
#[allow(clippy::expect_used)] // constant, valid bounds: this cannot fail at run time
pub fn latency_histogram() -> Histogram<u64> {
    // 3 significant digits from 1 up to an hour in microseconds (or as many records).
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant histogram bounds are valid")
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            bytes: AtomicU64::new(0),
            records: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            histograms: Mutex::new(Histograms {
                fsync_us: latency_histogram(),
                batch_records: latency_histogram(),
            }),
        }
    }
}

impl Stats {
    pub(crate) fn on_write(&self, bytes: u64, records: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.records.fetch_add(records, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn on_fsync(&self, took: Duration, records: u64) {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        let mut h = self.histograms.lock();
        h.fsync_us
            .saturating_record(took.as_micros().try_into().unwrap_or(u64::MAX).max(1));
        h.batch_records.saturating_record(records.max(1));
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let h = self.histograms.lock();
        StatsSnapshot {
            bytes_written: self.bytes.load(Ordering::Relaxed),
            records_written: self.records.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            fsyncs: self.fsyncs.load(Ordering::Relaxed),
            fsync_latency_us: h.fsync_us.clone(),
            batch_records: h.batch_records.clone(),
        }
    }
}
