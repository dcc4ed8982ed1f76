//! The embedded engine: a directory holding a durable, revisioned key-value store with leases.
//!
//! A write is validated, encoded as a [`Request`], appended to the WAL at the next log index,
//! and queued for the apply thread. The apply thread takes requests in log order, waits until
//! each is durable (the WAL's group commit makes one fdatasync serve many), applies it to the
//! state (store and lessor), and answers the caller. Reads take the state's read lock and are
//! served concurrently with other reads; a write's answer comes after it is applied, so a read
//! that starts after a write returns sees it.
//!
//! Leases expire on this member's clock: a checker thread (or an explicit
//! [`Engine::expire_leases`]) proposes a revoke for each expired lease, a bounded batch at a
//! time, through the same write path; each revoke deletes its keys in one revision.
//!
//! On disk: `<dir>/wal/`, the log of every request; `<dir>/data/`, the records of every change
//! still in history (see [`crate::backend`]); `<dir>/checkpoint`, the applied index with the
//! data files' layout and the leases. Opening rebuilds the state from the checkpoint and its
//! data files and replays the log after it, so a crash at any point recovers every
//! acknowledged write (and possibly some that were logged but not yet answered). This seam,
//! log then apply in order, is the one Raft will drive.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use std::collections::HashMap;

use cairn_wal::{LogIndex, Wal};
use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError, Sender, TryRecvError};
use parking_lot::{Mutex, RwLock};
use raft::eraftpb::EntryType;

use crate::backend::{FileLen, FileMaker, DATA_DIR};
use crate::checkpoint::{self, Checkpoint};
use crate::config::Config;
use crate::consensus::log::RaftLog;
use crate::consensus::node::{Input, MemberChange, NoPeers, Node, NodeConfig, Status, ToApply, Transport};
use crate::consensus::transfer::Staged;
use crate::consensus::{MemberAttributes, Membership, RecentRequests};
use crate::error::{Error, Result};
use crate::kv::range::{RangeRequest, RangeResponse};
use crate::kv::txn::{DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, TxnRequest, TxnResponse};
use crate::lease::lessor::{LeaseStatus, Lessor};
use crate::mvcc::index::KeyRange;
use crate::mvcc::store::{HashKv, Store, StoreMeta};
use crate::request::{Alarm, Request, Response};
use crate::snapshot::{self, SnapshotMeta, SnapshotWriter};
use crate::watch::hub::{Wake, WatchHub, WatchRequest, WatchResponse};

/// A response with the store's revision after the request (etcd's `header.revision`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied<T> {
    /// The request's own answer.
    pub response: T,
    /// The store's revision once the request was applied: the new one if it changed
    /// something, else the current one.
    pub revision: i64,
}

/// The members of a group (etcd's `MemberList`, by ID).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    /// Members that vote.
    pub voters: Vec<u64>,
    /// Members that receive the log without voting.
    pub learners: Vec<u64>,
}

/// What [`Engine::inspect_snapshot`] found in a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The revision it was taken at.
    pub revision: i64,
    /// Its compacted revision.
    pub compact_revision: i64,
    /// The log index it was taken at.
    pub applied_index: u64,
    /// Records of history it holds.
    pub records: u64,
    /// Keys that exist at its revision.
    pub keys: u64,
    /// Leases it holds.
    pub leases: u64,
}

/// What a member knows of Raft at one moment ([`Engine::raft_status`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftStatus {
    /// The leader it knows of.
    pub leader: Option<u64>,
    /// The current term.
    pub term: u64,
    /// The last log index it knows committed.
    pub commit_index: u64,
    /// The last log index it applied.
    pub applied_index: u64,
    /// Whether it is a learner.
    pub is_learner: bool,
    /// How many times it has seen a new leader since it was opened.
    pub leader_changes: u64,
    /// Proposals made through it and not answered yet.
    pub proposals_pending: u64,
    /// Proposals made through it that were dropped before being committed, since it was
    /// opened.
    pub proposals_failed: u64,
}

/// A member of the group, as [`Engine::member_list`] reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Member {
    /// Its Raft ID.
    pub id: u64,
    /// A learner receives the log but does not vote.
    pub is_learner: bool,
    /// See [`MemberAttributes::name`].
    pub name: String,
    /// Where its peers reach it.
    pub peer_urls: Vec<String>,
    /// Where clients reach it; empty until it publishes them.
    pub client_urls: Vec<String>,
}

/// Delivers Raft messages to one member (see [`Engine::inbox`]). It does not keep the
/// member open.
#[derive(Clone, Debug)]
pub struct Inbox {
    tx: Sender<Input>,
    inner: std::sync::Weak<Inner>,
}

impl Inbox {
    /// Delivers one message; fails once the member is closed. A message that does not decode
    /// is dropped (with a log line): a peer cannot harm the member with one.
    pub fn deliver(&self, message: &[u8]) -> Result<()> {
        use protobuf::Message as _;
        match raft::eraftpb::Message::parse_from_bytes(message) {
            Ok(m) => self.tx.send(Input::Step(m)).map_err(|_| Error::Closed),
            Err(e) => {
                tracing::warn!(error = %e, "dropping a raft message that does not decode");
                Ok(())
            }
        }
    }

    /// Delivers a snapshot from the leader (what its [`Transport::send_snapshot`] sent):
    /// `message` carries its metadata, `data` the state. The state is read into new data
    /// files, in bounded memory, and installed if raft accepts it. Returns once it is
    /// installed or turned down (a stale snapshot is turned down with `Ok`); a damaged stream
    /// is refused with [`Error::Snapshot`] and leaves nothing behind.
    pub fn deliver_snapshot(&self, message: &[u8], data: &mut dyn std::io::Read) -> Result<()> {
        use protobuf::Message as _;
        let m = raft::eraftpb::Message::parse_from_bytes(message)
            .map_err(|e| Error::Snapshot(format!("the snapshot's raft message does not decode: {e}")))?;
        if m.get_msg_type() != raft::eraftpb::MessageType::MsgSnapshot {
            return Err(Error::Snapshot(format!(
                "a {:?} message came with snapshot data",
                m.get_msg_type()
            )));
        }
        let index = m.get_snapshot().get_metadata().index;
        let inner = self.inner.upgrade().ok_or(Error::Closed)?;
        let (maker, applied) = {
            let st = inner.state.read();
            (st.store.file_maker(), st.applied_index)
        };
        if index <= applied {
            tracing::info!(index, applied, "turning down a snapshot older than the state");
            return Ok(());
        }
        let lessor = Lessor::new(inner.config.min_lease_ttl, inner.config.clock.clone());
        drop(inner);
        let staged = Staged::read(data, maker, lessor)?;
        if staged.index() < index {
            return Err(Error::Snapshot(format!(
                "the snapshot's data is at index {}, its message says {index}",
                staged.index()
            )));
        }
        let (reply, answer) = bounded(1);
        self.tx
            .send(Input::Snapshot {
                message: m,
                staged,
                reply,
            })
            .map_err(|_| Error::Closed)?;
        answer.recv().map_err(|_| Error::Closed)?.map(|_| ())
    }
}

/// What a defragmentation did: the data files' size before and after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defragmented {
    /// Bytes the data files took when defragmentation began ([`Engine::size`]).
    pub before: u64,
    /// Bytes the fresh data files take once switched to.
    pub after: u64,
}

/// Records per snapshot frame.
const SNAPSHOT_CHUNK: usize = 1024;
/// Records a defragmentation copies, or repoints under one lock hold.
const DEFRAG_BATCH: usize = 1024;

/// A granted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The lease's ID: the one asked for, or one the engine chose when asked for 0.
    pub id: i64,
    /// Seconds, raised to the minimum TTL.
    pub ttl: i64,
}

type Answer = Result<(Response, i64)>;

/// Waits for a proposal's answer: [`Error::Timeout`] after `timeout` (the write may still be
/// applied), [`Error::Closed`] if the engine closed first.
fn wait_answer(rx: oneshot::Receiver<Answer>, timeout: std::time::Duration) -> Answer {
    match rx.recv_timeout(timeout) {
        Ok(answer) => answer,
        Err(oneshot::RecvTimeoutError::Timeout) => Err(Error::Timeout),
        Err(oneshot::RecvTimeoutError::Disconnected) => Err(Error::Closed),
    }
}

/// Proposals waiting for their entry to be applied, by request ID (carried in the entry's
/// context, so an entry proposed through any member finds its waiter on the member that
/// proposed it).
type Waiters = Mutex<HashMap<u64, oneshot::Sender<Answer>>>;

/// The running Raft node and the log it writes.
struct Replica {
    node: Node,
    wal: Arc<Wal>,
}

/// The last applied log index, for reads to wait on.
#[derive(Default)]
struct AppliedIndex {
    index: Mutex<u64>,
    changed: parking_lot::Condvar,
}

impl AppliedIndex {
    fn set(&self, index: u64) {
        *self.index.lock() = index;
        self.changed.notify_all();
    }

    /// Waits until `index` is applied; false on timeout.
    fn wait(&self, index: u64, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut applied = self.index.lock();
        while *applied < index {
            if self.changed.wait_until(&mut applied, deadline).timed_out() {
                return *applied >= index;
            }
        }
        true
    }
}

/// What requests change: the store, the lessor and the alarms, always together.
struct State {
    store: Store,
    lessor: Lessor,
    alarms: std::collections::BTreeSet<Alarm>,
    /// The last log index applied. Invariant: the state is exactly the log up to here.
    applied_index: u64,
    /// The term of the entry at `applied_index`.
    applied_term: u64,
    /// The group's membership as of `applied_index`.
    membership: Membership,
    /// The request IDs of the last entries applied (each request is applied once).
    recent: RecentRequests,
    /// Defragmentations and installed snapshots so far (see [`crate::checkpoint`]).
    epoch: u64,
    /// Snapshots from the leader installed since open: a snapshot being taken of the old
    /// state cannot go on reading the new one.
    installs: u64,
}

/// A checkpoint encoded under the state lock, to write without it.
struct Encoded {
    bytes: Vec<u8>,
    order: (u64, u64),
    applied: u64,
    /// Data files to sync first.
    layout: Vec<FileLen>,
}

impl State {
    fn checkpoint(&mut self) -> Result<Encoded> {
        self.store.flush()?;
        let c = Checkpoint {
            applied_index: self.applied_index,
            applied_term: self.applied_term,
            membership: self.membership.clone(),
            recent: self.recent.clone(),
            epoch: self.epoch,
            store: self.store.meta(),
            leases: self.lessor.records(),
            alarms: self.alarms.iter().copied().collect(),
        };
        Ok(Encoded {
            bytes: checkpoint::encode(&c)?,
            order: c.order(),
            applied: c.applied_index,
            layout: c.store.layout,
        })
    }
}

/// How checkpoints are written.
struct Checkpointing {
    /// The order ([`Checkpoint::order`]) of the newest checkpoint written. Held while one is
    /// written, so two never write the same temporary file at once, and an older one never
    /// replaces a newer one (the log it needs may be released already, its data files
    /// deleted).
    newest: Mutex<(u64, u64)>,
    /// Log entries kept before a checkpoint (`Config::snapshot_catch_up_entries`).
    catch_up: u64,
    /// How long writing each checkpoint took, in microseconds.
    latency_us: Mutex<hdrhistogram::Histogram<u64>>,
}

/// Syncs the data files a checkpoint names, writes it, and releases the log it covers.
fn write_and_release(dir: &Path, c: &Encoded, wal: &Wal, checkpointing: &Checkpointing) -> Result<()> {
    let mut newest = checkpointing.newest.lock();
    if c.order < *newest {
        return Ok(());
    }
    let started = std::time::Instant::now();
    FileMaker::sync_files(&dir.join(DATA_DIR), &c.layout)?;
    checkpoint::write_bytes(dir, &c.bytes)?;
    *newest = c.order;
    let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    let _ = checkpointing.latency_us.lock().record(took.max(1));
    // The last entries before the checkpoint stay, for followers that are behind.
    wal.release_before(LogIndex(
        c.applied.saturating_add(1).saturating_sub(checkpointing.catch_up),
    ))?;
    Ok(())
}

/// Writes a checkpoint of `state` and releases the log it covers.
fn checkpoint_and_release(dir: &Path, state: &mut State, wal: &Wal, checkpointing: &Checkpointing) -> Result<()> {
    write_and_release(dir, &state.checkpoint()?, wal, checkpointing)
}

/// Writes a snapshot of `state` to `out` (see [`Engine::snapshot`]).
fn write_snapshot(state: &RwLock<State>, out: &mut dyn std::io::Write) -> Result<u64> {
    /// Unpins the store however the snapshot ends.
    struct Pin<'a>(&'a RwLock<State>);
    impl Drop for Pin<'_> {
        fn drop(&mut self) {
            self.0.write().store.pinned -= 1;
        }
    }
    let (meta, installs) = {
        let mut st = state.write();
        st.store.pinned += 1;
        let meta = SnapshotMeta {
            applied_index: st.applied_index,
            applied_term: st.applied_term,
            membership: st.membership.clone(),
            recent: st.recent.clone(),
            current: st.store.current_revision(),
            compacted: st.store.compacted_revision(),
            leases: st.lessor.records(),
            alarms: st.alarms.iter().copied().collect(),
        };
        (meta, st.installs)
    };
    let _pin = Pin(state);
    let mut writer = SnapshotWriter::new(out, &meta)?;
    let mut after = None;
    loop {
        let (records, last) = {
            let st = state.read();
            if st.installs != installs {
                return Err(Error::Snapshot(
                    "a snapshot from the leader replaced the state while this one was taken".into(),
                ));
            }
            st.store
                .export_chunk(after, meta.current, meta.compacted, SNAPSHOT_CHUNK)?
        };
        if last.is_none() {
            break;
        }
        writer.records(&records)?;
        after = last;
    }
    writer.finish()
}

struct Inner {
    config: Config,
    /// Lock order: `replica`, then `state`, then `hub`; the apply thread takes `state` and
    /// `hub`. `None` once closed.
    replica: Mutex<Option<Replica>>,
    waiters: Arc<Waiters>,
    /// The Raft log (shared with the node thread), for reads on a group of one.
    log: RaftLog,
    /// The node's leader and term, as it last published them.
    status: Arc<Status>,
    /// The next request ID: this member's ID in the top 16 bits, a counter below.
    next_request: AtomicU64,
    applied: Arc<AppliedIndex>,
    state: Arc<RwLock<State>>,
    hub: Arc<Mutex<WatchHub>>,
    /// See [`Checkpointing`].
    checkpointing: Arc<Checkpointing>,
    /// See [`Swept`].
    swept: Arc<Swept>,
    /// Held by the one defragmentation that may run at a time, and by a snapshot's install.
    defragmenting: Arc<Mutex<()>>,
    /// The next server-chosen lease ID candidate.
    next_lease_id: AtomicI64,
}

/// An open engine. `Engine` is `Send + Sync`: share it between threads.
pub struct Engine {
    dir: PathBuf,
    inner: Arc<Inner>,
    apply_thread: Mutex<Option<JoinHandle<()>>>,
    /// Dropping the sender stops the lease checker.
    checker: Mutex<Option<(Sender<()>, JoinHandle<()>)>>,
    /// Dropping the sender stops the watch thread.
    watch_thread: Mutex<Option<(Sender<()>, JoinHandle<()>)>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("dir", &self.dir).finish_non_exhaustive()
    }
}

fn unexpected(what: &str, answer: Response) -> Error {
    Error::Internal(format!("{what} answered with {answer:?}"))
}

/// A write that is logged and will be answered once applied: [`Pending::wait`] for it, or
/// `.await` it.
#[must_use = "a pending write says when it is applied, and how it went"]
pub struct Pending<T> {
    rx: oneshot::Receiver<Answer>,
    /// How long [`Pending::wait`] waits (`Config::request_timeout`).
    timeout: std::time::Duration,
    convert: fn((Response, i64)) -> Result<T>,
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").finish_non_exhaustive()
    }
}

impl<T> Pending<T> {
    fn new(
        (rx, timeout): (oneshot::Receiver<Answer>, std::time::Duration),
        convert: fn((Response, i64)) -> Result<T>,
    ) -> Pending<T> {
        Pending { rx, timeout, convert }
    }

    /// Blocks until the write is applied, or fails with [`Error::Timeout`] after
    /// `Config::request_timeout`: then the write may still be applied later, or may have been
    /// already (as with etcd, a timed-out write's outcome is unknown).
    pub fn wait(self) -> Result<T> {
        (self.convert)(wait_answer(self.rx, self.timeout)?)
    }
}

impl<T: Unpin> std::future::IntoFuture for Pending<T> {
    type Output = Result<T>;
    type IntoFuture = PendingFuture<T>;

    fn into_future(self) -> PendingFuture<T> {
        PendingFuture {
            rx: self.rx.into_future(),
            convert: self.convert,
        }
    }
}

/// The future of a [`Pending`] write.
pub struct PendingFuture<T> {
    rx: oneshot::AsyncReceiver<Answer>,
    convert: fn((Response, i64)) -> Result<T>,
}

impl<T> std::fmt::Debug for PendingFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFuture").finish_non_exhaustive()
    }
}

impl<T: Unpin> std::future::Future for PendingFuture<T> {
    type Output = Result<T>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<T>> {
        let convert = self.convert;
        std::pin::Pin::new(&mut self.rx).poll(cx).map(|r| match r {
            Ok(Ok(answer)) => convert(answer),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Closed),
        })
    }
}

/// Applies one request; its errors are the request's answer, not the engine's.
/// Applies one request; everything that depends on configuration was decided when it was
/// proposed, so replay reaches the same state whatever the configuration is now.
fn apply(state: &mut State, request: &Request) -> Answer {
    let State {
        store,
        lessor,
        alarms,
        membership,
        ..
    } = state;
    if alarms.contains(&Alarm::NoSpace) {
        // etcd's capped applier: what adds data fails; reads, deletes, compaction and leases'
        // revokes go on, so space can be reclaimed.
        let adds = match request {
            Request::Put(_) | Request::LeaseGrant { .. } => true,
            Request::Txn(t) => !t.is_read_only(),
            _ => false,
        };
        if adds {
            return Err(Error::NoSpace);
        }
    }
    match request {
        Request::Put(p) => {
            let (r, rev, changes) = p.apply_checked(store, &|id| lessor.exists(id))?;
            lessor.apply_changes(&changes);
            Ok((Response::Put(r), rev))
        }
        Request::DeleteRange(d) => {
            let (r, rev, changes) = d.apply_checked(store)?;
            lessor.apply_changes(&changes);
            Ok((Response::DeleteRange(r), rev))
        }
        Request::Txn(t) => {
            let (r, rev, changes) = t.apply_checked(store, &|id| lessor.exists(id))?;
            lessor.apply_changes(&changes);
            Ok((Response::Txn(r), rev))
        }
        Request::Compact { revision } => {
            // Logical now; the apply thread drops the history in bounded batches.
            store.begin_compaction(*revision)?;
            Ok((Response::Compact, store.current_revision()))
        }
        Request::LeaseGrant { id, ttl } => {
            let ttl = lessor.grant(*id, *ttl)?;
            Ok((Response::LeaseGrant { id: *id, ttl }, store.current_revision()))
        }
        Request::LeaseRevoke { id } => {
            // Every attached key goes in one revision.
            let keys = lessor.keys(*id)?;
            let mut w = store.write();
            for key in &keys {
                w.delete_range(key, &[])?;
            }
            let (rev, _) = w.finish();
            lessor.revoke(*id)?;
            Ok((Response::LeaseRevoke, rev))
        }
        Request::LeaseCheckpoint { remaining } => {
            for (id, ttl) in remaining {
                lessor.checkpoint(*id, *ttl);
            }
            Ok((Response::LeaseCheckpoint, store.current_revision()))
        }
        Request::MemberUpdate { id, peer_urls } => {
            if !membership.contains(*id) {
                return Err(Error::MemberNotFound);
            }
            membership.attributes.entry(*id).or_default().peer_urls = peer_urls.clone();
            Ok((Response::Member, store.current_revision()))
        }
        Request::MemberPublish { id, name, client_urls } => {
            if !membership.contains(*id) {
                return Err(Error::MemberNotFound);
            }
            let attributes = membership.attributes.entry(*id).or_default();
            attributes.name = name.clone();
            attributes.client_urls = client_urls.clone();
            Ok((Response::Member, store.current_revision()))
        }
        Request::Alarm { activate, alarm } => {
            if *activate {
                alarms.insert(*alarm);
            } else {
                alarms.remove(alarm);
            }
            Ok((Response::Alarm, store.current_revision()))
        }
    }
}

/// What the apply thread needs besides its queue.
struct Applier {
    state: Arc<RwLock<State>>,
    hub: Arc<Mutex<WatchHub>>,
    wal: Arc<Wal>,
    dir: PathBuf,
    checkpoint_entries: u64,
    compaction_batch: usize,
    checkpointing: Arc<Checkpointing>,
    swept: Arc<Swept>,
    waiters: Arc<Waiters>,
    applied: Arc<AppliedIndex>,
    /// To tell the node thread what was applied and what a checkpoint covers.
    node: Sender<Input>,
    /// Where a leader's restarted lease clocks are recorded.
    status: Arc<Status>,
    /// Where the applied index is published, for snapshots sent to followers.
    log: RaftLog,
    /// Held while a snapshot from the leader is installed (no defragmentation meanwhile).
    defragmenting: Arc<Mutex<()>>,
}

/// Signalled (under its mutex) when a compaction's sweep finishes.
type Swept = (Mutex<()>, parking_lot::Condvar);

/// Swaps a snapshot's staged state in for the live one; returns the checkpoint to write before
/// anything else, and the old data files, to delete after it. Watchers catch up from the new
/// state (or learn that their revisions were compacted). Call with `defragmenting` held.
fn install(state: &RwLock<State>, hub: &Mutex<WatchHub>, staged: Staged) -> Result<(Encoded, Vec<PathBuf>)> {
    let mut st = state.write();
    if staged.index() <= st.applied_index {
        return Err(Error::Internal(format!(
            "a snapshot at {} cannot replace the state at {}",
            staged.index(),
            st.applied_index
        )));
    }
    let Some((mut store, mut lessor, meta)) = staged.take() else {
        return Err(Error::Internal("a staged snapshot was installed twice".into()));
    };
    // Snapshots of the old state still running unpin the new one when they stop.
    store.pinned = st.store.pinned;
    let old = std::mem::replace(&mut st.store, store);
    lessor.restart_clocks();
    st.lessor = lessor;
    st.alarms = meta.alarms.into_iter().collect();
    st.applied_index = meta.applied_index;
    st.applied_term = meta.applied_term;
    st.membership = meta.membership;
    st.recent = meta.recent;
    st.epoch += 1;
    st.installs += 1;
    hub.lock().unsync_all();
    let encoded = st.checkpoint()?;
    Ok((encoded, old.file_paths()))
}

fn apply_loop(rx: Receiver<ToApply>, a: Applier) {
    let Applier {
        state,
        hub,
        wal,
        dir,
        checkpoint_entries,
        compaction_batch,
        checkpointing,
        swept,
        waiters,
        applied,
        node,
        status,
        log,
        defragmenting,
    } = a;
    let everything = KeyRange::new(&[0], &[0]);
    let mut since_checkpoint = 0u64;
    // The state is encoded here, under the lock; writing and fsyncing the file happen on the
    // checkpointer thread while requests go on being applied. One at a time: while one is
    // being written, the next waits for more entries.
    let writing = Arc::new(AtomicBool::new(false));
    let (to_write, written) = bounded::<Encoded>(1);
    let checkpointer = {
        let (dir, wal, checkpointing, writing) = (dir.clone(), wal.clone(), checkpointing.clone(), writing.clone());
        std::thread::Builder::new()
            .name("cairn-checkpoint".into())
            .spawn(move || {
                for encoded in written {
                    if let Err(e) = write_and_release(&dir, &encoded, &wal, &checkpointing) {
                        tracing::error!(error = %e, "checkpoint failed; the log keeps growing");
                    }
                    writing.store(false, Ordering::Release);
                }
            })
    };
    let (to_write, checkpointer) = match checkpointer {
        Ok(thread) => (Some(to_write), Some(thread)),
        Err(e) => {
            tracing::error!(error = %e, "no checkpoint thread; checkpoints only on close");
            (None, None)
        }
    };
    loop {
        // A compaction sweeps a bounded batch of keys between requests, and while idle, so no
        // write waits behind it for long.
        let (compacting, unfinished) = {
            let st = state.read();
            (st.store.compaction_pending(), st.store.compaction_unfinished())
        };
        let p = if compacting {
            if !state.write().store.compaction_step(compaction_batch) {
                let _signal = swept.0.lock();
                swept.1.notify_all();
            }
            match rx.try_recv() {
                Ok(p) => p,
                Err(TryRecvError::Empty) => continue,
                Err(TryRecvError::Disconnected) => break,
            }
        } else if unfinished {
            // Paused by a snapshot: look again now and then, requests or not.
            match rx.recv_timeout(std::time::Duration::from_millis(50)) {
                Ok(p) => p,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match rx.recv() {
                Ok(p) => p,
                Err(_) => break,
            }
        };
        let batch = match p {
            ToApply::Entries(batch) => batch,
            ToApply::Dropped { id, error } => {
                status.proposals_failed.fetch_add(1, Ordering::Relaxed);
                if let Some(w) = waiters.lock().remove(&id) {
                    let _ = w.send(Err(error));
                }
                continue;
            }
            ToApply::BecameLeader { term } => {
                // A new leader extends what the old one granted; it never expires early.
                state.write().lessor.restart_clocks();
                status.leases_term.store(term, Ordering::Release);
                continue;
            }
            ToApply::Install { staged, reply } => {
                let installed = {
                    let _one = defragmenting.lock();
                    install(&state, &hub, staged)
                };
                let outcome = installed.and_then(|(encoded, old_files)| {
                    let index = encoded.applied;
                    write_and_release(&dir, &encoded, &wal, &checkpointing)?;
                    for path in old_files {
                        if let Err(e) = crate::backend::delete_gradually(&path) {
                            tracing::warn!(file = %path.display(), error = %e, "cannot delete an old data file");
                        }
                    }
                    Ok(index)
                });
                if let Ok(index) = outcome {
                    let st = state.read();
                    log.publish_applied(index, st.applied_term, st.membership.to_conf_state());
                    drop(st);
                    applied.set(index);
                    let _ = node.send(Input::Applied(index));
                    since_checkpoint = 0;
                }
                let _ = reply.send(outcome.map(|_| ()));
                continue;
            }
        };
        let mut answers = Vec::new();
        let mut encoded = None;
        let mut st = state.write();
        for (entry, conf) in batch {
            if entry.index <= st.applied_index {
                // In the state already: a snapshot from the leader was newer than its
                // metadata said. A waiter for it times out, as for any outcome not known.
                continue;
            }
            if let Some(change) = conf {
                st.membership.apply(&change);
                if let Some(id) = entry.context.as_ref().try_into().ok().map(u64::from_le_bytes) {
                    answers.push((id, Ok((Response::ConfChange, st.store.current_revision()))));
                }
            }
            let before = st.store.current_revision();
            let id = entry.context.as_ref().try_into().ok().map(u64::from_le_bytes);
            let duplicate = id.is_some_and(|id| !st.recent.first_time(id));
            if duplicate {
                tracing::debug!(index = entry.index, "skipping a request applied already");
            }
            if entry.get_entry_type() == EntryType::EntryNormal && !entry.data.is_empty() && !duplicate {
                let outcome = match Request::decode(&entry.data) {
                    Ok(request) => apply(&mut st, &request),
                    Err(e) => {
                        tracing::error!(index = entry.index, error = %e, "a committed entry does not decode");
                        Err(Error::CorruptEntry {
                            index: entry.index,
                            reason: e.to_string(),
                        })
                    }
                };
                if let Some(id) = id {
                    answers.push((id, outcome));
                }
            }
            st.applied_index = entry.index;
            st.applied_term = entry.term;
            let after = st.store.current_revision();
            if after > before {
                // Still under the state lock, so a new watcher cannot miss this revision.
                let mut hub = hub.lock();
                if !hub.is_empty() {
                    match st.store.events(after, after, &everything, 0) {
                        Ok(events) => hub.notify(after, &events),
                        Err(e) => tracing::error!(error = %e, revision = after, "cannot build watch events"),
                    }
                }
            }
            since_checkpoint += 1;
            let due = checkpoint_entries > 0 && since_checkpoint >= checkpoint_entries;
            if due && encoded.is_none() && to_write.is_some() && !writing.load(Ordering::Acquire) {
                since_checkpoint = 0;
                // A small record: the layout and the leases.
                match st.checkpoint() {
                    Ok(e) => encoded = Some(e),
                    Err(e) => tracing::error!(error = %e, "cannot encode a checkpoint"),
                }
            }
        }
        let index = st.applied_index;
        log.publish_applied(index, st.applied_term, st.membership.to_conf_state());
        drop(st);
        applied.set(index);
        let _ = node.send(Input::Applied(index));
        {
            let mut waiting = waiters.lock();
            for (id, outcome) in answers {
                if let Some(w) = waiting.remove(&id) {
                    let _ = w.send(outcome);
                }
            }
        }
        if let (Some(e), Some(tx)) = (encoded, to_write.as_ref()) {
            let index = e.applied;
            writing.store(true, Ordering::Release);
            if tx.send(e).is_err() {
                writing.store(false, Ordering::Release);
            }
            let _ = node.send(Input::Compact {
                index: index.saturating_sub(checkpointing.catch_up),
            });
        }
    }
    // Let a checkpoint being written finish before the final one is taken.
    drop(to_write);
    if let Some(thread) = checkpointer {
        let _ = thread.join();
    }
}

/// Catches lagging watchers up every `every`, and sends progress notifications every
/// `progress_every`, until told to stop.
fn watch_loop(
    state: Arc<RwLock<State>>,
    hub: Arc<Mutex<WatchHub>>,
    stop: Receiver<()>,
    every: std::time::Duration,
    progress_every: Option<std::time::Duration>,
) {
    let mut last_progress = std::time::Instant::now();
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(every) {
        let st = state.read();
        let mut hub = hub.lock();
        hub.catch_up(&st.store);
        if progress_every.is_some_and(|p| last_progress.elapsed() >= p) {
            last_progress = std::time::Instant::now();
            hub.progress(st.store.current_revision());
        }
    }
}

/// A watcher: the responses for one [`WatchRequest`]. Dropping it cancels the watch.
#[derive(Debug)]
pub struct Watch {
    id: u64,
    rx: Receiver<WatchResponse>,
    hub: std::sync::Weak<Mutex<WatchHub>>,
}

impl Watch {
    /// The next response, waiting for it; `None` once the engine is closed.
    pub fn recv(&self) -> Option<WatchResponse> {
        self.rx.recv().ok()
    }

    /// The next response if one arrives within `timeout`.
    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Option<WatchResponse> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// The next response if one is waiting.
    pub fn try_recv(&self) -> Option<WatchResponse> {
        self.rx.try_recv().ok()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(hub) = self.hub.upgrade() {
            hub.lock().cancel(self.id);
        }
    }
}

impl Inner {
    /// Logs `request` and queues it; the receiver gets its answer once applied.
    /// Where inputs for the node thread go.
    fn node_tx(&self) -> Result<Sender<Input>> {
        let replica = self.replica.lock();
        Ok(replica.as_ref().ok_or(Error::Closed)?.node.tx.clone())
    }

    /// The WAL, while the engine is open.
    fn wal(&self) -> Result<Arc<Wal>> {
        let replica = self.replica.lock();
        Ok(replica.as_ref().ok_or(Error::Closed)?.wal.clone())
    }

    fn submit(&self, request: Request) -> Result<(oneshot::Receiver<Answer>, std::time::Duration)> {
        let data = request.encode();
        self.submit_input(|id| Input::Propose { id, data })
    }

    /// Registers a waiter under a new request ID and hands the node the input `make` builds
    /// with that ID.
    fn submit_input(
        &self,
        make: impl FnOnce(u64) -> Input,
    ) -> Result<(oneshot::Receiver<Answer>, std::time::Duration)> {
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        let tx = self.node_tx()?;
        self.waiters.lock().insert(id, reply);
        if tx.send(make(id)).is_err() {
            self.waiters.lock().remove(&id);
            return Err(Error::Closed);
        }
        Ok((answer, self.config.request_timeout))
    }

    /// Waits until this member has applied everything committed when the read started
    /// (ReadIndex, batched with other reads), so that a read after it is linearizable.
    fn read_barrier(&self) -> Result<()> {
        let timeout = self.config.request_timeout;
        // The sole voter needs no round: no other member can have committed anything, so
        // waiting until everything in its log is applied makes the read linearizable.
        if let Some(index) = self.log.sole_voter_last_index(self.config.member_id) {
            return if self.applied.wait(index, timeout) {
                Ok(())
            } else {
                Err(Error::Timeout)
            };
        }
        let tx = self.node_tx()?;
        let (reply, answer) = bounded(1);
        tx.send(Input::ReadIndex { reply }).map_err(|_| Error::Closed)?;
        let index = match answer.recv_timeout(timeout) {
            Ok(index) => index?,
            Err(RecvTimeoutError::Timeout) => return Err(Error::Timeout),
            Err(RecvTimeoutError::Disconnected) => return Err(Error::Closed),
        };
        if self.applied.wait(index, timeout) {
            Ok(())
        } else {
            Err(Error::Timeout)
        }
    }

    /// etcd's quota check, before a write that adds `bytes` is logged: past the quota, the
    /// NOSPACE alarm is raised (durably, once) and the write refused.
    fn check_quota(&self, bytes: u64) -> Result<()> {
        let quota = self.config.quota_backend_bytes;
        if quota == 0 {
            return Ok(());
        }
        let (used, raised) = {
            let st = self.state.read();
            (st.store.size_in_use(), st.alarms.contains(&Alarm::NoSpace))
        };
        if used.saturating_add(bytes) <= quota {
            return Ok(());
        }
        if !raised {
            tracing::warn!(used, quota, "backend quota exceeded: raising the NOSPACE alarm");
            self.propose(Request::Alarm {
                activate: true,
                alarm: Alarm::NoSpace,
            })?;
        }
        Err(Error::NoSpace)
    }

    fn checkpoint_leases(&self) -> Result<()> {
        let remaining = self.state.read().lessor.remaining();
        if remaining.is_empty() {
            return Ok(());
        }
        self.propose(Request::LeaseCheckpoint { remaining }).map(|_| ())
    }

    fn propose(&self, request: Request) -> Answer {
        let (rx, timeout) = self.submit(request)?;
        wait_answer(rx, timeout)
    }

    /// Proposes a revoke for up to a batch of expired leases, all at once so their fsyncs are
    /// shared, and waits for them. Returns how many were revoked.
    /// One round of revokes (see `Config::lease_revoke_keys`): returns how many leases it
    /// revoked, and whether more expired ones are waiting.
    fn expire_leases(&self) -> (usize, bool) {
        // Only the leader expires leases, by proposing revokes, once it has restarted their
        // clocks in its term.
        let leading = self.status.leader.load(Ordering::Relaxed) == self.config.member_id
            && self.status.leases_term.load(Ordering::Acquire) == self.status.term.load(Ordering::Relaxed);
        if !leading {
            return (0, false);
        }
        let (expired, more) = self
            .state
            .write()
            .lessor
            .expired(self.config.lease_revoke_batch, self.config.lease_revoke_keys);
        let pending: Vec<_> = expired
            .into_iter()
            .map(|id| (id, self.submit(Request::LeaseRevoke { id })))
            .collect();
        let mut revoked = 0;
        for (id, answer) in pending {
            let outcome = answer.and_then(|(rx, timeout)| wait_answer(rx, timeout));
            match outcome {
                Ok(_) => revoked += 1,
                // Revoked meanwhile by a client: nothing to retry.
                Err(Error::LeaseNotFound) => {}
                Err(e) => {
                    tracing::warn!(lease = id, error = %e, "revoking an expired lease failed");
                    self.state.write().lessor.revoke_failed(id);
                }
            }
        }
        (revoked, more)
    }
}

/// Expires leases every `every`, and checkpoints their remaining TTLs every
/// `lease_checkpoint_interval`, until told to stop.
fn checker_loop(inner: Arc<Inner>, stop: Receiver<()>, every: std::time::Duration) {
    let checkpoint_every = inner.config.lease_checkpoint_interval;
    let clock = inner.config.clock.clone();
    let mut last_checkpoint = clock.now();
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(every) {
        // Round after round while expired leases remain; other writes get in between rounds
        // (they queue with the next round's revokes), and a stop request is seen between them.
        while let (revoked, true) = inner.expire_leases() {
            if revoked == 0 || !matches!(stop.try_recv(), Err(TryRecvError::Empty)) {
                break;
            }
        }
        if checkpoint_every.is_some_and(|period| clock.now().saturating_sub(last_checkpoint) >= period) {
            last_checkpoint = clock.now();
            if let Err(e) = inner.checkpoint_leases() {
                tracing::warn!(error = %e, "lease checkpoint failed");
            }
        }
    }
}

impl Engine {
    /// Opens (or creates) the engine in `dir`, recovering everything its log holds.
    pub fn open(dir: impl AsRef<Path>, config: Config) -> Result<Engine> {
        Engine::open_member(dir, config, Arc::new(NoPeers))
    }

    /// Opens (or creates) a member of a replicated group in `dir`: its ID is
    /// `config.member_id`; a new group's members are `config.initial_members`; messages to
    /// the others go through `transport`, and theirs arrive through [`Engine::receive`] or
    /// an [`Inbox`]. A member that was part of a group resumes from its own data, whatever
    /// `initial_members` says.
    pub fn open_member(dir: impl AsRef<Path>, config: Config, transport: Arc<dyn Transport>) -> Result<Engine> {
        config.validate()?;
        let dir = dir.as_ref().to_path_buf();
        // The WAL locks the directory: nothing below runs in two processes at once.
        let wal_dir = config.wal_dir.clone().unwrap_or_else(|| dir.join("wal"));
        let mut replay = Wal::open(wal_dir, config.wal.clone())?;
        let checkpoint = checkpoint::read(&dir)?;
        let store = Store::open(
            &dir.join(DATA_DIR),
            config.data_file_size,
            checkpoint.as_ref().map(|c| &c.store),
        )?;
        let mut state = State {
            store,
            lessor: Lessor::new(config.min_lease_ttl, config.clock.clone()),
            alarms: Default::default(),
            applied_index: 0,
            applied_term: 0,
            // Learned from the log: a new group's first entries add its members.
            membership: Membership::default(),
            recent: RecentRequests::default(),
            epoch: 0,
            installs: 0,
        };
        if let Some(c) = checkpoint {
            state.lessor.load(c.leases);
            state.lessor.apply_changes(&state.store.leased_keys()?);
            state.alarms = c.alarms.into_iter().collect();
            state.applied_index = c.applied_index;
            state.applied_term = c.applied_term;
            state.membership = c.membership;
            state.recent = c.recent;
            state.epoch = c.epoch;
        }
        // The Raft log after the checkpoint; the entries committed in it are applied by the
        // apply thread once the node hands them over, before `open` returns.
        let log = RaftLog::new(
            state.applied_index,
            state.applied_term,
            state.membership.to_conf_state(),
        );
        for record in replay.by_ref() {
            log.replay(record?)?;
        }
        log.finish_replay(config.snapshot_catch_up_entries);
        state.store.release_pages();
        let wal = Arc::new(replay.finish()?);
        if state.applied_index == 0 && log.last_index() == 0 && !config.join_existing {
            let members = if config.initial_members.is_empty() {
                vec![config.member_id]
            } else {
                config.initial_members.clone()
            };
            crate::consensus::log::bootstrap(&log, &wal, &members, &config.initial_attributes)?;
        }
        let single = if log.last_index() > state.applied_index && state.membership.voters.is_empty() {
            // A new group: its members are in its first entries.
            !config.join_existing && (config.initial_members.is_empty() || config.initial_members == [config.member_id])
        } else {
            state.membership.voters == [config.member_id] && state.membership.learners.is_empty()
        };
        // A group of one is leader again at once and commits everything in its log with the
        // empty entry of its new term (so leases have restarted their clocks by then too); a
        // member of a bigger group knows only what was committed before it stopped.
        let catch_up_to = if single {
            log.last_index() + 1
        } else {
            log.hard_state().commit
        };
        let applied = Arc::new(AppliedIndex::default());
        applied.set(state.applied_index);
        let node_config = NodeConfig {
            id: config.member_id,
            tick: config.raft_tick,
            election_ticks: config.election_ticks,
            heartbeat_ticks: config.heartbeat_ticks,
            applied: state.applied_index,
            read_timeout: config.request_timeout,
        };
        let state = Arc::new(RwLock::new(state));
        let hub = Arc::new(Mutex::new(WatchHub::new(config.watch_buffer, config.watch_batch)));
        let checkpointing = Arc::new(Checkpointing {
            newest: Mutex::new((state.read().applied_index, state.read().epoch)),
            catch_up: config.snapshot_catch_up_entries,
            latency_us: Mutex::new(cairn_wal::latency_histogram()),
        });
        let swept: Arc<Swept> = Arc::new((Mutex::new(()), parking_lot::Condvar::new()));
        let waiters: Arc<Waiters> = Arc::default();
        let (apply_tx, apply_rx) = unbounded();
        let status = Arc::new(Status::default());
        let snapshots = {
            let state = state.clone();
            Arc::new(move |out: &mut dyn std::io::Write| write_snapshot(&state, out))
        };
        let node = Node::spawn(
            node_config,
            log.clone(),
            wal.clone(),
            transport,
            apply_tx,
            status.clone(),
            snapshots,
        )?;
        let defragmenting = Arc::new(Mutex::new(()));
        let apply_thread = {
            let applier = Applier {
                state: state.clone(),
                hub: hub.clone(),
                wal: wal.clone(),
                dir: dir.clone(),
                checkpoint_entries: config.checkpoint_entries,
                compaction_batch: config.compaction_batch,
                checkpointing: checkpointing.clone(),
                swept: swept.clone(),
                waiters: waiters.clone(),
                applied: applied.clone(),
                node: node.tx.clone(),
                status: status.clone(),
                log: log.clone(),
                defragmenting: defragmenting.clone(),
            };
            std::thread::Builder::new()
                .name("cairn-apply".into())
                .spawn(move || apply_loop(apply_rx, applier))
                .map_err(|e| Error::Internal(format!("spawn apply thread: {e}")))?
        };
        let watch_thread = {
            let (state, hub) = (state.clone(), hub.clone());
            let (stop_tx, stop_rx) = bounded(0);
            let (every, progress_every) = (config.watch_sync_interval, config.watch_progress_interval);
            let thread = std::thread::Builder::new()
                .name("cairn-watch".into())
                .spawn(move || watch_loop(state, hub, stop_rx, every, progress_every))
                .map_err(|e| Error::Internal(format!("spawn watch thread: {e}")))?;
            (stop_tx, thread)
        };
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| i64::try_from(d.as_millis()).unwrap_or(1));
        let first_request = ((config.member_id & 0xffff) << 48) | ((seed as u64) << 8 & ((1 << 48) - 1));
        let inner = Arc::new(Inner {
            replica: Mutex::new(Some(Replica { node, wal })),
            log,
            status,
            waiters,
            next_request: AtomicU64::new(first_request),
            applied,
            state,
            hub,
            checkpointing,
            defragmenting,
            swept,
            next_lease_id: AtomicI64::new((seed << 8) & i64::MAX),
            config,
        });
        let engine = Engine {
            dir,
            inner,
            apply_thread: Mutex::new(Some(apply_thread)),
            checker: Mutex::new(None),
            watch_thread: Mutex::new(Some(watch_thread)),
        };
        let caught_up = engine
            .inner
            .applied
            .wait(catch_up_to, engine.inner.config.request_timeout);
        if !caught_up {
            return Err(Error::Timeout);
        }
        // Lease clocks restart now: a restart can delay expiry, never hasten it.
        engine.inner.state.write().lessor.restart_clocks();
        if let Some(every) = engine.inner.config.lease_check_interval {
            let (stop_tx, stop_rx) = bounded(0);
            let inner = engine.inner.clone();
            let thread = std::thread::Builder::new()
                .name("cairn-lease-check".into())
                .spawn(move || checker_loop(inner, stop_rx, every))
                .map_err(|e| Error::Internal(format!("spawn lease checker: {e}")))?;
            *engine.checker.lock() = Some((stop_tx, thread));
        }
        Ok(engine)
    }

    /// Hands this member a message from another member of its group (what their
    /// [`Transport`] sent). Never blocks; a message that does not decode is dropped.
    pub fn receive(&self, message: &[u8]) -> Result<()> {
        self.inbox()?.deliver(message)
    }

    /// Hands this member a snapshot from its leader (what the leader's
    /// [`Transport::send_snapshot`] sent); see [`Inbox::deliver_snapshot`].
    pub fn receive_snapshot(&self, message: &[u8], data: &mut dyn std::io::Read) -> Result<()> {
        self.inbox()?.deliver_snapshot(message, data)
    }

    /// A handle that delivers messages to this member without holding the engine (for a
    /// transport's receiving side).
    pub fn inbox(&self) -> Result<Inbox> {
        Ok(Inbox {
            tx: self.inner.node_tx()?,
            inner: Arc::downgrade(&self.inner),
        })
    }

    /// The group's membership, as this member has applied it.
    pub fn members(&self) -> Members {
        let st = self.inner.state.read();
        Members {
            voters: st.membership.voters.clone(),
            learners: st.membership.learners.clone(),
        }
    }

    /// Every member with its attributes, in ID order (etcd's `MemberList`), as this member
    /// has applied them.
    pub fn member_list(&self) -> Vec<Member> {
        let st = self.inner.state.read();
        let m = &st.membership;
        let mut ids: Vec<u64> = m
            .voters
            .iter()
            .chain(&m.voters_outgoing)
            .chain(&m.learners)
            .chain(&m.learners_next)
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|id| {
                let attributes = m.attributes.get(&id).cloned().unwrap_or_default();
                Member {
                    id,
                    is_learner: m.learners.contains(&id),
                    name: attributes.name,
                    peer_urls: attributes.peer_urls,
                    client_urls: attributes.client_urls,
                }
            })
            .collect()
    }

    /// Replaces member `id`'s peer URLs (etcd's `MemberUpdate`); returns once applied here.
    pub fn member_update(&self, id: u64, peer_urls: Vec<String>) -> Result<()> {
        self.inner.propose(Request::MemberUpdate { id, peer_urls }).map(|_| ())
    }

    /// Records this member's name and client URLs in the group (what an etcd member publishes
    /// when it starts); returns once applied here.
    pub fn member_publish(&self, name: String, client_urls: Vec<String>) -> Result<()> {
        let id = self.inner.config.member_id;
        self.inner
            .propose(Request::MemberPublish { id, name, client_urls })
            .map(|_| ())
    }

    fn change_members(&self, change: MemberChange) -> Result<()> {
        let (rx, timeout) = self.inner.submit_input(|id| Input::ConfChange { id, change })?;
        wait_answer(rx, timeout).map(|_| ())
    }

    /// Adds voter `id`, reached at `peer_urls` (etcd's `MemberAdd`); returns once the change
    /// is applied here. Call it on the leader. One membership change at a time: a second
    /// fails with [`Error::ConfChangePending`] until the first is applied.
    pub fn member_add(&self, id: u64, peer_urls: Vec<String>) -> Result<()> {
        self.change_members(MemberChange::AddVoter(id, MemberAttributes::with_peer_urls(peer_urls)))
    }

    /// Adds learner `id` (etcd's `MemberAdd` with `is_learner`): it receives the log but does
    /// not vote, until [`Engine::member_promote`].
    pub fn member_add_learner(&self, id: u64, peer_urls: Vec<String>) -> Result<()> {
        self.change_members(MemberChange::AddLearner(
            id,
            MemberAttributes::with_peer_urls(peer_urls),
        ))
    }

    /// Promotes learner `id` to voter (etcd's `MemberPromote`); it must have caught up with
    /// the leader ([`Error::LearnerNotReady`] otherwise).
    pub fn member_promote(&self, id: u64) -> Result<()> {
        self.change_members(MemberChange::Promote(id))
    }

    /// Removes member `id` (etcd's `MemberRemove`).
    pub fn member_remove(&self, id: u64) -> Result<()> {
        self.change_members(MemberChange::Remove(id))
    }

    /// Hands leadership to voter `to` (etcd's `MoveLeader`), waiting until this member sees
    /// it leading or `Config::request_timeout` passes. Call it on the leader.
    pub fn move_leader(&self, to: u64) -> Result<()> {
        let config = &self.inner.config;
        let deadline = std::time::Instant::now() + config.request_timeout;
        // raft-rs abandons a transfer that has not finished within an election timeout (the
        // transferee was catching up, a message was lost): ask again until the deadline.
        let attempt = config.raft_tick * u32::try_from(config.election_ticks * 2).unwrap_or(u32::MAX);
        loop {
            let tx = self.inner.node_tx()?;
            let (reply, answer) = bounded(1);
            tx.send(Input::TransferLeader { to, reply })
                .map_err(|_| Error::Closed)?;
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match answer.recv_timeout(left) {
                Ok(Ok(())) => {}
                // Leadership moved already (to `to`, or on to someone else).
                Ok(Err(Error::NotLeader)) if self.leader() == Some(to) => return Ok(()),
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(Error::Timeout),
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if self.inner.status.wait_leader(to, attempt.min(left)) {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
        }
    }

    /// The leader this member knows of, if any.
    pub fn leader(&self) -> Option<u64> {
        match self.inner.status.leader.load(Ordering::Relaxed) {
            0 => None,
            id => Some(id),
        }
    }

    /// How many committed log entries this member has not applied yet (etcd refuses writes
    /// while this is large). Cheap enough for every request: no state lock.
    pub fn apply_lag(&self) -> u64 {
        let committed = self.inner.log.hard_state().commit;
        committed.saturating_sub(*self.inner.applied.index.lock())
    }

    /// The current Raft term, as this member knows it (cheap: one atomic read).
    pub fn term(&self) -> u64 {
        self.inner.status.term.load(Ordering::Relaxed)
    }

    /// What this member knows of Raft now (etcd's `Status` fields).
    pub fn raft_status(&self) -> RaftStatus {
        let (applied_index, is_learner) = {
            let st = self.inner.state.read();
            (
                st.applied_index,
                st.membership.learners.contains(&self.inner.config.member_id),
            )
        };
        let status = &self.inner.status;
        RaftStatus {
            leader: self.leader(),
            term: status.term.load(Ordering::Relaxed),
            commit_index: self.inner.log.hard_state().commit,
            applied_index,
            is_learner,
            leader_changes: status.leader_changes.load(Ordering::Relaxed),
            proposals_pending: self.inner.waiters.lock().len() as u64,
            proposals_failed: status.proposals_failed.load(Ordering::Relaxed),
        }
    }

    /// This member's ID.
    pub fn member_id(&self) -> u64 {
        self.inner.config.member_id
    }

    /// The directory the engine lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Puts a key (etcd's `Put`).
    pub fn put(&self, request: PutRequest) -> Result<Applied<PutResponse>> {
        self.put_async(request)?.wait()
    }

    /// [`Engine::put`] for async code: logs the request now, and the returned [`Pending`]
    /// can be awaited (or waited on).
    pub fn put_async(&self, request: PutRequest) -> Result<Pending<Applied<PutResponse>>> {
        request.validate()?;
        self.inner
            .check_quota(crate::mvcc::store::record_size(request.key.len(), request.value.len()))?;
        let rx = self.inner.submit(Request::Put(request))?;
        Ok(Pending::new(rx, |answer| match answer {
            (Response::Put(response), revision) => Ok(Applied { response, revision }),
            (other, _) => Err(unexpected("put", other)),
        }))
    }

    /// Deletes a key or range (etcd's `DeleteRange`).
    pub fn delete_range(&self, request: DeleteRangeRequest) -> Result<Applied<DeleteRangeResponse>> {
        self.delete_range_async(request)?.wait()
    }

    /// [`Engine::delete_range`] for async code.
    pub fn delete_range_async(&self, request: DeleteRangeRequest) -> Result<Pending<Applied<DeleteRangeResponse>>> {
        if request.key.is_empty() {
            return Err(Error::EmptyKey);
        }
        let rx = self.inner.submit(Request::DeleteRange(request))?;
        Ok(Pending::new(rx, |answer| match answer {
            (Response::DeleteRange(response), revision) => Ok(Applied { response, revision }),
            (other, _) => Err(unexpected("delete", other)),
        }))
    }

    /// Runs a transaction (etcd's `Txn`).
    pub fn txn(&self, request: TxnRequest) -> Result<Applied<TxnResponse>> {
        self.txn_async(request)?.wait()
    }

    /// [`Engine::txn`] for async code.
    pub fn txn_async(&self, request: TxnRequest) -> Result<Pending<Applied<TxnResponse>>> {
        request.validate(self.inner.config.max_txn_ops)?;
        if !request.is_read_only() {
            self.inner.check_quota(request.put_bytes())?;
        }
        let rx = self.inner.submit(Request::Txn(request))?;
        Ok(Pending::new(rx, |answer| match answer {
            (Response::Txn(response), revision) => Ok(Applied { response, revision }),
            (other, _) => Err(unexpected("txn", other)),
        }))
    }

    /// Drops history below `revision` (etcd's `Compact`).
    pub fn compact(&self, revision: i64) -> Result<Applied<()>> {
        match self.inner.propose(Request::Compact { revision })? {
            (Response::Compact, revision) => Ok(Applied { response: (), revision }),
            (other, _) => Err(Error::Internal(format!("compact answered with {other:?}"))),
        }
    }

    /// Waits until the history dropped by compactions so far is gone from the index and the
    /// revision log, not only hidden (etcd's `Compact` with `physical`); [`Engine::defragment`]
    /// then returns its space.
    pub fn wait_compacted(&self) -> Result<()> {
        let (lock, signal) = &*self.inner.swept;
        let mut guard = lock.lock();
        while self.inner.state.read().store.compaction_unfinished() {
            if self.inner.replica.lock().is_none() {
                return Err(Error::Closed);
            }
            signal.wait_for(&mut guard, std::time::Duration::from_millis(100));
        }
        Ok(())
    }

    /// Reads a key or range (etcd's `Range`), concurrently with other reads. Linearizable
    /// unless `request.serializable`: it first waits for a ReadIndex round (shared with the
    /// other reads in flight) and for this member to apply up to it; a serializable read is
    /// served from the local state at once.
    pub fn range(&self, request: &RangeRequest) -> Result<RangeResponse> {
        if request.key.is_empty() {
            return Err(Error::EmptyKey);
        }
        if !request.serializable {
            self.inner.read_barrier()?;
        }
        request.apply(&self.inner.state.read().store)
    }

    /// Waits until this member has applied everything committed when it was called: what it
    /// reads next is linearizable (a ReadIndex round, shared with concurrent reads).
    pub fn read_barrier(&self) -> Result<()> {
        self.inner.read_barrier()
    }

    /// Grants a lease (etcd's `LeaseGrant`); `id` 0 lets the engine choose one.
    pub fn lease_grant(&self, id: i64, ttl: i64) -> Result<Applied<LeaseGrant>> {
        self.inner.check_quota(crate::mvcc::store::record_size(0, 0))?;
        let ttl = self.inner.state.read().lessor.effective_ttl(ttl);
        let id = if id != 0 {
            id
        } else {
            loop {
                let candidate = self.inner.next_lease_id.fetch_add(1, Ordering::Relaxed).max(1);
                if !self.inner.state.read().lessor.exists(candidate) {
                    break candidate;
                }
            }
        };
        match self.inner.propose(Request::LeaseGrant { id, ttl })? {
            (Response::LeaseGrant { id, ttl }, revision) => Ok(Applied {
                response: LeaseGrant { id, ttl },
                revision,
            }),
            (other, _) => Err(Error::Internal(format!("lease grant answered with {other:?}"))),
        }
    }

    /// Revokes a lease, deleting its keys in one revision (etcd's `LeaseRevoke`).
    pub fn lease_revoke(&self, id: i64) -> Result<Applied<()>> {
        match self.inner.propose(Request::LeaseRevoke { id })? {
            (Response::LeaseRevoke, revision) => Ok(Applied { response: (), revision }),
            (other, _) => Err(Error::Internal(format!("lease revoke answered with {other:?}"))),
        }
    }

    /// Renews a lease for its full TTL (etcd's `LeaseKeepAlive`); returns the TTL. Only the
    /// leader, which expires leases, renews them ([`Error::NotLeader`] elsewhere: send the
    /// keep-alive to [`Engine::leader`]). A renewal is local, except that a checkpointed
    /// remaining TTL is cleared through the log, as etcd does, so a restart cannot resume from
    /// it.
    pub fn lease_keep_alive(&self, id: i64) -> Result<i64> {
        if self.leader() != Some(self.inner.config.member_id) {
            return Err(Error::NotLeader);
        }
        // Everything committed is applied first (etcd's waitAppliedIndex), so a lease granted
        // through another member is known here.
        self.inner.read_barrier()?;
        let (ttl, stale_checkpoint) = self.inner.state.write().lessor.renew(id)?;
        if stale_checkpoint {
            self.inner.propose(Request::LeaseCheckpoint {
                remaining: vec![(id, 0)],
            })?;
        }
        Ok(ttl)
    }

    /// A lease's remaining and granted TTL, and optionally its keys (etcd's `LeaseTimeToLive`;
    /// TTL -1 for an unknown lease).
    pub fn lease_time_to_live(&self, id: i64, keys: bool) -> LeaseStatus {
        self.inner.state.read().lessor.time_to_live(id, keys)
    }

    /// Every lease ID (etcd's `LeaseLeases`).
    pub fn leases(&self) -> Vec<i64> {
        self.inner.state.read().lessor.leases()
    }

    /// Revokes one round of expired leases now (at most `Config::lease_revoke_batch` leases,
    /// holding at most `Config::lease_revoke_keys` keys, but always one); returns how many.
    /// The lease checker runs rounds periodically unless `Config::lease_check_interval` is
    /// `None`.
    pub fn expire_leases(&self) -> usize {
        self.inner.expire_leases().0
    }

    /// Records every lease's remaining TTL durably, so that a restart resumes from it. The
    /// lease checker does this every `Config::lease_checkpoint_interval`.
    pub fn checkpoint_leases(&self) -> Result<()> {
        self.inner.checkpoint_leases()
    }

    /// Watches a key or range from `start_revision` (etcd's `Watch`). Past revisions are
    /// replayed from history, then changes follow as they are applied.
    /// An empty key means `"\0"`, as in etcd (with `range_end` `"\0"`: every key).
    pub fn watch(&self, request: &WatchRequest) -> Result<Watch> {
        self.watch_waking(request, None)
    }

    /// [`Engine::watch`], calling `wake` after each response is queued for the watcher (for a
    /// consumer that serves many watchers and waits for any of them, such as a gRPC stream).
    /// `wake` runs on the engine's threads, under its locks: it must only signal, never block.
    pub fn watch_waking(&self, request: &WatchRequest, wake: Option<Wake>) -> Result<Watch> {
        let owned;
        let request = if request.key.is_empty() {
            owned = WatchRequest {
                key: vec![0],
                ..request.clone()
            };
            &owned
        } else {
            request
        };
        let st = self.inner.state.read();
        let (id, rx) = self.inner.hub.lock().watch(
            request,
            st.store.current_revision(),
            st.store.compacted_revision(),
            wake,
        );
        Ok(Watch {
            id,
            rx,
            hub: Arc::downgrade(&self.inner.hub),
        })
    }

    /// Sends progress notifications now, as the periodic tick
    /// (`Config::watch_progress_interval`) does: every synced watcher that asked for them and
    /// was sent nothing since the last tick gets [`WatchResponse::Progress`].
    pub fn notify_progress(&self) {
        let st = self.inner.state.read();
        self.inner.hub.lock().progress(st.store.current_revision());
    }

    /// etcd's progress-request rule: the current revision if every one of `watches` has
    /// received everything up to it, else `None` (ask again later). A stream answers a
    /// progress request only when this says so; kube-apiserver relies on it for consistent
    /// reads from its watch cache.
    pub fn watch_progress(&self, watches: &[&Watch]) -> Option<i64> {
        let st = self.inner.state.read();
        let current = st.store.current_revision();
        let hub = self.inner.hub.lock();
        watches.iter().all(|w| hub.caught_up(w.id, current)).then_some(current)
    }

    /// Writes a snapshot of the complete state (history, leases, alarms, applied index) to
    /// `out`, as of now; returns its size. Records are copied out a chunk at a time, so memory
    /// stays bounded and writes go on meanwhile (the compaction sweep waits until it is done).
    /// [`Engine::restore`] turns a snapshot into a data directory.
    pub fn snapshot(&self, out: &mut dyn std::io::Write) -> Result<u64> {
        write_snapshot(&self.inner.state, out)
    }

    /// Creates the data directory `dir` from a snapshot taken by [`Engine::snapshot`], in
    /// bounded memory; open it with [`Engine::open`] afterwards. Refuses a damaged snapshot,
    /// and a directory that already holds an engine.
    pub fn restore(snapshot: &mut dyn std::io::Read, dir: impl AsRef<Path>) -> Result<()> {
        Engine::restore_with(snapshot, dir.as_ref(), None)
    }

    /// [`Engine::restore`] for the first member of a new cluster made from a snapshot (etcd's
    /// `snapshot restore`): the state is the snapshot's, but the group is `members` (each
    /// with its attributes), whatever group took the snapshot. Every member of the new
    /// cluster is restored from the same snapshot with the same `members`.
    pub fn restore_as_new_cluster(
        snapshot: &mut dyn std::io::Read,
        dir: impl AsRef<Path>,
        members: &std::collections::BTreeMap<u64, MemberAttributes>,
    ) -> Result<()> {
        if members.is_empty() {
            return Err(Error::InvalidConfig("a new cluster needs at least one member".into()));
        }
        let membership = Membership {
            voters: members.keys().copied().collect(),
            attributes: members.clone(),
            ..Membership::default()
        };
        Engine::restore_with(snapshot, dir.as_ref(), Some(membership))
    }

    /// Checks a snapshot from end to end and describes it, without restoring it.
    pub fn inspect_snapshot(snapshot: &mut dyn std::io::Read) -> Result<SnapshotInfo> {
        let mut alive: HashMap<Vec<u8>, bool> = HashMap::new();
        let mut records = 0u64;
        let meta = snapshot::read(snapshot, |record| {
            records += 1;
            alive.insert(record.key.to_vec(), record.version > 0);
            Ok(())
        })?;
        Ok(SnapshotInfo {
            revision: meta.current,
            compact_revision: meta.compacted,
            applied_index: meta.applied_index,
            records,
            keys: alive.values().filter(|a| **a).count() as u64,
            leases: meta.leases.len() as u64,
        })
    }

    fn restore_with(snapshot: &mut dyn std::io::Read, dir: &Path, membership: Option<Membership>) -> Result<()> {
        if checkpoint::in_use(dir) {
            return Err(Error::Snapshot(format!(
                "{} already holds data; restore into a new directory",
                dir.display()
            )));
        }
        let data_dir = dir.join(DATA_DIR);
        let restored = (|| {
            let mut backend = crate::backend::Backend::open(&data_dir, Config::default().data_file_size, &[])?;
            let meta = snapshot::read(snapshot, |record| backend.append(&record).map(|_| ()))?;
            backend.flush()?;
            Ok::<_, Error>((meta, backend.layout()))
        })();
        let (meta, layout) = match restored {
            Ok(done) => done,
            Err(e) => {
                // Nothing names these files yet: leave no half-restored directory behind.
                let _ = std::fs::remove_dir_all(&data_dir);
                return Err(e);
            }
        };
        let new_cluster = membership.is_some();
        let c = Checkpoint {
            applied_index: meta.applied_index,
            applied_term: meta.applied_term,
            membership: membership.unwrap_or(meta.membership),
            // A new cluster's requests are new: nothing to skip.
            recent: if new_cluster {
                RecentRequests::default()
            } else {
                meta.recent
            },
            epoch: 0,
            store: StoreMeta {
                current: meta.current,
                compacted: meta.compacted,
                layout,
            },
            leases: meta.leases,
            alarms: meta.alarms,
        };
        FileMaker::sync_files(&data_dir, &c.store.layout)?;
        checkpoint::write_bytes(dir, &checkpoint::encode(&c)?)
    }

    /// Rewrites the records still in history into fresh data files and deletes the old ones,
    /// returning the space compaction freed to the file system (etcd's `Defragment`). Reads
    /// and writes go on throughout: records are copied without the state lock, and the lock is
    /// taken only briefly, to point a batch of records at their copies and, at the end, to
    /// switch files. Crash-safe at every step: the old files are deleted only once a
    /// checkpoint naming the new ones is durable; until then the old checkpoint still holds.
    pub fn defragment(&self) -> Result<Defragmented> {
        let _one = self.inner.defragmenting.lock();
        let wal = self.inner.wal()?;
        let state = &self.inner.state;
        let (defrag, before) = {
            let mut st = state.write();
            let before = st.store.size();
            (st.store.begin_defrag()?, before)
        };
        let mut out = None;
        let mut fresh = Vec::new();
        let mut after = None;
        let mut pending: Vec<(crate::Revision, crate::backend::Loc)> = Vec::new();
        // Makes the filled copies readable, then points their records at them, a batch per
        // lock hold.
        let migrate = |files: Vec<(u32, crate::backend::Sealed)>, moved: &[(crate::Revision, crate::backend::Loc)]| {
            state.write().store.defrag_register(files);
            for batch in moved.chunks(DEFRAG_BATCH) {
                state.write().store.defrag_migrate(batch);
            }
        };
        loop {
            let chunk = state.read().store.defrag_chunk(&defrag, after, DEFRAG_BATCH);
            let Some((last, _)) = chunk.last() else { break };
            after = Some(*last);
            let (moved, filled) = defrag.copy(&chunk, &mut out)?;
            pending.extend(moved);
            if !filled.is_empty() {
                // Records in the file still being filled stay pending until it is sealed.
                let sealed: Vec<u32> = filled.iter().map(|(id, _)| *id).collect();
                let (ready, rest): (Vec<_>, Vec<_>) = pending.drain(..).partition(|(_, l)| sealed.contains(&l.file));
                pending = rest;
                fresh.extend(sealed);
                migrate(filled, &ready);
            }
        }
        if let Some(active) = out.take() {
            let (id, sealed) = defrag.finish(active)?;
            fresh.push(id);
            migrate(vec![(id, sealed)], &pending);
        }
        let (encoded, old_paths, after_size) = {
            let mut st = state.write();
            let old = st.store.defrag_switch(&defrag, &fresh)?;
            st.epoch += 1;
            (st.checkpoint()?, old, st.store.size())
        };
        write_and_release(&self.dir, &encoded, &wal, &self.inner.checkpointing)?;
        for path in old_paths {
            if let Err(e) = crate::backend::delete_gradually(&path) {
                tracing::warn!(file = %path.display(), error = %e, "cannot delete an old data file");
            }
        }
        Ok(Defragmented {
            before,
            after: after_size,
        })
    }

    /// Writes a checkpoint now and releases the log before it (also done every
    /// `Config::checkpoint_entries` entries and on close).
    pub fn checkpoint(&self) -> Result<()> {
        let wal = self.inner.wal()?;
        let encoded = self.inner.state.write().checkpoint()?;
        write_and_release(&self.dir, &encoded, &wal, &self.inner.checkpointing)
    }

    /// How many snapshots from the leader this member has installed since it was opened (a
    /// follower too far behind for the leader's log is sent one).
    pub fn snapshots_installed(&self) -> u64 {
        self.inner.state.read().installs
    }

    /// The alarms raised (etcd's `Alarm` list).
    pub fn alarms(&self) -> Vec<Alarm> {
        self.inner.state.read().alarms.iter().copied().collect()
    }

    /// Raises `alarm` on every member (etcd's `Alarm` ACTIVATE); returns once applied here.
    pub fn alarm_activate(&self, alarm: Alarm) -> Result<()> {
        self.inner.propose(Request::Alarm { activate: true, alarm }).map(|_| ())
    }

    /// Disarms an alarm (etcd's `Alarm` deactivate), durably.
    pub fn alarm_disarm(&self, alarm: Alarm) -> Result<()> {
        self.inner
            .propose(Request::Alarm { activate: false, alarm })
            .map(|_| ())
    }

    /// Bytes the data files take (etcd's `dbSize`): history kept, plus what compaction freed
    /// and [`Engine::defragment`] would return.
    pub fn size(&self) -> u64 {
        self.inner.state.read().store.size()
    }

    /// The WAL's counters and latency histograms (fsyncs, group-commit batches), for metrics.
    pub fn wal_stats(&self) -> Result<cairn_wal::StatsSnapshot> {
        Ok(self.inner.wal()?.stats())
    }

    /// How long checkpoints took to write (data files synced, checkpoint file written and
    /// synced), in microseconds: etcd's backend commit, for metrics.
    pub fn checkpoint_latency_us(&self) -> hdrhistogram::Histogram<u64> {
        self.inner.checkpointing.latency_us.lock().clone()
    }

    /// Watchers open now.
    pub fn watcher_count(&self) -> usize {
        self.inner.hub.lock().len()
    }

    /// Keys that exist now (etcd's `keys_total`); kept by the index, not counted.
    pub fn key_count(&self) -> usize {
        self.inner.state.read().store.key_count()
    }

    /// Bytes of history kept (etcd's `dbSizeInUse`; what the quota limits).
    pub fn size_in_use(&self) -> u64 {
        self.inner.state.read().store.size_in_use()
    }

    /// The revision history was compacted at (0 if never).
    pub fn compacted_revision(&self) -> i64 {
        self.inner.state.read().store.compacted_revision()
    }

    /// etcd's `HashKV`: a hash of the history kept up to `revision` (0 for the current one),
    /// equal on members that applied the same log, and across restarts.
    pub fn hash_kv(&self, revision: i64) -> Result<HashKv> {
        self.inner.state.read().store.hash_kv(revision)
    }

    /// The store's current revision.
    pub fn current_revision(&self) -> i64 {
        self.inner.state.read().store.current_revision()
    }

    /// Stops accepting writes, lets every queued one finish, and syncs the log.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&self) -> Result<()> {
        for stopper in [&self.checker, &self.watch_thread] {
            if let Some((stop, thread)) = stopper.lock().take() {
                drop(stop);
                let _ = thread.join();
            }
        }
        let replica = self.inner.replica.lock().take();
        let Some(Replica { node, wal }) = replica else {
            return Ok(());
        };
        // The node stops first; the apply thread then applies what it was handed and ends.
        node.stop();
        if let Some(t) = self.apply_thread.lock().take() {
            let _ = t.join();
        }
        // Proposals never committed: their callers get `Closed`.
        self.inner.waiters.lock().clear();
        // Everything queued is applied: checkpoint it, so the next open replays nothing.
        checkpoint_and_release(
            &self.dir,
            &mut self.inner.state.write(),
            &wal,
            &self.inner.checkpointing,
        )?;
        match Arc::try_unwrap(wal) {
            Ok(wal) => wal.close()?,
            Err(shared) => {
                shared.sync()?.wait()?;
            }
        }
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(applied: u64) -> Encoded {
        let mut state = State {
            store: Store::new(),
            lessor: Lessor::new(1, Arc::new(crate::clock::ManualClock::default())),
            alarms: Default::default(),
            applied_index: applied,
            applied_term: 0,
            membership: Membership::default(),
            recent: RecentRequests::default(),
            epoch: 0,
            installs: 0,
        };
        let mut c = state.checkpoint().unwrap();
        c.layout.clear();
        c
    }

    #[test]
    fn an_older_checkpoint_never_replaces_a_newer_one() {
        // The log before the newer one may be released already: going back would lose it.
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(DATA_DIR)).unwrap();
        let wal = Wal::open(dir.path().join("wal"), cairn_wal::Config::default())
            .unwrap()
            .finish()
            .unwrap();
        let checkpointing = Checkpointing {
            newest: Mutex::new((0, 0)),
            catch_up: 5000,
            latency_us: Mutex::new(cairn_wal::latency_histogram()),
        };
        write_and_release(dir.path(), &at(10), &wal, &checkpointing).unwrap();
        write_and_release(dir.path(), &at(5), &wal, &checkpointing).unwrap();
        assert_eq!(checkpoint::read(dir.path()).unwrap().unwrap().applied_index, 10);
        write_and_release(dir.path(), &at(12), &wal, &checkpointing).unwrap();
        assert_eq!(checkpoint::read(dir.path()).unwrap().unwrap().applied_index, 12);
    }
}
