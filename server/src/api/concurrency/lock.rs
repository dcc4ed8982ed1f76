//! The Lock service: etcd's `concurrency.Mutex` served (Lock, Unlock).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{compare_created, contender_key, delete_op, get_op, prefix_of, put_op, range_kvs, top_of, Client, Undo};
use crate::api::node::Node;
use crate::pb::etcdserverpb as pb;
use crate::pb::v3lockpb::lock_server::Lock;
use crate::pb::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};

/// The Lock service over a [`Node`].
#[derive(Debug, Clone)]
pub struct LockService {
    node: Arc<Node>,
}

impl LockService {
    /// The service for `node`.
    pub fn new(node: Arc<Node>) -> LockService {
        LockService { node }
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    /// Writes the caller's key `<name>/<lease>` (unless that lease already has one there),
    /// then waits until every key created before it is gone. A caller that hangs up while
    /// waiting has its key deleted; one whose key vanished meanwhile (its lease expired) gets
    /// "mutex: session is expired".
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let client = Client::of(&self.node, &request);
        let LockRequest { name, lease } = request.into_inner();
        let lease = client.session_lease(lease).await?;
        let prefix = prefix_of(&name);
        let key = contender_key(&prefix, lease);
        let holder = || super::range_op(top_of(&prefix, pb::range_request::SortOrder::Ascend));
        let acquire = pb::TxnRequest {
            compare: vec![compare_created(&key, 0)],
            success: vec![put_op(&key, bytes::Bytes::new(), lease), holder()],
            failure: vec![get_op(&key), holder()],
        };
        let answer = client.txn(acquire).await?;
        let mine = if answer.succeeded {
            answer.header.as_ref().map_or(0, |h| h.revision)
        } else {
            range_kvs(&answer, 0).first().map_or(0, |kv| kv.create_revision)
        };
        if range_kvs(&answer, 1)
            .first()
            .is_none_or(|owner| owner.create_revision == mine)
        {
            return Ok(Response::new(LockResponse {
                header: answer.header,
                key: key.into(),
            }));
        }
        let unlock = Undo::new(
            &client,
            pb::TxnRequest {
                success: vec![delete_op(&key)],
                ..Default::default()
            },
        );
        if let Err(e) = client.wait_deletes(&prefix, mine - 1).await {
            unlock.now().await;
            return Err(e);
        }
        let got = match client
            .range(pb::RangeRequest {
                key: key.clone().into(),
                ..Default::default()
            })
            .await
        {
            Ok(got) => got,
            Err(e) => {
                unlock.now().await;
                return Err(e);
            }
        };
        unlock.disarm();
        if got.kvs.is_empty() {
            return Err(super::recipe_error("mutex: session is expired"));
        }
        Ok(Response::new(LockResponse {
            header: got.header,
            key: key.into(),
        }))
    }

    /// Deletes the key Lock returned.
    async fn unlock(&self, request: Request<UnlockRequest>) -> Result<Response<UnlockResponse>, Status> {
        let client = Client::of(&self.node, &request);
        let deleted = client.delete(request.into_inner().key).await?;
        Ok(Response::new(UnlockResponse { header: deleted.header }))
    }
}
