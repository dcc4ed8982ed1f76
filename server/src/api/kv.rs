//! The KV service: Range, RangeStream, Put, DeleteRange, Txn and Compact.

use std::sync::Arc;
use std::time::Instant;

use prost::Message as _;
use tonic::{Request, Response, Status};

use crate::api::access::{self, Caller};
use crate::api::node::Node;
use crate::api::{convert, validate};
use crate::errors::{IntoStatus, Refusal};
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::kv_server::Kv;

/// Keys in a RangeStream's first chunk (etcd 3.7's `initialStreamChunkLimit`).
const FIRST_CHUNK: i64 = 10;

/// The KV service over a [`Node`].
#[derive(Debug, Clone)]
pub struct KvService {
    node: Arc<Node>,
}

impl KvService {
    /// The service for `node`: writes are checked against `node.limits` (request size, txn
    /// operations) before they are proposed.
    pub fn new(node: Arc<Node>) -> KvService {
        KvService { node }
    }
}

type RangeStream = super::ResponseStream<pb::RangeStreamResponse>;

/// A request validated and permitted for its caller.
struct Admitted<R> {
    request: R,
    caller: Option<Caller>,
    metadata: tonic::metadata::MetadataMap,
}

impl KvService {
    /// Validates `request` (before its caller is looked at, as etcd does), then checks that
    /// its caller may do what `needs` says it needs.
    async fn admit<M, R>(
        &self,
        request: Request<M>,
        validate: impl FnOnce(M) -> Result<R, Status>,
        needs: for<'a> fn(&'a R, &mut access::Needs<'a>),
    ) -> Result<Admitted<R>, Status> {
        let (metadata, extensions, message) = request.into_parts();
        let request = validate(message)?;
        let node = &self.node;
        let caller = access::caller_of(&node.engine, &node.access, &metadata, &extensions).await?;
        let mut wanted = access::Needs::new();
        needs(&request, &mut wanted);
        access::check(&node.engine, caller.as_ref(), &wanted)?;
        drop(wanted);
        Ok(Admitted {
            request,
            caller,
            metadata,
        })
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(&self, request: Request<pb::RangeRequest>) -> Result<Response<pb::RangeResponse>, Status> {
        let started = Instant::now();
        let Admitted { request, .. } = self.admit(request, validate::range, access::range_needs).await?;
        if !request.serializable && self.node.engine.server().is_learner() {
            return Err(Refusal::NotForLearner.into());
        }
        let at_past_revision = request.revision > 0;
        // A serializable read only takes the state's read lock; a linearizable one first awaits
        // the read barrier (a ReadIndex round), without holding a thread.
        let answer = self
            .node
            .bounded(self.node.engine.server().range_async(&request))
            .await?;
        let header = self
            .node
            .header(header_revision(&self.node, answer.revision, at_past_revision));
        let request = Summary::Range {
            key_size: request.key.len(),
            count: answer.count,
        };
        warn_if_slow(&self.node, started, request, answer.revision);
        Ok(Response::new(convert::range_response(answer, header)))
    }

    type RangeStreamStream = RangeStream;

    async fn range_stream(&self, request: Request<pb::RangeRequest>) -> Result<Response<RangeStream>, Status> {
        let Admitted { request, metadata, .. } = self.admit(request, validate::range, access::range_needs).await?;
        // etcd 3.7 streams the orders a Range reads in without sorting everything first: an
        // order left unset (whatever the target; each chunk is then sorted on its own) or
        // ascending keys.
        let chunkable = request.sort_order == cairn_engine::SortOrder::None
            || (request.sort_target == cairn_engine::SortTarget::Key
                && request.sort_order == cairn_engine::SortOrder::Ascend);
        if !chunkable {
            return Err(Refusal::StreamSort.into());
        }
        let filtered = [
            request.min_mod_revision,
            request.max_mod_revision,
            request.min_create_revision,
            request.max_create_revision,
        ]
        .iter()
        .any(|r| *r != 0);
        if filtered {
            return Err(Refusal::StreamFilters.into());
        }
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let node = self.node.clone();
        tokio::task::spawn_blocking(move || stream_range(&node, request, &tx));
        let stream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        Ok(Response::new(super::leader_bound(&self.node, &metadata, stream)))
    }

    async fn put(&self, request: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        let started = Instant::now();
        let limits = &self.node.limits.request;
        let Admitted { request, caller, .. } = self
            .admit(request, |m| validate::put(m, limits), access::put_needs)
            .await?;
        self.node.admit_write()?;
        let summary = Summary::Put {
            key_size: request.key.len(),
            value_size: request.value.len(),
        };
        let guard = access::guard(caller.as_ref());
        let pending = self.node.engine.server().write_async_as(request, guard).or_status()?;
        let applied = pending.await.or_status()?;
        let header = self.node.header(applied.revision);
        warn_if_slow(&self.node, started, summary, applied.revision);
        Ok(Response::new(convert::put_response(applied.response, header)))
    }

    async fn delete_range(
        &self,
        request: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        let started = Instant::now();
        let limits = &self.node.limits.request;
        let Admitted { request, caller, .. } = self
            .admit(request, |m| validate::delete_range(m, limits), access::delete_needs)
            .await?;
        self.node.admit_write()?;
        let summary = Summary::DeleteRange {
            key_size: request.key.len(),
        };
        let guard = access::guard(caller.as_ref());
        let pending = self.node.engine.server().write_async_as(request, guard).or_status()?;
        let applied = pending.await.or_status()?;
        let header = self.node.header(applied.revision);
        warn_if_slow(&self.node, started, summary, applied.revision);
        Ok(Response::new(convert::delete_response(applied.response, header)))
    }

    async fn txn(&self, request: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        let started = Instant::now();
        let limits = &self.node.limits.request;
        let Admitted { request, caller, .. } = self
            .admit(request, |m| validate::txn(m, limits), access::txn_needs)
            .await?;
        let summary = Summary::Txn {
            compares: request.compare.len(),
            success: request.success.len(),
            failure: request.failure.len(),
        };
        if request.is_read_only() {
            // Served from this member's state after the read barrier, as etcd does, not logged.
            let applied = self
                .node
                .bounded(self.node.engine.server().read_txn_async(&request))
                .await?;
            let header = self.node.header(applied.revision);
            warn_if_slow(&self.node, started, summary, applied.revision);
            return Ok(Response::new(convert::txn_response(applied.response, header)));
        }
        self.node.admit_write()?;
        let guard = access::guard(caller.as_ref());
        let pending = self.node.engine.server().write_async_as(request, guard).or_status()?;
        let applied = pending.await.or_status()?;
        let header = self.node.header(applied.revision);
        warn_if_slow(&self.node, started, summary, applied.revision);
        Ok(Response::new(convert::txn_response(applied.response, header)))
    }

    async fn compact(
        &self,
        request: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        let caller = self.node.caller(&request).await?;
        access::admin(&self.node.engine, caller.as_ref())?;
        let request = request.into_inner();
        let applied = self
            .node
            .blocking(move |e| {
                let applied = e.compact(request.revision)?;
                if request.physical {
                    e.maintenance().wait_compacted()?;
                }
                Ok(applied)
            })
            .await?;
        Ok(Response::new(pb::CompactionResponse {
            header: Some(self.node.header(applied.revision)),
        }))
    }
}

/// What a slow request's warning says about it: sizes and counts, gathered without copying
/// the request.
#[derive(Debug)]
enum Summary {
    Range {
        key_size: usize,
        count: i64,
    },
    Put {
        key_size: usize,
        value_size: usize,
    },
    DeleteRange {
        key_size: usize,
    },
    Txn {
        compares: usize,
        success: usize,
        failure: usize,
    },
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Summary::Range { key_size, count } => write!(f, "read-only range key_size:{key_size} count:{count}"),
            Summary::Put { key_size, value_size } => write!(f, "put key_size:{key_size} value_size:{value_size}"),
            Summary::DeleteRange { key_size } => write!(f, "delete_range key_size:{key_size}"),
            Summary::Txn {
                compares,
                success,
                failure,
            } => write!(f, "txn compare:{compares} success:{success} failure:{failure}"),
        }
    }
}

/// Logs a request that took longer than `--warning-apply-duration` from its arrival to its
/// answer, as etcd's "apply request took too long" (etcd times the apply step of a write;
/// cairn times what the client waited, the log round included).
fn warn_if_slow(node: &Node, started: Instant, request: Summary, revision: i64) {
    let took = started.elapsed();
    if took > node.limits.slow_request {
        tracing::warn!(
            took = ?took,
            expected_duration = ?node.limits.slow_request,
            request = %request,
            revision,
            "apply request took too long"
        );
    }
}

/// The revision a range answer's header carries: etcd's is the store's current revision, also
/// for a read at a past revision (the revision a read at the current one was served at).
fn header_revision(node: &Node, served_at: i64, at_past_revision: bool) -> i64 {
    if at_past_revision {
        node.engine.current_revision().max(served_at)
    } else {
        served_at
    }
}

/// Streams a range as etcd 3.7 does: in chunks of keys at one revision (the first chunk's,
/// pinned for the rest), every chunk carrying its keys and the last also the header, the
/// count and `more`, so merging every chunk gives the answer of one Range. The first chunk
/// holds [`FIRST_CHUNK`] keys; each next one twice as many while a chunk encodes to less
/// than half of `--max-request-bytes`, half as many once one passes twice that. A negative
/// limit is etcd's "no limit at all": one message.
fn stream_range(
    node: &Node,
    request: cairn_engine::RangeRequest,
    tx: &tokio::sync::mpsc::Sender<Result<pb::RangeStreamResponse, Status>>,
) {
    let send = |r: Result<pb::RangeResponse, Status>| {
        let message = r.map(|range| pb::RangeStreamResponse {
            range_response: Some(range),
        });
        tx.blocking_send(message).is_ok()
    };
    let total_limit = if request.limit > 0 { request.limit } else { i64::MAX };
    let target = i64::try_from(node.limits.request.max_request_bytes).unwrap_or(i64::MAX);
    let mut chunk = cairn_engine::RangeRequest {
        limit: if request.limit < 0 {
            0
        } else {
            FIRST_CHUNK.min(total_limit)
        },
        ..request.clone()
    };
    let mut sent = 0i64;
    // The header's revision, from the first chunk's read.
    let mut first: Option<i64> = None;
    loop {
        let answer = match node.engine.range(&chunk) {
            Ok(answer) => answer,
            Err(e) => {
                send(Err(crate::errors::status(&e)));
                return;
            }
        };
        let header_rev = *first.get_or_insert_with(|| header_revision(node, answer.revision, request.revision > 0));
        sent += answer.kvs.len() as i64;
        let next = answer.kvs.last().map(|kv| {
            let mut k = kv.key.to_vec();
            k.push(0);
            k
        });
        let last = !answer.more || sent >= total_limit || next.is_none();
        let mut message = pb::RangeResponse {
            kvs: answer.kvs.into_iter().map(convert::kv).collect(),
            ..pb::RangeResponse::default()
        };
        if last {
            // etcd's count: the keys sent, and those after the last one sent when a limit cut
            // the stream short. (The same as the range's count, but where an unset order with
            // another target sorted a chunk so that its last key is not its largest.)
            let mut count = if request.count_only { answer.count } else { sent };
            if answer.more {
                let rest = cairn_engine::RangeRequest {
                    key: next.clone().unwrap_or_default(),
                    revision: answer.revision,
                    serializable: true,
                    count_only: true,
                    limit: 0,
                    ..request.clone()
                };
                match node.engine.range(&rest) {
                    Ok(rest) => count += rest.count,
                    Err(e) => {
                        send(Err(crate::errors::status(&e)));
                        return;
                    }
                }
            }
            message.header = Some(node.header(header_rev));
            message.count = count;
            message.more = answer.more;
            send(Ok(message));
            return;
        }
        // What etcd sizes the next chunk by: this one as a whole Range answer (measured with
        // those fields set, then sent without them).
        message.header = Some(node.header(answer.revision));
        message.more = true;
        message.count = chunk.limit + 1;
        let size = i64::try_from(message.encoded_len()).unwrap_or(i64::MAX);
        message.header = None;
        message.more = false;
        message.count = 0;
        if !send(Ok(message)) {
            return;
        }
        chunk.limit = next_chunk_limit(chunk.limit, size, target).min(total_limit - sent);
        // The next chunk reads the same revision, locally: the first chunk's read was the
        // linearizable one.
        chunk.revision = answer.revision;
        chunk.serializable = true;
        chunk.key = next.unwrap_or_default();
    }
}

/// etcd 3.7's chunk sizing: a chunk of `limit` keys that encoded to `size` bytes is followed
/// by one of twice as many keys if it was under half of `target` (`--max-request-bytes`),
/// half as many (at least one) if it was over twice `target`, else as many.
fn next_chunk_limit(limit: i64, size: i64, target: i64) -> i64 {
    if size < target / 2 {
        limit.saturating_mul(2)
    } else if size > target.saturating_mul(2) {
        (limit / 2).max(1)
    } else {
        limit
    }
}

#[cfg(test)]
mod tests {
    use super::next_chunk_limit;

    /// etcd 3.7 (`v3_server.go`): 10 keys first, doubling under half the request limit,
    /// halving over twice it.
    #[test]
    fn chunks_grow_while_small_and_shrink_when_large() {
        let target = 1_572_864;
        assert_eq!(next_chunk_limit(10, 1_000, target), 20);
        assert_eq!(next_chunk_limit(20, 786_431, target), 40);
        assert_eq!(next_chunk_limit(40, 786_432, target), 40);
        assert_eq!(next_chunk_limit(40, 3_145_728, target), 40);
        assert_eq!(next_chunk_limit(40, 3_145_729, target), 20);
        assert_eq!(next_chunk_limit(1, 10_000_000, target), 1);
    }
}
