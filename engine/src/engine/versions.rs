//! The versions the members agree through the log (`crate::version`): what is agreed, and the
//! proposals that change it. Deciding them (asking every member its release) is the server's:
//! it knows the peers.

use super::handle::Engine;
use crate::version::{Feature, Version};

impl Engine {
    /// A group of one runs one release: its cluster version is that release's line, agreed as
    /// soon as it opens. (A bigger group's is decided by the server's version monitor, which
    /// can ask the peers; an application running one through a [`crate::Transport`] of its
    /// own agrees it with [`crate::ServerHooks::set_cluster_version`].)
    pub(super) fn agree_alone(&self) {
        let release = Version::release();
        let (alone, agreed) = {
            let st = self.core.state.read();
            let m = &st.membership;
            let alone = m.voters == [self.core.member_id] && m.learners.is_empty() && m.voters_outgoing.is_empty();
            (alone, st.versions)
        };
        if alone && agreed.downgrade.is_none() && agreed.cluster() < release && release >= Feature::Versions.since() {
            if let Err(e) = self.server().set_cluster_version(release) {
                tracing::warn!(error = %e, "cannot agree the cluster version of a group of one");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::version::{ClusterVersions, Version};
    use crate::{Alarm, Config, Engine};

    /// The agreed versions are applied, kept across a restart (in the checkpoint and in the
    /// log's replay), and decide the form of what is proposed next.
    #[test]
    fn agreed_versions_survive_a_restart_and_gate_what_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path(), Config::default()).unwrap();
        // A group of one agrees its own release at once.
        assert_eq!(engine.server().versions().cluster(), Version::release());
        engine.server().set_cluster_version(Version::new(0, 1)).unwrap();
        engine.maintenance().alarm_activate(7, Alarm::NoSpace).unwrap();
        // Below 0.2 the alarm is logged without its member: every member holds it as 0's.
        assert_eq!(engine.maintenance().alarms(), vec![(0, Alarm::NoSpace)]);
        engine.maintenance().alarm_disarm(7, Alarm::NoSpace).unwrap();
        assert_eq!(engine.maintenance().alarms(), vec![]);
        engine.server().set_cluster_version(Version::new(0, 2)).unwrap();
        engine.maintenance().alarm_activate(7, Alarm::NoSpace).unwrap();
        assert_eq!(engine.maintenance().alarms(), vec![(7, Alarm::NoSpace)]);
        engine.server().set_downgrade(Some(Version::new(0, 1))).unwrap();
        let agreed = ClusterVersions {
            cluster: Some(Version::new(0, 2)),
            downgrade: Some(Version::new(0, 1)),
        };
        assert_eq!(engine.server().versions(), agreed);
        engine.close().unwrap();
        let engine = Engine::open(dir.path(), Config::default()).unwrap();
        assert_eq!(engine.server().versions(), agreed);
        engine.server().set_cluster_version(Version::new(0, 1)).unwrap();
        engine.server().set_downgrade(None).unwrap();
        engine.maintenance().alarm_disarm(7, Alarm::NoSpace).unwrap();
        engine.maintenance().alarm_activate(9, Alarm::Corrupt).unwrap();
        assert_eq!(engine.maintenance().alarms(), vec![(0, Alarm::Corrupt)]);
        engine.close().unwrap();
        // Reopened alone with no downgrade in progress, it agrees its release again.
        let engine = Engine::open(dir.path(), Config::default()).unwrap();
        assert_eq!(engine.server().versions().cluster(), Version::release());
        assert_eq!(engine.server().versions().downgrade, None);
        engine.close().unwrap();
    }

    /// A data directory whose storage version is above this build's release is refused with
    /// what to do, not misread.
    #[test]
    fn data_from_a_newer_release_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path(), Config::default()).unwrap();
        let newer = Version::new(Version::release().major, Version::release().minor + 1);
        engine.server().set_cluster_version(newer).unwrap();
        engine.close().unwrap();
        let e = Engine::open(dir.path(), Config::default()).unwrap_err().to_string();
        assert!(e.contains("downgrade the cluster"), "{e}");
    }
}
