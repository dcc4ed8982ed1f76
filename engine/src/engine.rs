//! The embedded engine: a directory holding a durable, revisioned key-value store.
//!
//! A write is validated, encoded as a [`Request`], appended to the WAL at the next log index,
//! and queued for the apply thread. The apply thread takes requests in log order, waits until
//! each is durable (the WAL's group commit makes one fdatasync serve many), applies it to the
//! store, and answers the caller. Reads take the store's read lock and are served
//! concurrently with other reads; a write's answer comes after it is applied, so a read that
//! starts after a write returns sees it.
//!
//! On disk: `<dir>/wal/`, the log of every request. Opening replays it into the in-memory store,
//! so a crash at any point recovers every acknowledged write (and possibly some that were
//! logged but not yet answered). The memory-mapped backend with checkpoints (so that opening
//! does not replay the whole history) comes next; this seam, log then apply in order, is the
//! one Raft will drive.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use cairn_wal::{Durability, LogIndex, Record, Ticket, Wal};
use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::{Mutex, RwLock};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::kv::range::{RangeRequest, RangeResponse};
use crate::kv::txn::{DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, TxnRequest, TxnResponse};
use crate::mvcc::store::{HashKv, Store};
use crate::request::{Request, Response};

/// A response with the store's revision after the request (etcd's `header.revision`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied<T> {
    pub response: T,
    pub revision: i64,
}

type Reply = oneshot::Sender<Result<(Response, i64)>>;

/// A logged request on its way to the apply thread.
struct Proposal {
    request: Request,
    durable: Ticket,
    reply: Reply,
}

/// Assigns log indexes; held while a request is appended and queued, so log order and apply
/// order are the same.
struct Proposer {
    wal: Wal,
    /// The index the next request gets. Invariant: one more than the last logged entry.
    next_index: u64,
    apply_tx: Sender<Proposal>,
}

/// An open engine. `Engine` is `Send + Sync`: share it between threads.
pub struct Engine {
    dir: PathBuf,
    config: Config,
    /// Lock order: `proposer` before `store` (the apply thread takes only `store`).
    proposer: Mutex<Option<Proposer>>,
    store: Arc<RwLock<Store>>,
    apply_thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// Applies one request to the store; its errors are the request's answer, not the engine's.
fn apply(store: &mut Store, request: &Request, max_txn_ops: usize) -> Result<(Response, i64)> {
    match request {
        Request::Put(p) => p.apply(store).map(|(r, rev)| (Response::Put(r), rev)),
        Request::DeleteRange(d) => d.apply(store).map(|(r, rev)| (Response::DeleteRange(r), rev)),
        Request::Txn(t) => {
            t.validate(max_txn_ops)?;
            t.apply(store).map(|(r, rev)| (Response::Txn(r), rev))
        }
        Request::Compact { revision } => {
            store.compact(*revision)?;
            Ok((Response::Compact, store.current_revision()))
        }
    }
}

fn apply_loop(rx: Receiver<Proposal>, store: Arc<RwLock<Store>>, max_txn_ops: usize) {
    for p in rx {
        let outcome = match p.durable.wait() {
            Ok(_) => apply(&mut store.write(), &p.request, max_txn_ops),
            Err(e) => Err(Error::from(e)),
        };
        let _ = p.reply.send(outcome);
    }
}

impl Engine {
    /// Opens (or creates) the engine in `dir`, recovering everything its log holds.
    pub fn open(dir: impl AsRef<Path>, config: Config) -> Result<Engine> {
        config.validate()?;
        let dir = dir.as_ref().to_path_buf();
        let mut replay = Wal::open(dir.join("wal"), config.wal.clone())?;
        let mut store = Store::new();
        let mut next_index = 1u64;
        for record in replay.by_ref() {
            if let Record::Entry { index, payload } = record? {
                let request = Request::decode(&payload).map_err(|e| Error::CorruptEntry {
                    index: index.0,
                    reason: e.to_string(),
                })?;
                // A request's own failure (a compare, a compacted revision) was its answer then
                // and is again now: replay only needs the state it leaves.
                let _ = apply(&mut store, &request, config.max_txn_ops);
                next_index = index.0.saturating_add(1);
            }
        }
        let wal = replay.finish()?;
        let store = Arc::new(RwLock::new(store));
        let (apply_tx, apply_rx) = unbounded();
        let thread = {
            let store = store.clone();
            let max_txn_ops = config.max_txn_ops;
            std::thread::Builder::new()
                .name("cairn-apply".into())
                .spawn(move || apply_loop(apply_rx, store, max_txn_ops))
                .map_err(|e| Error::Internal(format!("spawn apply thread: {e}")))?
        };
        Ok(Engine {
            dir,
            config,
            proposer: Mutex::new(Some(Proposer {
                wal,
                next_index,
                apply_tx,
            })),
            store,
            apply_thread: Mutex::new(Some(thread)),
        })
    }

    /// The directory the engine lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Logs `request`, then waits for it to be applied.
    fn propose(&self, request: Request) -> Result<(Response, i64)> {
        let answer = {
            let mut guard = self.proposer.lock();
            let p = guard.as_mut().ok_or(Error::Closed)?;
            let index = p.next_index;
            let payload = Bytes::from(request.encode());
            let durable = p.wal.append(
                vec![Record::Entry {
                    index: LogIndex(index),
                    payload,
                }],
                Durability::Durable,
            )?;
            p.next_index += 1;
            let (reply, answer) = oneshot::channel();
            p.apply_tx
                .send(Proposal {
                    request,
                    durable,
                    reply,
                })
                .map_err(|_| Error::Closed)?;
            answer
        };
        answer.recv().map_err(|_| Error::Closed)?
    }

    /// Puts a key (etcd's `Put`).
    pub fn put(&self, request: PutRequest) -> Result<Applied<PutResponse>> {
        request.validate()?;
        match self.propose(Request::Put(request))? {
            (Response::Put(response), revision) => Ok(Applied { response, revision }),
            (other, _) => Err(Error::Internal(format!("put answered with {other:?}"))),
        }
    }

    /// Deletes a key or range (etcd's `DeleteRange`).
    pub fn delete_range(&self, request: DeleteRangeRequest) -> Result<Applied<DeleteRangeResponse>> {
        if request.key.is_empty() {
            return Err(Error::EmptyKey);
        }
        match self.propose(Request::DeleteRange(request))? {
            (Response::DeleteRange(response), revision) => Ok(Applied { response, revision }),
            (other, _) => Err(Error::Internal(format!("delete answered with {other:?}"))),
        }
    }

    /// Runs a transaction (etcd's `Txn`).
    pub fn txn(&self, request: TxnRequest) -> Result<Applied<TxnResponse>> {
        request.validate(self.config.max_txn_ops)?;
        match self.propose(Request::Txn(request))? {
            (Response::Txn(response), revision) => Ok(Applied { response, revision }),
            (other, _) => Err(Error::Internal(format!("txn answered with {other:?}"))),
        }
    }

    /// Drops history below `revision` (etcd's `Compact`).
    pub fn compact(&self, revision: i64) -> Result<Applied<()>> {
        match self.propose(Request::Compact { revision })? {
            (Response::Compact, revision) => Ok(Applied { response: (), revision }),
            (other, _) => Err(Error::Internal(format!("compact answered with {other:?}"))),
        }
    }

    /// Reads a key or range (etcd's `Range`), concurrently with other reads.
    pub fn range(&self, request: &RangeRequest) -> Result<RangeResponse> {
        if request.key.is_empty() {
            return Err(Error::EmptyKey);
        }
        request.apply(&self.store.read())
    }

    /// etcd's `HashKV`: a hash of the history kept up to `revision` (0 for the current one),
    /// equal on members that applied the same log, and across restarts.
    pub fn hash_kv(&self, revision: i64) -> Result<HashKv> {
        self.store.read().hash_kv(revision)
    }

    /// The store's current revision.
    pub fn current_revision(&self) -> i64 {
        self.store.read().current_revision()
    }

    /// Stops accepting writes, lets every queued one finish, and syncs the log.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&self) -> Result<()> {
        let proposer = self.proposer.lock().take();
        let Some(Proposer { wal, apply_tx, .. }) = proposer else {
            return Ok(());
        };
        drop(apply_tx);
        if let Some(t) = self.apply_thread.lock().take() {
            let _ = t.join();
        }
        wal.close()?;
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
