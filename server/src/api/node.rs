//! What every gRPC service shares: the engine, this member's identity, the request limits,
//! the one way to run engine calls that block, and the deadline for those that await.

use std::sync::Arc;

use cairn_engine::Engine;
use tonic::Status;

use crate::errors::{IntoStatus, Refusal};
use crate::pb::etcdserverpb::ResponseHeader;

/// How far the applied index may lag behind the committed one before writes are refused with
/// "too many requests" (etcd's `maxGapBetweenApplyAndCommitIndex`).
const MAX_APPLY_LAG: u64 = 5000;

/// The limits etcd's flags set.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// What a request may hold.
    pub request: crate::api::validate::Limits,
    /// `--quota-backend-bytes`, as `Status.dbSizeQuota` reports it.
    pub quota_backend_bytes: u64,
    /// `--warning-apply-duration`: a KV request that takes longer is logged.
    pub slow_request: std::time::Duration,
    /// `--max-learners` and `--strict-reconfig-check`.
    pub reconfig: crate::api::cluster::reconfig::Reconfig,
}

/// A running member, as the services see it.
#[derive(Debug)]
pub struct Node {
    /// The engine (shared with the peer transport and the HTTP endpoints).
    pub engine: Arc<Engine>,
    /// The cluster's ID, in every response header (learned from the cluster by a joining
    /// member).
    pub cluster: Arc<crate::transport::peer::ClusterId>,
    /// This member's ID (its Raft ID).
    pub member_id: u64,
    /// What a request may hold, and the backend quota, from the flags.
    pub limits: Limits,
    /// Where leader-only requests go from a follower.
    pub forward: crate::transport::forward::Forwarder,
    /// How callers are identified (tokens, certificates) and passwords hashed.
    pub access: crate::api::access::Settings,
    /// Bumped by [`watch_leader`] once this member has had no leader for
    /// [`NO_LEADER_TIMEOUTS`] election timeouts in a row, and at each timeout after: streams
    /// that asked for a leader end then.
    pub leaderless: tokio::sync::watch::Sender<u64>,
}

/// Election timeouts in a row without a leader after which streams that asked for one
/// (`hasleader` metadata) are ended with "no leader", as etcd's `maxNoLeaderCnt`. Streams
/// are dearer to reconnect than a request is to refuse, so they are given longer.
pub const NO_LEADER_TIMEOUTS: u32 = 3;

/// Checks every election timeout whether `node` knows a leader, and bumps
/// [`Node::leaderless`] while it has known none for [`NO_LEADER_TIMEOUTS`] of them (etcd's
/// `monitorLeader`). Exits the process once the engine has failed for good (its WAL failed:
/// a full disk, an fsync error), as etcd exits, so that whoever supervises the member starts
/// it again once the cause is gone; what the log took before is durable. Runs until the
/// task is dropped.
pub async fn watch_leader(node: Arc<Node>, election: std::time::Duration) {
    let mut without = 0u32;
    let mut ticks = tokio::time::interval(election);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Some(e) = node.engine.status().failure {
            tracing::error!(
                error = %e,
                "this member can take no more writes until it is started again: exiting (start it again once the cause, a full disk say, is gone)"
            );
            std::process::exit(1);
        }
        without = match node.engine.leader() {
            Some(_) => 0,
            None => without.saturating_add(1),
        };
        if without >= NO_LEADER_TIMEOUTS {
            node.leaderless.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

impl Node {
    /// The header of a response at `revision`.
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster.get(),
            member_id: self.member_id,
            revision,
            raft_term: self.engine.server().term(),
        }
    }

    /// The caller of `request` (see [`crate::api::access::caller`]).
    pub async fn caller<T>(&self, request: &tonic::Request<T>) -> Result<Option<crate::api::access::Caller>, Status> {
        crate::api::access::caller(&self.engine, &self.access, request).await
    }

    /// Whether this member serves a leader-only request itself, or where to send it
    /// ([`crate::transport::forward::Forwarder::route`]).
    pub async fn leader_route(&self) -> Result<crate::transport::forward::Route, Status> {
        self.forward.route(&self.engine, self.member_id).await
    }

    /// The header of a response that reads no revision: the current one.
    pub fn current_header(&self) -> ResponseHeader {
        self.header(self.engine.current_revision())
    }

    /// The header of the Cluster service's answers, which carry no revision in etcd (3.4
    /// to 3.7): membership is not part of the key space.
    pub fn membership_header(&self) -> ResponseHeader {
        self.header(0)
    }

    /// Awaits an engine call that has no deadline of its own (the async read barrier), for at
    /// most the engine's request timeout, and maps its error to etcd's status.
    pub async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = cairn_engine::Result<T>>,
    ) -> Result<T, Status> {
        match tokio::time::timeout(self.engine.server().request_timeout(), call).await {
            Ok(answer) => answer.or_status(),
            Err(_) => Err(crate::errors::status(&cairn_engine::Error::Timeout)),
        }
    }

    /// Awaits a request sent on to the leader for at most the engine's request timeout: a
    /// leader that went away without closing its connection must not leave the client
    /// waiting ("etcdserver: request timed out", as etcd answers).
    pub async fn forwarded<T>(&self, call: impl std::future::Future<Output = Result<T, Status>>) -> Result<T, Status> {
        match tokio::time::timeout(self.engine.server().request_timeout(), call).await {
            Ok(answer) => answer,
            Err(_) => Err(crate::errors::status(&cairn_engine::Error::Timeout)),
        }
    }

    /// Runs `f`, which may block (a ReadIndex round, a proposal, a defragmentation), on the
    /// blocking pool, and maps its error to etcd's status.
    pub async fn blocking<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Engine) -> cairn_engine::Result<T> + Send + 'static,
    ) -> Result<T, Status> {
        let node = self.clone();
        tokio::task::spawn_blocking(move || f(&node.engine).or_status())
            .await
            .map_err(|e| Status::internal(format!("etcdserver: {e}")))?
    }

    /// etcd's check before a write is proposed (after [`crate::api::validate`]): whether applying
    /// keeps up with committing.
    pub fn admit_write(&self) -> Result<(), Status> {
        if self.engine.server().apply_lag() > MAX_APPLY_LAG {
            return Err(Refusal::TooManyRequests.into());
        }
        Ok(())
    }
}
