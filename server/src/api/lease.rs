//! The Lease service: Grant, Revoke, the KeepAlive stream, TimeToLive and Leases.

use std::sync::Arc;

use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::api::access::{self, Need};
use crate::api::node::Node;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::lease_client::LeaseClient;
use crate::pb::etcdserverpb::lease_server::Lease;
use crate::transport::forward::Route;

/// The Lease service over a [`Node`].
#[derive(Debug, Clone)]
pub struct LeaseService {
    node: Arc<Node>,
}

impl LeaseService {
    /// The service for `node`; keep-alives and TTL queries a follower gets go on to the leader.
    pub fn new(node: Arc<Node>) -> LeaseService {
        LeaseService { node }
    }
}

type KeepAliveStream = super::ResponseStream<pb::LeaseKeepAliveResponse>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        let caller = self.node.caller(&request).await?;
        access::authenticated(&self.node.engine, caller.as_ref())?;
        let r = request.into_inner();
        self.node.admit_write()?;
        let applied = self.node.blocking(move |e| e.leases().grant(r.id, r.ttl)).await?;
        Ok(Response::new(pb::LeaseGrantResponse {
            header: Some(self.node.header(applied.revision)),
            id: applied.response.id,
            ttl: applied.response.ttl,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        request: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let caller = self.node.caller(&request).await?;
        let id = request.into_inner().id;
        access::authenticated(&self.node.engine, caller.as_ref())?;
        access::check(&self.node.engine, caller.as_ref(), &[Need::LeaseWrite(id)])?;
        let guard = access::guard(caller.as_ref());
        let applied = self
            .node
            .blocking(move |e| e.server().lease_revoke_as(id, guard))
            .await?;
        Ok(Response::new(pb::LeaseRevokeResponse {
            header: Some(self.node.header(applied.revision)),
        }))
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveStream>, Status> {
        let metadata = request.metadata().clone();
        let extensions = request.extensions().clone();
        let renewing = Renewing {
            requests: request.into_inner(),
            node: self.node.clone(),
            metadata: metadata.clone(),
            extensions,
        };
        // Each renewal is answered as the answers are polled, on the call's own task: a task
        // of its own would cost a hand-off and a wake-up per renewal.
        let answers = futures_util::stream::unfold(Some(renewing), |renewing| async move {
            let mut renewing = renewing?;
            let answer = renewing.next().await?;
            let more = answer.is_ok().then_some(renewing);
            Some((answer, more))
        });
        Ok(Response::new(super::leader_bound(
            &self.node,
            &metadata,
            Box::pin(answers),
        )))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        let caller = self.node.caller(&request).await?;
        let metadata = request.metadata().clone();
        let r = request.into_inner();
        access::authenticated(&self.node.engine, caller.as_ref())?;
        if r.keys {
            access::check(&self.node.engine, caller.as_ref(), &[Need::LeaseRead(r.id)])?;
        }
        // Only the leader's clocks count (a follower's restart on every election).
        if let Route::Leader(channel) = self.node.leader_route().await? {
            return self
                .node
                .forwarded(LeaseClient::new(channel).lease_time_to_live(access::onward(&metadata, r)))
                .await;
        }
        let status = self.node.engine.leases().time_to_live(r.id, r.keys);
        Ok(Response::new(pb::LeaseTimeToLiveResponse {
            header: Some(self.node.current_header()),
            id: r.id,
            ttl: status.ttl,
            granted_ttl: status.granted_ttl,
            keys: status.keys,
        }))
    }

    async fn lease_leases(
        &self,
        request: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        let caller = self.node.caller(&request).await?;
        access::authenticated(&self.node.engine, caller.as_ref())?;
        let ids = self.node.engine.leases().list();
        if access::admin(&self.node.engine, caller.as_ref()).is_err() {
            // etcd: one who is not an admin must be able to read every leased key.
            let needs: Vec<Need<'_>> = ids.iter().map(|id| Need::LeaseRead(*id)).collect();
            access::check(&self.node.engine, caller.as_ref(), &needs)?;
        }
        let leases = ids.into_iter().map(|id| pb::LeaseStatus { id }).collect();
        Ok(Response::new(pb::LeaseLeasesResponse {
            header: Some(self.node.current_header()),
            leases,
        }))
    }
}

/// A KeepAlive stream's requests, and what answering them needs.
struct Renewing {
    requests: Streaming<pb::LeaseKeepAliveRequest>,
    node: Arc<Node>,
    metadata: tonic::metadata::MetadataMap,
    extensions: tonic::Extensions,
}

impl Renewing {
    /// The answer to the next renewal, `None` once the client has sent its last; after an
    /// error the stream ends.
    async fn next(&mut self) -> Option<Result<pb::LeaseKeepAliveResponse, Status>> {
        let id = match self.requests.next().await? {
            Ok(r) => r.id,
            Err(status) => return Some(Err(status)),
        };
        let (node, metadata) = (&self.node, &self.metadata);
        // Each renewal is checked as etcd checks it: by an authenticated caller, an admin or
        // one who may write every key on the lease.
        let renewal = async {
            let caller = access::caller_of(&node.engine, &node.access, metadata, &self.extensions).await?;
            access::authenticated(&node.engine, caller.as_ref())?;
            access::check(&node.engine, caller.as_ref(), &[Need::LeaseWrite(id)])?;
            keep_alive(node, id, metadata).await
        };
        let ttl = match renewal.await {
            Ok(ttl) => ttl,
            // An unknown lease answers TTL 0, as etcd does.
            Err(s) if s.message() == "etcdserver: requested lease not found" => 0,
            Err(s) => return Some(Err(s)),
        };
        Some(Ok(pb::LeaseKeepAliveResponse {
            header: Some(node.current_header()),
            id,
            ttl,
        }))
    }
}

/// Renews lease `id` on the leader: here, or through the leader's own keep-alive stream.
async fn keep_alive(node: &Arc<Node>, id: i64, metadata: &tonic::metadata::MetadataMap) -> Result<i64, Status> {
    match node.leader_route().await? {
        Route::Here => node.bounded(node.engine.leases().keep_alive_async(id)).await,
        Route::Leader(channel) => {
            node.forwarded(async {
                let request = access::onward(metadata, tokio_stream::once(pb::LeaseKeepAliveRequest { id }));
                let mut answers = LeaseClient::new(channel).lease_keep_alive(request).await?.into_inner();
                match answers.next().await {
                    Some(answer) => Ok(answer?.ttl),
                    None => Err(crate::errors::status(&cairn_engine::Error::LeaderChanged)),
                }
            })
            .await
        }
    }
}
