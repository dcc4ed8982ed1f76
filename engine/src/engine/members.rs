//! The group this member belongs to: its membership (etcd's Cluster service: list, add,
//! promote, remove, update, publish), leadership transfer, and the [`Inbox`] other members'
//! Raft messages and snapshots arrive through.

use std::sync::Arc;

use crossbeam_channel::{bounded, Sender};

use super::core::Core;
use super::staged::Staged;
use super::waiters::wait_answer;
use crate::consensus::interface::{Input, MemberChange, Transferee};
use crate::error::{Error, Failure, Result};
use crate::lease::lessor::Lessor;
use crate::membership::MemberAttributes;
use crate::request::Request;

/// The members of a group by ID, voters and learners ([`Members::ids`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberIds {
    /// Members that vote.
    pub voters: Vec<u64>,
    /// Members that receive the log without voting.
    pub learners: Vec<u64>,
}

/// A member of the group, as [`Members::list`] reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
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

/// Delivers Raft messages to one member (see [`Engine::inbox`](crate::Engine::inbox)). It does not keep the
/// member open.
#[derive(Clone, Debug)]
pub struct Inbox {
    tx: Sender<Input>,
    core: std::sync::Weak<Core>,
}

impl Inbox {
    pub(super) fn new(core: &Arc<Core>) -> Result<Inbox> {
        Ok(Inbox {
            tx: core.node_tx()?,
            core: Arc::downgrade(core),
        })
    }

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
    ///
    /// [`Transport::send_snapshot`]: crate::Transport::send_snapshot
    pub fn deliver_snapshot(&self, message: &[u8], data: &mut dyn std::io::Read) -> Result<()> {
        use protobuf::Message as _;
        let m = raft::eraftpb::Message::parse_from_bytes(message)
            .map_err(|e| Error::Snapshot(Failure::caused_by("the snapshot's raft message does not decode", e)))?;
        if m.get_msg_type() != raft::eraftpb::MessageType::MsgSnapshot {
            return Err(Error::Snapshot(Failure::new(format!(
                "a {:?} message came with snapshot data",
                m.get_msg_type()
            ))));
        }
        let index = m.get_snapshot().get_metadata().index;
        let core = self.core.upgrade().ok_or(Error::Closed)?;
        let (maker, applied) = {
            let st = core.state.read();
            (st.store.file_maker(), st.applied_index)
        };
        if index <= applied {
            tracing::info!(index, applied, "turning down a snapshot older than the state");
            return Ok(());
        }
        let lessor = Lessor::new(core.config.min_lease_ttl, core.config.clock.clone());
        drop(core);
        let staged: crate::consensus::interface::Staged = Box::new(Staged::read(data, maker, lessor)?);
        if staged.index() < index {
            return Err(Error::Snapshot(Failure::new(format!(
                "the snapshot's data is at index {}, its message says {index}",
                staged.index()
            ))));
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

/// etcd's Cluster service, and leadership transfer ([`Engine::members`](crate::Engine::members)).
#[derive(Clone, Copy, Debug)]
pub struct Members<'a> {
    core: &'a Core,
}

impl<'a> Members<'a> {
    pub(super) fn new(core: &'a Core) -> Members<'a> {
        Members { core }
    }

    /// The group's voters and learners, as this member has applied them.
    pub fn ids(&self) -> MemberIds {
        let st = self.core.state.read();
        MemberIds {
            voters: st.membership.voters.clone(),
            learners: st.membership.learners.clone(),
        }
    }

    /// Every member with its attributes, in ID order (etcd's `MemberList`), as this member
    /// has applied them.
    pub fn list(&self) -> Vec<Member> {
        let st = self.core.state.read();
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
    pub fn update(&self, id: u64, peer_urls: Vec<String>) -> Result<()> {
        self.core.propose(Request::MemberUpdate { id, peer_urls }).map(|_| ())
    }

    fn change_members(&self, change: MemberChange) -> Result<()> {
        let (rx, timeout) = self.core.submit_input(|id| Input::ConfChange { id, change })?;
        wait_answer(rx, timeout).map(|_| ())
    }

    /// Adds voter `id`, reached at `peer_urls` (etcd's `MemberAdd`); returns once the change
    /// is applied here. Call it on the leader. One membership change at a time: a second
    /// fails with [`Error::ConfChangePending`] until the first is applied.
    pub fn add(&self, id: u64, peer_urls: Vec<String>) -> Result<()> {
        self.change_members(MemberChange::AddVoter(id, MemberAttributes::with_peer_urls(peer_urls)))
    }

    /// Adds learner `id` (etcd's `MemberAdd` with `is_learner`): it receives the log but does
    /// not vote, until [`Members::promote`].
    pub fn add_learner(&self, id: u64, peer_urls: Vec<String>) -> Result<()> {
        self.change_members(MemberChange::AddLearner(
            id,
            MemberAttributes::with_peer_urls(peer_urls),
        ))
    }

    /// Promotes learner `id` to voter (etcd's `MemberPromote`); it must have caught up with
    /// the leader ([`Error::LearnerNotReady`] otherwise).
    pub fn promote(&self, id: u64) -> Result<()> {
        self.change_members(MemberChange::Promote(id))
    }

    /// Removes member `id` (etcd's `MemberRemove`).
    pub fn remove(&self, id: u64) -> Result<()> {
        self.change_members(MemberChange::Remove(id))
    }

    /// Hands leadership to voter `to` (etcd's `MoveLeader`), waiting until this member sees
    /// it leading or `Config::request_timeout` passes. Call it on the leader.
    pub fn move_leader(&self, to: u64) -> Result<()> {
        self.transfer_leadership(Transferee::Member(to)).map(|_| ())
    }

    /// As a member shuts down, hands its leadership, if it leads others, to the voter most
    /// caught up (etcd transfers leadership on shutdown too), and waits until that voter
    /// leads or `Config::request_timeout` passes. The group then goes on without an election
    /// timeout's pause, and the proposals made during the handover are held and carried to
    /// the new leader, not lost. Returns the new leader; `None` when this member does not
    /// lead or leads alone.
    pub fn step_down(&self) -> Result<Option<u64>> {
        match self.transfer_leadership(Transferee::MostCaughtUp) {
            Ok(to) => Ok(Some(to)),
            Err(Error::NotLeader | Error::BadLeaderTransferee) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn transfer_leadership(&self, to: Transferee) -> Result<u64> {
        let config = &self.core.config;
        let deadline = std::time::Instant::now() + config.request_timeout;
        // raft-rs abandons a transfer that has not finished within an election timeout (the
        // transferee was catching up, a message was lost): ask again until the deadline.
        let attempt = config.raft_tick * u32::try_from(config.election_ticks * 2).unwrap_or(u32::MAX);
        let mut chosen = match to {
            Transferee::Member(to) => Some(to),
            Transferee::MostCaughtUp => None,
        };
        loop {
            let tx = self.core.node_tx()?;
            let (reply, answer) = bounded(1);
            // Once chosen, the same transferee each time.
            let ask = chosen.map_or(to, Transferee::Member);
            tx.send(Input::TransferLeader { to: ask, reply })
                .map_err(|_| Error::Closed)?;
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let to = match answer.recv_timeout(left) {
                Ok(Ok(to)) => to,
                // Leadership moved already: to the transferee (done), or on to someone else.
                Ok(Err(Error::NotLeader)) => {
                    return match chosen {
                        Some(to) if self.core.leader() == Some(to) => Ok(to),
                        _ => Err(Error::NotLeader),
                    }
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(Error::Timeout),
            };
            chosen = Some(to);
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if self.core.status.wait_leader(to, attempt.min(left)) {
                return Ok(to);
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
        }
    }
}
