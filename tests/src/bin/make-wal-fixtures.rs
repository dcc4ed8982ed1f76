//! `make-wal-fixtures <out-dir>`: regenerates the damaged-log fixtures of `tests/wal_fixtures.rs`.
//!
//! ```text
//! cargo run -p cairn-tests --bin make-wal-fixtures -- tests/fixtures/wal
//! ```
//!
//! Each fixture is written by the real log (512-byte segments, one durable append per record),
//! closed cleanly, then damaged by hand; `<out-dir>/torn` and `<out-dir>/corrupt` are replaced.
//! The output is deterministic: the same log code writes the same bytes. It prints the layout
//! of every frame, the segment names and offsets that `tests/wal_fixtures.rs` and
//! `tests/fixtures/wal/README.md` cite. The fixtures are committed so that a change to the
//! format or to recovery that stops reading old logs the same way fails the tests; rerun this
//! only when such a change is intended, and update the test and the README with it.
//!
//! - `torn/`: a state, entries 1..=10, a second state, entries 11..=20 ("entry-<i>"), over two
//!   segments. The payload of the last frame (entry 20) and its padding are zeroed: the end of
//!   the last write never reached the disk.
//! - `corrupt/`: a state and entries 1..=30 over three segments. One bit of entry 5's payload,
//!   in the first segment, is flipped: bit rot well before the tail.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cairn_wal::{decode_frame, Config, Durability, Record, SegmentHeader, Wal, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out] = args.as_slice() else {
        eprintln!("usage: make-wal-fixtures <out-dir>");
        return ExitCode::from(2);
    };
    match run(Path::new(out)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("make-wal-fixtures: {e}");
            ExitCode::FAILURE
        }
    }
}

fn config() -> Config {
    Config {
        segment_size: Config::MIN_SEGMENT_SIZE,
        ..Config::default()
    }
}

use cairn_tests::fixtures::{entry, state};

fn run(out: &Path) -> Result<()> {
    let mut torn = vec![state("hard-state term=1 vote=1 commit=0")];
    torn.extend((1..=10).map(entry));
    torn.push(state("hard-state term=2 vote=3 commit=10"));
    torn.extend((11..=20).map(entry));
    let dir = write_log(&out.join("torn"), &torn)?;
    let frames = layout(&dir)?;
    let last = frames.last().ok_or("torn: no frames")?;
    // Zero the payload and padding of the last frame (entry 20), keeping its header.
    let start = last.offset as usize + FRAME_HEADER_LEN;
    let end = (last.offset + last.len) as usize;
    damage(&last.segment, |bytes| bytes[start..end].fill(0))?;
    println!("torn: zeroed bytes {start}..{end} of {}", last.segment.display());

    let mut corrupt = vec![state("hard-state term=1 vote=1 commit=0")];
    corrupt.extend((1..=30).map(entry));
    let dir = write_log(&out.join("corrupt"), &corrupt)?;
    let frames = layout(&dir)?;
    let victim = frames
        .iter()
        .find(|f| f.index == 5 && f.kind == 1)
        .ok_or("corrupt: no entry 5")?;
    // Flip the low bit of the payload's first byte: "entry-5" becomes "dntry-5".
    let at = victim.offset as usize + FRAME_HEADER_LEN;
    damage(&victim.segment, |bytes| bytes[at] ^= 0x01)?;
    println!("corrupt: flipped bit 0 of byte {at} of {}", victim.segment.display());
    Ok(())
}

/// Writes `records` into a fresh log at `dir` and closes it, leaving only the segment files.
fn write_log(dir: &Path, records: &[Record]) -> Result<PathBuf> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let wal = Wal::open(dir, config())?.finish()?;
    for record in records {
        wal.append(vec![record.clone()], Durability::Durable)?.wait()?;
    }
    wal.close()?;
    // The lock file is recreated by every open; nothing else but segments may be left.
    std::fs::remove_file(dir.join("LOCK"))?;
    for name in std::fs::read_dir(dir)? {
        let name = name?.file_name();
        if !name.to_string_lossy().ends_with(".wal") {
            return Err(format!("unexpected file {name:?} in {}", dir.display()).into());
        }
    }
    Ok(dir.to_path_buf())
}

struct FrameAt {
    segment: PathBuf,
    offset: u64,
    len: u64,
    kind: u8,
    index: u64,
}

/// Decodes and prints every frame of the (still undamaged) log in `dir`.
fn layout(dir: &Path) -> Result<Vec<FrameAt>> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    names.sort();
    let mut frames = Vec::new();
    for path in names {
        let bytes = std::fs::read(&path)?;
        let header = SegmentHeader::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        println!("{name}: {} bytes, crc seed {:#010x}", bytes.len(), header.crc_seed);
        let (mut offset, mut seed) = (SEGMENT_HEADER_LEN, header.crc_seed);
        while let Ok((frame, used)) = decode_frame(&bytes[offset..], seed) {
            let kind = bytes[offset + 8];
            let payload = String::from_utf8_lossy(frame.payload);
            println!(
                "  offset {offset:4}  len {used:3}  type {kind}  index {:2}  {payload:?}",
                frame.index
            );
            frames.push(FrameAt {
                segment: path.clone(),
                offset: offset as u64,
                len: used as u64,
                kind,
                index: frame.index,
            });
            seed = frame.crc;
            offset += used;
        }
    }
    Ok(frames)
}

fn damage(path: &Path, f: impl FnOnce(&mut Vec<u8>)) -> Result<()> {
    let mut bytes = std::fs::read(path)?;
    f(&mut bytes);
    std::fs::write(path, bytes)?;
    Ok(())
}
