//! Model-based test of durability: random appends, syncs, truncations, releases and clean
//! reopens against a plain list of records, then a simulated power loss at an arbitrary point
//! (a write torn at any byte, or unsynced sectors lost at random), then recovery.
//!
//! The property (docs/wal-format.md, "Durability"): the recovered log is every record that was
//! acknowledged as durable, plus possibly a prefix of the unacknowledged ones, in order, never
//! a damaged record; after releases it starts at a segment boundary at or before the oldest
//! entry still needed, led by the latest state written before that boundary.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::Arc;

use bytes::Bytes;
use cairn_wal::{Config, Durability, LogIndex, Record, SimFs, Wal};
use proptest::prelude::*;

const DIR: &str = "/wal";

#[derive(Debug, Clone)]
enum Op {
    /// Entries continuing the log, with these payload sizes.
    Append {
        sizes: Vec<usize>,
        durable: bool,
    },
    State {
        size: usize,
        durable: bool,
    },
    /// Truncate `back` entries off the end (clamped), then append one.
    Truncate {
        back: u64,
    },
    Sync,
    /// Release below `last - behind`.
    Release {
        behind: u64,
    },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop::collection::vec(0usize..200, 1..6), any::<bool>()).prop_map(|(sizes, durable)| Op::Append { sizes, durable }),
        1 => (0usize..100, any::<bool>()).prop_map(|(size, durable)| Op::State { size, durable }),
        1 => (0u64..8).prop_map(|back| Op::Truncate { back }),
        1 => Just(Op::Sync),
        1 => (0u64..30).prop_map(|behind| Op::Release { behind }),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Debug, Clone)]
enum Crash {
    /// Keep this fraction (per mille) of each file's unsynced bytes, as a prefix.
    Tear(u64),
    /// Each unsynced sector survives when the hash of (seed, sector) is odd.
    Sectors(u64),
}

fn crash() -> impl Strategy<Value = Crash> {
    prop_oneof![
        (0u64..=1000).prop_map(Crash::Tear),
        any::<u64>().prop_map(Crash::Sectors)
    ]
}

/// What the test knows about the log it wrote.
#[derive(Debug, Default)]
struct Model {
    /// Every record appended, in order (across reopens).
    log: Vec<Record>,
    /// `log[..durable]` is acknowledged as durable.
    durable: usize,
    last_index: Option<u64>,
    /// The highest release point requested.
    released_below: Option<u64>,
    serial: u64,
}

impl Model {
    fn payload(&mut self, size: usize) -> Bytes {
        // Unique payloads make every record distinguishable.
        self.serial += 1;
        let mut p = format!("#{}:", self.serial).into_bytes();
        p.resize(p.len() + size, b'.');
        Bytes::from(p)
    }
}

/// Where the log under test lives: a simulated file system, and the configuration it is
/// opened with.
struct Disk {
    fs: SimFs,
    config: Config,
}

impl Disk {
    /// Opens the log and replays it: the records, and the log to append to.
    fn open(&self) -> (Vec<Record>, Wal) {
        let mut replay = Wal::open_with(Arc::new(self.fs.clone()), DIR, self.config.clone()).expect("open");
        let records = replay.by_ref().collect::<Result<Vec<_>, _>>().expect("replay");
        (records, replay.finish().expect("finish"))
    }

    /// Applies `op` to `wal`, and updates `model` to match.
    fn apply(&self, wal: &mut Wal, model: &mut Model, op: Op) {
        let (records, durable) = match op {
            Op::Append { sizes, durable } => {
                let mut next = model.last_index.map_or(1, |l| l + 1);
                let records = sizes
                    .into_iter()
                    .map(|s| {
                        let r = Record::Entry {
                            index: LogIndex(next),
                            payload: model.payload(s),
                        };
                        next += 1;
                        r
                    })
                    .collect();
                (records, durable)
            }
            Op::State { size, durable } => (vec![Record::State(model.payload(size))], durable),
            Op::Truncate { back } => {
                let Some(last) = model.last_index else { return };
                let from = last.saturating_sub(back).max(1);
                (
                    vec![
                        Record::Truncate { from: LogIndex(from) },
                        Record::Entry {
                            index: LogIndex(from),
                            payload: model.payload(10),
                        },
                    ],
                    true,
                )
            }
            Op::Sync => {
                wal.sync().unwrap().wait().unwrap();
                model.durable = model.log.len();
                return;
            }
            Op::Release { behind } => {
                let Some(last) = model.last_index else { return };
                let below = last.saturating_sub(behind);
                wal.release_before(LogIndex(below)).unwrap();
                model.released_below = model.released_below.max(Some(below));
                return;
            }
            Op::Reopen => {
                let placeholder = std::mem::replace(wal, open_scratch());
                drop(placeholder);
                let (_, reopened) = self.open();
                *wal = reopened;
                return;
            }
        };
        let mode = if durable {
            Durability::Durable
        } else {
            Durability::Buffered
        };
        let appended = wal.append(records.clone(), mode).unwrap().wait().unwrap();
        model.last_index = appended.last_index.map(|l| l.0);
        model.log.extend(records);
        if durable {
            model.durable = model.log.len();
        }
    }
}

/// A throwaway log to hold the place of one being reopened.
fn open_scratch() -> Wal {
    let scratch = Disk {
        fs: SimFs::new(),
        config: Config {
            segment_size: 512,
            ..Config::default()
        },
    };
    let (_, wal) = scratch.open();
    wal
}

/// Checks `recovered` against the model; returns the length of the log prefix it represents.
fn check(model: &Model, recovered: &[Record]) -> Result<usize, TestCaseError> {
    // The recovered log is a window `log[start..end]` of everything appended (led by the state
    // carried from before `start`). `start` is 0 unless segments were released, and then only
    // entries below the release point may precede it; `end` covers every durable record.
    let mut rejected = Vec::new();
    for start in 0..=model.log.len() {
        let carried = model.log[..start].iter().rev().find_map(|r| match r {
            Record::State(s) => Some(Record::State(s.clone())),
            _ => None,
        });
        let body = match (&carried, recovered.first()) {
            (Some(c), Some(first)) if first == c => &recovered[1..],
            (Some(_), _) => continue,
            (None, _) => recovered,
        };
        let end = start + body.len();
        if end > model.log.len() || model.log[start..end] != *body {
            continue;
        }
        let released_ok = match model.released_below {
            None => start == 0,
            Some(below) => model.log[..start].iter().all(|r| match r {
                Record::Entry { index, .. } => index.0 < below,
                _ => true,
            }),
        };
        let durable_ok = end >= model.durable;
        if released_ok && durable_ok {
            return Ok(end);
        }
        rejected.push((start, end, released_ok, durable_ok));
    }
    Err(TestCaseError::fail(format!(
        "recovered log matches no allowed window (start, end, release ok, durable ok: {rejected:?}); \
         durable {}, released below {:?}; recovered {recovered:?}",
        model.durable, model.released_below
    )))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn crash_recovery_keeps_every_acknowledged_record(
        segment_size in 512u64..2048,
        rounds in prop::collection::vec((prop::collection::vec(op(), 1..40), crash()), 1..4),
    ) {
        let config = Config { segment_size, ..Config::default() };
        let disk = Disk { fs: SimFs::new(), config };
        let mut model = Model::default();
        let (_, mut wal) = disk.open();
        for (ops, crash) in rounds {
            for op in ops {
                disk.apply(&mut wal, &mut model, op);
            }
            match crash {
                Crash::Tear(per_mille) => disk.fs.crash_tearing(|_, dirty| dirty * per_mille / 1000),
                Crash::Sectors(seed) => disk.fs.crash_sectors(|path, sector| {
                    use std::hash::{Hash, Hasher};
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    (seed, path, sector).hash(&mut h);
                    h.finish() % 2 == 1
                }),
            }
            drop(std::mem::replace(&mut wal, open_scratch()));
            let (recovered, reopened) = disk.open();
            let end = check(&model, &recovered)?;
            // Recovery is stable: what it kept is now the log, durably.
            model.log.truncate(end);
            model.durable = end;
            model.last_index = recovered.iter().fold(None, |last, r| match r {
                Record::Entry { index, .. } => Some(index.0),
                Record::Truncate { from } => from.0.checked_sub(1),
                Record::State(_) => last,
            });
            wal = reopened;
        }
    }
}
