//! `engine-crash-child <dir> <threads> <compact-every> <seed> <tag-prefix>`: the process
//! `tests/engine_crash.rs` kills with SIGKILL while it writes to an [`Engine`].
//!
//! It opens the engine in `<dir>` with [`engine_crash::config`] (replaying whatever the previous
//! kill left), prints `ready <current revision>`, then runs `<threads>` writer threads until it
//! is killed. Each writer loops over a mix chosen by a small generator seeded from `<seed>` and
//! the thread number: 70% puts of `value(tag)` to one of [`engine_crash::KEYS`] keys (the tag,
//! `<tag-prefix>.<thread>.<n>`, is unique in the test), 15% deletes of one such key, and 15%
//! compare-and-swap increments of [`engine_crash::COUNTER`] (compare MOD == the last one seen,
//! put the next number; on failure read the counter instead). Once a call returns `Ok` the
//! writer prints its line (module docs of [`engine_crash`]): every line is a promise that the
//! write is durable and applied. Writer 0 also asks for a compaction at the current revision
//! less [`COMPACT_LAG`] each time `<compact-every>` more writes have been acknowledged, printing
//! `compacting <rev>` before and `compact <rev>` once acknowledged.
//!
//! Exit codes (the parent fails on any exit other than its own SIGKILL): 1 for an error of the
//! engine or of stdout, 3 for bad arguments.

use std::convert::Infallible;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use cairn_engine::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, Engine, Error, PutRequest, RangeRequest, RequestOp,
    ResponseOp, TxnRequest,
};
use cairn_tests::engine_crash::{self, Line, COUNTER, KEYS};

/// How far behind the current revision a compaction lands, so that reads of recent history
/// keep working and each compaction drops a good part of the older one.
const COMPACT_LAG: i64 = 64;

struct Args {
    dir: PathBuf,
    threads: usize,
    compact_every: u64,
    seed: u64,
    prefix: String,
}

fn parse_args() -> Option<Args> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, threads, compact_every, seed, prefix] = args.as_slice() else {
        return None;
    };
    Some(Args {
        dir: PathBuf::from(dir),
        threads: threads.parse::<usize>().ok()?.max(1),
        compact_every: compact_every.parse().ok()?,
        seed: seed.parse().ok()?,
        prefix: prefix.clone(),
    })
}

fn main() -> ExitCode {
    let Some(args) = parse_args() else {
        eprintln!("usage: engine-crash-child <dir> <threads> <compact-every> <seed> <tag-prefix>");
        return ExitCode::from(3);
    };
    let Err((code, message)) = run(args);
    eprintln!("engine-crash-child: {message}");
    ExitCode::from(code)
}

/// Runs until killed; returns only on a failure, with the exit code and message.
fn run(args: Args) -> Result<Infallible, (u8, String)> {
    let engine = Engine::open(&args.dir, engine_crash::config()).map_err(|e| (1, format!("open: {e}")))?;
    let engine = Arc::new(engine);
    print_line(&Line::Ready {
        revision: engine.current_revision(),
    })
    .map_err(|e| (1, format!("stdout: {e}")))?;

    let acked = Arc::new(AtomicU64::new(0));
    let (failed, first_failure) = mpsc::channel();
    for thread in 0..args.threads {
        let mut writer = Writer {
            engine: engine.clone(),
            thread,
            rng: SplitMix64(args.seed ^ (thread as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            prefix: args.prefix.clone(),
            written: 0,
            counter: (0, 0),
            acked: acked.clone(),
            compact_every: if thread == 0 { args.compact_every } else { 0 },
            next_compaction: args.compact_every,
        };
        let failed = failed.clone();
        std::thread::spawn(move || {
            let Err(message) = writer.write_forever();
            let _ = failed.send(message);
        });
    }
    // Writers stop only on an error; the first one ends the process.
    let message = first_failure
        .recv()
        .unwrap_or_else(|_| "every writer stopped".to_string());
    Err((1, message))
}

/// A tiny deterministic generator (splitmix64): the choices of a writer follow from the seed.
struct SplitMix64(u64);

impl SplitMix64 {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

struct Writer {
    engine: Arc<Engine>,
    thread: usize,
    rng: SplitMix64,
    prefix: String,
    /// Puts made so far by this writer, for unique tags.
    written: u64,
    /// The counter as this writer last saw it: (mod revision, value); (0, 0) before it exists.
    counter: (i64, u64),
    /// Write requests acknowledged by all writers of this process.
    acked: Arc<AtomicU64>,
    /// Compact each time this many more writes are acknowledged; 0 for never.
    compact_every: u64,
    next_compaction: u64,
}

impl Writer {
    fn write_forever(&mut self) -> Result<Infallible, String> {
        loop {
            let line = match self.rng.below(100) {
                0..70 => self.put()?,
                70..85 => self.delete()?,
                _ => self.cas()?,
            };
            print_line(&line).map_err(|e| format!("stdout: {e}"))?;
            let acked = self.acked.fetch_add(1, Ordering::Relaxed) + 1;
            if self.compact_every > 0 && acked >= self.next_compaction {
                self.next_compaction = acked + self.compact_every;
                self.compact()?;
            }
        }
    }

    fn put(&mut self) -> Result<Line, String> {
        let key = engine_crash::key(self.rng.below(KEYS));
        let tag = format!("{}.{}.{}", self.prefix, self.thread, self.written);
        self.written += 1;
        let applied = self
            .engine
            .put(PutRequest {
                key: key.clone().into_bytes(),
                value: engine_crash::value(&tag),
                ..PutRequest::default()
            })
            .map_err(|e| format!("put {key} {tag}: {e}"))?;
        Ok(Line::Put {
            thread: self.thread,
            revision: applied.revision,
            key,
            tag,
        })
    }

    fn delete(&mut self) -> Result<Line, String> {
        let key = engine_crash::key(self.rng.below(KEYS));
        let applied = self
            .engine
            .delete_range(DeleteRangeRequest {
                key: key.clone().into_bytes(),
                ..DeleteRangeRequest::default()
            })
            .map_err(|e| format!("delete {key}: {e}"))?;
        Ok(Line::Delete {
            thread: self.thread,
            revision: applied.revision,
            key,
            deleted: applied.response.deleted,
        })
    }

    /// Compare MOD(counter) == the last mod seen; put the next number, or read the counter.
    fn cas(&mut self) -> Result<Line, String> {
        let (prev_mod, prev_value) = self.counter;
        let next = prev_value + 1;
        let applied = self
            .engine
            .txn(TxnRequest {
                compare: vec![Compare {
                    key: COUNTER.into(),
                    range_end: vec![],
                    target: CompareTarget::Mod(prev_mod),
                    result: CompareResult::Equal,
                }],
                success: vec![RequestOp::Put(PutRequest {
                    key: COUNTER.into(),
                    value: next.to_string().into(),
                    ..PutRequest::default()
                })],
                failure: vec![RequestOp::Range(RangeRequest {
                    key: COUNTER.into(),
                    ..RangeRequest::default()
                })],
            })
            .map_err(|e| format!("cas counter from mod {prev_mod}: {e}"))?;
        let revision = applied.revision;
        if applied.response.succeeded {
            self.counter = (revision, next);
            return Ok(Line::CasSucceeded {
                thread: self.thread,
                revision,
                prev_mod,
                value: next,
            });
        }
        let seen = match applied.response.responses.as_slice() {
            [ResponseOp::Range(r)] => match r.kvs.as_slice() {
                [] => (0, 0),
                [kv] => {
                    let value = std::str::from_utf8(&kv.value)
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                        .ok_or_else(|| format!("counter holds {:?}", kv.value))?;
                    (kv.mod_revision, value)
                }
                kvs => return Err(format!("a read of the counter returned {} keys", kvs.len())),
            },
            other => return Err(format!("the failure branch answered {other:?}")),
        };
        self.counter = seen;
        Ok(Line::CasFailed {
            thread: self.thread,
            revision,
            seen_mod: seen.0,
            seen_value: seen.1,
        })
    }

    /// Compacts at the current revision less [`COMPACT_LAG`], if that is a revision.
    fn compact(&self) -> Result<(), String> {
        let target = self.engine.current_revision() - COMPACT_LAG;
        if target < 1 {
            return Ok(());
        }
        print_line(&Line::Compacting { revision: target }).map_err(|e| format!("stdout: {e}"))?;
        match self.engine.compact(target) {
            Ok(_) => print_line(&Line::Compacted { revision: target }).map_err(|e| format!("stdout: {e}")),
            // An earlier compaction (one logged by a killed child but never acknowledged, say)
            // already went at least as far.
            Err(Error::Compacted { .. }) => Ok(()),
            Err(e) => Err(format!("compact {target}: {e}")),
        }
    }
}

/// Writes one whole line to stdout and flushes it, so the parent reads it even if the next
/// instruction is the kill.
fn print_line(line: &Line) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}
