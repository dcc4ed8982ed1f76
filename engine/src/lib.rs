//! cairn's engine: an embedded, Raft-replicated MVCC key-value store with etcd's semantics.
//!
//! An [`Engine`] keeps its state in a directory: every write is a raft-rs log entry, durable in
//! the write-ahead log before it is applied; values live in memory-mapped data files; and
//! checkpoints bound what a restart replays. It serves etcd's KV requests (range, put, delete,
//! txn), compaction, defragmentation that never stops writes, leases, watches and snapshots. An
//! engine is a group of one ([`Engine::open`]) or a member of a bigger group
//! ([`Engine::builder`] with a [`Transport`]).
//!
//! # Put and get
//!
//! ```
//! use cairn_engine::{Config, Engine};
//!
//! # fn main() -> cairn_engine::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path(), Config::default())?;
//! let revision = engine.put("greeting", "hello")?;
//! let kv = engine.get("greeting")?.expect("just put");
//! assert_eq!((kv.value.as_ref(), kv.mod_revision), (&b"hello"[..], revision));
//! engine.put("greetings/fr", "bonjour")?;
//! assert_eq!(engine.get_prefix("greetings/")?.len(), 1);
//! assert!(engine.delete("greeting")?);
//! engine.close()
//! # }
//! ```
//!
//! Every write is one of etcd's requests ([`PutRequest`], [`DeleteRangeRequest`],
//! [`TxnRequest`]) given to [`Engine::write`]; reads are [`RangeRequest`]s given to
//! [`Engine::range`]. `put`, `delete`, `get` and `get_prefix` are shorthands for the common
//! cases. Each blocking call has an async twin (`write_async`, `range_async`, ...) that no
//! thread waits in. Requests are etcd's messages, with public fields: build them with their
//! builders (`PutRequest::new(k, v).with_lease(id)`) or with `..Default::default()`, which keeps
//! compiling when etcd's messages gain a field. What the engine returns (responses, reports) is
//! `#[non_exhaustive]`: read its fields, never build it.
//!
//! # Transactions
//!
//! A txn's compares are checked and one branch applied in one revision, atomically:
//!
//! ```
//! use cairn_engine::{Compare, Config, Engine, PutRequest, TxnRequest};
//!
//! # fn main() -> cairn_engine::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path(), Config::default())?;
//! let seen = engine.put("leader", "a")?;
//! // Take over only if nobody wrote the key since we read it.
//! let takeover = TxnRequest::when([Compare::mod_revision("leader").eq(seen)])
//!     .then([PutRequest::new("leader", "b")])
//!     .otherwise([cairn_engine::RangeRequest::key("leader")]);
//! let applied = engine.txn(takeover)?;
//! assert!(applied.response.succeeded);
//! assert_eq!(engine.get("leader")?.map(|kv| kv.value), Some("b".into()));
//! # engine.close()
//! # }
//! ```
//!
//! # Watch
//!
//! A [`Watch`] delivers every change to a key or prefix, in revision order, from any revision
//! still in history. Read it blocking (`for response in &watch`) or as an async stream
//! (`futures_core::Stream`; see `examples/watch_stream.rs`).
//!
//! ```
//! use cairn_engine::{Config, Engine, EventKind, WatchRequest, WatchResponse};
//!
//! # fn main() -> cairn_engine::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path(), Config::default())?;
//! let first = engine.put("jobs/1", "queued")?;
//! engine.delete("jobs/1")?;
//! let watch = engine.watch(&WatchRequest::prefix("jobs/").from_revision(first))?;
//! let Some(WatchResponse::Events { events, .. }) = watch.recv() else { panic!("no events") };
//! let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
//! assert_eq!(kinds, [EventKind::Put, EventKind::Delete]);
//! # engine.close()
//! # }
//! ```
//!
//! # Leases
//!
//! Keys attached to a lease are deleted when it expires or is revoked; a holder keeps it alive.
//!
//! ```
//! use cairn_engine::{Config, Engine, PutRequest};
//!
//! # fn main() -> cairn_engine::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path(), Config::default())?;
//! let leases = engine.leases();
//! let lease = leases.grant(0, 10)?.response.id; // 0: the engine picks the ID
//! engine.write(PutRequest::new("session/me", "alive").with_lease(lease))?;
//! assert_eq!(leases.keep_alive(lease)?, 10);
//! leases.revoke(lease)?;
//! assert!(engine.get("session/me")?.is_none(), "revoking deletes the lease's keys");
//! # engine.close()
//! # }
//! ```
//!
//! # Which to use when
//!
//! | you want to | use |
//! |---|---|
//! | read and write keys | [`Engine::get`], [`Engine::put`], [`Engine::delete`]; etcd's requests with [`Engine::write`], [`Engine::txn`], [`Engine::range`] |
//! | the same from async code, no thread waiting | [`Engine::write_async`], [`Engine::range_async`], [`Engine::read_txn_async`], [`Engine::read_barrier_async`] |
//! | follow changes | [`Engine::watch`] (one request), [`Engine::watch_group`] (many watchers, one queue) |
//! | drop old history | [`Engine::compact`], then [`Maintenance::wait_compacted`] |
//! | leases | [`Engine::leases`]: [`Leases::grant`], [`Leases::keep_alive`], ... |
//! | the group's members, leadership | [`Engine::members`]: [`Members::add`], [`Members::move_leader`], ... |
//! | defragment, snapshot, alarms, HashKV | [`Engine::maintenance`] |
//! | how the member is doing | [`Engine::status`] (one call, every figure); [`Engine::leader`], [`Engine::current_revision`] (cheap, for every request) |
//! | restore or inspect a snapshot, import etcd's | [`offline`], with no engine open |
//! | serve the member to others (auth, versions, guarded writes) | [`Engine::server`]: a server's needs, not an application's |
//!
//! # Errors
//!
//! [`Error`] says what a caller can act on: [`Error::is_transient`] (a retry may succeed: no
//! leader yet, a leader change, a timeout), [`Error::outcome_unknown`] (a write may have been
//! applied all the same), and the cause of an I/O failure ([`Error::io_error`]).
//!
//! # Replication
//!
//! ```no_run
//! use cairn_engine::{Engine, LocalNetwork};
//!
//! # fn main() -> cairn_engine::Result<()> {
//! let net = LocalNetwork::new(7); // members in one process; a server brings its own Transport
//! let mut members = Vec::new();
//! for id in [1, 2, 3] {
//!     let engine = Engine::builder(format!("/var/lib/cairn/member-{id}"))
//!         .member(id)
//!         .peers([1, 2, 3])
//!         .transport(net.transport(id))
//!         .open()?;
//!     net.attach(id, engine.inbox()?);
//!     members.push(engine);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! docs/design.md in the repository describes how it all works.

#![warn(missing_docs)]

pub mod auth;
mod backend;
mod clock;
mod config;
mod consensus;
mod engine;
mod error;
mod etcd;
mod format;
mod kv;
mod lease;
mod membership;
mod mvcc;
pub mod offline;
mod request;
mod revision;
mod thread;
pub mod version;
mod watch;

pub use auth::{Access, AuthChange, AuthError, AuthInfo, AuthStore, Permission, Role, User};
pub use cairn_wal as wal;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::Config;
pub use consensus::interface::Transport;
pub use consensus::local::LocalNetwork;
pub use engine::{
    Applied, Defragmented, Engine, EngineBuilder, EngineStatus, Inbox, LeaseGrant, Leases, Maintenance, Member,
    MemberIds, Members, Peer, Pending, PendingFuture, ServerHooks,
};
pub use error::{Error, Failure, Result};
pub use kv::build::CompareOn;
pub use kv::range::{RangeRequest, RangeResponse, SortOrder, SortTarget};
pub use kv::txn::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RequestOp,
    ResponseOp, TxnRequest, TxnResponse,
};
pub use kv::write::WriteRequest;
pub use lease::lessor::{LeaseStatus, MAX_LEASE_TTL};
pub use membership::MemberAttributes;
pub use mvcc::index::prefix_end;
pub use mvcc::store::{Event, EventKind, HashKv, KeyValue};
/// The MVCC core on its own, without log, files or threads: for model tests and benchmarks
/// (the `testing` feature).
#[cfg(feature = "testing")]
pub use mvcc::store::{RangeResult, ReadOptions, Store, WriteTxn};
pub use request::Alarm;
pub use revision::Revision;
pub use watch::hub::{fragment as fragment_events, Delivery, Wake, WatchRequest, WatchResponse};
pub use watch::stream::{Watch, WatchGroup};
