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
//! grant <thread> <revision> <lease>             granted <lease> (TTL [`LEASE_TTL`])
//! lput <thread> <revision> <lease> <key> <tag>  put <key> = value(<tag>) attached to <lease>
//! revoking <thread> <lease>                     about to revoke <lease> (it may or may not land)
//! revoke <thread> <revision> <lease> <keys>     revoked <lease>, deleting its <keys> keys
//! ```
//!
//! A `del` or failed `cas` writes nothing: its revision is the store's revision when it was
//! applied, shared with the write before it. Neither does a `grant`, nor a `revoke` of a lease
//! without keys. An `lput` key is [`lease_key`] of its lease, which nothing else writes or
//! deletes: only its lease's revoke deletes it.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;

/// The key the compare-and-swap counter lives at (never deleted).
pub const COUNTER: &str = "counter";

/// How many keys puts and deletes choose from: few, so that every key gets many versions.
pub const KEYS: u64 = 12;

/// The TTL of every lease granted, in seconds: long enough that none expires during the test
/// (the lease checker runs), so a lease disappears only by an explicit revoke.
pub const LEASE_TTL: i64 = 3600;

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
        // Small data files, so the state spans several and defragmentation replaces them.
        data_file_size: 64 << 10,
        ..Default::default()
    }
}

/// Key `i` of the put/delete key space (`k00`, `k01`, ...).
pub fn key(i: u64) -> String {
    format!("k{:02}", i % KEYS)
}

/// Key `n` attached to `lease`: `l<lease>.<n>`, under [`lease_prefix`].
pub fn lease_key(lease: i64, n: u64) -> String {
    format!("{}{n}", lease_prefix(lease))
}

/// The prefix of every key attached to `lease`; no other key starts with it.
pub fn lease_prefix(lease: i64) -> String {
    format!("l{lease}.")
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
    Grant {
        thread: usize,
        revision: i64,
        lease: i64,
    },
    LeasePut {
        thread: usize,
        revision: i64,
        lease: i64,
        key: String,
        tag: String,
    },
    Revoking {
        thread: usize,
        lease: i64,
    },
    Revoked {
        thread: usize,
        revision: i64,
        lease: i64,
        keys: u64,
    },
}

impl Line {
    /// The writer thread and revision of a write request's answer.
    pub fn write(&self) -> Option<(usize, i64)> {
        match *self {
            Line::Put { thread, revision, .. }
            | Line::Delete { thread, revision, .. }
            | Line::CasSucceeded { thread, revision, .. }
            | Line::CasFailed { thread, revision, .. }
            | Line::Grant { thread, revision, .. }
            | Line::LeasePut { thread, revision, .. }
            | Line::Revoked { thread, revision, .. } => Some((thread, revision)),
            Line::Ready { .. } | Line::Compacting { .. } | Line::Compacted { .. } | Line::Revoking { .. } => None,
        }
    }

    /// Whether the request changed the store, and so owns its revision.
    pub fn changed_store(&self) -> bool {
        match self {
            Line::Put { .. } | Line::CasSucceeded { .. } | Line::LeasePut { .. } => true,
            Line::Delete { deleted, .. } => *deleted > 0,
            Line::Revoked { keys, .. } => *keys > 0,
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
            Line::Grant {
                thread,
                revision,
                lease,
            } => write!(f, "grant {thread} {revision} {lease}"),
            Line::LeasePut {
                thread,
                revision,
                lease,
                key,
                tag,
            } => write!(f, "lput {thread} {revision} {lease} {key} {tag}"),
            Line::Revoking { thread, lease } => write!(f, "revoking {thread} {lease}"),
            Line::Revoked {
                thread,
                revision,
                lease,
                keys,
            } => write!(f, "revoke {thread} {revision} {lease} {keys}"),
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
            ["grant", thread, rev, lease] => Line::Grant {
                thread: number(thread)?,
                revision: number(rev)?,
                lease: number(lease)?,
            },
            ["lput", thread, rev, lease, key, tag] => Line::LeasePut {
                thread: number(thread)?,
                revision: number(rev)?,
                lease: number(lease)?,
                key: (*key).to_string(),
                tag: (*tag).to_string(),
            },
            ["revoking", thread, lease] => Line::Revoking {
                thread: number(thread)?,
                lease: number(lease)?,
            },
            ["revoke", thread, rev, lease, keys] => Line::Revoked {
                thread: number(thread)?,
                revision: number(rev)?,
                lease: number(lease)?,
                keys: number(keys)?,
            },
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
            Line::Grant {
                thread: 2,
                revision: 20,
                lease: 440_123_456_789_000,
            },
            Line::LeasePut {
                thread: 2,
                revision: 21,
                lease: 440_123_456_789_000,
                key: lease_key(440_123_456_789_000, 1),
                tag: "c2.2.10".into(),
            },
            Line::Revoking {
                thread: 2,
                lease: 440_123_456_789_000,
            },
            Line::Revoked {
                thread: 2,
                revision: 22,
                lease: 440_123_456_789_000,
                keys: 1,
            },
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
            "grant 1 2",
            "grant 1 2 x",
            "lput 1 2 3 l3.0",
            "revoking 1",
            "revoke 1 2 3",
            "revoke 1 2 3 -1",
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

    #[test]
    fn lease_keys_stay_under_their_prefix() {
        assert_eq!(lease_key(17, 0), "l17.0");
        assert!(lease_key(17, 1).starts_with(&lease_prefix(17)));
        assert!(!lease_key(170, 1).starts_with(&lease_prefix(17)));
        assert!(!key(3).starts_with('l') && !COUNTER.starts_with('l'));
    }
}
