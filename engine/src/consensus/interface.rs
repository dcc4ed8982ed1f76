//! What the node thread ([`super::node`]) is told and tells: its inputs, what it hands the
//! apply thread, its configuration and the status it keeps, and the [`Transport`] its messages
//! leave by. The engine speaks to the node only in these types; the thread's own workings stay
//! in `node.rs`.

use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use protobuf::Message as _;
use raft::eraftpb::{Entry, Message};

use crate::error::{Error, Result};
use crate::membership::{ConfApplied, MemberAttributes};

/// Where Raft messages for the other members of a group go: the seam for the network. A
/// message is opaque bytes, delivered to the member `to` through its [`crate::Inbox`]
/// ([`crate::Inbox::deliver`]).
///
/// Delivery is best effort: Raft retries what is lost, and tolerates duplicates and reordering.
/// `send` is called on the node thread and must not block.
pub trait Transport: Send + Sync {
    /// Sends `message` to member `to`.
    fn send(&self, to: u64, message: bytes::Bytes);

    /// Streams a snapshot to member `to`: `message` is the raft message that carries its
    /// metadata, `data` the engine's state; the receiver hands both to
    /// [`crate::Inbox::deliver_snapshot`]. Returns once the receiver has installed it, or with
    /// the reason it failed (raft then tries again later). Called on a thread of its own: it
    /// may take as long as the transfer does. `data` is read to its end, in order, once.
    fn send_snapshot(&self, to: u64, message: bytes::Bytes, data: &mut dyn std::io::Read) -> std::io::Result<()>;
}

/// The transport of a group of one: there is no one to send to.
pub(crate) struct NoPeers;

impl Transport for NoPeers {
    fn send(&self, to: u64, _message: bytes::Bytes) {
        tracing::warn!(to, "a raft message for a peer in a group of one");
    }

    fn send_snapshot(&self, to: u64, _message: bytes::Bytes, _data: &mut dyn std::io::Read) -> std::io::Result<()> {
        Err(std::io::Error::other(format!("a group of one has no member {to}")))
    }
}

pub(super) fn send_all(transport: &dyn Transport, messages: Vec<Message>) {
    for m in messages {
        match m.write_to_bytes() {
            Ok(bytes) => transport.send(m.to, bytes::Bytes::from(bytes)),
            Err(e) => tracing::error!(error = %e, "cannot encode a raft message"),
        }
    }
}

/// A membership change, as the engine asks for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MemberChange {
    AddVoter(u64, MemberAttributes),
    AddLearner(u64, MemberAttributes),
    /// A learner becomes a voter; it must have caught up with the leader.
    Promote(u64),
    Remove(u64),
}

/// What the node thread publishes about itself, for the engine to read without asking.
#[derive(Debug, Default)]
pub(crate) struct Status {
    /// The leader this member knows of (0: none).
    pub(crate) leader: std::sync::atomic::AtomicU64,
    /// The current term.
    pub(crate) term: std::sync::atomic::AtomicU64,
    /// The term in which this member, as leader, restarted its leases' clocks: it may expire
    /// leases only while this is the current term.
    pub(crate) leases_term: std::sync::atomic::AtomicU64,
    /// How many times this member has seen a new leader (etcd's `leader_changes_seen_total`).
    pub(crate) leader_changes: std::sync::atomic::AtomicU64,
    /// Proposals dropped before they were committed (etcd's `proposals_failed_total`).
    pub(crate) proposals_failed: std::sync::atomic::AtomicU64,
    /// Whether this member is a learner in the membership it has applied (kept by the apply
    /// thread; the server refuses most calls on a learner, as etcd does).
    pub(crate) learner: std::sync::atomic::AtomicBool,
    /// Notified when the leader changes.
    changed: (parking_lot::Mutex<()>, parking_lot::Condvar),
    /// Why this member stopped accepting writes for good (its WAL failed), once it has.
    pub(crate) failed: parking_lot::Mutex<Option<Error>>,
}

impl Status {
    pub(super) fn set_leader(&self, leader: u64) {
        let _guard = self.changed.0.lock();
        let before = self.leader.swap(leader, std::sync::atomic::Ordering::Relaxed);
        if leader != 0 && leader != before {
            self.leader_changes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.changed.1.notify_all();
    }

    /// Waits until `leader` leads, as far as this member knows; false on timeout.
    pub(crate) fn wait_leader(&self, leader: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut guard = self.changed.0.lock();
        while self.leader.load(std::sync::atomic::Ordering::Relaxed) != leader {
            if self.changed.1.wait_until(&mut guard, deadline).timed_out() {
                return self.leader.load(std::sync::atomic::Ordering::Relaxed) == leader;
            }
        }
        true
    }
}

/// What the node thread is asked to do.
pub(crate) enum Input {
    /// Propose `data`; `id` identifies its waiter when the entry is applied.
    Propose { id: u64, data: Vec<u8> },
    /// Propose `data` only as the leader of `term`, which decided it (an expired lease's
    /// revoke, a lease checkpoint): never forwarded, nor held. A member that led an earlier
    /// term and decided by its own clock (a paused leader resuming) must not have its decision
    /// carried to the new leader, which renewed the lease meanwhile. Answered
    /// [`Error::NotLeader`] otherwise.
    ProposeAsLeader { id: u64, data: Vec<u8>, term: u64 },
    /// Start (or join) a ReadIndex round; the answer is the index to wait for.
    ReadIndex { reply: oneshot::Sender<Result<u64>> },
    /// The apply thread applied everything up to this index.
    Applied(u64),
    /// A checkpoint covers the log up to this index (less a catch-up margin): the in-memory
    /// copy can go.
    Compact { index: u64 },
    /// Propose a membership change (joint consensus); `id` identifies its waiter.
    ConfChange { id: u64, change: MemberChange },
    /// Hand leadership to `to`; the answer (the transferee) comes once the request is stepped.
    TransferLeader { to: Transferee, reply: Sender<Result<u64>> },
    /// A message from a peer.
    Step(Message),
    /// A snapshot from the leader (`message`), its state staged beside the live one; the
    /// answer says whether raft accepted and the state was installed.
    Snapshot {
        message: Message,
        staged: Staged,
        reply: Sender<Result<bool>>,
    },
    /// How streaming a snapshot to member `to` ended.
    SnapshotSent { to: u64, delivered: bool },
    /// Stop the node thread.
    Stop,
}

/// Whom a leader hands its leadership to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Transferee {
    /// This voter.
    Member(u64),
    /// The voter whose log matches the leader's furthest, among those recently heard from
    /// (a leader stepping down as it shuts down).
    MostCaughtUp,
}

/// Where the node thread hands what it has to apply, in order: to the apply thread, which may
/// lend the node thread its state for a small batch (the engine's `Handoff`).
pub(crate) trait ApplyQueue: Send {
    /// Hands `work` over, after everything handed before; fails once the apply side is gone.
    fn send(&self, work: ToApply) -> Result<()>;

    /// As `send`, but a small batch of entries may be applied on the calling thread, if the
    /// apply side is idle: for the node thread of a group's sole member with nothing else to
    /// do.
    fn send_or_apply(&self, work: ToApply) -> Result<()>;
}

/// What the apply thread is handed.
pub(crate) enum ToApply {
    /// Committed entries, in order, each with the membership change it applied, if any.
    Entries(Vec<(Entry, Option<ConfApplied>)>),
    /// A proposal that will never be applied.
    Dropped { id: u64, error: Error },
    /// This member became the leader in `term`: leases restart their clocks (never expiring
    /// early), and only then may this member expire them.
    BecameLeader { term: u64 },
    /// A snapshot raft accepted: the staged state replaces the live one (after everything
    /// handed over before it is applied), durably, before the answer.
    Install { staged: Staged, reply: Sender<Result<()>> },
    /// Nothing to apply: a batch applied on the node thread left a compaction unfinished, for
    /// the apply thread to sweep.
    Sweep,
}

/// Tunables of the node.
#[derive(Clone, Debug)]
pub(crate) struct NodeConfig {
    pub(crate) id: u64,
    pub(crate) tick: Duration,
    pub(crate) election_ticks: usize,
    pub(crate) heartbeat_ticks: usize,
    /// The last index the state machine has applied (from the checkpoint and what open
    /// replayed).
    pub(crate) applied: u64,
    /// A ReadIndex round not answered in this long fails: a request's timeout. A proposal
    /// is held ([`Held`]) for half of it.
    pub(crate) read_timeout: Duration,
    /// Raft's pre-vote (etcd's `--pre-vote`).
    pub(crate) pre_vote: bool,
    /// A member of several starts with its election clock nearly run out (etcd's
    /// `--initial-election-tick-advance`).
    pub(crate) advance_election_ticks: bool,
}

/// A state received from the leader, staged beside the live one by the engine. The node only
/// carries it, from the inbox to the apply thread once raft accepts the snapshot: it knows its
/// index and nothing of what it holds.
pub(crate) trait StagedState: Send + std::fmt::Debug {
    /// The log index the state is at.
    fn index(&self) -> u64;

    /// The state, for the engine to take back as its own type.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send>;
}

/// A staged state, as the node carries it.
pub(crate) type Staged = Box<dyn StagedState>;
