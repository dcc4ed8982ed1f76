//! Checking a downgrade request as etcd does (`etcdctl downgrade validate|enable`): the
//! target, its form, and whether a downgrade is already in progress. The leader's job
//! (`crate::job::versions`) then carries it out.

use cairn_engine::version::{ClusterVersions, Version, UNVERSIONED};
use tonic::Status;

/// Why a downgrade request is refused: etcd's errors.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// "etcdserver: wrong downgrade target version format".
    Format,
    /// "etcdserver: invalid downgrade target version".
    Target,
    /// "etcdserver: cluster has a downgrade job in progress".
    InProgress,
    /// "etcdserver: no inflight downgrade job".
    NoneInProgress,
}

impl Refusal {
    /// The status etcd answers.
    pub fn status(&self) -> Status {
        match self {
            Refusal::Format => Status::invalid_argument("etcdserver: wrong downgrade target version format"),
            Refusal::Target => Status::invalid_argument("etcdserver: invalid downgrade target version"),
            Refusal::InProgress => Status::failed_precondition("etcdserver: cluster has a downgrade job in progress"),
            Refusal::NoneInProgress => Status::failed_precondition("etcdserver: no inflight downgrade job"),
        }
    }
}

/// etcd's downgrade validation: the target is a version, exactly one release line below the
/// cluster version, and no downgrade is in progress.
pub fn validate(agreed: &ClusterVersions, target: &str) -> Result<Version, Refusal> {
    let target: Version = target.parse().map_err(|_| Refusal::Format)?;
    if agreed.downgrade.is_some() {
        return Err(Refusal::InProgress);
    }
    if agreed.cluster().previous() != Some(target) || target < UNVERSIONED {
        return Err(Refusal::Target);
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V01: Version = Version::new(0, 1);
    const V02: Version = Version::new(0, 2);

    fn agreed(cluster: Option<Version>, downgrade: Option<Version>) -> ClusterVersions {
        ClusterVersions { cluster, downgrade }
    }

    #[test]
    fn a_downgrade_goes_exactly_one_release_line_down() {
        let at02 = agreed(Some(V02), None);
        assert_eq!(validate(&at02, "0.1"), Ok(V01));
        assert_eq!(validate(&at02, "0.1.0"), Ok(V01));
        assert_eq!(validate(&at02, "0.0"), Err(Refusal::Target));
        assert_eq!(validate(&at02, "0.2"), Err(Refusal::Target));
        assert_eq!(validate(&at02, "3.5"), Err(Refusal::Target));
        assert_eq!(validate(&at02, "banana"), Err(Refusal::Format));
        assert_eq!(validate(&agreed(None, None), "0.0"), Err(Refusal::Target));
        assert_eq!(validate(&agreed(Some(V02), Some(V01)), "0.1"), Err(Refusal::InProgress));
    }
}
