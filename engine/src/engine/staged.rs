//! A snapshot received from the leader, staged: read into new data files beside the live
//! ones, its state rebuilt, waiting for raft to accept it. The node thread carries it as a
//! [`StagedState`] without knowing what it holds; the apply thread then swaps it in.

use std::io::Read;
use std::path::PathBuf;

use crate::backend::{Backend, FileMaker};
use crate::consensus::interface::StagedState;
use crate::error::Result;
use crate::format::snapshot::read;
use crate::format::snapshot::SnapshotMeta;
use crate::lease::lessor::Lessor;
use crate::mvcc::store::Store;

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
    use crate::error::Error;
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
        engine.maintenance().snapshot(&mut stream).unwrap();
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
