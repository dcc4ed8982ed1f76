//! The Raft log: raft-rs's [`Storage`] over an in-memory copy of the log since the last
//! checkpoint, which the WAL holds durably.
//!
//! The node thread appends a Ready's entries here *before* it hands them to the WAL (raft-rs
//! reads them back through `Storage` at once, while the fsync runs), and records the
//! HardState and ConfState the same way. On open, the WAL's records are replayed into a fresh
//! log on top of the checkpoint: the checkpoint is the log's "snapshot", the point before
//! which entries are compacted away (its applied index and term, and the membership then).
//!
//! In the WAL, an entry is a `Record::Entry` whose payload is the protobuf-encoded raft
//! `Entry`; HardState and ConfState together are one `Record::State` (see [`encode_state`]);
//! a conflicting suffix replaced by a new leader is a `Record::Truncate` before the new
//! entries.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use cairn_wal::{LogIndex, Record};
use parking_lot::RwLock;
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use crate::error::{Error, Failure, Result};

/// The log's state (see the module docs).
#[derive(Debug, Default)]
struct LogState {
    hard_state: HardState,
    conf_state: ConfState,
    /// The last index and term the checkpoint covers: entries up to it are compacted away.
    snapshot_index: u64,
    snapshot_term: u64,
    /// Entries from `snapshot_index + 1`, consecutive.
    entries: VecDeque<Entry>,
    /// While replaying: the WAL's entries up to `snapshot_index`, kept for followers that are
    /// behind (see [`RaftLog::finish_replay`]).
    before: VecDeque<Entry>,
    /// What the apply thread last published as applied: the index, its term and the
    /// membership then. A snapshot sent to a follower is at least this new.
    applied: (u64, u64, ConfState),
}

impl LogState {
    fn first_index(&self) -> u64 {
        self.snapshot_index + 1
    }

    fn last_index(&self) -> u64 {
        self.snapshot_index + self.entries.len() as u64
    }

    /// Drops every entry at or after `from`.
    fn truncate(&mut self, from: u64) {
        let keep = from.saturating_sub(self.first_index());
        self.entries.truncate(usize::try_from(keep).unwrap_or(usize::MAX));
    }
}

/// The Raft log, shared by the node thread and raft-rs (cheap to clone).
#[derive(Clone, Debug, Default)]
pub(crate) struct RaftLog {
    state: Arc<RwLock<LogState>>,
    /// The hard state's commit index, stored under the state's write lock whenever it changes,
    /// so that every request's apply-lag check reads it without the lock the node thread
    /// writes under.
    committed: Arc<AtomicU64>,
}

fn corrupt(what: &str) -> impl FnOnce(protobuf::ProtobufError) -> Error + '_ {
    move |e| Error::Internal(Failure::caused_by(format!("the log holds a damaged {what}"), e))
}

/// The `Record::State` payload for a HardState and ConfState: the HardState's length (u32
/// LE), the HardState, then the ConfState, each protobuf-encoded.
pub(crate) fn encode_state(hs: &HardState, cs: &ConfState) -> Result<Bytes> {
    let hs = hs
        .write_to_bytes()
        .map_err(|e| Error::Internal(Failure::caused_by("encode HardState", e)))?;
    let cs = cs
        .write_to_bytes()
        .map_err(|e| Error::Internal(Failure::caused_by("encode ConfState", e)))?;
    let mut out = Vec::with_capacity(4 + hs.len() + cs.len());
    out.extend_from_slice(&u32::try_from(hs.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&hs);
    out.extend_from_slice(&cs);
    Ok(Bytes::from(out))
}

fn decode_state(bytes: &[u8]) -> Result<(HardState, ConfState)> {
    let len = bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| Error::internal("the log holds a damaged state record"))?;
    let hs_end = 4usize.saturating_add(len as usize);
    let hs = bytes
        .get(4..hs_end)
        .ok_or_else(|| Error::internal("the log holds a damaged state record"))?;
    let cs = bytes.get(hs_end..).unwrap_or_default();
    Ok((
        HardState::parse_from_bytes(hs).map_err(corrupt("HardState"))?,
        ConfState::parse_from_bytes(cs).map_err(corrupt("ConfState"))?,
    ))
}

/// A raft entry as a WAL record.
pub(crate) fn entry_record(e: &Entry) -> Result<Record> {
    let payload = e
        .write_to_bytes()
        .map_err(|e| Error::Internal(Failure::caused_by("encode entry", e)))?;
    Ok(Record::Entry {
        index: LogIndex(e.index),
        payload: Bytes::from(payload),
    })
}

/// Starts a new group's log, as etcd does: entry `i` (term 1) adds member `members[i-1]`
/// with its attributes, and all are committed, so the log alone says who the members are (a
/// member that joins later learns them by replicating it). Written to the WAL and synced
/// before the node starts.
pub(crate) fn bootstrap(
    log: &RaftLog,
    wal: &cairn_wal::Wal,
    members: &[u64],
    attributes: &std::collections::BTreeMap<u64, crate::membership::MemberAttributes>,
) -> Result<()> {
    use raft::eraftpb::{ConfChange, ConfChangeType, EntryType};
    let mut entries = Vec::with_capacity(members.len());
    for (i, id) in members.iter().enumerate() {
        let cc = ConfChange {
            change_type: ConfChangeType::AddNode,
            node_id: *id,
            context: match attributes.get(id) {
                Some(a) => crate::format::state::attributes::encode(a)?.into(),
                None => Default::default(),
            },
            ..ConfChange::default()
        };
        let data = cc
            .write_to_bytes()
            .map_err(|e| Error::Internal(Failure::caused_by("encode a conf change", e)))?;
        entries.push(Entry {
            entry_type: EntryType::EntryConfChange,
            term: 1,
            index: i as u64 + 1,
            data: data.into(),
            ..Entry::default()
        });
    }
    log.append(&entries)?;
    let hs = HardState {
        term: 1,
        commit: entries.len() as u64,
        ..HardState::default()
    };
    log.set_hard_state(hs.clone());
    let mut records = entries.iter().map(entry_record).collect::<Result<Vec<_>>>()?;
    records.push(Record::State(encode_state(&hs, &log.conf_state())?));
    wal.append(records, cairn_wal::Durability::Durable)?.wait()?;
    Ok(())
}

/// etcd's `--force-new-cluster`: this member alone becomes the group, keeping its data, to
/// recover from the loss of a quorum. Entries past the commit index are dropped (no quorum is
/// left to have committed them); then one conf change per other member removes it, written
/// in the current term and committed at once, durably. Applied like any committed conf
/// change, they leave this member the sole voter, and it elects itself. `known` are the
/// members it knows of besides what the log holds (the checkpoint's); removing one already
/// gone changes nothing.
pub(crate) fn force_new_cluster(log: &RaftLog, wal: &cairn_wal::Wal, me: u64, known: &[u64]) -> Result<()> {
    use raft::eraftpb::{ConfChange, ConfChangeType, EntryType};
    let hs = log.hard_state();
    let mut others: std::collections::BTreeSet<u64> = known.iter().copied().collect();
    let cs = log.conf_state();
    others.extend(cs.voters.iter().chain(&cs.learners).chain(&cs.voters_outgoing));
    {
        let st = log.state.read();
        for e in st.entries.iter().filter(|e| e.index <= hs.commit) {
            if e.get_entry_type() == EntryType::EntryConfChange {
                if let Ok(cc) = ConfChange::parse_from_bytes(&e.data) {
                    others.insert(cc.node_id);
                }
            }
        }
    }
    others.remove(&me);
    others.remove(&0);
    let dropped = (log.last_index() > hs.commit).then_some(hs.commit + 1);
    let mut entries = Vec::with_capacity(others.len());
    for (i, id) in others.iter().enumerate() {
        let cc = ConfChange {
            change_type: ConfChangeType::RemoveNode,
            node_id: *id,
            ..ConfChange::default()
        };
        let data = cc
            .write_to_bytes()
            .map_err(|e| Error::Internal(Failure::caused_by("encode a conf change", e)))?;
        entries.push(Entry {
            entry_type: EntryType::EntryConfChange,
            term: hs.term,
            index: hs.commit + 1 + i as u64,
            data: data.into(),
            ..Entry::default()
        });
    }
    let mut records = Vec::with_capacity(entries.len() + 2);
    if let Some(from) = dropped {
        log.state.write().truncate(from);
        records.push(Record::Truncate { from: LogIndex(from) });
    }
    log.append(&entries)?;
    let hs = HardState {
        commit: hs.commit + entries.len() as u64,
        ..hs
    };
    log.set_hard_state(hs.clone());
    for e in &entries {
        records.push(entry_record(e)?);
    }
    records.push(Record::State(encode_state(&hs, &log.conf_state())?));
    wal.append(records, cairn_wal::Durability::Durable)?.wait()?;
    tracing::warn!(
        removed = ?others.iter().map(|id| format!("{id:x}")).collect::<Vec<_>>(),
        dropped_from = dropped,
        "forcing a new cluster: this member alone, with its data; the others are removed"
    );
    Ok(())
}

impl RaftLog {
    /// A log whose entries up to `index` (of `term`) are in the checkpoint, with membership
    /// `conf_state` then.
    pub(crate) fn new(index: u64, term: u64, conf_state: ConfState) -> RaftLog {
        let mut hard_state = HardState::default();
        (hard_state.term, hard_state.commit) = (term, index);
        let state = LogState {
            hard_state,
            conf_state: conf_state.clone(),
            snapshot_index: index,
            snapshot_term: term,
            entries: VecDeque::new(),
            before: VecDeque::new(),
            applied: (index, term, conf_state.clone()),
        };
        RaftLog {
            state: Arc::new(RwLock::new(state)),
            committed: Arc::new(AtomicU64::new(index)),
        }
    }

    /// Mirrors `st`'s commit index for [`RaftLog::committed`]; called under the write lock.
    fn mirror_commit(&self, st: &LogState) {
        self.committed.store(st.hard_state.commit, Ordering::Release);
    }

    /// The commit index of the hard state, read without a lock.
    pub(crate) fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// Replays one WAL record into the log.
    pub(crate) fn replay(&self, record: Record) -> Result<()> {
        let mut st = self.state.write();
        match record {
            Record::Entry { index, payload } => {
                let entry = Entry::parse_from_bytes(&payload).map_err(corrupt("entry"))?;
                if index.0 <= st.snapshot_index {
                    // In the checkpoint already; kept for followers if the run is unbroken.
                    let next = st.before.back().map(|e| e.index + 1);
                    if next.is_some_and(|n| n != index.0) {
                        let keep = index.0.saturating_sub(st.before.front().map_or(0, |e| e.index));
                        st.before.truncate(usize::try_from(keep).unwrap_or(usize::MAX));
                        if st.before.back().map(|e| e.index + 1) != Some(index.0) {
                            st.before.clear();
                        }
                    }
                    st.before.push_back(entry);
                    return Ok(());
                }
                if entry.index != index.0 {
                    return Err(Error::internal(format!(
                        "log entry {} is stored at index {}",
                        entry.index, index.0
                    )));
                }
                if index.0 > st.last_index() + 1 {
                    return Err(Error::internal(format!(
                        "log entry {} follows {}: a gap",
                        index.0,
                        st.last_index()
                    )));
                }
                st.truncate(index.0);
                st.entries.push_back(entry);
            }
            Record::State(bytes) => {
                // The latest state wins; the checkpoint's entries are committed whatever it says.
                let (mut hs, cs) = decode_state(&bytes)?;
                hs.commit = hs.commit.max(st.snapshot_index);
                st.hard_state = hs;
                self.mirror_commit(&st);
                if !cs.voters.is_empty() {
                    st.conf_state = cs;
                }
            }
            Record::Truncate { from } => {
                if from.0 <= st.snapshot_index {
                    let keep = from.0.saturating_sub(st.before.front().map_or(0, |e| e.index));
                    st.before.truncate(usize::try_from(keep).unwrap_or(usize::MAX));
                }
                let from = from.0.max(st.first_index());
                st.truncate(from);
            }
        }
        Ok(())
    }

    /// Ends replaying: the last `keep` entries the WAL kept from before the checkpoint (its
    /// catch-up margin) join the log, so a follower that is behind can still be sent them.
    /// The first of them becomes the log's start (raft-rs needs the term of the entry before
    /// the first).
    pub(crate) fn finish_replay(&self, keep: u64) {
        let mut st = self.state.write();
        let mut before = std::mem::take(&mut st.before);
        let extra = (before.len() as u64).saturating_sub(keep.saturating_add(1));
        before.drain(..usize::try_from(extra).unwrap_or(usize::MAX));
        let ends_right = before
            .back()
            .is_some_and(|e| e.index == st.snapshot_index && e.term == st.snapshot_term);
        if !ends_right || before.len() < 2 {
            return;
        }
        let Some(first) = before.pop_front() else {
            return;
        };
        before.extend(std::mem::take(&mut st.entries));
        st.entries = before;
        st.snapshot_index = first.index;
        st.snapshot_term = first.term;
    }

    /// Appends entries from a Ready, replacing any conflicting suffix; returns the first
    /// index replaced, if any (the WAL must drop it too).
    pub(crate) fn append(&self, entries: &[Entry]) -> Result<Option<u64>> {
        let Some(first) = entries.first() else {
            return Ok(None);
        };
        let mut st = self.state.write();
        if first.index <= st.snapshot_index || first.index > st.last_index() + 1 {
            return Err(Error::internal(format!(
                "entries from {} cannot follow the log ({}..={})",
                first.index,
                st.first_index(),
                st.last_index()
            )));
        }
        let replaced = (first.index <= st.last_index()).then_some(first.index);
        st.truncate(first.index);
        st.entries.extend(entries.iter().cloned());
        Ok(replaced)
    }

    pub(crate) fn set_hard_state(&self, hs: HardState) {
        let mut st = self.state.write();
        st.hard_state = hs;
        self.mirror_commit(&st);
    }

    pub(crate) fn set_conf_state(&self, cs: ConfState) {
        self.state.write().conf_state = cs;
    }

    pub(crate) fn hard_state(&self) -> HardState {
        self.state.read().hard_state.clone()
    }

    pub(crate) fn conf_state(&self) -> ConfState {
        self.state.read().conf_state.clone()
    }

    pub(crate) fn last_index(&self) -> u64 {
        self.state.read().last_index()
    }

    /// The last index in the log if member `id` is the group's only voter: then everything
    /// committed is in its log, and a read that waits until that index is applied is
    /// linearizable without a ReadIndex round.
    pub(crate) fn sole_voter_last_index(&self, id: u64) -> Option<u64> {
        let st = self.state.read();
        (st.conf_state.voters == [id] && st.conf_state.voters_outgoing.is_empty()).then(|| st.last_index())
    }

    /// Records what the state machine has applied: the log index, its term and the membership
    /// then (what a snapshot made now would hold at least).
    pub(crate) fn publish_applied(&self, index: u64, term: u64, conf_state: ConfState) {
        self.state.write().applied = (index, term, conf_state);
    }

    /// Restarts the log after a snapshot at `index` (of `term`, with membership `conf_state`)
    /// that this member installed: every entry it held is replaced by the snapshot.
    pub(crate) fn install_snapshot(&self, index: u64, term: u64, conf_state: ConfState) -> Result<()> {
        let mut st = self.state.write();
        if index < st.snapshot_index {
            return Err(Error::internal(format!(
                "a snapshot at {index} is older than the log's start at {}",
                st.snapshot_index
            )));
        }
        st.entries.clear();
        st.before.clear();
        st.snapshot_index = index;
        st.snapshot_term = term;
        st.hard_state.commit = st.hard_state.commit.max(index);
        self.mirror_commit(&st);
        st.conf_state = conf_state.clone();
        if index >= st.applied.0 {
            st.applied = (index, term, conf_state);
        }
        Ok(())
    }

    /// Drops the entries up to `index` (of `term`), which a durable checkpoint now covers.
    pub(crate) fn compact_to(&self, index: u64, term: u64) {
        let mut st = self.state.write();
        if index <= st.snapshot_index {
            return;
        }
        let drop = (index - st.snapshot_index).min(st.entries.len() as u64);
        st.entries.drain(..usize::try_from(drop).unwrap_or(usize::MAX));
        st.snapshot_index = index;
        st.snapshot_term = term;
    }
}

fn store_error(e: StorageError) -> raft::Error {
    raft::Error::Store(e)
}

impl Storage for RaftLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let st = self.state.read();
        Ok(RaftState::new(st.hard_state.clone(), st.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let st = self.state.read();
        if low < st.first_index() {
            return Err(store_error(StorageError::Compacted));
        }
        if high > st.last_index() + 1 || low > high {
            return Err(store_error(StorageError::Unavailable));
        }
        let max = max_size.into().unwrap_or(u64::MAX);
        let mut out = Vec::new();
        let mut size = 0u64;
        let start = usize::try_from(low - st.first_index()).unwrap_or(usize::MAX);
        let n = usize::try_from(high - low).unwrap_or(usize::MAX);
        for e in st.entries.iter().skip(start).take(n) {
            size += u64::from(e.compute_size());
            if !out.is_empty() && size > max {
                break;
            }
            out.push(e.clone());
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let st = self.state.read();
        if idx == st.snapshot_index {
            return Ok(st.snapshot_term);
        }
        if idx < st.first_index() {
            return Err(store_error(StorageError::Compacted));
        }
        let at = usize::try_from(idx - st.first_index()).unwrap_or(usize::MAX);
        st.entries
            .get(at)
            .map(|e| e.term)
            .ok_or_else(|| store_error(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.state.read().first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.state.read().last_index())
    }

    /// Only the metadata: the node thread streams the state itself when it sends the message
    /// (see [`super::transfer`]). Not ready while the state is older than `request_index` or
    /// does not yet count `to` as a member (it was just added).
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let st = self.state.read();
        let (index, term, cs) = &st.applied;
        let member = [&cs.voters, &cs.learners, &cs.voters_outgoing, &cs.learners_next]
            .iter()
            .any(|ids| ids.contains(&to));
        if *index == 0 || *index < request_index || !member {
            return Err(store_error(StorageError::SnapshotTemporarilyUnavailable));
        }
        let mut snapshot = Snapshot::default();
        let meta = snapshot.mut_metadata();
        (meta.index, meta.term) = (*index, *term);
        meta.set_conf_state(cs.clone());
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        let mut e = Entry::default();
        (e.index, e.term) = (index, term);
        e.data = vec![index as u8].into();
        e
    }

    fn ctx() -> GetEntriesContext {
        GetEntriesContext::empty(false)
    }

    #[test]
    fn storage_answers_as_raft_rs_expects() {
        let log = RaftLog::new(5, 2, ConfState::default());
        log.append(&[entry(6, 2), entry(7, 3), entry(8, 3)]).unwrap();
        assert_eq!((log.first_index().unwrap(), Storage::last_index(&log).unwrap()), (6, 8));
        assert_eq!(log.term(5).unwrap(), 2, "the checkpoint's term is kept");
        assert_eq!(log.term(7).unwrap(), 3);
        assert!(matches!(log.term(4), Err(raft::Error::Store(StorageError::Compacted))));
        assert!(matches!(
            log.term(9),
            Err(raft::Error::Store(StorageError::Unavailable))
        ));
        assert!(matches!(
            log.entries(5, 7, None, ctx()),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        let got: Vec<u64> = log
            .entries(6, 9, None, ctx())
            .unwrap()
            .iter()
            .map(|e| e.index)
            .collect();
        assert_eq!(got, vec![6, 7, 8]);
        let one = log.entries(6, 9, 1, ctx()).unwrap();
        assert_eq!(one.len(), 1, "at least one entry, whatever the size limit");
    }

    #[test]
    fn entries_before_the_checkpoint_stay_for_followers_behind() {
        let log = RaftLog::new(10, 2, ConfState::default());
        for i in 1..=12 {
            log.replay(entry_record(&entry(i, 2)).unwrap()).unwrap();
        }
        log.finish_replay(100);
        // Entry 1 becomes the start (its term is what raft-rs asks about); 2..=12 are there.
        assert_eq!((log.first_index().unwrap(), log.term(1).unwrap()), (2, 2));
        let got = log.entries(2, 13, None, ctx()).unwrap();
        assert_eq!(got.first().map(|e| e.index), Some(2));
        assert_eq!(got.len(), 11);
        // Only the last `keep` of them stay.
        let trimmed = RaftLog::new(10, 2, ConfState::default());
        for i in 1..=12 {
            trimmed.replay(entry_record(&entry(i, 2)).unwrap()).unwrap();
        }
        trimmed.finish_replay(3);
        assert_eq!(trimmed.first_index().unwrap(), 8);
        // A run that does not reach the checkpoint is not used.
        let gap = RaftLog::new(10, 2, ConfState::default());
        for i in 1..=8 {
            gap.replay(entry_record(&entry(i, 2)).unwrap()).unwrap();
        }
        gap.finish_replay(100);
        assert_eq!(gap.first_index().unwrap(), 11);
    }

    #[test]
    fn a_new_leader_replaces_a_conflicting_suffix() {
        let log = RaftLog::new(0, 0, ConfState::default());
        assert_eq!(log.append(&[entry(1, 1), entry(2, 1), entry(3, 1)]).unwrap(), None);
        assert_eq!(log.append(&[entry(2, 2)]).unwrap(), Some(2));
        assert_eq!(Storage::last_index(&log).unwrap(), 2);
        assert_eq!(log.term(2).unwrap(), 2);
        assert!(log.append(&[entry(5, 2)]).is_err(), "a gap is refused");
    }

    #[test]
    fn replaying_the_wal_rebuilds_the_log_after_the_checkpoint() {
        let written = RaftLog::new(0, 0, ConfState::default());
        let mut records = Vec::new();
        for e in [entry(1, 1), entry(2, 1), entry(3, 1)] {
            records.push(entry_record(&e).unwrap());
        }
        records.push(Record::Truncate { from: LogIndex(3) });
        records.push(entry_record(&entry(3, 2)).unwrap());
        records.push(entry_record(&entry(4, 2)).unwrap());
        let mut hs = HardState::default();
        (hs.term, hs.vote, hs.commit) = (2, 1, 3);
        let cs = ConfState {
            voters: vec![1],
            ..ConfState::default()
        };
        records.push(Record::State(encode_state(&hs, &cs).unwrap()));
        for r in records.clone() {
            written.replay(r).unwrap();
        }
        assert_eq!(written.hard_state(), hs);
        assert_eq!(written.conf_state(), cs);
        assert_eq!(written.term(3).unwrap(), 2, "the truncated entry was replaced");
        // With a checkpoint at 2, entries up to it are skipped.
        let after = RaftLog::new(2, 1, ConfState::default());
        for r in records {
            after.replay(r).unwrap();
        }
        assert_eq!(after.first_index().unwrap(), 3);
        assert_eq!(Storage::last_index(&after).unwrap(), 4);
        after.compact_to(3, 2);
        assert_eq!((after.first_index().unwrap(), after.term(3).unwrap()), (4, 2));
    }
}
