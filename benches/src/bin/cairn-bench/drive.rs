//! Runs (limits and rate), their clients, tallies of outcomes (with the log of answers that
//! `--latency-log` writes) and the progress bar.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cairn_benches::{histogram, micros, per_sec, Context, Failure};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use tonic::Status;

use crate::*;

/// A run's limits and the requests handed out so far, shared by its clients.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) started: Instant,
    /// `started` as Unix time, for the latency log.
    pub(crate) started_unix: SystemTime,
    pub(crate) total: Option<u64>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) rate: Option<f64>,
    /// Request numbers handed out (may pass `total`: every client takes one to learn it's over).
    pub(crate) issued: AtomicU64,
    /// Requests answered (or failed), for the progress bar.
    pub(crate) completed: AtomicU64,
}

impl Run {
    pub(crate) fn start(total: Option<u64>, seconds: Option<Duration>, rate: Option<f64>) -> Arc<Run> {
        let started = Instant::now();
        Arc::new(Run {
            started,
            started_unix: SystemTime::now(),
            total,
            deadline: seconds.map(|s| started + s),
            rate,
            issued: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        })
    }

    pub(crate) fn over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// The next request's number, once the rate allows it; `None` when the run is over.
    pub(crate) async fn next(&self) -> Option<u64> {
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

    pub(crate) fn done(&self) {
        self.completed.fetch_add(1, Ordering::Relaxed);
    }

    /// Time 0 of the run's latency log.
    pub(crate) fn origin(&self) -> Origin {
        Origin {
            at: self.started,
            unix: self.started_unix,
        }
    }
}

impl Bench {
    /// Runs `clients` workers (`worker(c, tally)`) until they return, with a progress bar for
    /// `run`; their merged tally, and the time from the run's start until the last one returned.
    pub(crate) async fn drive<F, Fut>(
        &self,
        label: &str,
        run: &Arc<Run>,
        clients: usize,
        worker: F,
    ) -> Result<(Tally, Duration), Failure>
    where
        F: Fn(usize, Tally) -> Fut,
        Fut: Future<Output = Tally> + Send + 'static,
    {
        let tallies = (0..clients).map(|_| Tally::new()).collect::<Result<Vec<_>, _>>()?;
        let bar = progress_bar(label, run, self.shown);
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
}

/// A bar for `run`: requests done of `--total`, or time passed of `--seconds`.
pub(crate) fn progress_bar(label: &str, run: &Run, shown: bool) -> ProgressBar {
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
pub(crate) fn spinner(shown: bool, label: &str) -> ProgressBar {
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
pub(crate) async fn tick(bar: ProgressBar, run: Arc<Run>) {
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
pub(crate) struct Errors {
    pub(crate) count: u64,
    pub(crate) example: String,
}

/// What a client (or a whole phase) counted: latencies of the successful requests, how many
/// succeeded, what the workload counts in them, failures by gRPC code, and (when recorded
/// with `answered`) each successful request's answer time and latency.
#[derive(Debug)]
pub(crate) struct Tally {
    pub(crate) latency: Histogram<u64>,
    pub(crate) ok: u64,
    pub(crate) hits: u64,
    pub(crate) errors: BTreeMap<String, Errors>,
    pub(crate) log: AnswerLog,
}

impl Tally {
    pub(crate) fn new() -> Result<Tally, Failure> {
        Ok(Tally {
            latency: histogram(LATENCY_CEILING)?,
            ok: 0,
            hits: 0,
            errors: BTreeMap::new(),
            log: AnswerLog::default(),
        })
    }

    /// Records an outcome that came just now, and logs it if it succeeded: its answer time
    /// counted from `origin`.
    pub(crate) fn answered(&mut self, origin: Origin, took: Duration, outcome: Result<u64, Status>) {
        if outcome.is_ok() {
            self.log.push(origin, Instant::now(), took);
        }
        self.record(took, outcome);
    }

    pub(crate) fn record(&mut self, took: Duration, outcome: Result<u64, Status>) {
        match outcome {
            Ok(hits) => {
                self.latency.saturating_record(micros(took));
                self.ok += 1;
                self.hits += hits;
            }
            Err(e) => self.error(&e),
        }
    }

    pub(crate) fn error(&mut self, e: &Status) {
        let entry = self.errors.entry(format!("{:?}", e.code())).or_insert_with(|| Errors {
            count: 0,
            example: e.message().chars().take(200).collect(),
        });
        entry.count += 1;
    }

    pub(crate) fn failed(&self) -> u64 {
        self.errors.values().map(|e| e.count).sum()
    }

    pub(crate) fn absorb(&mut self, other: Tally) -> Result<(), Failure> {
        self.latency
            .add(&other.latency)
            .context(|| "merge latency histograms".to_string())?;
        self.ok += other.ok;
        self.hits += other.hits;
        self.log.absorb(other.log);
        for (code, e) in other.errors {
            self.errors
                .entry(code)
                .and_modify(|mine| mine.count += e.count)
                .or_insert(e);
        }
        Ok(())
    }

    /// `: Code xN ("message"), ...`, or nothing without failures.
    pub(crate) fn errors_text(&self) -> String {
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

/// Time 0 of a latency log: an instant, and the same moment as Unix time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin {
    pub(crate) at: Instant,
    pub(crate) unix: SystemTime,
}

impl Origin {
    pub(crate) fn now() -> Origin {
        Origin {
            at: Instant::now(),
            unix: SystemTime::now(),
        }
    }
}

/// Successful requests for `--latency-log`: when each answer came, in microseconds since
/// `origin`, and its latency in microseconds (16 bytes a request, kept until the end).
/// Invariant: `answers` is empty while `origin` is `None`.
#[derive(Debug, Clone, Default)]
pub(crate) struct AnswerLog {
    pub(crate) origin: Option<Origin>,
    pub(crate) answers: Vec<(u64, u64)>,
}

impl AnswerLog {
    /// An empty log counting from `origin` (what it absorbs is shifted onto it).
    pub(crate) fn starting_at(origin: Origin) -> AnswerLog {
        AnswerLog {
            origin: Some(origin),
            answers: Vec::new(),
        }
    }

    /// Logs an answer that came at `answered` after `took`; the first one sets the origin.
    pub(crate) fn push(&mut self, origin: Origin, answered: Instant, took: Duration) {
        let origin = *self.origin.get_or_insert(origin);
        let at = answered.saturating_duration_since(origin.at);
        self.answers.push((whole_micros(at), micros(took)));
    }

    /// Adds `other`'s answers, counted from this log's origin (an answer before it counts as 0).
    pub(crate) fn absorb(&mut self, other: AnswerLog) {
        let Some(theirs) = other.origin else {
            return;
        };
        let ours = *self.origin.get_or_insert(theirs);
        // Their time 0 on our clock, in microseconds (negative if theirs came first).
        let shift = if theirs.at >= ours.at {
            i128::from(whole_micros(theirs.at.duration_since(ours.at)))
        } else {
            -i128::from(whole_micros(ours.at.duration_since(theirs.at)))
        };
        self.answers.extend(other.answers.into_iter().map(|(at, took)| {
            let at = (i128::from(at) + shift).clamp(0, i128::from(u64::MAX));
            (u64::try_from(at).unwrap_or(0), took)
        }));
    }

    /// Writes the log to `path`, by answer time: a `#` line with the origin as Unix time,
    /// then `<answered µs>,<latency µs>` lines.
    pub(crate) fn write(&self, path: &Path, workload: &str) -> Result<(), Failure> {
        let mut answers = self.answers.clone();
        answers.sort_unstable();
        let unix = self
            .origin
            .and_then(|o| o.unix.duration_since(UNIX_EPOCH).ok())
            .map_or(0, whole_micros);
        let write = || -> std::io::Result<()> {
            let mut out = BufWriter::new(std::fs::File::create(path)?);
            writeln!(
                out,
                "# {TOOL} {workload}: answered_us,latency_us; answered counted from started_unix_us={unix}"
            )?;
            for (at, took) in answers {
                writeln!(out, "{at},{took}")?;
            }
            out.flush()
        };
        write().context(|| format!("write the latency log {}", path.display()))
    }
}

/// `d` in whole microseconds (0 allowed, unlike `micros`).
pub(crate) fn whole_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
