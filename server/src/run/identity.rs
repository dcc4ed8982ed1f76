//! Who this member is: its ID and its cluster's, recorded, derived from the flags, or asked of
//! the peers by a member joining a running cluster.

use std::time::Duration;

use crate::transport::tls::Connector;

use super::error::ServeError;
use super::plan::Plan;

/// How long a member joining an existing cluster keeps asking its peers who it is.
pub(super) const JOIN_PATIENCE: Duration = Duration::from_secs(30);

/// This member's ID and its cluster's: recorded in `member_dir` once known; derived from the
/// flags for a new cluster's member; asked of the peers by a member joining an existing one.
pub(super) async fn identity(plan: &Plan, member_dir: &std::path::Path) -> Result<(u64, u64), ServeError> {
    use crate::transport::peer::{discover, load_cluster_id, load_member_id, store_cluster_id, store_member_id};
    let write_error = |e: std::io::Error| ServeError::Other(format!("cannot write to {}: {e}", member_dir.display()));
    if let Some(cluster) = load_cluster_id(member_dir) {
        return Ok((load_member_id(member_dir).unwrap_or(plan.member_id), cluster));
    }
    if !plan.join_existing {
        store_cluster_id(member_dir, plan.cluster_id).map_err(write_error)?;
        return Ok((plan.member_id, plan.cluster_id));
    }
    let others: Vec<String> = plan
        .initial_peers
        .iter()
        .filter(|(id, _)| *id != plan.member_id)
        .flat_map(|(_, urls)| urls.iter().cloned())
        .collect();
    let mine = plan
        .initial_peers
        .iter()
        .find(|(id, _)| *id == plan.member_id)
        .map(|(_, urls)| urls.clone())
        .unwrap_or_default();
    let connector = Connector::new(plan.peer_tls.clone());
    let (member, cluster) = discover(&connector, &others, &mine, JOIN_PATIENCE)
        .await
        .map_err(|e| ServeError::Other(format!("cannot join the existing cluster: {e}")))?;
    tracing::info!(
        member = format_args!("{member:x}"),
        cluster = format_args!("{cluster:x}"),
        "joining the existing cluster"
    );
    store_member_id(member_dir, member).map_err(write_error)?;
    store_cluster_id(member_dir, cluster).map_err(write_error)?;
    Ok((member, cluster))
}
