//! Model-based test of the MVCC store (etcd's data model, ETCD-COMPAT.md "Keys, ranges,
//! revisions"): random write requests (puts and deletes, several per request), compactions and
//! range reads at any revision, against a plain model that replays every write into a
//! `BTreeMap` per revision. Every read result and every error must match.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;

use bytes::Bytes;
use cairn_engine::{Error, KeyValue, ReadOptions, Store};
use proptest::prelude::*;

const KEYS: &[&[u8]] = &[b"a", b"a/1", b"a/2", b"b", b"c"];

#[derive(Debug, Clone)]
enum Change {
    Put {
        key: usize,
        value: u8,
        lease: i64,
    },
    /// Delete `[key, end)` (end: an index into KEYS, or past it for "no end").
    Delete {
        key: usize,
        end: Option<usize>,
    },
}

#[derive(Debug, Clone)]
enum Op {
    Write(Vec<Change>),
    Compact {
        back: i64,
    },
    Range {
        key: usize,
        end: Option<usize>,
        back: i64,
        limit: usize,
        keys_only: bool,
        count_only: bool,
    },
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        3 => (0..KEYS.len(), any::<u8>(), 0i64..3).prop_map(|(key, value, lease)| Change::Put { key, value, lease }),
        1 => (0..KEYS.len(), prop::option::of(0..=KEYS.len())).prop_map(|(key, end)| Change::Delete { key, end }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => prop::collection::vec(change(), 1..4).prop_map(Op::Write),
        1 => (0i64..6).prop_map(|back| Op::Compact { back }),
        4 => (0..KEYS.len(), prop::option::of(0..=KEYS.len()), -1i64..8, 0usize..4, any::<bool>(), any::<bool>())
            .prop_map(|(key, end, back, limit, keys_only, count_only)| Op::Range { key, end, back, limit, keys_only, count_only }),
    ]
}

/// `range_end` for a model range: `None` is a single key, `Some(KEYS.len())` is "no end".
fn range_end(end: Option<usize>) -> Vec<u8> {
    match end {
        None => Vec::new(),
        Some(i) if i >= KEYS.len() => vec![0],
        Some(i) => KEYS[i].to_vec(),
    }
}

fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    match end {
        [] => key == start,
        [0] => key >= start,
        end => key >= start && key < end,
    }
}

/// One write: (main revision, key, value and lease, or None for a delete).
type Write = (i64, Vec<u8>, Option<(u8, i64)>);

/// Every write ever made, and the revisions.
#[derive(Debug, Default)]
struct Model {
    writes: Vec<Write>,
    current: i64,
    compacted: i64,
}

impl Model {
    /// The key-values live at revision `at`.
    fn state_at(&self, at: i64) -> BTreeMap<Vec<u8>, KeyValue> {
        let mut state: BTreeMap<Vec<u8>, KeyValue> = BTreeMap::new();
        for (rev, key, change) in self.writes.iter().filter(|w| w.0 <= at) {
            match change {
                Some((value, lease)) => {
                    let (create, version) = match state.get(key) {
                        Some(kv) => (kv.create_revision, kv.version + 1),
                        None => (*rev, 1),
                    };
                    state.insert(
                        key.clone(),
                        KeyValue {
                            key: Bytes::copy_from_slice(key),
                            create_revision: create,
                            mod_revision: *rev,
                            version,
                            value: Bytes::from(vec![*value]),
                            lease: *lease,
                        },
                    );
                }
                None => {
                    state.remove(key);
                }
            }
        }
        state
    }

    fn write(&mut self, changes: &[Change]) -> i64 {
        let rev = self.current + 1;
        let mut changed = false;
        let mut live = self.state_at(self.current);
        for c in changes {
            match c {
                Change::Put { key, value, lease } => {
                    self.writes.push((rev, KEYS[*key].to_vec(), Some((*value, *lease))));
                    live.insert(
                        KEYS[*key].to_vec(),
                        KeyValue {
                            key: Bytes::new(),
                            create_revision: 0,
                            mod_revision: 0,
                            version: 0,
                            value: Bytes::new(),
                            lease: 0,
                        },
                    );
                    changed = true;
                }
                Change::Delete { key, end } => {
                    let end = range_end(*end);
                    let doomed: Vec<Vec<u8>> = live.keys().filter(|k| in_range(k, KEYS[*key], &end)).cloned().collect();
                    for k in doomed {
                        live.remove(&k);
                        self.writes.push((rev, k, None));
                        changed = true;
                    }
                }
            }
        }
        if changed {
            self.current = rev;
        }
        self.current
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_the_model(ops in prop::collection::vec(op(), 1..60)) {
        let mut store = Store::new();
        // An empty store is at revision 1, as in etcd.
        let mut model = Model { current: 1, ..Model::default() };
        for op in ops {
            match op {
                Op::Write(changes) => {
                    let mut w = store.write();
                    for c in &changes {
                        match c {
                            Change::Put { key, value, lease } => {
                                w.put(KEYS[*key], Bytes::from(vec![*value]), *lease).unwrap();
                            }
                            Change::Delete { key, end } => {
                                w.delete_range(KEYS[*key], &range_end(*end)).unwrap();
                            }
                        }
                    }
                    let rev = w.end();
                    prop_assert_eq!(rev, model.write(&changes));
                }
                Op::Compact { back } => {
                    let at = model.current - back;
                    let expected = if at <= model.compacted {
                        Err(Error::Compacted { requested: at, compacted: model.compacted })
                    } else {
                        model.compacted = at;
                        Ok(())
                    };
                    prop_assert_eq!(store.compact(at), expected);
                }
                Op::Range { key, end, back, limit, keys_only, count_only } => {
                    let revision = if back < 0 { model.current + 1 } else { (model.current - back).max(0) };
                    let opts = ReadOptions { revision, limit, keys_only, count_only };
                    let end = range_end(end);
                    let got = store.range(KEYS[key], &end, opts);
                    let at = if revision <= 0 { model.current } else { revision };
                    if revision > model.current {
                        prop_assert_eq!(got, Err(Error::FutureRevision { requested: revision, current: model.current }));
                        continue;
                    }
                    if revision > 0 && revision < model.compacted {
                        prop_assert_eq!(got, Err(Error::Compacted { requested: revision, compacted: model.compacted }));
                        continue;
                    }
                    let got = got.unwrap();
                    let all: Vec<KeyValue> = model.state_at(at).into_values().filter(|kv| in_range(&kv.key, KEYS[key], &end)).collect();
                    prop_assert_eq!(got.count, all.len());
                    prop_assert_eq!(got.more, limit != 0 && all.len() > limit);
                    prop_assert_eq!(got.revision, at);
                    let mut expected: Vec<KeyValue> = if count_only { Vec::new() } else { all };
                    if limit != 0 {
                        expected.truncate(limit);
                    }
                    if keys_only {
                        for kv in &mut expected {
                            kv.value = Bytes::new();
                        }
                    }
                    prop_assert_eq!(got.kvs, expected);
                }
            }
        }
    }
}
