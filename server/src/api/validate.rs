//! Every check a client request passes before it reaches the engine, in one place, as etcd
//! makes them: its size against `--max-request-bytes`, its operations against
//! `--max-txn-ops`, empty keys, sort options, and the put flags that exclude each other. The
//! rules for a request on its own are the engine's (`validate`, `WriteRequest::check`), made
//! here, once, at the server's edge and before any permission is looked at; the engine is then
//! handed the request through `ServerHooks`, which do not check it again.
//! Fuzzed by `fuzz/fuzz_targets/grpc_request.rs`.

use cairn_engine as engine;
use engine::WriteRequest as _;
use prost::Message as _;
use tonic::Status;

use crate::api::convert;
use crate::errors::{status, Refusal};
use crate::pb::etcdserverpb as pb;

/// What a request may hold (etcd's flags).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// `--max-request-bytes`: the largest encoded write request.
    pub max_request_bytes: usize,
    /// `--max-txn-ops`: the most operations in one txn list.
    pub max_txn_ops: usize,
}

fn size(encoded: usize, limits: &Limits) -> Result<(), Status> {
    if encoded > limits.max_request_bytes {
        return Err(Refusal::RequestTooLarge.into());
    }
    Ok(())
}

/// A Range, checked and converted.
pub fn range(r: pb::RangeRequest) -> Result<engine::RangeRequest, Status> {
    if r.key.is_empty() {
        return Err(status(&engine::Error::EmptyKey));
    }
    // The key before the sort options, as etcd checks them.
    Ok(convert::range_request(r)?)
}

/// A Put, checked and converted.
pub fn put(r: pb::PutRequest, limits: &Limits) -> Result<engine::PutRequest, Status> {
    size(r.encoded_len(), limits)?;
    let put = convert::put_request(r);
    put.check(limits.max_txn_ops).map_err(|e| status(&e))?;
    Ok(put)
}

/// A DeleteRange, checked and converted.
pub fn delete_range(r: pb::DeleteRangeRequest, limits: &Limits) -> Result<engine::DeleteRangeRequest, Status> {
    size(r.encoded_len(), limits)?;
    let delete = convert::delete_request(r);
    delete.check(limits.max_txn_ops).map_err(|e| status(&e))?;
    Ok(delete)
}

/// A Txn, checked and converted (every nested request too).
pub fn txn(r: pb::TxnRequest, limits: &Limits) -> Result<engine::TxnRequest, Status> {
    size(r.encoded_len(), limits)?;
    let txn = convert::txn_request(r)?;
    txn.check(limits.max_txn_ops).map_err(|e| status(&e))?;
    Ok(txn)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_request_bytes: 100,
        max_txn_ops: 2,
    };

    #[test]
    fn requests_are_checked_as_etcd_checks_them() {
        let wire = |key: &[u8], value: &[u8]| pb::PutRequest {
            key: bytes::Bytes::copy_from_slice(key),
            value: bytes::Bytes::copy_from_slice(value),
            ..pb::PutRequest::default()
        };
        let message = |r: Result<engine::PutRequest, Status>| r.map(|_| ()).map_err(|s| s.message().to_string());
        assert_eq!(message(put(wire(b"k", b"v"), &LIMITS)), Ok(()));
        assert_eq!(
            message(put(wire(b"", b"v"), &LIMITS)),
            Err("etcdserver: key is not provided".into())
        );
        assert_eq!(
            message(put(wire(b"k", &[0; 200]), &LIMITS)),
            Err("etcdserver: request is too large".into())
        );
        let ignore = pb::PutRequest {
            ignore_value: true,
            ..wire(b"k", b"v")
        };
        assert_eq!(
            message(put(ignore, &LIMITS)),
            Err("etcdserver: value is provided".into())
        );
        let bad_sort = pb::RangeRequest {
            key: "k".into(),
            sort_order: 7,
            ..pb::RangeRequest::default()
        };
        assert_eq!(
            range(bad_sort).map(|_| ()).map_err(|s| s.message().to_string()),
            Err("etcdserver: invalid sort option".into())
        );
        let op = |k: &str| pb::RequestOp {
            request: Some(pb::request_op::Request::RequestPut(wire(k.as_bytes(), b""))),
        };
        let too_many = pb::TxnRequest {
            success: vec![op("a"), op("b"), op("c")],
            ..pb::TxnRequest::default()
        };
        assert_eq!(
            txn(too_many, &LIMITS).map(|_| ()).map_err(|s| s.message().to_string()),
            Err("etcdserver: too many operations in txn request".into())
        );
        let twice = pb::TxnRequest {
            success: vec![op("a"), op("a")],
            ..pb::TxnRequest::default()
        };
        assert_eq!(
            txn(twice, &LIMITS).map(|_| ()).map_err(|s| s.message().to_string()),
            Err("etcdserver: duplicate key given in txn request".into())
        );
    }
}
