//! Fuzzes opening a log: recovery on the in-memory `SimFs`, in two modes.
//!
//! - Raw: one to four segment files built from the input (a canonical or arbitrary name, an
//!   optional header, correctly chained frames or not, then arbitrary tail bytes).
//! - Damage: a valid log written through `Wal` (tiny segments, so it rotates; entries, states,
//!   truncations, releases, reopens, simulated power losses), then damaged on disk: bits
//!   flipped, ranges zeroed, files cut, garbage appended, segments deleted.
//!
//! Then, for every input:
//! - opening never panics or hangs;
//! - a tolerant open that succeeds leaves a log that a second open replays identically (repair
//!   is idempotent), and that takes a new entry right after what it replayed;
//! - a strict open of the same bytes yields exactly the records the tolerant open did (the
//!   modes differ only in whether a torn tail is an error), never more;
//! - `repair_with` leaves a log that opens strictly, with those same records, and a second
//!   repair finds nothing to do;
//! - in damage mode, what recovery yields is a prefix of what the undamaged log replays, and
//!   that in turn is what was appended (exactly, unless segments were released or deleted:
//!   then a contiguous run of it, after at most one carried state); after a power loss while
//!   building, the log replays a prefix of what was appended that holds every record
//!   acknowledged durable.
//!
//! Damage bytes come from a PRNG seeded by the input rather than from the input itself: with
//! compare tracing, libFuzzer would otherwise write the expected crc into the file and forge a
//! valid record, which recovery rightly accepts but no prefix check can allow for.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arbitrary::Arbitrary;
use bytes::Bytes;
use cairn_wal::{
    decode_frame, parse_segment_name, repair_with, segment_name, Config, Durability, Error, FrameKind, LogIndex,
    Record, RecoveryMode, Replay, SegmentHeader, SegmentSeq, SimFs, Wal, SEGMENT_HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;

const DIR: &str = "/wal";
const MAX_PAYLOAD: usize = 300;
const MAX_OPS: usize = 32;
const MAX_BATCH: usize = 6;
const MAX_DAMAGE: usize = 6;
const MAX_RAW_FRAMES: usize = 12;
const MAX_RAW_TAIL: usize = 1024;

#[derive(Debug, Arbitrary)]
enum Input {
    Raw(RawInput),
    Damage(DamageInput),
}

/// Picks a segment size in 512..=4160, mostly small ones so that logs rotate often (SimFs
/// preallocates every segment to this size).
fn pick_segment_size(sel: u16) -> u64 {
    let base = [512, 512, 1024, 4096][usize::from(sel % 4)];
    base + u64::from(sel >> 2) % 9 * 8
}

fn config(segment_size: u64, recovery: RecoveryMode) -> Config {
    Config {
        segment_size,
        recovery,
        ..Config::default()
    }
}

#[derive(Debug, Arbitrary)]
enum Payload {
    Bytes(Vec<u8>),
    /// `len` bytes counting up from `start`: big records, and so rotation, from small inputs.
    Counting {
        len: u16,
        start: u8,
    },
}

impl Payload {
    fn bytes(&self) -> Bytes {
        match self {
            Payload::Bytes(b) => Bytes::copy_from_slice(b.get(..MAX_PAYLOAD).unwrap_or(b)),
            Payload::Counting { len, start } => (0..usize::from(*len) % (MAX_PAYLOAD + 1))
                .map(|i| start.wrapping_add(i as u8))
                .collect(),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Tail {
    Bytes(Vec<u8>),
    /// Zeros, as the unwritten part of a preallocated segment reads.
    Zeros(u16),
}

// ---------------------------------------------------------------------------------------------
// Raw mode

#[derive(Debug, Arbitrary)]
struct RawInput {
    segment_size: u16,
    /// Sequence number of the first canonically named segment.
    base_seq: u64,
    first: RawSegment,
    more: Vec<RawSegment>,
}

#[derive(Debug, Arbitrary)]
enum RawName {
    /// `segment_name(base_seq + i, first_index)`.
    Canonical { first_index: u64 },
    /// `segment_name(seq, first_index)` with an arbitrary sequence number.
    Numbered { seq: u64, first_index: u64 },
    /// Anything made of the characters segment, tmp and broken names use.
    Other(Vec<u8>),
}

#[derive(Debug, Arbitrary)]
enum Seed {
    /// Continues the crc chain: the previous frame's crc (or the previous segment's last one).
    Chained,
    Value(u32),
}

#[derive(Debug, Arbitrary)]
enum RawHeader {
    None,
    /// A valid header matching the name (when the name parses).
    Matching {
        seed: Seed,
    },
    /// A valid header with arbitrary fields.
    Valid {
        seq: u64,
        first_index: u64,
        seed: Seed,
    },
    /// Arbitrary bytes, at most a header's worth.
    Bytes(Vec<u8>),
}

#[derive(Debug, Arbitrary)]
enum Kind {
    Entry,
    State,
    Truncate,
    CarriedState,
}

impl Kind {
    fn frame_kind(&self) -> FrameKind {
        match self {
            Kind::Entry => FrameKind::Entry,
            Kind::State => FrameKind::State,
            Kind::Truncate => FrameKind::Truncate,
            Kind::CarriedState => FrameKind::CarriedState,
        }
    }
}

#[derive(Debug, Arbitrary)]
struct RawFrame {
    kind: Kind,
    /// Entry index: `index` itself, or (when `follow` is set) the previous entry's index + 1.
    index: u64,
    follow: bool,
    payload: Payload,
    seed: Seed,
}

#[derive(Debug, Arbitrary)]
struct RawSegment {
    name: RawName,
    header: RawHeader,
    frames: Vec<RawFrame>,
    tail: Tail,
}

fn sanitize_name(bytes: &[u8]) -> Option<String> {
    const CHARS: &[u8] = b"0123456789abcdef-.+wltmpbrokenWAL_";
    let name: String = bytes
        .iter()
        .take(48)
        .map(|b| char::from(CHARS[usize::from(*b) % CHARS.len()]))
        .collect();
    (!name.is_empty() && name != "." && name != "..").then_some(name)
}

fn build_raw(input: &RawInput) -> SimFs {
    let fs = SimFs::new();
    let dir = Path::new(DIR);
    let mut chain = 0u32;
    let mut last_entry = 0u64;
    for (i, seg) in std::iter::once(&input.first)
        .chain(input.more.iter().take(3))
        .enumerate()
    {
        let name = match &seg.name {
            RawName::Canonical { first_index } => Some(segment_name(
                SegmentSeq(input.base_seq.wrapping_add(i as u64)),
                LogIndex(*first_index),
            )),
            RawName::Numbered { seq, first_index } => Some(segment_name(SegmentSeq(*seq), LogIndex(*first_index))),
            RawName::Other(bytes) => sanitize_name(bytes),
        };
        let Some(name) = name else { continue };
        let seed = |s: &Seed, chain: u32| match s {
            Seed::Chained => chain,
            Seed::Value(v) => *v,
        };
        let mut bytes = Vec::new();
        match &seg.header {
            RawHeader::None => {}
            RawHeader::Matching { seed: s } => {
                let (seq, first_index) = parse_segment_name(&name).unwrap_or((SegmentSeq(0), LogIndex(0)));
                let crc_seed = seed(s, chain);
                bytes.extend_from_slice(
                    &SegmentHeader {
                        seq,
                        first_index,
                        crc_seed,
                    }
                    .encode(),
                );
                chain = crc_seed;
            }
            RawHeader::Valid {
                seq,
                first_index,
                seed: s,
            } => {
                let crc_seed = seed(s, chain);
                let header = SegmentHeader {
                    seq: SegmentSeq(*seq),
                    first_index: LogIndex(*first_index),
                    crc_seed,
                };
                bytes.extend_from_slice(&header.encode());
                chain = crc_seed;
            }
            RawHeader::Bytes(b) => bytes.extend_from_slice(b.get(..40).unwrap_or(b)),
        }
        // Frames start 8-aligned, as the log writes them.
        bytes.resize(bytes.len().next_multiple_of(8), 0);
        for f in seg.frames.iter().take(MAX_RAW_FRAMES) {
            let index = match f.kind {
                Kind::Entry if f.follow => last_entry.saturating_add(1),
                Kind::Entry | Kind::Truncate => f.index,
                Kind::State | Kind::CarriedState => 0,
            };
            if matches!(f.kind, Kind::Entry) {
                last_entry = index;
            }
            chain = f
                .kind
                .frame_kind()
                .encode(&mut bytes, index, &f.payload.bytes(), seed(&f.seed, chain));
        }
        match &seg.tail {
            Tail::Bytes(b) => bytes.extend_from_slice(b.get(..MAX_RAW_TAIL).unwrap_or(b)),
            Tail::Zeros(n) => bytes.resize(bytes.len() + usize::from(*n) % (4096 + 1), 0),
        }
        fs.write_file(&dir.join(name), &bytes);
    }
    fs
}

// ---------------------------------------------------------------------------------------------
// Damage mode

#[derive(Debug, Arbitrary)]
struct DamageInput {
    segment_size: u16,
    /// `ops` runs `1 + rounds % 4` times over (at most `MAX_OPS` in all): long logs from short
    /// inputs.
    rounds: u8,
    ops: Vec<BuildOp>,
    damage: Vec<DamageOp>,
}

#[derive(Debug, Arbitrary)]
enum Item {
    /// An entry at `last + 1 + skew` (skew is usually 0; otherwise the request is refused).
    Entry {
        skew: u8,
        payload: Payload,
    },
    State(Payload),
    /// A truncation at `last + 1 - back`.
    Truncate {
        back: u8,
    },
}

#[derive(Debug, Arbitrary)]
enum BuildOp {
    /// `1 + more % MAX_BATCH` entries like `payload` (a few input bytes make a big batch).
    AppendNext {
        payload: Payload,
        more: u8,
        durable: bool,
    },
    Append {
        items: Vec<Item>,
        durable: bool,
    },
    State {
        payload: Payload,
        durable: bool,
    },
    /// `truncate_suffix(last + 1 - back)`.
    TruncateSuffix {
        back: u8,
    },
    Sync,
    /// `release_before(last + 1 - back % 16)`.
    ReleaseBefore {
        back: u8,
    },
    /// Drop the `Wal` and open it again.
    Reopen,
    /// Power loss: a torn write (`sectors` false) or out-of-order sector writeback.
    Crash {
        sectors: bool,
        seed: u64,
    },
}

#[derive(Debug, Arbitrary)]
enum Anchor {
    /// `offset` bytes into the file (modulo its length).
    Start,
    /// `offset % 64` bytes into the `n`th frame (modulo their number): its length, crc, type,
    /// reserved bytes, index, payload or padding.
    Frame(u8),
    /// `offset % 256` bytes before the end of the non-zero bytes (where the next append goes).
    DataEnd,
    /// `offset` bytes before the end of the file (modulo its length).
    FileEnd,
}

#[derive(Debug, Arbitrary)]
struct Position {
    anchor: Anchor,
    offset: u16,
}

/// Where the frames of an undamaged segment start, walking the crc chain from its header.
fn frame_starts(data: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let Ok(header) = SegmentHeader::decode(data) else {
        return starts;
    };
    let (mut pos, mut seed) = (SEGMENT_HEADER_LEN, header.crc_seed);
    while let Some(Ok((frame, used))) = data.get(pos..).map(|rest| decode_frame(rest, seed)) {
        starts.push(pos);
        pos += used;
        seed = frame.crc;
    }
    starts
}

impl Position {
    fn resolve(&self, data: &[u8]) -> usize {
        let offset = usize::from(self.offset);
        let at = match self.anchor {
            Anchor::Start => offset % (data.len() + 1),
            Anchor::Frame(n) => {
                let starts = frame_starts(data);
                let start = if starts.is_empty() {
                    SEGMENT_HEADER_LEN
                } else {
                    starts[usize::from(n) % starts.len()]
                };
                start + offset % 64
            }
            Anchor::DataEnd => {
                let data_end = data.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
                data_end.saturating_sub(offset % 256)
            }
            Anchor::FileEnd => data.len() - offset % (data.len() + 1),
        };
        at.min(data.len())
    }
}

#[derive(Debug, Arbitrary)]
enum DamageOp {
    /// XOR `len` bytes with non-zero PRNG bytes.
    Flip {
        file: u8,
        at: Position,
        len: u8,
        seed: u64,
    },
    Zero {
        file: u8,
        at: Position,
        len: u16,
    },
    Truncate {
        file: u8,
        at: Position,
    },
    AppendGarbage {
        file: u8,
        len: u8,
        seed: u64,
    },
    /// Delete a segment file (applied before the byte damage).
    Remove {
        file: u8,
    },
}

/// splitmix64: damage bytes the fuzzer cannot steer into a valid crc (see the module docs).
struct Prng(u64);

impl Prng {
    fn byte(&mut self) -> u8 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) as u8
    }
}

/// The last entry index after `records`, folded the way the log does.
fn last_index(records: &[Record]) -> Option<LogIndex> {
    records.iter().fold(None, |last, r| match r {
        Record::Entry { index, .. } => Some(*index),
        Record::Truncate { from } => from.0.checked_sub(1).map(LogIndex),
        Record::State(_) => last,
    })
}

fn next_index(records: &[Record]) -> LogIndex {
    last_index(records).map_or(LogIndex(1), LogIndex::next)
}

fn latest_state(records: &[Record]) -> Option<&Bytes> {
    records.iter().rev().find_map(|r| match r {
        Record::State(s) => Some(s),
        _ => None,
    })
}

/// The ends `m` of every way `replayed` is `appended[k..m]`, possibly after one carried state
/// that was the latest state of `appended[..k]`: what a log replays after its oldest segments
/// were released (and, when damaged, its newest ones deleted or cut).
fn window_ends<'a>(replayed: &'a [Record], appended: &'a [Record]) -> impl Iterator<Item = usize> + 'a {
    let starts = |rest: &[Record], part: &[Record]| part.len() <= rest.len() && rest[..part.len()] == *part;
    (0..=appended.len()).filter_map(move |k| {
        let rest = &appended[k..];
        if starts(rest, replayed) {
            return Some(k + replayed.len());
        }
        match replayed.split_first() {
            Some((Record::State(s), tail)) if latest_state(&appended[..k]) == Some(s) && starts(rest, tail) => {
                Some(k + tail.len())
            }
            _ => None,
        }
    })
}

fn is_window(replayed: &[Record], appended: &[Record], to_end: bool) -> bool {
    window_ends(replayed, appended).any(|m| !to_end || m == appended.len())
}

/// A deterministic choice from (seed, path, n), whatever order SimFs asks in.
fn choose(seed: u64, path: &Path, n: u64) -> u64 {
    let mut h = seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for b in path.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01B3);
    }
    let mut prng = Prng(h);
    (0..8).fold(0u64, |acc, _| acc << 8 | u64::from(prng.byte()))
}

/// What the test knows about the log being built.
#[derive(Debug, Default)]
struct Model {
    /// Every record accepted since the log was last opened, preceded by what that open replayed.
    appended: Vec<Record>,
    /// How many of `appended` were acknowledged durable (a crash must keep at least these).
    durable: usize,
    /// Whether segments were released since the log was last opened: then it replays a suffix.
    released: bool,
}

/// Opens the log being built and checks what it replays against the model; after a crash, a
/// prefix holding everything acknowledged durable.
fn reopen(fs: &SimFs, cfg: &Config, model: &mut Model, crashed: bool) -> Wal {
    let mut replay = Wal::open_with(Arc::new(fs.clone()), DIR, cfg.clone()).expect("open the log being built");
    let records: Vec<Record> = replay
        .by_ref()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("replay of the log being built failed (crashed: {crashed}): {e}"));
    let appended = &model.appended;
    if crashed {
        assert!(
            window_ends(&records, appended).any(|m| m >= model.durable && (model.released || m == records.len())),
            "after a crash, replayed {records:?}\nappended {appended:?}\n{} acknowledged durable",
            model.durable
        );
    } else if model.released {
        assert!(
            is_window(&records, appended, true),
            "reopen replayed {records:?}\nappended {appended:?}"
        );
    } else {
        assert_eq!(&records, appended, "reopen replayed something else than was appended");
    }
    // From here on, the log is what it replayed.
    model.durable = records.len();
    model.appended = records;
    model.released = false;
    replay.finish().expect("finish the log being built")
}

/// Writes the log, waiting on every ticket; returns what it knows about it.
fn build_log(fs: &SimFs, segment_size: u64, ops: &[BuildOp], rounds: u8) -> Model {
    let cfg = config(segment_size, RecoveryMode::TolerateTornTail);
    let mut model = Model::default();
    let mut wal = reopen(fs, &cfg, &mut model, false);
    let durability = |durable: bool| {
        if durable {
            Durability::Durable
        } else {
            Durability::Buffered
        }
    };
    let count = (ops.len() * (1 + usize::from(rounds % 4))).min(MAX_OPS);
    for op in ops.iter().cycle().take(count) {
        let next = next_index(&model.appended);
        let last = last_index(&model.appended).map_or(0, |l| l.0);
        let (accepted, durable): (Vec<Record>, bool) = match op {
            BuildOp::AppendNext { payload, more, durable } => {
                let first = payload.bytes();
                let payloads: Vec<Bytes> = (0..1 + usize::from(*more) % MAX_BATCH)
                    .map(|i| first.iter().map(|b| b.wrapping_add(i as u8)).collect())
                    .collect();
                let done = wal
                    .append_next(payloads.clone(), durability(*durable))
                    .and_then(|t| t.wait())
                    .expect("append_next");
                let records: Vec<Record> = payloads
                    .into_iter()
                    .enumerate()
                    .map(|(i, payload)| Record::Entry {
                        index: LogIndex(next.0 + i as u64),
                        payload,
                    })
                    .collect();
                let expected_first = (!records.is_empty()).then_some(next);
                assert_eq!(
                    done.first_index, expected_first,
                    "append_next assigned an unexpected index"
                );
                let expected_last = last_index(&records).or(last_index(&model.appended));
                assert_eq!(done.last_index, expected_last, "append_next reported last index");
                (records, *durable)
            }
            BuildOp::Append { items, durable } => {
                let mut expect_next = next;
                let records: Vec<Record> = items
                    .iter()
                    .take(MAX_BATCH)
                    .map(|item| match item {
                        Item::Entry { skew, payload } => {
                            let skew = if *skew < 224 { 0 } else { u64::from(*skew - 223) };
                            let r = Record::Entry {
                                index: LogIndex(expect_next.0 + skew),
                                payload: payload.bytes(),
                            };
                            expect_next = expect_next.next();
                            r
                        }
                        Item::State(payload) => Record::State(payload.bytes()),
                        Item::Truncate { back } => {
                            let from = LogIndex(expect_next.0.saturating_sub(u64::from(*back)));
                            expect_next = from;
                            Record::Truncate { from }
                        }
                    })
                    .collect();
                match wal.append(records.clone(), durability(*durable)).map(|t| t.wait()) {
                    Ok(Ok(_)) => (records, *durable),
                    _ => (Vec::new(), false),
                }
            }
            BuildOp::State { payload, durable } => {
                let record = Record::State(payload.bytes());
                wal.append(vec![record.clone()], durability(*durable))
                    .and_then(|t| t.wait())
                    .expect("append state");
                (vec![record], *durable)
            }
            BuildOp::TruncateSuffix { back } => {
                let from = LogIndex((last + 1).saturating_sub(u64::from(*back)));
                match wal.truncate_suffix(from).map(|t| t.wait()) {
                    Ok(Ok(_)) => (vec![Record::Truncate { from }], true),
                    _ => (Vec::new(), false),
                }
            }
            BuildOp::Sync => {
                wal.sync().and_then(|t| t.wait()).expect("sync");
                (Vec::new(), true)
            }
            BuildOp::ReleaseBefore { back } => {
                let below = LogIndex((last + 1).saturating_sub(u64::from(*back % 16)));
                model.released |= wal.release_before(below).expect("release") > 0;
                (Vec::new(), false)
            }
            BuildOp::Reopen => {
                drop(wal);
                wal = reopen(fs, &cfg, &mut model, false);
                (Vec::new(), false)
            }
            BuildOp::Crash { sectors, seed } => {
                // Power loss with the log open; its handles die, so drop it and recover.
                if *sectors {
                    fs.crash_sectors(|path, sector| choose(*seed, path, sector) & 1 == 0);
                } else {
                    fs.crash_tearing(|path, dirty| choose(*seed, path, 0) % (dirty + 1));
                }
                drop(wal);
                wal = reopen(fs, &cfg, &mut model, true);
                (Vec::new(), false)
            }
        };
        model.appended.extend(accepted);
        if durable {
            model.durable = model.appended.len();
        }
    }
    drop(wal);
    model
}

fn segment_files(files: &[(String, Vec<u8>)]) -> Vec<usize> {
    (0..files.len())
        .filter(|i| parse_segment_name(&files[*i].0).is_some())
        .collect()
}

fn damage(files: &mut Vec<(String, Vec<u8>)>, op: &DamageOp) {
    let segments = segment_files(files);
    if segments.is_empty() {
        return;
    }
    let pick = |file: u8| segments[usize::from(file) % segments.len()];
    match op {
        DamageOp::Flip { file, at, len, seed } => {
            let data = &mut files[pick(*file)].1;
            let start = at.resolve(data);
            let end = (start + usize::from(*len).max(1)).min(data.len());
            let mut prng = Prng(*seed);
            for b in &mut data[start..end] {
                *b ^= prng.byte().max(1);
            }
        }
        DamageOp::Zero { file, at, len } => {
            let data = &mut files[pick(*file)].1;
            let start = at.resolve(data);
            let end = (start + usize::from(*len % 2048).max(1)).min(data.len());
            data[start..end].fill(0);
        }
        DamageOp::Truncate { file, at } => {
            let data = &mut files[pick(*file)].1;
            let at = at.resolve(data);
            data.truncate(at);
        }
        DamageOp::AppendGarbage { file, len, seed } => {
            let data = &mut files[pick(*file)].1;
            let mut prng = Prng(*seed);
            data.extend((0..usize::from(*len).max(1)).map(|_| prng.byte()));
        }
        DamageOp::Remove { file } => {
            files.remove(pick(*file));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Checks shared by both modes

fn snapshot(fs: &SimFs) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(DIR);
    fs.file_names(dir)
        .into_iter()
        .filter_map(|name| {
            let bytes = fs.read_file(&dir.join(&name))?;
            Some((name, bytes))
        })
        .collect()
}

fn restore(files: &[(String, Vec<u8>)]) -> SimFs {
    let fs = SimFs::new();
    for (name, bytes) in files {
        fs.write_file(&PathBuf::from(DIR).join(name), bytes);
    }
    fs
}

struct Opened {
    records: Vec<Record>,
    error: Option<Error>,
    /// The replay, if the log opened; drop it before opening the directory again.
    replay: Option<Replay>,
}

fn open(fs: &SimFs, cfg: Config) -> Opened {
    match Wal::open_with(Arc::new(fs.clone()), DIR, cfg) {
        Err(e) => Opened {
            records: Vec::new(),
            error: Some(e),
            replay: None,
        },
        Ok(mut replay) => {
            let mut records = Vec::new();
            let mut error = None;
            for r in replay.by_ref() {
                match r {
                    Ok(r) => records.push(r),
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            Opened {
                records,
                error,
                replay: Some(replay),
            }
        }
    }
}

/// Runs every mode-independent check on `files`; returns what the tolerant open yielded, if it
/// succeeded.
fn check_recovery(files: &[(String, Vec<u8>)], segment_size: u64) -> (Vec<Record>, Option<Error>) {
    let tolerant_cfg = config(segment_size, RecoveryMode::TolerateTornTail);
    let strict_cfg = config(segment_size, RecoveryMode::Strict);

    // Strict, on its own copy.
    let strict = open(&restore(files), strict_cfg.clone());

    // Tolerant: replay, repair, then replay again and append.
    let fs = restore(files);
    let mut first = open(&fs, tolerant_cfg.clone());
    let tolerant_records = first.records.clone();
    let tolerant_error = first.error.take();

    assert!(
        strict.records.len() <= tolerant_records.len(),
        "strict open yielded more records ({}) than tolerant ({})",
        strict.records.len(),
        tolerant_records.len()
    );
    assert_eq!(
        strict.records, tolerant_records,
        "strict and tolerant opens yielded different records (strict error: {:?}, tolerant error: {:?})",
        strict.error, tolerant_error
    );
    if let Some(e) = &tolerant_error {
        assert_eq!(
            strict.error.as_ref().map(ToString::to_string),
            Some(e.to_string()),
            "tolerant open failed but strict did not fail the same way"
        );
    }
    if tolerant_error.is_none() {
        assert!(
            matches!(strict.error, None | Some(Error::TornTail { .. })),
            "tolerant open succeeded but strict failed with more than a torn tail: {:?}",
            strict.error
        );
    }
    drop(strict);

    if tolerant_error.is_none() {
        let replay = first.replay.take().expect("a replay without error");
        let wal = replay.finish().expect("finish after a successful tolerant replay");
        drop(wal);

        let mut second = open(&fs, tolerant_cfg.clone());
        assert!(second.error.is_none(), "second open failed: {:?}", second.error);
        assert_eq!(
            second.records, tolerant_records,
            "second open replayed different records"
        );

        // The repaired log continues where the replay ended.
        let wal = second.replay.take().expect("replay").finish().expect("second finish");
        let marker = Bytes::from_static(b"fuzz marker");
        let done = wal
            .append_next(vec![marker.clone()], Durability::Durable)
            .and_then(|t| t.wait())
            .expect("append after recovery");
        let index = next_index(&tolerant_records);
        assert_eq!(
            done.first_index,
            Some(index),
            "append after recovery got an unexpected index"
        );
        drop(wal);
        let third = open(&fs, strict_cfg.clone());
        assert!(third.error.is_none(), "open after appending failed: {:?}", third.error);
        let mut expected = tolerant_records.clone();
        expected.push(Record::Entry { index, payload: marker });
        assert_eq!(
            third.records, expected,
            "the entry appended after recovery did not replay"
        );
    }
    drop(first);

    // Explicit repair, on its own copy.
    let fs = restore(files);
    if let Ok(report) = repair_with(Arc::new(fs.clone()), Path::new(DIR), strict_cfg.clone()) {
        let after = open(&fs, strict_cfg.clone());
        assert!(
            after.error.is_none(),
            "strict open after repair ({report:?}) failed: {:?}",
            after.error
        );
        assert_eq!(
            after.records, tolerant_records,
            "repair kept different records ({report:?})"
        );
        drop(after);
        let again = repair_with(Arc::new(fs.clone()), Path::new(DIR), strict_cfg).expect("second repair");
        assert!(
            again.truncated.is_none() && again.set_aside.is_empty(),
            "second repair still found damage: {again:?} (first: {report:?})"
        );
    }

    (tolerant_records, tolerant_error)
}

fn run_damage(input: &DamageInput) {
    let segment_size = pick_segment_size(input.segment_size);
    let fs = SimFs::new();
    let Model { appended, released, .. } = build_log(&fs, segment_size, &input.ops, input.rounds);
    let mut files = snapshot(&fs);
    drop(fs);

    let damage_ops: Vec<&DamageOp> = input.damage.iter().take(MAX_DAMAGE).collect();
    let mut removed = false;
    for op in damage_ops.iter().filter(|op| matches!(op, DamageOp::Remove { .. })) {
        removed |= !segment_files(&files).is_empty();
        damage(&mut files, op);
    }

    // What the undamaged files replay.
    let baseline = open(&restore(&files), config(segment_size, RecoveryMode::Strict));
    if !removed {
        assert!(
            baseline.error.is_none(),
            "a clean log failed to open: {:?}",
            baseline.error
        );
    }
    if baseline.error.is_none() {
        if released || removed {
            assert!(
                is_window(&baseline.records, &appended, !removed),
                "clean log replayed {:?}\nappended {appended:?}",
                baseline.records
            );
        } else {
            assert_eq!(
                baseline.records, appended,
                "clean log replayed something else than was appended"
            );
        }
    }

    let mut flipped = false;
    for op in damage_ops.iter().filter(|op| !matches!(op, DamageOp::Remove { .. })) {
        flipped = true;
        damage(&mut files, op);
    }

    let (records, error) = check_recovery(&files, segment_size);
    if baseline.error.is_none() {
        assert!(
            records.len() <= baseline.records.len() && records[..] == baseline.records[..records.len()],
            "recovery yielded records that are not a prefix of the log (error {error:?})\nrecovered {records:?}\nlog {:?}",
            baseline.records
        );
        if !flipped {
            assert!(error.is_none(), "an undamaged log failed to open: {error:?}");
            assert_eq!(records.len(), baseline.records.len(), "an undamaged log lost records");
        }
    }
}

fn run_raw(input: &RawInput) {
    let fs = build_raw(input);
    let files = snapshot(&fs);
    drop(fs);
    check_recovery(&files, pick_segment_size(input.segment_size));
}

fuzz_target!(|input: Input| {
    match &input {
        Input::Raw(raw) => run_raw(raw),
        Input::Damage(d) => run_damage(d),
    }
});
