//! The lessor: leases, the keys attached to them, and when they expire.
//!
//! Two kinds of state live here. What every member agrees on comes from applied requests:
//! which leases exist, their granted TTL, the keys attached (followed from every write's lease
//! changes) and the remaining TTL of the last checkpoint. When a lease expires is local: it is
//! `now + TTL` on the member's own clock, set when the lease is granted or renewed, or when it is
//! loaded after a restart (then from the checkpointed remaining TTL if there is one). So a
//! restart can only postpone expiry, never bring it forward.
//!
//! Expiry does not delete anything by itself: [`Lessor::expired`] lists up to a batch of
//! expired leases, and the engine proposes a revoke for each through the normal write path, so
//! mass expiry becomes many small writes interleaved with everyone else's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::mvcc::store::LeaseChange;

/// The largest TTL a lease may have, in seconds (etcd's `MaxLeaseTTL`).
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

#[derive(Debug, Clone)]
struct Lease {
    /// Granted TTL in seconds (raised to the minimum).
    ttl: i64,
    /// Remaining TTL at the last checkpoint, in seconds; 0 if never checkpointed.
    remaining_ttl: i64,
    /// Local: when it expires on this member's clock.
    expiry: Duration,
    /// Local: where `by_expiry` holds it, at or before `expiry`. A renewal moves `expiry` on
    /// and leaves the entry; [`Lessor::expired`] moves it when it comes due first.
    queued: Duration,
    keys: BTreeSet<Bytes>,
    /// Local: a revoke has been proposed and not yet applied.
    revoking: bool,
}

/// The part of a lease every member agrees on, as a checkpoint keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseRecord {
    pub(crate) id: i64,
    pub(crate) ttl: i64,
    pub(crate) remaining_ttl: i64,
}

/// What [`crate::Leases::time_to_live`] reports (etcd's `LeaseTimeToLiveResponse`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStatus {
    /// The lease asked about.
    pub id: i64,
    /// Whole seconds left, rounded down as etcd does; -1 for a lease that does not exist.
    pub ttl: i64,
    /// The TTL granted, in seconds, after raising to the minimum; 0 for a lease that does not
    /// exist.
    pub granted_ttl: i64,
    /// The keys attached, in key order, if asked for; else empty.
    pub keys: Vec<Bytes>,
}

#[derive(Debug)]
pub(crate) struct Lessor {
    leases: foldhash::HashMap<i64, Lease>,
    /// Local expiry order: (queued, id). Invariant: one entry per lease, at its `queued`,
    /// which is at or before its expiry. A keep-alive renews a lease every few seconds: it
    /// then changes only the lease, and the entry moves once per TTL, not per renewal.
    by_expiry: BTreeMap<(Duration, i64), ()>,
    /// Grants below this TTL (seconds) are raised to it.
    min_ttl: i64,
    clock: Arc<dyn Clock>,
}

fn secs(d: i64) -> Duration {
    Duration::from_secs(u64::try_from(d).unwrap_or(0))
}

impl Lessor {
    pub(crate) fn new(min_ttl: i64, clock: Arc<dyn Clock>) -> Lessor {
        Lessor {
            leases: foldhash::HashMap::default(),
            by_expiry: BTreeMap::new(),
            min_ttl,
            clock,
        }
    }

    pub(crate) fn exists(&self, id: i64) -> bool {
        self.leases.contains_key(&id)
    }

    /// Sets when lease `id` expires; its queue entry moves only if that is earlier than
    /// where it is queued.
    fn set_expiry(&mut self, id: i64, expiry: Duration) {
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.expiry = expiry;
            if expiry < lease.queued {
                self.by_expiry.remove(&(lease.queued, id));
                lease.queued = expiry;
                self.by_expiry.insert((expiry, id), ());
            }
        }
    }

    /// The TTL a grant asking for `ttl` gets: raised to the minimum. Decided when the grant
    /// is proposed, so replaying it never depends on the configuration of the day.
    pub(crate) fn effective_ttl(&self, ttl: i64) -> i64 {
        ttl.max(self.min_ttl)
    }

    /// Applies a grant of exactly `ttl` (see [`Lessor::effective_ttl`]); returns it.
    pub(crate) fn grant(&mut self, id: i64, ttl: i64) -> Result<i64> {
        // Any ID but 0 (no lease): etcd grants negative ones too.
        if id == 0 {
            return Err(Error::internal("a lease grant with ID 0 reached the lessor"));
        }
        if ttl > MAX_LEASE_TTL {
            return Err(Error::LeaseTtlTooLarge);
        }
        if self.leases.contains_key(&id) {
            return Err(Error::LeaseExists);
        }
        let expiry = self.clock.now() + secs(ttl);
        self.leases.insert(
            id,
            Lease {
                ttl,
                remaining_ttl: 0,
                expiry,
                queued: expiry,
                keys: BTreeSet::new(),
                revoking: false,
            },
        );
        self.by_expiry.insert((expiry, id), ());
        Ok(ttl)
    }

    /// The keys attached to a lease, to delete when it is revoked.
    pub(crate) fn keys(&self, id: i64) -> Result<Vec<Bytes>> {
        let lease = self.leases.get(&id).ok_or(Error::LeaseNotFound)?;
        Ok(lease.keys.iter().cloned().collect())
    }

    /// Applies a revoke (its keys are deleted by the caller in the same request).
    pub(crate) fn revoke(&mut self, id: i64) -> Result<()> {
        let lease = self.leases.remove(&id).ok_or(Error::LeaseNotFound)?;
        self.by_expiry.remove(&(lease.queued, id));
        Ok(())
    }

    /// Applies a checkpoint of the remaining TTL (unknown leases are ignored: a revoke won).
    pub(crate) fn checkpoint(&mut self, id: i64, remaining_ttl: i64) {
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.remaining_ttl = remaining_ttl;
        }
    }

    /// Follows a write's lease changes.
    pub(crate) fn apply_changes(&mut self, changes: &[LeaseChange]) {
        for change in changes {
            if let Some(lease) = self.leases.get_mut(&change.from) {
                lease.keys.remove(&change.key);
            }
            if let Some(lease) = self.leases.get_mut(&change.to) {
                lease.keys.insert(change.key.clone());
            }
        }
    }

    /// Renews a lease (keep-alive): it expires a full TTL from now. Returns the TTL, and
    /// whether a checkpointed remaining TTL must now be cleared through the log (else a
    /// restart would resume from the stale, shorter one). A lease whose revoke is under way
    /// is gone already.
    pub(crate) fn renew(&mut self, id: i64) -> Result<(i64, bool)> {
        let lease = self
            .leases
            .get(&id)
            .filter(|l| !l.revoking)
            .ok_or(Error::LeaseNotFound)?;
        let (ttl, stale_checkpoint) = (lease.ttl, lease.remaining_ttl != 0);
        let expiry = self.clock.now() + secs(ttl);
        self.set_expiry(id, expiry);
        Ok((ttl, stale_checkpoint))
    }

    /// Restarts every lease's clock from now, after loading state or on becoming leader: from
    /// the checkpointed remaining TTL where there is one, else the full TTL. Never earlier than
    /// before. A revoke this member proposed as an earlier leader is forgotten: it was applied
    /// by now, or it never will be.
    pub(crate) fn restart_clocks(&mut self) {
        for lease in self.leases.values_mut() {
            lease.revoking = false;
        }
        let now = self.clock.now();
        let plan: Vec<(i64, Duration)> = self
            .leases
            .iter()
            .map(|(id, l)| {
                let left = if l.remaining_ttl > 0 { l.remaining_ttl } else { l.ttl };
                (*id, now + secs(left))
            })
            .collect();
        for (id, expiry) in plan {
            self.set_expiry(id, expiry);
        }
    }

    /// Expired leases not already being revoked, marked as being revoked: up to `limit` of
    /// them, stopping once they hold `max_keys` keys (always at least one). Also says whether
    /// more expired leases are left for another round.
    pub(crate) fn expired(&mut self, limit: usize, max_keys: usize) -> (Vec<i64>, bool) {
        let now = self.clock.now();
        let mut out = Vec::new();
        let mut keys = 0;
        let mut more = false;
        // Due entries of leases renewed since they were queued: queued again at their expiry.
        let mut renewed = Vec::new();
        for &(queued, id) in self.by_expiry.keys() {
            if queued > now {
                break;
            }
            let Some(lease) = self.leases.get(&id) else {
                continue;
            };
            if lease.expiry > now {
                renewed.push((queued, id, lease.expiry));
                continue;
            }
            if lease.revoking {
                continue;
            }
            if !out.is_empty() && (out.len() >= limit || keys + lease.keys.len() > max_keys) {
                more = true;
                break;
            }
            keys += lease.keys.len();
            out.push(id);
        }
        for (queued, id, expiry) in renewed {
            self.by_expiry.remove(&(queued, id));
            self.by_expiry.insert((expiry, id), ());
            if let Some(lease) = self.leases.get_mut(&id) {
                lease.queued = expiry;
            }
        }
        for id in &out {
            if let Some(l) = self.leases.get_mut(id) {
                l.revoking = true;
            }
        }
        (out, more)
    }

    /// Forgets that a revoke was proposed (it failed): the lease may be listed again.
    pub(crate) fn revoke_failed(&mut self, id: i64) {
        if let Some(l) = self.leases.get_mut(&id) {
            l.revoking = false;
        }
    }

    /// Remaining TTLs of every lease, for a checkpoint.
    pub(crate) fn remaining(&self) -> Vec<(i64, i64)> {
        let now = self.clock.now();
        self.leases
            .iter()
            .map(|(id, l)| {
                (
                    *id,
                    i64::try_from(l.expiry.saturating_sub(now).as_secs()).unwrap_or(i64::MAX),
                )
            })
            .collect()
    }

    pub(crate) fn time_to_live(&self, id: i64, with_keys: bool) -> LeaseStatus {
        let Some(l) = self.leases.get(&id) else {
            return LeaseStatus {
                id,
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            };
        };
        // Whole seconds left, rounded down, as etcd reports them.
        let left = l.expiry.saturating_sub(self.clock.now());
        let ttl = i64::try_from(left.as_secs()).unwrap_or(i64::MAX);
        LeaseStatus {
            id,
            ttl,
            granted_ttl: l.ttl,
            keys: if with_keys {
                l.keys.iter().cloned().collect()
            } else {
                Vec::new()
            },
        }
    }

    /// The agreed state of every lease, by ID, for a checkpoint.
    pub(crate) fn records(&self) -> Vec<LeaseRecord> {
        let mut out: Vec<LeaseRecord> = self
            .leases
            .iter()
            .map(|(id, l)| LeaseRecord {
                id: *id,
                ttl: l.ttl,
                remaining_ttl: l.remaining_ttl,
            })
            .collect();
        out.sort_by_key(|r| r.id);
        out
    }

    /// Loads leases from a checkpoint, their keys from the store; their clocks start with
    /// [`Lessor::restart_clocks`].
    pub(crate) fn load(&mut self, records: Vec<LeaseRecord>) {
        let now = self.clock.now();
        for r in records {
            let expiry = now + secs(r.ttl);
            self.by_expiry.insert((expiry, r.id), ());
            self.leases.insert(
                r.id,
                Lease {
                    ttl: r.ttl,
                    remaining_ttl: r.remaining_ttl,
                    expiry,
                    queued: expiry,
                    keys: Default::default(),
                    revoking: false,
                },
            );
        }
    }

    /// How many leases exist.
    pub(crate) fn len(&self) -> usize {
        self.leases.len()
    }

    /// Every lease ID, ascending.
    pub(crate) fn leases(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.leases.keys().copied().collect();
        ids.sort_unstable();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn lessor() -> (Lessor, ManualClock) {
        let clock = ManualClock::new();
        (Lessor::new(2, Arc::new(clock.clone())), clock)
    }

    #[test]
    fn grants_are_raised_to_the_minimum_and_ids_are_unique() {
        // As in etcd: a TTL below the minimum is raised to it.
        let (mut l, _) = lessor();
        assert_eq!(l.effective_ttl(1), 2);
        assert_eq!(l.grant(1, l.effective_ttl(1)).unwrap(), 2);
        assert_eq!(l.grant(2, 60).unwrap(), 60);
        assert_eq!(l.grant(1, 10), Err(Error::LeaseExists));
        assert_eq!(l.grant(3, MAX_LEASE_TTL + 1), Err(Error::LeaseTtlTooLarge));
        assert_eq!(l.leases(), vec![1, 2]);
        assert_eq!(l.time_to_live(9, false).ttl, -1, "unknown lease: TTL -1, no error");
    }

    #[test]
    fn leases_expire_on_time_never_early_and_once() {
        let (mut l, clock) = lessor();
        l.grant(1, 10).unwrap();
        l.grant(2, 20).unwrap();
        clock.advance(Duration::from_millis(9_999));
        assert!(l.expired(10, usize::MAX).0.is_empty(), "not a millisecond early");
        clock.advance(Duration::from_millis(1));
        assert_eq!(l.expired(10, usize::MAX), (vec![1], false));
        assert!(
            l.expired(10, usize::MAX).0.is_empty(),
            "listed once while its revoke is in flight"
        );
        l.revoke_failed(1);
        assert_eq!(l.expired(10, usize::MAX), (vec![1], false));
        l.revoke(1).unwrap();
        assert_eq!(l.renew(2).unwrap(), (20, false), "keep-alive restarts the TTL");
        clock.advance(Duration::from_secs(19));
        assert!(l.expired(10, usize::MAX).0.is_empty());
        assert_eq!(l.time_to_live(2, false).ttl, 1);
    }

    /// A keep-alive changes only its lease; the lease's one queue entry moves when it comes due
    /// before the lease does, and a clock restarted earlier moves it at once.
    #[test]
    fn a_renewed_lease_expires_a_full_ttl_after_its_last_renewal_with_one_queue_entry() {
        let (mut l, clock) = lessor();
        l.grant(1, 10).unwrap();
        let entry = |l: &Lessor| l.by_expiry.keys().copied().collect::<Vec<_>>();
        let first = entry(&l);
        for _ in 0..3 {
            clock.advance(Duration::from_secs(4));
            l.renew(1).unwrap();
            assert_eq!(entry(&l), first, "a renewal leaves the entry where it is");
        }
        // 12 s on: the entry (at 10 s) is due, the lease (renewed at 12 s) is not.
        assert!(l.expired(10, usize::MAX).0.is_empty());
        assert_eq!(entry(&l), vec![(clock.now() + Duration::from_secs(10), 1)]);
        clock.advance(Duration::from_millis(9_999));
        assert!(l.expired(10, usize::MAX).0.is_empty(), "not a millisecond early");
        clock.advance(Duration::from_millis(1));
        assert_eq!(l.expired(10, usize::MAX), (vec![1], false));
        // A lease queued far out, then restarted from a shorter checkpoint: moved earlier.
        l.grant(2, 100).unwrap();
        l.checkpoint(2, 5);
        l.restart_clocks();
        assert_eq!(entry(&l).len(), 2, "one entry per lease");
        clock.advance(Duration::from_secs(5));
        assert_eq!(l.expired(10, usize::MAX).0, vec![2]);
        l.revoke(1).unwrap();
        l.revoke(2).unwrap();
        assert!(entry(&l).is_empty(), "a revoke takes the entry where it is queued");
    }

    #[test]
    fn expiry_is_batched() {
        let (mut l, clock) = lessor();
        for id in 1..=25 {
            l.grant(id, 5).unwrap();
        }
        clock.advance(Duration::from_secs(5));
        assert_eq!(l.expired(10, usize::MAX).0.len(), 10);
        assert_eq!(l.expired(10, usize::MAX).0.len(), 10);
        assert_eq!(l.expired(10, usize::MAX).0.len(), 5);
    }

    #[test]
    fn keys_follow_writes() {
        let (mut l, _) = lessor();
        l.grant(1, 10).unwrap();
        l.grant(2, 10).unwrap();
        let change = |key: &'static str, from, to| LeaseChange {
            key: Bytes::from(key),
            from,
            to,
        };
        l.apply_changes(&[change("a", 0, 1), change("b", 0, 1), change("c", 0, 2)]);
        l.apply_changes(&[change("b", 1, 2), change("c", 2, 0)]);
        assert_eq!(l.keys(1).unwrap(), vec![Bytes::from("a")]);
        assert_eq!(l.keys(2).unwrap(), vec![Bytes::from("b")]);
        assert_eq!(l.time_to_live(2, true).keys, vec![Bytes::from("b")]);
    }

    #[test]
    fn a_restart_resumes_from_the_checkpoint_and_never_expires_early() {
        let (mut l, clock) = lessor();
        l.grant(1, 100).unwrap();
        l.grant(2, 100).unwrap();
        clock.advance(Duration::from_secs(60));
        // Lease 1 was checkpointed with 40 s left; lease 2 never was.
        l.checkpoint(1, 40);
        l.restart_clocks();
        clock.advance(Duration::from_secs(39));
        assert!(l.expired(10, usize::MAX).0.is_empty());
        clock.advance(Duration::from_secs(1));
        assert_eq!(l.expired(10, usize::MAX), (vec![1], false));
        clock.advance(Duration::from_secs(59));
        assert_eq!(
            l.expired(10, usize::MAX).0,
            Vec::<i64>::new(),
            "lease 2 gets its full TTL again"
        );
        clock.advance(Duration::from_secs(1));
        assert_eq!(l.expired(10, usize::MAX).0, vec![2]);
    }
}
