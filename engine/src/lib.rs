//! cairn's engine: the MVCC state machine and the embedded, durable [`Engine`].
//!
//! [`Store`] is the MVCC core: revisions, per-key generations, the B-tree key index, and etcd's
//! read, write and compaction semantics, with etcd's KV requests over it (Range with sorting and
//! filters, Put, DeleteRange, Txn with compares and nested txns). [`Engine`] keeps it in a
//! directory: each request is a raft-rs log entry, in the WAL before it is applied, changes
//! live in memory-mapped data files, and checkpoints bound what a restart replays. It serves
//! txns, compaction, non-blocking defragmentation, leases, watch and streamed snapshots. An
//! engine is a Raft group of one ([`Engine::open`]) or a member of a bigger group
//! ([`Engine::open_member`] with a [`Transport`]; [`LocalNetwork`] for members in one process).
//!
//! ```no_run
//! use cairn_engine::{Config, Engine, PutRequest, RangeRequest};
//!
//! # fn main() -> cairn_engine::Result<()> {
//! let engine = Engine::open("/var/lib/cairn", Config::default())?;
//! let written = engine.put(PutRequest {
//!     key: b"greeting".to_vec(),
//!     value: "hello".into(),
//!     ..PutRequest::default()
//! })?;
//! let read = engine.range(&RangeRequest::key("greeting"))?;
//! assert_eq!(read.revision, written.revision);
//! assert_eq!(read.kvs.first().map(|kv| kv.value.clone()), Some("hello".into()));
//! engine.close()
//! # }
//! ```

#![warn(missing_docs)]

pub mod auth;
mod backend;
mod checkpoint;
mod clock;
mod config;
mod consensus;
mod engine;
mod error;
mod format;
mod kv;
mod lease;
mod mvcc;
mod request;
mod snapshot;
mod watch;

pub use auth::{Access, AuthChange, AuthError, AuthStore, Permission, Role, User};
pub use cairn_wal as wal;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::Config;
pub use consensus::local::LocalNetwork;
pub use consensus::node::Transport;
pub use consensus::MemberAttributes;
pub use engine::{
    Applied, Defragmented, Engine, Inbox, LeaseGrant, Member, Members, Pending, PendingFuture, RaftStatus,
    SnapshotInfo, Watch, WatchGroup,
};
pub use error::{Error, Failure, Result};
pub use kv::build::CompareOn;
pub use kv::range::{RangeRequest, RangeResponse, SortOrder, SortTarget};
pub use kv::txn::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RequestOp,
    ResponseOp, TxnRequest, TxnResponse,
};
pub use lease::lessor::{LeaseStatus, MAX_LEASE_TTL};
pub use mvcc::index::prefix_end;
pub use mvcc::revision::Revision;
pub use mvcc::store::{Event, EventKind, HashKv, KeyValue, RangeResult, ReadOptions, Store, WriteTxn};
pub use request::Alarm;
pub use watch::hub::{fragment as fragment_events, Delivery, Wake, WatchRequest, WatchResponse};
