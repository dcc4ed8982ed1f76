//! How the k8s workload writes, the apiserver's way: each write an optimistic update (a Txn on
//! the key's MOD revision, retried with the revision read after a conflict), made by the
//! [`Apiserver`] that every writer shares, with its bound on writes in flight, its tallies and
//! its counters; and the untimed creation of the objects before the clock starts.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Conn;
use bytes::Bytes;
use cairn_benches::{Context, Failure};
use cairn_server::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::request_op::Request;
use cairn_server::pb::etcdserverpb::response_op::Response;
use cairn_server::pb::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, TxnResponse,
};
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::{BEHIND_SLACK, MAX_CONFLICT_RETRIES};
use crate::drive::*;
use crate::keys::*;
use crate::request::*;
use crate::*;

/// What a write does if the compare holds.
#[derive(Debug, Clone)]
pub(crate) enum Change {
    /// Puts the value, stamped with the send time.
    Put(Bytes),
    Delete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Lease,
    Pod,
}

/// An object a writer keeps up to date: its kind, its key, and its MOD revision as last seen
/// (0 once deleted).
#[derive(Debug, Clone)]
pub(crate) struct Object {
    pub(crate) kind: Kind,
    pub(crate) key: Bytes,
    pub(crate) rev: i64,
}

/// The apiserver's update: if `MOD(key) == rev`, the change; else read the key.
pub(crate) fn update_txn(key: &Bytes, rev: i64, change: &Change, epoch: Instant) -> TxnRequest {
    let then = match change {
        Change::Put(value) => Request::RequestPut(PutRequest {
            key: key.clone(),
            value: stamped(value, epoch),
            ..PutRequest::default()
        }),
        Change::Delete => Request::RequestDeleteRange(DeleteRangeRequest {
            key: key.clone(),
            ..DeleteRangeRequest::default()
        }),
    };
    TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Mod as i32,
            key: key.clone(),
            target_union: Some(TargetUnion::ModRevision(rev)),
            ..Compare::default()
        }],
        success: vec![RequestOp { request: Some(then) }],
        failure: vec![RequestOp {
            request: Some(Request::RequestRange(RangeRequest {
                key: key.clone(),
                ..RangeRequest::default()
            })),
        }],
    }
}

/// The revision a Txn's answer was given at.
pub(crate) fn header_revision(r: &TxnResponse) -> i64 {
    r.header.as_ref().map_or(0, |h| h.revision)
}

/// What a failed update read: the key's MOD revision, 0 if it is gone.
pub(crate) fn read_revision(r: &TxnResponse) -> i64 {
    match r.responses.first().and_then(|op| op.response.as_ref()) {
        Some(Response::ResponseRange(range)) => range.kvs.first().map_or(0, |kv| kv.mod_revision),
        _ => 0,
    }
}

/// Keys a successful update deleted.
pub(crate) fn deleted(r: &TxnResponse) -> u64 {
    match r.responses.first().and_then(|op| op.response.as_ref()) {
        Some(Response::ResponseDeleteRange(d)) => d.deleted.max(0).unsigned_abs(),
        _ => 0,
    }
}

/// Creates `objects` (key and value) with at most `max_in_flight` creates at once, untimed; their
/// MOD revisions in order (0 for those that failed) and the failures. A key already there (from
/// an earlier run) is not overwritten: its revision is read instead.
pub(crate) async fn create_all(
    b: &Bench,
    objects: &[(Bytes, Bytes)],
    max_in_flight: usize,
) -> Result<(Vec<i64>, Tally), Failure> {
    let slots = Arc::new(Semaphore::new(max_in_flight));
    let epoch = Instant::now();
    let mut tasks = JoinSet::new();
    for (i, (key, value)) in objects.iter().enumerate() {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            break;
        };
        let mut kv = KvClient::new(b.channel(i));
        let request = update_txn(key, 0, &Change::Put(value.clone()), epoch);
        let timeout = b.timeout;
        tasks.spawn(async move {
            let answer = timed(timeout, kv.txn(request)).await;
            drop(slot);
            let rev = answer.map(|r| {
                if r.succeeded {
                    header_revision(&r)
                } else {
                    read_revision(&r)
                }
            });
            (i, rev)
        });
    }
    let mut revisions = vec![0; objects.len()];
    let mut failures = Tally::new()?;
    while let Some(done) = tasks.join_next().await {
        let (i, rev) = done.context(|| "creating an object failed".to_string())?;
        match rev {
            Ok(rev) => {
                if let Some(slot) = revisions.get_mut(i) {
                    *slot = rev;
                }
            }
            Err(e) => failures.error(&e),
        }
    }
    Ok((revisions, failures))
}

/// The measured writes' tallies.
#[derive(Debug)]
pub(crate) struct Tallies {
    /// Every write: `write` = `lease` + `pod`. `hits` counts conflicts.
    pub(crate) write: Tally,
    pub(crate) lease: Tally,
    pub(crate) pod: Tally,
    /// How late the writes (first attempts) were sent after they were due.
    pub(crate) delay: Tally,
}

impl Tallies {
    pub(crate) fn new() -> Result<Tallies, Failure> {
        Ok(Tallies {
            write: Tally::new()?,
            lease: Tally::new()?,
            pod: Tally::new()?,
            delay: Tally::new()?,
        })
    }
}

/// Counters of the writers.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Writes (first attempts) sent in the measured window.
    pub(crate) sent: AtomicU64,
    /// Of those, sent more than [`BEHIND_SLACK`] late.
    pub(crate) behind: AtomicU64,
    /// Updates in the window whose compare still failed after the last retry.
    pub(crate) gave_up: AtomicU64,
    /// Changes made since the watches started: the events they owe.
    pub(crate) lease_changes: AtomicU64,
    pub(crate) pod_changes: AtomicU64,
}

/// What every writer of a run shares: the connections, the bound on writes in flight, the
/// schedule's times, and the outcomes.
#[derive(Debug)]
pub(crate) struct Apiserver {
    /// Invariant: not empty.
    pub(crate) channels: Vec<Conn>,
    pub(crate) next_channel: AtomicUsize,
    pub(crate) in_flight: Semaphore,
    pub(crate) timeout: Duration,
    /// The schedule's start; values carry their send time as nanoseconds since then.
    pub(crate) epoch: Instant,
    /// Writes sent from here until `deadline` are measured. Invariant: `epoch <= measured_from <= deadline`.
    pub(crate) measured_from: Instant,
    /// No write is due from here on.
    pub(crate) deadline: Instant,
    /// Lock order: taken alone, never across an await.
    pub(crate) tallies: Mutex<Tallies>,
    pub(crate) counts: Counts,
    /// A Lease object, the same for every node (the stamp makes each write differ).
    pub(crate) lease_value: Bytes,
    /// For the progress bar.
    pub(crate) run: Arc<Run>,
}

impl Apiserver {
    pub(crate) fn kv(&self) -> KvClient<Conn> {
        let i = self.next_channel.fetch_add(1, Ordering::Relaxed);
        KvClient::new(self.channels[i % self.channels.len()].clone())
    }

    pub(crate) fn measures(&self, sent: Instant) -> bool {
        self.measured_from <= sent && sent < self.deadline
    }

    /// Writes `change` to `object`, due at `due`, if its MOD revision is still `object.rev`;
    /// after a conflict, again with the revision read (as the apiserver's GuaranteedUpdate
    /// does). Leaves in `object.rev` the key's MOD revision as last seen (0 once deleted).
    pub(crate) async fn update(&self, object: &mut Object, change: &Change, due: Instant) {
        for attempt in 0..=MAX_CONFLICT_RETRIES {
            let Ok(slot) = self.in_flight.acquire().await else {
                return;
            };
            let sent = Instant::now();
            let measured = self.measures(sent);
            if measured && attempt == 0 {
                let delay = sent.saturating_duration_since(due);
                self.counts.sent.fetch_add(1, Ordering::Relaxed);
                if delay > BEHIND_SLACK {
                    self.counts.behind.fetch_add(1, Ordering::Relaxed);
                }
                self.tallies.lock().delay.record(delay, Ok(0));
            }
            let answer = timed(
                self.timeout,
                self.kv().txn(update_txn(&object.key, object.rev, change, self.epoch)),
            )
            .await;
            drop(slot);
            let took = sent.elapsed();
            self.run.done();
            let (outcome, settled) = match answer {
                Ok(r) if r.succeeded => {
                    let changes = match change {
                        Change::Put(_) => {
                            object.rev = header_revision(&r);
                            1
                        }
                        Change::Delete => {
                            object.rev = 0;
                            deleted(&r)
                        }
                    };
                    let counter = match object.kind {
                        Kind::Lease => &self.counts.lease_changes,
                        Kind::Pod => &self.counts.pod_changes,
                    };
                    counter.fetch_add(changes, Ordering::SeqCst);
                    (Ok(0), true)
                }
                Ok(r) => {
                    object.rev = read_revision(&r);
                    (Ok(1), false)
                }
                Err(e) => (Err(e), true),
            };
            if measured {
                let mut t = self.tallies.lock();
                match &outcome {
                    Ok(hits) => t.write.answered(self.run.origin(), took, Ok(*hits)),
                    Err(e) => t.write.error(e),
                }
                match object.kind {
                    Kind::Lease => t.lease.record(took, outcome),
                    Kind::Pod => t.pod.record(took, outcome),
                }
            }
            if settled {
                return;
            }
        }
        if self.measures(Instant::now()) {
            self.counts.gave_up.fetch_add(1, Ordering::Relaxed);
        }
    }
}
