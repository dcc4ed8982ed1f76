//! Preallocation ahead of need: a helper thread keeps one zero-filled, fsynced segment file
//! ready under a temporary name, so rotating to a new segment never waits for fallocate.
//!
//! Crash safety: a `*.tmp` file is never part of the log; recovery deletes it. The writer
//! writes the header into it, syncs it, and only then renames it into place.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver};

use crate::error::{Error, Result};
use crate::fs::{FileSystem, WalFile};
use crate::segment::tmp_name;

type Prepared = std::io::Result<(PathBuf, Box<dyn WalFile>)>;

pub(crate) struct Pipeline {
    rx: Option<Receiver<Prepared>>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pipeline").finish_non_exhaustive()
    }
}

fn prepare(fs: &dyn FileSystem, dir: &Path, n: u64, size: u64) -> Prepared {
    let path = dir.join(tmp_name(n));
    let file = fs.create(&path)?;
    file.preallocate(size)?;
    Ok((path, file))
}

impl Pipeline {
    pub(crate) fn start(fs: Arc<dyn FileSystem>, dir: PathBuf, size: u64) -> Result<Pipeline> {
        // A rendezvous channel: exactly one file is prepared ahead.
        let (tx, rx) = bounded::<Prepared>(0);
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name("cairn-wal-prealloc".into())
            .spawn(move || {
                let _span = span.enter();
                for n in 0u64.. {
                    let prepared = prepare(fs.as_ref(), &dir, n, size);
                    let failed = prepared.is_err();
                    if let Err(unsent) = tx.send(prepared) {
                        if let Ok((path, _)) = unsent.into_inner() {
                            let _ = fs.remove(&path);
                        }
                        return;
                    }
                    if failed {
                        return;
                    }
                }
            })
            .map_err(Error::io("spawn preallocation thread"))?;
        Ok(Pipeline {
            rx: Some(rx),
            thread: Some(thread),
        })
    }

    /// The next preallocated file, waiting for it if it is not ready yet.
    pub(crate) fn take(&self) -> std::io::Result<(PathBuf, Box<dyn WalFile>)> {
        match self.rx.as_ref().map(Receiver::recv) {
            Some(Ok(prepared)) => prepared,
            _ => Err(std::io::Error::other(
                "preallocation thread stopped after an earlier failure",
            )),
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        drop(self.rx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
