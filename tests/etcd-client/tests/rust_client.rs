//! cairn driven by a Rust etcd client, the `etcd-client` crate, against a single fresh member
//! per test (so revisions are exact, starting at 1): KV put/get/delete with their options
//! (prev_kv, prefix, from-key, limit, sort, revision, keys_only, count_only), txn compares and
//! both branches with nested txn responses, compaction and the compacted error, watch (prefix +
//! prev_kv in revision order, replay from a past revision, filters, cancel, progress requests,
//! a watch below the compaction), leases (grant, keep-alive stream, time-to-live with keys,
//! list, revoke deleting attached keys in one revision, expiry) and maintenance (status,
//! member list, hash_kv, alarm list, defragment, snapshot with its SHA-256 trailer).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;

use std::time::{Duration, Instant};

use etcd_client::{
    AlarmAction, AlarmType, Client, Compare, CompareOp, DeleteOptions, Error, EventType, GetOptions, KeyValue,
    LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions, WatchResponse, WatchStream,
};
use sha2::{Digest, Sha256};
use tonic::Code;

use common::{assert_status, next_message, Member, PATIENCE};

const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
const FUTURE_REV: &str = "etcdserver: mvcc: required revision is a future revision";
const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";

/// (key, value, create_revision, mod_revision, version, lease) of a KeyValue.
type Kv = (String, String, i64, i64, i64, i64);

fn kv(kv: &KeyValue) -> Kv {
    (
        String::from_utf8_lossy(kv.key()).into_owned(),
        String::from_utf8_lossy(kv.value()).into_owned(),
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        kv.lease(),
    )
}

fn kvs(list: &[KeyValue]) -> Vec<Kv> {
    list.iter().map(kv).collect()
}

/// Where a key is in the history: its create revision, its last mod revision and its version.
#[derive(Clone, Copy)]
struct Revisions(i64, i64, i64);

fn t(key: &str, value: &str, Revisions(create, modr, version): Revisions) -> Kv {
    (key.to_string(), value.to_string(), create, modr, version, 0)
}

fn keys(list: &[KeyValue]) -> Vec<String> {
    list.iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

fn rev(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.expect("response header").revision()
}

/// A watch event as (type, key, value, create, mod, version, prev (value, mod) if any).
type Ev = (EventType, String, String, i64, i64, i64, Option<(String, i64)>);

fn events(resp: &WatchResponse) -> Vec<Ev> {
    resp.events()
        .iter()
        .map(|e| {
            let kv = e.kv().expect("event kv");
            (
                e.event_type(),
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                e.prev_kv()
                    .map(|p| (String::from_utf8_lossy(p.value()).into_owned(), p.mod_revision())),
            )
        })
        .collect()
}

/// Reads responses of `watch_id` until `count` events have arrived. Checks that a revision's
/// events are never split across responses (a catch-up response may carry several revisions)
/// and that a header's revision is at least its events' revision.
async fn collect_events(stream: &mut WatchStream, watch_id: i64, count: usize) -> Vec<Ev> {
    let mut out: Vec<Ev> = Vec::new();
    while out.len() < count {
        let resp = next_message(stream).await;
        assert_eq!(resp.watch_id(), watch_id, "{resp:?}");
        assert!(!resp.canceled(), "{resp:?}");
        let evs = events(&resp);
        if let (Some(first), Some(last)) = (evs.first(), evs.last()) {
            if let Some(previous) = out.last() {
                assert!(first.4 > previous.4, "revision {} split: {resp:?}", previous.4);
            }
            assert!(rev(resp.header()) >= last.4, "{resp:?}");
        }
        out.extend(evs);
    }
    assert_eq!(out.len(), count, "{out:?}");
    out
}

fn put(key: &str, value: &str, Revisions(create, modr, version): Revisions, prev: Option<(&str, i64)>) -> Ev {
    (
        EventType::Put,
        key.to_string(),
        value.to_string(),
        create,
        modr,
        version,
        prev.map(|(v, r)| (v.to_string(), r)),
    )
}

fn del(key: &str, modr: i64, prev: Option<(&str, i64)>) -> Ev {
    (
        EventType::Delete,
        key.to_string(),
        String::new(),
        0,
        modr,
        0,
        prev.map(|(v, r)| (v.to_string(), r)),
    )
}

#[tokio::test]
async fn kv_put_get_delete_with_options() {
    let (_member, mut c) = Member::start("kv").await;

    // A fresh store is at revision 1.
    let r = c.get("k/a", None).await.unwrap();
    assert_eq!((rev(r.header()), r.count(), r.kvs().len()), (1, 0, 0));

    // Put, with and without prev_kv.
    let r = c
        .put("k/a", "1", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!(rev(r.header()), 2);
    assert!(r.prev_key().is_none());
    let r = c
        .put("k/a", "2", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!(rev(r.header()), 3);
    assert_eq!(kv(r.prev_key().unwrap()), t("k/a", "1", Revisions(2, 2, 1)));
    assert_eq!(rev(c.put("k/b", "3", None).await.unwrap().header()), 4);
    assert_eq!(rev(c.put("k/c", "0", None).await.unwrap().header()), 5);
    assert_eq!(rev(c.put("other", "x", None).await.unwrap().header()), 6);

    // Single key.
    let r = c.get("k/a", None).await.unwrap();
    assert_eq!(rev(r.header()), 6);
    assert_eq!((r.count(), r.more()), (1, false));
    assert_eq!(kvs(r.kvs()), vec![t("k/a", "2", Revisions(2, 3, 2))]);

    // Prefix.
    let r = c.get("k/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(
        kvs(r.kvs()),
        vec![
            t("k/a", "2", Revisions(2, 3, 2)),
            t("k/b", "3", Revisions(4, 4, 1)),
            t("k/c", "0", Revisions(5, 5, 1))
        ]
    );
    assert_eq!((r.count(), r.more()), (3, false));

    // Limit: count ignores it, more says keys remain.
    let r = c
        .get("k/", Some(GetOptions::new().with_prefix().with_limit(2)))
        .await
        .unwrap();
    assert_eq!(keys(r.kvs()), ["k/a", "k/b"]);
    assert_eq!((r.count(), r.more()), (3, true));
    let r = c
        .get("k/", Some(GetOptions::new().with_prefix().with_limit(3)))
        .await
        .unwrap();
    assert_eq!((r.kvs().len(), r.count(), r.more()), (3, 3, false));

    // Sort.
    let sorted = |target, order| GetOptions::new().with_prefix().with_sort(target, order);
    let r = c
        .get("k/", Some(sorted(SortTarget::Value, SortOrder::Descend)))
        .await
        .unwrap();
    assert_eq!(keys(r.kvs()), ["k/b", "k/a", "k/c"]);
    let r = c
        .get("k/", Some(sorted(SortTarget::Key, SortOrder::Descend)))
        .await
        .unwrap();
    assert_eq!(keys(r.kvs()), ["k/c", "k/b", "k/a"]);
    let r = c
        .get("k/", Some(sorted(SortTarget::Mod, SortOrder::Ascend)))
        .await
        .unwrap();
    assert_eq!(keys(r.kvs()), ["k/a", "k/b", "k/c"]);
    let r = c
        .get("k/", Some(sorted(SortTarget::Version, SortOrder::Descend)))
        .await
        .unwrap();
    assert_eq!(keys(r.kvs())[0], "k/a");
    let r = c
        .get("k/", Some(sorted(SortTarget::Create, SortOrder::Descend).with_limit(1)))
        .await
        .unwrap();
    assert_eq!(keys(r.kvs()), ["k/c"]);
    assert_eq!((r.count(), r.more()), (3, true));

    // Past revisions (the header's revision: see range_at_a_past_revision_has_current_header).
    let r = c
        .get("k/", Some(GetOptions::new().with_prefix().with_revision(3)))
        .await
        .unwrap();
    assert_eq!(kvs(r.kvs()), vec![t("k/a", "2", Revisions(2, 3, 2))]);
    assert_eq!(r.count(), 1);
    let r = c.get("k/a", Some(GetOptions::new().with_revision(2))).await.unwrap();
    assert_eq!(kvs(r.kvs()), vec![t("k/a", "1", Revisions(2, 2, 1))]);
    let r = c.get("k/a", Some(GetOptions::new().with_revision(1))).await.unwrap();
    assert_eq!((r.count(), r.kvs().len()), (0, 0));
    assert_status(
        c.get("k/a", Some(GetOptions::new().with_revision(7))).await,
        Code::OutOfRange,
        FUTURE_REV,
    );

    // keys_only and count_only.
    let r = c
        .get("k/", Some(GetOptions::new().with_prefix().with_keys_only()))
        .await
        .unwrap();
    assert_eq!(
        kvs(r.kvs()),
        vec![
            t("k/a", "", Revisions(2, 3, 2)),
            t("k/b", "", Revisions(4, 4, 1)),
            t("k/c", "", Revisions(5, 5, 1))
        ]
    );
    let r = c
        .get("k/", Some(GetOptions::new().with_prefix().with_count_only()))
        .await
        .unwrap();
    assert_eq!((r.count(), r.kvs().len()), (3, 0));
    let r = c
        .get(
            "k/",
            Some(GetOptions::new().with_prefix().with_count_only().with_revision(4)),
        )
        .await
        .unwrap();
    assert_eq!((r.count(), r.kvs().len()), (2, 0));

    // From-key and all keys.
    let r = c.get("k/b", Some(GetOptions::new().with_from_key())).await.unwrap();
    assert_eq!(keys(r.kvs()), ["k/b", "k/c", "other"]);
    let r = c.get("", Some(GetOptions::new().with_all_keys())).await.unwrap();
    assert_eq!(keys(r.kvs()), ["k/a", "k/b", "k/c", "other"]);
    let r = c.get("k/a", Some(GetOptions::new().with_range("k/c"))).await.unwrap();
    assert_eq!(keys(r.kvs()), ["k/a", "k/b"]);

    // Min/max mod revision filters leave count alone.
    let r = c
        .get("k/", Some(GetOptions::new().with_prefix().with_min_mod_revision(4)))
        .await
        .unwrap();
    assert_eq!(keys(r.kvs()), ["k/b", "k/c"]);
    assert_eq!(r.count(), 3);

    // Delete: nothing deleted does not bump the revision.
    let r = c.delete("k/zzz", None).await.unwrap();
    assert_eq!((r.deleted(), rev(r.header())), (0, 6));
    let r = c
        .delete("k/a", Some(DeleteOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!((r.deleted(), rev(r.header())), (1, 7));
    assert_eq!(kvs(r.prev_kvs()), vec![t("k/a", "2", Revisions(2, 3, 2))]);
    let r = c
        .delete("k/", Some(DeleteOptions::new().with_prefix().with_prev_key()))
        .await
        .unwrap();
    assert_eq!((r.deleted(), rev(r.header())), (2, 8));
    assert_eq!(
        kvs(r.prev_kvs()),
        vec![t("k/b", "3", Revisions(4, 4, 1)), t("k/c", "0", Revisions(5, 5, 1))]
    );
    let r = c.delete("k/", Some(DeleteOptions::new().with_prefix())).await.unwrap();
    assert_eq!((r.deleted(), rev(r.header()), r.prev_kvs().len()), (0, 8, 0));
    let r = c.get("k/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!((r.count(), rev(r.header())), (0, 8));
    let r = c
        .get("k/", Some(GetOptions::new().with_prefix().with_revision(7)))
        .await
        .unwrap();
    assert_eq!(keys(r.kvs()), ["k/b", "k/c"]);

    // A re-created key starts again at version 1.
    assert_eq!(rev(c.put("k/a", "again", None).await.unwrap().header()), 9);
    let r = c.get("k/a", None).await.unwrap();
    assert_eq!(kvs(r.kvs()), vec![t("k/a", "again", Revisions(9, 9, 1))]);

    // Errors.
    assert_status(
        c.put("", "v", None).await,
        Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
    assert_status(
        c.put("missing", "", Some(PutOptions::new().with_ignore_value())).await,
        Code::InvalidArgument,
        "etcdserver: key not found",
    );
    assert_status(
        c.put("k/a", "v", Some(PutOptions::new().with_ignore_value())).await,
        Code::InvalidArgument,
        "etcdserver: value is provided",
    );
    assert_status(
        c.put("k/a", "v", Some(PutOptions::new().with_lease(12345))).await,
        Code::NotFound,
        LEASE_NOT_FOUND,
    );
    // ignore_value keeps the value and bumps the version.
    let r = c
        .put("k/a", "", Some(PutOptions::new().with_ignore_value()))
        .await
        .unwrap();
    assert_eq!(rev(r.header()), 10);
    let r = c.get("k/a", None).await.unwrap();
    assert_eq!(kvs(r.kvs()), vec![t("k/a", "again", Revisions(9, 10, 2))]);
}

/// etcd answers a Range at a past revision with the store's current revision in the header
/// (mvcc's `RangeResult.Rev` is `curRev`), as for a latest read; checked against etcd 3.4.23.
#[tokio::test]
async fn range_at_a_past_revision_has_current_header() {
    let (_member, mut c) = Member::start("kv-header").await;
    c.put("a", "1", None).await.unwrap(); // 2
    c.put("a", "2", None).await.unwrap(); // 3
    c.put("b", "1", None).await.unwrap(); // 4
    let r = c.get("a", Some(GetOptions::new().with_revision(2))).await.unwrap();
    assert_eq!(kvs(r.kvs()), vec![t("a", "1", Revisions(2, 2, 1))]);
    assert_eq!(rev(r.header()), 4);
    let r = c
        .get(
            "",
            Some(GetOptions::new().with_all_keys().with_count_only().with_revision(3)),
        )
        .await
        .unwrap();
    assert_eq!((r.count(), rev(r.header())), (1, 4));
}

#[tokio::test]
async fn txn_compares_branches_and_nested_responses() {
    let (_member, mut c) = Member::start("txn").await;
    assert_eq!(rev(c.put("a", "1", None).await.unwrap().header()), 2);
    assert_eq!(rev(c.put("b", "1", None).await.unwrap().header()), 3);

    // All compares true: the success branch runs, all its writes share revision 4.
    let txn = Txn::new()
        .when([
            Compare::version("a", CompareOp::Equal, 1),
            Compare::value("b", CompareOp::Equal, "1"),
            Compare::mod_revision("a", CompareOp::Equal, 2),
            Compare::create_revision("missing", CompareOp::Equal, 0),
            Compare::version("missing", CompareOp::Equal, 0),
            Compare::lease("a", CompareOp::Equal, 0),
        ])
        .and_then([
            TxnOp::put("a", "2", Some(PutOptions::new().with_prev_key())),
            TxnOp::get("a", None),
            TxnOp::delete("b", Some(DeleteOptions::new().with_prev_key())),
            TxnOp::txn(
                Txn::new()
                    .when([Compare::version("c", CompareOp::Equal, 0)])
                    .and_then([TxnOp::put("c", "3", None)])
                    .or_else([TxnOp::get("c", None)]),
            ),
        ])
        .or_else([TxnOp::put("failed", "1", None)]);
    let r = c.txn(txn).await.unwrap();
    assert!(r.succeeded());
    assert_eq!(rev(r.header()), 4);
    let ops = r.op_responses();
    assert_eq!(ops.len(), 4);
    match &ops[0] {
        TxnOpResponse::Put(p) => {
            assert_eq!(kv(p.prev_key().unwrap()), t("a", "1", Revisions(2, 2, 1)));
            assert_eq!(rev(p.header()), 4);
        }
        other => panic!("expected a put response, got {other:?}"),
    }
    match &ops[1] {
        // A range after a put in the same txn sees the put.
        TxnOpResponse::Get(g) => {
            assert_eq!(kvs(g.kvs()), vec![t("a", "2", Revisions(2, 4, 2))]);
            assert_eq!(g.count(), 1);
        }
        other => panic!("expected a range response, got {other:?}"),
    }
    match &ops[2] {
        TxnOpResponse::Delete(d) => {
            assert_eq!(d.deleted(), 1);
            assert_eq!(kvs(d.prev_kvs()), vec![t("b", "1", Revisions(3, 3, 1))]);
        }
        other => panic!("expected a delete response, got {other:?}"),
    }
    match &ops[3] {
        TxnOpResponse::Txn(nested) => {
            assert!(nested.succeeded());
            let inner = nested.op_responses();
            assert_eq!(inner.len(), 1);
            assert!(matches!(inner[0], TxnOpResponse::Put(_)), "{inner:?}");
        }
        other => panic!("expected a txn response, got {other:?}"),
    }
    let r = c.get("", Some(GetOptions::new().with_all_keys())).await.unwrap();
    assert_eq!(rev(r.header()), 4);
    assert_eq!(
        kvs(r.kvs()),
        vec![t("a", "2", Revisions(2, 4, 2)), t("c", "3", Revisions(4, 4, 1))]
    );

    // A failing compare runs the failure branch; a read-only branch does not bump the revision.
    let r = c
        .txn(
            Txn::new()
                .when([Compare::value("a", CompareOp::Equal, "nope")])
                .and_then([TxnOp::put("x", "1", None)])
                .or_else([TxnOp::get("a", None), TxnOp::get("x", None)]),
        )
        .await
        .unwrap();
    assert!(!r.succeeded());
    assert_eq!(rev(r.header()), 4);
    let ops = r.op_responses();
    assert_eq!(ops.len(), 2);
    match (&ops[0], &ops[1]) {
        (TxnOpResponse::Get(a), TxnOpResponse::Get(x)) => {
            assert_eq!(kvs(a.kvs()), vec![t("a", "2", Revisions(2, 4, 2))]);
            assert_eq!((x.count(), x.kvs().len()), (0, 0));
        }
        other => panic!("expected two range responses, got {other:?}"),
    }

    // Compares are ANDed: one false compare among true ones fails the txn; the failure
    // branch writes, so the revision moves by exactly one.
    let r = c
        .txn(
            Txn::new()
                .when([
                    Compare::version("a", CompareOp::Equal, 2),
                    Compare::version("a", CompareOp::Greater, 5),
                ])
                .and_then([TxnOp::put("x", "then", None)])
                .or_else([TxnOp::put("d", "else", None), TxnOp::put("e", "else", None)]),
        )
        .await
        .unwrap();
    assert!(!r.succeeded());
    assert_eq!(rev(r.header()), 5);
    let r = c.get("d", None).await.unwrap();
    assert_eq!(kvs(r.kvs()), vec![t("d", "else", Revisions(5, 5, 1))]);
    assert_eq!(c.get("x", None).await.unwrap().count(), 0);

    // GREATER, LESS, NOT_EQUAL on each target.
    let r = c
        .txn(Txn::new().when([
            Compare::version("a", CompareOp::Less, 3),
            Compare::mod_revision("a", CompareOp::Greater, 3),
            Compare::value("a", CompareOp::NotEqual, "x"),
            Compare::value("a", CompareOp::Greater, "1"),
            Compare::value("a", CompareOp::Less, "3"),
            Compare::create_revision("a", CompareOp::Equal, 2),
            Compare::create_revision("a", CompareOp::NotEqual, 3),
            Compare::lease("a", CompareOp::NotEqual, 7),
        ]))
        .await
        .unwrap();
    assert!(r.succeeded());
    assert_eq!(rev(r.header()), 5);

    // A compare over a range holds only if it holds for every key in it (a, c, d, e).
    let r = c
        .txn(Txn::new().when([Compare::create_revision("a", CompareOp::Greater, 1).with_range("z")]))
        .await
        .unwrap();
    assert!(r.succeeded());
    let r = c
        .txn(Txn::new().when([Compare::create_revision("a", CompareOp::Less, 5).with_range("z")]))
        .await
        .unwrap();
    assert!(!r.succeeded());
    let r = c
        .txn(Txn::new().when([Compare::value("d", CompareOp::Equal, "else").with_prefix()]))
        .await
        .unwrap();
    assert!(r.succeeded());

    // The same key written twice in one txn is refused.
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::put("a", "1", None), TxnOp::put("a", "2", None)]))
            .await,
        Code::InvalidArgument,
        "etcdserver: duplicate key given in txn request",
    );
    assert_eq!(rev(c.get("a", None).await.unwrap().header()), 5);
}

#[tokio::test]
async fn compaction_and_compacted_reads() {
    let (_member, mut c) = Member::start("compact").await;
    for (i, value) in ["v1", "v2", "v3", "v4", "v5"].into_iter().enumerate() {
        let r = c.put("k", value, None).await.unwrap();
        assert_eq!(rev(r.header()), i as i64 + 2);
    }
    // k: v1@2 v2@3 v3@4 v4@5 v5@6; another key deleted before the compaction point.
    assert_eq!(rev(c.put("gone", "x", None).await.unwrap().header()), 7);
    assert_eq!(rev(c.delete("gone", None).await.unwrap().header()), 8);

    let r = c.compact(4, None).await.unwrap();
    assert_eq!(rev(r.header()), 8);
    assert_eq!(c.hash_kv(0).await.unwrap().compact_version(), 4);

    let r = c.get("k", Some(GetOptions::new().with_revision(3))).await;
    assert_status(r, Code::OutOfRange, COMPACTED);
    let r = c.get("k", Some(GetOptions::new().with_revision(1))).await;
    assert_status(r, Code::OutOfRange, COMPACTED);
    // At the compaction revision the newest version at or below it is kept.
    let r = c.get("k", Some(GetOptions::new().with_revision(4))).await.unwrap();
    assert_eq!(kvs(r.kvs()), vec![t("k", "v3", Revisions(2, 4, 3))]);
    let r = c.get("k", Some(GetOptions::new().with_revision(5))).await.unwrap();
    assert_eq!(kvs(r.kvs()), vec![t("k", "v4", Revisions(2, 5, 4))]);
    let r = c.get("gone", Some(GetOptions::new().with_revision(7))).await.unwrap();
    assert_eq!(kvs(r.kvs()), vec![t("gone", "x", Revisions(7, 7, 1))]);

    // Compacting at or below the current compaction, or into the future, fails.
    assert_status(c.compact(4, None).await, Code::OutOfRange, COMPACTED);
    assert_status(c.compact(3, None).await, Code::OutOfRange, COMPACTED);
    assert_status(c.compact(9, None).await, Code::OutOfRange, FUTURE_REV);

    // A txn reading below the compaction fails the same way.
    let r = c
        .txn(Txn::new().and_then([TxnOp::get("k", Some(GetOptions::new().with_revision(2)))]))
        .await;
    assert_status(r, Code::OutOfRange, COMPACTED);

    // Physical compaction to the latest revision; the latest value stays readable.
    c.compact(8, Some(etcd_client::CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    let r = c.get("k", Some(GetOptions::new().with_revision(7))).await;
    assert_status(r, Code::OutOfRange, COMPACTED);
    let r = c.get("k", None).await.unwrap();
    assert_eq!(kvs(r.kvs()), vec![t("k", "v5", Revisions(2, 6, 5))]);
    assert_eq!(c.get("gone", None).await.unwrap().count(), 0);

    // A watch starting below the compaction is canceled with compact_revision set.
    let mut w = c
        .watch("k", Some(WatchOptions::new().with_start_revision(3)))
        .await
        .unwrap();
    let resp = loop {
        let resp = next_message(&mut w).await;
        assert!(resp.events().is_empty(), "{resp:?}");
        if resp.canceled() {
            break resp;
        }
        assert!(resp.created(), "{resp:?}");
    };
    assert_eq!(resp.compact_revision(), 8, "{resp:?}");
}

#[tokio::test]
async fn watch_prefix_prev_kv_replay_cancel_progress() {
    let (_member, mut c) = Member::start("watch").await;

    let mut w = c
        .watch("w/", Some(WatchOptions::new().with_prefix().with_prev_key()))
        .await
        .unwrap();
    let created = next_message(&mut w).await;
    assert!(created.created() && !created.canceled(), "{created:?}");
    assert_eq!(rev(created.header()), 1);
    assert!(created.events().is_empty());
    let id = created.watch_id();

    c.put("w/a", "1", None).await.unwrap(); // 2
    c.put("w/a", "2", None).await.unwrap(); // 3
    c.put("other", "x", None).await.unwrap(); // 4, not watched
    c.delete("w/a", None).await.unwrap(); // 5
    let r = c
        .txn(Txn::new().and_then([TxnOp::put("w/b", "b", None), TxnOp::put("w/c", "c", None)]))
        .await
        .unwrap(); // 6
    assert_eq!(rev(r.header()), 6);
    let r = c.delete("w/", Some(DeleteOptions::new().with_prefix())).await.unwrap(); // 7
    assert_eq!(rev(r.header()), 7);

    let expected = vec![
        put("w/a", "1", Revisions(2, 2, 1), None),
        put("w/a", "2", Revisions(2, 3, 2), Some(("1", 2))),
        del("w/a", 5, Some(("2", 3))),
        put("w/b", "b", Revisions(6, 6, 1), None),
        put("w/c", "c", Revisions(6, 6, 1), None),
        del("w/b", 7, Some(("b", 6))),
        del("w/c", 7, Some(("c", 6))),
    ];
    assert_eq!(collect_events(&mut w, id, 7).await, expected);

    // Every watcher on the stream has caught up: a progress request is answered with
    // watch_id -1 and the current revision.
    w.request_progress().await.unwrap();
    let p = next_message(&mut w).await;
    assert_eq!(
        (
            p.watch_id(),
            rev(p.header()),
            p.events().len(),
            p.created(),
            p.canceled()
        ),
        (-1, 7, 0, false, false),
        "{p:?}"
    );

    // Cancel: answered with canceled for that id; later writes reach only the other watcher.
    w.cancel(id).await.unwrap();
    let r = next_message(&mut w).await;
    assert!(r.canceled(), "{r:?}");
    assert_eq!(r.watch_id(), id);
    w.watch("w/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    let created2 = next_message(&mut w).await;
    assert!(created2.created(), "{created2:?}");
    let id2 = created2.watch_id();
    assert_ne!(id2, id);
    c.put("w/z", "z", None).await.unwrap(); // 8
    assert_eq!(
        collect_events(&mut w, id2, 1).await,
        vec![put("w/z", "z", Revisions(8, 8, 1), None)]
    );
    w.request_progress().await.unwrap();
    let p = next_message(&mut w).await;
    assert_eq!((p.watch_id(), rev(p.header()), p.events().len()), (-1, 8, 0), "{p:?}");

    // A watch from a past revision replays history, with prev_kv.
    let mut replay = c
        .watch(
            "w/",
            Some(WatchOptions::new().with_prefix().with_prev_key().with_start_revision(2)),
        )
        .await
        .unwrap();
    let created = next_message(&mut replay).await;
    assert!(created.created(), "{created:?}");
    let mut all = expected.clone();
    all.push(put("w/z", "z", Revisions(8, 8, 1), None));
    assert_eq!(collect_events(&mut replay, created.watch_id(), 8).await, all);

    // A single key from revision 1, with a client-chosen watch id on the same stream.
    replay
        .watch(
            "w/a",
            Some(WatchOptions::new().with_start_revision(1).with_watch_id(42)),
        )
        .await
        .unwrap();
    let created = next_message(&mut replay).await;
    assert_eq!((created.created(), created.watch_id()), (true, 42), "{created:?}");
    assert_eq!(
        collect_events(&mut replay, 42, 3).await,
        vec![
            put("w/a", "1", Revisions(2, 2, 1), None),
            put("w/a", "2", Revisions(2, 3, 2), None),
            del("w/a", 5, None),
        ]
    );

    // Filters: NOPUT leaves only the deletes.
    let mut deletes = c
        .watch(
            "w/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(2)
                    .with_filters([WatchFilterType::NoPut]),
            ),
        )
        .await
        .unwrap();
    let created = next_message(&mut deletes).await;
    assert!(created.created(), "{created:?}");
    assert_eq!(
        collect_events(&mut deletes, created.watch_id(), 3).await,
        vec![del("w/a", 5, None), del("w/b", 7, None), del("w/c", 7, None)]
    );

    // A future start revision waits for it.
    let mut future = c
        .watch("w/", Some(WatchOptions::new().with_prefix().with_start_revision(10)))
        .await
        .unwrap();
    let created = next_message(&mut future).await;
    assert!(created.created(), "{created:?}");
    c.put("w/f", "9", None).await.unwrap(); // 9
    c.put("w/f", "10", None).await.unwrap(); // 10
    assert_eq!(
        collect_events(&mut future, created.watch_id(), 1).await,
        vec![put("w/f", "10", Revisions(9, 10, 2), None)]
    );
}

#[tokio::test]
async fn lease_grant_keep_alive_ttl_revoke() {
    let (_member, mut c) = Member::start("lease").await;

    let g = c.lease_grant(60, None).await.unwrap();
    assert_eq!(g.ttl(), 60);
    assert_ne!(g.id(), 0);
    assert_eq!(g.error(), "");
    let lease = g.id();
    // A lease grant does not change the revision.
    assert_eq!(rev(g.header()), 1);

    let g = c
        .lease_grant(30, Some(LeaseGrantOptions::new().with_id(1234)))
        .await
        .unwrap();
    assert_eq!((g.id(), g.ttl()), (1234, 30));
    assert_status(
        c.lease_grant(30, Some(LeaseGrantOptions::new().with_id(1234))).await,
        Code::FailedPrecondition,
        "etcdserver: lease already exists",
    );
    // A TTL below the minimum (2 s with the default election timeout) is raised to it.
    let short = c.lease_grant(1, None).await.unwrap();
    assert_eq!(short.ttl(), 2);

    c.put("l/1", "a", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap(); // 2
    c.put("l/2", "b", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap(); // 3
    c.put("l/3", "c", None).await.unwrap(); // 4
    let r = c.get("l/1", None).await.unwrap();
    assert_eq!(kvs(r.kvs()), vec![("l/1".to_string(), "a".to_string(), 2, 2, 1, lease)]);

    // TimeToLive with keys.
    let ttl = c
        .lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!((ttl.id(), ttl.granted_ttl()), (lease, 60));
    assert!(ttl.ttl() > 50 && ttl.ttl() <= 60, "{ttl:?}");
    let mut attached: Vec<&[u8]> = ttl.keys().iter().map(Vec::as_slice).collect();
    attached.sort();
    assert_eq!(attached, [b"l/1".as_slice(), b"l/2".as_slice()]);
    let ttl = c.lease_time_to_live(lease, None).await.unwrap();
    assert!(ttl.keys().is_empty(), "{ttl:?}");

    // Keep-alive stream: each keep-alive request is answered with the granted TTL.
    let (mut keeper, mut stream) = c.lease_keep_alive(lease).await.unwrap();
    assert_eq!(keeper.id(), lease);
    for _ in 0..2 {
        keeper.keep_alive().await.unwrap();
        let resp = tokio::time::timeout(PATIENCE, stream.message())
            .await
            .expect("keep-alive response in time")
            .unwrap()
            .expect("keep-alive stream open");
        assert_eq!((resp.id(), resp.ttl()), (lease, 60));
    }
    // Keep-alive of an unknown lease answers TTL 0 (which the client turns into an error).
    match c.lease_keep_alive(999_999).await {
        Err(Error::LeaseKeepAliveError(_)) => {}
        other => panic!("expected a keep-alive error for an unknown lease, got {other:?}"),
    }

    // Leases list.
    let mut ids: Vec<i64> = c.leases().await.unwrap().leases().iter().map(|l| l.id()).collect();
    ids.sort_unstable();
    let mut want = vec![lease, 1234, short.id()];
    want.sort_unstable();
    assert_eq!(ids, want);

    // TimeToLive of an unknown lease: TTL -1, no error.
    let ttl = c.lease_time_to_live(999_999, None).await.unwrap();
    assert_eq!(ttl.ttl(), -1);

    // Revoke deletes every attached key in one revision.
    let r = c.lease_revoke(lease).await.unwrap();
    assert_eq!(rev(r.header()), 5);
    let r = c.get("l/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(keys(r.kvs()), ["l/3"]);
    assert_eq!(rev(r.header()), 5);
    let r = c
        .get("l/", Some(GetOptions::new().with_prefix().with_revision(4)))
        .await
        .unwrap();
    assert_eq!(keys(r.kvs()), ["l/1", "l/2", "l/3"]);
    let ttl = c.lease_time_to_live(lease, None).await.unwrap();
    assert_eq!(ttl.ttl(), -1);
    assert_status(c.lease_revoke(lease).await, Code::NotFound, LEASE_NOT_FOUND);
    assert_status(
        c.put("l/4", "d", Some(PutOptions::new().with_lease(lease))).await,
        Code::NotFound,
        LEASE_NOT_FOUND,
    );

    // The short lease expires on its own and takes its key with it.
    c.put("l/short", "s", Some(PutOptions::new().with_lease(short.id())))
        .await
        .unwrap(); // 6
    let deadline = Instant::now() + PATIENCE;
    loop {
        if c.get("l/short", None).await.unwrap().count() == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the 2 s lease never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(c.lease_time_to_live(short.id(), None).await.unwrap().ttl(), -1);
    let r = c.get("l/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(rev(r.header()), 7);
}

/// The writes both members of the HashKV comparison get: revisions 2 to 5.
async fn writes(c: &mut Client) {
    c.put("h/a", "1", None).await.unwrap();
    c.put("h/b", "2", None).await.unwrap();
    c.put("h/a", "3", None).await.unwrap();
    c.delete("h/b", None).await.unwrap();
}

#[tokio::test]
async fn maintenance_status_members_hash_alarm_defrag_snapshot() {
    let (member, mut c) = Member::start("maint").await;

    // Status.
    let s = c.status().await.unwrap();
    let header = s.header().expect("status header");
    let member_id = header.member_id();
    assert_ne!(member_id, 0);
    assert_ne!(header.cluster_id(), 0);
    assert_eq!(s.version(), "3.6.0");
    assert_eq!(s.leader(), member_id);
    assert!(s.raft_term() >= 1, "{s:?}");
    assert!(s.raft_index() >= 1, "{s:?}");
    assert!(s.db_size() > 0, "{s:?}");
    assert!(s.errors().is_empty(), "{s:?}");
    assert!(!s.is_learner());

    // Member list: just this member, with the name and URLs it was started with.
    let list = c.member_list().await.unwrap();
    let members = list.members();
    assert_eq!(members.len(), 1, "{members:?}");
    let m = &members[0];
    assert_eq!(m.id(), member_id);
    assert_eq!(m.name(), member.name);
    assert_eq!(m.peer_urls(), std::slice::from_ref(&member.peer_url));
    assert_eq!(m.client_urls(), std::slice::from_ref(&member.client_url));
    assert!(!m.is_learner());

    // Alarms: none.
    let alarms = c.alarm(AlarmAction::Get, AlarmType::None, None).await.unwrap();
    let alarms: Vec<_> = alarms.alarms().iter().map(|a| (a.member_id(), a.alarm())).collect();
    assert!(alarms.is_empty(), "{alarms:?}");

    // HashKV: stable for an unchanged state, and for a past revision after new writes; equal
    // on another member that was given the same writes.
    writes(&mut c).await;
    let h1 = c.hash_kv(0).await.unwrap();
    let h2 = c.hash_kv(0).await.unwrap();
    assert_eq!(h1.hash(), h2.hash());
    assert_eq!((h1.hash_revision(), rev(h1.header())), (5, 5));
    let (_other, mut c2) = Member::start("maint-twin").await;
    writes(&mut c2).await;
    let twin = c2.hash_kv(0).await.unwrap();
    assert_eq!((twin.hash(), twin.hash_revision()), (h1.hash(), 5));
    c.put("h/c", "4", None).await.unwrap(); // 6
    let h3 = c.hash_kv(5).await.unwrap();
    assert_eq!(rev(h3.header()), 6);
    assert_eq!((h3.hash(), h3.hash_revision()), (h1.hash(), 5));
    let h4 = c.hash_kv(0).await.unwrap();
    assert_eq!(h4.hash_revision(), 6);
    assert_ne!(h4.hash(), h1.hash());
    c.hash().await.unwrap();

    // Defragment succeeds and leaves the data alone.
    c.defragment().await.unwrap();
    let r = c.get("h/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(keys(r.kvs()), ["h/a", "h/c"]);
    assert_eq!(c.hash_kv(0).await.unwrap().hash(), h4.hash());

    // Snapshot: data followed by its SHA-256, the total a multiple of 512 plus 32.
    let mut snap = c.snapshot().await.unwrap();
    let mut data = Vec::new();
    let mut last_remaining = None;
    while let Some(chunk) = tokio::time::timeout(PATIENCE, snap.message())
        .await
        .expect("snapshot chunk in time")
        .unwrap()
    {
        data.extend_from_slice(chunk.blob());
        last_remaining = Some(chunk.remaining_bytes());
    }
    assert_eq!(last_remaining, Some(0));
    assert!(data.len() > 32, "snapshot of {} bytes", data.len());
    assert_eq!(data.len() % 512, 32, "snapshot of {} bytes", data.len());
    let (body, sum) = data.split_at(data.len() - 32);
    assert_eq!(Sha256::digest(body).as_slice(), sum);
}
