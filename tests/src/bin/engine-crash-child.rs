//! `engine-crash-child <dir> <threads> <compact-every> <seed> <tag-prefix>`: the process
//! `tests/engine_crash.rs` kills with SIGKILL while it writes to an [`Engine`].
//!
//! It opens the engine in `<dir>` with [`engine_crash::config`] (replaying whatever the previous
//! kill left), prints `ready <current revision>`, then runs `<threads>` writer threads until it
//! is killed. Each writer loops over a mix chosen by a small generator seeded from `<seed>` and
//! the thread number: 4% lease requests, 66% puts of `value(tag)` to one of
//! [`engine_crash::KEYS`] keys (the tag, `<tag-prefix>.<thread>.<n>`, is unique in the test), 15%
//! deletes of one such key, and 15% compare-and-swap increments of [`engine_crash::COUNTER`]
//! (compare MOD == the last one seen, put the next number; on failure read the counter instead).
//! A lease request either revokes a lease this writer granted earlier (a third of the time, if
//! it has one), printing `revoking` before, or grants a new one with TTL
//! [`engine_crash::LEASE_TTL`] and puts one or two [`engine_crash::lease_key`]s attached to it.
//! Puts go through `put`, `write_async(..)?.wait()` or an awaited `write_async`, chosen at random;
//! deletes through `delete_range` or `write_async(..)?.wait()`. Once a call returns `Ok`
//! the writer prints its line (module docs of [`engine_crash`]): every line is a promise that the
//! write is durable and applied. Writer 0 also asks for a compaction at the current revision
//! less [`COMPACT_LAG`] each time `<compact-every>` more writes have been acknowledged, printing
//! `compacting <rev>` before and `compact <rev>` once acknowledged, then defragments.
//!
//! Exit codes (the parent fails on any exit other than its own SIGKILL): 1 for an error of the
//! engine or of stdout, 3 for bad arguments.

use std::convert::Infallible;
use std::future::IntoFuture;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use cairn_engine::{
    Applied, Compare, CompareResult, CompareTarget, DeleteRangeRequest, Engine, Error, PutRequest, PutResponse,
    RangeRequest, RequestOp, ResponseOp, TxnRequest,
};
use cairn_tests::engine_crash::{self, Line, COUNTER, KEYS, LEASE_TTL};

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
            leases: Vec::new(),
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
    /// The leases this writer granted and has not asked to revoke: (ID, keys attached).
    leases: Vec<(i64, u64)>,
}

impl Writer {
    fn write_forever(&mut self) -> Result<Infallible, String> {
        loop {
            match self.rng.below(100) {
                0..4 => self.lease()?,
                4..70 => self.put()?,
                70..85 => self.delete()?,
                _ => self.cas()?,
            }
            if self.compact_every > 0 && self.acked.load(Ordering::Relaxed) >= self.next_compaction {
                self.next_compaction = self.acked.load(Ordering::Relaxed) + self.compact_every;
                self.compact()?;
            }
        }
    }

    /// Prints an acknowledged write's line and counts it.
    fn ack(&self, line: &Line) -> Result<(), String> {
        print_line(line).map_err(|e| format!("stdout: {e}"))?;
        self.acked.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The next unique tag of this writer.
    fn tag(&mut self) -> String {
        let tag = format!("{}.{}.{}", self.prefix, self.thread, self.written);
        self.written += 1;
        tag
    }

    /// Puts through one of the three ways the engine offers, chosen at random.
    fn send_put(&mut self, request: PutRequest) -> Result<Applied<PutResponse>, Error> {
        match self.rng.below(3) {
            0 => self.engine.write(request),
            1 => self.engine.write_async(request)?.wait(),
            _ => pollster::block_on(self.engine.write_async(request)?.into_future()),
        }
    }

    fn put(&mut self) -> Result<(), String> {
        let key = engine_crash::key(self.rng.below(KEYS));
        let tag = self.tag();
        let applied = self
            .send_put(PutRequest {
                key: key.clone().into_bytes(),
                value: engine_crash::value(&tag),
                ..PutRequest::default()
            })
            .map_err(|e| format!("put {key} {tag}: {e}"))?;
        self.ack(&Line::Put {
            thread: self.thread,
            revision: applied.revision,
            key,
            tag,
        })
    }

    /// Revokes a lease granted earlier, or grants one and attaches one or two keys to it.
    fn lease(&mut self) -> Result<(), String> {
        if !self.leases.is_empty() && self.rng.below(3) == 0 {
            let (lease, keys) = self
                .leases
                .swap_remove(self.rng.below(self.leases.len() as u64) as usize);
            print_line(&Line::Revoking {
                thread: self.thread,
                lease,
            })
            .map_err(|e| format!("stdout: {e}"))?;
            let applied = self
                .engine
                .leases()
                .revoke(lease)
                .map_err(|e| format!("revoke lease {lease}: {e}"))?;
            return self.ack(&Line::Revoked {
                thread: self.thread,
                revision: applied.revision,
                lease,
                keys,
            });
        }
        let granted = self
            .engine
            .leases()
            .grant(0, LEASE_TTL)
            .map_err(|e| format!("grant a lease: {e}"))?;
        let lease = granted.response.id;
        self.ack(&Line::Grant {
            thread: self.thread,
            revision: granted.revision,
            lease,
        })?;
        // Known to the writer before its keys, so that a revoke counts the keys acknowledged.
        self.leases.push((lease, 0));
        let slot = self.leases.len() - 1;
        for n in 0..=self.rng.below(2) {
            let key = engine_crash::lease_key(lease, n);
            let tag = self.tag();
            let applied = self
                .send_put(PutRequest {
                    key: key.clone().into_bytes(),
                    value: engine_crash::value(&tag),
                    lease,
                    ..PutRequest::default()
                })
                .map_err(|e| format!("put {key} {tag} with lease {lease}: {e}"))?;
            self.leases[slot].1 += 1;
            self.ack(&Line::LeasePut {
                thread: self.thread,
                revision: applied.revision,
                lease,
                key,
                tag,
            })?;
        }
        Ok(())
    }

    fn delete(&mut self) -> Result<(), String> {
        let key = engine_crash::key(self.rng.below(KEYS));
        let request = DeleteRangeRequest {
            key: key.clone().into_bytes(),
            ..DeleteRangeRequest::default()
        };
        let applied = if self.rng.below(2) == 0 {
            self.engine.write(request)
        } else {
            self.engine.write_async(request).and_then(|pending| pending.wait())
        }
        .map_err(|e| format!("delete {key}: {e}"))?;
        self.ack(&Line::Delete {
            thread: self.thread,
            revision: applied.revision,
            key,
            deleted: applied.response.deleted,
        })
    }

    /// Compare MOD(counter) == the last mod seen; put the next number, or read the counter.
    fn cas(&mut self) -> Result<(), String> {
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
            return self.ack(&Line::CasSucceeded {
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
        self.ack(&Line::CasFailed {
            thread: self.thread,
            revision,
            seen_mod: seen.0,
            seen_value: seen.1,
        })
    }

    /// Compacts at the current revision less [`COMPACT_LAG`], if that is a revision, then
    /// defragments.
    fn compact(&self) -> Result<(), String> {
        let target = self.engine.current_revision() - COMPACT_LAG;
        if target < 1 {
            return Ok(());
        }
        print_line(&Line::Compacting { revision: target }).map_err(|e| format!("stdout: {e}"))?;
        match self.engine.compact(target) {
            Ok(_) => {
                print_line(&Line::Compacted { revision: target }).map_err(|e| format!("stdout: {e}"))?;
                // Then return the space while the other writers go on: kills land mid-copy,
                // mid-switch and mid-delete too.
                self.engine
                    .maintenance()
                    .defragment()
                    .map(|_| ())
                    .map_err(|e| format!("defragment: {e}"))
            }
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
