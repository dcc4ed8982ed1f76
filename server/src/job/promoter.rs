//! `--auto-promote-learners`: the leader promotes each learner as soon as it is in sync, by
//! etcd's rule for MemberPromote (its log matched up to 90% of the leader's), so a member
//! added as a learner needs no operator to become a voter (etcd #15107, #21611; kubeadm loops
//! on "can only promote a learner member which is in sync with leader" meanwhile).

use std::sync::Arc;
use std::time::Duration;

use cairn_engine::Error;

use crate::api::node::Node;

/// Checks the learners every `every` while this member leads, and promotes those in sync.
pub async fn run(node: Arc<Node>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if node.engine.leader() != Some(node.member_id) {
            continue;
        }
        let learners = node.engine.members().list().into_iter().filter(|m| m.is_learner);
        for learner in learners {
            let (id, engine) = (learner.id, node.engine.clone());
            // A promotion not in sync yet is refused before anything is proposed: asking
            // again on the next tick costs nothing.
            match tokio::task::spawn_blocking(move || engine.members().promote(id)).await {
                Ok(Ok(())) => tracing::info!(
                    member = format_args!("{id:x}"),
                    name = %learner.name,
                    "promoted a learner in sync with the leader (--auto-promote-learners)"
                ),
                Ok(Err(Error::LearnerNotReady | Error::ConfChangePending | Error::NotLeader)) => {}
                Ok(Err(e)) => tracing::warn!(
                    member = format_args!("{id:x}"),
                    error = %e,
                    "cannot promote a learner; will retry"
                ),
                Err(e) => tracing::warn!(error = %e, "the promotion task failed"),
            }
        }
    }
}
