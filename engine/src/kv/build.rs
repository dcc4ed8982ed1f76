//! Builders for the write requests, so a caller says what it means:
//!
//! ```
//! use cairn_engine::{Compare, PutRequest, TxnRequest};
//!
//! // Create `config` only if nobody has (kube-apiserver's create).
//! let txn = TxnRequest::when([Compare::mod_revision("config").eq(0)])
//!     .then([PutRequest::new("config", "v1")])
//!     .otherwise([cairn_engine::RangeRequest::key("config")]);
//! assert_eq!(txn.success.len(), 1);
//! ```

use bytes::Bytes;

use super::range::RangeRequest;
use super::txn::{Compare, CompareResult, CompareTarget, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest};

impl PutRequest {
    /// Puts `value` at `key`.
    pub fn new(key: impl Into<Vec<u8>>, value: impl Into<Bytes>) -> PutRequest {
        PutRequest {
            key: key.into(),
            value: value.into(),
            ..PutRequest::default()
        }
    }

    /// Attaches the key to lease `id`.
    pub fn with_lease(self, id: i64) -> PutRequest {
        PutRequest { lease: id, ..self }
    }

    /// Returns the key-value the put replaced.
    pub fn with_prev_kv(self) -> PutRequest {
        PutRequest { prev_kv: true, ..self }
    }
}

impl DeleteRangeRequest {
    /// Deletes `key`.
    pub fn key(key: impl Into<Vec<u8>>) -> DeleteRangeRequest {
        DeleteRangeRequest {
            key: key.into(),
            ..DeleteRangeRequest::default()
        }
    }

    /// Deletes every key starting with `prefix`.
    pub fn prefix(prefix: impl AsRef<[u8]>) -> DeleteRangeRequest {
        let prefix = prefix.as_ref();
        DeleteRangeRequest {
            key: prefix.to_vec(),
            range_end: crate::mvcc::index::prefix_end(prefix),
            ..DeleteRangeRequest::default()
        }
    }
}

/// A compare on one key's field, waiting for its relation: `Compare::version(k).eq(3)`.
#[derive(Debug)]
pub struct CompareOn<T> {
    key: Vec<u8>,
    target: fn(T) -> CompareTarget,
}

impl<T> CompareOn<T> {
    fn with(self, operand: T, result: CompareResult) -> Compare {
        Compare {
            key: self.key,
            range_end: Vec::new(),
            target: (self.target)(operand),
            result,
        }
    }

    /// The field equals `operand`.
    pub fn eq(self, operand: T) -> Compare {
        self.with(operand, CompareResult::Equal)
    }

    /// The field differs from `operand`.
    pub fn ne(self, operand: T) -> Compare {
        self.with(operand, CompareResult::NotEqual)
    }

    /// The field is greater than `operand`.
    pub fn gt(self, operand: T) -> Compare {
        self.with(operand, CompareResult::Greater)
    }

    /// The field is less than `operand`.
    pub fn lt(self, operand: T) -> Compare {
        self.with(operand, CompareResult::Less)
    }
}

impl Compare {
    /// The key's version (0 if missing).
    pub fn version(key: impl Into<Vec<u8>>) -> CompareOn<i64> {
        CompareOn {
            key: key.into(),
            target: CompareTarget::Version,
        }
    }

    /// The key's create revision (0 if missing).
    pub fn create_revision(key: impl Into<Vec<u8>>) -> CompareOn<i64> {
        CompareOn {
            key: key.into(),
            target: CompareTarget::Create,
        }
    }

    /// The key's mod revision (0 if missing).
    pub fn mod_revision(key: impl Into<Vec<u8>>) -> CompareOn<i64> {
        CompareOn {
            key: key.into(),
            target: CompareTarget::Mod,
        }
    }

    /// The key's lease (0 for none or a missing key).
    pub fn lease(key: impl Into<Vec<u8>>) -> CompareOn<i64> {
        CompareOn {
            key: key.into(),
            target: CompareTarget::Lease,
        }
    }

    /// The key's value (a missing key fails every value compare).
    pub fn value(key: impl Into<Vec<u8>>) -> CompareOn<Bytes> {
        CompareOn {
            key: key.into(),
            target: CompareTarget::Value,
        }
    }
}

impl TxnRequest {
    /// A txn whose success branch runs if every one of `compares` holds.
    pub fn when(compares: impl IntoIterator<Item = Compare>) -> TxnRequest {
        TxnRequest {
            compare: compares.into_iter().collect(),
            ..TxnRequest::default()
        }
    }

    /// The operations run when the compares hold.
    pub fn then<Op: Into<RequestOp>>(self, ops: impl IntoIterator<Item = Op>) -> TxnRequest {
        TxnRequest {
            success: ops.into_iter().map(Into::into).collect(),
            ..self
        }
    }

    /// The operations run when a compare fails.
    pub fn otherwise<Op: Into<RequestOp>>(self, ops: impl IntoIterator<Item = Op>) -> TxnRequest {
        TxnRequest {
            failure: ops.into_iter().map(Into::into).collect(),
            ..self
        }
    }
}

impl From<PutRequest> for RequestOp {
    fn from(p: PutRequest) -> RequestOp {
        RequestOp::Put(p)
    }
}

impl From<DeleteRangeRequest> for RequestOp {
    fn from(d: DeleteRangeRequest) -> RequestOp {
        RequestOp::DeleteRange(d)
    }
}

impl From<RangeRequest> for RequestOp {
    fn from(r: RangeRequest) -> RequestOp {
        RequestOp::Range(r)
    }
}

impl From<TxnRequest> for RequestOp {
    fn from(t: TxnRequest) -> RequestOp {
        RequestOp::Txn(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_say_what_the_structs_do() {
        let txn = TxnRequest::when([Compare::mod_revision("k").eq(0), Compare::value("v").ne("x".into())])
            .then([PutRequest::new("k", "1").with_lease(7).with_prev_kv()])
            .otherwise([DeleteRangeRequest::prefix("p/")]);
        assert_eq!(
            txn.compare[0],
            Compare {
                key: b"k".to_vec(),
                range_end: vec![],
                target: CompareTarget::Mod(0),
                result: CompareResult::Equal,
            }
        );
        assert_eq!(txn.compare[1].result, CompareResult::NotEqual);
        assert_eq!(
            txn.success,
            vec![RequestOp::Put(PutRequest {
                key: b"k".to_vec(),
                value: Bytes::from("1"),
                lease: 7,
                prev_kv: true,
                ..PutRequest::default()
            })]
        );
        assert_eq!(
            txn.failure,
            vec![RequestOp::DeleteRange(DeleteRangeRequest {
                key: b"p/".to_vec(),
                range_end: b"p0".to_vec(),
                prev_kv: false,
            })]
        );
    }
}
