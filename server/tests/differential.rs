//! Differential test: one deterministic script of several hundred KV, txn, compaction and lease
//! operations (errors included) goes to cairn and to a real etcd 3.4 (Debian's `etcd-server`,
//! `/usr/bin/etcd`), and the answers must be identical apart from cluster and member ids and raft
//! terms: same revisions, versions, counts, errors and watch events.
//!
//! The script is generated from a seeded PRNG, with fixed edge cases spread through it; where a
//! request depends on the store's state (a past revision, a live lease), it is derived from
//! etcd's earlier answers, so both servers get byte-for-byte the same requests. On the first
//! difference the test fails with the operation's index, the request and both answers.
//!
//! What is not compared as it is: `cluster_id`, `member_id` and `raft_term` in every header
//! (zeroed); a lease's remaining TTL (checked against the time since its grant instead); the
//! order of a lease's keys and of LeaseLeases (etcd's come from a Go map, and by expiry);
//! `cancel_reason` of a watch canceled by compaction (printed). Sorts on anything but the key
//! are only asked of at most 12 keys: beyond, etcd's order among ties is Go's sort algorithm's.
//!
//! Environment: `CAIRN_DIFF_KEEP_GOING=1` runs to the end and reports every difference (later
//! ones often follow from earlier ones); `CAIRN_DIFF_TRACE=1` prints each comparison's outcome
//! and each lease's TTLs; `CAIRN_DIFF_SEED=<n>` runs another script.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

#[path = "common/process.rs"]
mod process;

use std::collections::HashMap;
use std::fmt::Debug;
use std::path::Path;
use std::time::{Duration, Instant};

use cairn_server::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::lease_client::LeaseClient;
use cairn_server::pb::etcdserverpb::range_request;
use cairn_server::pb::etcdserverpb::request_op::Request;
use cairn_server::pb::etcdserverpb::response_op::Response;
use cairn_server::pb::etcdserverpb::watch_client::WatchClient;
use cairn_server::pb::etcdserverpb::watch_request::RequestUnion;
use cairn_server::pb::etcdserverpb::{
    CompactionRequest, CompactionResponse, Compare, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest,
    LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseLeasesRequest, LeaseLeasesResponse,
    LeaseRevokeRequest, LeaseRevokeResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, PutRequest, PutResponse,
    RangeRequest, RangeResponse, RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse, WatchCancelRequest,
    WatchCreateRequest, WatchProgressRequest, WatchRequest, WatchResponse,
};
use process::Server;
use prost::bytes::Bytes;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

/// Debian's etcd 3.4, which `tests/run-all.sh` installs.
const ETCD: &str = "/usr/bin/etcd";
/// How many random operations the script has (the fixed edge cases come on top).
const RANDOM_OPS: usize = 420;
/// The PRNG's seed: change it to explore another script.
const SEED: u64 = 0x00ca_1a4e_d1ff_2024;
/// The watched prefix.
const WATCH_PREFIX: &str = "k/";
const WATCH_PREFIX_END: &str = "k0";

// ---------------------------------------------------------------------------------------------
// Requests, answers and their normalization.

fn b(s: impl AsRef<[u8]>) -> Bytes {
    Bytes::copy_from_slice(s.as_ref())
}

fn range(key: Bytes, range_end: Bytes) -> RangeRequest {
    RangeRequest {
        key,
        range_end,
        ..Default::default()
    }
}

fn put(key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> PutRequest {
    PutRequest {
        key: b(key),
        value: b(value),
        ..Default::default()
    }
}

fn delete(key: impl AsRef<[u8]>, range_end: impl AsRef<[u8]>, prev_kv: bool) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key: b(key),
        range_end: b(range_end),
        prev_kv,
    }
}

fn op_put(p: PutRequest) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(p)),
    }
}

fn op_range(r: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestRange(r)),
    }
}

fn op_delete(d: DeleteRangeRequest) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestDeleteRange(d)),
    }
}

fn op_txn(t: TxnRequest) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestTxn(t)),
    }
}

/// A compare of `key` (to `range_end`) with `union`, on the target the union is a value of.
fn compare(key: &str, range_end: &str, result: CompareResult, union: TargetUnion) -> Compare {
    let target = match union {
        TargetUnion::Version(_) => CompareTarget::Version,
        TargetUnion::CreateRevision(_) => CompareTarget::Create,
        TargetUnion::ModRevision(_) => CompareTarget::Mod,
        TargetUnion::Value(_) => CompareTarget::Value,
        TargetUnion::Lease(_) => CompareTarget::Lease,
    };
    Compare {
        result: result as i32,
        target: target as i32,
        key: b(key),
        range_end: b(range_end),
        target_union: Some(union),
    }
}

/// One operation of the script.
#[derive(Clone, Debug)]
enum Op {
    Put(PutRequest),
    Range(RangeRequest),
    Delete(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact(CompactionRequest),
    Grant(LeaseGrantRequest),
    Revoke(LeaseRevokeRequest),
    TimeToLive(LeaseTimeToLiveRequest),
    Leases,
}

impl Op {
    fn kind(&self) -> &'static str {
        match self {
            Op::Put(_) => "Put",
            Op::Range(_) => "Range",
            Op::Delete(_) => "DeleteRange",
            Op::Txn(_) => "Txn",
            Op::Compact(_) => "Compact",
            Op::Grant(_) => "LeaseGrant",
            Op::Revoke(_) => "LeaseRevoke",
            Op::TimeToLive(_) => "LeaseTimeToLive",
            Op::Leases => "LeaseLeases",
        }
    }
}

/// One answer, normalized.
#[derive(Clone, Debug, PartialEq)]
enum Reply {
    Put(PutResponse),
    Range(RangeResponse),
    Delete(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact(CompactionResponse),
    Grant(LeaseGrantResponse),
    Revoke(LeaseRevokeResponse),
    TimeToLive(LeaseTimeToLiveResponse),
    Leases(LeaseLeasesResponse),
    Error { code: tonic::Code, message: String },
    NoAnswerWithin5s,
}

impl Reply {
    fn revision(&self) -> Option<i64> {
        let header = match self {
            Reply::Put(r) => &r.header,
            Reply::Range(r) => &r.header,
            Reply::Delete(r) => &r.header,
            Reply::Txn(r) => &r.header,
            Reply::Compact(r) => &r.header,
            Reply::Grant(r) => &r.header,
            Reply::Revoke(r) => &r.header,
            Reply::TimeToLive(r) => &r.header,
            Reply::Leases(r) => &r.header,
            Reply::Error { .. } | Reply::NoAnswerWithin5s => return None,
        };
        header.as_ref().map(|h| h.revision)
    }

    fn is_ok(&self) -> bool {
        !matches!(self, Reply::Error { .. } | Reply::NoAnswerWithin5s)
    }
}

/// Zeroes what legitimately differs between two clusters: the cluster and member ids and the
/// raft term.
fn norm_header(header: &mut Option<ResponseHeader>) {
    if let Some(h) = header {
        h.cluster_id = 0;
        h.member_id = 0;
        h.raft_term = 0;
    }
}

fn norm_txn(t: &mut TxnResponse) {
    norm_header(&mut t.header);
    for ResponseOp { response } in &mut t.responses {
        match response {
            Some(Response::ResponseRange(r)) => norm_header(&mut r.header),
            Some(Response::ResponsePut(r)) => norm_header(&mut r.header),
            Some(Response::ResponseDeleteRange(r)) => norm_header(&mut r.header),
            Some(Response::ResponseTxn(r)) => norm_txn(r),
            None => {}
        }
    }
}

fn normalize(reply: &mut Reply) {
    match reply {
        Reply::Put(r) => norm_header(&mut r.header),
        Reply::Range(r) => norm_header(&mut r.header),
        Reply::Delete(r) => norm_header(&mut r.header),
        Reply::Txn(r) => norm_txn(r),
        Reply::Compact(r) => norm_header(&mut r.header),
        Reply::Grant(r) => norm_header(&mut r.header),
        Reply::Revoke(r) => norm_header(&mut r.header),
        Reply::TimeToLive(r) => {
            norm_header(&mut r.header);
            // etcd lists a lease's keys from a Go map: in no particular order.
            r.keys.sort();
        }
        Reply::Leases(r) => {
            norm_header(&mut r.header);
            // etcd 3.4 lists leases by expiry time, which only differs from ID order by timing.
            r.leases.sort_by_key(|l| l.id);
        }
        Reply::Error { .. } | Reply::NoAnswerWithin5s => {}
    }
}

/// The clients of one server.
#[derive(Clone)]
struct Clients {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    channel: Channel,
}

impl Clients {
    fn new(channel: Channel) -> Clients {
        Clients {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            channel,
        }
    }

    async fn run(&mut self, op: &Op) -> Reply {
        fn done<T>(r: Result<tonic::Response<T>, tonic::Status>, f: impl FnOnce(T) -> Reply) -> Reply {
            match r {
                Ok(resp) => f(resp.into_inner()),
                Err(status) => Reply::Error {
                    code: status.code(),
                    message: status.message().to_owned(),
                },
            }
        }
        let call = async {
            match op.clone() {
                Op::Put(r) => done(self.kv.put(r).await, Reply::Put),
                Op::Range(r) => done(self.kv.range(r).await, Reply::Range),
                Op::Delete(r) => done(self.kv.delete_range(r).await, Reply::Delete),
                Op::Txn(r) => done(self.kv.txn(r).await, Reply::Txn),
                Op::Compact(r) => done(self.kv.compact(r).await, Reply::Compact),
                Op::Grant(r) => done(self.lease.lease_grant(r).await, Reply::Grant),
                Op::Revoke(r) => done(self.lease.lease_revoke(r).await, Reply::Revoke),
                Op::TimeToLive(r) => done(self.lease.lease_time_to_live(r).await, Reply::TimeToLive),
                Op::Leases => done(self.lease.lease_leases(LeaseLeasesRequest {}).await, Reply::Leases),
            }
        };
        let mut reply = tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .unwrap_or(Reply::NoAnswerWithin5s);
        normalize(&mut reply);
        keys_only_without_lease(op, &mut reply);
        reply
    }
}

/// etcd 3.7 answers a keys-only range from its index alone, without the lease (unless it
/// sorts by value), and cairn answers as 3.7 does; etcd 3.4 still reads the lease. The one
/// answer where the two versions differ: compared without the lease.
fn keys_only_without_lease(op: &Op, reply: &mut Reply) {
    fn range(request: &RangeRequest, response: &mut RangeResponse) {
        if request.keys_only && request.sort_target != range_request::SortTarget::Value as i32 {
            response.kvs.iter_mut().for_each(|kv| kv.lease = 0);
        }
    }
    fn txn(request: &TxnRequest, response: &mut TxnResponse) {
        let ops = if response.succeeded {
            &request.success
        } else {
            &request.failure
        };
        for (op, answer) in ops.iter().zip(&mut response.responses) {
            match (&op.request, &mut answer.response) {
                (Some(Request::RequestRange(q)), Some(Response::ResponseRange(a))) => range(q, a),
                (Some(Request::RequestTxn(q)), Some(Response::ResponseTxn(a))) => txn(q, a),
                _ => {}
            }
        }
    }
    match (op, reply) {
        (Op::Range(q), Reply::Range(a)) => range(q, a),
        (Op::Txn(q), Reply::Txn(a)) => txn(q, a),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// The script.

/// xorshift64*: small, deterministic, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn index(&mut self, n: usize) -> usize {
        usize::try_from(self.below(u64::try_from(n).unwrap())).unwrap()
    }

    /// True with probability `percent`%.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        lo + i64::try_from(self.below(u64::try_from(hi - lo + 1).unwrap())).unwrap()
    }
}

/// What the script knows of the store, as etcd reported it.
#[derive(Debug, Default)]
struct State {
    rev: i64,
    compacted: i64,
    leases: Vec<i64>,
    revoked: Vec<i64>,
    next_lease: i64,
    values: u64,
    /// When each lease was granted (its grant answered), for its remaining TTL.
    granted_at: HashMap<i64, Instant>,
}

impl State {
    fn value(&mut self) -> String {
        self.values += 1;
        format!("v{}", self.values)
    }

    /// Learns from etcd's answer to `op`.
    fn learn(&mut self, op: &Op, reply: &Reply) {
        if let Some(rev) = reply.revision() {
            self.rev = rev;
        }
        if !reply.is_ok() {
            return;
        }
        match op {
            Op::Compact(c) => self.compacted = c.revision,
            Op::Grant(g) => {
                self.leases.push(g.id);
                self.granted_at.insert(g.id, Instant::now());
            }
            Op::Revoke(r) => {
                self.leases.retain(|&id| id != r.id);
                self.revoked.push(r.id);
            }
            _ => {}
        }
    }
}

fn random_key(rng: &mut Rng) -> String {
    if rng.chance(85) {
        format!("k/{:02}", rng.below(12))
    } else {
        format!("o/{}", rng.below(4))
    }
}

fn random_lease(rng: &mut Rng, st: &State) -> i64 {
    if !st.leases.is_empty() && rng.chance(85) {
        st.leases[rng.index(st.leases.len())]
    } else if !st.revoked.is_empty() && rng.chance(50) {
        st.revoked[rng.index(st.revoked.len())]
    } else {
        999
    }
}

/// A revision to read at: mostly retained history, sometimes compacted away or in the future.
fn random_revision(rng: &mut Rng, st: &State) -> i64 {
    match rng.below(10) {
        0 => 0,
        1 if st.compacted > 1 => rng.between(1, st.compacted - 1),
        2 => st.rev + rng.between(1, 3),
        3 => st.compacted.max(1),
        _ => rng.between(st.compacted.max(1), st.rev),
    }
}

fn random_put(rng: &mut Rng, st: &mut State) -> PutRequest {
    let mut p = put(random_key(rng), st.value());
    p.prev_kv = rng.chance(50);
    match rng.below(20) {
        0..=4 => p.lease = random_lease(rng, st),
        5 | 6 => {
            p.ignore_value = true;
            if rng.chance(80) {
                p.value = Bytes::new();
            }
        }
        7 | 8 => {
            p.ignore_lease = true;
            if rng.chance(20) {
                p.lease = random_lease(rng, st);
            }
        }
        9 if rng.chance(20) => p.key = Bytes::new(),
        _ => {}
    }
    p
}

fn random_range(rng: &mut Rng, st: &State) -> RangeRequest {
    let mut r = match rng.below(6) {
        0 | 1 => range(b(random_key(rng)), b("")),
        2 | 3 => range(b(WATCH_PREFIX), b(WATCH_PREFIX_END)),
        4 => range(b("\0"), b("\0")),
        _ => range(b(random_key(rng)), b("\0")),
    };
    if rng.chance(40) {
        r.limit = rng.between(0, 5);
    }
    if rng.chance(40) {
        r.revision = random_revision(rng, st);
    }
    if rng.chance(40) {
        r.sort_order = i32::try_from(rng.below(3)).unwrap();
        r.sort_target = i32::try_from(rng.below(5)).unwrap();
        if r.sort_target != 0 {
            // Sorting on anything but the key has ties. etcd 3.4 (Go's sort.Sort) breaks them
            // deterministically only for up to 12 keys (insertion sort, stable); beyond, their
            // order is the sort algorithm's (it differs between Go releases). So: at most 12.
            r.key = b(WATCH_PREFIX);
            r.range_end = b(WATCH_PREFIX_END);
        }
    }
    r.serializable = rng.chance(10);
    r.keys_only = rng.chance(15);
    r.count_only = rng.chance(15);
    if rng.chance(15) {
        r.min_mod_revision = rng.between(0, st.rev);
    }
    if rng.chance(15) {
        r.max_mod_revision = rng.between(0, st.rev);
    }
    if rng.chance(15) {
        r.min_create_revision = rng.between(0, st.rev);
    }
    if rng.chance(15) {
        r.max_create_revision = rng.between(0, st.rev);
    }
    r
}

fn random_delete(rng: &mut Rng) -> DeleteRangeRequest {
    let prev_kv = rng.chance(50);
    match rng.below(8) {
        0..=3 => delete(random_key(rng), "", prev_kv),
        4 => delete("k/0", "k/1", prev_kv),
        5 => delete(format!("k/{:02}", rng.below(12)), "\0", prev_kv),
        6 => delete("nothing", "", prev_kv),
        _ => delete("o/", "o0", prev_kv),
    }
}

fn random_compare(rng: &mut Rng, st: &State) -> Compare {
    let key = random_key(rng);
    let result = [
        CompareResult::Equal,
        CompareResult::Greater,
        CompareResult::Less,
        CompareResult::NotEqual,
    ][rng.index(4)];
    let union = match rng.below(5) {
        0 => TargetUnion::Version(rng.between(0, 3)),
        1 => TargetUnion::CreateRevision(rng.between(0, st.rev)),
        2 => TargetUnion::ModRevision(rng.between(0, st.rev)),
        3 => TargetUnion::Value(b(format!("v{}", st.values.saturating_sub(rng.below(20))))),
        _ => TargetUnion::Lease(if rng.chance(50) { 0 } else { random_lease(rng, st) }),
    };
    let range_end = if rng.chance(20) { "k/1" } else { "" };
    let key = if range_end.is_empty() { key } else { "k/0".to_owned() };
    compare(&key, range_end, result, union)
}

fn random_request_op(rng: &mut Rng, st: &mut State, depth: u32) -> RequestOp {
    match rng.below(if depth == 0 { 10 } else { 9 }) {
        0..=3 => {
            let mut p = put(random_key(rng), st.value());
            p.prev_kv = rng.chance(50);
            if rng.chance(15) {
                p.lease = random_lease(rng, st);
            }
            op_put(p)
        }
        4 | 5 => op_delete(random_delete(rng)),
        6..=8 => op_range(random_range(rng, st)),
        _ => op_txn(random_txn(rng, st, depth + 1)),
    }
}

fn random_txn(rng: &mut Rng, st: &mut State, depth: u32) -> TxnRequest {
    let compares = (0..rng.below(3)).map(|_| random_compare(rng, st)).collect();
    let success = (0..rng.below(4)).map(|_| random_request_op(rng, st, depth)).collect();
    let failure = (0..rng.below(3)).map(|_| random_request_op(rng, st, depth)).collect();
    TxnRequest {
        compare: compares,
        success,
        failure,
    }
}

fn random_op(rng: &mut Rng, st: &mut State) -> Op {
    match rng.below(100) {
        0..=29 => Op::Put(random_put(rng, st)),
        30..=54 => Op::Range(random_range(rng, st)),
        55..=64 => Op::Delete(random_delete(rng)),
        65..=84 => Op::Txn(random_txn(rng, st, 0)),
        85..=87 => {
            let revision = match rng.below(6) {
                0 => st.compacted,
                1 => st.rev + 1,
                _ => rng.between(st.compacted + 1, (st.compacted + 1).max(st.rev - 10)),
            };
            Op::Compact(CompactionRequest {
                revision,
                physical: rng.chance(50),
            })
        }
        88..=91 => {
            let id = if !st.leases.is_empty() && rng.chance(15) {
                st.leases[rng.index(st.leases.len())]
            } else {
                st.next_lease += 1;
                1000 + st.next_lease
            };
            Op::Grant(LeaseGrantRequest {
                ttl: [60, 90, 120][rng.index(3)],
                id,
            })
        }
        92..=94 => Op::Revoke(LeaseRevokeRequest {
            id: random_lease(rng, st),
        }),
        95..=97 => Op::TimeToLive(LeaseTimeToLiveRequest {
            id: random_lease(rng, st),
            keys: rng.chance(70),
        }),
        _ => Op::Leases,
    }
}

/// Edge cases, each built from the state at the time it runs; they are spread through the
/// random script.
/// An edge case: builds its operation from the state at the time it runs.
type Edge = Box<dyn Fn(&mut State) -> Op>;

fn edge_cases() -> Vec<Edge> {
    fn many_puts(n: usize) -> TxnRequest {
        TxnRequest {
            success: (0..n).map(|i| op_put(put(format!("t/{i:03}"), "many"))).collect(),
            ..Default::default()
        }
    }
    vec![
        Box::new(|_| Op::Put(put("", "no key"))),
        Box::new(|_| Op::Range(range(b(""), b("")))),
        Box::new(|_| Op::Delete(delete("", "", false))),
        Box::new(|_| Op::Txn(many_puts(129))),
        Box::new(|_| Op::Txn(many_puts(128))),
        Box::new(|_| {
            Op::Txn(TxnRequest {
                compare: (0..129)
                    .map(|_| compare("k/00", "", CompareResult::Greater, TargetUnion::Version(-1)))
                    .collect(),
                ..Default::default()
            })
        }),
        Box::new(|_| Op::Range(range(b("t/"), b("t0")))),
        Box::new(|_| {
            let mut r = range(b("t/"), b("t0"));
            r.count_only = true;
            r.limit = 3;
            Op::Range(r)
        }),
        Box::new(|_| Op::Delete(delete("o/", "\0", true))),
        Box::new(|st| {
            Op::Txn(TxnRequest {
                success: vec![op_put(put("k/01", st.value())), op_put(put("k/01", st.value()))],
                ..Default::default()
            })
        }),
        Box::new(|st| {
            Op::Txn(TxnRequest {
                success: vec![op_delete(delete("k/", "k0", false)), op_put(put("k/03", st.value()))],
                ..Default::default()
            })
        }),
        Box::new(|st| {
            Op::Txn(TxnRequest {
                success: vec![op_put(put("k/02", st.value())), op_range(range(b("k/02"), b("")))],
                failure: vec![op_put(put("k/02", st.value()))],
                ..Default::default()
            })
        }),
        Box::new(|st| {
            Op::Txn(TxnRequest {
                compare: vec![compare("k/01", "", CompareResult::Greater, TargetUnion::Version(0))],
                success: vec![
                    op_txn(TxnRequest {
                        compare: vec![compare(
                            "k/04",
                            "",
                            CompareResult::Equal,
                            TargetUnion::CreateRevision(0),
                        )],
                        success: vec![op_put(put("k/04", st.value())), op_range(range(b("k/"), b("k0")))],
                        failure: vec![op_delete(delete("k/04", "", true))],
                    }),
                    op_put(put("k/05", st.value())),
                ],
                failure: vec![op_range(range(b("k/01"), b("")))],
            })
        }),
        Box::new(|st| {
            Op::Txn(TxnRequest {
                success: vec![
                    op_put(put("k/06", st.value())),
                    op_txn(TxnRequest {
                        success: vec![op_put(put("k/06", st.value()))],
                        ..Default::default()
                    }),
                ],
                ..Default::default()
            })
        }),
        Box::new(|st| {
            Op::Txn(TxnRequest {
                success: vec![
                    op_put(put("k/06", st.value())),
                    op_txn(TxnRequest {
                        success: vec![op_put(put("k/07", st.value()))],
                        failure: vec![op_put(put("k/06", st.value()))],
                        ..Default::default()
                    }),
                ],
                ..Default::default()
            })
        }),
        Box::new(|st| {
            let mut r = range(b("k/01"), b(""));
            r.revision = st.rev + 1;
            Op::Txn(TxnRequest {
                success: vec![op_range(r)],
                ..Default::default()
            })
        }),
        Box::new(|st| {
            let mut r = range(b("k/01"), b(""));
            r.revision = (st.compacted - 1).max(1);
            Op::Txn(TxnRequest {
                success: vec![op_range(r), op_put(put("k/08", st.value()))],
                ..Default::default()
            })
        }),
        Box::new(|st| {
            let mut p = put("k/09", st.value());
            p.lease = 777;
            Op::Txn(TxnRequest {
                success: vec![op_put(p)],
                ..Default::default()
            })
        }),
        Box::new(|st| {
            Op::Compact(CompactionRequest {
                revision: st.rev - 3,
                physical: false,
            })
        }),
        Box::new(|st| {
            Op::Compact(CompactionRequest {
                revision: st.compacted,
                physical: false,
            })
        }),
        Box::new(|st| {
            Op::Compact(CompactionRequest {
                revision: st.compacted - 1,
                physical: true,
            })
        }),
        Box::new(|st| {
            Op::Compact(CompactionRequest {
                revision: st.rev + 1,
                physical: false,
            })
        }),
        Box::new(|_| {
            Op::Compact(CompactionRequest {
                revision: -1,
                physical: false,
            })
        }),
        Box::new(|st| {
            let mut r = range(b("k/"), b("k0"));
            r.revision = st.compacted;
            Op::Range(r)
        }),
        Box::new(|st| {
            let mut r = range(b("k/"), b("k0"));
            r.revision = st.compacted - 1;
            Op::Range(r)
        }),
        Box::new(|_| {
            let mut r = range(b("k/"), b("k0"));
            r.revision = -1;
            Op::Range(r)
        }),
        Box::new(|_| {
            let mut r = range(b("k/"), b("k0"));
            r.limit = -1;
            Op::Range(r)
        }),
        Box::new(|_| {
            let mut r = range(b("k/"), b("k0"));
            r.sort_target = 3; // MOD, order NONE
            r.limit = 4;
            Op::Range(r)
        }),
        Box::new(|_| {
            let mut r = range(b("\0"), b("\0"));
            r.sort_order = 2;
            r.limit = 3;
            r.keys_only = true;
            Op::Range(r)
        }),
        Box::new(|_| Op::Grant(LeaseGrantRequest { ttl: 1, id: 1 })),
        Box::new(|_| Op::TimeToLive(LeaseTimeToLiveRequest { id: 1, keys: true })),
        Box::new(|_| Op::Revoke(LeaseRevokeRequest { id: 1 })),
        Box::new(|_| {
            Op::Grant(LeaseGrantRequest {
                ttl: 9_000_000_001,
                id: 2,
            })
        }),
        Box::new(|_| Op::Grant(LeaseGrantRequest { ttl: 60, id: 5000 })),
        Box::new(|_| Op::Grant(LeaseGrantRequest { ttl: 60, id: 5000 })),
        Box::new(|st| {
            let mut p = put("k/07", st.value());
            p.lease = 5000;
            Op::Txn(TxnRequest {
                success: vec![
                    op_put(p.clone()),
                    op_put(PutRequest {
                        key: b("k/08"),
                        ..p.clone()
                    }),
                    op_put(PutRequest { key: b("o/1"), ..p }),
                ],
                ..Default::default()
            })
        }),
        Box::new(|st| {
            let mut p = put("k/09", st.value());
            p.lease = 5000;
            p.prev_kv = true;
            Op::Put(p)
        }),
        Box::new(|_| {
            let mut p = put("k/09", "");
            p.ignore_value = true;
            p.prev_kv = true;
            Op::Put(p)
        }),
        Box::new(|st| {
            let mut p = put("k/09", st.value());
            p.ignore_lease = true;
            p.prev_kv = true;
            Op::Put(p)
        }),
        Box::new(|_| {
            Op::Txn(TxnRequest {
                compare: vec![compare("k/07", "", CompareResult::Equal, TargetUnion::Lease(5000))],
                success: vec![op_range(range(b("k/07"), b("")))],
                ..Default::default()
            })
        }),
        Box::new(|_| Op::TimeToLive(LeaseTimeToLiveRequest { id: 5000, keys: true })),
        Box::new(|_| Op::Revoke(LeaseRevokeRequest { id: 5000 })),
        Box::new(|_| Op::Revoke(LeaseRevokeRequest { id: 5000 })),
        Box::new(|_| Op::TimeToLive(LeaseTimeToLiveRequest { id: 5000, keys: true })),
        Box::new(|_| Op::Leases),
        Box::new(|_| Op::Txn(TxnRequest::default())),
        Box::new(|_| {
            Op::Txn(TxnRequest {
                success: vec![op_range(range(b("k/"), b("k0")))],
                ..Default::default()
            })
        }),
        Box::new(|_| {
            Op::Txn(TxnRequest {
                success: vec![op_delete(delete("nothing", "", true))],
                ..Default::default()
            })
        }),
        Box::new(|_| Op::Delete(delete("nothing", "nothinh", true))),
        Box::new(|_| {
            Op::Txn(TxnRequest {
                compare: vec![compare("k/0", "k/1", CompareResult::Greater, TargetUnion::Value(b("")))],
                success: vec![op_range(range(b("k/0"), b("k/1")))],
                failure: vec![op_delete(delete("k/0", "k/1", true))],
            })
        }),
        Box::new(|_| {
            // The target and the value given disagree.
            Op::Txn(TxnRequest {
                compare: vec![Compare {
                    target: CompareTarget::Version as i32,
                    ..compare("k/02", "", CompareResult::Equal, TargetUnion::Value(b("x")))
                }],
                success: vec![op_range(range(b("k/02"), b("")))],
                ..Default::default()
            })
        }),
        Box::new(|_| {
            Op::Txn(TxnRequest {
                compare: vec![Compare {
                    target_union: None,
                    ..compare("k/02", "", CompareResult::Greater, TargetUnion::ModRevision(0))
                }],
                success: vec![op_range(range(b("k/02"), b("")))],
                ..Default::default()
            })
        }),
        Box::new(|_| Op::Range(range(b("k/05"), b("k/01")))),
        Box::new(|_| Op::Delete(delete("k/05", "k/01", true))),
        Box::new(|_| {
            // Compares over an empty range and on a missing key.
            Op::Txn(TxnRequest {
                compare: vec![
                    compare("k/05", "k/01", CompareResult::Equal, TargetUnion::Version(0)),
                    compare("missing", "", CompareResult::Equal, TargetUnion::CreateRevision(0)),
                ],
                success: vec![op_range(range(b("missing"), b("")))],
                failure: vec![op_range(range(b("k/05"), b("k/01")))],
            })
        }),
        Box::new(|_| {
            Op::Txn(TxnRequest {
                compare: vec![compare(
                    "missing",
                    "",
                    CompareResult::NotEqual,
                    TargetUnion::Value(b("x")),
                )],
                success: vec![op_range(range(b("missing"), b("")))],
                failure: vec![op_range(range(b("k/05"), b("")))],
            })
        }),
        Box::new(|st| {
            // A read of the revision before the txn, after a write in it: a key created by the
            // txn, and one it deletes.
            let mut r = range(b("\0"), b("\0"));
            r.revision = st.rev;
            let mut counted = r.clone();
            counted.count_only = true;
            Op::Txn(TxnRequest {
                success: vec![
                    op_put(put("o/9", st.value())),
                    op_delete(delete("k/00", "", false)),
                    op_range(r),
                    op_range(counted),
                ],
                ..Default::default()
            })
        }),
        Box::new(|st| Op::Put(put("o/7", st.value()))),
        Box::new(|_| Op::Delete(delete("o/7", "", false))),
        Box::new(|st| {
            // The same, for a key deleted before the revision read and written again by the txn.
            let mut r = range(b("o/"), b("o0"));
            r.revision = st.rev;
            let mut counted = r.clone();
            counted.count_only = true;
            Op::Txn(TxnRequest {
                success: vec![
                    op_put(PutRequest {
                        prev_kv: true,
                        ..put("o/7", st.value())
                    }),
                    op_range(r),
                    op_range(counted),
                ],
                ..Default::default()
            })
        }),
        Box::new(|st| {
            let mut r = range(b("o/9"), b(""));
            r.revision = st.rev + 1;
            Op::Txn(TxnRequest {
                success: vec![op_put(put("o/8", st.value())), op_range(r)],
                ..Default::default()
            })
        }),
        Box::new(|st| {
            // A put, and a delete "from" a key before it: the put's key is in the deleted range.
            Op::Txn(TxnRequest {
                success: vec![op_put(put("k/09", st.value())), op_delete(delete("k/05", "\0", true))],
                ..Default::default()
            })
        }),
        Box::new(|st| {
            // The same across two nested txns.
            Op::Txn(TxnRequest {
                success: vec![
                    op_txn(TxnRequest {
                        success: vec![op_put(put("k/10", st.value()))],
                        ..Default::default()
                    }),
                    op_txn(TxnRequest {
                        success: vec![op_delete(delete("k/08", "\0", true))],
                        ..Default::default()
                    }),
                ],
                ..Default::default()
            })
        }),
        Box::new(|_| {
            let mut r = range(b(WATCH_PREFIX), b(WATCH_PREFIX_END));
            r.sort_order = 2; // DESCEND
            r.sort_target = 1; // VERSION
            Op::Range(r)
        }),
        Box::new(|_| Op::Grant(LeaseGrantRequest { ttl: 60, id: -5 })),
        Box::new(|_| Op::Revoke(LeaseRevokeRequest { id: -5 })),
        Box::new(|_| {
            let mut p = put("nope", "");
            p.ignore_value = true;
            Op::Put(p)
        }),
        Box::new(|_| {
            let mut p = put("k/03", "x");
            p.ignore_value = true;
            Op::Put(p)
        }),
        Box::new(|_| {
            let mut p = put("k/03", "x");
            p.ignore_lease = true;
            p.lease = 5000;
            Op::Put(p)
        }),
        Box::new(|_| {
            let mut p = put("k/03", "x");
            p.lease = 424_242;
            Op::Put(p)
        }),
    ]
}

// ---------------------------------------------------------------------------------------------
// Watches.

/// A watch stream: its requests' sender and its responses' receiver.
struct WatchStream {
    requests: mpsc::UnboundedSender<WatchRequest>,
    responses: mpsc::UnboundedReceiver<WatchResponse>,
}

impl WatchStream {
    /// Opens a stream and creates a watch on it. (The create request goes first: a gRPC-Go
    /// server sends the response headers with its first message, which the call waits for.)
    async fn open(channel: Channel, create: WatchCreateRequest) -> WatchStream {
        let (req_tx, req_rx) = mpsc::unbounded_channel();
        let (resp_tx, resp_rx) = mpsc::unbounded_channel();
        req_tx
            .send(WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(create)),
            })
            .unwrap();
        let mut client = WatchClient::new(channel);
        let mut stream = tokio::time::timeout(
            Duration::from_secs(10),
            client.watch(UnboundedReceiverStream::new(req_rx)),
        )
        .await
        .expect("the Watch call did not answer within 10 s")
        .unwrap()
        .into_inner();
        tokio::spawn(async move {
            while let Ok(Some(resp)) = stream.message().await {
                if resp_tx.send(resp).is_err() {
                    break;
                }
            }
        });
        WatchStream {
            requests: req_tx,
            responses: resp_rx,
        }
    }

    /// Sends a request on the stream; false if the stream has ended.
    fn send(&self, request: WatchRequest) -> bool {
        self.requests.send(request).is_ok()
    }

    /// The next response, normalized (cluster and member ids, raft term), or None after 10 s.
    async fn next(&mut self) -> Option<WatchResponse> {
        self.next_within(Duration::from_secs(10)).await
    }

    async fn next_within(&mut self, wait: Duration) -> Option<WatchResponse> {
        let mut resp = tokio::time::timeout(wait, self.responses.recv()).await.ok()??;
        norm_header(&mut resp.header);
        Some(resp)
    }

    /// Responses up to and including the first that satisfies `last` (or all received until a
    /// 10 s silence).
    async fn until(&mut self, last: impl Fn(&WatchResponse) -> bool) -> Vec<WatchResponse> {
        let mut out = Vec::new();
        while let Some(resp) = self.next().await {
            let done = last(&resp);
            out.push(resp);
            if done {
                break;
            }
        }
        out
    }
}

/// Sends keep-alives for `ids` on one stream; the normalized answers (or the error).
async fn keep_alive(channel: Channel, ids: &[i64]) -> Result<Vec<LeaseKeepAliveResponse>, (tonic::Code, String)> {
    let (tx, rx) = mpsc::unbounded_channel();
    for &id in ids {
        tx.send(LeaseKeepAliveRequest { id }).unwrap();
    }
    let mut client = LeaseClient::new(channel);
    let call = tokio::time::timeout(
        Duration::from_secs(10),
        client.lease_keep_alive(UnboundedReceiverStream::new(rx)),
    );
    let mut stream = match call.await.expect("LeaseKeepAlive did not answer within 10 s") {
        Ok(stream) => stream.into_inner(),
        Err(status) => return Err((status.code(), status.message().to_owned())),
    };
    let mut out = Vec::new();
    for _ in ids {
        match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
            Ok(Ok(Some(mut resp))) => {
                norm_header(&mut resp.header);
                out.push(resp);
            }
            Ok(Err(status)) => return Err((status.code(), status.message().to_owned())),
            Ok(Ok(None)) | Err(_) => break,
        }
    }
    drop(tx);
    Ok(out)
}

fn has_event(resp: &WatchResponse, key: &str, value: &str) -> bool {
    resp.events.iter().any(|e| {
        e.kv.as_ref()
            .is_some_and(|kv| kv.key == key.as_bytes() && kv.value == value.as_bytes())
    })
}

// ---------------------------------------------------------------------------------------------
// The comparison.

/// A difference between etcd's answer and cairn's.
struct Difference {
    index: String,
    request: String,
    etcd: String,
    cairn: String,
}

fn clip(s: String) -> String {
    const MAX: usize = 30000;
    if s.len() <= MAX {
        return s;
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes more)", &s[..end], s.len() - end)
}

struct Report {
    keep_going: bool,
    trace: bool,
    compared: usize,
    matched: usize,
    differences: Vec<Difference>,
    notes: Vec<String>,
}

impl Report {
    /// Records one comparison; without `CAIRN_DIFF_KEEP_GOING`, fails on the first difference.
    fn check<T: PartialEq + Debug>(&mut self, index: String, request: &dyn Debug, etcd: &T, cairn: &T) {
        self.compared += 1;
        if self.trace {
            eprintln!("{index}: {}", if etcd == cairn { "same" } else { "DIFFERENT" });
        }
        if etcd == cairn {
            self.matched += 1;
            return;
        }
        self.differences.push(Difference {
            index,
            request: clip(format!("{request:#?}")),
            etcd: clip(format!("{etcd:#?}")),
            cairn: clip(format!("{cairn:#?}")),
        });
        if !self.keep_going {
            self.finish();
        }
    }

    /// Compares two watches' responses one by one. The same events grouped differently into
    /// responses match if no revision's events are split between two responses: how many
    /// revisions a response carries depends on timing on both servers (a watcher that falls
    /// behind catches up several revisions at once, in etcd as in cairn).
    fn check_watch(&mut self, what: &str, request: &WatchCreateRequest, e: &[WatchResponse], c: &[WatchResponse]) {
        if e == c {
            self.check(what.to_owned(), request, &e, &c);
            return;
        }
        let flat = |rs: &[WatchResponse]| rs.iter().flat_map(|r| r.events.clone()).collect::<Vec<_>>();
        let revision = |ev: &cairn_server::pb::mvccpb::Event| ev.kv.as_ref().map_or(0, |kv| kv.mod_revision);
        // The revisions each response ends and starts with: a split revision ends one response
        // and starts the next.
        let splits = |rs: &[WatchResponse]| {
            let bounds: Vec<(i64, i64)> = rs
                .iter()
                .filter_map(|r| Some((revision(r.events.first()?), revision(r.events.last()?))))
                .collect();
            bounds.windows(2).filter(|w| w[0].1 == w[1].0).count()
        };
        if flat(e) == flat(c) {
            self.notes
                .push(format!("{what}: same events, grouped differently into responses"));
            self.check(
                format!("{what}: revisions split between responses"),
                request,
                &splits(e),
                &splits(c),
            );
            return;
        }
        for (i, (er, cr)) in e.iter().zip(c).enumerate() {
            if er != cr {
                self.check(format!("{what}, response #{i}"), request, er, cr);
                return;
            }
        }
        self.check(format!("{what}: number of responses"), request, &e.len(), &c.len());
    }

    fn summary(&self) -> String {
        format!(
            "differential: {} of {} comparisons matched etcd 3.4 ({} differences)",
            self.matched,
            self.compared,
            self.differences.len()
        )
    }

    fn finish(&self) {
        println!("{}", self.summary());
        for note in &self.notes {
            println!("note: {note}");
        }
        if self.differences.is_empty() {
            return;
        }
        // In full (the first ones: later ones often follow from them), then by index only.
        const IN_FULL: usize = 25;
        let mut text = String::new();
        for d in self.differences.iter().take(IN_FULL) {
            text.push_str(&format!(
                "\n=== difference at {}\n--- request:\n{}\n--- etcd 3.4:\n{}\n--- cairn:\n{}\n",
                d.index, d.request, d.etcd, d.cairn
            ));
        }
        for d in self.differences.iter().skip(IN_FULL) {
            text.push_str(&format!("\n=== difference at {} (not shown)", d.index));
        }
        panic!("{}{text}", self.summary());
    }
}

/// The remaining TTL depends on the wall clock: it is checked against the time since the
/// grant (etcd truncates to whole seconds) and, if plausible, replaced by the granted TTL, so
/// that only an implausible one shows as a difference.
fn check_ttl(reply: &mut Reply, st: &State) {
    let Reply::TimeToLive(r) = reply else { return };
    let Some(granted_at) = st.granted_at.get(&r.id) else {
        return;
    };
    if r.granted_ttl <= 0 || r.ttl < 0 {
        return;
    }
    #[allow(clippy::cast_precision_loss)]
    let expected = r.granted_ttl as f64 - granted_at.elapsed().as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let ttl = r.ttl as f64;
    if ttl >= expected - 2.0 && ttl <= expected + 1.0 {
        r.ttl = r.granted_ttl;
    }
}

/// The clients of both servers the script runs on.
struct Servers {
    etcd: Clients,
    cairn: Clients,
}

impl Servers {
    /// Runs one operation on both servers, compares the answers and learns from etcd's.
    async fn step(&mut self, report: &mut Report, st: &mut State, index: &mut usize, op: &Op) {
        let (mut er, mut cr) = tokio::join!(self.etcd.run(op), self.cairn.run(op));
        if let (Reply::TimeToLive(et), Reply::TimeToLive(ct)) = (&er, &cr) {
            if report.trace {
                let since = st.granted_at.get(&et.id).map(|t| t.elapsed().as_secs_f64());
                eprintln!(
                    "lease {}: {since:?} s since granted: TTL etcd {}, cairn {} (granted {})",
                    et.id, et.ttl, ct.ttl, et.granted_ttl
                );
            }
        }
        check_ttl(&mut er, st);
        check_ttl(&mut cr, st);
        report.check(format!("op #{index} ({})", op.kind()), op, &er, &cr);
        st.learn(op, &er);
        *index += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cairn_answers_a_script_exactly_as_etcd_3_4() {
    let etcd_bin = Path::new(ETCD);
    assert!(
        etcd_bin.exists(),
        "{ETCD} is missing: the differential test needs Debian's etcd-server 3.4; run tests/run-all.sh, which installs it"
    );
    let started = Instant::now();
    let mut etcd = Server::start("etcd", etcd_bin, &[]);
    let mut cairn = Server::start("cairn", Path::new(env!("CARGO_BIN_EXE_cairn")), &[]);
    let (etcd_channel, cairn_channel) = tokio::join!(etcd.ready(), cairn.ready());
    let mut servers = Servers {
        etcd: Clients::new(etcd_channel),
        cairn: Clients::new(cairn_channel),
    };
    let mut report = Report {
        keep_going: std::env::var_os("CAIRN_DIFF_KEEP_GOING").is_some(),
        trace: std::env::var_os("CAIRN_DIFF_TRACE").is_some(),
        compared: 0,
        matched: 0,
        differences: Vec::new(),
        notes: Vec::new(),
    };
    let mut st = State {
        rev: 1,
        ..Default::default()
    };
    let mut index = 0usize;

    // Two writes before the watches, so that the first watch starts in the past.
    for p in [put("k/00", "init"), put("o/0", "init")] {
        servers.step(&mut report, &mut st, &mut index, &Op::Put(p)).await;
    }

    // Watch 0: the watched prefix, with previous values, from revision 2 (in the past).
    // Watch 1 (another stream): k/00..k/06 from now on, without deletes.
    let main_watch = WatchCreateRequest {
        key: b(WATCH_PREFIX),
        range_end: b(WATCH_PREFIX_END),
        start_revision: 2,
        prev_kv: true,
        ..Default::default()
    };
    let filtered_watch = WatchCreateRequest {
        key: b("k/00"),
        range_end: b("k/06"),
        filters: vec![1], // NODELETE
        ..Default::default()
    };
    let (mut ew, mut cw) = tokio::join!(
        WatchStream::open(servers.etcd.channel.clone(), main_watch.clone()),
        WatchStream::open(servers.cairn.channel.clone(), main_watch.clone())
    );
    let (mut ew2, mut cw2) = tokio::join!(
        WatchStream::open(servers.etcd.channel.clone(), filtered_watch.clone()),
        WatchStream::open(servers.cairn.channel.clone(), filtered_watch.clone())
    );
    // The created responses, and the main watch's catch-up (the put of k/00 at revision 2):
    // wait for it, so that every later event comes from a synced watcher, one response per
    // revision.
    let (er, cr) = tokio::join!(
        ew.until(|r| !r.events.is_empty() || r.canceled),
        cw.until(|r| !r.events.is_empty() || r.canceled)
    );
    report.check("watch 0 creation and catch-up".into(), &main_watch, &er, &cr);
    let (er, cr) = tokio::join!(ew2.next(), cw2.next());
    report.check("watch 1 creation".into(), &filtered_watch, &er, &cr);

    // The script: random operations with the edge cases spread among them.
    let seed = std::env::var("CAIRN_DIFF_SEED").map_or(SEED, |s| s.parse().expect("CAIRN_DIFF_SEED: a number"));
    let mut rng = Rng(seed);
    let edges = edge_cases();
    let spacing = RANDOM_OPS / (edges.len() + 1);
    let mut edges = edges.into_iter();
    for i in 0..RANDOM_OPS {
        let mut ops = vec![random_op(&mut rng, &mut st)];
        if i % spacing == spacing - 1 {
            if let Some(edge) = edges.next() {
                ops.push(edge(&mut st));
            }
        }
        for op in ops {
            servers.step(&mut report, &mut st, &mut index, &op).await;
        }
    }
    for edge in edges {
        let op = edge(&mut st);
        servers.step(&mut report, &mut st, &mut index, &op).await;
    }
    // A last compaction, so that the compacted watch below has history to miss.
    let op = Op::Compact(CompactionRequest {
        revision: st.rev - 5,
        physical: true,
    });
    servers.step(&mut report, &mut st, &mut index, &op).await;
    // The sentinel: both watches see it last.
    let op = Op::Put(put("k/00", "end"));
    servers.step(&mut report, &mut st, &mut index, &op).await;

    // Every event of the two watches, response by response.
    let (er, cr) = tokio::join!(
        ew.until(|r| has_event(r, "k/00", "end")),
        cw.until(|r| has_event(r, "k/00", "end"))
    );
    report.notes.push(format!(
        "watch 0: etcd sent {} responses ({} events), cairn {} ({} events)",
        er.len(),
        er.iter().map(|r| r.events.len()).sum::<usize>(),
        cr.len(),
        cr.iter().map(|r| r.events.len()).sum::<usize>()
    ));
    report.check_watch("watch 0 (prefix, prev_kv, from revision 2)", &main_watch, &er, &cr);
    let (er, cr) = tokio::join!(
        ew2.until(|r| has_event(r, "k/00", "end")),
        cw2.until(|r| has_event(r, "k/00", "end"))
    );
    report.check_watch("watch 1 (range, NODELETE)", &filtered_watch, &er, &cr);

    // A watch from a compacted revision: created, then canceled with the compaction's revision.
    let compacted_watch = WatchCreateRequest {
        key: b(WATCH_PREFIX),
        range_end: b(WATCH_PREFIX_END),
        start_revision: 1,
        prev_kv: true,
        ..Default::default()
    };
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(compacted_watch.clone())),
    };
    let (e_open, c_open) = (ew.send(create.clone()), cw.send(create));
    report.check(
        "watch 0's stream still open after the script".to_owned(),
        &compacted_watch,
        &e_open,
        &c_open,
    );
    let (mut er, mut cr) = tokio::join!(ew.until(|r| r.canceled), cw.until(|r| r.canceled));
    let reasons = |rs: &mut Vec<WatchResponse>| -> Vec<String> {
        rs.iter_mut().map(|r| std::mem::take(&mut r.cancel_reason)).collect()
    };
    let (e_reasons, c_reasons) = (reasons(&mut er), reasons(&mut cr));
    report.notes.push(format!(
        "compacted watch cancel_reason: etcd {e_reasons:?}, cairn {c_reasons:?} (not compared)"
    ));
    report.check(
        format!("watch 2 (from revision 1, compacted at {})", st.compacted),
        &compacted_watch,
        &er,
        &cr,
    );

    // Watch IDs chosen by the client, progress requests, cancellations.
    let create = |key: &str, watch_id: i64| WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: b(key),
            watch_id,
            ..Default::default()
        })),
    };
    let cancel = |watch_id: i64| WatchRequest {
        request_union: Some(RequestUnion::CancelRequest(WatchCancelRequest { watch_id })),
    };
    let progress = WatchRequest {
        request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
    };
    let steps: Vec<(&str, Vec<WatchRequest>)> = vec![
        ("a watch with a chosen ID", vec![create("k/01", 100)]),
        ("a watch with an ID in use", vec![create("k/02", 100)]),
        ("a watch with the next free ID", vec![create("k/02", 0)]),
        ("a progress request", vec![progress.clone()]),
        (
            "cancelling an unknown watch (then a progress request)",
            vec![cancel(555), progress],
        ),
        ("cancelling a watch", vec![cancel(100)]),
    ];
    for (what, requests) in steps {
        for request in &requests {
            ew.send(request.clone());
            cw.send(request.clone());
        }
        let (er, cr) = tokio::join!(ew.next(), cw.next());
        report.check(format!("watch stream 0: {what}"), &requests, &er, &cr);
    }
    // Nothing more may come on the stream.
    let (er, cr) = tokio::join!(
        ew.next_within(Duration::from_millis(300)),
        cw.next_within(Duration::from_millis(300))
    );
    report.check("watch stream 0: nothing more".to_owned(), &"(nothing)", &er, &cr);

    // Keep-alives: a live lease is renewed to its granted TTL; an unknown one gets TTL 0.
    let mut keep_alive_ids: Vec<i64> = st.leases.iter().copied().take(2).collect();
    keep_alive_ids.push(424_242);
    let (er, cr) = tokio::join!(
        keep_alive(servers.etcd.channel.clone(), &keep_alive_ids),
        keep_alive(servers.cairn.channel.clone(), &keep_alive_ids)
    );
    report.check("LeaseKeepAlive".to_owned(), &keep_alive_ids, &er, &cr);

    report.notes.push(format!(
        "{index} operations, final revision {}, compacted at {}, {:.1} s",
        st.rev,
        st.compacted,
        started.elapsed().as_secs_f64()
    ));
    report.finish();
}
