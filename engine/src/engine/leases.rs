//! etcd's Lease service on the engine: grant, revoke, keep-alive, time-to-live, and expiry,
//! which the leader alone proposes, a bounded round of revokes at a time, from the lease
//! checker thread, which also checkpoints remaining TTLs.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};

use super::core::Core;
use super::propose::{Applied, OverQuota, Pending};
use super::waiters::wait_answer;
use crate::error::{Error, Result};
use crate::lease::lessor::LeaseStatus;
use crate::request::{Alarm, Request, Response};

/// A granted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseGrant {
    /// The lease's ID: the one asked for, or one the engine chose when asked for 0.
    pub id: i64,
    /// Seconds, raised to the minimum TTL.
    pub ttl: i64,
}

/// etcd's Lease service ([`Engine::leases`](crate::Engine::leases)).
#[derive(Clone, Copy, Debug)]
pub struct Leases<'a> {
    core: &'a Core,
}

impl<'a> Leases<'a> {
    pub(super) fn new(core: &'a Core) -> Leases<'a> {
        Leases { core }
    }

    /// Grants a lease (etcd's `LeaseGrant`); `id` 0 lets the engine choose one.
    pub fn grant(&self, id: i64, ttl: i64) -> Result<Applied<LeaseGrant>> {
        // A thread of its own (a server calls this off its async threads): the refusal may
        // wait for the NOSPACE alarm.
        self.core
            .check_quota(crate::mvcc::store::record_size(0, 0))
            .map_err(OverQuota::wait)?;
        let ttl = self.core.state.read().lessor.effective_ttl(ttl);
        let id = if id != 0 {
            id
        } else {
            loop {
                let candidate = self.core.next_lease_id.fetch_add(1, Ordering::Relaxed).max(1);
                if !self.core.state.read().lessor.exists(candidate) {
                    break candidate;
                }
            }
        };
        match self.core.propose(Request::LeaseGrant { id, ttl })? {
            (Response::LeaseGrant { id, ttl }, revision) => Ok(Applied {
                response: LeaseGrant { id, ttl },
                revision,
            }),
            (other, _) => Err(Error::internal(format!("lease grant answered with {other:?}"))),
        }
    }

    /// Revokes a lease, deleting its keys in one revision (etcd's `LeaseRevoke`).
    pub fn revoke(&self, id: i64) -> Result<Applied<()>> {
        revoke(self.core, id, None)
    }

    /// Renews a lease for its full TTL (etcd's `LeaseKeepAlive`); returns the TTL. Only the
    /// leader, which expires leases, renews them ([`Error::NotLeader`] elsewhere: send the
    /// keep-alive to [`Engine::leader`](crate::Engine::leader)). A renewal is local, except that a checkpointed
    /// remaining TTL is cleared through the log, as etcd does, so a restart cannot resume from
    /// it.
    pub fn keep_alive(&self, id: i64) -> Result<i64> {
        if self.core.leader() != Some(self.core.member_id) {
            return Err(Error::NotLeader);
        }
        // Everything committed is applied first (etcd's waitAppliedIndex), so a lease granted
        // through another member is known here.
        self.core.read_barrier()?;
        let (ttl, stale_checkpoint) = self.core.state.write().lessor.renew(id)?;
        if stale_checkpoint {
            self.core.propose(clear_checkpoint(id))?;
        }
        Ok(ttl)
    }

    /// [`Leases::keep_alive`] for async code: no thread waits for the read barrier or
    /// the log. Bound the wait with a timeout of your runtime's (see
    /// [`Engine::read_barrier_async`](crate::Engine::read_barrier_async)).
    pub async fn keep_alive_async(&self, id: i64) -> Result<i64> {
        if self.core.leader() != Some(self.core.member_id) {
            return Err(Error::NotLeader);
        }
        self.core.read_barrier_async().await?;
        let (ttl, stale_checkpoint) = self.core.state.write().lessor.renew(id)?;
        if stale_checkpoint {
            Pending::new(self.core.submit(clear_checkpoint(id))?, |_| Ok(())).await?;
        }
        Ok(ttl)
    }

    /// A lease's remaining and granted TTL, and optionally its keys (etcd's `LeaseTimeToLive`;
    /// TTL -1 for an unknown lease).
    pub fn time_to_live(&self, id: i64, keys: bool) -> LeaseStatus {
        self.core.state.read().lessor.time_to_live(id, keys)
    }

    /// Every lease ID (etcd's `LeaseLeases`).
    pub fn list(&self) -> Vec<i64> {
        self.core.state.read().lessor.leases()
    }

    /// Revokes one round of expired leases now (at most `Config::lease_revoke_batch` leases,
    /// holding at most `Config::lease_revoke_keys` keys, but always one); returns how many.
    /// The lease checker runs rounds periodically unless `Config::lease_check_interval` is
    /// `None`.
    pub fn expire_now(&self) -> usize {
        self.core.expire_leases().0
    }

    /// Records every lease's remaining TTL durably, so that a restart resumes from it. The
    /// lease checker does this every `Config::lease_checkpoint_interval`.
    pub fn checkpoint_now(&self) -> Result<()> {
        self.core.checkpoint_leases()
    }
}

/// Revokes lease `id`, permitted at auth revision `guard` if any.
pub(super) fn revoke(core: &Core, id: i64, guard: Option<u64>) -> Result<Applied<()>> {
    match core.propose(super::propose::guarded(Request::LeaseRevoke { id }, guard))? {
        (Response::LeaseRevoke, revision) => Ok(Applied { response: (), revision }),
        (other, _) => Err(Error::internal(format!("lease revoke answered with {other:?}"))),
    }
}

impl Core {
    fn checkpoint_leases(&self) -> Result<()> {
        // Only the leader renews leases, so only its clocks are worth recording; a follower's
        // would record expiries that keep-alives moved on long ago.
        let Some(term) = self.leading_term() else {
            return Ok(());
        };
        let remaining = self.state.read().lessor.remaining();
        if remaining.is_empty() {
            return Ok(());
        }
        let (answer, timeout) = self.submit_as_leader(Request::LeaseCheckpoint { remaining }, term)?;
        wait_answer(answer, timeout).map(|_| ())
    }

    /// The term this member leads and has restarted the lease clocks in (it expires and
    /// checkpoints leases by them), if it leads.
    fn leading_term(&self) -> Option<u64> {
        let term = self.status.term.load(Ordering::Relaxed);
        let leading = self.status.leader.load(Ordering::Relaxed) == self.member_id
            && self.status.leases_term.load(Ordering::Acquire) == term;
        leading.then_some(term)
    }

    /// One round of revokes (see `Config::lease_revoke_keys`): proposes a revoke for up to a
    /// batch of expired leases, all at once so their fsyncs are shared, and waits for them.
    /// Returns how many leases it revoked, and whether more expired ones are waiting.
    fn expire_leases(&self) -> (usize, bool) {
        // Only the leader expires leases, by proposing revokes, once it has restarted their
        // clocks in its term; and only while it still leads that term (a paused leader that
        // resumes decides by a clock the new leader's keep-alives moved on from).
        let Some(term) = self.leading_term() else {
            return (0, false);
        };
        // Nothing that writes is applied while a CORRUPT alarm is raised: revokes would fail.
        if self.state.read().alarms.iter().any(|(_, a)| *a == Alarm::Corrupt) {
            return (0, false);
        }
        let (expired, more) = self
            .state
            .write()
            .lessor
            .expired(self.config.lease_revoke_batch, self.config.lease_revoke_keys);
        let pending: Vec<_> = expired
            .into_iter()
            .map(|id| (id, self.submit_as_leader(Request::LeaseRevoke { id }, term)))
            .collect();
        let mut revoked = 0;
        for (id, answer) in pending {
            let outcome = answer.and_then(|(rx, timeout)| wait_answer(rx, timeout));
            match outcome {
                Ok(_) => revoked += 1,
                // Revoked meanwhile by a client: nothing to retry.
                Err(Error::LeaseNotFound) => {}
                // It may still be applied: the lease stays unrenewable (a renewal now could be
                // answered and then revoked) until this member leads again, which restarts the
                // lease clocks.
                Err(e) if e.outcome_unknown() => {
                    tracing::warn!(lease = id, error = %e, "revoking an expired lease: no answer in time");
                }
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
pub(super) fn checker_loop(core: Arc<Core>, stop: Receiver<()>, every: std::time::Duration) {
    let checkpoint_every = core.config.lease_checkpoint_interval;
    let clock = core.config.clock.clone();
    let mut last_checkpoint = clock.now();
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(every) {
        // Round after round while expired leases remain; other writes get in between rounds
        // (they queue with the next round's revokes), and a stop request is seen between them.
        while let (revoked, true) = core.expire_leases() {
            if revoked == 0 || !matches!(stop.try_recv(), Err(TryRecvError::Empty)) {
                break;
            }
        }
        if checkpoint_every.is_some_and(|period| clock.now().saturating_sub(last_checkpoint) >= period) {
            last_checkpoint = clock.now();
            if let Err(e) = core.checkpoint_leases() {
                tracing::warn!(error = %e, "lease checkpoint failed");
            }
        }
    }
}

/// Clears a renewed lease's checkpointed remaining TTL, so a restart cannot resume from it.
fn clear_checkpoint(id: i64) -> Request {
    Request::LeaseCheckpoint {
        remaining: vec![(id, 0)],
    }
}

#[cfg(test)]
mod tests {
    use super::wait_answer;
    use crate::request::Request;
    use crate::{Config, Engine, Error};

    /// What only the leader of a term decides (an expired lease's revoke) is proposed only
    /// while this member leads that term: a decision made in a term it no longer leads is
    /// refused, not carried to the new leader, and changes nothing.
    #[test]
    fn a_revoke_decided_in_a_term_this_member_no_longer_leads_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            lease_check_interval: None,
            ..Config::default()
        };
        let engine = Engine::open(dir.path(), config).unwrap();
        let lease = engine.leases().grant(0, 60).unwrap().response.id;
        let term = engine.server().term();
        let core = &engine.core;
        for stale in [term - 1, term + 1] {
            let (answer, timeout) = core
                .submit_as_leader(Request::LeaseRevoke { id: lease }, stale)
                .unwrap();
            assert!(
                matches!(wait_answer(answer, timeout), Err(Error::NotLeader)),
                "term {stale}"
            );
            assert_eq!(
                engine.leases().time_to_live(lease, false).granted_ttl,
                60,
                "term {stale}"
            );
        }
        let (answer, timeout) = core.submit_as_leader(Request::LeaseRevoke { id: lease }, term).unwrap();
        wait_answer(answer, timeout).unwrap();
        assert_eq!(engine.leases().time_to_live(lease, false).ttl, -1);
        engine.close().unwrap();
    }
}
