//! Checkpoints: the applied log index and the state it describes, in one small file.
//!
//! Opening loads the checkpoint, then replays only the log entries after its applied index;
//! segments of the log wholly below it are released. The applied index and the state are
//! written together, never separately, so a crash can never pair a state with the wrong
//! position in the log (the mistake behind etcd 3.5's data-inconsistency bug).
//!
//! ```text
//! offset  size  field
//! 0       8     magic "CAIRNCKP"
//! 8       4     format version, u32 LE (7; 6, with alarms without their member, and 5,
//!               without the auth store either, are read too)
//! 12      4     crc32 of the body, u32 LE
//! 16      8     body length, u64 LE
//! 24      len   body: postcard of (applied index and term, membership with each member's
//!               attributes, recent request IDs,
//!               layout epoch, store meta, leases, alarms with their members, auth store),
//!               then, once the members have agreed versions, postcard of the agreed versions
//! ```
//!
//! The agreed versions (`crate::version`) trail the body: a reader from before them (0.1)
//! decodes the fields it knows and ignores the rest, which is how a downgraded member opens
//! this checkpoint. Absent, they are the defaults (nothing agreed). A trailer holds only what
//! an older reader can do without; anything it must understand is a new format version.
//!
//! The store meta is the revision, the compacted revision and the data files' layout (each
//! file's id and length, in order); the records themselves are in the data files, which are
//! fsynced before the checkpoint naming them is written. The layout epoch counts
//! defragmentations: of two checkpoints at the same applied index, the later layout wins.
//!
//! Crash safety: written to `checkpoint.tmp`, fsynced, renamed over `checkpoint`, and the
//! directory fsynced; a crash leaves the old checkpoint or the new one, whole. A checkpoint
//! that fails its checks is an error, never silently ignored (the log before it may be gone).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

use crate::consensus::{Membership, RecentRequests};
use crate::error::{Error, Failure, Result};
use crate::format::state::versions_trailer;
use crate::lease::lessor::LeaseRecord;
use crate::mvcc::store::StoreMeta;
use crate::request::Alarm;
use crate::version::ClusterVersions;

const MAGIC: &[u8; 8] = b"CAIRNCKP";
const VERSION: u32 = 7;
/// The version before alarms had a member: its body is version 7's with each alarm alone.
const VERSION_NO_MEMBER: u32 = 6;
/// The version before the auth store: its body is version 6's without the last field.
const VERSION_NO_AUTH: u32 = 5;
const HEADER_LEN: usize = 24;
const NAME: &str = "checkpoint";
const TMP_NAME: &str = "checkpoint.tmp";

/// What a checkpoint holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Checkpoint {
    pub(crate) applied_index: u64,
    /// The term of the entry at `applied_index` (the Raft log's "snapshot" term).
    pub(crate) applied_term: u64,
    /// The group's membership at `applied_index`.
    pub(crate) membership: Membership,
    /// The last request IDs applied.
    pub(crate) recent: RecentRequests,
    /// Defragmentations so far (see the module docs).
    pub(crate) epoch: u64,
    pub(crate) store: StoreMeta,
    pub(crate) leases: Vec<LeaseRecord>,
    /// The raised alarms, with the member each was raised for.
    #[serde(with = "crate::format::state::alarms")]
    pub(crate) alarms: Vec<(u64, Alarm)>,
    /// Users, roles and permissions (its permission cache is rebuilt on load).
    #[serde(with = "crate::format::state::auth_store")]
    pub(crate) auth: crate::auth::AuthStore,
    /// The agreed versions: the body's trailer, not one of its fields.
    #[serde(skip)]
    pub(crate) versions: ClusterVersions,
}

/// A version 6 body: [`Checkpoint`] with alarms that have no member (read as member 0's).
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct CheckpointV6 {
    applied_index: u64,
    applied_term: u64,
    membership: Membership,
    recent: RecentRequests,
    epoch: u64,
    store: StoreMeta,
    leases: Vec<LeaseRecord>,
    #[serde(with = "crate::format::state::alarms_without_member")]
    alarms: Vec<(u64, Alarm)>,
    #[serde(with = "crate::format::state::auth_store")]
    auth: crate::auth::AuthStore,
}

impl From<CheckpointV6> for Checkpoint {
    fn from(v6: CheckpointV6) -> Checkpoint {
        Checkpoint {
            applied_index: v6.applied_index,
            applied_term: v6.applied_term,
            membership: v6.membership,
            recent: v6.recent,
            epoch: v6.epoch,
            store: v6.store,
            leases: v6.leases,
            alarms: v6.alarms,
            auth: v6.auth,
            versions: ClusterVersions::default(),
        }
    }
}

impl Checkpoint {
    /// Which of two checkpoints is newer.
    pub(crate) fn order(&self) -> (u64, u64) {
        (self.applied_index, self.epoch)
    }
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::Checkpoint(Failure::caused_by(what, e))
}

/// The checkpoint's bytes: header and body.
pub(crate) fn encode(checkpoint: &Checkpoint) -> Result<Vec<u8>> {
    let encode_error = |e| Error::Checkpoint(Failure::caused_by("encode", e));
    let body = postcard::to_allocvec(checkpoint)
        .and_then(|body| versions_trailer::append(body, &checkpoint.versions))
        .map_err(encode_error)?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes and verifies checkpoint bytes; `what` names them in errors.
pub(crate) fn decode(bytes: &[u8], what: &str) -> Result<Checkpoint> {
    let bad = |why: &str| Error::Checkpoint(Failure::new(format!("{what} is damaged: {why}")));
    let header = bytes.get(..HEADER_LEN).ok_or_else(|| bad("shorter than its header"))?;
    if header.get(..8) != Some(&MAGIC[..]) {
        return Err(bad("bad magic"));
    }
    let u32_at = |at: usize| {
        header
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    let version = u32_at(8);
    if ![Some(VERSION), Some(VERSION_NO_MEMBER), Some(VERSION_NO_AUTH)].contains(&version) {
        return Err(bad("unknown format version"));
    }
    let crc = u32_at(12).unwrap_or_default();
    let len = header
        .get(16..24)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or_default();
    let body = usize::try_from(len)
        .ok()
        .and_then(|len| bytes.get(HEADER_LEN..HEADER_LEN.checked_add(len)?))
        .ok_or_else(|| bad("body cut short"))?;
    if crc32fast::hash(body) != crc {
        return Err(bad("checksum mismatch"));
    }
    if version == Some(VERSION) {
        let (mut checkpoint, versions) =
            versions_trailer::split::<Checkpoint>(body).map_err(|e| bad(&e.to_string()))?;
        checkpoint.versions = versions;
        return Ok(checkpoint);
    }
    let mut v6 = body.to_vec();
    if version == Some(VERSION_NO_AUTH) {
        // postcard writes fields one after another: an empty auth store appended makes it a
        // version 6 body.
        v6.extend_from_slice(&crate::format::state::auth_store::empty());
    }
    postcard::from_bytes::<CheckpointV6>(&v6)
        .map(Checkpoint::from)
        .map_err(|e| bad(&e.to_string()))
}

/// Writes checkpoint bytes into `dir` atomically and durably.
pub(crate) fn write_bytes(dir: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(TMP_NAME);
    let mut file = std::os::unix::fs::OpenOptionsExt::mode(&mut OpenOptions::new(), 0o600)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(io("create checkpoint.tmp"))?;
    file.write_all(bytes).map_err(io("write checkpoint"))?;
    file.sync_all().map_err(io("fsync checkpoint"))?;
    fs::rename(&tmp, dir.join(NAME)).map_err(io("rename checkpoint"))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync the data dir"))?;
    Ok(())
}

/// Loads the checkpoint of `dir`, if there is one.
pub(crate) fn read(dir: &Path) -> Result<Option<Checkpoint>> {
    let mut file = match File::open(dir.join(NAME)) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("open checkpoint")(e)),
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io("read checkpoint"))?;
    decode(&bytes, &format!("checkpoint in {}", dir.display())).map(Some)
}

/// Whether `dir` holds an engine already (a checkpoint or a log).
pub(crate) fn in_use(dir: &Path) -> bool {
    dir.join(NAME).exists() || dir.join("wal").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Version 6 and 5 bodies, from a checkpoint: alarms without their member, and (5)
    /// without the auth store.
    fn older(c: &Checkpoint) -> (Vec<u8>, Vec<u8>) {
        let v6 = CheckpointV6 {
            applied_index: c.applied_index,
            applied_term: c.applied_term,
            membership: c.membership.clone(),
            recent: c.recent.clone(),
            epoch: c.epoch,
            store: c.store.clone(),
            leases: c.leases.clone(),
            alarms: c.alarms.clone(),
            auth: c.auth.clone(),
        };
        let framed = |version: u32, body: &[u8]| {
            let mut out = Vec::new();
            out.extend_from_slice(MAGIC);
            out.extend_from_slice(&version.to_le_bytes());
            out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
            out.extend_from_slice(&(body.len() as u64).to_le_bytes());
            out.extend_from_slice(body);
            out
        };
        let body = postcard::to_allocvec(&v6).unwrap();
        // Version 5: the same body without its last field, the (empty) auth store.
        let empty_auth = crate::format::state::auth_store::empty();
        let v5 = framed(VERSION_NO_AUTH, &body[..body.len() - empty_auth.len()]);
        (framed(VERSION_NO_MEMBER, &body), v5)
    }

    #[test]
    fn alarms_keep_their_member() {
        let mut c = sample();
        c.alarms = vec![(0, Alarm::NoSpace), (0x8e9e_05c5_2164_694d, Alarm::Corrupt)];
        assert_eq!(decode(&encode(&c).unwrap(), "v7").unwrap(), c);
    }

    #[test]
    fn a_checkpoint_from_before_the_auth_store_opens_with_auth_empty() {
        let c = sample();
        let v7 = encode(&c).unwrap();
        let (v6, v5) = older(&c);
        assert_eq!(decode(&v5, "v5").unwrap(), c);
        assert_eq!(decode(&v6, "v6").unwrap(), c);
        assert_eq!(decode(&v7, "v7").unwrap(), c);
        let mut v4 = v5.clone();
        v4[8] = 4;
        assert!(decode(&v4, "v4").is_err());
    }

    /// A checkpoint whose alarms older versions could hold (member 0's, as they are read).
    fn sample() -> Checkpoint {
        Checkpoint {
            applied_index: 7,
            applied_term: 2,
            membership: Membership::default(),
            recent: RecentRequests::default(),
            epoch: 1,
            store: StoreMeta {
                current: 5,
                compacted: 1,
                layout: Vec::new(),
            },
            leases: Vec::new(),
            alarms: vec![(0, Alarm::NoSpace)],
            auth: crate::auth::AuthStore::default(),
            versions: ClusterVersions::default(),
        }
    }

    #[test]
    fn the_agreed_versions_trail_the_body_where_an_older_reader_ignores_them() {
        use crate::version::Version;
        let plain = sample();
        let mut agreed = sample();
        agreed.versions = ClusterVersions {
            cluster: Some(Version::new(0, 2)),
            downgrade: Some(Version::new(0, 1)),
        };
        // Nothing agreed: the same bytes as before versions existed.
        let plain_bytes = encode(&plain).unwrap();
        let body = |bytes: &[u8]| bytes[HEADER_LEN..].to_vec();
        assert_eq!(body(&plain_bytes), postcard::to_allocvec(&plain).unwrap());
        // Agreed: read back whole.
        let agreed_bytes = encode(&agreed).unwrap();
        assert_eq!(decode(&agreed_bytes, "v7").unwrap(), agreed);
        // A reader from before versions (0.1 reads the body with postcard::from_bytes, which
        // leaves trailing bytes alone) gets every other field.
        let old_reader: Checkpoint = postcard::from_bytes(&body(&agreed_bytes)).unwrap();
        assert_eq!(old_reader, plain);
        // A damaged trailer is damage, not defaults.
        let mut cut = agreed_bytes.clone();
        let last = cut.len() - 1;
        cut[last] = 0xff;
        let crc = crc32fast::hash(&cut[HEADER_LEN..]);
        cut[12..16].copy_from_slice(&crc.to_le_bytes());
        assert!(decode(&cut, "v7").is_err());
    }
}
