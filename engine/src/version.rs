//! cairn's versions: what a build is, what a cluster has agreed all its members understand, and
//! what the data on disk was written for.
//!
//! - The **release** is the workspace's version (`0.2.0`, say). Members compare release lines,
//!   `major.minor`: patch releases never change what is written.
//! - The **cluster version** is the lowest release line among the members, agreed through the
//!   log (a `ClusterVersion` entry), as etcd's leader publishes its
//!   cluster version. Whatever an older release cannot decode (a new entry kind, a new form of
//!   an entry) is written only once the cluster version allows it: see [`Feature`]. Until then
//!   the old form is written. Releases before 0.2 neither report a version nor know the
//!   agreement; a cluster that has agreed nothing is at [`UNVERSIONED`].
//! - The **storage version** is the cluster version the data directory's last checkpoint was
//!   written at: the forms its state may hold. A build refuses data whose storage version is
//!   above its own release.
//!
//! A **downgrade** (etcd 3.6's `etcdctl downgrade enable`) records a target one release line
//! below the cluster version. The leader then lowers the cluster version to it, so that from
//! that entry on only the target's forms are written, and members can be swapped for the
//! older release one at a time.

use std::fmt;
use std::str::FromStr;

/// This build's release, as Cargo knows it (`0.2.0-dev`, say).
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The release line of builds that report no version: 0.1 and the builds before it.
pub const UNVERSIONED: Version = Version::new(0, 1);

/// A release line: `major.minor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// The major version.
    pub major: u32,
    /// The minor version.
    pub minor: u32,
}

impl Version {
    /// The release line `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Version {
        Version { major, minor }
    }

    /// This build's release line.
    pub fn release() -> Version {
        RELEASE.parse().unwrap_or(UNVERSIONED)
    }

    /// The release line just below this one within its major version (downgrades go one line
    /// at a time, as etcd's do).
    pub fn previous(self) -> Option<Version> {
        self.minor.checked_sub(1).map(|minor| Version::new(self.major, minor))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Why a version string was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a version (major.minor or major.minor.patch): {0:?}")]
pub struct ParseVersionError(String);

impl FromStr for Version {
    type Err = ParseVersionError;

    /// `major.minor`, or a full release (`0.2.0`, `0.2.0-dev`, `v0.2.1`) whose line it takes.
    fn from_str(s: &str) -> Result<Version, ParseVersionError> {
        let bad = || ParseVersionError(s.to_string());
        let core = s.strip_prefix('v').unwrap_or(s);
        let core = core.split(['-', '+']).next().unwrap_or_default();
        let mut parts = core.split('.');
        let number = |p: Option<&str>| p.and_then(|p| p.parse::<u32>().ok().filter(|_| !p.starts_with('+')));
        let major = number(parts.next()).ok_or_else(bad)?;
        let minor = number(parts.next()).ok_or_else(bad)?;
        match parts.next() {
            None => {}
            Some(patch) if patch.parse::<u32>().is_ok() => {}
            Some(_) => return Err(bad()),
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Version { major, minor })
    }
}

/// What an older release cannot decode, each with the release line that first can. Adding a
/// kind of entry, a form of one, or a format version means adding a feature here and writing
/// the old form while [`ClusterVersions::allows`] says no (docs/design.md, "Versions").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// Alarms logged with the member they are for (`MemberAlarm`). Before, an alarm is logged
    /// without one and is member 0's. 0.1 decodes it, but does not say so: it counts as the
    /// builds before it, which do not.
    MemberAlarm,
    /// The entries that agree the versions themselves (`ClusterVersion`, `Downgrade`).
    Versions,
}

impl Feature {
    /// The first release line that decodes it.
    pub const fn since(self) -> Version {
        match self {
            Feature::MemberAlarm | Feature::Versions => Version::new(0, 2),
        }
    }
}

/// The versions the members have agreed through the log: part of the replicated state, kept
/// in checkpoints and snapshots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterVersions {
    /// The agreed cluster version; `None` before any was agreed ([`UNVERSIONED`]).
    pub cluster: Option<Version>,
    /// The target of a downgrade in progress.
    pub downgrade: Option<Version>,
}

impl ClusterVersions {
    /// The cluster version, [`UNVERSIONED`] before one was agreed.
    pub fn cluster(&self) -> Version {
        self.cluster.unwrap_or(UNVERSIONED)
    }

    /// Whether every member can decode `feature`.
    pub fn allows(&self, feature: Feature) -> bool {
        self.cluster() >= feature.since()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_their_release_line() {
        for (text, want) in [
            ("0.2", Version::new(0, 2)),
            ("0.2.0", Version::new(0, 2)),
            ("0.2.0-dev", Version::new(0, 2)),
            ("v1.4.7", Version::new(1, 4)),
            ("3.5", Version::new(3, 5)),
        ] {
            assert_eq!(text.parse::<Version>(), Ok(want), "{text}");
        }
        for bad in ["", "0", "0.", "a.b", "0.2.x", "0.2.0.1", "-1.2", "0.+2"] {
            assert!(bad.parse::<Version>().is_err(), "{bad}");
        }
        assert_eq!(Version::release(), RELEASE.parse().unwrap());
    }

    #[test]
    fn a_downgrade_goes_one_release_line_down() {
        assert_eq!(Version::new(0, 2).previous(), Some(Version::new(0, 1)));
        assert_eq!(Version::new(3, 6).previous(), Some(Version::new(3, 5)));
        assert_eq!(Version::new(0, 0).previous(), None);
        assert_eq!(Version::new(1, 0).previous(), None);
    }

    #[test]
    fn a_feature_is_allowed_once_the_cluster_version_reaches_it() {
        let mut v = ClusterVersions::default();
        assert_eq!(v.cluster(), UNVERSIONED);
        assert!(!v.allows(Feature::MemberAlarm));
        v.cluster = Some(Version::new(0, 2));
        assert!(v.allows(Feature::MemberAlarm) && v.allows(Feature::Versions));
        v.cluster = Some(Version::new(0, 1));
        assert!(!v.allows(Feature::MemberAlarm));
    }
}
