//! Snapshots: the complete state as a stream, written and read in bounded memory.
//!
//! ```text
//! "CAIRNSNP" | format version u32 LE (6; 5, with alarms without their member, and 4, without
//!              the auth store either, are read too)
//! frames:    kind u32 LE | body length u32 LE | crc32 of the body u32 LE | body
//!   1 meta     postcard of (applied index and term, membership with attributes, recent request IDs,
//!              revision, compacted revision, leases, alarms with their members, auth store),
//!              then, once the members have agreed versions, postcard of them (a trailer that
//!              readers from before versions ignore, as in `crate::checkpoint`)
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
use std::path::PathBuf;

use crate::backend::record::{self, Record};
use crate::backend::{Backend, FileMaker};
use crate::consensus::interface::StagedState;
use crate::consensus::{Membership, RecentRequests};
use crate::error::{Error, Failure, Result};
use crate::format::state::versions_trailer;
use crate::lease::lessor::LeaseRecord;
use crate::lease::lessor::Lessor;
use crate::mvcc::store::Store;
use crate::request::Alarm;
use crate::revision::Revision;
use crate::version::ClusterVersions;

const MAGIC: &[u8; 8] = b"CAIRNSNP";
const VERSION: u32 = 6;
/// The version before alarms had a member: its meta is version 6's with each alarm alone.
const VERSION_NO_MEMBER: u32 = 5;
/// The version before the auth store: its meta is version 5's without the last field.
const VERSION_NO_AUTH: u32 = 4;
const META: u32 = 1;
const RECORDS: u32 = 2;
const END: u32 = 3;
/// Frames are written well below this; a longer one is damage, not data.
const MAX_FRAME: u32 = 256 << 20;

/// Everything in a snapshot besides the records.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    #[serde(with = "crate::format::state::alarms")]
    pub(crate) alarms: Vec<(u64, Alarm)>,
    /// Users, roles and permissions.
    #[serde(with = "crate::format::state::auth_store")]
    pub(crate) auth: crate::auth::AuthStore,
    /// The agreed versions: the meta's trailer, not one of its fields.
    #[serde(skip)]
    pub(crate) versions: ClusterVersions,
}

/// A version 5 meta: [`SnapshotMeta`] with alarms that have no member (read as member 0's).
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct SnapshotMetaV5 {
    applied_index: u64,
    applied_term: u64,
    membership: Membership,
    recent: RecentRequests,
    current: i64,
    compacted: i64,
    leases: Vec<LeaseRecord>,
    #[serde(with = "crate::format::state::alarms_without_member")]
    alarms: Vec<(u64, Alarm)>,
    #[serde(with = "crate::format::state::auth_store")]
    auth: crate::auth::AuthStore,
}

impl From<SnapshotMetaV5> for SnapshotMeta {
    fn from(v5: SnapshotMetaV5) -> SnapshotMeta {
        SnapshotMeta {
            applied_index: v5.applied_index,
            applied_term: v5.applied_term,
            membership: v5.membership,
            recent: v5.recent,
            current: v5.current,
            compacted: v5.compacted,
            leases: v5.leases,
            alarms: v5.alarms,
            auth: v5.auth,
            versions: ClusterVersions::default(),
        }
    }
}

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
        header.extend_from_slice(&VERSION.to_le_bytes());
        w.out.write_all(&header).map_err(write_error)?;
        w.written += header.len() as u64;
        let encode_error = |e| Error::Snapshot(Failure::caused_by("encode", e));
        let body = postcard::to_allocvec(meta)
            .and_then(|body| versions_trailer::append(body, &meta.versions))
            .map_err(encode_error)?;
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
    let version = header.get(8..).and_then(|v| v.try_into().ok()).map(u32::from_le_bytes);
    let without_auth = version == Some(VERSION_NO_AUTH);
    if ![Some(VERSION), Some(VERSION_NO_MEMBER), Some(VERSION_NO_AUTH)].contains(&version) {
        return Err(Error::Snapshot(Failure::new("unknown snapshot format version")));
    }
    let mut body = Vec::new();
    if read_frame(input, &mut body)? != META {
        return Err(Error::Snapshot(Failure::new("the meta frame is missing")));
    }
    if without_auth {
        // postcard writes fields one after another: an empty auth store appended makes it a
        // version 5 meta.
        body.extend_from_slice(&crate::format::state::auth_store::empty());
    }
    let meta = if version == Some(VERSION) {
        versions_trailer::split::<SnapshotMeta>(&body).map(|(mut meta, versions)| {
            meta.versions = versions;
            meta
        })
    } else {
        postcard::from_bytes::<SnapshotMetaV5>(&body).map(SnapshotMeta::from)
    };
    let meta = meta.map_err(|e| Error::Snapshot(Failure::caused_by("meta", e)))?;
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

/// Deletes files a staged state made; they are named by no checkpoint, so a failure only
/// leaves them for the next open to delete.
fn remove_files(paths: &[PathBuf]) {
    for path in paths {
        if let Err(e) = std::fs::remove_file(path) {
            tracing::warn!(file = %path.display(), error = %e, "cannot remove a staged data file");
        }
    }
}

/// A state received from the leader, in data files beside the live ones, waiting to replace
/// the live state. Dropped without being taken, it deletes its files.
pub(crate) struct Staged {
    /// Boxed: a staged state travels through channels whose other messages are small.
    parts: Option<Box<(Store, Lessor, SnapshotMeta)>>,
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staged").field("index", &self.index()).finish()
    }
}

impl Staged {
    /// Reads a snapshot stream into new files that `maker` creates, and rebuilds the state it
    /// holds (its leases into `lessor`), without touching the live state. Nothing is left
    /// behind on failure.
    pub(crate) fn read(data: &mut dyn Read, maker: FileMaker, mut lessor: Lessor) -> Result<Staged> {
        let mut backend = Backend::fresh(maker)?;
        let read = read(data, |record| backend.append(&record).map(|_| ()));
        let paths = backend.file_paths();
        let built = read.and_then(|meta| {
            backend.flush()?;
            let store = Store::rebuild(backend, meta.current, meta.compacted)?;
            lessor.load(meta.leases.clone());
            lessor.apply_changes(&store.leased_keys()?);
            Ok((store, meta))
        });
        match built {
            Ok((store, meta)) => Ok(Staged {
                parts: Some(Box::new((store, lessor, meta))),
            }),
            Err(e) => {
                remove_files(&paths);
                Err(e)
            }
        }
    }

    /// The log index the staged state is at (0 once taken).
    pub(crate) fn index(&self) -> u64 {
        self.parts.as_ref().map_or(0, |parts| parts.2.applied_index)
    }

    /// Takes the staged state to install; its files are then the engine's.
    pub(crate) fn take(mut self) -> Option<(Store, Lessor, SnapshotMeta)> {
        self.parts.take().map(|parts| *parts)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(parts) = self.parts.take() {
            let paths = parts.0.file_paths();
            drop(parts);
            remove_files(&paths);
        }
    }
}

impl StagedState for Staged {
    fn index(&self) -> u64 {
        Staged::index(self)
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Engine, PutRequest};
    use bytes::Bytes;
    use std::sync::Arc;

    fn files(dir: &std::path::Path) -> Vec<std::ffi::OsString> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_staged_state_leaves_no_file_behind_unless_taken() {
        let source = tempfile::tempdir().unwrap();
        let engine = Engine::open(source.path(), Config::default()).unwrap();
        for i in 0..50 {
            let put = PutRequest {
                key: format!("k{i}").into_bytes(),
                value: Bytes::from(vec![b'v'; 100]),
                ..PutRequest::default()
            };
            engine.write(put).unwrap();
        }
        let mut stream = Vec::new();
        engine.snapshot(&mut stream).unwrap();
        engine.close().unwrap();

        let live = tempfile::tempdir().unwrap();
        let backend = Backend::open(live.path(), 64 << 10, &[]).unwrap();
        let before = files(live.path());
        let lessor = || Lessor::new(1, Arc::new(crate::clock::ManualClock::default()));
        // Cut short: refused, and the files it began are gone.
        let cut = stream.get(..stream.len() / 2).unwrap();
        let err = Staged::read(&mut &cut[..], backend.maker(), lessor()).unwrap_err();
        assert!(matches!(err, Error::Snapshot(_)), "{err}");
        assert_eq!(files(live.path()), before);
        // Whole: the state is there, beside the live files, until dropped.
        let staged = Staged::read(&mut &stream[..], backend.maker(), lessor()).unwrap();
        assert!(staged.index() > 0);
        assert!(files(live.path()).len() > before.len());
        drop(staged);
        assert_eq!(files(live.path()), before);
        // Taken: the files are the taker's.
        let staged = Staged::read(&mut &stream[..], backend.maker(), lessor()).unwrap();
        let (store, _, meta) = staged.take().unwrap();
        assert_eq!(store.key_count(), 50);
        assert_eq!(meta.current, store.current_revision());
        assert!(files(live.path()).len() > before.len());
    }
}
