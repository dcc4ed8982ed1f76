//! Model-based test of the MVCC store (etcd's data model of keys, ranges and revisions,
//! docs/compatibility.md): random write requests (puts and deletes, several per request),
//! compactions and range reads at any revision, against a plain model that replays every
//! write into a `BTreeMap` per revision. Every read result and every error must match.
//!
//! A second test then sends random `RangeRequest`s (any key range, revision, sort, revision
//! filters, `keys_only`, `count_only`, `limit`) and checks each answer against what etcd's
//! `executeRange` (server/etcdserver/txn/range.go) makes of the model's key-values.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;

use bytes::Bytes;
use cairn_engine::{Error, KeyValue, RangeRequest, RangeResponse, ReadOptions, SortOrder, SortTarget, Store};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const KEYS: &[&[u8]] = &[b"a", b"a/1", b"a/2", b"b", b"c"];

/// Values a put writes: their byte order is not the keys', one is empty, one is a prefix of
/// two others, and there are few enough that keys often share one (ties when sorting by value).
const VALUES: &[&[u8]] = &[b"", b"m", b"m\0", b"mn", b"f"];

#[derive(Debug, Clone)]
enum Change {
    /// Put `VALUES[value]` at `KEYS[key]`.
    Put { key: usize, value: usize, lease: i64 },
    /// Delete `[key, end)` (end: an index into KEYS, or past it for "no end").
    Delete { key: usize, end: Option<usize> },
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
        3 => (0..KEYS.len(), 0..VALUES.len(), 0i64..3).prop_map(|(key, value, lease)| Change::Put { key, value, lease }),
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

/// Writes and compactions only: the history `RangeRequest`s are then sent to.
fn history_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec(change(), 1..4).prop_map(Op::Write),
        1 => (0i64..6).prop_map(|back| Op::Compact { back }),
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

/// Whether `key` is in etcd's `(key, range_end)`: empty `end` is `start` alone, `"\0"` every
/// key from `start` on, anything else `[start, end)` (empty when `end <= start`).
fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    match end {
        [] => key == start,
        [0] => key >= start,
        end => key >= start && key < end,
    }
}

/// One write: (main revision, key, index into VALUES and lease, or None for a delete).
type Write = (i64, Vec<u8>, Option<(usize, i64)>);

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
                            value: Bytes::from_static(VALUES[*value]),
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

/// Applies `op` to the store and the model; checks the revision a write ends at, a
/// compaction's answer, and a range read's result or error.
fn step(store: &mut Store, model: &mut Model, op: Op) -> Result<(), TestCaseError> {
    match op {
        Op::Write(changes) => {
            let mut w = store.write();
            for c in &changes {
                match c {
                    Change::Put { key, value, lease } => {
                        w.put(KEYS[*key], Bytes::from_static(VALUES[*value]), *lease).unwrap();
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
                Err(Error::Compacted {
                    requested: at,
                    compacted: model.compacted,
                })
            } else {
                model.compacted = at;
                Ok(())
            };
            prop_assert_eq!(store.compact(at), expected);
        }
        Op::Range {
            key,
            end,
            back,
            limit,
            keys_only,
            count_only,
        } => {
            let revision = if back < 0 {
                model.current + 1
            } else {
                (model.current - back).max(0)
            };
            let opts = ReadOptions {
                revision,
                limit,
                keys_only,
                count_only,
            };
            let end = range_end(end);
            let got = store.range(KEYS[key], &end, opts);
            let at = if revision <= 0 { model.current } else { revision };
            if revision > model.current {
                prop_assert_eq!(
                    got,
                    Err(Error::FutureRevision {
                        requested: revision,
                        current: model.current
                    })
                );
                return Ok(());
            }
            if revision > 0 && revision < model.compacted {
                prop_assert_eq!(
                    got,
                    Err(Error::Compacted {
                        requested: revision,
                        compacted: model.compacted
                    })
                );
                return Ok(());
            }
            let got = got.unwrap();
            let all: Vec<KeyValue> = model
                .state_at(at)
                .into_values()
                .filter(|kv| in_range(&kv.key, KEYS[key], &end))
                .collect();
            prop_assert_eq!(got.count, all.len());
            prop_assert_eq!(got.more, limit != 0 && all.len() > limit);
            prop_assert_eq!(got.revision, at);
            let mut expected: Vec<KeyValue> = if count_only { Vec::new() } else { all };
            if limit != 0 {
                expected.truncate(limit);
            }
            if keys_only {
                // Keys only come from the index alone, without the lease (etcd 3.7).
                for kv in &mut expected {
                    kv.value = Bytes::new();
                    kv.lease = 0;
                }
            }
            prop_assert_eq!(got.kvs, expected);
        }
    }
    Ok(())
}

/// First keys a request may name: every key, and "a/", a prefix that is not itself a key.
const STARTS: &[&[u8]] = &[b"a", b"a/1", b"a/2", b"b", b"c", b"a/"];

/// The keys a request names: its `key` and `range_end`.
#[derive(Debug, Clone)]
enum Span {
    /// `STARTS[i]` alone.
    Key(usize),
    /// Every key starting with `STARTS[i]` (etcdctl's `--prefix`).
    Prefix(usize),
    /// Every key from `STARTS[i]` on (`range_end` "\0").
    From(usize),
    /// `[STARTS[i], KEYS[j])`; empty when `KEYS[j]` is not after the start.
    To(usize, usize),
    /// Every key (`key` = `range_end` = "\0").
    All,
}

/// The revision a request reads at, relative to the store's when it is sent.
#[derive(Debug, Clone, Copy)]
enum At {
    /// This revision, 0 or less: the current one.
    Current(i64),
    /// `back` revisions before the current one (at least 1).
    Back(i64),
    /// The compacted revision plus `delta` (at least 1): either side of the boundary.
    Compacted(i64),
    /// `ahead` revisions after the current one.
    Future(i64),
}

/// One bound of a revision filter, relative to the store's revision when the request is sent.
#[derive(Debug, Clone, Copy)]
enum Filter {
    /// 0: no bound.
    Off,
    /// `current + 1 - back`, at least 1 (so it can be a future revision).
    Back(i64),
    /// -1, compared like any other bound.
    Negative,
}

/// A `RangeRequest` to build against the store as it is when the request is sent.
#[derive(Debug, Clone)]
struct Request {
    span: Span,
    at: At,
    limit: i64,
    sort_order: SortOrder,
    sort_target: SortTarget,
    serializable: bool,
    keys_only: bool,
    count_only: bool,
    /// `min_mod_revision`, `max_mod_revision`, `min_create_revision`, `max_create_revision`.
    filters: [Filter; 4],
}

const SORT_ORDERS: &[SortOrder] = &[SortOrder::None, SortOrder::Ascend, SortOrder::Descend];
const SORT_TARGETS: &[SortTarget] = &[
    SortTarget::Key,
    SortTarget::Version,
    SortTarget::Create,
    SortTarget::Mod,
    SortTarget::Value,
];

fn span() -> impl Strategy<Value = Span> {
    let start = 0..STARTS.len();
    prop_oneof![
        1 => start.clone().prop_map(Span::Key),
        2 => start.clone().prop_map(Span::Prefix),
        2 => start.clone().prop_map(Span::From),
        2 => (start, 0..KEYS.len()).prop_map(|(i, j)| Span::To(i, j)),
        3 => Just(Span::All),
    ]
}

fn at() -> impl Strategy<Value = At> {
    prop_oneof![
        3 => prop_oneof![Just(0), Just(-1), Just(i64::MIN)].prop_map(At::Current),
        3 => (0i64..3).prop_map(At::Back),
        1 => (3i64..12).prop_map(At::Back),
        2 => (-1i64..=1).prop_map(At::Compacted),
        1 => (1i64..3).prop_map(At::Future),
    ]
}

fn filter() -> impl Strategy<Value = Filter> {
    prop_oneof![
        3 => Just(Filter::Off),
        4 => (0i64..10).prop_map(Filter::Back),
        1 => Just(Filter::Negative),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    (
        span(),
        at(),
        prop_oneof![3 => Just(0i64), 4 => 1i64..5, 1 => Just(-1i64), 1 => Just(i64::MAX)],
        prop::sample::select(SORT_ORDERS),
        prop::sample::select(SORT_TARGETS),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.2),
        // Most requests have no filter: `limit` is applied differently then.
        prop_oneof![2 => Just([Filter::Off; 4]), 1 => prop::array::uniform4(filter())],
    )
        .prop_map(
            |(span, at, limit, sort_order, sort_target, serializable, keys_only, count_only, filters)| Request {
                span,
                at,
                limit,
                sort_order,
                sort_target,
                serializable,
                keys_only,
                count_only,
                filters,
            },
        )
}

/// clientv3's `GetPrefixRangeEnd`: the prefix with its last byte below 0xff incremented and
/// what follows dropped; "\0" (every key) when there is none.
fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|b| *b < 0xff) {
        Some(i) => {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => vec![0],
    }
}

impl Request {
    fn build(&self, model: &Model) -> RangeRequest {
        let (key, range_end) = match self.span {
            Span::Key(i) => (STARTS[i].to_vec(), Vec::new()),
            Span::Prefix(i) => (STARTS[i].to_vec(), prefix_range_end(STARTS[i])),
            Span::From(i) => (STARTS[i].to_vec(), vec![0]),
            Span::To(i, j) => (STARTS[i].to_vec(), KEYS[j].to_vec()),
            Span::All => (vec![0], vec![0]),
        };
        let revision = match self.at {
            At::Current(rev) => rev,
            At::Back(back) => (model.current - back).max(1),
            At::Compacted(delta) => (model.compacted + delta).max(1),
            At::Future(ahead) => model.current + ahead,
        };
        let bound = |f: Filter| match f {
            Filter::Off => 0,
            Filter::Back(back) => (model.current + 1 - back).max(1),
            Filter::Negative => -1,
        };
        RangeRequest {
            key,
            range_end,
            limit: self.limit,
            revision,
            sort_order: self.sort_order,
            sort_target: self.sort_target,
            serializable: self.serializable,
            keys_only: self.keys_only,
            count_only: self.count_only,
            min_mod_revision: bound(self.filters[0]),
            max_mod_revision: bound(self.filters[1]),
            min_create_revision: bound(self.filters[2]),
            max_create_revision: bound(self.filters[3]),
        }
    }
}

/// Whether etcd keeps the store's key order: no sort order, or ascending by key
/// (`IsDefaultOrdering`).
fn default_ordering(order: SortOrder, target: SortTarget) -> bool {
    order == SortOrder::None || (order == SortOrder::Ascend && target == SortTarget::Key)
}

fn has_revision_filters(req: &RangeRequest) -> bool {
    req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0
}

/// etcd's answer to `req` over the model, step by step as `executeRange` and mvcc's
/// `rangeKeys` compute it.
fn etcd_range(model: &Model, req: &RangeRequest) -> Result<RangeResponse, Error> {
    // rangeKeys: a future revision fails, 0 or less reads the current one, below the
    // compacted revision fails.
    if req.revision > model.current {
        return Err(Error::FutureRevision {
            requested: req.revision,
            current: model.current,
        });
    }
    let at = if req.revision <= 0 { model.current } else { req.revision };
    if at < model.compacted {
        return Err(Error::Compacted {
            requested: req.revision,
            compacted: model.compacted,
        });
    }
    // Every key of the range at `at`, in key order; `count` is all of them.
    let in_range: Vec<KeyValue> = model
        .state_at(at)
        .into_values()
        .filter(|kv| in_range(&kv.key, &req.key, &req.range_end))
        .collect();
    let count = i64::try_from(in_range.len()).unwrap();
    let mut kvs = if req.count_only { Vec::new() } else { in_range };
    // rangeLimit: unless the request re-sorts (by its sort order as sent) or filters, mvcc
    // reads `limit + 1` keys in key order, and the sort below sees only those.
    if req.limit > 0 && default_ordering(req.sort_order, req.sort_target) && !has_revision_filters(req) {
        kvs.truncate(usize::try_from(req.limit).unwrap().saturating_add(1));
    }
    // filterRangeResults: a bound of 0 is no bound.
    kvs.retain(|kv| {
        (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
            && (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
            && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
            && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
    });
    // sortRangeResults: no order with a target other than the key is ascending. etcd sorts
    // with a reversed comparison for DESCEND; its sort is not stable, so ties have no order in
    // general, but for the few keys of one answer (an insertion sort) they keep the key order
    // they came in, ascending, which is what cairn does always.
    let order = match (req.sort_order, req.sort_target) {
        (SortOrder::None, SortTarget::Key) => SortOrder::None,
        (SortOrder::None, _) => SortOrder::Ascend,
        (order, _) => order,
    };
    if !default_ordering(order, req.sort_target) {
        kvs.sort_by(|a, b| {
            let by_target = match req.sort_target {
                SortTarget::Key => a.key.cmp(&b.key),
                SortTarget::Version => a.version.cmp(&b.version),
                SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                SortTarget::Value => a.value.cmp(&b.value),
            };
            let directed = if order == SortOrder::Descend {
                by_target.reverse()
            } else {
                by_target
            };
            directed.then_with(|| a.key.cmp(&b.key))
        });
    }
    // asembleRangeResponse: cut to `limit`, then empty the values for keys_only; etcd 3.7
    // reads keys only from its index (no lease) unless it sorts by value.
    let mut more = false;
    if req.limit > 0 && i64::try_from(kvs.len()).unwrap() > req.limit {
        kvs.truncate(usize::try_from(req.limit).unwrap());
        more = true;
    }
    if req.keys_only {
        let from_index = req.sort_target != SortTarget::Value;
        for kv in &mut kvs {
            kv.value = Bytes::new();
            if from_index {
                kv.lease = 0;
            }
        }
    }
    let mut expected = RangeResponse::default();
    (expected.kvs, expected.more, expected.count, expected.revision) = (kvs, more, count, at);
    Ok(expected)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_the_model(ops in prop::collection::vec(op(), 1..60)) {
        let mut store = Store::new();
        // An empty store is at revision 1, as in etcd.
        let mut model = Model { current: 1, ..Model::default() };
        for op in ops {
            step(&mut store, &mut model, op)?;
        }
    }

    #[test]
    fn range_requests_match_etcd_on_the_model(
        ops in prop::collection::vec(history_op(), 0..40),
        requests in prop::collection::vec(request(), 1..40),
    ) {
        let mut store = Store::new();
        let mut model = Model { current: 1, ..Model::default() };
        for op in ops {
            step(&mut store, &mut model, op)?;
        }
        for request in &requests {
            let req = request.build(&model);
            let got = req.apply(&store);
            let expected = etcd_range(&model, &req);
            prop_assert_eq!(got, expected, "{:?}", req);
        }
    }
}

/// A smallest case of an etcd behaviour cairn once got wrong (regression tests).
struct Divergence {
    /// `(index into KEYS, index into VALUES)`, one write each.
    puts: &'static [(usize, usize)],
    request: RangeRequest,
    /// The keys etcd returns, and its `more`.
    keys: &'static [&'static [u8]],
    more: bool,
}

impl Divergence {
    fn store_and_model(&self) -> (Store, Model) {
        let mut store = Store::new();
        let mut model = Model {
            current: 1,
            ..Model::default()
        };
        for &(key, value) in self.puts {
            step(
                &mut store,
                &mut model,
                Op::Write(vec![Change::Put { key, value, lease: 0 }]),
            )
            .unwrap();
        }
        (store, model)
    }
}

/// a = "m", b = "f", read with keys_only and sorted by value: etcd sorts by the values, then
/// empties them (`asembleRangeResponse` runs after `sortRangeResults`), so b, a.
fn keys_only_by_value() -> Divergence {
    Divergence {
        puts: &[(0, 1), (3, 4)],
        request: RangeRequest {
            sort_target: SortTarget::Value,
            keys_only: true,
            ..RangeRequest::all()
        },
        keys: &[b"b", b"a"],
        more: false,
    }
}

/// a = "mn", b = "m", c = "", sorted by value with no sort order and limit 1: etcd's
/// `rangeLimit` has mvcc read a and b only (limit + 1, key order), sorts them by value (b, a)
/// and returns b.
fn limit_with_no_sort_order() -> Divergence {
    Divergence {
        puts: &[(0, 3), (3, 1), (4, 0)],
        request: RangeRequest {
            sort_target: SortTarget::Value,
            limit: 1,
            ..RangeRequest::all()
        },
        keys: &[b"b"],
        more: true,
    }
}

fn keys_and_more(resp: &RangeResponse) -> (Vec<&[u8]>, bool) {
    (resp.kvs.iter().map(|kv| kv.key.as_ref()).collect(), resp.more)
}

#[test]
fn the_model_answers_as_etcd_in_the_regression_cases() {
    for d in [keys_only_by_value(), limit_with_no_sort_order()] {
        let (_, model) = d.store_and_model();
        let resp = etcd_range(&model, &d.request).unwrap();
        assert_eq!(keys_and_more(&resp), (d.keys.to_vec(), d.more), "{:?}", d.request);
    }
}

#[test]
fn keys_only_sorts_by_the_values() {
    let d = keys_only_by_value();
    let (store, _) = d.store_and_model();
    let resp = d.request.apply(&store).unwrap();
    assert_eq!(keys_and_more(&resp), (d.keys.to_vec(), d.more));
}

#[test]
fn a_limit_with_no_sort_order_sorts_the_first_keys_only() {
    let d = limit_with_no_sort_order();
    let (store, _) = d.store_and_model();
    let resp = d.request.apply(&store).unwrap();
    assert_eq!(keys_and_more(&resp), (d.keys.to_vec(), d.more));
}
