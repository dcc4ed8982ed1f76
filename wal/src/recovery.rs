//! Opening a log: listing its segments, replaying their records, and repairing a torn tail.
//!
//! Replay walks the segments in sequence order and decodes frames one by one, checking each
//! frame's crc against the chain. Where a frame fails to decode, the damage is classified:
//!
//! - in a segment that is not the last one, it is corruption: every segment is fdatasynced
//!   before the next one is created, so a crash cannot have damaged it;
//! - in the last segment, it is a torn tail (a crash while writing the last batch) when the
//!   frame runs past the end of the file, when nothing but zeros follows the damaged frame, or
//!   when the damaged frame holds an all-zero run that reaches a sector's end (a lost sector of
//!   a preallocated, zero-filled file); otherwise it is corruption.
//!
//! A torn tail is truncated (in [`RecoveryMode::TolerateTornTail`]) after the segment is copied
//! to `<name>.broken`; corruption is an error naming the segment and offset. Recovery never
//! yields a record that failed its check and never skips one to go on.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::config::{Config, RecoveryMode};
use crate::error::{CorruptionReason, Error, FrameError, Result};
use crate::frame::{claimed_extent, decode_frame, is_zero_header, FrameKind};
use crate::fs::{DirLock, FileSystem, WalFile};
use crate::segment::{is_tmp_name, parse_segment_name, SegmentHeader, BROKEN_SUFFIX, HEADER_LEN};
use crate::types::{LogIndex, Record};
use crate::wal::Wal;
use crate::writer::{LogTracker, SegmentMeta, WriterInit};

/// Where replay stopped in the last segment because of a torn tail.
#[derive(Debug, Clone)]
struct Damage {
    segment: usize,
    offset: u64,
    reason: FrameError,
}

#[derive(Debug)]
struct Loaded {
    segment: usize,
    bytes: Bytes,
    pos: usize,
}

/// A log being opened: an iterator over its records, in order. Appending is possible once it
/// is turned into a [`Wal`] with [`Replay::finish`].
#[derive(Debug)]
pub struct Replay {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    config: Config,
    lock: Box<dyn DirLock>,
    segments: Vec<SegmentMeta>,
    next_segment: usize,
    loaded: Option<Loaded>,
    /// The stored crc of the last good frame, or the current segment's seed.
    prev_crc: u32,
    tracker: LogTracker,
    /// Whether a state record has been yielded; carried copies are yielded only before that.
    state_yielded: bool,
    /// Where the valid data of the last segment ends.
    end_offset: u64,
    damage: Option<Damage>,
    done: bool,
    /// A copy of the error replay stopped at: `finish` refuses to append after it.
    failed: Option<Error>,
}

/// What [`repair`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairReport {
    /// The segment that was truncated and the offset it was truncated at.
    pub truncated: Option<(PathBuf, u64)>,
    /// Segments after the damage that were set aside as `.broken`.
    pub set_aside: Vec<PathBuf>,
}

fn list_segments(fs: &dyn FileSystem, dir: &Path) -> Result<Vec<SegmentMeta>> {
    let mut segments = Vec::new();
    for name in fs.list(dir).map_err(Error::io("list wal dir"))? {
        if is_tmp_name(&name) {
            // A preallocated segment never put in use; it holds no records.
            fs.remove(&dir.join(&name)).map_err(Error::io("remove tmp segment"))?;
        } else if let Some((seq, first_index)) = parse_segment_name(&name) {
            segments.push(SegmentMeta {
                seq,
                first_index,
                path: dir.join(name),
                max_entry: None,
            });
        }
    }
    segments.sort_by_key(|s| s.seq);
    for pair in segments.windows(2) {
        if let [a, b] = pair {
            if a.seq.0.checked_add(1) != Some(b.seq.0) {
                return Err(Error::Corruption {
                    segment: b.path.clone(),
                    offset: 0,
                    reason: CorruptionReason::SequenceGap {
                        expected: a.seq.0.saturating_add(1),
                        found: b.seq.0,
                    },
                });
            }
        }
    }
    Ok(segments)
}

/// Creates `dir` and any missing ancestors, syncing each new entry's parent so a crash cannot
/// take the directory (and the log in it) away after it was acknowledged.
fn create_dir_durably(fs: &dyn FileSystem, dir: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut cur = dir;
    while fs.list(cur).is_err() {
        missing.push(cur);
        match cur.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => cur = parent,
            _ => break,
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    fs.create_dir_all(dir)?;
    for created in missing.iter().rev() {
        let parent = created
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        fs.sync_dir(parent)?;
    }
    Ok(())
}

impl Replay {
    pub(crate) fn open(fs: Arc<dyn FileSystem>, dir: PathBuf, config: Config) -> Result<Replay> {
        config.validate()?;
        create_dir_durably(fs.as_ref(), &dir).map_err(Error::io("create wal dir"))?;
        let lock = fs.lock_dir(&dir).map_err(|source| Error::Locked {
            dir: dir.clone(),
            source,
        })?;
        let segments = list_segments(fs.as_ref(), &dir)?;
        Ok(Replay {
            fs,
            dir,
            config,
            lock,
            segments,
            next_segment: 0,
            loaded: None,
            prev_crc: 0,
            tracker: LogTracker::default(),
            state_yielded: false,
            end_offset: HEADER_LEN as u64,
            damage: None,
            done: false,
            failed: None,
        })
    }

    fn corruption(&self, segment: usize, offset: u64, reason: CorruptionReason) -> Error {
        Error::Corruption {
            segment: self.segments.get(segment).map(|s| s.path.clone()).unwrap_or_default(),
            offset,
            reason,
        }
    }

    fn load(&mut self, segment: usize) -> Result<Loaded> {
        let meta = self.segments.get(segment).ok_or(Error::Closed)?;
        let file = self.fs.open(&meta.path).map_err(Error::io("open segment"))?;
        let bytes = Bytes::from(file.read_all().map_err(Error::io("read segment"))?);
        let header = SegmentHeader::decode(&bytes).map_err(|r| self.corruption(segment, 0, r))?;
        if header.seq != meta.seq || header.first_index != meta.first_index {
            return Err(self.corruption(segment, 0, CorruptionReason::Header("header does not match file name")));
        }
        if segment > 0 && header.crc_seed != self.prev_crc {
            return Err(self.corruption(
                segment,
                0,
                CorruptionReason::ChainBroken {
                    seed: header.crc_seed,
                    expected: self.prev_crc,
                },
            ));
        }
        self.prev_crc = header.crc_seed;
        Ok(Loaded {
            segment,
            bytes,
            pos: HEADER_LEN,
        })
    }

    /// Decodes the next record; `Ok(None)` at the end of the log.
    fn step(&mut self) -> Result<Option<Record>> {
        loop {
            let loaded = match self.loaded.take() {
                Some(l) => l,
                None => {
                    if self.next_segment >= self.segments.len() {
                        return Ok(None);
                    }
                    let l = self.load(self.next_segment)?;
                    self.next_segment += 1;
                    l
                }
            };
            let is_last = loaded.segment + 1 == self.segments.len();
            let rest = loaded.bytes.get(loaded.pos..).unwrap_or_default();
            if rest.is_empty() || (is_zero_header(rest) && rest.iter().all(|b| *b == 0)) {
                // The clean end of this segment.
                self.end_offset = loaded.pos as u64;
                continue;
            }
            let (kind, index, crc, payload_len, used) = match decode_frame(rest, self.prev_crc) {
                Ok((f, used)) => (f.kind, f.index, f.crc, f.payload.len(), used),
                Err(reason) => {
                    let offset = loaded.pos as u64;
                    self.end_offset = offset;
                    if !is_last {
                        let reason = if is_zero_header(rest) {
                            CorruptionReason::DataAfterEnd
                        } else {
                            CorruptionReason::Frame(reason)
                        };
                        return Err(self.corruption(loaded.segment, offset, reason));
                    }
                    if !is_torn(rest, loaded.pos) {
                        return Err(self.corruption(loaded.segment, offset, CorruptionReason::Frame(reason)));
                    }
                    if self.config.recovery == RecoveryMode::Strict {
                        return Err(Error::TornTail {
                            segment: self
                                .segments
                                .get(loaded.segment)
                                .map(|s| s.path.clone())
                                .unwrap_or_default(),
                            offset,
                            reason,
                        });
                    }
                    self.damage = Some(Damage {
                        segment: loaded.segment,
                        offset,
                        reason,
                    });
                    return Ok(None);
                }
            };
            self.prev_crc = crc;
            let start = loaded.pos + crate::frame::FRAME_HEADER_LEN;
            let payload = loaded.bytes.slice(start..start + payload_len);
            let segment = loaded.segment;
            self.loaded = Some(Loaded {
                pos: loaded.pos + used,
                ..loaded
            });
            let record = match kind {
                FrameKind::Entry => Record::Entry {
                    index: LogIndex(index),
                    payload,
                },
                FrameKind::State => Record::State(payload),
                FrameKind::Truncate => Record::Truncate { from: LogIndex(index) },
                FrameKind::CarriedState => {
                    self.tracker
                        .apply(&Record::State(payload.clone()), self.segments.get_mut(segment));
                    if self.state_yielded {
                        continue;
                    }
                    Record::State(payload)
                }
            };
            self.tracker.apply(&record, self.segments.get_mut(segment));
            if matches!(record, Record::State(_)) {
                self.state_yielded = true;
            }
            return Ok(Some(record));
        }
    }

    /// Consumes whatever was not yet replayed, repairs a torn tail, and starts the writer.
    pub fn finish(mut self) -> Result<Wal> {
        for record in self.by_ref() {
            record?;
        }
        if let Some(err) = self.failed.take() {
            return Err(err);
        }
        if let Some(damage) = self.damage.take() {
            let meta = self.segments.get(damage.segment).ok_or(Error::Closed)?;
            tracing::warn!(
                segment = %meta.path.display(),
                offset = damage.offset,
                reason = %damage.reason,
                "truncating torn wal tail"
            );
            truncate_segment(self.fs.as_ref(), &meta.path, damage.offset, self.config.segment_size)?;
        }
        let (file, segments, end_offset) = if self.segments.is_empty() {
            (None, Vec::new(), HEADER_LEN as u64)
        } else {
            let last = self.segments.last().ok_or(Error::Closed)?;
            let file: Arc<dyn WalFile> = self.fs.open(&last.path).map_err(Error::io("open segment"))?.into();
            (Some(file), std::mem::take(&mut self.segments), self.end_offset)
        };
        Wal::start(WriterInit {
            fs: self.fs,
            dir: self.dir,
            config: self.config,
            lock: self.lock,
            file,
            segments,
            offset: end_offset,
            last_crc: self.prev_crc,
            tracker: self.tracker,
        })
    }
}

impl Iterator for Replay {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        if self.done {
            return None;
        }
        match self.step() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                self.failed = Some(e.duplicate());
                Some(Err(e))
            }
        }
    }
}

/// The smallest unit a device writes: a write lost in a crash leaves whole sectors zeroed
/// (or old). 512 bytes, the smallest any disk has, so a lost sector is never missed.
pub(crate) const SECTOR: usize = 512;

/// Whether damage at absolute offset `at` of the last segment, with `rest` the bytes from there
/// to the end of the file, is a torn tail rather than corruption (see the module docs).
fn is_torn(rest: &[u8], at: usize) -> bool {
    let extent = claimed_extent(rest);
    if extent >= rest.len() {
        return true; // the frame runs to or past the end of the file
    }
    if rest.get(extent..).is_none_or(|after| after.iter().all(|b| *b == 0)) {
        return true; // nothing was written after the damaged frame
    }
    // A lost sector: an all-zero run starting inside the damaged frame and reaching the end of
    // its sector (or of the file).
    let mut chunk_start = 0usize;
    while chunk_start < extent.max(1) {
        let abs = at + chunk_start;
        let chunk_end = ((abs / SECTOR + 1) * SECTOR - at).min(rest.len());
        if rest
            .get(chunk_start..chunk_end)
            .is_some_and(|c| !c.is_empty() && c.iter().all(|b| *b == 0))
        {
            return true;
        }
        chunk_start = chunk_end;
    }
    false
}

/// A name to keep a damaged segment under: `<path>.broken`, or `<path>.broken.N` when earlier
/// copies exist, so evidence from an earlier repair is never overwritten.
fn broken_path(fs: &dyn FileSystem, path: &Path) -> PathBuf {
    let taken: Vec<String> = path.parent().and_then(|dir| fs.list(dir).ok()).unwrap_or_default();
    let base = format!("{}{BROKEN_SUFFIX}", path.display());
    let candidate = |n: u32| if n == 0 { base.clone() } else { format!("{base}.{n}") };
    let is_free = |c: &String| {
        let name = Path::new(c).file_name().and_then(|n| n.to_str()).unwrap_or_default();
        !taken.iter().any(|t| t == name)
    };
    let free = (0u32..).map(candidate).find(is_free).unwrap_or_else(|| candidate(0));
    PathBuf::from(free)
}

/// Copies the segment at `path` aside (see [`broken_path`]), then cuts it at `offset` and
/// restores its zero-filled preallocation.
fn truncate_segment(fs: &dyn FileSystem, path: &Path, offset: u64, segment_size: u64) -> Result<()> {
    let file = fs.open(path).map_err(Error::io("open segment"))?;
    let bytes = file.read_all().map_err(Error::io("read segment"))?;
    let keep_len = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    let broken = fs
        .create(&broken_path(fs, path))
        .map_err(Error::io("create .broken copy"))?;
    broken
        .write_all_at(bytes.get(..keep_len).unwrap_or_default(), 0)
        .map_err(Error::io("write .broken copy"))?;
    broken.sync_data().map_err(Error::io("sync .broken copy"))?;
    file.set_len(offset).map_err(Error::io("truncate segment"))?;
    file.preallocate(segment_size.max(offset))
        .map_err(Error::io("preallocate segment"))?;
    file.sync_data().map_err(Error::io("sync truncated segment"))?;
    if let Some(dir) = path.parent() {
        fs.sync_dir(dir).map_err(Error::io("sync wal dir"))?;
    }
    Ok(())
}

/// Repairs a log that does not open: truncates it at its first damaged record, torn or
/// corrupt, and sets aside every later segment.
///
/// Each affected segment is kept as `<name>.broken` first. Records after the damage are lost;
/// in a replicated group the leader sends them again. Returns what was done, or an empty report
/// for a healthy log.
pub fn repair_with(fs: Arc<dyn FileSystem>, dir: &Path, config: Config) -> Result<RepairReport> {
    let config = Config {
        recovery: RecoveryMode::Strict,
        ..config
    };
    let mut replay = Replay::open(fs.clone(), dir.to_path_buf(), config.clone())?;
    let mut failure = None;
    for record in replay.by_ref() {
        if let Err(e) = record {
            failure = Some(e);
            break;
        }
    }
    let (segment, offset) = match failure {
        None => {
            return Ok(RepairReport {
                truncated: None,
                set_aside: Vec::new(),
            })
        }
        Some(Error::TornTail { segment, offset, .. }) => (segment, offset),
        Some(Error::Corruption { segment, offset, .. }) => (segment, offset),
        Some(other) => return Err(other),
    };
    let position = replay
        .segments
        .iter()
        .position(|s| s.path == segment)
        .ok_or_else(|| Error::Corruption {
            segment: segment.clone(),
            offset,
            reason: CorruptionReason::Header("segment vanished during repair"),
        })?;
    let later: Vec<SegmentMeta> = replay.segments.split_off(position + 1);
    drop(replay);
    let mut set_aside = Vec::new();
    // Newest first, each rename synced, so a crash leaves a contiguous run of segments.
    for meta in later.iter().rev() {
        let to = broken_path(fs.as_ref(), &meta.path);
        fs.rename(&meta.path, &to).map_err(Error::io("set segment aside"))?;
        fs.sync_dir(dir).map_err(Error::io("sync wal dir"))?;
        set_aside.push(meta.path.clone());
    }
    if offset == 0 {
        // A bad header: nothing in the segment can be trusted, so it goes aside whole (a log
        // left without segments starts afresh on the next open).
        let to = broken_path(fs.as_ref(), &segment);
        fs.rename(&segment, &to).map_err(Error::io("set segment aside"))?;
        fs.sync_dir(dir).map_err(Error::io("sync wal dir"))?;
        set_aside.push(segment);
        return Ok(RepairReport {
            truncated: None,
            set_aside,
        });
    }
    truncate_segment(fs.as_ref(), &segment, offset, config.segment_size)?;
    Ok(RepairReport {
        truncated: Some((segment, offset)),
        set_aside,
    })
}

/// [`repair_with`] on the operating system's file system.
pub fn repair(dir: impl AsRef<Path>, config: Config) -> Result<RepairReport> {
    repair_with(Arc::new(crate::fs::StdFs), dir.as_ref(), config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::SegmentSeq;

    #[test]
    fn torn_classification() {
        // Table of (description, bytes from the damaged frame on, absolute offset, torn?).
        let mut frame_then_zeros = vec![0u8; 2048];
        frame_then_zeros[..8].copy_from_slice(&[16, 0, 0, 0, 1, 2, 3, 4]);
        let mut frame_then_data = frame_then_zeros.clone();
        frame_then_data[1500] = 9;
        let mut lost_middle_sector = vec![7u8; 2048];
        lost_middle_sector[0..4].copy_from_slice(&1500u32.to_le_bytes());
        lost_middle_sector[512..1024].iter_mut().for_each(|b| *b = 0);
        let mut zero_header_then_data = vec![0u8; 2048];
        zero_header_then_data[1024] = 1;
        let cases: Vec<(&str, Vec<u8>, usize, bool)> = vec![
            ("frame runs past eof", vec![0xff, 0xff, 0, 0, 1, 1, 1, 1], 64, true),
            ("only zeros after", frame_then_zeros, 64, true),
            ("bit rot with data after, no zero sector", frame_then_data, 0, false),
            ("lost sector inside the frame", lost_middle_sector, 0, true),
            ("lost sector holding the header", zero_header_then_data, 0, true),
        ];
        for (name, bytes, at, torn) in cases {
            assert_eq!(is_torn(&bytes, at), torn, "{name}");
        }
    }

    #[test]
    fn broken_copies_never_overwrite_earlier_ones() {
        let fs = crate::SimFs::new();
        let seg = Path::new("/wal/0000000000000000-0000000000000001.wal");
        fs.write_file(seg, b"segment");
        assert_eq!(
            broken_path(&fs, seg),
            Path::new("/wal/0000000000000000-0000000000000001.wal.broken")
        );
        fs.write_file(&broken_path(&fs, seg), b"first copy");
        assert_eq!(
            broken_path(&fs, seg),
            Path::new("/wal/0000000000000000-0000000000000001.wal.broken.1")
        );
        fs.write_file(&broken_path(&fs, seg), b"second copy");
        assert_eq!(
            broken_path(&fs, seg),
            Path::new("/wal/0000000000000000-0000000000000001.wal.broken.2")
        );
    }

    #[test]
    fn sequence_gap_is_corruption() {
        let fs = crate::SimFs::new();
        let dir = Path::new("/wal");
        for seq in [0u64, 2] {
            let h = SegmentHeader {
                seq: SegmentSeq(seq),
                first_index: LogIndex(1),
                crc_seed: 0,
            };
            fs.write_file(
                &dir.join(crate::segment::segment_name(h.seq, h.first_index)),
                &h.encode(),
            );
        }
        let err = Replay::open(Arc::new(fs), dir.to_path_buf(), Config::default()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Corruption {
                    reason: CorruptionReason::SequenceGap { expected: 1, found: 2 },
                    ..
                }
            ),
            "{err}"
        );
    }
}
