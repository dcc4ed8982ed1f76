//! etcd's Election and Lock services. etcd serves them as a client of its own KV and Lease
//! services (its server wraps the client-side `concurrency` package); cairn does the same
//! with [`Client`], so that these services and the client-side recipes (`concurrency.Mutex`,
//! `concurrency.Election`, `etcdctl lock` and `elect`) write the same keys and see each
//! other's holders and leaders:
//!
//! - a contender's key is `<name>/<lease ID in hex>`, written with that lease;
//! - the contender whose key was created first holds the lock (leads);
//! - a contender waits for every older key to be deleted, one at a time, newest first.
//!
//! Each call acts with its caller's credentials, so auth applies as to any KV call.

pub mod election;
pub mod lock;

use std::sync::Arc;

use cairn_engine::{EventKind, WatchRequest, WatchResponse};
use tokio_stream::StreamExt as _;
use tonic::{Extensions, Request, Status};

use crate::api::kv::KvService;
use crate::api::lease::LeaseService;
use crate::api::node::Node;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::kv_server::Kv as _;
use crate::pb::etcdserverpb::lease_server::Lease as _;
use crate::pb::mvccpb;

/// The TTL of the lease granted for a caller that gives none (etcd's session default). It is
/// not kept alive: the key it holds goes after a minute unless deleted first, as in etcd.
const SESSION_TTL: i64 = 60;

/// The KV and Lease services, called with one caller's metadata (its token) and connection
/// (its certificate).
#[derive(Debug, Clone)]
struct Client {
    node: Arc<Node>,
    metadata: tonic::metadata::MetadataMap,
    extensions: Extensions,
}

impl Client {
    /// A client acting as the caller of `request`.
    fn of<M>(node: &Arc<Node>, request: &Request<M>) -> Client {
        Client {
            node: node.clone(),
            metadata: request.metadata().clone(),
            extensions: request.extensions().clone(),
        }
    }

    fn request<M>(&self, message: M) -> Request<M> {
        Request::from_parts(self.metadata.clone(), self.extensions.clone(), message)
    }

    async fn txn(&self, txn: pb::TxnRequest) -> Result<pb::TxnResponse, Status> {
        let kv = KvService::new(self.node.clone());
        Ok(kv.txn(self.request(txn)).await.map_err(as_client_error)?.into_inner())
    }

    async fn range(&self, range: pb::RangeRequest) -> Result<pb::RangeResponse, Status> {
        let kv = KvService::new(self.node.clone());
        Ok(kv
            .range(self.request(range))
            .await
            .map_err(as_client_error)?
            .into_inner())
    }

    async fn delete(&self, key: bytes::Bytes) -> Result<pb::DeleteRangeResponse, Status> {
        let kv = KvService::new(self.node.clone());
        let delete = pb::DeleteRangeRequest {
            key,
            ..Default::default()
        };
        Ok(kv
            .delete_range(self.request(delete))
            .await
            .map_err(as_client_error)?
            .into_inner())
    }

    /// The lease a contender's key is written with: the caller's, or, for 0, a new one of
    /// [`SESSION_TTL`] seconds.
    async fn session_lease(&self, lease: i64) -> Result<i64, Status> {
        if lease != 0 {
            return Ok(lease);
        }
        let service = LeaseService::new(self.node.clone());
        let grant = pb::LeaseGrantRequest {
            ttl: SESSION_TTL,
            id: 0,
        };
        Ok(service
            .lease_grant(self.request(grant))
            .await
            .map_err(as_client_error)?
            .into_inner()
            .id)
    }

    /// Waits until no key under `prefix` created at or before `max_create_revision` is
    /// left: the newest such key is waited on until deleted, then the next.
    async fn wait_deletes(&self, prefix: &[u8], max_create_revision: i64) -> Result<(), Status> {
        loop {
            let newest = pb::RangeRequest {
                max_create_revision,
                ..top_of(prefix, pb::range_request::SortOrder::Descend)
            };
            let answer = self.range(newest).await?;
            let Some(kv) = answer.kvs.into_iter().next() else {
                return Ok(());
            };
            let revision = answer.header.map_or(0, |h| h.revision);
            self.wait_delete(kv.key.to_vec(), revision).await?;
        }
    }

    /// Waits for `key` to be deleted at or after `revision`.
    async fn wait_delete(&self, key: Vec<u8>, revision: i64) -> Result<(), Status> {
        let watch = WatchRequest {
            start_revision: revision,
            no_put: true,
            ..WatchRequest::key(key)
        };
        let mut watch = self.node.engine.watch(&watch).map_err(|e| crate::errors::status(&e))?;
        while let Some(response) = watch.next().await {
            match response {
                WatchResponse::Events { events, .. } => {
                    if events.iter().any(|e| e.kind == EventKind::Delete) {
                        return Ok(());
                    }
                }
                WatchResponse::Compacted { compact_revision } => {
                    return Err(as_client_error(crate::errors::status(
                        &cairn_engine::Error::Compacted {
                            requested: revision,
                            compacted: compact_revision,
                        },
                    )));
                }
                WatchResponse::Progress { .. } => {}
            }
        }
        Err(Status::unknown("lost watcher waiting for delete"))
    }
}

/// An error of the KV or Lease service as these services return it: etcd's server calls them
/// through its Go client, which turns each of etcd's errors into a plain Go error, so the
/// caller gets gRPC's `Unknown` with etcd's message (for example "etcdserver: requested
/// lease not found").
fn as_client_error(status: Status) -> Status {
    Status::unknown(status.message())
}

/// The oldest (`Ascend`) or newest (`Descend`) key under `prefix` by creation: the leader or
/// holder, or the contender just ahead.
fn top_of(prefix: &[u8], order: pb::range_request::SortOrder) -> pb::RangeRequest {
    pb::RangeRequest {
        key: prefix.to_vec().into(),
        range_end: cairn_engine::prefix_end(prefix).into(),
        limit: 1,
        sort_order: order as i32,
        sort_target: pb::range_request::SortTarget::Create as i32,
        ..Default::default()
    }
}

/// A contender's key: `<prefix><lease ID in hex>`, as etcd's recipes name it.
fn contender_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

/// `<name>/`: where the contenders for `name` keep their keys.
fn prefix_of(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

fn compare_created(key: &[u8], revision: i64) -> pb::Compare {
    pb::Compare {
        result: pb::compare::CompareResult::Equal as i32,
        target: pb::compare::CompareTarget::Create as i32,
        key: key.to_vec().into(),
        target_union: Some(pb::compare::TargetUnion::CreateRevision(revision)),
        ..Default::default()
    }
}

fn put_op(key: &[u8], value: bytes::Bytes, lease: i64) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
            key: key.to_vec().into(),
            value,
            lease,
            ..Default::default()
        })),
    }
}

fn range_op(range: pb::RangeRequest) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestRange(range)),
    }
}

fn get_op(key: &[u8]) -> pb::RequestOp {
    range_op(pb::RangeRequest {
        key: key.to_vec().into(),
        ..Default::default()
    })
}

fn delete_op(key: &[u8]) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(pb::request_op::Request::RequestDeleteRange(pb::DeleteRangeRequest {
            key: key.to_vec().into(),
            ..Default::default()
        })),
    }
}

/// The key-values of a txn's `index`th response, if it was a range.
fn range_kvs(txn: &pb::TxnResponse, index: usize) -> &[mvccpb::KeyValue] {
    match txn.responses.get(index).and_then(|r| r.response.as_ref()) {
        Some(pb::response_op::Response::ResponseRange(range)) => &range.kvs,
        _ => &[],
    }
}

/// etcd's errors from its `concurrency` package, which its server returns as they are:
/// gRPC's `Unknown` with the package's text.
fn recipe_error(text: &'static str) -> Status {
    Status::unknown(text)
}

/// Undoes a contender's key if the call waiting on it goes away (the client hung up or timed
/// out), as etcd's recipes do when their context ends: the undo (a txn) runs on its own task,
/// since the call's future is being dropped.
struct Undo {
    client: Option<Client>,
    txn: pb::TxnRequest,
}

impl Undo {
    fn new(client: &Client, txn: pb::TxnRequest) -> Undo {
        Undo {
            client: Some(client.clone()),
            txn,
        }
    }

    /// Runs the undo now, on the call's own task.
    async fn now(mut self) {
        if let Some(client) = self.client.take() {
            if let Err(e) = client.txn(std::mem::take(&mut self.txn)).await {
                tracing::warn!(error = %e.message(), "cannot withdraw a contender's key");
            }
        }
    }

    /// The call finished: nothing to undo.
    fn disarm(mut self) {
        self.client = None;
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            let txn = std::mem::take(&mut self.txn);
            tokio::spawn(async move {
                if let Err(e) = client.txn(txn).await {
                    tracing::warn!(error = %e.message(), "cannot withdraw a contender's key");
                }
            });
        }
    }
}
