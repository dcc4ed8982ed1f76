//! The Election service: etcd's `concurrency.Election` served (Campaign, Proclaim, Leader,
//! Observe, Resign).

use std::sync::Arc;

use cairn_engine::{EventKind, WatchRequest, WatchResponse};
use tokio_stream::StreamExt as _;
use tonic::{Request, Response, Status};

use super::{compare_created, contender_key, delete_op, get_op, prefix_of, put_op, range_kvs, top_of, Client, Undo};
use crate::api::convert;
use crate::api::node::Node;
use crate::pb::etcdserverpb as pb;
use crate::pb::v3electionpb::election_server::Election;
use crate::pb::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest, ProclaimResponse,
    ResignRequest, ResignResponse,
};

/// The Election service over a [`Node`].
#[derive(Debug, Clone)]
pub struct ElectionService {
    node: Arc<Node>,
}

impl ElectionService {
    /// The service for `node`.
    pub fn new(node: Arc<Node>) -> ElectionService {
        ElectionService { node }
    }
}

/// etcd's refusal of a Proclaim or Resign without the leader's key.
fn missing_leader() -> Status {
    Status::unknown("\"leader\" field must be provided")
}

/// If `leader`'s key is still the one created at `leader.rev`: `then`. The check Proclaim and
/// Resign make, so that a contender who lost its key cannot touch a successor's.
fn if_still_leader(key: &[u8], rev: i64, then: pb::RequestOp) -> pb::TxnRequest {
    pb::TxnRequest {
        compare: vec![compare_created(key, rev)],
        success: vec![then],
        failure: Vec::new(),
    }
}

/// A leader's key as its holder knows it: the key, the revision it was created at, and the
/// lease it is attached to.
struct Held<'a> {
    key: &'a [u8],
    rev: i64,
    lease: i64,
}

impl ElectionService {
    /// Sets the value of the leader's key if it still leads; "election: not leader" if not.
    async fn proclaim_as(client: &Client, held: Held<'_>, value: bytes::Bytes) -> Result<pb::TxnResponse, Status> {
        let Held { key, rev, lease } = held;
        let answer = client.txn(if_still_leader(key, rev, put_op(key, value, lease))).await?;
        if !answer.succeeded {
            return Err(super::recipe_error("election: not leader"));
        }
        Ok(answer)
    }
}

type Observed = crate::api::ResponseStream<LeaderResponse>;

#[tonic::async_trait]
impl Election for ElectionService {
    /// Writes the caller's key `<name>/<lease>` with `value` (or, if that lease already has
    /// one, proclaims `value` on it), then waits until every key created before it is gone:
    /// the caller leads. A caller that hangs up while waiting resigns.
    async fn campaign(&self, request: Request<CampaignRequest>) -> Result<Response<CampaignResponse>, Status> {
        let client = Client::of(&self.node, &request);
        let CampaignRequest { name, lease, value } = request.into_inner();
        let lease = client.session_lease(lease).await?;
        let prefix = prefix_of(&name);
        let key = contender_key(&prefix, lease);
        let enter = pb::TxnRequest {
            compare: vec![compare_created(&key, 0)],
            success: vec![put_op(&key, value.clone(), lease)],
            failure: vec![get_op(&key)],
        };
        let answer = client.txn(enter).await?;
        let mut rev = answer.header.as_ref().map_or(0, |h| h.revision);
        let resign = |rev| Undo::new(&client, if_still_leader(&key, rev, delete_op(&key)));
        if !answer.succeeded {
            let existing = range_kvs(&answer, 0).first().cloned().unwrap_or_default();
            rev = existing.create_revision;
            if existing.value != value {
                let held = Held { key: &key, rev, lease };
                if let Err(e) = Self::proclaim_as(&client, held, value.clone()).await {
                    resign(rev).now().await;
                    return Err(e);
                }
            }
        }
        let undo = resign(rev);
        match client.wait_deletes(&prefix, rev - 1).await {
            Ok(()) => undo.disarm(),
            Err(e) => {
                // etcd resigns only when the caller went away, which drops this future (and
                // `undo` with it); an error of the wait itself leaves the key.
                undo.disarm();
                return Err(e);
            }
        }
        Ok(Response::new(CampaignResponse {
            header: answer.header,
            leader: Some(LeaderKey {
                name,
                key: key.into(),
                rev,
                lease,
            }),
        }))
    }

    /// Sets a new value on the leader's key, if the caller still leads.
    async fn proclaim(&self, request: Request<ProclaimRequest>) -> Result<Response<ProclaimResponse>, Status> {
        let client = Client::of(&self.node, &request);
        let ProclaimRequest { leader, value } = request.into_inner();
        let leader = leader.ok_or_else(missing_leader)?;
        let lease = client.session_lease(leader.lease).await?;
        let held = Held {
            key: &leader.key,
            rev: leader.rev,
            lease,
        };
        let answer = Self::proclaim_as(&client, held, value).await?;
        Ok(Response::new(ProclaimResponse { header: answer.header }))
    }

    /// The leader's key-value: the oldest key under the name; "election: no leader" if none.
    async fn leader(&self, request: Request<LeaderRequest>) -> Result<Response<LeaderResponse>, Status> {
        let client = Client::of(&self.node, &request);
        let prefix = prefix_of(&request.into_inner().name);
        let answer = client
            .range(top_of(&prefix, pb::range_request::SortOrder::Ascend))
            .await?;
        let kv = answer
            .kvs
            .into_iter()
            .next()
            .ok_or_else(|| super::recipe_error("election: no leader"))?;
        Ok(Response::new(LeaderResponse {
            header: answer.header,
            kv: Some(kv),
        }))
    }

    type ObserveStream = Observed;

    /// The leader's key-value, then every new value it proclaims; when it goes, the next
    /// leader's (waiting for one if there is none).
    async fn observe(&self, request: Request<LeaderRequest>) -> Result<Response<Observed>, Status> {
        let client = Client::of(&self.node, &request);
        let prefix = prefix_of(&request.into_inner().name);
        let stream = crate::api::async_stream(move |tx| async move {
            tokio::select! {
                () = observe(&client, &prefix, &tx) => {}
                () = tx.closed() => {}
            }
        });
        Ok(Response::new(stream))
    }

    /// Deletes the leader's key, if it is still the one created at `leader.rev`.
    async fn resign(&self, request: Request<ResignRequest>) -> Result<Response<ResignResponse>, Status> {
        let client = Client::of(&self.node, &request);
        let leader = request.into_inner().leader.ok_or_else(missing_leader)?;
        let answer = client
            .txn(if_still_leader(&leader.key, leader.rev, delete_op(&leader.key)))
            .await?;
        Ok(Response::new(ResignResponse { header: answer.header }))
    }
}

/// Feeds `tx` with each leader and each value it proclaims, until a read or a watch fails
/// (the stream then ends, as etcd's does).
async fn observe(client: &Client, prefix: &[u8], tx: &tokio::sync::mpsc::Sender<Result<LeaderResponse, Status>>) {
    let node = &client.node;
    loop {
        let Ok(answer) = client.range(top_of(prefix, pb::range_request::SortOrder::Ascend)).await else {
            return;
        };
        let revision = answer.header.as_ref().map_or(0, |h| h.revision);
        let leader = match answer.kvs.into_iter().next() {
            Some(kv) => LeaderResponse {
                header: answer.header,
                kv: Some(kv),
            },
            // No leader yet: the first key put under the name is the next one.
            None => {
                let Some(kv) = next_put(node, WatchRequest::prefix(prefix), revision).await else {
                    return;
                };
                LeaderResponse {
                    header: Some(node.header(kv.mod_revision)),
                    kv: Some(kv),
                }
            }
        };
        let (key, from) = match &leader.kv {
            Some(kv) => (kv.key.to_vec(), leader.header.as_ref().map_or(0, |h| h.revision) + 1),
            None => return,
        };
        if tx.send(Ok(leader)).await.is_err() {
            return;
        }
        // Its new values, until it is deleted.
        let watch = WatchRequest {
            start_revision: from,
            ..WatchRequest::key(key)
        };
        let Ok(mut watch) = node.engine.watch(&watch) else {
            return;
        };
        'leading: loop {
            let Some(WatchResponse::Events { events, revision }) = watch.next().await else {
                return;
            };
            for event in events.iter() {
                if event.kind == EventKind::Delete {
                    break 'leading;
                }
                let update = LeaderResponse {
                    header: Some(node.header(revision)),
                    kv: Some(convert::kv(event.kv.clone())),
                };
                if tx.send(Ok(update)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The first key-value put into `watch` from `revision` on; `None` if the watch ends.
async fn next_put(node: &Node, watch: WatchRequest, revision: i64) -> Option<crate::pb::mvccpb::KeyValue> {
    let watch = WatchRequest {
        start_revision: revision,
        ..watch
    };
    let mut watch = node.engine.watch(&watch).ok()?;
    loop {
        match watch.next().await? {
            WatchResponse::Events { events, .. } => {
                if let Some(put) = events.iter().find(|e| e.kind == EventKind::Put) {
                    return Some(convert::kv(put.kv.clone()));
                }
            }
            WatchResponse::Compacted { .. } => return None,
            WatchResponse::Progress { .. } => {}
        }
    }
}
