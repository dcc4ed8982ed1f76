//! The k8s workload's compactor, the apiserver's way: every `--compact-interval`, a Txn on
//! `compact_rev_key` that learns the current revision (and whether another apiserver compacted
//! meanwhile), then a Compact to the revision the round before learned.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_benches::Failure;
use cairn_server::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use cairn_server::pb::etcdserverpb::request_op::Request;
use cairn_server::pb::etcdserverpb::response_op::Response;
use cairn_server::pb::etcdserverpb::{CompactionRequest, Compare, PutRequest, RangeRequest, RequestOp, TxnRequest};
use tokio::time::sleep_until;

use super::apiserver::{header_revision, Apiserver};
use crate::drive::*;
use crate::request::*;

/// The apiserver's compactor: every `interval` from the start until the deadline, a Txn on
/// `key` (bumping its Version if no one else did since this compactor last looked) whose
/// header is the current revision, then a Compact to the revision the round before saw.
/// Returns the Compacts' tally and the last revision compacted to.
pub(crate) async fn compactor(api: Arc<Apiserver>, key: Bytes, interval: Duration) -> Result<(Tally, i64), Failure> {
    let mut tally = Tally::new()?;
    let mut version = 0;
    let mut seen = 0;
    let mut compacted_to = 0;
    let mut due = api.epoch;
    while due < api.deadline {
        sleep_until(due.into()).await;
        due += interval;
        let mut kv = api.kv();
        let request = TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Version as i32,
                key: key.clone(),
                target_union: Some(TargetUnion::Version(version)),
                ..Compare::default()
            }],
            success: vec![RequestOp {
                request: Some(Request::RequestPut(PutRequest {
                    key: key.clone(),
                    value: Bytes::from(seen.to_string()),
                    ..PutRequest::default()
                })),
            }],
            failure: vec![RequestOp {
                request: Some(Request::RequestRange(RangeRequest {
                    key: key.clone(),
                    ..RangeRequest::default()
                })),
            }],
        };
        let r = match timed(api.timeout, kv.txn(request)).await {
            Ok(r) => r,
            Err(e) => {
                tally.error(&e);
                continue;
            }
        };
        let before = seen;
        seen = header_revision(&r);
        if !r.succeeded {
            // Another compactor's turn (or an earlier run's key): take up its count.
            version = match r.responses.first().and_then(|op| op.response.as_ref()) {
                Some(Response::ResponseRange(range)) => range.kvs.first().map_or(0, |kv| kv.version),
                _ => 0,
            };
            continue;
        }
        version += 1;
        if before == 0 {
            continue;
        }
        let started = Instant::now();
        let request = CompactionRequest {
            revision: before,
            physical: false,
        };
        let outcome = timed(api.timeout, kv.compact(request)).await.map(|_| 0);
        if outcome.is_ok() {
            compacted_to = before;
        }
        tally.record(started.elapsed(), outcome);
    }
    Ok((tally, compacted_to))
}
