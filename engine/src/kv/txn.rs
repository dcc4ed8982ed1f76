//! Write requests: Put, DeleteRange and Txn, with etcd's validation and semantics.
//!
//! A Txn's compares are all evaluated first, against the store as it was before the request
//! (nested txns included: the whole branch path is chosen up front, as etcd does); then the
//! chosen branch's operations run in order inside one write request, so they share one
//! revision and a range sees the writes before it. A missing key compares as 0 for VERSION,
//! CREATE and MOD, and fails every VALUE compare.

use bytes::Bytes;

use super::range::{RangeRequest, RangeResponse};
use crate::error::{Error, Result};
use crate::mvcc::index::KeyRange;
use crate::mvcc::store::{KeyValue, LeaseChange, ReadOptions, Store, WriteTxn};

/// Whether a lease exists, for puts that attach one (etcd: ErrLeaseNotFound otherwise).
pub(crate) type LeaseExists<'a> = &'a dyn Fn(i64) -> bool;

/// What a write request did: its response, the store's revision after it, and the keys whose
/// lease changed.
pub(crate) type Written<T> = (T, i64, Vec<LeaseChange>);

/// etcd's `PutRequest`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PutRequest {
    /// The key written; must not be empty.
    pub key: Vec<u8>,
    /// The new value; must be empty with `ignore_value`.
    pub value: Bytes,
    /// The lease to attach, which must exist; 0 for none, which detaches the key's lease if
    /// it had one.
    pub lease: i64,
    /// Return the key-value as it was before the put, in [`PutResponse::prev_kv`].
    pub prev_kv: bool,
    /// Keep the key's current value (the key must exist).
    pub ignore_value: bool,
    /// Keep the key's current lease (the key must exist).
    pub ignore_lease: bool,
}

/// etcd's `PutResponse`, less the header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PutResponse {
    /// The key-value before the put, if the request asked for it and the key existed.
    pub prev_kv: Option<KeyValue>,
}

/// etcd's `DeleteRangeRequest`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteRangeRequest {
    /// The key deleted, or the first key of the range; must not be empty.
    pub key: Vec<u8>,
    /// The end of the range, exclusive: empty deletes `key` alone, `"\0"` every key from
    /// `key` on.
    pub range_end: Vec<u8>,
    /// Return the deleted key-values, in [`DeleteRangeResponse::prev_kvs`].
    pub prev_kv: bool,
}

/// etcd's `DeleteRangeResponse`, less the header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeleteRangeResponse {
    /// How many keys were deleted.
    pub deleted: i64,
    /// The deleted key-values in key order, if the request asked for them; else empty.
    pub prev_kvs: Vec<KeyValue>,
}

/// What a compare looks at, with the operand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    /// The key's [`KeyValue::version`] (etcd's `VERSION`); 0 for a missing key.
    Version(i64),
    /// The key's [`KeyValue::create_revision`] (etcd's `CREATE`); 0 for a missing key.
    Create(i64),
    /// The key's [`KeyValue::mod_revision`] (etcd's `MOD`); 0 for a missing key.
    Mod(i64),
    /// The key's value, compared bytewise (etcd's `VALUE`); a missing key fails every
    /// comparison.
    Value(Bytes),
    /// The key's attached lease ID (etcd's `LEASE`); 0 for none or a missing key.
    Lease(i64),
}

/// How the key's field must relate to the operand for a compare to hold (etcd's
/// `Compare.CompareResult`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareResult {
    /// The field equals the operand.
    Equal,
    /// The field is greater than the operand.
    Greater,
    /// The field is less than the operand.
    Less,
    /// The field differs from the operand.
    NotEqual,
}

/// etcd's `Compare`: every key of the range must satisfy it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    /// The key compared, or the first key of the range; must not be empty.
    pub key: Vec<u8>,
    /// The end of the range, exclusive: empty compares `key` alone, `"\0"` every key from
    /// `key` on. A range with no key in it compares as a missing key.
    pub range_end: Vec<u8>,
    /// The field compared, with the operand.
    pub target: CompareTarget,
    /// The relation that must hold.
    pub result: CompareResult,
}

/// One operation of a Txn branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestOp {
    /// A read (etcd's `request_range`); it sees the branch's earlier writes.
    Range(RangeRequest),
    /// etcd's `request_put`.
    Put(PutRequest),
    /// etcd's `request_delete_range`.
    DeleteRange(DeleteRangeRequest),
    /// A nested txn (etcd's `request_txn`); its compares are evaluated with the outer ones,
    /// before anything is written.
    Txn(TxnRequest),
}

/// The answer to one [`RequestOp`], of the same kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseOp {
    /// etcd's `response_range`.
    Range(RangeResponse),
    /// etcd's `response_put`.
    Put(PutResponse),
    /// etcd's `response_delete_range`.
    DeleteRange(DeleteRangeResponse),
    /// etcd's `response_txn`.
    Txn(TxnResponse),
}

/// etcd's `TxnRequest`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnRequest {
    /// Conditions that must all hold for `success` to run, else `failure` runs; none means
    /// `success`.
    pub compare: Vec<Compare>,
    /// Operations run in order when every compare holds.
    pub success: Vec<RequestOp>,
    /// Operations run in order when some compare fails.
    pub failure: Vec<RequestOp>,
}

/// etcd's `TxnResponse`, less the header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TxnResponse {
    /// Whether every compare held (the success branch ran).
    pub succeeded: bool,
    /// One response per operation of the branch that ran, in order.
    pub responses: Vec<ResponseOp>,
}

impl Compare {
    fn holds_for(&self, kv: Option<&KeyValue>) -> bool {
        let ordering = match (&self.target, kv) {
            // A missing key has no value to compare: every VALUE compare fails.
            (CompareTarget::Value(_), None) => return false,
            (CompareTarget::Value(v), Some(kv)) => kv.value.as_ref().cmp(v.as_ref()),
            (CompareTarget::Version(v), kv) => kv.map_or(0, |kv| kv.version).cmp(v),
            (CompareTarget::Create(v), kv) => kv.map_or(0, |kv| kv.create_revision).cmp(v),
            (CompareTarget::Mod(v), kv) => kv.map_or(0, |kv| kv.mod_revision).cmp(v),
            (CompareTarget::Lease(v), kv) => kv.map_or(0, |kv| kv.lease).cmp(v),
        };
        match self.result {
            CompareResult::Equal => ordering.is_eq(),
            CompareResult::NotEqual => ordering.is_ne(),
            CompareResult::Greater => ordering.is_gt(),
            CompareResult::Less => ordering.is_lt(),
        }
    }

    fn holds(&self, store: &Store) -> Result<bool> {
        let found = store.range(&self.key, &self.range_end, ReadOptions::default())?;
        if found.kvs.is_empty() {
            return Ok(self.holds_for(None));
        }
        Ok(found.kvs.iter().all(|kv| self.holds_for(Some(kv))))
    }
}

impl TxnRequest {
    /// Whether every operation, in both branches and nested txns, only reads.
    pub fn is_read_only(&self) -> bool {
        self.success.iter().chain(&self.failure).all(|op| match op {
            RequestOp::Range(_) => true,
            RequestOp::Txn(t) => t.is_read_only(),
            RequestOp::Put(_) | RequestOp::DeleteRange(_) => false,
        })
    }

    /// Whether etcd serves the txn without a read barrier: every op of both branches is a
    /// serializable range (a nested txn or a write needs one; etcd's `isTxnSerializable`).
    pub fn is_serializable(&self) -> bool {
        self.success
            .iter()
            .chain(&self.failure)
            .all(|op| matches!(op, RequestOp::Range(r) if r.serializable))
    }

    /// Bytes the puts of both branches would add, for the quota check.
    pub(crate) fn put_bytes(&self) -> u64 {
        self.success
            .iter()
            .chain(&self.failure)
            .map(|op| match op {
                RequestOp::Put(p) => crate::mvcc::store::record_size(p.key.len(), p.value.len()),
                RequestOp::Txn(t) => t.put_bytes(),
                _ => 0,
            })
            .sum()
    }

    /// Checks the request as etcd does before applying it: no empty keys, at most `max_ops`
    /// operations in any branch or compare list (nested txns counting against what is left),
    /// and no key written twice in a branch.
    pub fn validate(&self, max_ops: usize) -> Result<()> {
        self.check_ops(max_ops)?;
        check_intervals(&self.success)?;
        check_intervals(&self.failure)?;
        Ok(())
    }

    fn check_ops(&self, max_ops: usize) -> Result<()> {
        let ops = self.compare.len().max(self.success.len()).max(self.failure.len());
        if ops > max_ops {
            return Err(Error::TooManyOps { ops, limit: max_ops });
        }
        if self.compare.iter().any(|c| c.key.is_empty()) {
            return Err(Error::EmptyKey);
        }
        for op in self.success.iter().chain(&self.failure) {
            match op {
                RequestOp::Range(r) => r.validate()?,
                RequestOp::Put(p) => p.validate()?,
                RequestOp::DeleteRange(d) => d.validate()?,
                RequestOp::Txn(t) => t.check_ops(max_ops - ops)?,
            }
        }
        Ok(())
    }

    /// The branch chosen at each level, outermost first, decided before anything is written.
    fn path(&self, store: &Store, path: &mut Vec<bool>) -> Result<()> {
        let mut succeeded = true;
        for c in &self.compare {
            if !c.holds(store)? {
                succeeded = false;
                break;
            }
        }
        path.push(succeeded);
        let branch = if succeeded { &self.success } else { &self.failure };
        for op in branch {
            if let RequestOp::Txn(nested) = op {
                nested.path(store, path)?;
            }
        }
        Ok(())
    }

    /// Checks, before anything is written, everything on the chosen path that could fail once
    /// writing has begun, as etcd's `checkRequests` does against the same view: a put's lease
    /// must exist, a put that keeps the current value or lease needs a key to keep it from, and
    /// a range's revision must be readable. A write request is never left half applied.
    fn check_puts(&self, store: &Store, leases: LeaseExists<'_>, path: &mut std::slice::Iter<'_, bool>) -> Result<()> {
        let branch = if path.next().copied().unwrap_or(false) {
            &self.success
        } else {
            &self.failure
        };
        for op in branch {
            match op {
                RequestOp::Put(p) if p.lease != 0 && !leases(p.lease) => return Err(Error::LeaseNotFound),
                RequestOp::Put(p)
                    if (p.ignore_value || p.ignore_lease)
                        && store.range(&p.key, &[], ReadOptions::default())?.count == 0 =>
                {
                    return Err(Error::KeyNotFound);
                }
                RequestOp::Range(r) if r.revision > 0 => {
                    if r.revision > store.current_revision() {
                        return Err(Error::FutureRevision {
                            requested: r.revision,
                            current: store.current_revision(),
                        });
                    }
                    if r.revision < store.compacted_revision() {
                        return Err(Error::Compacted {
                            requested: r.revision,
                            compacted: store.compacted_revision(),
                        });
                    }
                }
                RequestOp::Txn(t) => t.check_puts(store, leases, path)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn run(&self, w: &mut WriteTxn<'_>, path: &mut std::slice::Iter<'_, bool>) -> Result<TxnResponse> {
        let succeeded = path.next().copied().unwrap_or(false);
        let branch = if succeeded { &self.success } else { &self.failure };
        let mut responses = Vec::with_capacity(branch.len());
        for op in branch {
            responses.push(match op {
                RequestOp::Range(r) => ResponseOp::Range(r.apply_in(w)?),
                RequestOp::Put(p) => ResponseOp::Put(p.run(w)?),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(d.run(w)?),
                RequestOp::Txn(t) => ResponseOp::Txn(t.run(w, path)?),
            });
        }
        Ok(TxnResponse { succeeded, responses })
    }

    /// Answers a read-only txn ([`TxnRequest::is_read_only`]) from `store` without writing
    /// (etcd serves them so too): the answer applying it would give, and the store's current
    /// revision. Validate it first ([`TxnRequest::validate`]).
    pub fn read(&self, store: &Store) -> Result<(TxnResponse, i64)> {
        let mut path = Vec::new();
        self.path(store, &mut path)?;
        let response = self.read_along(store, &mut path.iter())?;
        Ok((response, store.current_revision()))
    }

    fn read_along(&self, store: &Store, path: &mut std::slice::Iter<'_, bool>) -> Result<TxnResponse> {
        let succeeded = path.next().copied().unwrap_or(false);
        let branch = if succeeded { &self.success } else { &self.failure };
        let mut responses = Vec::with_capacity(branch.len());
        for op in branch {
            responses.push(match op {
                RequestOp::Range(r) => ResponseOp::Range(r.apply(store)?),
                RequestOp::Txn(t) => ResponseOp::Txn(t.read_along(store, path)?),
                RequestOp::Put(_) | RequestOp::DeleteRange(_) => {
                    return Err(Error::internal("a write in a txn read without writing"))
                }
            });
        }
        Ok(TxnResponse { succeeded, responses })
    }

    /// Applies the request as one write request; returns the response and the store's
    /// revision after it. Validate it first ([`TxnRequest::validate`]).
    pub fn apply(&self, store: &mut Store) -> Result<(TxnResponse, i64)> {
        self.apply_checked(store, &|_| true).map(|(r, rev, _)| (r, rev))
    }

    pub(crate) fn apply_checked(&self, store: &mut Store, leases: LeaseExists<'_>) -> Result<Written<TxnResponse>> {
        let mut path = Vec::new();
        self.path(store, &mut path)?;
        self.check_puts(store, leases, &mut path.iter())?;
        let mut w = store.write();
        let response = self.run(&mut w, &mut path.iter())?;
        let (rev, changes) = w.finish();
        Ok((response, rev, changes))
    }
}

/// Rejects a branch that puts a key twice, or puts a key a delete in it also covers; nested
/// txns count, and a key put in both branches of one nested txn is fine (only one runs).
/// Returns the keys put and the ranges deleted.
fn check_intervals(ops: &[RequestOp]) -> Result<(Vec<Vec<u8>>, Vec<KeyRange>)> {
    // etcd checks a delete as the interval [key, range_end) of plain byte strings, so a
    // delete "from key on" (range_end "\0") or with an end before its key covers nothing here.
    let mut dels: Vec<KeyRange> = ops
        .iter()
        .filter_map(|op| match op {
            RequestOp::DeleteRange(d) if !d.range_end.is_empty() && d.range_end <= d.key => None,
            RequestOp::DeleteRange(d) => Some(KeyRange::new(&d.key, &d.range_end)),
            _ => None,
        })
        .collect();
    let deleted = |dels: &[KeyRange], key: &[u8]| dels.iter().any(|r| r.contains(key));
    let mut puts: Vec<Vec<u8>> = Vec::new();
    for op in ops {
        let RequestOp::Txn(t) = op else { continue };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || deleted(&dels, k) {
                return Err(Error::DuplicateKey);
            }
            puts.push(k.clone());
        }
        for k in &puts_else {
            if (puts.contains(k) && !puts_then.contains(k)) || deleted(&dels, k) {
                return Err(Error::DuplicateKey);
            }
            if !puts.contains(k) {
                puts.push(k.clone());
            }
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let RequestOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || deleted(&dels, &p.key) {
            return Err(Error::DuplicateKey);
        }
        puts.push(p.key.clone());
    }
    Ok((puts, dels))
}

impl PutRequest {
    /// Checks the put on its own, as etcd does before proposing it: a key, no value with
    /// `ignore_value`, no lease with `ignore_lease`. Whether the lease, or the key to keep
    /// them from, exists is checked when the put is applied.
    pub fn validate(&self) -> Result<()> {
        if self.key.is_empty() {
            return Err(Error::EmptyKey);
        }
        if self.ignore_value && !self.value.is_empty() {
            return Err(Error::ValueProvided);
        }
        if self.ignore_lease && self.lease != 0 {
            return Err(Error::LeaseProvided);
        }
        Ok(())
    }

    fn run(&self, w: &mut WriteTxn<'_>) -> Result<PutResponse> {
        let (mut value, mut lease) = (self.value.clone(), self.lease);
        if self.ignore_value || self.ignore_lease {
            let current = w.range(&self.key, &[], ReadOptions::default())?;
            let kv = current.kvs.first().ok_or(Error::KeyNotFound)?;
            if self.ignore_value {
                value = kv.value.clone();
            }
            if self.ignore_lease {
                lease = kv.lease;
            }
        }
        let prev_kv = match self.prev_kv {
            true => w.put(&self.key, value, lease)?,
            false => {
                w.put_only(&self.key, value, lease)?;
                None
            }
        };
        Ok(PutResponse { prev_kv })
    }

    /// Applies the put as its own write request; returns the response and the new revision.
    /// Validate it first ([`PutRequest::validate`]).
    pub fn apply(&self, store: &mut Store) -> Result<(PutResponse, i64)> {
        self.apply_checked(store, &|_| true).map(|(r, rev, _)| (r, rev))
    }

    pub(crate) fn apply_checked(&self, store: &mut Store, leases: LeaseExists<'_>) -> Result<Written<PutResponse>> {
        if self.lease != 0 && !leases(self.lease) {
            return Err(Error::LeaseNotFound);
        }
        let mut w = store.write();
        let response = self.run(&mut w)?;
        let (rev, changes) = w.finish();
        Ok((response, rev, changes))
    }
}

impl DeleteRangeRequest {
    /// Checks the delete on its own, as etcd does before proposing it: a key is given.
    pub fn validate(&self) -> Result<()> {
        match self.key.is_empty() {
            true => Err(Error::EmptyKey),
            false => Ok(()),
        }
    }

    fn run(&self, w: &mut WriteTxn<'_>) -> Result<DeleteRangeResponse> {
        let deleted = w.delete_range(&self.key, &self.range_end)?;
        Ok(DeleteRangeResponse {
            deleted: i64::try_from(deleted.len()).unwrap_or(i64::MAX),
            prev_kvs: if self.prev_kv { deleted } else { Vec::new() },
        })
    }

    /// Applies the delete as its own write request; returns the response and the revision
    /// after it (unchanged if nothing was deleted).
    pub fn apply(&self, store: &mut Store) -> Result<(DeleteRangeResponse, i64)> {
        self.apply_checked(store).map(|(r, rev, _)| (r, rev))
    }

    pub(crate) fn apply_checked(&self, store: &mut Store) -> Result<Written<DeleteRangeResponse>> {
        let mut w = store.write();
        let response = self.run(&mut w)?;
        let (rev, changes) = w.finish();
        Ok((response, rev, changes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str) -> RequestOp {
        RequestOp::Put(PutRequest {
            key: key.as_bytes().to_vec(),
            value: Bytes::copy_from_slice(value.as_bytes()),
            ..PutRequest::default()
        })
    }

    fn get(key: &str) -> RequestOp {
        RequestOp::Range(RangeRequest {
            key: key.as_bytes().to_vec(),
            ..RangeRequest::default()
        })
    }

    fn del(key: &str, end: &str) -> RequestOp {
        RequestOp::DeleteRange(DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            range_end: end.as_bytes().to_vec(),
            prev_kv: false,
        })
    }

    fn cmp(key: &str, target: CompareTarget, result: CompareResult) -> Compare {
        Compare {
            key: key.as_bytes().to_vec(),
            range_end: Vec::new(),
            target,
            result,
        }
    }

    fn txn(compare: Vec<Compare>, success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
        TxnRequest {
            compare,
            success,
            failure,
        }
    }

    fn apply(store: &mut Store, t: &TxnRequest) -> Result<(TxnResponse, i64)> {
        t.validate(128)?;
        t.apply(store)
    }

    #[test]
    fn kube_apiserver_create_and_update() {
        // kube-apiserver's writes: create is MOD(key) == 0 -> Put; update is MOD(key) == rev ->
        // Put / Range.
        let mut store = Store::new();
        let create = txn(
            vec![cmp("k", CompareTarget::Mod(0), CompareResult::Equal)],
            vec![put("k", "v1")],
            vec![],
        );
        let (resp, rev) = apply(&mut store, &create).unwrap();
        assert!(resp.succeeded);
        assert_eq!(rev, 2, "an empty store is at 1; the first write gets 2");
        let (resp, rev) = apply(&mut store, &create).unwrap();
        assert!(!resp.succeeded, "the key exists now");
        assert_eq!(rev, 2, "a txn that writes nothing does not bump the revision");
        let update = |at| {
            txn(
                vec![cmp("k", CompareTarget::Mod(at), CompareResult::Equal)],
                vec![put("k", "v2")],
                vec![get("k")],
            )
        };
        let (resp, _) = apply(&mut store, &update(7)).unwrap();
        assert!(!resp.succeeded);
        let ResponseOp::Range(current) = &resp.responses[0] else {
            panic!("{resp:?}")
        };
        assert_eq!(current.kvs[0].mod_revision, 2);
        let (resp, rev) = apply(&mut store, &update(2)).unwrap();
        assert!(resp.succeeded);
        assert_eq!(rev, 3);
    }

    #[test]
    fn compare_targets_and_results() {
        let mut store = Store::new();
        apply(&mut store, &txn(vec![], vec![put("k", "b")], vec![])).unwrap();
        apply(&mut store, &txn(vec![], vec![put("k", "b")], vec![])).unwrap();
        // k: value "b", version 2, create 2, mod 3, lease 0. "missing" does not exist.
        use CompareResult::*;
        use CompareTarget::*;
        let cases = [
            ("k", Value("b".into()), Equal, true),
            ("k", Value("a".into()), Greater, true),
            ("k", Value("c".into()), Less, true),
            ("k", Value("b".into()), NotEqual, false),
            ("k", Version(2), Equal, true),
            ("k", Version(1), Greater, true),
            ("k", Create(2), Equal, true),
            ("k", Mod(4), Less, true),
            ("k", Lease(0), Equal, true),
            ("missing", Version(0), Equal, true),
            ("missing", Create(0), Equal, true),
            ("missing", Mod(1), Less, true),
            ("missing", Value("".into()), Equal, false),
            ("missing", Value("".into()), NotEqual, false),
        ];
        for (key, target, result, expected) in cases {
            let t = txn(vec![cmp(key, target.clone(), result)], vec![], vec![]);
            let (resp, _) = apply(&mut store, &t).unwrap();
            assert_eq!(resp.succeeded, expected, "{key} {target:?} {result:?}");
        }
    }

    #[test]
    fn range_compare_must_hold_for_every_key() {
        let mut store = Store::new();
        apply(&mut store, &txn(vec![], vec![put("a/1", "x"), put("a/2", "y")], vec![])).unwrap();
        let all = |value: &str, result| Compare {
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
            target: CompareTarget::Value(Bytes::copy_from_slice(value.as_bytes())),
            result,
        };
        let (resp, _) = apply(&mut store, &txn(vec![all("x", CompareResult::Equal)], vec![], vec![])).unwrap();
        assert!(!resp.succeeded, "a/2 is not x");
        let (resp, _) = apply(&mut store, &txn(vec![all("z", CompareResult::Less)], vec![], vec![])).unwrap();
        assert!(resp.succeeded);
    }

    #[test]
    fn writes_share_one_revision_and_later_ops_see_earlier_ones() {
        let mut store = Store::new();
        apply(&mut store, &txn(vec![], vec![put("c", "old")], vec![])).unwrap();
        let t = txn(
            vec![],
            vec![put("a", "1"), get("a"), put("b", "2"), del("c", "")],
            vec![],
        );
        let (resp, rev) = apply(&mut store, &t).unwrap();
        assert_eq!(rev, 3);
        let ResponseOp::Range(seen) = &resp.responses[1] else {
            panic!("{resp:?}")
        };
        assert_eq!(seen.kvs[0].value, "1", "a range sees the put before it");
        let ResponseOp::DeleteRange(d) = &resp.responses[3] else {
            panic!("{resp:?}")
        };
        assert_eq!(d.deleted, 1);
        for key in [&b"a"[..], b"b"] {
            let kv = store.range(key, b"", ReadOptions::default()).unwrap();
            assert_eq!((kv.kvs[0].mod_revision, kv.revision), (3, 3), "{key:?}");
        }
        assert_eq!(store.range(b"c", b"", ReadOptions::default()).unwrap().count, 0);
    }

    #[test]
    fn nested_compares_see_the_store_before_the_txn() {
        let mut store = Store::new();
        // The outer branch creates k; the nested compare still sees k missing, as in etcd.
        let nested = txn(
            vec![cmp("k", CompareTarget::Version(0), CompareResult::Equal)],
            vec![put("n", "then")],
            vec![put("n", "else")],
        );
        let t = txn(vec![], vec![put("k", "v"), RequestOp::Txn(nested)], vec![]);
        let (resp, _) = apply(&mut store, &t).unwrap();
        let ResponseOp::Txn(inner) = &resp.responses[1] else {
            panic!("{resp:?}")
        };
        assert!(inner.succeeded);
        assert_eq!(
            store.range(b"n", b"", ReadOptions::default()).unwrap().kvs[0].value,
            "then"
        );
    }

    #[test]
    fn a_txn_that_fails_writes_nothing() {
        // A range at a future revision after a put: refused before the put is made.
        let mut store = Store::new();
        apply(&mut store, &txn(vec![], vec![put("a", "1")], vec![])).unwrap();
        let bad_range = RequestOp::Range(RangeRequest {
            key: b"a".to_vec(),
            revision: 99,
            ..RangeRequest::default()
        });
        let err = apply(&mut store, &txn(vec![], vec![put("x", "phantom"), bad_range], vec![])).unwrap_err();
        assert!(matches!(err, Error::FutureRevision { .. }), "{err}");
        assert_eq!(store.range(b"x", b"", ReadOptions::default()).unwrap().count, 0);
        let (_, rev) = apply(&mut store, &txn(vec![], vec![put("x", "real")], vec![])).unwrap();
        assert_eq!(rev, store.current_revision());
        assert_eq!(
            store.range(b"x", b"", ReadOptions::default()).unwrap().kvs[0].value,
            "real"
        );
    }

    #[test]
    fn validation_follows_etcd() {
        let many: Vec<RequestOp> = (0..129).map(|i| put(&format!("k{i}"), "v")).collect();
        let nested_both = txn(vec![], vec![put("x", "1")], vec![put("x", "2")]);
        let cases: Vec<(TxnRequest, Option<Error>)> = vec![
            (
                txn(vec![], many, vec![]),
                Some(Error::TooManyOps { ops: 129, limit: 128 }),
            ),
            (
                txn(vec![], vec![put("a", "1"), put("a", "2")], vec![]),
                Some(Error::DuplicateKey),
            ),
            (
                txn(vec![], vec![del("a", "c"), put("b", "1")], vec![]),
                Some(Error::DuplicateKey),
            ),
            // etcd checks [key, range_end) as plain strings: a delete "from a on" is the empty
            // interval ["a", "\0"), which no put overlaps (checked against etcd 3.4).
            (txn(vec![], vec![del("a", "\0"), put("z", "1")], vec![]), None),
            (txn(vec![], vec![del("a", "b"), put("b", "1")], vec![]), None),
            (txn(vec![], vec![put("a", "1")], vec![put("a", "2")]), None),
            (txn(vec![], vec![RequestOp::Txn(nested_both.clone())], vec![]), None),
            (
                txn(vec![], vec![RequestOp::Txn(nested_both), put("x", "3")], vec![]),
                Some(Error::DuplicateKey),
            ),
            (
                txn(
                    vec![cmp("", CompareTarget::Version(0), CompareResult::Equal)],
                    vec![],
                    vec![],
                ),
                Some(Error::EmptyKey),
            ),
            (txn(vec![], vec![put("", "v")], vec![]), Some(Error::EmptyKey)),
        ];
        for (i, (t, expected)) in cases.into_iter().enumerate() {
            assert_eq!(t.validate(128).err(), expected, "case {i}");
        }
    }

    #[test]
    fn ignore_value_and_lease_need_an_existing_key_and_write_nothing_otherwise() {
        let mut store = Store::new();
        let keep = |key: &str| {
            RequestOp::Put(PutRequest {
                key: key.as_bytes().to_vec(),
                ignore_value: true,
                ..PutRequest::default()
            })
        };
        let t = txn(vec![], vec![put("a", "1"), keep("missing")], vec![]);
        assert_eq!(apply(&mut store, &t).err(), Some(Error::KeyNotFound));
        assert_eq!(store.current_revision(), 1, "nothing of the failed txn was written");
        apply(&mut store, &txn(vec![], vec![put("a", "1")], vec![])).unwrap();
        apply(&mut store, &txn(vec![], vec![keep("a")], vec![])).unwrap();
        let a = store.range(b"a", b"", ReadOptions::default()).unwrap();
        assert_eq!((a.kvs[0].value.as_ref(), a.kvs[0].version), (&b"1"[..], 2));
        let bad = PutRequest {
            key: b"a".to_vec(),
            value: "v".into(),
            ignore_value: true,
            ..PutRequest::default()
        };
        assert_eq!(bad.validate(), Err(Error::ValueProvided));
        let bad = PutRequest {
            key: b"a".to_vec(),
            lease: 5,
            ignore_lease: true,
            ..PutRequest::default()
        };
        assert_eq!(bad.validate(), Err(Error::LeaseProvided));
    }
}
