//! Deciding the cluster version, as etcd's leader does (`cairn_engine::version` says what the
//! versions are and what they gate).
//!
//! Every few seconds the leader asks each member its release (the peer service's `Version`;
//! a member before 0.2 answers UNIMPLEMENTED and counts as 0.1). Once every member has
//! answered, the lowest release line is what they all decode:
//!
//! - above the agreed cluster version, it is proposed as the new one (never below 0.2: nothing
//!   needs agreeing before);
//! - below it, a member runs a release older than the cluster's, which cannot decode what the
//!   cluster writes: it is logged, and the cluster version stays (it only goes down through a
//!   downgrade).
//!
//! With a downgrade enabled, the leader lowers the cluster version to its target, and ends the
//! downgrade once every member runs the target's release line ("the cluster has been
//! downgraded", as etcd logs it). A member that cannot be asked leaves the decision to the next
//! round.

use std::sync::Arc;
use std::time::Duration;

use cairn_engine::version::{ClusterVersions, Feature, Version, UNVERSIONED};
use tonic::{Code, Status};

use crate::api::node::Node;
use crate::pb::peer as pb;
use crate::transport::tls::Connector;

/// How often the leader asks until every member has answered once.
const FIRST: Duration = Duration::from_millis(500);

/// What the leader should propose, given the agreed versions and each member's release line
/// (`None` for one that did not answer).
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to change.
    Keep,
    /// Propose this cluster version.
    Set(Version),
    /// Every member runs the downgrade's target: end the downgrade.
    Downgraded,
    /// Some members run a release below the cluster version: they cannot decode what the
    /// cluster writes.
    Behind(Vec<(u64, Version)>),
}

/// The leader's decision (pure: the tests drive it).
pub fn decide(agreed: &ClusterVersions, members: &[(u64, Option<Version>)]) -> Decision {
    if let Some(target) = agreed.downgrade {
        if agreed.cluster() > target {
            return Decision::Set(target);
        }
        let all_there = members.iter().all(|(_, v)| *v == Some(target));
        return if all_there {
            Decision::Downgraded
        } else {
            Decision::Keep
        };
    }
    let cluster = agreed.cluster();
    let behind: Vec<(u64, Version)> = members
        .iter()
        .filter_map(|&(id, v)| v.filter(|v| *v < cluster).map(|v| (id, v)))
        .collect();
    if !behind.is_empty() {
        return Decision::Behind(behind);
    }
    let known: Option<Vec<Version>> = members.iter().map(|(_, v)| *v).collect();
    let Some(lowest) = known.and_then(|k| k.into_iter().min()) else {
        return Decision::Keep;
    };
    if lowest > cluster && lowest >= Feature::Versions.since() {
        return Decision::Set(lowest);
    }
    Decision::Keep
}

/// A member's answer as a release line: UNIMPLEMENTED is a release before 0.2; no answer is
/// `None`.
fn release_line(answer: Result<pb::VersionResponse, Status>) -> Option<Version> {
    match answer {
        Ok(r) => r.release.parse().ok(),
        Err(s) if s.code() == Code::Unimplemented => Some(UNVERSIONED),
        Err(_) => None,
    }
}

/// Every member's release line, this one's included.
async fn ask_members(node: &Node, connector: &Connector) -> Vec<(u64, Option<Version>)> {
    let answers =
        crate::transport::peer::ask_every_peer(&node.engine, node.member_id, connector, |mut client| async move {
            client
                .version(pb::VersionRequest {})
                .await
                .map(tonic::Response::into_inner)
        })
        .await;
    let mut members: Vec<(u64, Option<Version>)> = answers.into_iter().map(|(id, a)| (id, release_line(a))).collect();
    members.push((node.member_id, Some(Version::release())));
    members.sort_unstable();
    members
}

/// The leader's rounds, `every` so often, until the task is dropped. Until a round has found
/// every member answering, they come every [`FIRST`]: a new cluster agrees its version within
/// a second or two of electing its leader.
pub async fn run(node: Arc<Node>, connector: Connector, every: Duration) {
    let mut warned = Vec::new();
    let mut all_answered = false;
    loop {
        tokio::time::sleep(if all_answered { every } else { FIRST.min(every) }).await;
        if node.engine.leader() != Some(node.member_id) {
            continue;
        }
        let members = ask_members(&node, &connector).await;
        all_answered = members.iter().all(|(_, v)| v.is_some());
        let agreed = node.engine.server().versions();
        match decide(&agreed, &members) {
            Decision::Keep => warned.clear(),
            Decision::Set(v) => {
                tracing::info!(from = %agreed.cluster(), to = %v, "setting the cluster version");
                if let Err(s) = node.blocking(move |e| e.server().set_cluster_version(v)).await {
                    tracing::warn!(error = %s.message(), "cannot set the cluster version");
                }
            }
            Decision::Downgraded => {
                tracing::info!(version = %agreed.cluster(), "the cluster has been downgraded");
                if let Err(s) = node.blocking(|e| e.server().set_downgrade(None)).await {
                    tracing::warn!(error = %s.message(), "cannot end the downgrade");
                }
            }
            Decision::Behind(behind) => {
                if behind != warned {
                    for (id, v) in &behind {
                        tracing::error!(
                            member = format_args!("{id:x}"),
                            release = %v,
                            cluster_version = %agreed.cluster(),
                            "a member runs a release below the cluster version and cannot decode what the cluster writes: \
                             upgrade it, or downgrade the cluster first (etcdctl downgrade enable)"
                        );
                    }
                    warned = behind;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V01: Version = Version::new(0, 1);
    const V02: Version = Version::new(0, 2);
    const V03: Version = Version::new(0, 3);

    fn agreed(cluster: Option<Version>, downgrade: Option<Version>) -> ClusterVersions {
        ClusterVersions { cluster, downgrade }
    }

    #[test]
    fn the_cluster_version_rises_to_the_lowest_release_once_all_answered() {
        let none = agreed(None, None);
        assert_eq!(
            decide(&none, &[(1, Some(V02)), (2, Some(V02)), (3, Some(V03))]),
            Decision::Set(V02)
        );
        // A member before 0.2 holds everything at 0.1: nothing to agree.
        assert_eq!(decide(&none, &[(1, Some(V02)), (2, Some(V01))]), Decision::Keep);
        // One member did not answer: no decision.
        assert_eq!(decide(&none, &[(1, Some(V02)), (2, None)]), Decision::Keep);
        let at02 = agreed(Some(V02), None);
        assert_eq!(decide(&at02, &[(1, Some(V03)), (2, Some(V03))]), Decision::Set(V03));
        assert_eq!(decide(&at02, &[(1, Some(V03)), (2, Some(V02))]), Decision::Keep);
    }

    #[test]
    fn a_member_below_the_cluster_version_is_reported_and_nothing_is_lowered() {
        let at02 = agreed(Some(V02), None);
        assert_eq!(
            decide(&at02, &[(1, Some(V02)), (2, Some(V01)), (3, None)]),
            Decision::Behind(vec![(2, V01)])
        );
    }

    #[test]
    fn a_downgrade_lowers_the_cluster_version_then_ends_when_every_member_runs_the_target() {
        let enabled = agreed(Some(V02), Some(V01));
        assert_eq!(decide(&enabled, &[(1, Some(V02)), (2, Some(V02))]), Decision::Set(V01));
        let lowered = agreed(Some(V01), Some(V01));
        assert_eq!(decide(&lowered, &[(1, Some(V01)), (2, Some(V02))]), Decision::Keep);
        assert_eq!(decide(&lowered, &[(1, Some(V01)), (2, None)]), Decision::Keep);
        assert_eq!(
            decide(&lowered, &[(1, Some(V01)), (2, Some(V01))]),
            Decision::Downgraded
        );
    }
}
