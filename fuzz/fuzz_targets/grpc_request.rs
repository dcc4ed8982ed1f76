//! Fuzzes the checks every client request passes before it reaches the engine
//! (`cairn_server::internals::validate`), on arbitrary wire bytes.
//!
//! Each input is a request of one kind (Range, Put, DeleteRange or Txn) as protobuf bytes, and
//! the limits to check it against. For every input: decoding, validation and conversion never
//! panic; an error is one of etcd's statuses; and a request that passed validation, applied to
//! an in-memory store, never fails with an error validation exists to catch (an empty key, a
//! duplicate key, too many operations, a value or lease given with its `ignore_` flag).

#![no_main]

use std::cell::RefCell;

use arbitrary::Arbitrary;
use cairn_engine::{Error, Store};
use cairn_server::internals::validate::{self, Limits};
use cairn_server::pb::etcdserverpb as pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;

#[derive(Arbitrary, Debug)]
enum Kind {
    Range,
    Put,
    Delete,
    Txn,
}

#[derive(Arbitrary, Debug)]
struct Input {
    kind: Kind,
    bytes: Vec<u8>,
    max_request_bytes: u16,
    max_txn_ops: u8,
}

/// Inputs applied to one store before it starts afresh (so it stays small and fast).
const RESET_EVERY: u32 = 256;

thread_local! {
    static STORE: RefCell<(Store, u32)> = RefCell::new((Store::new(), 0));
}

/// Errors that validation must have caught before the engine sees the request.
fn caught_by_validation(e: &Error) -> bool {
    matches!(
        e,
        Error::EmptyKey | Error::DuplicateKey | Error::TooManyOps { .. } | Error::ValueProvided | Error::LeaseProvided
    )
}

fn check_status(s: &tonic::Status) {
    assert!(s.message().starts_with("etcdserver: "), "not etcd's message: {s:?}");
    assert_ne!(s.code(), tonic::Code::Ok);
}

fuzz_target!(|input: Input| {
    let limits = Limits {
        max_request_bytes: usize::from(input.max_request_bytes),
        max_txn_ops: usize::from(input.max_txn_ops).max(1),
    };
    STORE.with(|cell| {
        let (store, used) = &mut *cell.borrow_mut();
        *used += 1;
        if *used > RESET_EVERY {
            *store = Store::new();
            *used = 0;
        }
        let applied: Result<(), Error> = match input.kind {
            Kind::Range => {
                let Ok(r) = pb::RangeRequest::decode(input.bytes.as_slice()) else {
                    return;
                };
                match validate::range(r) {
                    Ok(r) => r.apply(store).map(|_| ()),
                    Err(s) => return check_status(&s),
                }
            }
            Kind::Put => {
                let Ok(r) = pb::PutRequest::decode(input.bytes.as_slice()) else {
                    return;
                };
                match validate::put(r, &limits) {
                    Ok(r) => r.apply(store).map(|_| ()),
                    Err(s) => return check_status(&s),
                }
            }
            Kind::Delete => {
                let Ok(r) = pb::DeleteRangeRequest::decode(input.bytes.as_slice()) else {
                    return;
                };
                match validate::delete_range(r, &limits) {
                    Ok(r) => r.apply(store).map(|_| ()),
                    Err(s) => return check_status(&s),
                }
            }
            Kind::Txn => {
                let Ok(r) = pb::TxnRequest::decode(input.bytes.as_slice()) else {
                    return;
                };
                match validate::txn(r, &limits) {
                    Ok(r) => r.apply(store).map(|_| ()),
                    Err(s) => return check_status(&s),
                }
            }
        };
        if let Err(e) = applied {
            assert!(
                !caught_by_validation(&e),
                "validation let through a request that fails with {e:?}"
            );
            check_status(&cairn_server::internals::errors::status(&e));
        }
    });
});
