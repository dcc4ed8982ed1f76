//! `cairn check disk`: is this disk fit to carry a member's WAL? It answers etcd's question
//! the way etcd's documentation measures it (fio with `--ioengine=sync --fdatasync=1
//! --size=22m --bs=2300`): 2,300-byte writes at successive offsets of a file fallocated first
//! (as fio lays its file out, and as etcd's WAL and cairn's preallocate their segments, so
//! each first write into a block costs the fdatasync a metadata update too), each followed
//! by an fdatasync, with the fdatasync timed alone; then a verdict against
//! etcd's guidance, a WAL fdatasync p99 under 10 ms. It also runs cairn's own WAL on the same
//! disk with several appenders, to show what group commit makes of that disk.
//!
//! Everything is written in a new `cairn-check-disk-<pid>` directory under `--dir`, removed
//! at the end (also after an error); a check killed midway leaves that directory and nothing
//! else.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::DiskArgs;
use cairn_engine::wal::{Config, Durability, Replay, Wal};
use serde_json::json;

/// Why the check could not run (as opposed to a disk found unfit).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A bad argument.
    #[error("{0}")]
    Argument(String),
    /// The disk could not be written, synced or read.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// cairn's WAL failed on this disk.
    #[error("the WAL: {0}")]
    Wal(#[from] cairn_engine::wal::Error),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CheckError {
    let what = what.into();
    move |source| CheckError::Io { what, source }
}

/// The latency percentiles of one run, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    /// Samples taken.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile: what etcd's guidance is about.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Slowest.
    pub max: u64,
}

impl Percentiles {
    fn of(d: &cairn_engine::wal::Distribution) -> Percentiles {
        Percentiles {
            count: d.len(),
            p50: d.quantile(0.50),
            p90: d.quantile(0.90),
            p99: d.quantile(0.99),
            p999: d.quantile(0.999),
            max: d.max(),
        }
    }

    fn json(&self) -> serde_json::Value {
        json!({"count": self.count, "p50_us": self.p50, "p90_us": self.p90, "p99_us": self.p99,
               "p99_9_us": self.p999, "max_us": self.max})
    }
}

/// The WAL's group-commit run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupCommit {
    /// Appender threads.
    pub appenders: usize,
    /// Durable appends per second.
    pub records_per_sec: f64,
    /// fdatasyncs per second.
    pub fsyncs_per_sec: f64,
    /// The WAL's fdatasync latencies.
    pub fsync: Percentiles,
}

/// What the check found.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The directory checked.
    pub dir: PathBuf,
    /// fdatasync latency with etcd's recipe.
    pub fdatasync: Percentiles,
    /// The p99 a fit disk stays under.
    pub max_p99: Duration,
    /// The WAL's run, unless skipped.
    pub wal: Option<GroupCommit>,
}

impl Report {
    /// Whether the disk is fit: its fdatasync p99 is under the bound.
    pub fn fit(&self) -> bool {
        u128::from(self.fdatasync.p99) < self.max_p99.as_micros()
    }

    /// The verdict, one line.
    pub fn verdict(&self) -> String {
        let p99 = ms(self.fdatasync.p99);
        let bound = self.max_p99.as_secs_f64() * 1e3;
        match self.fit() {
            true => format!("PASS: fdatasync p99 is {p99:.3} ms, under {bound} ms: the disk is fit for a member's WAL"),
            false => format!(
                "FAIL: fdatasync p99 is {p99:.3} ms, not under {bound} ms: the disk is too slow for a member's WAL (etcd's guidance)"
            ),
        }
    }

    /// The report as one JSON object.
    pub fn json(&self) -> serde_json::Value {
        json!({
            "dir": self.dir.display().to_string(),
            "fdatasync": self.fdatasync.json(),
            "max_p99_us": self.max_p99.as_micros() as u64,
            "fit": self.fit(),
            "verdict": self.verdict(),
            "wal": self.wal.map(|w| json!({
                "appenders": w.appenders,
                "records_per_sec": w.records_per_sec,
                "fsyncs_per_sec": w.fsyncs_per_sec,
                "fsync": w.fsync.json(),
            })),
        })
    }

    /// The report as lines for people.
    pub fn text(&self) -> String {
        let f = &self.fdatasync;
        let mut out = format!(
            "disk check of {}: {} writes of etcd's recipe, each followed by an fdatasync\n\
             fdatasync latency: p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms\n",
            self.dir.display(),
            f.count,
            ms(f.p50),
            ms(f.p90),
            ms(f.p99),
            ms(f.p999),
            ms(f.max)
        );
        if let Some(w) = &self.wal {
            out += &format!(
                "cairn's WAL, {} appenders: {:.0} durable appends/s over {:.0} fdatasyncs/s ({:.1} per fdatasync), fdatasync p99 {:.3} ms\n",
                w.appenders,
                w.records_per_sec,
                w.fsyncs_per_sec,
                w.records_per_sec / w.fsyncs_per_sec.max(f64::MIN_POSITIVE),
                ms(w.fsync.p99)
            );
        }
        out + &self.verdict() + "\n"
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1e3
}

/// A directory removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the check.
pub fn run(args: &DiskArgs) -> Result<Report, CheckError> {
    let max_p99 =
        crate::config::go_duration("max-p99", &args.max_p99).map_err(|e| CheckError::Argument(e.to_string()))?;
    if args.block_size == 0 || args.size < args.block_size {
        return Err(CheckError::Argument(
            "--block-size must be positive and at most --size".into(),
        ));
    }
    if !(args.wal_seconds.is_finite() && (0.0..=3600.0).contains(&args.wal_seconds)) {
        return Err(CheckError::Argument("--wal-seconds must be between 0 and 3600".into()));
    }
    let scratch = Scratch(args.dir.join(format!("cairn-check-disk-{}", std::process::id())));
    std::fs::create_dir(&scratch.0).map_err(io(format!("create {}", scratch.0.display())))?;
    let fdatasync = recipe(&scratch.0, args.size, args.block_size)?;
    let wal = match args.appenders {
        0 => None,
        n => Some(group_commit(
            &scratch.0,
            n,
            args.block_size,
            Duration::from_secs_f64(args.wal_seconds.max(0.1)),
        )?),
    };
    Ok(Report {
        dir: args.dir.clone(),
        fdatasync,
        max_p99,
        wal,
    })
}

/// etcd's fio recipe: the file fallocated first through the WAL's own file layer (as fio and
/// the WAL do it: unwritten extents, no data), then `size / block` writes of bytes that do not
/// compress at successive offsets, each followed by an fdatasync timed alone.
fn recipe(dir: &Path, size: u64, block: u64) -> Result<Percentiles, CheckError> {
    use cairn_engine::wal::{FileSystem, StdFs};
    let path = dir.join("recipe");
    let file = StdFs.create(&path).map_err(io(format!("create {}", path.display())))?;
    file.preallocate(size).map_err(io("fallocate the file"))?;
    // A different pseudo-random block per write (xorshift), as fio's are random: a
    // compressing or deduplicating volume stores them at full cost.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
    let mut next_block = move || -> Vec<u8> {
        (0..block)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    let mut latency = cairn_engine::wal::Distribution::default();
    let mut offset = 0;
    while offset + block <= size {
        file.write_all_at(&next_block(), offset).map_err(io("write"))?;
        let started = Instant::now();
        file.sync_data().map_err(io("fdatasync"))?;
        latency.record_duration(started.elapsed());
        offset += block;
    }
    Ok(Percentiles::of(&latency))
}

/// cairn's WAL on the same disk: `appenders` threads each appending `block`-byte records
/// durably, one at a time, for `window`.
fn group_commit(dir: &Path, appenders: usize, block: u64, window: Duration) -> Result<GroupCommit, CheckError> {
    let wal_dir = dir.join("wal");
    std::fs::create_dir(&wal_dir).map_err(io(format!("create {}", wal_dir.display())))?;
    let wal = Arc::new(Wal::open(&wal_dir, Config::default()).and_then(Replay::finish)?);
    let payload = bytes::Bytes::from(vec![7u8; usize::try_from(block).unwrap_or(2300)]);
    let stop = Arc::new(AtomicBool::new(false));
    let before = wal.stats();
    let started = Instant::now();
    let threads: Vec<_> = (0..appenders)
        .map(|_| {
            let (wal, stop, payload) = (wal.clone(), stop.clone(), payload.clone());
            std::thread::spawn(move || -> Result<u64, cairn_engine::wal::Error> {
                let mut appended = 0;
                while !stop.load(Ordering::Relaxed) {
                    wal.append_next(vec![payload.clone()], Durability::Durable)?.wait()?;
                    appended += 1;
                }
                Ok(appended)
            })
        })
        .collect();
    std::thread::sleep(window);
    stop.store(true, Ordering::Relaxed);
    let mut records = 0;
    for t in threads {
        match t.join() {
            Ok(appended) => records += appended?,
            Err(_) => return Err(CheckError::Argument("an appender thread panicked".into())),
        }
    }
    let took = started.elapsed().as_secs_f64();
    let after = wal.stats();
    let fsync = after.fsync_latency_us.since(&before.fsync_latency_us);
    Ok(GroupCommit {
        appenders,
        records_per_sec: records as f64 / took,
        fsyncs_per_sec: (after.fsyncs - before.fsyncs) as f64 / took,
        fsync: Percentiles::of(&fsync),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(p99_us: u64, bound: Duration) -> Report {
        let p = Percentiles {
            count: 1,
            p50: 1,
            p90: 1,
            p99: p99_us,
            p999: p99_us,
            max: p99_us,
        };
        Report {
            dir: PathBuf::from("/d"),
            fdatasync: p,
            max_p99: bound,
            wal: None,
        }
    }

    #[test]
    fn the_verdict_is_etcds_guidance_p99_strictly_under_the_bound() {
        let bound = Duration::from_millis(10);
        assert!(report(9_999, bound).fit());
        assert!(!report(10_000, bound).fit(), "under, not at");
        assert!(report(2_000, bound).verdict().starts_with("PASS"));
        assert!(report(25_000, bound).verdict().starts_with("FAIL"));
        assert_eq!(report(25_000, bound).json()["fit"], false);
    }

    #[test]
    fn a_small_check_runs_end_to_end_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let args = DiskArgs {
            dir: dir.path().to_path_buf(),
            max_p99: "1h".into(),
            size: 64 << 10,
            block_size: 2300,
            appenders: 2,
            wal_seconds: 0.1,
            json: false,
        };
        let r = run(&args).unwrap();
        assert_eq!(r.fdatasync.count, (64 << 10) / 2300, "one fdatasync per write");
        assert!(r.fit());
        assert!(r.wal.is_some_and(|w| w.records_per_sec > 0.0));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left behind");
        let bad = DiskArgs { block_size: 0, ..args };
        assert!(run(&bad).is_err());
    }
}
