//! etcd's KV requests (Range, Put, DeleteRange, Txn) over the MVCC store: their validation,
//! options and responses, independent of any wire format; `build` has their builders.

pub(crate) mod build;
pub(crate) mod range;
pub(crate) mod txn;
pub(crate) mod write;
