//! The Cluster service: MemberAdd, MemberRemove, MemberUpdate, MemberList and MemberPromote,
//! each change first checked against `--max-learners` and `--strict-reconfig-check`
//! ([`reconfig`]).

pub mod reconfig;

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::api::access;
use crate::api::convert;
use crate::api::node::Node;
use crate::errors::Refusal;
use crate::ids;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::cluster_client::ClusterClient;
use crate::pb::etcdserverpb::cluster_server::Cluster;
use crate::transport::forward::Route;

/// The Cluster service over a [`Node`].
#[derive(Debug, Clone)]
pub struct ClusterService {
    node: Arc<Node>,
    /// `--initial-cluster-token`, which new members' IDs are derived from.
    token: String,
}

impl ClusterService {
    /// The service for `node`; `token` is `--initial-cluster-token`, from which (with the
    /// peer URLs and the time) added members' IDs are derived.
    pub fn new(node: Arc<Node>, token: String) -> ClusterService {
        ClusterService { node, token }
    }

    fn members(&self) -> Vec<pb::Member> {
        self.node
            .engine
            .members()
            .list()
            .into_iter()
            .map(convert::member)
            .collect()
    }

    /// Whether a member other than `except` already has one of `urls` (etcd refuses that).
    fn urls_taken(&self, urls: &[String], except: Option<u64>) -> Result<(), Status> {
        let taken = self
            .node
            .engine
            .members()
            .list()
            .iter()
            .any(|m| Some(m.id) != except && m.peer_urls.iter().any(|u| urls.contains(u)));
        if taken {
            return Err(Refusal::PeerUrlsExist.into());
        }
        Ok(())
    }

    /// Refuses `change` if the cluster's members, as this member (the leader) knows them,
    /// cannot take it.
    fn may(&self, change: reconfig::Change) -> Result<(), Status> {
        let members: Vec<reconfig::Seat> = self.node.engine.members().list().iter().map(Into::into).collect();
        reconfig::check(&members, change, self.node.limits.reconfig)
            .map_err(|refused| Status::failed_precondition(refused.to_string()))
    }

    /// Applies a membership change here; the header and members every answer carries.
    async fn apply_change(
        &self,
        change: impl FnOnce(&cairn_engine::Engine) -> cairn_engine::Result<()> + Send + 'static,
    ) -> Result<(Option<pb::ResponseHeader>, Vec<pb::Member>), Status> {
        self.node.blocking(change).await?;
        Ok((Some(self.node.membership_header()), self.members()))
    }
}

fn check_urls(urls: &[String]) -> Result<(), Status> {
    if urls.is_empty() || !urls.iter().all(|u| crate::config::valid_peer_url(u)) {
        return Err(Refusal::InvalidMemberUrls.into());
    }
    Ok(())
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        request: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        let caller = self.node.caller(&request).await?;
        access::admin(&self.node.engine, caller.as_ref())?;
        let metadata = request.metadata().clone();
        let r = request.into_inner();
        if let Route::Leader(channel) = self.node.leader_route().await? {
            let onward = access::onward(&metadata, r);
            return self
                .node
                .forwarded(ClusterClient::new(channel).member_add(onward))
                .await;
        }
        check_urls(&r.peer_ur_ls)?;
        self.urls_taken(&r.peer_ur_ls, None)?;
        self.may(match r.is_learner {
            true => reconfig::Change::AddLearner,
            false => reconfig::Change::AddVoter,
        })?;
        let id = ids::member_id(&r.peer_ur_ls, &self.token, Some(now_secs()));
        let (urls, learner) = (r.peer_ur_ls.clone(), r.is_learner);
        self.node
            .blocking(move |e| {
                if learner {
                    e.members().add_learner(id, urls)
                } else {
                    e.members().add(id, urls)
                }
            })
            .await?;
        Ok(Response::new(pb::MemberAddResponse {
            header: Some(self.node.membership_header()),
            member: Some(pb::Member {
                id,
                peer_ur_ls: r.peer_ur_ls,
                is_learner: r.is_learner,
                ..pb::Member::default()
            }),
            members: self.members(),
        }))
    }

    async fn member_remove(
        &self,
        request: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        let caller = self.node.caller(&request).await?;
        access::admin(&self.node.engine, caller.as_ref())?;
        let metadata = request.metadata().clone();
        let r = request.into_inner();
        if let Route::Leader(channel) = self.node.leader_route().await? {
            let onward = access::onward(&metadata, r);
            return self
                .node
                .forwarded(ClusterClient::new(channel).member_remove(onward))
                .await;
        }
        self.may(reconfig::Change::Remove(r.id))?;
        let (header, members) = self.apply_change(move |e| e.members().remove(r.id)).await?;
        Ok(Response::new(pb::MemberRemoveResponse { header, members }))
    }

    async fn member_update(
        &self,
        request: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        let caller = self.node.caller(&request).await?;
        access::admin(&self.node.engine, caller.as_ref())?;
        let r = request.into_inner();
        check_urls(&r.peer_ur_ls)?;
        self.urls_taken(&r.peer_ur_ls, Some(r.id))?;
        let (header, members) = self
            .apply_change(move |e| e.members().update(r.id, r.peer_ur_ls))
            .await?;
        Ok(Response::new(pb::MemberUpdateResponse { header, members }))
    }

    async fn member_list(
        &self,
        request: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        if request.into_inner().linearizable {
            // Everything committed before the request is applied here first.
            self.node.blocking(|e| e.read_barrier()).await?;
        }
        Ok(Response::new(pb::MemberListResponse {
            header: Some(self.node.membership_header()),
            members: self.members(),
        }))
    }

    async fn member_promote(
        &self,
        request: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        let caller = self.node.caller(&request).await?;
        access::admin(&self.node.engine, caller.as_ref())?;
        let metadata = request.metadata().clone();
        let r = request.into_inner();
        if let Route::Leader(channel) = self.node.leader_route().await? {
            let onward = access::onward(&metadata, r);
            return self
                .node
                .forwarded(ClusterClient::new(channel).member_promote(onward))
                .await;
        }
        self.may(reconfig::Change::Promote(r.id))?;
        let (header, members) = self.apply_change(move |e| e.members().promote(r.id)).await?;
        Ok(Response::new(pb::MemberPromoteResponse { header, members }))
    }
}
