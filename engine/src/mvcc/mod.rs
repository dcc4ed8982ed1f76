//! Multi-version concurrency control: revisions, the per-key history, the key index and the
//! store built on them.
//!
//! Laid out the way etcd's `mvcc` package is: `revision` (the clock), `key_index` (one key's
//! generations), `index` (the B-tree of all keys), `store` (reads and write requests).

pub(crate) mod index;
pub(crate) mod key_index;
pub(crate) mod revision;
pub(crate) mod store;
