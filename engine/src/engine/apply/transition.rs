//! The apply core: one batch of committed entries applied to the [`State`], as a pure
//! transition. [`State::apply_batch`] changes nothing but the state and returns an
//! [`Outcome`], a plain value: the proposals' answers, each new revision's events, a checkpoint
//! to write, and where the state now stands. Publishing it (answering waiters, feeding the
//! watchers, telling the node thread) is the caller's step, after the state lock is released
//! (raft-rs's `Ready`/`advance` split). The tests below drive it entry by entry.

use std::sync::atomic::{AtomicUsize, Ordering};

use raft::eraftpb::{ConfState, EntryType};

use crate::auth::{AuthChange, AuthError};
use crate::engine::checkpointing::Encoded;
use crate::engine::state::State;
use crate::engine::waiters::Answer;
use crate::error::Error;
use crate::request::{Alarm, Request, Response};
use crate::version::Feature;
use crate::watch::feed::Fed;

/// Committed entries, in order, each with the membership change it applied, if any.
pub(in crate::engine) type Entries = Vec<(raft::eraftpb::Entry, Option<crate::membership::ConfApplied>)>;

/// What applying a batch did, for [`super::Publisher::publish`] to carry out.
#[derive(Debug, Default)]
pub(in crate::engine) struct Outcome {
    /// Each proposal's answer, by request ID, in log order.
    pub(super) answers: Vec<(u64, Answer)>,
    /// Each new revision with its events, in revision order (none while nobody watches).
    pub(super) events: Vec<Fed>,
    /// A checkpoint encoded at its point in the batch, to be written off the apply path.
    pub(super) checkpoint: Option<Encoded>,
    /// The last index applied, its term, and the membership then.
    pub(super) applied_index: u64,
    pub(super) applied_term: u64,
    pub(super) conf_state: ConfState,
    /// The store's current revision after the batch.
    pub(super) revision: i64,
    /// Whether this member is a learner, if the batch changed the membership.
    pub(super) learner: Option<bool>,
    /// A compaction is left for the apply thread to sweep. Unfinished, not only pending: one
    /// paused by a snapshot still needs the apply loop, which looks again now and then.
    pub(super) compacting: bool,
    /// Entries left unapplied because this member could not apply the first of them (its
    /// disk is full, say): applying stops there and is tried again, in order.
    pub(super) stalled: Option<Stalled>,
}

/// Entries not applied, from the one that failed on, and why it failed.
#[derive(Debug)]
pub(in crate::engine) struct Stalled {
    pub(super) entries: Entries,
    pub(super) error: Error,
}

/// Whether applying a request failed because of this member, not the request: its files
/// (a full disk, damage). Every other member applies it, so this one must not answer the
/// request with the error and go on, which would leave it with another state than theirs; it
/// stops and applies the entry again later.
fn is_local_failure(e: &Error) -> bool {
    matches!(
        e,
        Error::Backend(_) | Error::Wal(_) | Error::Checkpoint(_) | Error::Snapshot(_)
    )
}

/// When a checkpoint is encoded: every `every` entries applied (0: never), and only when the
/// checkpointer thread can take one (one is written at a time).
#[derive(Debug)]
pub(in crate::engine) struct Schedule {
    pub(super) every: u64,
    /// Entries applied since the last checkpoint was encoded.
    pub(super) since: u64,
    /// Whether one may be encoded now: a checkpointer runs and is not writing one.
    pub(super) may_encode: bool,
}

impl Schedule {
    /// Whether applying `entries` more would encode a checkpoint.
    pub(super) fn due_within(&self, entries: usize) -> bool {
        self.every > 0 && self.since + entries as u64 >= self.every
    }

    /// Counts one entry applied; whether a checkpoint is to be encoded after it.
    fn count(&mut self) -> bool {
        self.since += 1;
        if self.every > 0 && self.since >= self.every && self.may_encode {
            self.since = 0;
            self.may_encode = false;
            return true;
        }
        false
    }
}

/// What a batch is applied with, besides the state.
pub(in crate::engine) struct Step<'a> {
    /// This member's ID (to say whether it is a learner after a membership change).
    pub(super) member_id: u64,
    /// How many watchers there are: no events are built for none.
    pub(super) watchers: &'a AtomicUsize,
    pub(super) schedule: &'a mut Schedule,
}

impl State {
    /// Applies committed entries in order: each request once (a duplicate ID is skipped), a
    /// membership change, and the applied index and term. Changes nothing but the state.
    pub(in crate::engine) fn apply_batch(&mut self, batch: Entries, step: Step<'_>) -> Outcome {
        let mut out = Outcome::default();
        // Each write records its events as it makes them, while anyone watches.
        self.store.record_events(step.watchers.load(Ordering::Relaxed) > 0);
        let mut batch = batch.into_iter();
        while let Some((entry, conf)) = batch.next() {
            if entry.index <= self.applied_index {
                // In the state already: a snapshot from the leader was newer than its
                // metadata said. A waiter for it times out, as for any outcome not known.
                continue;
            }
            let id = entry.context.as_ref().try_into().ok().map(u64::from_le_bytes);
            if let Some(change) = conf {
                self.membership
                    .apply(&change, &crate::format::state::attributes::decode(&change.context));
                out.learner = Some(self.membership.learners.contains(&step.member_id));
                if let Some(id) = id {
                    out.answers
                        .push((id, Ok((Response::ConfChange, self.store.current_revision()))));
                }
            }
            let before = self.store.current_revision();
            let duplicate = id.is_some_and(|id| !self.recent.first_time(id));
            if duplicate {
                tracing::debug!(index = entry.index, "skipping a request applied already");
            }
            if entry.get_entry_type() == EntryType::EntryNormal && !entry.data.is_empty() && !duplicate {
                let outcome = match crate::format::entry::decode(&entry.data) {
                    Ok(request) => request.check().and_then(|()| apply(self, &request, entry.index)),
                    Err(e) => {
                        tracing::error!(index = entry.index, error = %e, "a committed entry does not decode");
                        Err(Error::CorruptEntry {
                            index: entry.index,
                            reason: e.to_string(),
                        })
                    }
                };
                if let Some(e) = outcome.as_ref().err().filter(|e| is_local_failure(e)) {
                    // The request left no trace (a failed write is undone): stop here, and
                    // apply this entry and the rest again later.
                    if let Some(id) = id {
                        self.recent.forget_last(id);
                    }
                    let error = e.clone();
                    // A normal entry: no membership change rides with it.
                    let mut entries = vec![(entry, None)];
                    entries.extend(batch);
                    out.stalled = Some(Stalled { entries, error });
                    break;
                }
                if let Some(id) = id {
                    out.answers.push((id, outcome));
                }
            }
            self.applied_index = entry.index;
            self.applied_term = entry.term;
            let after = self.store.current_revision();
            let events = self.store.take_events();
            if after > before && !events.is_empty() {
                out.events.push((after, events));
            }
            if step.schedule.count() {
                // A small record: the layout and the leases.
                match self.checkpoint() {
                    Ok(e) => out.checkpoint = Some(e),
                    Err(e) => {
                        step.schedule.may_encode = true;
                        tracing::error!(error = %e, "cannot encode a checkpoint");
                    }
                }
            }
        }
        out.applied_index = self.applied_index;
        out.applied_term = self.applied_term;
        out.revision = self.store.current_revision();
        out.conf_state = self.membership.to_conf_state();
        out.compacting = self.store.compaction_unfinished();
        out
    }
}

/// Applies one request; its errors are the request's answer, not the engine's. Everything that
/// depends on configuration was decided when it was proposed, so replay reaches the same state
/// whatever the configuration is now.
pub(super) fn apply(state: &mut State, request: &Request, index: u64) -> Answer {
    let State {
        store,
        lessor,
        alarms,
        membership,
        auth,
        auth_status,
        tokens,
        versions,
        ..
    } = state;
    if alarms.iter().any(|(_, a)| *a == Alarm::Corrupt) {
        // etcd's corrupt applier: nothing that changes data is applied while a member's copy
        // is known to differ; alarms go on, so it can be disarmed once the member is rebuilt.
        let refused = matches!(
            request,
            Request::Put(_)
                | Request::DeleteRange(_)
                | Request::Txn(_)
                | Request::Compact { .. }
                | Request::LeaseGrant { .. }
                | Request::LeaseRevoke { .. }
        );
        if refused {
            return Err(Error::Corrupt);
        }
    }
    if alarms.iter().any(|(_, a)| *a == Alarm::NoSpace) {
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
        Request::Alarm {
            activate,
            member,
            alarm,
        } => {
            if *activate {
                alarms.insert((*member, *alarm));
            } else {
                alarms.remove(&(*member, *alarm));
            }
            Ok((Response::Alarm, store.current_revision()))
        }
        Request::Auth(change) => {
            let applied = auth.apply(change);
            auth_status.mirror(auth);
            applied?;
            match change {
                AuthChange::UserDelete { name } | AuthChange::UserChangePassword { name, .. } => {
                    tokens.get_mut().invalidate_user(name);
                }
                AuthChange::Disable => tokens.get_mut().clear(),
                _ => {}
            }
            Ok((Response::Auth, store.current_revision()))
        }
        Request::Authenticate {
            name,
            prefix,
            checked_revision,
        } => {
            auth.password_hash(name)?;
            if auth.revision() != *checked_revision {
                return Err(AuthError::OldRevision.into());
            }
            let token = format!("{prefix}.{index}");
            tokens.get_mut().register(token.clone(), name.clone());
            Ok((Response::Authenticated { token }, store.current_revision()))
        }
        Request::Guarded { auth_revision, request } => {
            if auth.enabled() && *auth_revision < auth.revision() {
                return Err(AuthError::OldRevision.into());
            }
            apply(state, request, index)
        }
        Request::ClusterVersion(v) => {
            if *v != versions.cluster() {
                tracing::info!(from = %versions.cluster(), to = %v, "the cluster version changed");
            }
            versions.cluster = Some(*v);
            if !versions.allows(Feature::MemberAlarm) {
                // From here alarms are logged without their member (member 0's): hold the
                // raised ones that way too, so that a disarm in that form reaches them, on
                // this release and on the older one a downgrade goes to.
                *alarms = alarms.iter().map(|&(_, a)| (0, a)).collect();
            }
            Ok((Response::Versions, store.current_revision()))
        }
        Request::Downgrade { target } => {
            match target {
                Some(t) => tracing::info!(target = %t, "a downgrade is enabled"),
                None => tracing::info!("the downgrade is over (cancelled or done)"),
            }
            versions.downgrade = *target;
            Ok((Response::Versions, store.current_revision()))
        }
    }
}

#[cfg(test)]
mod tests {
    use raft::eraftpb::Entry;

    use super::*;
    use crate::kv::txn::{DeleteRangeRequest, PutRequest};
    use crate::mvcc::store::EventKind;

    /// A committed entry at `index` holding `request`, proposed with ID `id`.
    fn entry(index: u64, id: u64, request: Request) -> (Entry, Option<crate::membership::ConfApplied>) {
        let e = Entry {
            entry_type: EntryType::EntryNormal,
            index,
            term: 3,
            data: crate::format::entry::encode(request, &Default::default())
                .unwrap()
                .into(),
            context: id.to_le_bytes().to_vec().into(),
            ..Entry::default()
        };
        (e, None)
    }

    fn put(key: &str) -> Request {
        Request::Put(PutRequest::new(key, "v"))
    }

    struct Harness {
        state: State,
        watchers: AtomicUsize,
        schedule: Schedule,
    }

    impl Harness {
        fn new(watchers: usize, checkpoint_every: u64) -> Harness {
            Harness {
                state: State::empty(0),
                watchers: AtomicUsize::new(watchers),
                schedule: Schedule {
                    every: checkpoint_every,
                    since: 0,
                    may_encode: true,
                },
            }
        }

        fn apply(&mut self, batch: Entries) -> Outcome {
            self.state.apply_batch(
                batch,
                Step {
                    member_id: 2,
                    watchers: &self.watchers,
                    schedule: &mut self.schedule,
                },
            )
        }
    }

    fn revisions(answers: &[(u64, Answer)]) -> Vec<(u64, Option<i64>)> {
        answers
            .iter()
            .map(|(id, a)| (*id, a.as_ref().ok().map(|(_, rev)| *rev)))
            .collect()
    }

    #[test]
    fn a_batch_answers_each_request_once_with_its_revision_and_events() {
        let mut h = Harness::new(1, 0);
        let out = h.apply(vec![
            entry(1, 10, put("a")),
            entry(2, 10, put("a")), // the same proposal logged twice: applied once
            entry(3, 11, put("b")),
            entry(4, 12, Request::DeleteRange(DeleteRangeRequest::key("a"))),
        ]);
        assert_eq!(revisions(&out.answers), [(10, Some(2)), (11, Some(3)), (12, Some(4))]);
        let events: Vec<(i64, Vec<(EventKind, String)>)> = out
            .events
            .iter()
            .map(|(rev, events)| {
                let kinds = events
                    .iter()
                    .map(|e| (e.kind, String::from_utf8(e.kv.key.to_vec()).unwrap()))
                    .collect();
                (*rev, kinds)
            })
            .collect();
        assert_eq!(
            events,
            [
                (2, vec![(EventKind::Put, "a".into())]),
                (3, vec![(EventKind::Put, "b".into())]),
                (4, vec![(EventKind::Delete, "a".into())]),
            ]
        );
        assert_eq!((out.applied_index, out.applied_term), (4, 3));
        assert_eq!((h.state.applied_index, h.state.store.current_revision()), (4, 4));
        assert!(out.checkpoint.is_none() && out.learner.is_none() && !out.compacting);

        // Entries already applied (a snapshot was newer than its metadata said) are skipped.
        let out = h.apply(vec![entry(4, 13, put("c")), entry(5, 14, put("d"))]);
        assert_eq!(revisions(&out.answers), [(14, Some(5))]);
    }

    #[test]
    fn nobody_watching_builds_no_events_and_a_damaged_entry_is_answered_as_such() {
        let mut h = Harness::new(0, 0);
        let (mut bad, _) = entry(1, 20, put("a"));
        bad.data = vec![9, 9].into();
        let out = h.apply(vec![(bad, None), entry(2, 21, put("a"))]);
        assert!(out.events.is_empty());
        assert!(matches!(
            out.answers[0],
            (20, Err(Error::CorruptEntry { index: 1, .. }))
        ));
        assert_eq!(revisions(&out.answers[1..]), [(21, Some(2))]);
        assert_eq!(out.applied_index, 2);
    }

    #[test]
    fn a_checkpoint_is_encoded_when_due_and_only_when_one_can_be_taken() {
        let mut h = Harness::new(0, 2);
        let out = h.apply((1..=5).map(|i| entry(i, 100 + i, put("k"))).collect());
        // Due after the second entry; one at a time, so none after the fourth.
        assert_eq!(out.checkpoint.map(|c| c.applied), Some(2));
        assert_eq!(h.schedule.since, 3);
        // The checkpointer is busy: none, however many entries pass.
        h.schedule.may_encode = false;
        let out = h.apply((6..=9).map(|i| entry(i, 100 + i, put("k"))).collect());
        assert!(out.checkpoint.is_none());
        // Free again: the first entry of the next batch encodes one.
        h.schedule.may_encode = true;
        assert!(h.schedule.due_within(1));
        let out = h.apply(vec![entry(10, 110, put("k"))]);
        assert_eq!(out.checkpoint.map(|c| c.applied), Some(10));
    }

    #[test]
    fn a_membership_change_is_answered_and_says_whether_this_member_learns() {
        let mut h = Harness::new(0, 0);
        let (mut e, _) = entry(1, 30, put("ignored"));
        e.entry_type = EntryType::EntryConfChange;
        let change = crate::membership::ConfApplied {
            state: ConfState {
                voters: vec![1],
                learners: vec![2],
                ..ConfState::default()
            },
            added: vec![1, 2],
            ..Default::default()
        };
        let out = h.apply(vec![(e, Some(change))]);
        assert!(matches!(out.answers[..], [(30, Ok((Response::ConfChange, _)))]));
        assert_eq!(out.learner, Some(true), "member 2 is a learner");
        assert_eq!(out.conf_state.learners, [2]);
        assert_eq!(
            h.state.store.current_revision(),
            1,
            "a conf change entry writes nothing"
        );
    }
}
