//! A checkpoint: what it holds ([`Checkpoint`]), and its file:
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

use serde::{Deserialize, Serialize};

use super::entry;
use super::state::{self, versions_trailer, Auth, Lease, Members, Recent, Store};
use crate::consensus::RecentRequests;
use crate::error::{Error, Failure, Result};
use crate::lease::lessor::LeaseRecord;
use crate::membership::Membership;
use crate::mvcc::store::StoreMeta;
use crate::request::Alarm;
use crate::version::ClusterVersions;

/// What a checkpoint holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub(crate) applied_index: u64,
    /// The term of the entry at `applied_index` (the Raft log's "snapshot" term).
    pub(crate) applied_term: u64,
    /// The group's membership at `applied_index`.
    pub(crate) membership: Membership,
    /// The last request IDs applied.
    pub(crate) recent: RecentRequests,
    /// Defragmentations and installed snapshots so far: of two checkpoints at the same applied index, the later layout wins.
    pub(crate) epoch: u64,
    pub(crate) store: StoreMeta,
    pub(crate) leases: Vec<LeaseRecord>,
    /// The raised alarms, with the member each was raised for.
    pub(crate) alarms: Vec<(u64, Alarm)>,
    /// Users, roles and permissions (its permission cache is rebuilt on load).
    pub(crate) auth: crate::auth::AuthStore,
    /// The agreed versions (a trailer of the body: see `format::checkpoint`).
    pub(crate) versions: ClusterVersions,
}

impl Checkpoint {
    /// Which of two checkpoints is newer.
    pub(crate) fn order(&self) -> (u64, u64) {
        (self.applied_index, self.epoch)
    }
}

const MAGIC: &[u8; 8] = b"CAIRNCKP";
const HEADER_LEN: usize = 24;
const NAME: &str = "checkpoint";
const TMP_NAME: &str = "checkpoint.tmp";

/// The checkpoint formats: the one written, and the older ones still read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    /// Before the auth store: version 6's body without its last field.
    V5,
    /// Before alarms had a member: version 7's body with each alarm alone.
    V6,
    /// Today's: [`BodyV7`], then the agreed versions once there are any.
    V7,
}

impl Version {
    /// The version written.
    const WRITTEN: Version = Version::V7;

    fn number(self) -> u32 {
        match self {
            Version::V5 => 5,
            Version::V6 => 6,
            Version::V7 => 7,
        }
    }

    fn from_number(n: u32) -> Option<Version> {
        [Version::V5, Version::V6, Version::V7]
            .into_iter()
            .find(|v| v.number() == n)
    }
}

/// A checkpoint body, versions 6 and 7: they differ only in how an alarm is written.
#[derive(Serialize, Deserialize)]
struct Body<A> {
    applied_index: u64,
    applied_term: u64,
    membership: Members,
    recent: Recent,
    epoch: u64,
    store: Store,
    leases: Vec<Lease>,
    alarms: Vec<A>,
    auth: Auth,
}

/// A version 7 body: each alarm with its member.
type BodyV7 = Body<(u64, entry::Alarm)>;

/// A version 6 body: alarms without their member (read as member 0's).
type BodyV6 = Body<entry::Alarm>;

impl From<&Checkpoint> for BodyV7 {
    fn from(c: &Checkpoint) -> BodyV7 {
        Body {
            applied_index: c.applied_index,
            applied_term: c.applied_term,
            membership: (&c.membership).into(),
            recent: (&c.recent).into(),
            epoch: c.epoch,
            store: (&c.store).into(),
            leases: c.leases.iter().map(Lease::from).collect(),
            alarms: state::alarms(&c.alarms),
            auth: (&c.auth).into(),
        }
    }
}

impl BodyV7 {
    fn into_checkpoint(self, versions: ClusterVersions) -> Checkpoint {
        Checkpoint {
            applied_index: self.applied_index,
            applied_term: self.applied_term,
            membership: self.membership.into(),
            recent: self.recent.into(),
            epoch: self.epoch,
            store: self.store.into(),
            leases: self.leases.into_iter().map(Into::into).collect(),
            alarms: state::alarms_from(self.alarms),
            auth: self.auth.into(),
            versions,
        }
    }
}

impl<A> Body<A> {
    /// The same, with each alarm written as `f` writes it.
    fn map_alarms<B>(self, f: impl FnMut(A) -> B) -> Body<B> {
        Body {
            alarms: self.alarms.into_iter().map(f).collect(),
            applied_index: self.applied_index,
            applied_term: self.applied_term,
            membership: self.membership,
            recent: self.recent,
            epoch: self.epoch,
            store: self.store,
            leases: self.leases,
            auth: self.auth,
        }
    }
}

impl From<BodyV6> for BodyV7 {
    fn from(old: BodyV6) -> BodyV7 {
        old.map_alarms(|a| (0, a))
    }
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::Checkpoint(Failure::caused_by(what, e))
}

/// The checkpoint's bytes: header and body.
pub(crate) fn encode(checkpoint: &Checkpoint) -> Result<Vec<u8>> {
    let encode_error = |e| Error::Checkpoint(Failure::caused_by("encode", e));
    let body = postcard::to_allocvec(&BodyV7::from(checkpoint))
        .and_then(|body| versions_trailer::append(body, &checkpoint.versions))
        .map_err(encode_error)?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&Version::WRITTEN.number().to_le_bytes());
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
    let version = u32_at(8)
        .and_then(Version::from_number)
        .ok_or_else(|| bad("unknown format version"))?;
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
    if version == Version::V7 {
        let (body, versions) = versions_trailer::split::<BodyV7>(body).map_err(|e| bad(&e.to_string()))?;
        return Ok(body.into_checkpoint(versions));
    }
    let mut v6 = body.to_vec();
    if version == Version::V5 {
        // postcard writes fields one after another: an empty auth store appended makes it a
        // version 6 body.
        v6.extend_from_slice(&state::empty_auth());
    }
    postcard::from_bytes::<BodyV6>(&v6)
        .map(|v6| BodyV7::from(v6).into_checkpoint(ClusterVersions::default()))
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
    use crate::consensus::RecentRequests;
    use crate::membership::Membership;
    use crate::mvcc::store::StoreMeta;
    use crate::request::Alarm;

    /// Version 6 and 5 bodies, from a checkpoint: alarms without their member, and (5)
    /// without the auth store.
    fn older(c: &Checkpoint) -> (Vec<u8>, Vec<u8>) {
        let v6: BodyV6 = BodyV7::from(c).map_alarms(|(_, a)| a);
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
        let empty_auth = state::empty_auth();
        let v5 = framed(Version::V5.number(), &body[..body.len() - empty_auth.len()]);
        (framed(Version::V6.number(), &body), v5)
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
        assert_eq!(
            body(&plain_bytes),
            postcard::to_allocvec(&BodyV7::from(&plain)).unwrap()
        );
        // Agreed: read back whole.
        let agreed_bytes = encode(&agreed).unwrap();
        assert_eq!(decode(&agreed_bytes, "v7").unwrap(), agreed);
        // A reader from before versions (0.1 reads the body with postcard::from_bytes, which
        // leaves trailing bytes alone) gets every other field.
        let old_reader: BodyV7 = postcard::from_bytes(&body(&agreed_bytes)).unwrap();
        assert_eq!(old_reader.into_checkpoint(ClusterVersions::default()), plain);
        // A damaged trailer is damage, not defaults.
        let mut cut = agreed_bytes.clone();
        let last = cut.len() - 1;
        cut[last] = 0xff;
        let crc = crc32fast::hash(&cut[HEADER_LEN..]);
        cut[12..16].copy_from_slice(&crc.to_le_bytes());
        assert!(decode(&cut, "v7").is_err());
    }

    /// The checkpoint of `tests/fixtures/format/v7-checkpoint-v6-snapshot`, which the engine's
    /// own types wrote through serde before these mirrors existed, byte for byte: decoded and
    /// encoded again, it is the same file.
    #[test]
    fn a_version_7_checkpoint_is_byte_for_byte_what_it_was() {
        let hex: String = include_str!("checkpoint_v7.golden").split_whitespace().collect();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let checkpoint = decode(&bytes, "golden").unwrap();
        assert!(checkpoint.applied_index > 0 && !checkpoint.membership.attributes.is_empty());
        assert!(checkpoint.auth.revision > 0, "the fixture has users and roles");
        assert_eq!(encode(&checkpoint).unwrap(), bytes);
    }
}
