//! What `engine-crash-child` and `tests/engine_crash.rs` share: the engine's configuration, the
//! keys and values written, and the line protocol by which the child reports what the engine
//! acknowledged.
//!
//! Every line is one promise the parent checks after the kill (`<thread>` is the writer that
//! printed it, so each thread's lines are in its program order):
//!
//! ```text
//! ready <revision>                              the engine opened at this current revision
//! put <thread> <revision> <key> <tag>           put <key> = value(<tag>), answered at <revision>
//! del <thread> <revision> <key> <deleted>       deleted <key> (0 or 1 keys), answered at <revision>
//! cas <thread> <revision> ok <prev_mod> <n>     counter: compare MOD == <prev_mod> held, put <n>
//! cas <thread> <revision> fail <mod> <n>        counter: compare failed; a read saw <n> at <mod>
//! compacting <revision>                         about to ask for a compaction (it may or may not land)
//! compact <revision>                            the compaction was acknowledged
//! ```
//!
//! A `del` or failed `cas` writes nothing: its revision is the store's revision when it was
//! applied, shared with the write before it.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;

/// The key the compare-and-swap counter lives at (never deleted).
pub const COUNTER: &str = "counter";

/// How many keys puts and deletes choose from: few, so that every key gets many versions.
pub const KEYS: u64 = 12;

/// The engine's configuration: 64 KiB WAL segments, so segments rotate every few hundred writes
/// and kills land mid-rotation too.
pub fn config() -> cairn_engine::Config {
    cairn_engine::Config {
        wal: cairn_engine::wal::Config {
            segment_size: 64 << 10,
            ..Default::default()
        },
        // Checkpoints every 100 entries, so kills also land while one is written.
        checkpoint_entries: 100,
        ..Default::default()
    }
}

/// Key `i` of the put/delete key space (`k00`, `k01`, ...).
pub fn key(i: u64) -> String {
    format!("k{:02}", i % KEYS)
}

/// The value put under `tag`: derived from the tag, so a line needs only the tag, and 8 to 519
/// bytes long, so entries vary in size.
pub fn value(tag: &str) -> Bytes {
    let hash = tag.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let len = 8 + (hash % 512) as usize;
    tag.bytes().chain(std::iter::once(b'|')).cycle().take(len).collect()
}

/// One line of the child's output (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    Ready {
        revision: i64,
    },
    Put {
        thread: usize,
        revision: i64,
        key: String,
        tag: String,
    },
    Delete {
        thread: usize,
        revision: i64,
        key: String,
        deleted: i64,
    },
    CasSucceeded {
        thread: usize,
        revision: i64,
        prev_mod: i64,
        value: u64,
    },
    CasFailed {
        thread: usize,
        revision: i64,
        seen_mod: i64,
        seen_value: u64,
    },
    Compacting {
        revision: i64,
    },
    Compacted {
        revision: i64,
    },
}

impl Line {
    /// The writer thread and revision of a write request's answer.
    pub fn write(&self) -> Option<(usize, i64)> {
        match *self {
            Line::Put { thread, revision, .. }
            | Line::Delete { thread, revision, .. }
            | Line::CasSucceeded { thread, revision, .. }
            | Line::CasFailed { thread, revision, .. } => Some((thread, revision)),
            Line::Ready { .. } | Line::Compacting { .. } | Line::Compacted { .. } => None,
        }
    }

    /// Whether the request changed the store, and so owns its revision.
    pub fn changed_store(&self) -> bool {
        match self {
            Line::Put { .. } | Line::CasSucceeded { .. } => true,
            Line::Delete { deleted, .. } => *deleted > 0,
            _ => false,
        }
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Line::Ready { revision } => write!(f, "ready {revision}"),
            Line::Put {
                thread,
                revision,
                key,
                tag,
            } => write!(f, "put {thread} {revision} {key} {tag}"),
            Line::Delete {
                thread,
                revision,
                key,
                deleted,
            } => write!(f, "del {thread} {revision} {key} {deleted}"),
            Line::CasSucceeded {
                thread,
                revision,
                prev_mod,
                value,
            } => write!(f, "cas {thread} {revision} ok {prev_mod} {value}"),
            Line::CasFailed {
                thread,
                revision,
                seen_mod,
                seen_value,
            } => write!(f, "cas {thread} {revision} fail {seen_mod} {seen_value}"),
            Line::Compacting { revision } => write!(f, "compacting {revision}"),
            Line::Compacted { revision } => write!(f, "compact {revision}"),
        }
    }
}

fn number<T: FromStr>(field: &str) -> Result<T, String> {
    field.parse().map_err(|_| format!("bad number {field:?}"))
}

impl FromStr for Line {
    type Err = String;

    fn from_str(line: &str) -> Result<Line, String> {
        let fields: Vec<&str> = line.split(' ').collect();
        let parsed = match fields.as_slice() {
            ["ready", rev] => Line::Ready { revision: number(rev)? },
            ["put", thread, rev, key, tag] => Line::Put {
                thread: number(thread)?,
                revision: number(rev)?,
                key: (*key).to_string(),
                tag: (*tag).to_string(),
            },
            ["del", thread, rev, key, deleted] => Line::Delete {
                thread: number(thread)?,
                revision: number(rev)?,
                key: (*key).to_string(),
                deleted: number(deleted)?,
            },
            ["cas", thread, rev, "ok", prev_mod, value] => Line::CasSucceeded {
                thread: number(thread)?,
                revision: number(rev)?,
                prev_mod: number(prev_mod)?,
                value: number(value)?,
            },
            ["cas", thread, rev, "fail", seen_mod, seen_value] => Line::CasFailed {
                thread: number(thread)?,
                revision: number(rev)?,
                seen_mod: number(seen_mod)?,
                seen_value: number(seen_value)?,
            },
            ["compacting", rev] => Line::Compacting { revision: number(rev)? },
            ["compact", rev] => Line::Compacted { revision: number(rev)? },
            _ => return Err(format!("unknown line {line:?}")),
        };
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_roundtrip_and_garbage_is_refused() {
        let lines = [
            Line::Ready { revision: 0 },
            Line::Put {
                thread: 3,
                revision: 17,
                key: key(5),
                tag: "c2.3.9".into(),
            },
            Line::Delete {
                thread: 0,
                revision: 18,
                key: key(11),
                deleted: 1,
            },
            Line::CasSucceeded {
                thread: 1,
                revision: 19,
                prev_mod: 4,
                value: 7,
            },
            Line::CasFailed {
                thread: 2,
                revision: 19,
                seen_mod: 19,
                seen_value: 7,
            },
            Line::Compacting { revision: 12 },
            Line::Compacted { revision: 12 },
        ];
        for line in lines {
            assert_eq!(line.to_string().parse::<Line>(), Ok(line));
        }
        for bad in [
            "",
            "ack 1",
            "put 1 2 k00",
            "del x 1 k00 0",
            "cas 0 5 maybe 1 2",
            "ready 1 2",
        ] {
            assert!(bad.parse::<Line>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn values_follow_their_tag() {
        assert_eq!(value("a.0.1"), value("a.0.1"));
        assert_ne!(value("a.0.1"), value("a.0.2"));
        assert!((8..520).contains(&value("x").len()));
        assert!(value("a.0.1").starts_with(b"a.0.1|"));
    }
}
