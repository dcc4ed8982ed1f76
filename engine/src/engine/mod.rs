//! The embedded engine: a directory holding a durable, revisioned key-value store with leases,
//! replicated by Raft.
//!
//! A write is validated, encoded as a [`Request`](crate::request::Request), and handed to the
//! Raft node thread under a request ID, which proposes it. Once the entry is committed (in the
//! WALs of a majority; the WAL's group commit makes one fdatasync serve many), the apply thread
//! applies it to the state (store, lessor and alarms) in log order and answers the caller.
//! Reads take the state's read lock and are served concurrently with other reads; a write's
//! answer comes after it is applied, so a read that starts after a write returns sees it.
//!
//! Leases expire on this member's clock: a checker thread (or an explicit
//! [`Leases::expire_now`]) proposes a revoke for each expired lease, a bounded batch at a
//! time, through the same write path; each revoke deletes its keys in one revision.
//!
//! On disk: `<dir>/wal/`, the log of every request; `<dir>/data/`, the records of every change
//! still in history (see [`crate::backend`]); `<dir>/checkpoint`, the applied index with the
//! data files' layout and the leases. Opening rebuilds the state from the checkpoint and its
//! data files and replays the log after it, so a crash at any point recovers every
//! acknowledged write (and possibly some that were logged but not yet answered).
//!
//! This module holds [`Engine`] and what its threads share (`Core`, `State`), with opening
//! and closing. The rest of the API is split by concern: `kv` (put, delete_range, txn, range),
//! `leases`, `watch`, `membership` (and the inbox peers' messages arrive through),
//! `maintenance` (compaction, defragmentation, snapshots, alarms, HashKV) and `status`; the
//! write path's ends are in `propose`, the apply thread in `apply`, checkpoints in
//! `checkpointing`.

mod api;
mod apply;
mod builder;
mod checkpointing;
pub(crate) mod core;
mod handle;
mod leases;
mod maintenance;
mod members;
mod open;
mod progress;
pub(crate) mod propose;
mod reads;
mod server;
pub(crate) mod staged;
pub(crate) mod state;
mod status;
mod versions;
mod waiters;

pub use builder::{EngineBuilder, Peer};
pub use handle::Engine;
pub use leases::{LeaseGrant, Leases};
pub use maintenance::{Defragmented, Maintenance};
pub use members::{Inbox, Member, MemberIds, Members};
pub use propose::{Applied, Pending, PendingFuture};
pub use server::ServerHooks;
pub use status::EngineStatus;
