//! Multi-version concurrency control: revisions, the per-key history, the key index and the
//! store built on them.
//!
//! Laid out the way etcd's `mvcc` package is, over the revisions of `crate::revision` (the
//! clock, which the data files' records carry too): `key_index` (one key's
//! generations), `index` (all keys, in sorted leaves), `store` (reads and write requests), plus
//! `revision_log` (where each revision's record lives, etcd's key bucket).

pub(crate) mod defrag;
pub(crate) mod index;
pub(crate) mod key_index;
pub(crate) mod revision_log;
pub(crate) mod saved_index;
pub(crate) mod store;
