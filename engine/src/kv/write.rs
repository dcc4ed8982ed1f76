//! A write's way into the log ([`WriteRequest`]): one of etcd's write requests, checked where
//! it entered ([`WriteRequest::check`]: by `Engine::write`, or by the server's edge), then
//! held to the quota for what it adds, guarded by the auth revision it was permitted at, and
//! proposed; its answer comes back as a [`Pending`].

use crate::engine::core::Core;
use crate::engine::propose::{guarded, Applied, Pending};
use crate::error::{Error, Result};
use crate::kv::txn::{DeleteRangeRequest, PutRequest, TxnRequest};

/// Logs `request`, checked already where it entered ([`WriteRequest::check`]), permitted at
/// auth revision `guard` if any (refused with [`crate::AuthError::OldRevision`] if the auth
/// store changed before it is applied).
pub(crate) fn write<W: WriteRequest>(
    core: &Core,
    request: W,
    guard: Option<u64>,
) -> Result<Pending<Applied<W::Response>>> {
    if let Err(over) = request.quota(core) {
        return over.pending();
    }
    let rx = core.submit(guarded(request.into_request(), guard))?;
    Ok(Pending::new(rx, |(response, revision)| match W::answer(response) {
        Ok(response) => Ok(Applied { response, revision }),
        Err(other) => Err(Error::internal(format!("a write answered with {other:?}"))),
    }))
}

/// One of etcd's write requests, for [`Engine::write`](crate::Engine::write): [`PutRequest`],
/// [`DeleteRangeRequest`] or [`TxnRequest`] (sealed).
pub trait WriteRequest: sealed::Write {
    /// Checks the request on its own, as etcd does before proposing it: keys given, the put
    /// flags that exclude each other, at most `max_txn_ops` operations in a txn's lists, no key
    /// written twice in a branch. `Engine::write` checks what it is given; a server checks
    /// at its own edge, before it looks at permissions, as etcd does.
    fn check(&self, max_txn_ops: usize) -> Result<()> {
        self.check_alone(max_txn_ops)
    }
}

impl WriteRequest for PutRequest {}
impl WriteRequest for DeleteRangeRequest {}
impl WriteRequest for TxnRequest {}

// The supertrait makes the engine's own types reachable from a public trait, but nothing outside
// the crate can name it, so none can implement or call it.
#[allow(private_interfaces)]
pub(crate) mod sealed {
    use crate::engine::core::Core;
    use crate::engine::propose::OverQuota;
    use crate::error::Result;
    use crate::kv::txn::{DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, TxnRequest, TxnResponse};
    use crate::request::{Request, Response};

    /// What [`Engine::write`](crate::Engine::write) does with each kind of request.
    pub trait Write: Sized {
        /// What applying it answers.
        type Response: Unpin;
        /// See [`super::WriteRequest::check`].
        fn check_alone(&self, max_txn_ops: usize) -> Result<()>;
        /// Refuses it if what it adds would pass the quota.
        fn quota(&self, core: &Core) -> std::result::Result<(), OverQuota>;
        /// The request as logged.
        fn into_request(self) -> Request;
        /// Its answer, or the unexpected one.
        fn answer(response: Response) -> std::result::Result<Self::Response, Response>;
    }

    impl Write for PutRequest {
        type Response = PutResponse;

        fn check_alone(&self, _: usize) -> Result<()> {
            self.validate()
        }

        fn quota(&self, core: &Core) -> std::result::Result<(), OverQuota> {
            core.check_quota(crate::mvcc::store::record_size(self.key.len(), self.value.len()))
        }

        fn into_request(self) -> Request {
            Request::Put(self)
        }

        fn answer(response: Response) -> std::result::Result<PutResponse, Response> {
            match response {
                Response::Put(r) => Ok(r),
                other => Err(other),
            }
        }
    }

    impl Write for DeleteRangeRequest {
        type Response = DeleteRangeResponse;

        fn check_alone(&self, _: usize) -> Result<()> {
            self.validate()
        }

        fn quota(&self, _: &Core) -> std::result::Result<(), OverQuota> {
            Ok(())
        }

        fn into_request(self) -> Request {
            Request::DeleteRange(self)
        }

        fn answer(response: Response) -> std::result::Result<DeleteRangeResponse, Response> {
            match response {
                Response::DeleteRange(r) => Ok(r),
                other => Err(other),
            }
        }
    }

    impl Write for TxnRequest {
        type Response = TxnResponse;

        fn check_alone(&self, max_txn_ops: usize) -> Result<()> {
            self.validate(max_txn_ops)
        }

        fn quota(&self, core: &Core) -> std::result::Result<(), OverQuota> {
            match self.is_read_only() {
                true => Ok(()),
                false => core.check_quota(self.put_bytes()),
            }
        }

        fn into_request(self) -> Request {
            Request::Txn(self)
        }

        fn answer(response: Response) -> std::result::Result<TxnResponse, Response> {
            match response {
                Response::Txn(r) => Ok(r),
                other => Err(other),
            }
        }
    }
}
