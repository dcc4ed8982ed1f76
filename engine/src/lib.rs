//! cairn's engine: the MVCC state machine, Raft replication and the embedded API.
//!
//! Today it holds the MVCC core: revisions, per-key generations, the B-tree key index, an
//! in-memory [`Store`] with etcd's read, write and compaction semantics, and etcd's KV requests
//! (Range with sorting and filters, Put, DeleteRange, Txn with compares and nested txns) over
//! it. The durable backend, leases, watch, snapshots and the embedded `Engine` arrive with
//! issue #3 (see README.md's status table).

mod backend;
mod checkpoint;
mod clock;
mod config;
mod engine;
mod error;
mod kv;
mod lease;
mod mvcc;
mod request;
mod snapshot;
mod watch;

pub use cairn_wal as wal;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::Config;
pub use engine::{Applied, Defragmented, Engine, LeaseGrant, Pending, PendingFuture, Watch};
pub use error::{Error, Result};
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
pub use watch::hub::{fragment as fragment_events, WatchRequest, WatchResponse};
