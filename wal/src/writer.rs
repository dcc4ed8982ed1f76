//! The group-commit writer: the one thread that writes the log.
//!
//! Appenders queue requests on a bounded channel. The writer takes one request, drains every
//! other request already queued, encodes them all into one buffer and writes it with one
//! call, answers the requests that only wanted their bytes written, and calls fdatasync once if
//! any asked for durability; then it answers those (large groups through the notifier,
//! `notifier.rs`, so waking their waiters overlaps the next write and fsync). While it syncs,
//! new requests queue up and form the next group.
//!
//! Rotation: when the current segment is full the writer writes and syncs what it has, takes
//! the preallocated file, writes and syncs the new header (seeded with the last crc), renames
//! the file into place and syncs the directory, then repeats the latest state record at the
//! head of the new segment. So every sealed segment is fully durable, and only the last one
//! can hold a torn tail.
//!
//! A failed write or fsync poisons the log: the kernel may have dropped the dirty pages, so
//! the writer never retries; every pending and later request fails with [`Error::Poisoned`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use crossbeam_channel::Receiver;
use parking_lot::Mutex;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::frame::{framed_len, FrameKind};
use crate::fs::{DirLock, FileSystem, WalFile};
use crate::notifier::{Completed, Notifier};
use crate::pipeline::Pipeline;
use crate::segment::{segment_name, SegmentHeader, HEADER_LEN};
use crate::stats::Stats;
use crate::types::{Appended, Durability, LogIndex, Record, SegmentSeq};

/// A segment of the log, as the writer and recovery track it.
#[derive(Debug, Clone)]
pub(crate) struct SegmentMeta {
    pub(crate) seq: SegmentSeq,
    pub(crate) first_index: LogIndex,
    pub(crate) path: PathBuf,
    /// The largest entry index in the segment; a segment is released only when this is below
    /// the release point.
    pub(crate) max_entry: Option<LogIndex>,
}

/// The log's logical position: what the next entry must be, and the state to carry forward.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogTracker {
    pub(crate) last_index: Option<LogIndex>,
    pub(crate) latest_state: Option<Bytes>,
}

impl LogTracker {
    /// Checks that `record` may follow the log as it stands.
    fn check(&self, record: &Record) -> Result<()> {
        match (record, self.last_index) {
            (Record::Entry { index, .. }, Some(last)) if *index != last.next() => {
                Err(Error::NonContiguous { last, got: *index })
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn apply(&mut self, record: &Record, segment: Option<&mut SegmentMeta>) {
        match record {
            Record::Entry { index, .. } => {
                self.last_index = Some(*index);
                if let Some(seg) = segment {
                    seg.max_entry = seg.max_entry.max(Some(*index));
                }
            }
            Record::Truncate { from } => self.last_index = from.0.checked_sub(1).map(LogIndex),
            // A copy: a replayed state is a slice of its whole segment, which it would pin.
            Record::State(s) => self.latest_state = Some(Bytes::copy_from_slice(s)),
        }
    }
}

pub(crate) type Reply = oneshot::Sender<Result<Appended>>;

pub(crate) enum Op {
    Append {
        records: Vec<Record>,
        durability: Durability,
        reply: Reply,
    },
    /// Entries whose indexes the writer assigns, continuing the log.
    AppendNext {
        payloads: Vec<Bytes>,
        durability: Durability,
        reply: Reply,
    },
    Sync {
        reply: Reply,
    },
    Release {
        below: LogIndex,
        reply: oneshot::Sender<Result<usize>>,
    },
}

/// Why the log is poisoned: the failed operation and its error text.
pub(crate) type Poison = Arc<Mutex<Option<(&'static str, String)>>>;

pub(crate) fn poisoned_error(poison: &Poison) -> Option<Error> {
    poison.lock().as_ref().map(|(op, cause)| Error::Poisoned {
        op,
        cause: cause.clone(),
    })
}

/// Everything recovery hands over to start a writer.
#[derive(Debug)]
pub(crate) struct WriterInit {
    pub(crate) fs: Arc<dyn FileSystem>,
    pub(crate) dir: PathBuf,
    pub(crate) config: Config,
    pub(crate) lock: Box<dyn DirLock>,
    /// The last segment, open; `None` for a new log.
    pub(crate) file: Option<Arc<dyn WalFile>>,
    pub(crate) segments: Vec<SegmentMeta>,
    /// End of the valid data in the last segment.
    pub(crate) offset: u64,
    pub(crate) last_crc: u32,
    pub(crate) tracker: LogTracker,
}

struct IoFail {
    op: &'static str,
    err: std::io::Error,
}

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> IoFail {
    move |err| IoFail { op, err }
}

pub(crate) struct Writer {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    config: Config,
    _lock: Box<dyn DirLock>,
    pipeline: Pipeline,
    stats: Arc<Stats>,
    poison: Poison,
    file: Arc<dyn WalFile>,
    /// Oldest first. Invariant: non-empty, and the last one is `file`.
    segments: Vec<SegmentMeta>,
    /// Where `buf` goes in the current segment. Invariant: a multiple of 8, >= HEADER_LEN.
    offset: u64,
    /// Encoded frames not yet written.
    buf: Vec<u8>,
    buf_records: u64,
    /// Stored crc of the last encoded frame: the seed of the next.
    last_crc: u32,
    /// Records (not carried state) in the current segment, written or buffered.
    records_in_segment: u64,
    /// Records written since the last fdatasync.
    unsynced_records: u64,
    /// Whether bytes were written since the last fdatasync.
    dirty: bool,
    tracker: LogTracker,
    notifier: Notifier,
    /// Requests taken from the queue so far (see `Wal::queued`).
    pub(crate) taken: u64,
}

impl Writer {
    pub(crate) fn new(init: WriterInit, stats: Arc<Stats>, poison: Poison) -> Result<Writer> {
        let pipeline = Pipeline::start(init.fs.clone(), init.dir.clone(), init.config.segment_size)?;
        let notifier = Notifier::start().map_err(Error::io("spawn wal notifier"))?;
        let mut segments = init.segments;
        let (file, offset) = match init.file {
            Some(file) => {
                // What replay returned may sit unsynced in the page cache (the previous process
                // exited without syncing): make it durable before anything builds on it.
                file.sync_data().map_err(Error::io("fdatasync"))?;
                (file, init.offset)
            }
            None => {
                // A new log: its first segment, installed like any other.
                let header = SegmentHeader {
                    seq: SegmentSeq(0),
                    first_index: LogIndex(1),
                    crc_seed: 0,
                };
                let bytes = header.encode();
                let head = SegmentHead { header, bytes: &bytes };
                let (meta, file) =
                    install_segment(init.fs.as_ref(), &init.dir, &pipeline, head).map_err(|f| Error::Io {
                        op: f.op,
                        source: f.err,
                    })?;
                segments.push(meta);
                (Arc::from(file), HEADER_LEN as u64)
            }
        };
        Ok(Writer {
            fs: init.fs,
            dir: init.dir,
            config: init.config,
            _lock: init.lock,
            pipeline,
            stats,
            poison,
            file,
            segments,
            offset,
            buf: Vec::with_capacity(1 << 20),
            buf_records: 0,
            last_crc: init.last_crc,
            // Unknown for a recovered segment; only a segment just rotated to counts from zero.
            records_in_segment: 1,
            unsynced_records: 0,
            dirty: false,
            tracker: init.tracker,
            notifier,
            taken: 0,
        })
    }

    /// Serves requests until every sender is gone, holding the writer while it serves a group
    /// (a caller appending inline takes it only while this thread waits for requests).
    pub(crate) fn run(writer: &Mutex<Writer>, rx: Receiver<Op>) {
        while let Ok(first) = rx.recv() {
            let mut this = writer.lock();
            let mut group = vec![first];
            group.extend(rx.try_iter());
            this.taken += group.len() as u64;
            this.process(group);
        }
    }

    pub(crate) fn process(&mut self, group: Vec<Op>) {
        if let Some(err) = poisoned_error(&self.poison) {
            for op in group {
                fail(op, &err);
            }
            return;
        }
        // Requests answered once their bytes are written, and once they are durable.
        let mut written: Vec<(Reply, Appended)> = Vec::new();
        let mut durable: Vec<(Reply, Appended)> = Vec::with_capacity(group.len());
        let mut releases = Vec::new();
        let mut failure = None;
        let mut ops = group.into_iter();
        for op in ops.by_ref() {
            let (records, durability, reply) = match op {
                Op::Append {
                    records,
                    durability,
                    reply,
                } => (records, durability, reply),
                Op::AppendNext {
                    payloads,
                    durability,
                    reply,
                } => {
                    let mut next = self.tracker.last_index.map_or(LogIndex(1), LogIndex::next);
                    let records = payloads
                        .into_iter()
                        .map(|payload| {
                            let index = next;
                            next = next.next();
                            Record::Entry { index, payload }
                        })
                        .collect();
                    (records, durability, reply)
                }
                Op::Sync { reply } => {
                    let appended = Appended {
                        first_index: None,
                        last_index: self.tracker.last_index,
                    };
                    durable.push((reply, appended));
                    continue;
                }
                Op::Release { below, reply } => {
                    releases.push((below, reply));
                    continue;
                }
            };
            if let Err(e) = self.check(&records) {
                let _ = reply.send(Err(e));
                continue;
            }
            match self.stage(&records) {
                Ok(appended) => match durability {
                    Durability::Durable => durable.push((reply, appended)),
                    Durability::Buffered => written.push((reply, appended)),
                },
                Err(f) => {
                    durable.push((
                        reply,
                        Appended {
                            first_index: None,
                            last_index: None,
                        },
                    ));
                    failure = Some(f);
                    break;
                }
            }
        }
        let mut result = match failure {
            Some(f) => Err(f),
            None => self.flush(),
        };
        if result.is_ok() {
            self.notifier.answer(Completed {
                replies: std::mem::take(&mut written),
                result: Ok(()),
            });
            if !durable.is_empty() {
                result = self.sync();
            }
        }
        match result {
            Ok(()) => {
                self.notifier.answer(Completed {
                    replies: durable,
                    result: Ok(()),
                });
                for (below, reply) in releases {
                    let _ = reply.send(self.release(below).map_err(|f| self.poison_with(f)));
                }
            }
            Err(f) => {
                let err = self.poison_with(f);
                for (reply, _) in durable.into_iter().chain(written) {
                    let _ = reply.send(Err(err.duplicate()));
                }
                for (_, reply) in releases {
                    let _ = reply.send(Err(err.duplicate()));
                }
                for op in ops {
                    fail(op, &err);
                }
            }
        }
    }

    fn poison_with(&self, f: IoFail) -> Error {
        poison_with(&self.poison, f.op, &f.err)
    }

    /// Validates a request against the log as it will stand; sizes were checked by the handle.
    fn check(&self, records: &[Record]) -> Result<()> {
        let mut t = self.tracker.clone();
        for r in records {
            t.check(r)?;
            t.apply(r, None);
        }
        Ok(())
    }

    /// Encodes `records` (already checked), rotating segments as they fill.
    fn stage(&mut self, records: &[Record]) -> Result<Appended, IoFail> {
        let mut first_index = None;
        for r in records {
            let (kind, index, payload): (FrameKind, u64, &[u8]) = match r {
                Record::Entry { index, payload } => {
                    first_index = first_index.or(Some(*index));
                    (FrameKind::Entry, index.0, payload)
                }
                Record::State(payload) => (FrameKind::State, 0, payload),
                Record::Truncate { from } => (FrameKind::Truncate, from.0, &[]),
            };
            let used = self.offset + self.buf.len() as u64;
            if self.records_in_segment > 0 && used + framed_len(payload.len()) as u64 > self.config.segment_size {
                self.rotate()?;
            }
            self.last_crc = kind.encode(&mut self.buf, index, payload, self.last_crc);
            self.buf_records += 1;
            self.records_in_segment += 1;
            let segment = self.segments.last_mut();
            self.tracker.apply(r, segment);
        }
        Ok(Appended {
            first_index,
            last_index: self.tracker.last_index,
        })
    }

    fn flush(&mut self) -> Result<(), IoFail> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.file.write_all_at(&self.buf, self.offset).map_err(io("write"))?;
        self.offset += self.buf.len() as u64;
        self.stats.on_write(self.buf.len() as u64, self.buf_records);
        self.unsynced_records += self.buf_records;
        self.buf.clear();
        self.buf_records = 0;
        self.dirty = true;
        Ok(())
    }

    fn sync(&mut self) -> Result<(), IoFail> {
        if !self.dirty {
            return Ok(());
        }
        let started = Instant::now();
        // `unsafe_no_fsync`: the page cache is trusted, as etcd's --unsafe-no-fsync trusts it,
        // and no fsync is counted.
        if !self.config.unsafe_no_fsync {
            self.file.sync_data().map_err(io("fdatasync"))?;
            self.stats.on_fsync(started.elapsed(), self.unsynced_records);
        }
        self.unsynced_records = 0;
        self.dirty = false;
        Ok(())
    }

    fn rotate(&mut self) -> Result<(), IoFail> {
        self.flush()?;
        self.sync()?;
        let seq = match self.segments.last().map(|s| s.seq.0.checked_add(1)) {
            Some(Some(next)) => SegmentSeq(next),
            // A recovered log whose last segment claims sequence u64::MAX: refuse rather than wrap.
            Some(None) => {
                return Err(io("rotate")(std::io::Error::other(
                    "segment sequence numbers exhausted",
                )))
            }
            None => SegmentSeq(0),
        };
        let header = SegmentHeader {
            seq,
            first_index: self.tracker.last_index.map_or(LogIndex(1), LogIndex::next),
            crc_seed: self.last_crc,
        };
        // The latest state leads the new segment, synced with its header before the rename, so
        // a segment in the log always carries it: releasing older segments cannot lose it.
        let mut head = header.encode().to_vec();
        let mut crc = self.last_crc;
        if let Some(state) = &self.tracker.latest_state {
            crc = FrameKind::CarriedState.encode(&mut head, 0, state, crc);
        }
        let (meta, file) = install_segment(
            self.fs.as_ref(),
            &self.dir,
            &self.pipeline,
            SegmentHead { header, bytes: &head },
        )?;
        let file: Arc<dyn WalFile> = Arc::from(file);
        tracing::debug!(segment = %meta.path.display(), "wal rotated to a new segment");
        self.segments.push(meta);
        self.file = file;
        self.offset = head.len() as u64;
        self.last_crc = crc;
        self.records_in_segment = 0;
        Ok(())
    }

    /// Removes the oldest segments whose entries all lie below `below`; never the last one.
    /// Oldest first, with a directory sync after each removal, so a crash part-way leaves a
    /// contiguous run of segments.
    fn release(&mut self, below: LogIndex) -> Result<usize, IoFail> {
        let mut released = 0;
        while self.segments.len() > 1 {
            let Some(first) = self.segments.first() else { break };
            if first.max_entry.is_some_and(|m| m >= below) {
                break;
            }
            self.fs.remove(&first.path).map_err(io("remove segment"))?;
            self.fs.sync_dir(&self.dir).map_err(io("sync wal dir"))?;
            self.segments.remove(0);
            released += 1;
        }
        Ok(released)
    }
}

/// What a new segment starts with: its header, and the bytes before its first record (the
/// encoded header, then any carried state).
struct SegmentHead<'a> {
    header: SegmentHeader,
    bytes: &'a [u8],
}

/// Turns the preallocated file into segment `head.header.seq`: its head written and synced,
/// then the file renamed into place, then the directory synced.
fn install_segment(
    fs: &dyn FileSystem,
    dir: &std::path::Path,
    pipeline: &Pipeline,
    head: SegmentHead<'_>,
) -> Result<(SegmentMeta, Box<dyn WalFile>), IoFail> {
    let header = head.header;
    let (tmp, file) = pipeline.take().map_err(io("preallocate segment"))?;
    file.write_all_at(head.bytes, 0).map_err(io("write segment header"))?;
    file.sync_data().map_err(io("fdatasync"))?;
    let path = dir.join(segment_name(header.seq, header.first_index));
    fs.rename(&tmp, &path).map_err(io("rename segment"))?;
    fs.sync_dir(dir).map_err(io("sync wal dir"))?;
    Ok((
        SegmentMeta {
            seq: header.seq,
            first_index: header.first_index,
            path,
            max_entry: None,
        },
        file,
    ))
}

fn fail(op: Op, err: &Error) {
    match op {
        Op::Append { reply, .. } | Op::AppendNext { reply, .. } | Op::Sync { reply } => {
            let _ = reply.send(Err(err.duplicate()));
        }
        Op::Release { reply, .. } => {
            let _ = reply.send(Err(err.duplicate()));
        }
    }
}

/// Records why the log is poisoned (the first failure wins) and returns the error to report.
pub(crate) fn poison_with(poison: &Poison, op: &'static str, err: &std::io::Error) -> Error {
    tracing::error!(op, error = %err, "wal i/o failed; the log is poisoned");
    let mut p = poison.lock();
    if p.is_none() {
        *p = Some((op, err.to_string()));
    }
    let (op, cause) = p.clone().unwrap_or((op, String::new()));
    Error::Poisoned { op, cause }
}
