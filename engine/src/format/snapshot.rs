//! A snapshot: the complete state as a stream, written and read in bounded memory. What it
//! holds besides the records ([`SnapshotMeta`]), and its stream:
//!
//! ```text
//! "CAIRNSNP" | format version u32 LE (6; 5, with alarms without their member, and 4, without
//!              the auth store either, are read too)
//! frames:    kind u32 LE | body length u32 LE | crc32 of the body u32 LE | body
//!   1 meta     postcard of (applied index and term, membership with attributes, recent request IDs,
//!              revision, compacted revision, leases, alarms with their members, auth store),
//!              then, once the members have agreed versions, postcard of them (a trailer that
//!              readers from before versions ignore, as in [`super::checkpoint`])
//!   2 records  data-file records (see `backend::record`), back to back, in revision order
//!   3 end      the number of records, u64 LE
//! ```
//!
//! The meta frame comes first and the end frame last; zero bytes may follow it (padding), but
//! anything else after it, a missing end frame, a bad checksum or a record out of order is
//! refused. The records are those still
//! in history at the snapshot's revision, so restoring rebuilds the same state, HashKV
//! included.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use super::entry;
use super::state::{self, versions_trailer, Auth, Lease, Members, Recent};
use crate::backend::record::{self, Record};
use crate::consensus::RecentRequests;
use crate::error::{Error, Failure, Result};
use crate::lease::lessor::LeaseRecord;
use crate::membership::Membership;
use crate::request::Alarm;
use crate::revision::Revision;
use crate::version::ClusterVersions;

/// Everything in a snapshot besides the records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotMeta {
    pub(crate) applied_index: u64,
    /// The term of the entry at `applied_index`.
    pub(crate) applied_term: u64,
    /// The group's membership then.
    pub(crate) membership: Membership,
    /// The last request IDs applied.
    pub(crate) recent: RecentRequests,
    pub(crate) current: i64,
    pub(crate) compacted: i64,
    pub(crate) leases: Vec<LeaseRecord>,
    /// The raised alarms, with the member each was raised for.
    pub(crate) alarms: Vec<(u64, Alarm)>,
    /// Users, roles and permissions.
    pub(crate) auth: crate::auth::AuthStore,
    /// The agreed versions (a trailer of the meta: see `format::snapshot`).
    pub(crate) versions: ClusterVersions,
}

const MAGIC: &[u8; 8] = b"CAIRNSNP";

/// The snapshot formats: the one written, and the older ones still read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    /// Before the auth store: version 5's meta without its last field.
    V4,
    /// Before alarms had a member: version 6's meta with each alarm alone.
    V5,
    /// Today's: [`MetaV6`], then the agreed versions once there are any.
    V6,
}

impl Version {
    /// The version written.
    const WRITTEN: Version = Version::V6;

    fn number(self) -> u32 {
        match self {
            Version::V4 => 4,
            Version::V5 => 5,
            Version::V6 => 6,
        }
    }

    fn from_number(n: u32) -> Option<Version> {
        [Version::V4, Version::V5, Version::V6]
            .into_iter()
            .find(|v| v.number() == n)
    }
}

/// A snapshot's meta, versions 5 and 6: they differ only in how an alarm is written.
#[derive(Serialize, Deserialize)]
struct Meta<A> {
    applied_index: u64,
    applied_term: u64,
    membership: Members,
    recent: Recent,
    current: i64,
    compacted: i64,
    leases: Vec<Lease>,
    alarms: Vec<A>,
    auth: Auth,
}

/// A version 6 meta: each alarm with its member.
type MetaV6 = Meta<(u64, entry::Alarm)>;

/// A version 5 meta: alarms without their member (read as member 0's).
type MetaV5 = Meta<entry::Alarm>;

impl From<&SnapshotMeta> for MetaV6 {
    fn from(m: &SnapshotMeta) -> MetaV6 {
        Meta {
            applied_index: m.applied_index,
            applied_term: m.applied_term,
            membership: (&m.membership).into(),
            recent: (&m.recent).into(),
            current: m.current,
            compacted: m.compacted,
            leases: m.leases.iter().map(Lease::from).collect(),
            alarms: state::alarms(&m.alarms),
            auth: (&m.auth).into(),
        }
    }
}

impl MetaV6 {
    fn into_meta(self, versions: ClusterVersions) -> SnapshotMeta {
        SnapshotMeta {
            applied_index: self.applied_index,
            applied_term: self.applied_term,
            membership: self.membership.into(),
            recent: self.recent.into(),
            current: self.current,
            compacted: self.compacted,
            leases: self.leases.into_iter().map(Into::into).collect(),
            alarms: state::alarms_from(self.alarms),
            auth: self.auth.into(),
            versions,
        }
    }
}

impl<A> Meta<A> {
    /// The same, with each alarm written as `f` writes it.
    fn map_alarms<B>(self, f: impl FnMut(A) -> B) -> Meta<B> {
        Meta {
            alarms: self.alarms.into_iter().map(f).collect(),
            applied_index: self.applied_index,
            applied_term: self.applied_term,
            membership: self.membership,
            recent: self.recent,
            current: self.current,
            compacted: self.compacted,
            leases: self.leases,
            auth: self.auth,
        }
    }
}

impl From<MetaV5> for MetaV6 {
    fn from(old: MetaV5) -> MetaV6 {
        old.map_alarms(|a| (0, a))
    }
}

/// A meta frame's body.
fn encode_meta(meta: &SnapshotMeta) -> postcard::Result<Vec<u8>> {
    postcard::to_allocvec(&MetaV6::from(meta)).and_then(|body| versions_trailer::append(body, &meta.versions))
}
const META: u32 = 1;
const RECORDS: u32 = 2;
const END: u32 = 3;
/// Frames are written well below this; a longer one is damage, not data.
const MAX_FRAME: u32 = 256 << 20;

fn write_error(e: std::io::Error) -> Error {
    Error::Snapshot(Failure::caused_by("write", e))
}

/// Writes a snapshot frame by frame.
pub(crate) struct SnapshotWriter<'a> {
    out: &'a mut dyn Write,
    written: u64,
    records: u64,
}

impl<'a> SnapshotWriter<'a> {
    /// Writes the header and the meta frame.
    pub(crate) fn new(out: &'a mut dyn Write, meta: &SnapshotMeta) -> Result<SnapshotWriter<'a>> {
        let mut w = SnapshotWriter {
            out,
            written: 0,
            records: 0,
        };
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&Version::WRITTEN.number().to_le_bytes());
        w.out.write_all(&header).map_err(write_error)?;
        w.written += header.len() as u64;
        let encode_error = |e| Error::Snapshot(Failure::caused_by("encode", e));
        let body = encode_meta(meta).map_err(encode_error)?;
        w.frame(META, &body)?;
        Ok(w)
    }

    fn frame(&mut self, kind: u32, body: &[u8]) -> Result<()> {
        let len = u32::try_from(body.len())
            .ok()
            .filter(|l| *l <= MAX_FRAME)
            .ok_or_else(|| Error::Snapshot(Failure::new("frame too large")))?;
        let mut header = [0u8; 12];
        header[..4].copy_from_slice(&kind.to_le_bytes());
        header[4..8].copy_from_slice(&len.to_le_bytes());
        header[8..].copy_from_slice(&crc32fast::hash(body).to_le_bytes());
        self.out.write_all(&header).map_err(write_error)?;
        self.out.write_all(body).map_err(write_error)?;
        self.written += 12 + body.len() as u64;
        Ok(())
    }

    /// Writes encoded records (in revision order, after any written before) as one frame.
    pub(crate) fn records(&mut self, chunk: &crate::mvcc::store::Chunk) -> Result<()> {
        if chunk.count == 0 {
            return Ok(());
        }
        self.records += chunk.count;
        self.frame(RECORDS, &chunk.bytes)
    }

    /// Writes the end frame; returns the snapshot's size in bytes.
    pub(crate) fn finish(mut self) -> Result<u64> {
        let count = self.records.to_le_bytes();
        self.frame(END, &count)?;
        self.out.flush().map_err(write_error)?;
        Ok(self.written)
    }
}

fn read_exact(input: &mut dyn Read, buf: &mut [u8], what: &str) -> Result<()> {
    input.read_exact(buf).map_err(|e| {
        Error::Snapshot(Failure::caused_by(
            format!("{what} (the snapshot is cut short or unreadable)"),
            e,
        ))
    })
}

fn read_frame(input: &mut dyn Read, body: &mut Vec<u8>) -> Result<u32> {
    let mut header = [0u8; 12];
    read_exact(input, &mut header, "frame header")?;
    let word = |at: usize| {
        header
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_le_bytes)
    };
    let (kind, len, crc) = (word(0), word(4), word(8));
    if len > MAX_FRAME {
        return Err(Error::Snapshot(Failure::new(format!(
            "frame of {len} bytes is too large: damaged"
        ))));
    }
    body.resize(len as usize, 0);
    read_exact(input, body, "frame body")?;
    if crc32fast::hash(body) != crc {
        return Err(Error::Snapshot(Failure::new("frame checksum mismatch: damaged")));
    }
    Ok(kind)
}

/// Reads and verifies a snapshot, handing each record to `each` in order; returns its meta.
pub(crate) fn read(input: &mut dyn Read, mut each: impl FnMut(Record<'_>) -> Result<()>) -> Result<SnapshotMeta> {
    let mut header = [0u8; 12];
    read_exact(input, &mut header, "header")?;
    if &header[..8] != MAGIC {
        return Err(Error::Snapshot(Failure::new(
            "not a snapshot: neither cairn's format nor etcd's (bad magic)",
        )));
    }
    let version = header
        .get(8..)
        .and_then(|v| v.try_into().ok())
        .map(u32::from_le_bytes)
        .and_then(Version::from_number)
        .ok_or_else(|| Error::Snapshot(Failure::new("unknown snapshot format version")))?;
    let mut body = Vec::new();
    if read_frame(input, &mut body)? != META {
        return Err(Error::Snapshot(Failure::new("the meta frame is missing")));
    }
    let meta = decode_meta(version, std::mem::take(&mut body))?;
    let mut count = 0u64;
    let mut last: Option<Revision> = None;
    loop {
        match read_frame(input, &mut body)? {
            RECORDS => {
                let mut rest = body.as_slice();
                while !rest.is_empty() {
                    let (record, used) =
                        record::decode(rest).map_err(|e| Error::Snapshot(Failure::caused_by("record", e)))?;
                    if last.is_some_and(|l| record.rev <= l) || record.rev.main > meta.current {
                        return Err(Error::Snapshot(Failure::new(format!(
                            "record {} out of order",
                            record.rev
                        ))));
                    }
                    last = Some(record.rev);
                    each(record)?;
                    count += 1;
                    rest = rest.get(used..).unwrap_or_default();
                }
            }
            END => {
                if body.as_slice() != count.to_le_bytes() {
                    return Err(Error::Snapshot(Failure::new("record count mismatch: damaged")));
                }
                // Zero bytes may pad the stream (to the 512-byte multiple etcd's snapshot files
                // have before their hash); anything else is damage.
                let mut extra = [0u8; 4096];
                loop {
                    let n = input
                        .read(&mut extra)
                        .map_err(|e| Error::Snapshot(Failure::caused_by("read", e)))?;
                    if n == 0 {
                        return Ok(meta);
                    }
                    if extra.get(..n).is_some_and(|b| b.iter().any(|x| *x != 0)) {
                        return Err(Error::Snapshot(Failure::new("data after the end frame")));
                    }
                }
            }
            kind => return Err(Error::Snapshot(Failure::new(format!("unknown frame kind {kind}")))),
        }
    }
}

/// A meta frame's body, as `version` wrote it.
fn decode_meta(version: Version, mut body: Vec<u8>) -> Result<SnapshotMeta> {
    if version == Version::V4 {
        // postcard writes fields one after another: an empty auth store appended makes it a
        // version 5 meta.
        body.extend_from_slice(&state::empty_auth());
    }
    let meta = match version {
        Version::V6 => versions_trailer::split::<MetaV6>(&body).map(|(meta, versions)| meta.into_meta(versions)),
        Version::V4 | Version::V5 => {
            postcard::from_bytes::<MetaV5>(&body).map(|v5| MetaV6::from(v5).into_meta(ClusterVersions::default()))
        }
    };
    meta.map_err(|e| Error::Snapshot(Failure::caused_by("meta", e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The meta frame of `tests/fixtures/format/v7-checkpoint-v6-snapshot/snapshot.cairn`,
    /// which the engine's own types wrote through serde before these mirrors existed, byte for
    /// byte: decoded and encoded again, it is the same.
    #[test]
    fn a_version_6_meta_is_byte_for_byte_what_it_was() {
        let hex: String = include_str!("snapshot_meta_v6.golden").split_whitespace().collect();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let meta = decode_meta(Version::V6, bytes.clone()).unwrap();
        assert!(meta.applied_index > 0 && !meta.membership.attributes.is_empty());
        assert!(meta.auth.revision > 0, "the fixture has users and roles");
        assert_eq!(encode_meta(&meta).unwrap(), bytes);
    }
}
