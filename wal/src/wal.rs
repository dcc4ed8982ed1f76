//! The [`Wal`] handle: the public face of the log, and its completion [`Ticket`].

use std::future::{Future, IntoFuture};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use bytes::Bytes;
use crossbeam_channel::{bounded, Sender};
use parking_lot::Mutex;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::fs::{FileSystem, StdFs};
use crate::recovery::Replay;
use crate::stats::{Stats, StatsSnapshot};
use crate::types::{Appended, Durability, LogIndex, Record};
use crate::writer::{poisoned_error, Op, Poison, Writer, WriterInit};

/// A write-ahead log open for appending.
///
/// Obtained from [`Wal::open`] after replaying the log. `Wal` is `Send + Sync`: share it
/// (in an `Arc`) between threads and their appends are committed together.
///
/// ```
/// use cairn_wal::{Durability, LogIndex, Record, Wal, Config};
/// let dir = tempfile::tempdir()?;
/// let config = Config { segment_size: 1 << 20, ..Config::default() };
/// let wal = Wal::open(dir.path(), config.clone())?.finish()?;
/// wal.append(vec![Record::Entry { index: LogIndex(1), payload: "a".into() }], Durability::Durable)?
///     .wait()?;
/// drop(wal);
/// let records: Vec<Record> = Wal::open(dir.path(), config)?.collect::<Result<_, _>>()?;
/// assert_eq!(records, vec![Record::Entry { index: LogIndex(1), payload: "a".into() }]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Wal {
    tx: Option<Sender<Op>>,
    /// The writer, held by its thread while it serves a group; [`Wal::append_here`] borrows it
    /// when the thread is idle.
    writer_state: Arc<Mutex<Writer>>,
    /// Requests queued for the writer's thread so far (it counts those it has taken under the
    /// writer's lock): equal, nothing is queued or in hand.
    queued: AtomicU64,
    stats: Arc<Stats>,
    poison: Poison,
    max_record_bytes: u64,
    writer: Option<JoinHandle<()>>,
    dir: PathBuf,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl Wal {
    /// Opens (or creates) the log in `dir` on the real file system and returns its replay.
    pub fn open(dir: impl AsRef<Path>, config: Config) -> Result<Replay> {
        Wal::open_with(Arc::new(StdFs), dir, config)
    }

    /// Opens the log through the given file system (the `testing` feature's `SimFs` in tests).
    pub fn open_with(fs: Arc<dyn FileSystem>, dir: impl AsRef<Path>, config: Config) -> Result<Replay> {
        Replay::open(fs, dir.as_ref().to_path_buf(), config)
    }

    pub(crate) fn start(init: WriterInit) -> Result<Wal> {
        let stats = Arc::new(Stats::default());
        let poison: Poison = Arc::new(Mutex::new(None));
        let (tx, rx) = bounded(init.config.queue_depth);
        let max_record_bytes = init.config.max_record_bytes;
        let dir = init.dir.clone();
        let writer = Arc::new(Mutex::new(Writer::new(init, stats.clone(), poison.clone())?));
        let thread = std::thread::Builder::new()
            .name("cairn-wal-writer".into())
            .spawn({
                let span = tracing::Span::current();
                let writer = writer.clone();
                move || {
                    let _span = span.enter();
                    Writer::run(&writer, rx)
                }
            })
            .map_err(Error::io("spawn wal writer"))?;
        Ok(Wal {
            tx: Some(tx),
            writer_state: writer,
            queued: AtomicU64::new(0),
            stats,
            poison,
            max_record_bytes,
            writer: Some(thread),
            dir,
        })
    }

    /// The directory of the log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn submit(&self, op: Op) -> Result<()> {
        if let Some(err) = poisoned_error(&self.poison) {
            return Err(err);
        }
        let tx = self.tx.as_ref().ok_or(Error::Closed)?;
        // Counted before it is sent: an inline append that sees the count ahead of the
        // writer's knows something is queued or in flight, and queues behind it.
        self.queued.fetch_add(1, Ordering::SeqCst);
        tx.send(op).map_err(|_| Error::Closed)
    }

    fn check_sizes<'a>(&self, payloads: impl Iterator<Item = &'a Bytes>) -> Result<()> {
        for p in payloads {
            if p.len() as u64 > self.max_record_bytes {
                return Err(Error::RecordTooLarge {
                    size: p.len() as u64,
                    limit: self.max_record_bytes,
                });
            }
        }
        Ok(())
    }

    fn check_record_sizes(&self, records: &[Record]) -> Result<()> {
        self.check_sizes(records.iter().filter_map(|r| match r {
            Record::Entry { payload, .. } | Record::State(payload) => Some(payload),
            Record::Truncate { .. } => None,
        }))
    }

    /// Queues `records` to be appended in order, after everything queued before them.
    ///
    /// Entries must continue the log (index = last + 1, or any index in an empty log or right
    /// after a truncation to it); otherwise the ticket completes with
    /// [`Error::NonContiguous`] and nothing of the request is written. Records of one request
    /// are not atomic across a crash: recovery keeps a prefix of the log.
    pub fn append(&self, records: Vec<Record>, durability: Durability) -> Result<Ticket> {
        self.check_record_sizes(&records)?;
        let (reply, rx) = oneshot::channel();
        self.submit(Op::Append {
            records,
            durability,
            reply,
        })?;
        Ok(Ticket(rx))
    }

    /// As [`Wal::append`], but when the writer's thread is idle (nothing queued, nothing in
    /// hand) the calling thread writes the records, and syncs them if asked, itself: the
    /// returned ticket is then complete (unless the notifier is still answering an earlier
    /// large group, which answers it in turn), and the append cost no thread hand-off. Otherwise the
    /// request is queued as `append` queues it, after everything queued before.
    ///
    /// For a caller with nothing better to do while the disk syncs, such as the node thread of
    /// a group's sole member: order and durability are `append`'s either way.
    pub fn append_here(&self, records: Vec<Record>, durability: Durability) -> Result<Ticket> {
        if self.tx.is_some() {
            if let Some(mut writer) = self.writer_state.try_lock() {
                if writer.taken == self.queued.load(Ordering::SeqCst) {
                    self.check_record_sizes(&records)?;
                    let (reply, rx) = oneshot::channel();
                    writer.process(vec![Op::Append {
                        records,
                        durability,
                        reply,
                    }]);
                    return Ok(Ticket(rx));
                }
            }
        }
        self.append(records, durability)
    }

    /// Waits until the writer's thread has taken everything queued so far and let go of the
    /// log, so that [`Wal::append_here`] finds it idle (tests that need an idle writer: a
    /// request is answered before the writer lets go).
    #[cfg(any(test, feature = "testing"))]
    pub fn wait_until_idle(&self) {
        loop {
            let writer = self.writer_state.lock();
            if writer.taken == self.queued.load(Ordering::SeqCst) {
                return;
            }
            drop(writer);
            std::thread::yield_now();
        }
    }

    /// Queues entries that continue the log, the writer assigning their indexes (the first
    /// entry of an empty log gets index 1). The ticket reports the indexes assigned.
    pub fn append_next(&self, payloads: Vec<Bytes>, durability: Durability) -> Result<Ticket> {
        self.check_sizes(payloads.iter())?;
        let (reply, rx) = oneshot::channel();
        self.submit(Op::AppendNext {
            payloads,
            durability,
            reply,
        })?;
        Ok(Ticket(rx))
    }

    /// Drops every entry at or after `from` (Raft replacing a conflicting suffix), durably.
    pub fn truncate_suffix(&self, from: LogIndex) -> Result<Ticket> {
        self.append(vec![Record::Truncate { from }], Durability::Durable)
    }

    /// Makes everything appended so far durable.
    pub fn sync(&self) -> Result<Ticket> {
        let (reply, rx) = oneshot::channel();
        self.submit(Op::Sync { reply })?;
        Ok(Ticket(rx))
    }

    /// Deletes the oldest segments whose entries all have indexes below `below` (after a
    /// snapshot covers them), keeping at least the current segment. Returns how many went.
    pub fn release_before(&self, below: LogIndex) -> Result<usize> {
        let (reply, rx) = oneshot::channel();
        self.submit(Op::Release { below, reply })?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Counters and histograms of the log so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Syncs everything appended, then stops the writer.
    pub fn close(mut self) -> Result<()> {
        let synced = self.sync().and_then(Ticket::wait);
        self.stop();
        synced.map(|_| ())
    }

    fn stop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.writer.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Wal {
    /// Stops the writer after it has handled every queued request. Buffered appends are not
    /// synced: use [`Wal::close`] for that.
    fn drop(&mut self) {
        self.stop();
    }
}

/// Completion of a queued request: wait for it, or `.await` it.
#[derive(Debug)]
#[must_use = "a ticket says when the append is written or durable"]
pub struct Ticket(oneshot::Receiver<Result<Appended>>);

impl Ticket {
    /// Blocks until the request completes.
    pub fn wait(self) -> Result<Appended> {
        self.0.recv().map_err(|_| Error::Closed)?
    }

    /// The outcome if the request has completed, or the ticket back if it has not.
    pub fn try_wait(self) -> std::result::Result<Result<Appended>, Ticket> {
        match self.0.try_recv() {
            Ok(r) => Ok(r),
            Err(oneshot::TryRecvError::Empty) => Err(self),
            Err(oneshot::TryRecvError::Disconnected) => Ok(Err(Error::Closed)),
        }
    }
}

/// The future of a [`Ticket`].
#[derive(Debug)]
pub struct TicketFuture(oneshot::AsyncReceiver<Result<Appended>>);

impl IntoFuture for Ticket {
    type Output = Result<Appended>;
    type IntoFuture = TicketFuture;

    fn into_future(self) -> TicketFuture {
        TicketFuture(self.0.into_future())
    }
}

impl Future for TicketFuture {
    type Output = Result<Appended>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Appended>> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.map_err(|_| Error::Closed).and_then(|r| r))
    }
}
