//! `raft-bench`: what replication costs a durable write. Proposals/s and commit latency of a
//! group of one and of a group of three in this process (over a [`LocalNetwork`], each member
//! with its own WAL on disk), with 1 and with 64 concurrent proposers, and each multi-member
//! result as a ratio to the group of one with the same proposers, measured in the same run
//! because the machine is noisy.
//!
//! A proposer is a thread putting one 256-byte value at a time through the leader and waiting
//! until it is committed and applied (`Engine::put`); each put's latency goes into a histogram.
//! Configurations run one after another, paired by proposers (1 member then 3 members with 1
//! proposer, then with 64), so the two results a ratio compares are minutes apart at most.
//! First, the raw floor: small pwrite + fdatasync calls on a file in the same directory, one
//! at a time, as `fsync-latency` does; every p50 is also given as a multiple of its p50.
//!
//! ```text
//! cargo run --release -p cairn-benches --bin raft-bench -- --dir /var/lib/cairn --seconds 5
//! ```
//!
//! All members' WALs are on the one disk under `--dir` and their threads share this machine's
//! cores, so three members pay for three fdatasyncs on one device per commit where a real
//! group pays for one on each of three: the 3-member cost here is an upper bound.
//!
//! With `--catch-up KEYS`, one more experiment follows, on a fresh group of three: one
//! follower is stopped, KEYS distinct keys (256-byte values) are put through the leader by 64
//! proposer threads (the write time), then the follower is restarted and timed until it has
//! applied the leader's revision (the catch-up time, from reopening it). The leader has
//! released the entries it missed by then, so it must be sent a snapshot of the whole state
//! (the run fails if it installed none); the result is the catch-up time, as MiB/s of the
//! leader's history (`EngineStatus::size_in_use`, what the snapshot streams) and as a ratio to the
//! write time. KEYS is 0 (skip, the default) or at least 20,000: with the default
//! configuration the leader only releases log entries at its checkpoints (every 10,000 applied
//! entries, keeping the last 5,000).
//!
//! ```text
//! cargo run --release -p cairn-benches --bin raft-bench -- --dir /var/lib/cairn --seconds 1 \
//!     --members 1 --proposers 1 --catch-up 100000
//! ```
//!
//! Every file lives in a new `raft-bench-<pid>` directory under `--dir`, each configuration in
//! a fresh subdirectory of it, removed when the configuration is done. The tool removes its
//! directory at the end, also after an error. Killed mid-run, it leaves that directory behind
//! and nothing else.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_benches::{
    dedup_in_order, exit_code, histogram, merge, micros, parse_count, parse_seconds, payload, per_sec, preallocate,
    ratio, ratio_json, rounded, sleep_unless_stopped, times_cell, us_cell, Context, Failure, Percentiles, WorkDir,
    WorkerResult, MEASURING, STOPPED, WARMING,
};
use cairn_engine::{Config, Engine, LocalNetwork, PutRequest};
use clap::Parser;
use serde_json::{Map, Value};

/// Names the work directory and prefixes every message.
const TOOL: &str = "raft-bench";

/// Measures proposals/s and commit latency of 1- and 3-member groups with real WALs.
#[derive(Debug, Parser)]
#[command(name = "raft-bench", version)]
struct Args {
    /// An existing directory on the disk to measure (the members' WALs go under it).
    #[arg(long)]
    dir: PathBuf,
    /// How long each configuration is measured, in seconds (fractions allowed, e.g. 0.5).
    #[arg(long, default_value_t = 5.0, value_parser = parse_seconds, allow_negative_numbers = true)]
    seconds: f64,
    /// Numbers of concurrent proposer threads, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64", value_parser = parse_proposers)]
    proposers: Vec<usize>,
    /// Group sizes, comma-separated; 1 is the baseline the others are compared with.
    #[arg(long, value_delimiter = ',', default_value = "1,3", value_parser = parse_members)]
    members: Vec<u64>,
    /// After the configurations, time a follower catching up by snapshot after this many keys
    /// were written without it (0 skips it; otherwise at least 20000).
    #[arg(long = "catch-up", value_name = "KEYS", default_value_t = 0, value_parser = parse_catch_up)]
    catch_up: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

impl Args {
    /// How long each configuration is measured.
    fn window(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }

    /// The unmeasured warm-up before it.
    fn warmup(&self) -> Duration {
        WARMUP.min(self.window())
    }
}

/// Most proposer threads accepted.
const MAX_PROPOSERS: usize = 1024;
/// Largest group accepted.
const MAX_MEMBERS: u64 = 7;
/// Bytes of each put's value (and of each raw write).
const VALUE_SIZE: usize = 256;
/// Unmeasured warm-up before each configuration (capped at its length).
const WARMUP: Duration = Duration::from_millis(500);
/// How long a new group may take to agree on a leader.
const ELECTION_PATIENCE: Duration = Duration::from_secs(30);
/// Raw write + fdatasync calls timed for the baseline, after `RAW_WARMUP` untimed ones.
const RAW_SYNCS: u64 = 200;
const RAW_WARMUP: u64 = 20;
/// The raw file is preallocated up front, like a WAL segment, so no sync pays for growth.
const RAW_FILE_SIZE: u64 = 1 << 20;
/// Latencies are recorded up to a minute.
const LATENCY_CEILING: Duration = Duration::from_secs(60);
/// Fewest keys `--catch-up` accepts: with the default configuration the leader releases log
/// entries only when it checkpoints (every 10,000 applied entries, keeping the last 5,000), so
/// after two checkpoints the stopped follower's next entry is surely gone.
const MIN_CATCH_UP_KEYS: u64 = 20_000;
/// Most keys `--catch-up` accepts: 4M 256-byte values stay under the default 2 GiB quota.
const MAX_CATCH_UP_KEYS: u64 = 4_000_000;
/// The group `--catch-up` measures: a leader, a follower that stays, and one that is stopped.
const CATCH_UP_MEMBERS: u64 = 3;
/// Proposer threads putting `--catch-up`'s keys.
const CATCH_UP_PROPOSERS: usize = 64;
/// How long the restarted follower may take to catch up before the run fails.
const CATCH_UP_PATIENCE: Duration = Duration::from_secs(600);
/// How often the restarted follower's revision is looked at.
const CATCH_UP_POLL: Duration = Duration::from_millis(1);
/// Bytes in a MiB, for rates.
const MIB: f64 = (1u64 << 20) as f64;

fn parse_proposers(s: &str) -> Result<usize, String> {
    parse_count(s, MAX_PROPOSERS, "threads")
}

fn parse_members(s: &str) -> Result<u64, String> {
    parse_count(s, MAX_MEMBERS, "members")
}

/// Parses `--catch-up`: 0 (skip), or a number of keys from `MIN_CATCH_UP_KEYS` up.
fn parse_catch_up(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    let keys = parse_count(s, MAX_CATCH_UP_KEYS, "keys")?;
    if keys < MIN_CATCH_UP_KEYS {
        return Err(format!(
            "must be 0 (skip) or at least {MIN_CATCH_UP_KEYS} keys: the leader releases log entries only \
             at its checkpoints (every 10,000 entries, keeping the last 5,000), so a follower that missed \
             fewer could catch up from the log instead of by snapshot"
        ));
    }
    Ok(keys)
}

fn main() -> ExitCode {
    let args = Args::parse();
    exit_code(TOOL, run(&args))
}

fn run(args: &Args) -> Result<(), Failure> {
    let mut proposers = args.proposers.clone();
    dedup_in_order(&mut proposers);
    let mut members = args.members.clone();
    dedup_in_order(&mut members);

    let work = WorkDir::create(&args.dir, TOOL)?;
    eprintln!(
        "raft-bench: measuring in {} ({} s per configuration, {VALUE_SIZE}-byte values)",
        work.path().display(),
        args.seconds
    );
    eprintln!("  raw pwrite + fdatasync ...");
    let raw = measure_raw(work.path())?;
    let mut runs = Vec::with_capacity(proposers.len() * members.len());
    // Paired by proposers, so each ratio compares results measured close together.
    for &p in &proposers {
        for &m in &members {
            eprintln!("  {m} member(s), {p} proposer(s) ...");
            runs.push(measure_group(work.path(), m, p, args)?);
        }
    }
    let catch_up = if args.catch_up > 0 {
        Some(measure_catch_up(work.path(), args.catch_up)?)
    } else {
        None
    };
    work.remove()?;

    let report = Report { raw, runs, catch_up };
    if args.json {
        let json = serde_json::to_string_pretty(&report.to_json(args)).context(|| "encode JSON".to_string())?;
        println!("{json}");
    } else {
        report.print_table(args);
    }
    Ok(())
}

/// The raw baseline: what one small durable append costs on this disk, with nothing above it.
#[derive(Debug)]
struct RawResult {
    latency: Percentiles,
    syncs: u64,
}

/// `RAW_SYNCS` pwrites of `VALUE_SIZE` bytes at the next offset of a preallocated file, each
/// followed by fdatasync, one at a time: the floor for one durable append.
fn measure_raw(dir: &Path) -> Result<RawResult, Failure> {
    let path = dir.join("raw.log");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .context(|| format!("create {}", path.display()))?;
    preallocate(&file, 0, RAW_FILE_SIZE).context(|| format!("preallocate {}", path.display()))?;
    let buf = payload(VALUE_SIZE);
    let mut latency = histogram(LATENCY_CEILING)?;
    let mut offset = 0u64;
    for i in 0..RAW_WARMUP + RAW_SYNCS {
        let started = Instant::now();
        file.write_all_at(&buf, offset)
            .context(|| format!("write {}", path.display()))?;
        file.sync_data().context(|| format!("fdatasync {}", path.display()))?;
        let took = started.elapsed();
        if i >= RAW_WARMUP {
            latency.saturating_record(micros(took));
        }
        // Wraps inside the preallocated space; the file never grows.
        offset = (offset + VALUE_SIZE as u64) % (RAW_FILE_SIZE - VALUE_SIZE as u64);
    }
    drop(file);
    fs::remove_file(&path).context(|| format!("remove {}", path.display()))?;
    Ok(RawResult {
        latency: Percentiles::of(&latency),
        syncs: RAW_SYNCS,
    })
}

/// One configuration's outcome.
#[derive(Debug)]
struct GroupResult {
    members: u64,
    proposers: usize,
    latency: Percentiles,
    /// Puts completed inside the measured window.
    proposals: u64,
    elapsed: Duration,
}

impl GroupResult {
    fn proposals_per_sec(&self) -> f64 {
        per_sec(self.proposals, self.elapsed)
    }
}

/// A proposer thread: puts one key at a time through `leader` and waits for it to be
/// committed and applied, until the phase is `STOPPED`. A failed put stops every proposer.
fn proposer(leader: &Engine, id: usize, phase: &AtomicU8, value: &Bytes) -> WorkerResult {
    let mut latency = histogram(LATENCY_CEILING)?;
    let mut completed = 0u64;
    let mut n = 0u64;
    while phase.load(Ordering::SeqCst) != STOPPED {
        let request = PutRequest {
            key: format!("bench/{id:04}/{n:012}").into_bytes(),
            value: value.clone(),
            ..PutRequest::default()
        };
        n += 1;
        let started = Instant::now();
        let outcome = leader.write(request);
        let took = started.elapsed();
        if let Err(e) = outcome {
            phase.store(STOPPED, Ordering::SeqCst);
            return Err(Failure(format!(
                "put through member {} by proposer {id}: {e}",
                leader.member_id()
            )));
        }
        if phase.load(Ordering::SeqCst) == MEASURING {
            latency.saturating_record(micros(took));
            completed += 1;
        }
    }
    Ok((latency, completed))
}

/// A running group: its running members (in ID order until one is restarted), and the
/// network between them (none for one).
struct Group {
    net: Option<LocalNetwork>,
    engines: Vec<Engine>,
    /// Where each member's subdirectory is.
    dir: PathBuf,
    /// Every member's ID, running or not.
    ids: Vec<u64>,
}

impl Group {
    /// Opens a new group of `members` under `dir` (one subdirectory per member) and waits
    /// until every member knows the same leader.
    fn start(dir: &Path, members: u64) -> Result<Group, Failure> {
        let mut group = Group {
            net: (members > 1).then(|| LocalNetwork::new(members)),
            engines: Vec::new(),
            dir: dir.to_path_buf(),
            ids: (1..=members).collect(),
        };
        for id in group.ids.clone() {
            // On failure, `group` drops and closes the members opened so far.
            group.open(id)?;
        }
        group.wait_for_leader()?;
        Ok(group)
    }

    /// Opens member `id` from its subdirectory (new, or as it was left) and connects it.
    fn open(&mut self, id: u64) -> Result<(), Failure> {
        let member_dir = self.dir.join(format!("member-{id}"));
        let opened = match &self.net {
            None => Engine::open(&member_dir, Config::default()),
            Some(net) => {
                let opened = Engine::builder(&member_dir)
                    .member(id)
                    .peers(self.ids.iter().copied())
                    .transport(net.transport(id))
                    .open();
                opened.and_then(|engine| {
                    net.attach(id, engine.inbox()?);
                    Ok(engine)
                })
            }
        };
        let engine = opened.context(|| format!("open member {id} in {}", member_dir.display()))?;
        self.engines.push(engine);
        Ok(())
    }

    /// Stops member `id`, which must be running: disconnects and closes it.
    fn stop(&mut self, id: u64) -> Result<(), Failure> {
        let i = self
            .engines
            .iter()
            .position(|e| e.member_id() == id)
            .ok_or_else(|| Failure(format!("member {id} is not running")))?;
        let engine = self.engines.remove(i);
        if let Some(net) = &self.net {
            net.detach(id);
        }
        engine.close().context(|| format!("close member {id}"))
    }

    /// Waits until every member names the same leader, one of them; returns its index.
    fn wait_for_leader(&self) -> Result<usize, Failure> {
        let deadline = Instant::now() + ELECTION_PATIENCE;
        loop {
            let seen: Vec<Option<u64>> = self.engines.iter().map(Engine::leader).collect();
            if let Some(Some(leader)) = seen.first() {
                if seen.iter().all(|s| s == &Some(*leader)) {
                    if let Some(i) = self.engines.iter().position(|e| e.member_id() == *leader) {
                        return Ok(i);
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(Failure(format!(
                    "no leader agreed on within {} s: members see {seen:?}",
                    ELECTION_PATIENCE.as_secs()
                )));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn leader(&self) -> Result<&Engine, Failure> {
        let i = self.wait_for_leader()?;
        self.engines
            .get(i)
            .ok_or_else(|| Failure("the leader is not a member".to_string()))
    }

    /// Closes every member (each syncs its log and checkpoints); the first failure wins.
    fn close(mut self) -> Result<(), Failure> {
        let mut first_error = None;
        for engine in std::mem::take(&mut self.engines) {
            let id = engine.member_id();
            if let Some(net) = &self.net {
                net.detach(id);
            }
            if let Err(e) = engine.close() {
                first_error.get_or_insert(Failure(format!("close member {id}: {e}")));
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for engine in self.engines.drain(..) {
            if let Some(net) = &self.net {
                net.detach(engine.member_id());
            }
            let _ = engine.close();
        }
    }
}

/// Measures a group of `members` with `proposers` proposer threads, for as long as `args` says.
fn measure_group(dir: &Path, members: u64, proposers: usize, args: &Args) -> Result<GroupResult, Failure> {
    let (warmup, window) = (args.warmup(), args.window());
    let group_dir = dir.join(format!("members-{members}-proposers-{proposers}"));
    fs::create_dir(&group_dir).context(|| format!("create {}", group_dir.display()))?;
    let group = Group::start(&group_dir, members)?;
    let leader = group.leader()?;
    let phase = AtomicU8::new(WARMING);
    let value = Bytes::from(payload(VALUE_SIZE));

    let (outcomes, elapsed) = thread::scope(|s| {
        // Proposers start right away; the warm-up is timed from the last one's start.
        let mut running = Vec::with_capacity(proposers);
        let mut spawn_error = None;
        for i in 0..proposers {
            let (phase, value) = (&phase, &value);
            let spawned = thread::Builder::new()
                .name(format!("proposer-{i}"))
                .stack_size(256 << 10)
                .spawn_scoped(s, move || proposer(leader, i, phase, value));
            match spawned {
                Ok(t) => running.push(t),
                Err(e) => {
                    phase.store(STOPPED, Ordering::SeqCst);
                    spawn_error = Some(Failure(format!("spawn proposer thread {i} of {proposers}: {e}")));
                    break;
                }
            }
        }
        let mut elapsed = Duration::ZERO;
        if spawn_error.is_none() {
            sleep_unless_stopped(&phase, warmup);
            if phase
                .compare_exchange(WARMING, MEASURING, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                let started = Instant::now();
                sleep_unless_stopped(&phase, window);
                phase.store(STOPPED, Ordering::SeqCst);
                elapsed = started.elapsed();
            }
        }
        let mut outcomes: Vec<WorkerResult> = spawn_error.into_iter().map(Err).collect();
        for t in running {
            outcomes.push(
                t.join()
                    .unwrap_or_else(|_| Err(Failure("a proposer panicked".to_string()))),
            );
        }
        (outcomes, elapsed)
    });

    let (latency, proposals) = merge(outcomes, LATENCY_CEILING)?;

    group.close()?;
    fs::remove_dir_all(&group_dir).context(|| format!("remove {}", group_dir.display()))?;
    Ok(GroupResult {
        members,
        proposers,
        latency: Percentiles::of(&latency),
        proposals,
        elapsed,
    })
}

/// `--catch-up`'s outcome.
#[derive(Debug)]
struct CatchUpResult {
    keys: u64,
    /// Putting the keys through the leader while the follower was down.
    write: Duration,
    /// Latency of those puts.
    write_latency: Percentiles,
    /// From reopening the follower until it had applied the leader's revision.
    catch_up: Duration,
    /// The part of `catch_up` spent opening the member (`EngineBuilder::open`) (its own log, before it can hear
    /// from the leader).
    reopen: Duration,
    /// The leader's `EngineStatus::size_in_use` once the keys were written: the history a snapshot
    /// streams (`EngineStatus::size` counts the data files' preallocated space too).
    state_bytes: u64,
    /// The leader's `EngineStatus::size` then: its data files on disk.
    file_bytes: u64,
    /// `EngineStatus::snapshots_installed` of the follower once it had caught up.
    snapshots_installed: u64,
}

impl CatchUpResult {
    fn keys_per_sec(&self) -> f64 {
        per_sec(self.keys, self.write)
    }

    fn mib_per_sec(&self) -> Option<f64> {
        ratio(self.state_bytes as f64 / MIB, self.catch_up.as_secs_f64())
    }

    /// Catch-up time over write time.
    fn over_write(&self) -> Option<f64> {
        ratio(self.catch_up.as_secs_f64(), self.write.as_secs_f64())
    }
}

/// What the filler threads of [`write_keys`] share: the leader they put through, the next key
/// to take and how many to put, the phase, and the value.
#[derive(Clone, Copy)]
struct Fillers<'a> {
    leader: &'a Engine,
    next: &'a AtomicU64,
    keys: u64,
    phase: &'a AtomicU8,
    value: &'a Bytes,
}

/// Filler `id`: puts keys `n` taken from `next` until `keys` are taken or the phase is
/// `STOPPED`, through `leader`, one at a time as `proposer` does; every put's latency is
/// recorded. A failed put stops every filler.
fn filler(fillers: Fillers<'_>, id: usize) -> WorkerResult {
    let Fillers {
        leader,
        next,
        keys,
        phase,
        value,
    } = fillers;
    let mut latency = histogram(LATENCY_CEILING)?;
    let mut completed = 0u64;
    while phase.load(Ordering::SeqCst) != STOPPED {
        let n = next.fetch_add(1, Ordering::SeqCst);
        if n >= keys {
            break;
        }
        let request = PutRequest {
            key: format!("catch-up/{n:012}").into_bytes(),
            value: value.clone(),
            ..PutRequest::default()
        };
        let started = Instant::now();
        let outcome = leader.write(request);
        let took = started.elapsed();
        if let Err(e) = outcome {
            phase.store(STOPPED, Ordering::SeqCst);
            return Err(Failure(format!(
                "put through member {} by filler {id}: {e}",
                leader.member_id()
            )));
        }
        latency.saturating_record(micros(took));
        completed += 1;
    }
    Ok((latency, completed))
}

/// Puts `keys` distinct keys through `leader` with `CATCH_UP_PROPOSERS` threads; returns how
/// long it took and the puts' latency.
fn write_keys(leader: &Engine, keys: u64) -> Result<(Duration, Percentiles), Failure> {
    let next = AtomicU64::new(0);
    let phase = AtomicU8::new(MEASURING);
    let value = Bytes::from(payload(VALUE_SIZE));
    let fillers = Fillers {
        leader,
        next: &next,
        keys,
        phase: &phase,
        value: &value,
    };
    let started = Instant::now();
    let outcomes = thread::scope(|s| {
        let mut running = Vec::with_capacity(CATCH_UP_PROPOSERS);
        let mut outcomes: Vec<WorkerResult> = Vec::with_capacity(CATCH_UP_PROPOSERS);
        for i in 0..CATCH_UP_PROPOSERS {
            let spawned = thread::Builder::new()
                .name(format!("filler-{i}"))
                .stack_size(256 << 10)
                .spawn_scoped(s, move || filler(fillers, i));
            match spawned {
                Ok(t) => running.push(t),
                Err(e) => {
                    phase.store(STOPPED, Ordering::SeqCst);
                    outcomes.push(Err(Failure(format!(
                        "spawn filler thread {i} of {CATCH_UP_PROPOSERS}: {e}"
                    ))));
                    break;
                }
            }
        }
        for t in running {
            outcomes.push(
                t.join()
                    .unwrap_or_else(|_| Err(Failure("a filler panicked".to_string()))),
            );
        }
        outcomes
    });
    let took = started.elapsed();
    let (latency, completed) = merge(outcomes, LATENCY_CEILING)?;
    if completed != keys {
        return Err(Failure(format!("{completed} keys were put, not {keys}")));
    }
    Ok((took, Percentiles::of(&latency)))
}

/// `--catch-up`: on a new group of three, stops a follower, puts `keys` keys without it,
/// restarts it and times it until it has applied the leader's revision, which it must have
/// reached by installing a snapshot.
fn measure_catch_up(dir: &Path, keys: u64) -> Result<CatchUpResult, Failure> {
    let group_dir = dir.join("catch-up");
    fs::create_dir(&group_dir).context(|| format!("create {}", group_dir.display()))?;
    eprintln!("  catch-up: {CATCH_UP_MEMBERS} members, {keys} keys written with one follower down ...");
    let mut group = Group::start(&group_dir, CATCH_UP_MEMBERS)?;
    let leader_id = group.leader()?.member_id();
    let behind = group
        .ids
        .iter()
        .copied()
        .find(|id| *id != leader_id)
        .ok_or_else(|| Failure("the group has no follower".to_string()))?;
    group.stop(behind)?;

    let leader = group.leader()?;
    let leader_id = leader.member_id();
    let (write, write_latency) = write_keys(leader, keys)?;
    let (state_bytes, file_bytes) = (leader.status().size_in_use, leader.status().size);
    eprintln!(
        "  catch-up: {keys} keys put in {:.2} s; restarting member {behind} ...",
        write.as_secs_f64()
    );

    let started = Instant::now();
    group.open(behind)?;
    let reopen = started.elapsed();
    let find = |id: u64| {
        group
            .engines
            .iter()
            .find(|e| e.member_id() == id)
            .ok_or_else(|| Failure(format!("member {id} is not running")))
    };
    let (leader, follower) = (find(leader_id)?, find(behind)?);
    let deadline = started + CATCH_UP_PATIENCE;
    loop {
        let (have, want) = (follower.current_revision(), leader.current_revision());
        if have == want {
            break;
        }
        if Instant::now() >= deadline {
            return Err(Failure(format!(
                "member {behind} did not catch up within {} s: at revision {have}, the leader at {want}",
                CATCH_UP_PATIENCE.as_secs()
            )));
        }
        thread::sleep(CATCH_UP_POLL);
    }
    let catch_up = started.elapsed();
    let snapshots_installed = follower.status().snapshots_installed;
    if snapshots_installed < 1 {
        return Err(Failure(format!(
            "member {behind} caught up from the leader's log, not by a snapshot: {keys} keys were not \
             enough for the leader to release the entries it missed"
        )));
    }

    group.close()?;
    fs::remove_dir_all(&group_dir).context(|| format!("remove {}", group_dir.display()))?;
    Ok(CatchUpResult {
        keys,
        write,
        write_latency,
        catch_up,
        reopen,
        state_bytes,
        file_bytes,
        snapshots_installed,
    })
}

/// Everything measured, ready to print.
#[derive(Debug)]
struct Report {
    raw: RawResult,
    runs: Vec<GroupResult>,
    catch_up: Option<CatchUpResult>,
}

/// A multi-member result over the group of one with the same proposers.
#[derive(Debug, Clone, Copy)]
struct VsOne {
    proposals_per_sec: Option<f64>,
    p50: Option<f64>,
    p99: Option<f64>,
    p999: Option<f64>,
}

impl Report {
    fn run(&self, members: u64, proposers: usize) -> Option<&GroupResult> {
        self.runs
            .iter()
            .find(|r| r.members == members && r.proposers == proposers)
    }

    /// `r` against the group of one with as many proposers; `None` for the group of one
    /// itself, or when it was not measured.
    fn vs_one(&self, r: &GroupResult) -> Option<VsOne> {
        if r.members == 1 {
            return None;
        }
        let one = self.run(1, r.proposers)?;
        let over = |a: Option<u64>, b: Option<u64>| ratio(a? as f64, b? as f64);
        Some(VsOne {
            proposals_per_sec: ratio(r.proposals_per_sec(), one.proposals_per_sec()),
            p50: over(r.latency.p50, one.latency.p50),
            p99: over(r.latency.p99, one.latency.p99),
            p999: over(r.latency.p999, one.latency.p999),
        })
    }

    /// `r`'s p50 as a multiple of the raw fdatasync p50.
    fn p50_over_fsync(&self, r: &GroupResult) -> Option<f64> {
        ratio(r.latency.p50? as f64, self.raw.latency.p50? as f64)
    }

    fn to_json(&self, args: &Args) -> Value {
        let mut m = Map::new();
        m.insert("seconds".into(), Value::from(args.seconds));
        m.insert("value_size".into(), Value::from(VALUE_SIZE));
        m.insert("fsync_p50_us".into(), Value::from(self.raw.latency.p50));
        m.insert("fsync_p99_us".into(), Value::from(self.raw.latency.p99));
        m.insert("fsync_p999_us".into(), Value::from(self.raw.latency.p999));
        m.insert("fsync_syncs".into(), Value::from(self.raw.syncs));
        for r in &self.runs {
            let k = format!("m{}_p{}", r.members, r.proposers);
            m.insert(format!("{k}_proposals"), Value::from(r.proposals));
            m.insert(
                format!("{k}_proposals_per_sec"),
                Value::from(rounded(r.proposals_per_sec(), 2)),
            );
            m.insert(format!("{k}_p50_us"), Value::from(r.latency.p50));
            m.insert(format!("{k}_p99_us"), Value::from(r.latency.p99));
            m.insert(format!("{k}_p999_us"), Value::from(r.latency.p999));
            m.insert(format!("{k}_p50_over_fsync_p50"), ratio_json(self.p50_over_fsync(r)));
            if let Some(v) = self.vs_one(r) {
                let one = format!("m1_p{}", r.proposers);
                m.insert(
                    format!("{k}_over_{one}_proposals_per_sec"),
                    ratio_json(v.proposals_per_sec),
                );
                m.insert(format!("{k}_over_{one}_p50"), ratio_json(v.p50));
                m.insert(format!("{k}_over_{one}_p99"), ratio_json(v.p99));
                m.insert(format!("{k}_over_{one}_p999"), ratio_json(v.p999));
            }
        }
        if let Some(c) = &self.catch_up {
            m.insert("catch_up_keys".into(), Value::from(c.keys));
            m.insert(
                "catch_up_write_s".into(),
                Value::from(rounded(c.write.as_secs_f64(), 3)),
            );
            m.insert(
                "catch_up_write_keys_per_sec".into(),
                Value::from(rounded(c.keys_per_sec(), 2)),
            );
            m.insert("catch_up_write_p50_us".into(), Value::from(c.write_latency.p50));
            m.insert("catch_up_write_p99_us".into(), Value::from(c.write_latency.p99));
            m.insert("catch_up_state_bytes".into(), Value::from(c.state_bytes));
            m.insert("catch_up_data_file_bytes".into(), Value::from(c.file_bytes));
            m.insert("catch_up_s".into(), Value::from(rounded(c.catch_up.as_secs_f64(), 3)));
            m.insert(
                "catch_up_reopen_s".into(),
                Value::from(rounded(c.reopen.as_secs_f64(), 3)),
            );
            m.insert(
                "catch_up_mib_per_sec".into(),
                c.mib_per_sec().map_or(Value::Null, |v| Value::from(rounded(v, 2))),
            );
            m.insert("catch_up_over_write".into(), ratio_json(c.over_write()));
            m.insert(
                "catch_up_snapshots_installed".into(),
                Value::from(c.snapshots_installed),
            );
        }
        Value::Object(m)
    }

    fn print_table(&self, args: &Args) {
        println!(
            "raft commit latency, {} s per configuration, {VALUE_SIZE}-byte values, in {}",
            args.seconds,
            args.dir.display()
        );
        println!(
            "raw pwrite+fdatasync: p50 {} us, p99 {} us, p99.9 {} us ({} syncs)",
            us_cell(self.raw.latency.p50),
            us_cell(self.raw.latency.p99),
            us_cell(self.raw.latency.p999),
            self.raw.syncs
        );
        println!();
        println!(
            "{:>7} {:>9} {:>11} {:>8} {:>8} {:>9} {:>9} | {:>8} {:>7} {:>7} {:>7}",
            "members",
            "proposers",
            "proposals/s",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "p50/fsync",
            "prop/s",
            "p50",
            "p99",
            "p99.9"
        );
        for r in &self.runs {
            let v = self.vs_one(r);
            println!(
                "{:>7} {:>9} {:>11.0} {:>8} {:>8} {:>9} {:>9} | {:>8} {:>7} {:>7} {:>7}",
                r.members,
                r.proposers,
                r.proposals_per_sec(),
                us_cell(r.latency.p50),
                us_cell(r.latency.p99),
                us_cell(r.latency.p999),
                times_cell(self.p50_over_fsync(r)),
                times_cell(v.and_then(|v| v.proposals_per_sec)),
                times_cell(v.and_then(|v| v.p50)),
                times_cell(v.and_then(|v| v.p99)),
                times_cell(v.and_then(|v| v.p999)),
            );
        }
        println!("(right of |: the result over the 1-member result with as many proposers, same run)");
        println!("(p50/fsync: the p50 as a multiple of the raw pwrite+fdatasync p50)");
        if let Some(c) = &self.catch_up {
            println!();
            println!(
                "catch-up by snapshot, {CATCH_UP_MEMBERS} members, one follower down while {CATCH_UP_PROPOSERS} \
                 proposers put {} keys",
                c.keys
            );
            println!(
                "{:>9} {:>8} {:>8} {:>8} {:>8} | {:>9} {:>10} {:>7} {:>8} {:>11}",
                "keys",
                "write s",
                "keys/s",
                "p50 us",
                "p99 us",
                "state MiB",
                "catch-up s",
                "MiB/s",
                "reopen s",
                "catch/write"
            );
            println!(
                "{:>9} {:>8.2} {:>8.0} {:>8} {:>8} | {:>9.1} {:>10.2} {:>7} {:>8.2} {:>11}",
                c.keys,
                c.write.as_secs_f64(),
                c.keys_per_sec(),
                us_cell(c.write_latency.p50),
                us_cell(c.write_latency.p99),
                c.state_bytes as f64 / MIB,
                c.catch_up.as_secs_f64(),
                c.mib_per_sec().map_or_else(|| "-".to_string(), |v| format!("{v:.1}")),
                c.reopen.as_secs_f64(),
                times_cell(c.over_write()),
            );
            println!(
                "(catch-up s: from reopening the follower until it applied the leader's revision, reopen s \
                 included; {} snapshot(s) installed)",
                c.snapshots_installed
            );
            println!(
                "(state MiB: the leader's history in use, in {:.1} MiB of data files; MiB/s: state over catch-up s)",
                c.file_bytes as f64 / MIB
            );
        }
    }
}
