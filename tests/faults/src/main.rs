//! `faults`: a Jepsen-style test of real member processes (cairn's, or etcd's for the
//! harness's own check) under faults: SIGKILL and restart, SIGSTOP and SIGCONT, a member or
//! the leader isolated, asymmetric partitions and lossy links, one at a time at random, all
//! healed at the end. Clients on random members do linearizable reads, writes and
//! compare-and-set on a few keys meanwhile. Then it checks:
//!
//! - the history is linearizable per key (an acknowledged write lost fails this too: the
//!   final reads on every member would contradict it);
//! - after healing, every member reaches the same revision and the same HashKV within a
//!   stated bound.
//!
//! It prints a report and exits non-zero when a check fails. Run as root: the members live in
//! network namespaces (see `net.rs`). See tests/faults/README.md.

// A test harness: member and key indices are its own, and a panic is a failed run.
#![allow(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used)]

mod chores;
mod cluster;
mod lease;
mod nemesis;
mod net;
mod upgrade;
mod watch;
mod workload;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_server::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use cairn_server::pb::etcdserverpb::{HashKvRequest, StatusRequest};
use cairn_tests::linearizability::{check_with, Budget, Input, Output, Verdict};
use clap::Parser;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tonic::transport::{Channel, Endpoint};

/// How long the members may take to agree once every fault is healed (a restarted member
/// catches up, a new leader is elected): past this, convergence fails.
const CONVERGENCE_BOUND: Duration = Duration::from_secs(60);

#[derive(Debug, Parser)]
#[command(about = "A Jepsen-style fault test of cairn (or etcd) processes; run as root")]
struct Args {
    /// The member binary: cairn, or etcd for the harness's own check.
    #[arg(long)]
    binary: PathBuf,
    /// What the report calls it.
    #[arg(long, default_value = "cairn")]
    label: String,
    /// Members.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// How long faults are injected, in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 6)]
    clients: usize,
    /// Keys the clients share.
    #[arg(long, default_value_t = 8)]
    keys: usize,
    /// Seconds after which the clients move to new keys (each key's history stays short).
    #[arg(long, default_value_t = 10)]
    epoch_seconds: u64,
    /// Seed of the fault schedule and the clients' choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the members' data and logs go (emptied first).
    #[arg(long, default_value = "/tmp/cairn-faults")]
    workdir: PathBuf,
    /// The third byte of the members' addresses (10.77.<subnet>.x), so runs can coexist.
    #[arg(long, default_value_t = 1)]
    subnet: u8,
    /// Each member's data on a tmpfs of this many MiB, which the nemesis fills; 0 for none
    /// (no disk-full faults).
    #[arg(long, default_value_t = 0)]
    disk_mb: u64,
    /// Seconds between an operator's chores under faults: a compaction and a defragmentation
    /// (0: never).
    #[arg(long, default_value_t = 10)]
    compact_seconds: u64,
    /// A rolling upgrade under the faults: the members start on this (older) build and are
    /// swapped for `--binary` one at a time (tests/faults/src/upgrade.rs).
    #[arg(long)]
    upgrade_from: Option<PathBuf>,
    /// With --upgrade-from: then the downgrade back to the older build, as etcd 3.6 does it.
    #[arg(long, requires = "upgrade_from")]
    downgrade: bool,
    /// With --upgrade-from: the upgrade (and downgrade) this many times over, spread over the
    /// run: members alternating between the two releases (tests/faults/soak.sh's mixed run).
    #[arg(long, default_value_t = 1, requires = "upgrade_from")]
    cycles: usize,
}

fn main() {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("faults: cannot start a runtime: {e}");
            std::process::exit(2);
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(report) => {
            println!("{report}");
            if !report.passed() {
                eprintln!("the members' data and logs are kept in {}", args.workdir.display());
                std::process::exit(1);
            }
            // The members preallocate their files: a passed run's data is not kept.
            let _ = std::fs::remove_dir_all(&args.workdir);
        }
        Err(e) => {
            eprintln!("faults ({}): {e}", args.label);
            std::process::exit(2);
        }
    }
}

/// What a run found.
#[derive(Debug)]
struct Report {
    label: String,
    members: usize,
    seconds: u64,
    seed: u64,
    injected: nemesis::Injected,
    ops: Vec<cairn_tests::linearizability::Operation>,
    verdict: Verdict,
    /// How long the linearizability check took.
    checked_in: Duration,
    recovered: Result<Duration, String>,
    converged: Result<(Duration, i64), String>,
    /// Events checked and connections made by the watchers.
    watched: Result<(usize, usize), String>,
    leases: lease::Leases,
    /// What was asked of each member whose disk stalled.
    stalled: Vec<nemesis::Stall>,
    /// Compactions and defragmentations done under faults.
    chores: chores::Chores,
    /// The alarms raised once healed: (member, alarm).
    alarms: Result<Vec<(u64, String)>, String>,
    /// The upgrade's and downgrade's steps, as taken (`--upgrade-from`).
    upgrade: Vec<String>,
    /// The errors the members answered clients' calls with: "code: message" and how often.
    refusals: std::collections::BTreeMap<String, usize>,
    /// The history's time 0, in seconds since the Unix epoch.
    started_unix: f64,
}

impl Report {
    fn passed(&self) -> bool {
        self.verdict.is_linearizable()
            && self.recovered.is_ok()
            && self.converged.is_ok()
            && self.watched.is_ok()
            && self.leases.violations.is_empty()
            && self.no_corrupt_alarm().is_ok()
            && self.stalled_writes_answered().is_ok()
            && self.no_version_refusal().is_ok()
    }

    /// No call was refused for a version reason. cairn gates what a newer build writes by
    /// the cluster version and writes the older form meanwhile, so none of a client's
    /// requests is ever refused for one (only `Maintenance.Downgrade` answers with version
    /// errors, and the clients do not call it).
    fn no_version_refusal(&self) -> Result<(), String> {
        let version: Vec<String> = self
            .refusals
            .iter()
            .filter(|(what, _)| what.to_ascii_lowercase().contains("version"))
            .map(|(what, n)| format!("{what} ({n}x)"))
            .collect();
        match version.is_empty() {
            true => Ok(()),
            false => Err(version.join("; ")),
        }
    }

    /// Every write through a member whose disk stalled was acknowledged or answered with one
    /// of etcd's timeout errors, within the stall and a few seconds.
    fn stalled_writes_answered(&self) -> Result<(), String> {
        for stall in &self.stalled {
            match &stall.write {
                Ok(()) => {}
                Err(Some(e)) if nemesis::TIMEOUT_ERRORS.iter().any(|t| e.contains(t)) => {}
                Err(Some(e)) => return Err(format!("answered {e:?}")),
                Err(None) => return Err("a write was not answered at all".to_string()),
            }
        }
        Ok(())
    }

    /// The hash checks (on, at short periods, in every member) found no member whose data
    /// differs.
    fn no_corrupt_alarm(&self) -> Result<usize, String> {
        let alarms = self.alarms.as_ref().map_err(|e| format!("cannot list alarms: {e}"))?;
        match alarms.iter().find(|(_, a)| a == "CORRUPT") {
            Some((member, _)) => Err(format!("CORRUPT raised for member {member:x}")),
            None => Ok(alarms.len()),
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "== faults: {} ({} members, {} s of faults, seed {}; times below count from {:.3} s after the Unix epoch)",
            self.label, self.members, self.seconds, self.seed, self.started_unix
        )?;
        for step in &self.upgrade {
            writeln!(f, "upgrade: {step}")?;
        }
        let total: usize = self.injected.values().sum();
        writeln!(f, "faults injected: {total}")?;
        for (kind, count) in &self.injected {
            writeln!(f, "  {kind:?}: {count}")?;
        }
        let mut counts = std::collections::BTreeMap::<(&str, &str), usize>::new();
        for op in &self.ops {
            let what = match op.input {
                Input::Get { .. } => "read",
                Input::Put { .. } => "write",
                Input::Cas { .. } => "cas",
            };
            let outcome = match op.output {
                Output::Unknown => "indeterminate",
                Output::Swapped(false) => "not swapped",
                _ => "ok",
            };
            *counts.entry((what, outcome)).or_default() += 1;
        }
        writeln!(f, "operations: {}", self.ops.len())?;
        for ((what, outcome), count) in &counts {
            writeln!(f, "  {what} {outcome}: {count}")?;
        }
        let verdict = match &self.verdict {
            Verdict::Linearizable => "PASS".to_string(),
            other => format!("FAIL: {other:?}"),
        };
        writeln!(
            f,
            "check linearizable per key (acknowledged writes kept): {verdict} (checked in {:.2} s, after {} s of faults)",
            self.checked_in.as_secs_f64(),
            self.seconds
        )?;
        match &self.recovered {
            Ok(took) => writeln!(
                f,
                "check every member takes writes after healing (within {CONVERGENCE_BOUND:?}): PASS, after {:.1} s",
                took.as_secs_f64()
            )?,
            Err(e) => writeln!(f, "check every member takes writes after healing: FAIL: {e}")?,
        }
        match &self.converged {
            Ok((took, revision)) => writeln!(
                f,
                "check converged after healing (same revision and HashKV within {CONVERGENCE_BOUND:?}): PASS, revision {revision} after {:.1} s",
                took.as_secs_f64()
            )?,
            Err(e) => writeln!(f, "check converged after healing: FAIL: {e}")?,
        }
        match &self.watched {
            Ok((events, connections)) => writeln!(
                f,
                "check watchers ordered, without gaps, equal to the history: PASS, {events} events over {connections} connections"
            )?,
            Err(e) => writeln!(f, "check watchers ordered, without gaps, equal to the history: FAIL: {e}")?,
        }
        let l = &self.leases;
        let verdict = match l.violations.first() {
            None => "PASS".to_string(),
            Some(first) => format!("FAIL: {} violations, the first: {first}", l.violations.len()),
        };
        writeln!(
            f,
            "check no lease expires before its TTL after its last acknowledged keep-alive, and each expires: {verdict}, {} leases, {} keep-alives, {} expiries seen",
            l.granted, l.keep_alives, l.expired
        )?;
        if !self.stalled.is_empty() {
            let (asked, answered) = self
                .stalled
                .iter()
                .fold((0, 0), |(a, b), s| (a + s.reads.0, b + s.reads.1));
            writeln!(
                f,
                "serializable reads on a member whose disk is stalled: {answered} of {asked} answered within 1 s, over {} stalls",
                self.stalled.len()
            )?;
            let acknowledged = self.stalled.iter().filter(|s| s.write.is_ok()).count();
            let timed_out: Vec<&str> = self
                .stalled
                .iter()
                .filter_map(|s| s.write.as_ref().err().and_then(|e| e.as_deref()))
                .collect();
            let verdict = match self.stalled_writes_answered() {
                Ok(()) => "PASS".to_string(),
                Err(e) => format!("FAIL: {e}"),
            };
            writeln!(
                f,
                "check writes through a member whose disk is stalled are acknowledged or answered with etcd's errors: {verdict}, {acknowledged} acknowledged, {} answered {:?}",
                timed_out.len(),
                timed_out.iter().collect::<std::collections::BTreeSet<_>>()
            )?;
        }
        let c = &self.chores;
        writeln!(
            f,
            "chores under faults: {} compactions (the last asked at revision {}), {} defragmentations",
            c.compactions, c.compacted, c.defrags
        )?;
        let refused: usize = self.refusals.values().sum();
        let mut common: Vec<(&String, &usize)> = self.refusals.iter().collect();
        common.sort_by(|a, b| b.1.cmp(a.1));
        let common: Vec<String> = common
            .iter()
            .take(4)
            .map(|(what, n)| format!("{what} ({n}x)"))
            .collect();
        match self.no_version_refusal() {
            Ok(()) => writeln!(
                f,
                "check no call refused for a version reason: PASS ({refused} refusals of other kinds; the most common: {})",
                common.join("; ")
            )?,
            Err(e) => writeln!(f, "check no call refused for a version reason: FAIL: {e}")?,
        }
        match self.no_corrupt_alarm() {
            Ok(others) => writeln!(
                f,
                "check no CORRUPT alarm from the hash checks: PASS ({others} other alarms raised)"
            )?,
            Err(e) => writeln!(f, "check no CORRUPT alarm from the hash checks: FAIL: {e}")?,
        }
        write!(f, "result: {}", if self.passed() { "PASS" } else { "FAIL" })
    }
}

async fn run(args: &Args) -> Result<Report, String> {
    let _ = std::fs::remove_dir_all(&args.workdir);
    std::fs::create_dir_all(&args.workdir).map_err(|e| format!("{}: {e}", args.workdir.display()))?;
    let net = net::Net::new(&format!("cf{}", args.subnet), args.subnet, args.members)?;
    let data = cluster::Data {
        root: &args.workdir,
        disk_mb: (args.disk_mb > 0).then_some(args.disk_mb),
    };
    let first = args.upgrade_from.as_ref().unwrap_or(&args.binary);
    let mut cluster = cluster::Cluster::start(first, net, args.members, data)?;
    let channels: Vec<Channel> = (0..args.members)
        .map(|i| {
            Endpoint::from_shared(cluster.client_url(i))
                .map(|e| e.connect_timeout(Duration::from_secs(1)).connect_lazy())
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let keys = workload::Keys {
        count: args.keys,
        epoch: Duration::from_secs(args.epoch_seconds.max(1)),
    };
    let history = workload::History::new();
    let stop = Arc::new(AtomicBool::new(false));
    let shared = workload::Shared {
        channels: channels.clone(),
        history: history.clone(),
        stop: stop.clone(),
    };
    let progress: Vec<Arc<AtomicI64>> = (0..=channels.len()).map(|_| Arc::default()).collect();
    let watchers: Vec<_> = channels
        .iter()
        .zip(&progress)
        .map(|(channel, seen)| {
            tokio::spawn(watch::watcher(
                channel.clone(),
                "k/".to_string(),
                stop.clone(),
                seen.clone(),
            ))
        })
        .collect();
    let recorder = tokio::spawn(watch::recorder(
        channels.clone(),
        "k/".to_string(),
        LAST_KEY.to_string(),
        progress[channels.len()].clone(),
    ));
    let chores = tokio::spawn(chores::run(
        shared.clone(),
        progress.clone(),
        Duration::from_secs(args.compact_seconds.max(1)),
        args.seed.wrapping_mul(31),
    ));
    let chores = (args.compact_seconds > 0).then_some(chores);
    let leases = Arc::new(std::sync::Mutex::new(lease::Leases::default()));
    let lease_clients: Vec<_> = (0..2)
        .map(|n| {
            tokio::spawn(lease::client(
                shared.clone(),
                args.seed.wrapping_mul(7919).wrapping_add(n),
                leases.clone(),
            ))
        })
        .collect();
    let clients: Vec<_> = (0..args.clients)
        .map(|id| {
            tokio::spawn(workload::client(
                id,
                shared.clone(),
                keys.clone(),
                args.seed.wrapping_mul(1000).wrapping_add(id as u64),
            ))
        })
        .collect();

    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut injected = nemesis::Injected::new();
    let mut stalled = Vec::new();
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let mut upgrade = match &args.upgrade_from {
        Some(old) => Some(upgrade::Plan::new(
            Instant::now(),
            args.seconds,
            args.members,
            upgrade::Swaps {
                old,
                new: &args.binary,
                downgrade: args.downgrade,
                cycles: args.cycles,
            },
        )?),
        None => None,
    };
    while Instant::now() < until || upgrade.as_ref().is_some_and(|u| !u.finished()) {
        if let Some(plan) = upgrade.as_mut() {
            plan.step_if_due(&mut cluster, &channels).await?;
        }
        let kind = nemesis::one_fault(&mut cluster, &channels, &mut rng, &mut stalled).await?;
        *injected.entry(kind).or_default() += 1;
        let gap = Duration::from_millis(rand::Rng::random_range(&mut rng, 500..2000));
        tokio::time::sleep(gap).await;
    }
    // Heal everything, let the clients go on a little, then stop them.
    cluster.net.heal()?;
    cluster.heal_processes()?;
    let healed = Instant::now();
    let recovered = recover(&channels, healed).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let _ = client.await;
    }
    for client in lease_clients {
        let _ = client.await;
    }
    let leases = std::mem::take(&mut *leases.lock().unwrap_or_else(|e| e.into_inner()));
    let mut seen = Vec::new();
    for watcher in watchers {
        seen.push(watcher.await.unwrap_or_default());
    }
    let chores = match chores {
        Some(chores) => chores.await.unwrap_or_default(),
        None => chores::Chores::default(),
    };
    let converged = converge(&mut cluster, &channels, healed).await;
    let alarms = alarms(&channels).await;
    let watched = check_watchers(&channels, &seen, recorder, chores.compacted).await;
    // The final reads: every key on every member, after convergence.
    for (i, channel) in channels.iter().enumerate() {
        for key in keys.all(history.now()) {
            workload::read(1000 + i, channel.clone(), key, &history).await;
        }
    }
    let ops = history.operations();
    let checking = Instant::now();
    let verdict = check_with(
        &ops,
        Budget {
            max_steps_per_key: 50_000_000,
        },
    );
    let checked_in = checking.elapsed();
    if !verdict.is_linearizable() {
        dump(&args.workdir, &ops);
    }
    cluster.stop();
    Ok(Report {
        label: args.label.clone(),
        members: args.members,
        seconds: args.seconds,
        seed: args.seed,
        injected,
        ops,
        verdict,
        checked_in,
        recovered,
        converged,
        watched,
        leases,
        stalled,
        chores,
        alarms,
        upgrade: upgrade.map(|u| u.log).unwrap_or_default(),
        refusals: history.refusals(),
        started_unix: history
            .started
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
    })
}

/// The key written after everything else: the end of the history.
const LAST_KEY: &str = "k/~end";

/// The watchers' events against the recorder's history, up to a last key written after
/// everything else; the recorder's in turn against member 0's after the last compaction
/// (`compacted`): how many events were checked over how many connections.
async fn check_watchers(
    channels: &[Channel],
    seen: &[Vec<watch::Segment>],
    recorder: tokio::task::JoinHandle<Vec<watch::Event>>,
    compacted: i64,
) -> Result<(usize, usize), String> {
    use cairn_server::pb::etcdserverpb::{kv_client::KvClient, PutRequest};
    let put = PutRequest {
        key: LAST_KEY.as_bytes().to_vec().into(),
        value: b"end".to_vec().into(),
        ..Default::default()
    };
    KvClient::new(channels[0].clone())
        .put(put)
        .await
        .map_err(|e| format!("the last key: {e}"))?;
    let recorded = tokio::time::timeout(Duration::from_secs(60), recorder)
        .await
        .map_err(|_| "the recorder did not see the last key within 60 s".to_string())?
        .map_err(|e| format!("the recorder failed: {e}"))?;
    let kept = tokio::time::timeout(
        Duration::from_secs(60),
        watch::history(&channels[0], "k/", compacted, LAST_KEY),
    )
    .await
    .map_err(|_| "reading the history took over 60 s".to_string())?;
    if kept.last().is_none_or(|e| e.key != LAST_KEY) {
        return Err(format!("member 0's history ended early, after {} events", kept.len()));
    }
    let recorded_tail: Vec<&watch::Event> = recorded.iter().filter(|e| e.revision > compacted).collect();
    if recorded_tail != kept.iter().collect::<Vec<_>>() {
        return Err(format!(
            "the recorder's history after revision {compacted} differs from member 0's ({} events, {} there)",
            recorded_tail.len(),
            kept.len()
        ));
    }
    let checked = watch::check(seen, &recorded)?;
    Ok((checked, seen.iter().map(Vec::len).sum()))
}

/// The alarms raised, as member 0 (or the first member that answers) lists them.
async fn alarms(channels: &[Channel]) -> Result<Vec<(u64, String)>, String> {
    use cairn_server::pb::etcdserverpb::{alarm_request::AlarmAction, AlarmRequest, AlarmType};
    let mut last = String::new();
    for channel in channels {
        let mut maintenance = MaintenanceClient::new(channel.clone());
        let asked = maintenance.alarm(AlarmRequest {
            action: AlarmAction::Get as i32,
            ..Default::default()
        });
        match tokio::time::timeout(Duration::from_secs(5), asked).await {
            Ok(Ok(r)) => {
                return Ok(r
                    .into_inner()
                    .alarms
                    .iter()
                    .map(|a| {
                        let name = AlarmType::try_from(a.alarm).map_or("?", |t| t.as_str_name());
                        (a.member_id, name.to_string())
                    })
                    .collect())
            }
            Ok(Err(e)) => last = e.message().to_string(),
            Err(_) => last = "no answer within 5 s".to_string(),
        }
    }
    Err(last)
}

/// Waits until a write through each member is acknowledged: how long after healing the
/// last one was.
async fn recover(channels: &[Channel], healed: Instant) -> Result<Duration, String> {
    use cairn_server::pb::etcdserverpb::{kv_client::KvClient, PutRequest};
    let deadline = healed + CONVERGENCE_BOUND;
    for (i, channel) in channels.iter().enumerate() {
        let mut kv = KvClient::new(channel.clone());
        loop {
            let put = PutRequest {
                key: format!("recovery/{i}").into_bytes().into(),
                value: b"ok".to_vec().into(),
                ..Default::default()
            };
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), kv.put(put)).await {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("member {i} takes no write within {CONVERGENCE_BOUND:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(healed.elapsed())
}

/// Waits until every member is healthy and all report the same revision with the same
/// HashKV there: how long it took after healing, and the revision.
async fn converge(
    cluster: &mut cluster::Cluster,
    channels: &[Channel],
    healed: Instant,
) -> Result<(Duration, i64), String> {
    let deadline = healed + CONVERGENCE_BOUND;
    for i in 0..channels.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        cluster.wait_healthy(i, left)?;
    }
    let mut last = String::new();
    while Instant::now() < deadline {
        let mut revisions = Vec::new();
        let mut hashes = Vec::new();
        for channel in channels {
            let mut m = MaintenanceClient::new(channel.clone());
            let status = tokio::time::timeout(Duration::from_secs(1), m.status(StatusRequest {})).await;
            if let Ok(Ok(s)) = status {
                revisions.push(s.into_inner().header.map_or(0, |h| h.revision));
            }
        }
        if revisions.len() == channels.len() && revisions.iter().all(|r| *r == revisions[0]) {
            let revision = revisions[0];
            for channel in channels {
                let mut m = MaintenanceClient::new(channel.clone());
                let asked = m.hash_kv(HashKvRequest { revision });
                if let Ok(Ok(h)) = tokio::time::timeout(Duration::from_secs(2), asked).await {
                    hashes.push(h.into_inner().hash);
                }
            }
            if hashes.len() == channels.len() && hashes.iter().all(|h| *h == hashes[0]) {
                return Ok((healed.elapsed(), revision));
            }
            last = format!("revision {revision}, hashes {hashes:?}");
        } else {
            last = format!("revisions {revisions:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("not within {CONVERGENCE_BOUND:?}: {last}"))
}

/// Writes the history beside the members' data, for the reader of a failure.
fn dump(workdir: &std::path::Path, ops: &[cairn_tests::linearizability::Operation]) {
    let text: Vec<String> = ops.iter().map(|op| format!("{op:?}")).collect();
    let path = workdir.join("history.txt");
    if std::fs::write(&path, text.join("\n")).is_ok() {
        eprintln!("history written to {}", path.display());
    }
}
