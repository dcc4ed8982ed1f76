//! Wire messages to engine requests and engine answers to wire messages. Only shapes change
//! here: what a request may hold is checked in [`crate::api::validate`] and by the engine.

use cairn_engine as engine;
use engine::{CompareResult, CompareTarget, SortOrder, SortTarget};

use crate::errors::Refusal;
use crate::pb::etcdserverpb as pb;
use crate::pb::mvccpb;

/// An engine key-value as the wire's.
pub fn kv(kv: engine::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    }
}

/// An engine event as the wire's.
pub fn event(e: engine::Event) -> mvccpb::Event {
    let kind = match e.kind {
        engine::EventKind::Put => mvccpb::event::EventType::Put,
        engine::EventKind::Delete => mvccpb::event::EventType::Delete,
    };
    mvccpb::Event {
        r#type: kind as i32,
        kv: Some(kv(e.kv)),
        prev_kv: e.prev_kv.map(kv),
    }
}

/// A range request; unknown sort options are refused as etcd does.
pub fn range_request(r: pb::RangeRequest) -> Result<engine::RangeRequest, Refusal> {
    let sort_order = match pb::range_request::SortOrder::try_from(r.sort_order) {
        Ok(pb::range_request::SortOrder::None) => SortOrder::None,
        Ok(pb::range_request::SortOrder::Ascend) => SortOrder::Ascend,
        Ok(pb::range_request::SortOrder::Descend) => SortOrder::Descend,
        Err(_) => return Err(Refusal::InvalidSortOption),
    };
    let sort_target = match pb::range_request::SortTarget::try_from(r.sort_target) {
        Ok(pb::range_request::SortTarget::Key) => SortTarget::Key,
        Ok(pb::range_request::SortTarget::Version) => SortTarget::Version,
        Ok(pb::range_request::SortTarget::Create) => SortTarget::Create,
        Ok(pb::range_request::SortTarget::Mod) => SortTarget::Mod,
        Ok(pb::range_request::SortTarget::Value) => SortTarget::Value,
        Err(_) => return Err(Refusal::InvalidSortOption),
    };
    Ok(engine::RangeRequest {
        key: r.key.to_vec(),
        range_end: r.range_end.to_vec(),
        limit: r.limit,
        revision: r.revision,
        sort_order,
        sort_target,
        serializable: r.serializable,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    })
}

/// A range answer, less the header.
pub fn range_response(r: engine::RangeResponse, header: pb::ResponseHeader) -> pb::RangeResponse {
    pb::RangeResponse {
        header: Some(header),
        kvs: r.kvs.into_iter().map(kv).collect(),
        more: r.more,
        count: r.count,
    }
}

/// A put request; only the key is copied (the value's buffer is shared).
pub fn put_request(r: pb::PutRequest) -> engine::PutRequest {
    engine::PutRequest {
        key: r.key.to_vec(),
        value: r.value,
        lease: r.lease,
        prev_kv: r.prev_kv,
        ignore_value: r.ignore_value,
        ignore_lease: r.ignore_lease,
    }
}

/// A put answer under `header`, with the previous key-value if the request asked for it.
pub fn put_response(r: engine::PutResponse, header: pb::ResponseHeader) -> pb::PutResponse {
    pb::PutResponse {
        header: Some(header),
        prev_kv: r.prev_kv.map(kv),
    }
}

/// A delete-range request; `range_end` keeps etcd's meaning (empty: the key alone; `"\0"`:
/// every key from `key` on).
pub fn delete_request(r: pb::DeleteRangeRequest) -> engine::DeleteRangeRequest {
    engine::DeleteRangeRequest {
        key: r.key.to_vec(),
        range_end: r.range_end.to_vec(),
        prev_kv: r.prev_kv,
    }
}

/// A delete-range answer under `header`: the count deleted, and the deleted key-values if the
/// request asked for them.
pub fn delete_response(r: engine::DeleteRangeResponse, header: pb::ResponseHeader) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header: Some(header),
        deleted: r.deleted,
        prev_kvs: r.prev_kvs.into_iter().map(kv).collect(),
    }
}

fn compare(c: pb::Compare) -> Result<engine::Compare, Refusal> {
    use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let result = match R::try_from(c.result) {
        Ok(R::Equal) => CompareResult::Equal,
        Ok(R::Greater) => CompareResult::Greater,
        Ok(R::Less) => CompareResult::Less,
        Ok(R::NotEqual) => CompareResult::NotEqual,
        // etcd treats an unknown result as never holding; refusing is clearer and no client
        // sends one.
        Err(_) => return Err(Refusal::InvalidSortOption),
    };
    let number = |u: &Option<U>| match u {
        Some(U::Version(n) | U::CreateRevision(n) | U::ModRevision(n) | U::Lease(n)) => *n,
        _ => 0,
    };
    let target = match T::try_from(c.target) {
        Ok(T::Version) => CompareTarget::Version(number(&c.target_union)),
        Ok(T::Create) => CompareTarget::Create(number(&c.target_union)),
        Ok(T::Mod) => CompareTarget::Mod(number(&c.target_union)),
        Ok(T::Lease) => CompareTarget::Lease(number(&c.target_union)),
        Ok(T::Value) => CompareTarget::Value(match c.target_union {
            Some(U::Value(v)) => v,
            _ => bytes::Bytes::new(),
        }),
        Err(_) => return Err(Refusal::InvalidSortOption),
    };
    Ok(engine::Compare {
        key: c.key.to_vec(),
        range_end: c.range_end.to_vec(),
        target,
        result,
    })
}

fn request_op(op: pb::RequestOp) -> Result<Option<engine::RequestOp>, Refusal> {
    use pb::request_op::Request as R;
    Ok(match op.request {
        Some(R::RequestRange(r)) => Some(engine::RequestOp::Range(range_request(r)?)),
        Some(R::RequestPut(p)) => Some(engine::RequestOp::Put(put_request(p))),
        Some(R::RequestDeleteRange(d)) => Some(engine::RequestOp::DeleteRange(delete_request(d))),
        Some(R::RequestTxn(t)) => Some(engine::RequestOp::Txn(txn_request(t)?)),
        // An empty op: etcd skips it.
        None => None,
    })
}

/// A txn request, nested txns included. Empty operations are dropped, as etcd skips them; an
/// unknown compare result or target, or an unknown sort option in a range, is refused as
/// [`Refusal::InvalidSortOption`].
pub fn txn_request(t: pb::TxnRequest) -> Result<engine::TxnRequest, Refusal> {
    let ops = |list: Vec<pb::RequestOp>| -> Result<Vec<engine::RequestOp>, Refusal> {
        let mut out = Vec::with_capacity(list.len());
        for op in list {
            out.extend(request_op(op)?);
        }
        Ok(out)
    };
    Ok(engine::TxnRequest {
        compare: t.compare.into_iter().map(compare).collect::<Result<_, _>>()?,
        success: ops(t.success)?,
        failure: ops(t.failure)?,
    })
}

/// Whether a txn's executed operations wrote anything (every write of a txn shares one
/// revision).
fn wrote(responses: &[engine::ResponseOp]) -> bool {
    responses.iter().any(|r| match r {
        engine::ResponseOp::Put(_) => true,
        engine::ResponseOp::DeleteRange(d) => d.deleted > 0,
        engine::ResponseOp::Range(_) => false,
        engine::ResponseOp::Txn(t) => wrote(&t.responses),
    })
}

/// A txn answer with `header` (at the txn's revision). The answers of its operations carry
/// only a revision in their headers, as etcd's do: the revision before the txn until the txn
/// has written something, the txn's revision from then on; a nested txn's own header is empty.
pub fn txn_response(t: engine::TxnResponse, header: pb::ResponseHeader) -> pb::TxnResponse {
    let before = if wrote(&t.responses) {
        header.revision - 1
    } else {
        header.revision
    };
    let mut changed = false;
    pb::TxnResponse {
        header: Some(header),
        succeeded: t.succeeded,
        responses: op_responses(t.responses, before, &mut changed),
    }
}

fn op_responses(responses: Vec<engine::ResponseOp>, before: i64, changed: &mut bool) -> Vec<pb::ResponseOp> {
    use pb::response_op::Response as R;
    let at = |revision: i64| pb::ResponseHeader {
        revision,
        ..pb::ResponseHeader::default()
    };
    let mut out = Vec::with_capacity(responses.len());
    for r in responses {
        let response = match r {
            engine::ResponseOp::Range(r) => R::ResponseRange(range_response(r, at(before + i64::from(*changed)))),
            engine::ResponseOp::Put(p) => {
                *changed = true;
                R::ResponsePut(put_response(p, at(before + 1)))
            }
            engine::ResponseOp::DeleteRange(d) => {
                *changed |= d.deleted > 0;
                R::ResponseDeleteRange(delete_response(d, at(before + i64::from(*changed))))
            }
            engine::ResponseOp::Txn(t) => R::ResponseTxn(pb::TxnResponse {
                header: Some(pb::ResponseHeader::default()),
                succeeded: t.succeeded,
                responses: op_responses(t.responses, before, changed),
            }),
        };
        out.push(pb::ResponseOp {
            response: Some(response),
        });
    }
    out
}

/// A member as the wire's.
pub fn member(m: engine::Member) -> pb::Member {
    pb::Member {
        id: m.id,
        name: m.name,
        peer_ur_ls: m.peer_urls,
        client_ur_ls: m.client_urls,
        is_learner: m.is_learner,
    }
}
