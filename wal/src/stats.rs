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
    fsync_us: Distribution,
    batch_records: Distribution,
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
    pub fsync_latency_us: Distribution,
    /// Records made durable by each fsync (the group-commit batch size).
    pub batch_records: Distribution,
}

/// A distribution of latencies in microseconds (or of counts), from 1 up to an hour, kept to 3
/// significant digits in constant memory (an HDR histogram). Values outside are clamped.
#[derive(Debug, Clone)]
pub struct Distribution(Histogram<u64>);

impl Default for Distribution {
    #[allow(clippy::expect_used)] // constant, valid bounds: this cannot fail at run time
    fn default() -> Distribution {
        Distribution(Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant histogram bounds are valid"))
    }
}

impl Distribution {
    /// Records one value (clamped to the range).
    pub fn record(&mut self, value: u64) {
        self.0.saturating_record(value.max(1));
    }

    /// Records a duration, in microseconds.
    pub fn record_duration(&mut self, took: Duration) {
        self.record(took.as_micros().try_into().unwrap_or(u64::MAX));
    }

    /// How many values were recorded.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value at quantile `q` (0.5 for the median, 0.99 for p99); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        self.0.value_at_quantile(q)
    }

    /// The largest value recorded; 0 when empty.
    pub fn max(&self) -> u64 {
        self.0.max()
    }

    /// The mean of the values recorded; 0 when empty.
    pub fn mean(&self) -> f64 {
        self.0.mean()
    }

    /// How many values recorded are at most `bound` (a cumulative bucket).
    pub fn count_at_most(&self, bound: u64) -> u64 {
        self.0.count_between(0, bound)
    }

    /// The values of both distributions, as if recorded in one.
    pub fn merged(&self, other: &Distribution) -> Distribution {
        let mut both = self.clone();
        // Both have the same range and precision (`Default`): adding cannot fail; if it did,
        // `self`'s values alone are the answer.
        let _ = both.0.add(&other.0);
        both
    }

    /// The values recorded since `earlier`, a copy taken before of the same distribution.
    pub fn since(&self, earlier: &Distribution) -> Distribution {
        let mut newer = self.clone();
        if newer.0.subtract(&earlier.0).is_err() {
            // Not an earlier copy of this one: nothing can be told apart.
            return self.clone();
        }
        newer
    }
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            bytes: AtomicU64::new(0),
            records: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            histograms: Mutex::new(Histograms {
                fsync_us: Distribution::default(),
                batch_records: Distribution::default(),
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
        h.fsync_us.record_duration(took);
        h.batch_records.record(records);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_distribution_counts_buckets_and_differences() {
        let mut d = Distribution::default();
        assert!(d.is_empty() && d.quantile(0.99) == 0);
        for v in [0, 10, 20, 30, 40] {
            d.record(v);
        }
        let before = d.clone();
        d.record_duration(Duration::from_millis(2));
        d.record(u64::MAX);
        assert_eq!(d.len(), 7);
        assert_eq!(d.count_at_most(1), 1, "0 is clamped to 1");
        assert_eq!(d.count_at_most(40), 5);
        let later = d.since(&before);
        assert_eq!(later.len(), 2);
        assert_eq!(later.count_at_most(2_000), 1, "2 ms, in microseconds");
        assert!(later.max() >= 3_600_000_000, "clamped to the top of the range");
        // Not an earlier copy: nothing is subtracted.
        assert_eq!(before.since(&d).len(), before.len());
    }
}
