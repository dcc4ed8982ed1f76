//! What cairn writes to disk and sends to its peers, and the one place that knows its layout.
//!
//! | what                          | where                    | version                     |
//! |-------------------------------|--------------------------|-----------------------------|
//! | a Raft log entry's request    | [`entry`]                | format byte 1               |
//! | a membership change's context | [`state::attributes`]    | unversioned, as format 1    |
//! | checkpoints                   | [`checkpoint`], [`state`] | 7 (6 and 5 are read too)   |
//! | snapshots                     | [`snapshot`], [`state`]  | 6 (5 and 4 are read too)    |
//! | data-file records             | `backend/record.rs`      | one layout, CRC-framed      |
//! | the saved key index           | [`index`]                | 1                           |
//! | WAL segments                  | the `cairn-wal` crate    | docs/wal-format.md          |
//!
//! The bodies are postcard, which is positional: a field added to a struct, or a variant
//! inserted into an enum, changes the bytes of everything already written. So none of the
//! engine's own types is serialized: nothing outside this module derives serde. Each format
//! has its own private types here, mirroring the engine's as they were when the format was
//! fixed, a `Version` enum of what it writes and still reads, and the engine's types convert
//! to and from them at the boundary. An engine type may then grow freely; a new thing to
//! persist is a new format version with new types, and the old version keeps decoding. The golden tests in [`entry`], [`state`],
//! [`checkpoint`] and [`snapshot`] pin every byte of today's formats, and
//! `tests/fixtures/format/` holds whole data directories and snapshots that every later
//! version must open.

pub(crate) mod checkpoint;
pub(crate) mod entry;
pub(crate) mod index;
pub(crate) mod snapshot;
pub(crate) mod state;
