//! The requests a client sends, timed, and the loop that sends them.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Conn;
use bytes::Bytes;
use cairn_server::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::lease_client::LeaseClient;
use cairn_server::pb::etcdserverpb::request_op::Request;
use cairn_server::pb::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use tonic::Status;

use crate::drive::*;
use crate::keys::*;
use crate::*;

/// The request a requester sends, by workload.
#[derive(Debug)]
pub(crate) enum Op {
    /// A put; with `stamp`, the value carries the send time.
    Put {
        keys: Keys,
        value: Bytes,
        stamp: Option<Instant>,
    },
    /// A read of one key, or of the whole prefix (`paged`: a page of it, see [`Page`]).
    Range {
        keys: Keys,
        whole_prefix: bool,
        paged: bool,
        limit: i64,
        keys_only: bool,
        count_only: bool,
        serializable: bool,
    },
    TxnPut {
        keys: Keys,
        value: Bytes,
        compare: TxnCompare,
    },
    /// Deletes key `i` (keys are sequential).
    Delete { keys: Keys },
    /// Grants a lease; its ID goes into `granted`.
    Grant { ttl: i64, granted: Arc<Mutex<Vec<i64>>> },
    /// Puts key `i`, attached to lease `i / per_lease`.
    Attach {
        prefix: String,
        leases: Vec<i64>,
        per_lease: u64,
        value: Bytes,
    },
    /// Revokes lease `i`.
    Revoke { leases: Vec<i64> },
}

/// One client: its connection's stubs and what it sends.
#[derive(Debug)]
pub(crate) struct Requester {
    pub(crate) kv: KvClient<Conn>,
    pub(crate) lease: LeaseClient<Conn>,
    pub(crate) op: Arc<Op>,
    pub(crate) rng: StdRng,
    pub(crate) timeout: Duration,
    /// Where a paged list goes on; `None` before its first page.
    pub(crate) page: Option<Page>,
}

/// The next page of a list: it starts at `from` and reads at `revision`, the first page's.
#[derive(Debug)]
pub(crate) struct Page {
    from: Bytes,
    revision: i64,
}

impl Requester {
    /// Sends request `i` and waits for the answer; `Ok` carries what the workload counts
    /// (keys read or counted, txns succeeded, keys deleted).
    pub(crate) async fn call(&mut self, i: u64) -> Result<u64, Status> {
        let op = Arc::clone(&self.op);
        let t = self.timeout;
        match &*op {
            Op::Put { keys, value, stamp } => {
                let value = stamp.map_or_else(|| value.clone(), |epoch| stamped(value, epoch));
                let request = PutRequest {
                    key: keys.pick(i, &mut self.rng),
                    value,
                    ..PutRequest::default()
                };
                timed(t, self.kv.put(request)).await.map(|_| 0)
            }
            Op::Range {
                keys,
                whole_prefix,
                paged,
                limit,
                keys_only,
                count_only,
                serializable,
            } => {
                let (key, range_end) = if *whole_prefix {
                    let prefix = keys.prefix.as_bytes();
                    (Bytes::copy_from_slice(prefix), prefix_end(prefix))
                } else {
                    (keys.pick(i, &mut self.rng), Bytes::new())
                };
                let page = self.page.take();
                let request = RangeRequest {
                    key: page.as_ref().map_or(key, |p| p.from.clone()),
                    range_end,
                    limit: *limit,
                    revision: page.as_ref().map_or(0, |p| p.revision),
                    keys_only: *keys_only,
                    count_only: *count_only,
                    serializable: *serializable,
                    ..RangeRequest::default()
                };
                let r = timed(t, self.kv.range(request)).await?;
                if *paged && r.more {
                    // The next page starts just after this one's last key.
                    let last = r.kvs.last().map(|kv| kv.key.clone()).unwrap_or_default();
                    let revision = match page {
                        Some(p) => p.revision,
                        None => r.header.map_or(0, |h| h.revision),
                    };
                    let from = Bytes::from([&last[..], b"\0"].concat());
                    self.page = Some(Page { from, revision });
                }
                // A count's answer is its count; a read's, the keys it returned.
                Ok(if *count_only {
                    r.count.unsigned_abs()
                } else {
                    r.kvs.len() as u64
                })
            }
            Op::TxnPut { keys, value, compare } => {
                let key = keys.pick(i, &mut self.rng);
                let result = match compare {
                    TxnCompare::Absent => CompareResult::Equal,
                    TxnCompare::Present => CompareResult::Greater,
                };
                let request = TxnRequest {
                    compare: vec![Compare {
                        result: result as i32,
                        target: CompareTarget::Mod as i32,
                        key: key.clone(),
                        target_union: Some(TargetUnion::ModRevision(0)),
                        ..Compare::default()
                    }],
                    success: vec![RequestOp {
                        request: Some(Request::RequestPut(PutRequest {
                            key,
                            value: value.clone(),
                            ..PutRequest::default()
                        })),
                    }],
                    failure: Vec::new(),
                };
                timed(t, self.kv.txn(request)).await.map(|r| u64::from(r.succeeded))
            }
            Op::Delete { keys } => {
                let request = DeleteRangeRequest {
                    key: keys.pick(i, &mut self.rng),
                    ..DeleteRangeRequest::default()
                };
                timed(t, self.kv.delete_range(request))
                    .await
                    .map(|r| r.deleted.max(0).unsigned_abs())
            }
            Op::Grant { ttl, granted } => {
                let r = timed(t, self.lease.lease_grant(LeaseGrantRequest { ttl: *ttl, id: 0 })).await?;
                if !r.error.is_empty() {
                    return Err(Status::unknown(r.error));
                }
                granted.lock().push(r.id);
                Ok(0)
            }
            Op::Attach {
                prefix,
                leases,
                per_lease,
                value,
            } => {
                let n = i / per_lease;
                let lease = usize::try_from(n)
                    .ok()
                    .and_then(|n| leases.get(n))
                    .copied()
                    .ok_or_else(|| Status::internal(format!("no lease number {n}")))?;
                let request = PutRequest {
                    key: Bytes::from(format!("{prefix}{n:012}/{:08}", i % per_lease)),
                    value: value.clone(),
                    lease,
                    ..PutRequest::default()
                };
                timed(t, self.kv.put(request)).await.map(|_| 0)
            }
            Op::Revoke { leases } => {
                let id = usize::try_from(i)
                    .ok()
                    .and_then(|i| leases.get(i))
                    .copied()
                    .ok_or_else(|| Status::internal(format!("no lease number {i}")))?;
                timed(t, self.lease.lease_revoke(LeaseRevokeRequest { id }))
                    .await
                    .map(|_| 0)
            }
        }
    }
}

/// Waits for `call`'s answer at most `timeout`.
pub(crate) async fn timed<T>(
    timeout: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(timeout, call).await {
        Ok(answer) => answer.map(tonic::Response::into_inner),
        Err(_) => Err(deadline(timeout)),
    }
}

pub(crate) fn deadline(timeout: Duration) -> Status {
    Status::deadline_exceeded(format!("no answer within {timeout:?} (client-side timeout)"))
}

/// A requester's loop: sends the run's requests one at a time until it ends.
pub(crate) async fn request_loop(mut r: Requester, run: Arc<Run>, mut tally: Tally) -> Tally {
    while let Some(i) = run.next().await {
        let started = Instant::now();
        let outcome = r.call(i).await;
        tally.answered(run.origin(), started.elapsed(), outcome);
        run.done();
    }
    tally
}
