//! The node thread: the one owner of raft-rs's `RawNode`.
//!
//! It ticks on a timer, steps messages from peers, proposes requests, starts ReadIndex rounds,
//! and handles each Ready in the order raft-rs documents for asynchronous persistence:
//! 1. send the messages that need no persistence (a leader's appends and heartbeats);
//! 2. hand the committed entries to the apply thread (conf changes are applied to raft here
//!    first, as raft-rs requires);
//! 3. answer finished ReadIndex rounds;
//! 4. put the new entries and HardState into the in-memory [`RaftLog`] (raft-rs reads them
//!    back at once) and append them to the WAL without waiting, then
//!    `advance_append_async`;
//! 5. once each append's fsync is done (the WAL's completion wakes this thread), in order,
//!    send that Ready's persisted messages (votes, append responses) and pass the Ready on
//!    with `on_persist_ready`.
//!
//! So the WAL's group commit batches the fsyncs of many Readies, and of many proposals per
//! Ready, and the node thread of a group of several never waits for the disk. A group's sole
//! member has no peer waiting on it: its node thread writes and syncs each Ready itself while
//! the WAL's thread is idle (step 4 with [`Wal::append_here`]), and the proposals that arrive
//! meanwhile share the next Ready's fsync.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::VecDeque;
use std::future::{Future as _, IntoFuture as _};

use cairn_wal::{Durability, LogIndex, Record, TicketFuture, Wal};
use crossbeam_channel::{bounded, Receiver, Sender};
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeV2, ConfState, Entry, EntryType, Message, MessageType, Snapshot};
use raft::{RawNode, StateRole};

use super::interface::{
    send_all, ApplyQueue, Input, MemberChange, NodeConfig, Staged, Status, ToApply, Transferee, Transport,
};
use super::log::{encode_state, entry_record, RaftLog};
use super::transfer::{self, SnapshotSource};
use crate::error::{Error, Failure, Result};
use crate::membership::ConfApplied;
use crate::thread::Worker;

/// A learner is caught up once it has matched this fraction of the leader's log (etcd's
/// rule for promotion).
const LEARNER_READY: f64 = 0.9;

/// How long a stopping node waits for snapshots still being sent.
const SENDERS_PATIENCE: Duration = Duration::from_secs(5);

/// A Ready whose WAL append is not known durable yet.
struct Persisting {
    number: u64,
    /// None: it appended nothing.
    ticket: Option<TicketFuture>,
    /// Sent once the append is durable.
    messages: Vec<Message>,
}

/// A Ready taken into the in-memory log, its records not yet handed to the WAL.
struct StagedReady {
    number: u64,
    records: Vec<Record>,
    durability: Durability,
    /// Sent once the records are durable.
    persisted_messages: Vec<Message>,
}

/// Wakes the node thread when a WAL append it waits for completes: the WAL answers a
/// [`Ticket`] on its own threads, and this waker turns the answer into a nudge on a channel the
/// node thread selects on (one thread hand-off, where a thread waiting on each ticket made two).
struct Nudge(Sender<()>);

impl std::task::Wake for Nudge {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Full: a nudge is pending already.
        let _ = self.0.try_send(());
    }
}

/// How a Ready's records go to the WAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Append {
    /// Queued for the WAL's thread; this thread goes on while it writes and syncs.
    Queued,
    /// Written and synced on this thread when the WAL's thread is idle (queued otherwise).
    Here,
}

/// A running node thread.
pub(crate) struct NodeHandle {
    pub(crate) tx: Sender<Input>,
    thread: Worker,
}

/// What the node thread owns, handed over when it starts.
pub(crate) struct NodeParts {
    pub(crate) config: NodeConfig,
    /// Its input, made by the caller, so that what the node feeds can hold the sender before
    /// it starts.
    pub(crate) inputs: (Sender<Input>, Receiver<Input>),
    pub(crate) log: RaftLog,
    pub(crate) wal: Arc<Wal>,
    pub(crate) transport: Arc<dyn Transport>,
    /// Where committed entries go.
    pub(crate) apply: Box<dyn ApplyQueue>,
    pub(crate) status: Arc<Status>,
    /// What a follower far behind is sent.
    pub(crate) snapshots: SnapshotSource,
}

impl NodeHandle {
    /// Starts the node thread with its `parts`.
    pub(crate) fn spawn(parts: NodeParts) -> Result<NodeHandle> {
        let NodeParts {
            config,
            inputs: (tx, rx),
            log,
            wal,
            transport,
            apply,
            status,
            snapshots,
        } = parts;
        let raft_config = raft::Config {
            id: config.id,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            applied: config.applied,
            check_quorum: true,
            pre_vote: config.pre_vote,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            ..raft::Config::default()
        };
        raft_config
            .validate()
            .map_err(|e| Error::InvalidConfig(format!("raft: {e}")))?;
        let logger = slog::Logger::root(super::logging::TracingDrain, slog::o!());
        let mut raw = RawNode::new(&raft_config, log.clone(), &logger)
            .map_err(|e| Error::Internal(Failure::caused_by("start raft", e)))?;
        let single = log.conf_state().voters == [config.id];
        if single {
            // A group of one elects itself at once.
            raw.campaign()
                .map_err(|e| Error::Internal(Failure::caused_by("campaign", e)))?;
        } else if config.advance_election_ticks {
            // etcd's tick advance: a first election comes after one tick to one election
            // timeout, not one to two. raft-rs draws its timeout from [election, 2 × election),
            // so election - 1 ticks never start a campaign by themselves; a member that hears
            // from a leader meanwhile resets its clock, and with check-quorum its peers refuse a
            // vote while their leader is alive.
            for _ in 1..config.election_ticks {
                raw.tick();
            }
        }
        let (nudge_tx, nudges) = bounded(1);
        let node = NodeThread {
            raw,
            log,
            wal,
            transport,
            apply,
            persisting: VecDeque::new(),
            wal_failed: false,
            waker: std::task::Waker::from(Arc::new(Nudge(nudge_tx.clone()))),
            nudge: nudge_tx,
            reads: ReadRounds::default(),
            broken: None,
            status,
            campaign_when_applied: false,
            snapshots,
            inputs: tx.clone(),
            senders: Vec::new(),
            staged: None,
            engine_applied: config.applied,
            proposals: Proposals::default(),
            held: Held::default(),
            config,
        };
        let thread = crate::thread::start("cairn-raft", move || node.run(rx, nudges))?;
        Ok(NodeHandle { tx, thread })
    }

    /// Stops the node: what was handed to the apply thread stays handed; proposals not yet
    /// committed are dropped with their waiters. An error if the node thread panicked.
    pub(crate) fn stop(self) -> Result<()> {
        let _ = self.tx.send(Input::Stop);
        self.thread.join()
    }
}

/// Reads waiting for one ReadIndex round, with when the first of them arrived (what its
/// timeout counts from).
type Round = (Instant, Vec<oneshot::Sender<Result<u64>>>);

/// ReadIndex rounds: reads that arrive while a round is out wait for the next one, so many
/// concurrent reads share one round.
#[derive(Default)]
struct ReadRounds {
    next_ctx: u64,
    waiting: Vec<oneshot::Sender<Result<u64>>>,
    /// When the first of `waiting` arrived.
    waiting_since: Option<Instant>,
    out: HashMap<u64, Round>,
}

impl ReadRounds {
    /// A read joins the next round.
    fn wait(&mut self, reply: oneshot::Sender<Result<u64>>) {
        self.waiting_since.get_or_insert_with(Instant::now);
        self.waiting.push(reply);
    }

    fn start(&mut self, raw: &mut RawNode<RaftLog>) {
        if self.waiting.is_empty() || !self.out.is_empty() {
            return;
        }
        // A leader that has not committed an entry of its term yet drops ReadIndex requests
        // (raft-rs): wait for that instead of losing the round.
        if raw.raft.state == StateRole::Leader && !raw.raft.commit_to_current_term() {
            return;
        }
        self.next_ctx += 1;
        let ctx = self.next_ctx;
        raw.read_index(ctx.to_le_bytes().to_vec());
        let since = self.waiting_since.take().unwrap_or_else(Instant::now);
        self.out.insert(ctx, (since, std::mem::take(&mut self.waiting)));
    }

    /// Asks again for rounds still out: raft-rs drops a ReadIndex a leader cannot serve yet
    /// and one forwarded to a leader that is gone; the first answer wins.
    fn retry(&mut self, raw: &mut RawNode<RaftLog>) {
        for ctx in self.out.keys() {
            raw.read_index(ctx.to_le_bytes().to_vec());
        }
    }

    fn answer(&mut self, ctx: &[u8], index: u64) {
        let Some(ctx) = ctx.try_into().ok().map(u64::from_le_bytes) else {
            return;
        };
        if let Some((_, waiters)) = self.out.remove(&ctx) {
            for w in waiters {
                let _ = w.send(Ok(index));
            }
        }
    }

    /// Fails rounds, and reads waiting for one, older than `timeout` (raft may drop a round
    /// again and again: no leader, or one that cannot serve it yet), and every round and
    /// waiting read with `error` when given (leadership lost).
    fn expire(&mut self, timeout: Duration, error: Option<&Error>) {
        let now = Instant::now();
        let too_old = |since: Instant| now.duration_since(since) >= timeout;
        self.out.retain(|_, (started, waiters)| {
            let failed = match error {
                Some(e) => Some(e.clone()),
                None => too_old(*started).then_some(Error::Timeout),
            };
            match failed {
                Some(e) => {
                    for w in waiters.drain(..) {
                        let _ = w.send(Err(e.clone()));
                    }
                    false
                }
                None => true,
            }
        });
        let failed = match error {
            Some(e) => Some(e.clone()),
            None => self.waiting_since.is_some_and(too_old).then_some(Error::Timeout),
        };
        if let Some(e) = failed {
            for w in self.waiting.drain(..) {
                let _ = w.send(Err(e.clone()));
            }
            self.waiting_since = None;
        }
    }
}

struct NodeThread {
    raw: RawNode<RaftLog>,
    log: RaftLog,
    wal: Arc<Wal>,
    transport: Arc<dyn Transport>,
    apply: Box<dyn ApplyQueue>,
    /// Readies appended to the WAL and not known durable yet, in order.
    persisting: VecDeque<Persisting>,
    /// Set once an append failed: nothing after it is passed on.
    wal_failed: bool,
    /// Wakes this thread when the first of `persisting` completes.
    waker: std::task::Waker,
    /// Nudges this thread to go round again.
    nudge: Sender<()>,
    reads: ReadRounds,
    /// Set when the WAL failed: nothing can be made durable any more.
    broken: Option<Error>,
    status: Arc<Status>,
    /// Campaign once raft has seen the conf change that left this member the sole voter
    /// applied.
    campaign_when_applied: bool,
    /// Writes the snapshots sent to followers far behind.
    snapshots: SnapshotSource,
    /// This thread's own inputs, for snapshot senders to report to.
    inputs: Sender<Input>,
    /// Snapshots being sent, each on a thread of its own.
    senders: Vec<Worker>,
    /// A snapshot from the leader stepped into raft, until its Ready installs it.
    staged: Option<(Staged, Sender<Result<bool>>)>,
    /// The last index the apply thread reported applied; raft is told as much of it as it
    /// allows (its applied index never passes what it committed and persisted).
    engine_applied: u64,
    /// Proposals taken from the inputs and not yet handed to raft.
    proposals: Proposals,
    /// Proposals raft would have dropped, held until it can take them.
    held: Held,
    config: NodeConfig,
}

/// Proposals that arrived while raft would drop them: this member leads but is handing its
/// leadership over, or it knows no leader (an election, or the moment after a handover). raft
/// never appended them, so stepping them again later is safe. They are stepped again, in
/// order, as soon as a leader can take them, and held for at most half a request's timeout (an
/// election may take several election timeouts): a write carries over to the next leader while
/// its client still waits, or its client is told "no leader" (it was never proposed), not a
/// write that its client saw time out applied much later. Without
/// this, a handover on shutdown (or `MoveLeader`) fails the proposals made during it, and the
/// ones followers forwarded are lost silently and their clients wait out their timeouts.
#[derive(Default)]
struct Held {
    /// Each held message (a batch of this member's own proposals, or one a follower
    /// forwarded), with when it stops being held.
    messages: VecDeque<(Message, Instant)>,
}

/// Proposals gathered for one raft message ([`NodeThread::propose_batch`]).
#[derive(Default)]
struct Proposals {
    /// Request IDs and entries, in the order they came.
    entries: Vec<(u64, Vec<u8>)>,
    bytes: usize,
}

/// A batch of proposals goes to raft once it has this many, or this many bytes (a follower
/// forwards it as one message).
const PROPOSE_ENTRIES: usize = 256;
const PROPOSE_BYTES: usize = 1 << 20;

impl NodeThread {
    /// This member stops accepting writes for good: logged once, and kept in the status for
    /// whoever runs the engine (the server exits, as etcd does).
    fn fail(&mut self, e: Error, what: &str) {
        if self.broken.is_none() {
            tracing::error!(error = %e, "{what}: this member stops accepting writes");
            *self.status.failed.lock() = Some(e.clone());
            self.broken = Some(e);
        }
    }

    fn run(mut self, rx: Receiver<Input>, nudges: Receiver<()>) {
        let mut next_tick = Instant::now() + self.config.tick;
        // A group of one is leader already: start at once.
        if let Err(e) = self.on_ready() {
            self.fail(e, "raft ready failed");
        }
        loop {
            crossbeam_channel::select! {
                recv(rx) -> input => match input {
                    Ok(Input::Stop) | Err(_) => break,
                    Ok(input) => self.handle(input),
                },
                recv(nudges) -> _ => {}
                default(next_tick.saturating_duration_since(Instant::now())) => {
                    self.tick();
                    next_tick = Instant::now() + self.config.tick;
                }
            }
            // Take everything queued before handling the Ready: one Ready, one WAL append.
            let mut stop = false;
            while let Ok(input) = rx.try_recv() {
                if matches!(input, Input::Stop) {
                    stop = true;
                    break;
                }
                self.handle(input);
            }
            self.release_held();
            self.propose_batch();
            self.on_persisted();
            if Instant::now() >= next_tick {
                self.tick();
                next_tick = Instant::now() + self.config.tick;
            }
            self.reads.start(&mut self.raw);
            if let Err(e) = self.on_ready() {
                self.fail(e, "raft ready failed");
            }
            if self.on_persisted() {
                // An append already durable: its Ready goes on at once, without waiting.
                let _ = self.nudge.try_send(());
            }
            if let Some((_, reply)) = self.staged.take() {
                // Raft did not take it (stale, or no longer from the leader): the staged files go.
                let _ = reply.send(Ok(false));
            }
            if stop {
                break;
            }
        }
        let deadline = Instant::now() + SENDERS_PATIENCE;
        for sender in std::mem::take(&mut self.senders) {
            if let Err(e) = sender.join_by(deadline) {
                tracing::error!(error = %e, "a snapshot sender failed");
            }
        }
    }

    /// Passes on, in order, every Ready whose append is durable: sends its persisted messages
    /// and tells raft. Returns whether any went on. The first Ready still waiting registers
    /// the waker, so its completion nudges this thread.
    fn on_persisted(&mut self) -> bool {
        let mut progressed = false;
        let waker = self.waker.clone();
        let mut cx = std::task::Context::from_waker(&waker);
        while !self.wal_failed {
            let Some(front) = self.persisting.front_mut() else {
                break;
            };
            if let Some(ticket) = &mut front.ticket {
                match std::pin::Pin::new(ticket).poll(&mut cx) {
                    std::task::Poll::Pending => break,
                    std::task::Poll::Ready(Ok(_)) => {}
                    std::task::Poll::Ready(Err(e)) => {
                        self.fail(e.into(), "the WAL failed");
                        self.wal_failed = true;
                        break;
                    }
                }
            }
            let Some(done) = self.persisting.pop_front() else { break };
            send_all(&*self.transport, done.messages);
            self.raw.on_persist_ready(done.number);
            self.advance_applied();
            progressed = true;
        }
        progressed
    }

    fn tick(&mut self) {
        self.raw.tick();
        self.reads.retry(&mut self.raw);
        self.reads.expire(self.config.read_timeout, None);
    }

    fn handle(&mut self, input: Input) {
        match input {
            Input::Propose { id, data } => {
                self.proposals.bytes += data.len();
                self.proposals.entries.push((id, data));
                if self.proposals.entries.len() >= PROPOSE_ENTRIES || self.proposals.bytes >= PROPOSE_BYTES {
                    self.propose_batch();
                }
            }
            Input::ProposeAsLeader { id, data, term } => {
                let raft = &self.raw.raft;
                let leads = raft.state == StateRole::Leader && raft.term == term && raft.lead_transferee.is_none();
                if !leads || self.broken.is_some() {
                    let error = self.broken.clone().unwrap_or(Error::NotLeader);
                    self.drop_proposals(vec![id], &error);
                    return;
                }
                // After the proposals taken before it, in one message of its own: stepped
                // now, while this member leads the term, so raft appends it here.
                self.propose_batch();
                let m = self.proposal(vec![(id, data)]);
                if self.raw.step(m).is_err() {
                    self.drop_proposals(vec![id], &Error::NotLeader);
                }
            }
            Input::ReadIndex { reply } => match &self.broken {
                Some(e) => {
                    let _ = reply.send(Err(e.clone()));
                }
                None => self.reads.wait(reply),
            },
            Input::ConfChange { id, change } => {
                // After the proposals that came before it.
                self.propose_batch();
                if let Err(error) = self.propose_conf_change(id, change) {
                    let _ = self.apply.send(ToApply::Dropped { id, error });
                }
            }
            Input::TransferLeader { to, reply } => {
                let raft = &self.raw.raft;
                let to = match to {
                    Transferee::Member(to) => Some(to),
                    Transferee::MostCaughtUp => raft
                        .prs()
                        .iter()
                        .filter(|(id, p)| {
                            **id != raft.id && p.recent_active && raft.prs().conf().voters().contains(**id)
                        })
                        .max_by_key(|(id, p)| (p.matched, **id))
                        .map(|(id, _)| *id),
                };
                let answer = match to {
                    _ if raft.state != StateRole::Leader => Err(Error::NotLeader),
                    Some(to) if raft.prs().conf().voters().contains(to) => {
                        self.raw.transfer_leader(to);
                        Ok(to)
                    }
                    _ => Err(Error::BadLeaderTransferee),
                };
                let _ = reply.send(answer);
            }
            Input::Step(m) if m.get_msg_type() == MessageType::MsgSnapshot => {
                tracing::warn!(from = m.from, "dropping a snapshot message that came without its data");
            }
            Input::Step(m) if m.get_msg_type() == MessageType::MsgPropose => self.step_proposal(m),
            Input::Step(m) => {
                if let Err(e) = self.raw.step(m) {
                    tracing::debug!(error = %e, "a raft message was not stepped");
                }
            }
            Input::Snapshot { message, staged, reply } => {
                if let Some((_, earlier)) = self.staged.take() {
                    let _ = earlier.send(Ok(false));
                }
                match self.raw.step(message) {
                    Ok(()) => self.staged = Some((staged, reply)),
                    Err(e) => {
                        tracing::debug!(error = %e, "a snapshot message was not stepped");
                        let _ = reply.send(Ok(false));
                    }
                }
            }
            Input::SnapshotSent { to, delivered } => {
                self.join_finished_senders();
                let status = if delivered {
                    raft::SnapshotStatus::Finish
                } else {
                    raft::SnapshotStatus::Failure
                };
                self.raw.report_snapshot(to, status);
            }
            Input::Applied(index) => {
                self.engine_applied = self.engine_applied.max(index);
                self.advance_applied();
                let log = &self.raw.raft.raft_log;
                if self.campaign_when_applied && log.applied >= log.committed {
                    self.campaign_when_applied = false;
                    if self.raw.raft.state != StateRole::Leader {
                        if let Err(e) = self.raw.campaign() {
                            tracing::warn!(error = %e, "campaign failed");
                        }
                    }
                }
            }
            Input::Compact { index } => {
                // Never past what raft itself has seen applied. A follower that needs entries
                // from before it is sent a snapshot instead.
                let upto = index.min(self.raw.raft.raft_log.applied);
                if let Ok(term) = raft::Storage::term(&self.log, upto) {
                    self.log.compact_to(upto, term);
                }
            }
            Input::Stop => {}
        }
    }

    /// Proposes the proposals taken since the last batch, in order, as one raft message: a
    /// leader appends them together and sends them to each follower in one append, and a
    /// follower forwards them to its leader in one message, where a proposal each cost a
    /// message each way. If raft cannot take it now, it is held ([`Held`]); if raft drops it,
    /// each of them is answered why.
    fn propose_batch(&mut self) {
        if self.proposals.entries.is_empty() {
            return;
        }
        self.proposals.bytes = 0;
        let batch = std::mem::take(&mut self.proposals.entries);
        if let Some(e) = self.broken.clone() {
            self.drop_proposals(batch.into_iter().map(|(id, _)| id).collect(), &e);
            return;
        }
        let m = self.proposal(batch);
        self.step_proposal(m);
    }

    /// One raft proposal message from this member: each entry carries its request ID, by
    /// which the apply thread answers its waiter.
    fn proposal(&self, entries: Vec<(u64, Vec<u8>)>) -> Message {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgPropose);
        m.from = self.config.id;
        m.set_entries(
            entries
                .into_iter()
                .map(|(id, data)| Entry {
                    context: id.to_le_bytes().to_vec().into(),
                    data: data.into(),
                    ..Entry::default()
                })
                .collect::<Vec<_>>()
                .into(),
        );
        m
    }

    /// Steps a proposal message raft can take now; if it drops it all the same, this
    /// member's own proposals in it are answered why.
    fn step_now(&mut self, m: Message) {
        let ids = self.own_ids(&m);
        if let Err(e) = self.raw.step(m) {
            let error = match e {
                raft::Error::ProposalDropped if self.raw.raft.leader_id == raft::INVALID_ID => Error::NoLeader,
                raft::Error::ProposalDropped => Error::LeaderChanged,
                e => Error::Internal(Failure::caused_by("propose", e)),
            };
            self.drop_proposals(ids, &error);
        }
    }

    /// Steps a proposal message, this member's own batch or one a follower forwarded: held
    /// while raft would drop it ([`Held`]), and behind any already held, to keep their order.
    fn step_proposal(&mut self, m: Message) {
        if !self.held.messages.is_empty() || self.proposals_wait() {
            self.held
                .messages
                .push_back((m, Instant::now() + self.config.read_timeout / 2));
            return;
        }
        self.step_now(m);
    }

    /// Whether raft would drop a proposal now for want of a leader that can take it: this
    /// member leads but is handing over, or it knows no leader.
    fn proposals_wait(&self) -> bool {
        let raft = &self.raw.raft;
        match raft.state {
            StateRole::Leader => raft.lead_transferee.is_some(),
            _ => raft.leader_id == raft::INVALID_ID,
        }
    }

    /// Steps the held proposals again once a leader can take them, in order; answers this
    /// member's own that waited in vain, and lets go of forwarded ones.
    fn release_held(&mut self) {
        while let Some((_, until)) = self.held.messages.front() {
            if !self.proposals_wait() {
                let Some((m, _)) = self.held.messages.pop_front() else {
                    break;
                };
                self.step_now(m);
            } else if Instant::now() >= *until {
                let Some((m, _)) = self.held.messages.pop_front() else {
                    break;
                };
                let error = match self.raw.raft.state {
                    StateRole::Leader => Error::LeaderChanged,
                    _ => Error::NoLeader,
                };
                let ids = self.own_ids(&m);
                if ids.is_empty() {
                    tracing::debug!(from = m.from, "a forwarded proposal found no leader in time; dropped");
                }
                self.drop_proposals(ids, &error);
            } else {
                break;
            }
        }
    }

    /// The request IDs of a proposal message this member made itself (none for one a
    /// follower forwarded: its waiters are on that follower).
    fn own_ids(&self, m: &Message) -> Vec<u64> {
        if m.from != self.config.id {
            return Vec::new();
        }
        m.entries
            .iter()
            .filter_map(|e| e.context.as_ref().try_into().ok().map(u64::from_le_bytes))
            .collect()
    }

    fn drop_proposals(&self, ids: Vec<u64>, error: &Error) {
        for id in ids {
            let _ = self.apply.send(ToApply::Dropped {
                id,
                error: error.clone(),
            });
        }
    }

    /// Tells raft what the apply thread applied, as far as raft allows: never past what it
    /// committed and persisted (after a snapshot, the state can be ahead of both).
    fn advance_applied(&mut self) {
        let log = &self.raw.raft.raft_log;
        let target = self.engine_applied.min(log.committed).min(log.persisted);
        if target > log.applied {
            self.raw.advance_apply_to(target);
        }
    }

    /// Installs the snapshot raft accepted: the apply thread swaps in the staged state and
    /// checkpoints it (after applying everything handed over before), then the in-memory log
    /// restarts after it.
    fn install(&mut self, snapshot: &Snapshot) -> Result<()> {
        let meta = snapshot.get_metadata();
        let Some((staged, reply)) = self.staged.take() else {
            return Err(Error::internal(format!(
                "raft accepted a snapshot at {} that came without its data",
                meta.index
            )));
        };
        let (done, answer) = bounded(1);
        self.apply.send(ToApply::Install { staged, reply: done })?;
        let installed = answer.recv().map_err(|_| Error::Closed).and_then(|r| r);
        if let Err(e) = installed {
            let _ = reply.send(Err(e.clone()));
            return Err(e);
        }
        self.log
            .install_snapshot(meta.index, meta.term, meta.get_conf_state().clone())?;
        self.engine_applied = self.engine_applied.max(meta.index);
        tracing::info!(
            index = meta.index,
            term = meta.term,
            "installed a snapshot from the leader"
        );
        let _ = reply.send(Ok(true));
        Ok(())
    }

    /// Joins the snapshot senders that have ended.
    fn join_finished_senders(&mut self) {
        let (done, running) = std::mem::take(&mut self.senders)
            .into_iter()
            .partition::<Vec<_>, _>(Worker::is_finished);
        self.senders = running;
        for sender in done {
            if let Err(e) = sender.join() {
                tracing::error!(error = %e, "a snapshot sender failed");
            }
        }
    }

    /// Sends a Ready's messages; snapshots are streamed on threads of their own.
    fn dispatch(&mut self, messages: Vec<Message>) {
        let (snapshots, rest): (Vec<_>, Vec<_>) = messages
            .into_iter()
            .partition(|m| m.get_msg_type() == MessageType::MsgSnapshot);
        send_all(&*self.transport, rest);
        for m in snapshots {
            match m.write_to_bytes() {
                Ok(bytes) => {
                    let route = transfer::Route {
                        source: self.snapshots.clone(),
                        transport: self.transport.clone(),
                        report: self.inputs.clone(),
                    };
                    self.senders
                        .extend(transfer::send(m.to, bytes::Bytes::from(bytes), route));
                }
                Err(e) => tracing::error!(error = %e, "cannot encode a snapshot message"),
            }
        }
    }

    /// Checks a membership change against the current membership (etcd's rules) and
    /// proposes it.
    fn propose_conf_change(&mut self, id: u64, change: MemberChange) -> Result<()> {
        use raft::eraftpb::{ConfChangeSingle, ConfChangeType};
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader {
            return Err(Error::NotLeader);
        }
        if raft.has_pending_conf() {
            return Err(Error::ConfChangePending);
        }
        let conf = raft.prs().conf();
        let is_voter = |m: u64| conf.voters().contains(m);
        let is_learner = |m: u64| conf.learners().contains(&m);
        let mut context = Vec::new();
        let (kind, node) = match change {
            MemberChange::AddVoter(m, _) | MemberChange::AddLearner(m, _) if is_voter(m) || is_learner(m) => {
                return Err(Error::MemberExists);
            }
            MemberChange::AddVoter(m, attributes) => {
                context = crate::format::state::attributes::encode(&attributes)?;
                (ConfChangeType::AddNode, m)
            }
            MemberChange::AddLearner(m, attributes) => {
                context = crate::format::state::attributes::encode(&attributes)?;
                (ConfChangeType::AddLearnerNode, m)
            }
            MemberChange::Promote(m) if !is_voter(m) && !is_learner(m) => return Err(Error::MemberNotFound),
            MemberChange::Promote(m) if !is_learner(m) => return Err(Error::MemberNotLearner),
            MemberChange::Promote(m) => {
                let leader = raft.raft_log.last_index();
                let matched = raft.prs().get(m).map_or(0, |p| p.matched);
                if (matched as f64) < leader as f64 * LEARNER_READY {
                    return Err(Error::LearnerNotReady);
                }
                (ConfChangeType::AddNode, m)
            }
            MemberChange::Remove(m) if !is_voter(m) && !is_learner(m) => return Err(Error::MemberNotFound),
            MemberChange::Remove(m) => (ConfChangeType::RemoveNode, m),
        };
        let single = ConfChangeSingle {
            change_type: kind,
            node_id: node,
            ..ConfChangeSingle::default()
        };
        let cc = ConfChangeV2 {
            changes: vec![single].into(),
            context: context.into(),
            ..ConfChangeV2::default()
        };
        self.raw
            .propose_conf_change(id.to_le_bytes().to_vec(), cc)
            .map_err(|e| match e {
                raft::Error::ProposalDropped => Error::LeaderChanged,
                e => Error::Internal(Failure::caused_by("propose a conf change", e)),
            })
    }

    /// Applies conf changes among `entries` to raft; returns them all, to hand to the apply
    /// thread.
    fn committed(&mut self, entries: Vec<Entry>) -> Result<Option<ToApply>> {
        if entries.is_empty() {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let cs = match e.get_entry_type() {
                EntryType::EntryNormal => None,
                EntryType::EntryConfChange => {
                    let cc = ConfChange::parse_from_bytes(&e.data)
                        .map_err(|err| Error::Internal(Failure::caused_by(format!("conf change {}", e.index), err)))?;
                    Some(self.apply_conf_change(&cc, cc.context.clone())?)
                }
                EntryType::EntryConfChangeV2 => {
                    let cc = ConfChangeV2::parse_from_bytes(&e.data)
                        .map_err(|err| Error::Internal(Failure::caused_by(format!("conf change {}", e.index), err)))?;
                    Some(self.apply_conf_change(&cc, cc.context.clone())?)
                }
            };
            out.push((e, cs));
        }
        Ok(Some(ToApply::Entries(out)))
    }

    fn apply_conf_change(&mut self, cc: &impl raft_proto::ConfChangeI, context: bytes::Bytes) -> Result<ConfApplied> {
        use raft::eraftpb::ConfChangeType;
        let state = self
            .raw
            .apply_conf_change(cc)
            .map_err(|e| Error::Internal(Failure::caused_by("apply conf change", e)))?;
        self.log.set_conf_state(state.clone());
        let mut applied = ConfApplied {
            state,
            context,
            ..ConfApplied::default()
        };
        for change in cc.as_v2().changes.iter() {
            match change.get_change_type() {
                ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => applied.added.push(change.node_id),
                ConfChangeType::RemoveNode => applied.removed.push(change.node_id),
            }
        }
        Ok(applied)
    }

    fn on_ready(&mut self) -> Result<()> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut rd = self.raw.ready();
        if let Some(ss) = rd.ss() {
            let was_leader = self.status.leader.load(std::sync::atomic::Ordering::Relaxed) == self.config.id;
            self.status.set_leader(ss.leader_id);
            let is_leader = ss.raft_state == StateRole::Leader;
            if is_leader && !was_leader {
                let _ = self.apply.send(ToApply::BecameLeader {
                    term: self.raw.raft.term,
                });
            }
            if !is_leader {
                // Reads waiting on this member's leadership must not be served by it.
                self.reads.expire(self.config.read_timeout, Some(&Error::LeaderChanged));
            }
        }
        self.status
            .term
            .store(self.raw.raft.term, std::sync::atomic::Ordering::Relaxed);
        if !rd.messages().is_empty() {
            self.dispatch(rd.take_messages());
        }
        // A snapshot comes first: the entries of this Ready follow it.
        let installed = if rd.snapshot().is_empty() {
            None
        } else {
            let snapshot = rd.snapshot().clone();
            self.install(&snapshot)?;
            Some(snapshot.get_metadata().index)
        };
        let conf_before = if installed.is_some() {
            ConfState::default()
        } else {
            self.log.conf_state()
        };
        let committed = self.committed(rd.take_committed_entries())?;
        let conf = self.log.conf_state();
        let alone = conf.voters == [self.config.id] && conf.learners.is_empty() && conf.voters_outgoing.is_empty();
        // The new entries and HardState go into the in-memory log first, so that nothing
        // applied is ahead of the commit index this member reports.
        let staged = self.stage_ready(rd, installed, conf_before)?;
        if !alone {
            // Peers wait on this thread's heartbeats and appends: the apply thread applies
            // these while this thread goes on, and the WAL's thread writes and syncs.
            if let Some(work) = committed {
                self.apply.send(work)?;
            }
            return self.write_ready(staged, Append::Queued);
        }
        // A sole member: no one waits on this thread but its own proposers, whose next
        // proposals queue up while the disk syncs and go in the next Ready, one fsync for all.
        // So what is committed is applied (on this thread if the batch is small and nothing
        // else waits), then this thread writes and syncs the new entries itself when the WAL's
        // thread is idle: two thread hand-offs fewer per write.
        if let Some(work) = committed {
            if self.inputs.is_empty() {
                self.apply.send_or_apply(work)?;
            } else {
                self.apply.send(work)?;
            }
        }
        self.write_ready(staged, Append::Here)
    }

    /// The rest of a Ready but its WAL append: its read states answered, its entries and
    /// HardState into the in-memory log (raft-rs reads them back at once), the WAL's records
    /// built ([`NodeThread::write_ready`] hands them over).
    fn stage_ready(
        &mut self,
        mut rd: raft::Ready,
        installed: Option<u64>,
        conf_before: ConfState,
    ) -> Result<StagedReady> {
        let sole_voter = self.log.conf_state() != conf_before
            && self.log.conf_state().voters == [self.config.id]
            && self.raw.raft.state != StateRole::Leader;
        for rs in rd.take_read_states() {
            self.reads.answer(&rs.request_ctx, rs.index);
        }
        let entries = rd.take_entries();
        let replaced = self.log.append(&entries)?;
        let hs_changed = rd.hs().is_some();
        let before = self.log.hard_state();
        // A vote or a new term must be durable before the messages that depend on it; a
        // commit index alone need not be (a member that loses it learns it again), so it rides
        // along unsynced and the next durable append covers it: one fsync per write, not two.
        let vote_changed = rd
            .hs()
            .is_some_and(|hs| hs.term != before.term || hs.vote != before.vote);
        if let Some(hs) = rd.hs() {
            self.log.set_hard_state(hs.clone());
        }
        let persisted_messages = rd.take_persisted_messages();
        let number = rd.number();
        self.raw.advance_append_async(rd);
        let mut records = Vec::with_capacity(entries.len() + 3);
        if let Some(index) = installed {
            // The log restarts after the snapshot (the checkpoint covers what came before).
            records.push(Record::Truncate {
                from: LogIndex(index + 1),
            });
        }
        if let Some(from) = replaced {
            records.push(Record::Truncate { from: LogIndex(from) });
        }
        for e in &entries {
            records.push(entry_record(e)?);
        }
        if hs_changed || self.log.conf_state() != conf_before {
            records.push(Record::State(encode_state(
                &self.log.hard_state(),
                &self.log.conf_state(),
            )?));
        }
        let durability = if entries.is_empty() && !vote_changed && self.log.conf_state() == conf_before {
            Durability::Buffered
        } else {
            Durability::Durable
        };
        if sole_voter {
            // The sole voter of a new group (or of one shrunk to it) elects itself, once the
            // change is applied (raft-rs refuses to campaign before).
            self.campaign_when_applied = true;
        }
        Ok(StagedReady {
            number,
            records,
            durability,
            persisted_messages,
        })
    }

    /// The rest of a Ready: its records to the WAL, without waiting for the WAL when `how`
    /// queues them.
    fn write_ready(&mut self, staged: StagedReady, how: Append) -> Result<()> {
        let StagedReady {
            number,
            records,
            durability,
            persisted_messages,
        } = staged;
        if self.wal_failed {
            return Err(Error::Closed);
        }
        let ticket = if records.is_empty() {
            None
        } else {
            let ticket = match how {
                Append::Here => self.wal.append_here(records, durability)?,
                Append::Queued => self.wal.append(records, durability)?,
            };
            Some(ticket.into_future())
        };
        self.persisting.push_back(Persisting {
            number,
            ticket,
            messages: persisted_messages,
        });
        Ok(())
    }
}
