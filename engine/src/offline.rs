//! What is done to a data directory or a snapshot file without an engine running on it:
//! restoring a snapshot into a new directory (cairn's own, or etcd's, with a new membership),
//! and describing a snapshot without restoring it. `cairn snapshot restore` and `cairn
//! snapshot status` are these; a snapshot is taken from a running engine
//! ([`Maintenance::snapshot`](crate::Maintenance::snapshot)).
//!
//! ```
//! use cairn_engine::{offline, Config, Engine};
//!
//! # fn main() -> cairn_engine::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path().join("a"), Config::default())?;
//! engine.put("k", "v")?;
//! let mut snapshot = Vec::new();
//! engine.maintenance().snapshot(&mut snapshot)?;
//! engine.close()?;
//! assert_eq!(offline::status(&mut &snapshot[..])?.keys, 1);
//! offline::restore(&mut &snapshot[..], dir.path().join("b"))?;
//! let restored = Engine::open(dir.path().join("b"), Config::default())?;
//! assert!(restored.get("k")?.is_some());
//! # restored.close()
//! # }
//! ```

use std::collections::HashMap;
use std::path::Path;

use crate::backend::{FileMaker, DATA_DIR};
use crate::config::Config;
use crate::consensus::RecentRequests;
use crate::error::{Error, Failure, Result};
use crate::format::checkpoint::Checkpoint;
use crate::format::snapshot::SnapshotMeta;
use crate::format::{checkpoint, snapshot};
use crate::membership::{MemberAttributes, Membership};
use crate::mvcc::store::StoreMeta;

/// What [`status`] or [`etcd_status`] found in a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotInfo {
    /// The revision it was taken at.
    pub revision: i64,
    /// Its compacted revision.
    pub compact_revision: i64,
    /// The log index it was taken at.
    pub applied_index: u64,
    /// Records of history it holds.
    pub records: u64,
    /// Keys that exist at its revision.
    pub keys: u64,
    /// Leases it holds.
    pub leases: u64,
}

/// Creates the data directory `dir` from a snapshot taken by [`Maintenance::snapshot`](crate::Maintenance::snapshot), in
/// bounded memory; open it with [`Engine::open`](crate::Engine::open) afterwards. Refuses a damaged snapshot,
/// and a directory that already holds an engine.
pub fn restore(snapshot: &mut dyn std::io::Read, dir: impl AsRef<Path>) -> Result<()> {
    restore_with(snapshot, dir.as_ref(), None)
}

/// [`restore`] for the first member of a new cluster made from a snapshot (etcd's
/// `snapshot restore`): the state is the snapshot's, but the group is `members` (each
/// with its attributes), whatever group took the snapshot. Every member of the new
/// cluster is restored from the same snapshot with the same `members`.
pub fn restore_new_cluster(
    snapshot: &mut dyn std::io::Read,
    dir: impl AsRef<Path>,
    members: &std::collections::BTreeMap<u64, MemberAttributes>,
) -> Result<()> {
    if members.is_empty() {
        return Err(Error::InvalidConfig("a new cluster needs at least one member".into()));
    }
    let membership = Membership {
        voters: members.keys().copied().collect(),
        attributes: members.clone(),
        ..Membership::default()
    };
    restore_with(snapshot, dir.as_ref(), Some(membership))
}

/// [`status`] of a snapshot in etcd's format (its SHA-256 trailer
/// checked unless `skip_hash_check`): read whole, page by page, without restoring it.
pub fn etcd_status(path: &Path, skip_hash_check: bool) -> Result<SnapshotInfo> {
    let opened = crate::etcd::import::open(path, skip_hash_check)?;
    let mut alive: foldhash::HashMap<Vec<u8>, bool> = foldhash::HashMap::default();
    let mut records = 0u64;
    let read = crate::etcd::import::read(&opened.db, |record| {
        records += 1;
        alive.insert(record.key.to_vec(), record.version > 0);
        Ok(())
    });
    let imported = opened.checked(read)?;
    Ok(SnapshotInfo {
        revision: imported.current,
        compact_revision: imported.compacted,
        applied_index: 0,
        records,
        keys: alive.values().filter(|a| **a).count() as u64,
        leases: imported.leases.len() as u64,
    })
}

/// The hash `etcdutl snapshot status` prints for an etcd snapshot or member db (a CRC-32C
/// of its buckets' names, keys and values, in order), read page by page; the trailer is
/// not checked.
pub fn etcd_hash(path: &Path) -> Result<u32> {
    let opened = crate::etcd::import::open(path, true)?;
    crate::etcd::import::status_hash(&opened.db)
}

/// Whether the file at `path` is in etcd's own format (a bbolt database: an etcd snapshot
/// or member db) rather than cairn's.
pub fn is_etcd(path: &Path) -> Result<bool> {
    let mut file = std::fs::File::open(path)
        .map_err(|e| Error::Snapshot(Failure::caused_by(format!("read {}", path.display()), e)))?;
    crate::etcd::import::is_etcd_db(&mut file)
}

/// [`restore_new_cluster`] from etcd's own format: a snapshot `etcdctl snapshot
/// save` wrote (etcd 3.4 to 3.7; its SHA-256 trailer must match unless `skip_hash_check`),
/// or a stopped etcd member's `member/snap/db` (which has none: `skip_hash_check`). The
/// whole history since etcd's last compaction comes across with its revisions exactly,
/// and the leases and the auth store with it; the group is `members`, as with
/// `etcdutl snapshot restore`.
pub fn import_etcd(
    snapshot: &Path,
    dir: impl AsRef<Path>,
    members: &std::collections::BTreeMap<u64, MemberAttributes>,
    skip_hash_check: bool,
) -> Result<()> {
    if members.is_empty() {
        return Err(Error::InvalidConfig("a new cluster needs at least one member".into()));
    }
    let opened = crate::etcd::import::open(snapshot, skip_hash_check)?;
    restore_into(dir.as_ref(), |backend| {
        let read = crate::etcd::import::read(&opened.db, |record| backend.append(&record).map(|_| ()));
        let imported = opened.checked(read)?;
        Ok(SnapshotMeta {
            // As etcdutl restores: the members' conf changes are the log so far, term 1.
            applied_index: members.len() as u64,
            applied_term: 1,
            membership: Membership {
                voters: members.keys().copied().collect(),
                attributes: members.clone(),
                ..Membership::default()
            },
            recent: RecentRequests::default(),
            current: imported.current,
            compacted: imported.compacted,
            leases: imported.leases,
            alarms: Vec::new(),
            auth: imported.auth,
            versions: Default::default(),
        })
    })
}

/// Checks a snapshot from end to end and describes it, without restoring it.
pub fn status(snapshot: &mut dyn std::io::Read) -> Result<SnapshotInfo> {
    let mut alive: HashMap<Vec<u8>, bool> = HashMap::new();
    let mut records = 0u64;
    let meta = snapshot::read(snapshot, |record| {
        records += 1;
        alive.insert(record.key.to_vec(), record.version > 0);
        Ok(())
    })?;
    Ok(SnapshotInfo {
        revision: meta.current,
        compact_revision: meta.compacted,
        applied_index: meta.applied_index,
        records,
        keys: alive.values().filter(|a| **a).count() as u64,
        leases: meta.leases.len() as u64,
    })
}

fn restore_with(snapshot: &mut dyn std::io::Read, dir: &Path, membership: Option<Membership>) -> Result<()> {
    restore_into(dir, |backend| {
        let mut meta = snapshot::read(snapshot, |record| backend.append(&record).map(|_| ()))?;
        if let Some(membership) = membership {
            meta.membership = membership;
            // A new cluster's requests are new: nothing to skip.
            meta.recent = RecentRequests::default();
        }
        Ok(meta)
    })
}

/// Restores into `dir` (which must hold no data) the records `fill` appends to a fresh
/// backend, with the state it returns; on failure nothing is left behind.
fn restore_into(dir: &Path, fill: impl FnOnce(&mut crate::backend::Backend) -> Result<SnapshotMeta>) -> Result<()> {
    if checkpoint::in_use(dir) {
        return Err(Error::Snapshot(Failure::new(format!(
            "{} already holds data; restore into a new directory",
            dir.display()
        ))));
    }
    let data_dir = dir.join(DATA_DIR);
    let restored = (|| {
        let mut backend = crate::backend::Backend::open(&data_dir, Config::default().data_file_size, &[])?;
        let meta = fill(&mut backend)?;
        backend.flush()?;
        Ok::<_, Error>((meta, backend.layout()))
    })();
    let (meta, layout) = match restored {
        Ok(done) => done,
        Err(e) => {
            // Nothing names these files yet: leave no half-restored directory behind.
            let _ = std::fs::remove_dir_all(&data_dir);
            return Err(e);
        }
    };
    let c = Checkpoint {
        applied_index: meta.applied_index,
        applied_term: meta.applied_term,
        membership: meta.membership,
        recent: meta.recent,
        epoch: 0,
        store: StoreMeta {
            current: meta.current,
            compacted: meta.compacted,
            layout,
        },
        leases: meta.leases,
        alarms: meta.alarms,
        auth: meta.auth,
        versions: meta.versions,
    };
    FileMaker::sync_files(&data_dir, &c.store.layout)?;
    checkpoint::write_bytes(dir, &checkpoint::encode(&c)?)
}
