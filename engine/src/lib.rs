//! cairn's engine: the MVCC state machine, Raft replication and the embedded API.
//!
//! Today it only re-exports the write-ahead log it is built on; the MVCC store, leases, watch,
//! snapshots and the embedded `Engine` arrive with their own issues (see README.md's status
//! table).

pub use cairn_wal as wal;
