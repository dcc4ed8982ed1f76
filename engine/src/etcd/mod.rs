//! etcd's own formats, for moving data in from etcd and back out to it.
//!
//! - [`bbolt`]: the B+tree file etcd keeps its state in, and which its snapshots are: a reader
//!   for any file etcd 3.4 to 3.7 writes, and a writer of files etcd's tools open.
//! - [`export`]: cairn's state as an etcd database, what `etcdctl snapshot save` gets.
//! - [`import`]: an etcd snapshot (or a stopped member's db) into cairn's state, revisions
//!   exact.

pub(crate) mod bbolt;
pub(crate) mod export;
pub(crate) mod import;
mod pb;
