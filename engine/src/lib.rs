//! cairn's engine: the MVCC state machine, Raft replication and the embedded API.
//!
//! Today it holds the MVCC core: revisions, per-key generations, the B-tree key index and an
//! in-memory [`Store`] with etcd's read, write and compaction semantics. The durable backend,
//! txn compares, leases, watch, snapshots and the embedded `Engine` arrive with issue #3 (see
//! README.md's status table).

mod error;
mod mvcc;

pub use cairn_wal as wal;
pub use error::{Error, Result};
pub use mvcc::index::prefix_end;
pub use mvcc::revision::Revision;
pub use mvcc::store::{KeyValue, RangeResult, ReadOptions, Store, WriteTxn};
