//! Snapshots between members: a follower too far behind for the leader's log is sent the
//! engine's state instead of entries.
//!
//! **Leader.** raft-rs asks the [`super::log::RaftLog`] for a snapshot; it answers with
//! metadata only: the index, term and membership the apply thread last published. When the
//! node thread meets the resulting `MsgSnapshot` in a Ready, [`send`] streams the engine's
//! snapshot (the [`crate::snapshot`] format) through an OS pipe into
//! [`Transport::send_snapshot`], on threads of its own, and reports the outcome to raft.
//!
//! **Follower.** [`crate::Inbox::deliver_snapshot`] reads the stream into new data files beside
//! the live ones ([`Staged`]), holding neither the state lock nor the whole snapshot in memory,
//! then hands the message and the staged state to the node thread. If raft accepts the
//! snapshot, the apply thread swaps the staged state in and checkpoints it, and the node thread
//! restarts its log after the snapshot (a WAL truncation past the end). If not, the staged
//! files are deleted.
//!
//! The data may be newer than its metadata (the leader went on applying while it streamed):
//! the follower's state is then ahead of its raft log, and the apply thread skips the entries
//! it holds already.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_channel::Sender;

use super::node::{Input, Transport};
use crate::backend::{Backend, FileMaker};
use crate::error::{Error, Failure, Result};
use crate::lease::lessor::Lessor;
use crate::mvcc::store::Store;
use crate::snapshot::{self, SnapshotMeta};

/// Writes the engine's current state as a snapshot stream; returns its size.
pub(crate) type SnapshotSource = Arc<dyn Fn(&mut dyn std::io::Write) -> Result<u64> + Send + Sync>;

/// Streams a snapshot to member `to` (`message` is raft's `MsgSnapshot`, encoded) on threads
/// of its own, then reports to the node thread whether it arrived.
pub(crate) fn send(
    to: u64,
    message: Bytes,
    source: SnapshotSource,
    transport: Arc<dyn Transport>,
    report: Sender<Input>,
) {
    let failed = report.clone();
    let span = tracing::Span::current();
    let spawned = std::thread::Builder::new()
        .name("cairn-snapshot-send".into())
        .spawn(move || {
            let _span = span.enter();
            let outcome = stream(to, message, source, &*transport);
            match &outcome {
                Ok(size) => tracing::info!(to, bytes = size, "sent a snapshot"),
                Err(e) => tracing::warn!(to, error = %e, "sending a snapshot failed"),
            }
            let _ = report.send(Input::SnapshotSent {
                to,
                delivered: outcome.is_ok(),
            });
        });
    if let Err(e) = spawned {
        tracing::warn!(to, error = %e, "cannot start sending a snapshot");
        let _ = failed.send(Input::SnapshotSent { to, delivered: false });
    }
}

fn stream(to: u64, message: Bytes, source: SnapshotSource, transport: &dyn Transport) -> Result<u64> {
    let (mut reader, mut writer) = std::io::pipe().map_err(|e| Error::Snapshot(Failure::caused_by("pipe", e)))?;
    // The writer end closes when the source returns, which ends the stream.
    let producer = std::thread::Builder::new()
        .name("cairn-snapshot-write".into())
        .spawn({
            let span = tracing::Span::current();
            move || {
                let _span = span.enter();
                source(&mut writer)
            }
        })
        .map_err(|e| Error::Snapshot(Failure::caused_by("spawn the snapshot writer", e)))?;
    let sent = transport.send_snapshot(to, message, &mut reader);
    // A writer still writing sees the pipe closed and stops.
    drop(reader);
    let produced = producer
        .join()
        .map_err(|_| Error::internal("the snapshot writer panicked"))?;
    sent.map_err(|e| Error::Snapshot(Failure::caused_by(format!("to member {to}"), e)))?;
    produced
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
        let read = snapshot::read(data, |record| backend.append(&record).map(|_| ()));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Engine, PutRequest};

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
