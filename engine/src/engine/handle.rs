//! [`Engine`], the handle an application holds: its threads, and how it closes. What it does
//! is in the files named for each of etcd's services (`kv`, `watch`, `leases`, `membership`,
//! `maintenance`), and in `status` and `server`; how it opens, in `open` and `builder`.

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use super::checkpointing::{refresh_saved_index, write_and_release};
use super::core::{Core, Replica};
use crate::error::Result;
use crate::mvcc::saved_index::When;
use crate::thread::{Stoppable, Worker};

/// An open engine. `Engine` is `Send + Sync`: share it between threads.
pub struct Engine {
    pub(super) core: Arc<Core>,
    pub(super) apply_thread: Mutex<Option<Worker<Result<()>>>>,
    /// The lease checker, when leases expire on their own.
    pub(super) checker: Mutex<Option<Stoppable>>,
    pub(super) watch_thread: Mutex<Option<Stoppable>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// The directory the engine lives in.
    pub fn dir(&self) -> &Path {
        &self.core.dir
    }

    /// Stops accepting writes, lets every queued one finish, and syncs the log.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    /// Stops the threads, checkpoints and closes the log. A thread that panicked is the error
    /// (after everything else is done), unless closing failed first.
    fn shutdown(&self) -> Result<()> {
        let mut panicked = Ok(());
        for stopper in [&self.checker, &self.watch_thread] {
            if let Some(thread) = stopper.lock().take() {
                panicked = panicked.and(thread.stop());
            }
        }
        let replica = self.core.replica.lock().take();
        let Some(Replica { node, wal }) = replica else {
            return panicked;
        };
        // The node stops first; the apply thread then applies what it was handed and ends.
        panicked = panicked.and(node.stop());
        if let Some(t) = self.apply_thread.lock().take() {
            panicked = panicked.and(t.join().and_then(|checkpointer| checkpointer));
        }
        // Proposals never committed: their callers get `Closed`.
        self.core.waiters.clear();
        // Everything queued is applied: checkpoint it, so the next open replays nothing, and
        // save the key index, so that it reads few records.
        let encoded = self.core.state.write().checkpoint()?;
        write_and_release(&self.core.dir, &encoded, &wal, &self.core.checkpointing)?;
        let bytes = self.core.checkpointing.saved_index_bytes;
        refresh_saved_index(&self.core.dir, &encoded, When::Closing(bytes));
        match Arc::try_unwrap(wal) {
            Ok(wal) => wal.close()?,
            Err(shared) => {
                shared.sync()?.wait()?;
            }
        }
        panicked
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
