//! Watch guarantees (etcd's watch guarantees, docs/compatibility.md): events ordered, unique, complete, one revision
//! per response, resumable from any uncompacted revision, prev_kv and filters, compaction
//! cancels, and a slow consumer neither blocks writers nor loses anything.
//!
//! Waiting for a response is waiting for an event: `recv_timeout` only bounds a hang.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_engine::{
    Config, DeleteRangeRequest, Engine, Event, EventKind, PutRequest, RequestOp, TxnRequest, Watch, WatchGroup,
    WatchRequest, WatchResponse,
};

const HANG: Duration = Duration::from_secs(20);

fn config(buffer: usize) -> Config {
    Config {
        wal: cairn_engine::wal::Config {
            segment_size: 64 << 10,
            ..Default::default()
        },
        watch_buffer: buffer,
        watch_batch: 7,
        watch_sync_interval: Duration::from_millis(10),
        lease_check_interval: None,
        ..Config::default()
    }
}

fn put(engine: &Engine, key: &str, value: &str) -> i64 {
    engine
        .write(PutRequest {
            key: key.as_bytes().to_vec(),
            value: Bytes::copy_from_slice(value.as_bytes()),
            ..PutRequest::default()
        })
        .unwrap()
        .revision
}

fn prefix(key: &str, start_revision: i64) -> WatchRequest {
    WatchRequest::prefix(key).from_revision(start_revision)
}

/// Receives responses until `n` events have arrived; checks each response holds whole, newer
/// revisions.
fn events(watch: &Watch, n: usize) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    while out.len() < n {
        match watch.recv_timeout(HANG).expect("a response") {
            WatchResponse::Events { events, revision } => {
                let last_before = out.last().map_or(0, |e| e.kv.mod_revision);
                for e in events.iter() {
                    assert!(e.kv.mod_revision > last_before, "ordered and unique");
                    assert!(e.kv.mod_revision <= revision);
                }
                out.extend(events.iter().cloned());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(out.len(), n, "no more events than written");
    out
}

fn summary(events: &[Event]) -> Vec<(i64, String, EventKind)> {
    events
        .iter()
        .map(|e| {
            (
                e.kv.mod_revision,
                String::from_utf8_lossy(&e.kv.key).into_owned(),
                e.kind,
            )
        })
        .collect()
}

#[test]
fn live_events_with_prev_kv_and_filters() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(64)).unwrap();
    put(&engine, "a/x", "0");
    let all = engine
        .watch(&WatchRequest {
            prev_kv: true,
            ..prefix("a/", 0)
        })
        .unwrap();
    // An empty key means "\0": with range_end "\0", every key.
    let everything = engine
        .watch(&WatchRequest {
            key: vec![],
            range_end: vec![0],
            ..WatchRequest::default()
        })
        .unwrap();
    let deletes = engine
        .watch(&WatchRequest {
            no_put: true,
            ..prefix("a/", 0)
        })
        .unwrap();
    put(&engine, "a/x", "1");
    put(&engine, "b", "outside");
    engine
        .write(DeleteRangeRequest {
            key: b"a/x".to_vec(),
            range_end: vec![],
            prev_kv: false,
        })
        .unwrap();
    let got = events(&all, 2);
    assert_eq!(
        summary(&got),
        vec![(3, "a/x".into(), EventKind::Put), (5, "a/x".into(), EventKind::Delete)]
    );
    assert_eq!(got[0].kv.version, 2);
    assert_eq!(got[0].prev_kv.as_ref().unwrap().value, "0");
    assert_eq!(got[1].prev_kv.as_ref().unwrap().value, "1");
    assert_eq!(events(&everything, 3).len(), 3, "a/x twice and b");
    let got = events(&deletes, 1);
    assert_eq!(summary(&got), vec![(5, "a/x".into(), EventKind::Delete)]);
    assert_eq!(got[0].prev_kv, None, "prev_kv only when asked for");
}

#[test]
fn a_revision_arrives_whole_and_history_replays_before_live_events() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(64)).unwrap();
    for i in 0..20 {
        put(&engine, &format!("k/{}", i % 4), &i.to_string());
    }
    let txn = TxnRequest {
        compare: vec![],
        success: (0..3)
            .map(|i| {
                RequestOp::Put(PutRequest {
                    key: format!("k/t{i}").into_bytes(),
                    value: Bytes::from_static(b"t"),
                    ..PutRequest::default()
                })
            })
            .collect(),
        failure: vec![],
    };
    let txn_rev = engine.txn(txn.clone()).unwrap().revision;
    // From revision 6: 16 puts from history (catch-up batches of 7 events), then the txn.
    let watch = engine.watch(&prefix("k/", 6)).unwrap();
    put(&engine, "k/live", "after");
    let got = events(&watch, 16 + 3 + 1);
    let revisions: Vec<i64> = got.iter().map(|e| e.kv.mod_revision).collect();
    let mut expected: Vec<i64> = (6..=21).collect();
    expected.extend([txn_rev, txn_rev, txn_rev, txn_rev + 1]);
    assert_eq!(revisions, expected, "complete, in order, exactly once");
    // Reopening keeps the history watchable.
    drop(watch);
    engine.close().unwrap();
    let engine = Engine::open(dir.path(), config(64)).unwrap();
    let watch = engine.watch(&prefix("k/t", 1)).unwrap();
    assert_eq!(events(&watch, 3).len(), 3);
}

#[test]
fn a_compacted_start_is_cancelled_with_the_compact_revision() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(64)).unwrap();
    for i in 0..10 {
        put(&engine, "k", &i.to_string());
    }
    engine.compact(7).unwrap();
    let watch = engine.watch(&prefix("k", 3)).unwrap();
    assert_eq!(
        watch.recv_timeout(HANG),
        Some(WatchResponse::Compacted { compact_revision: 7 })
    );
    let watch = engine.watch(&prefix("k", 7)).unwrap();
    assert_eq!(
        events(&watch, 5).len(),
        5,
        "from the compact revision on is still watchable"
    );
}

#[test]
fn a_slow_consumer_neither_blocks_writers_nor_loses_events() {
    let dir = tempfile::tempdir().unwrap();
    // A buffer of two responses: the watcher falls behind almost at once.
    let engine = Engine::open(dir.path(), config(2)).unwrap();
    let watch = engine.watch(&prefix("s/", 0)).unwrap();
    for i in 0..200 {
        put(&engine, &format!("s/{}", i % 7), &i.to_string()); // never waits for the watcher
    }
    let got = events(&watch, 200);
    let revisions: Vec<i64> = got.iter().map(|e| e.kv.mod_revision).collect();
    assert_eq!(revisions, (2..=201).collect::<Vec<i64>>());
}

#[test]
fn a_watcher_behind_a_compaction_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(1)).unwrap();
    let watch = engine.watch(&prefix("c/", 0)).unwrap();
    for i in 0..20 {
        put(&engine, "c/k", &i.to_string());
    }
    engine.compact(15).unwrap();
    // It got revision 1 into its buffer, fell behind, and history below 15 is gone.
    let mut saw_cancel = false;
    while let Some(r) = watch.recv_timeout(HANG) {
        if let WatchResponse::Compacted { compact_revision } = r {
            assert_eq!(compact_revision, 15);
            saw_cancel = true;
            break;
        }
    }
    assert!(saw_cancel);
}

/// Takes `group`'s deliveries until `n` events arrived in all; the revisions each watcher got.
fn group_events(group: &WatchGroup, n: usize) -> std::collections::BTreeMap<u64, Vec<i64>> {
    let mut got: std::collections::BTreeMap<u64, Vec<i64>> = Default::default();
    while got.values().map(Vec::len).sum::<usize>() < n {
        let delivery = group.recv_timeout(HANG).unwrap_or_else(|| panic!("only {got:?}"));
        let WatchResponse::Events { events, .. } = delivery.response else {
            panic!("{:?}", delivery.response)
        };
        for id in delivery.watchers {
            got.entry(id)
                .or_default()
                .extend(events.iter().map(|e| e.kv.mod_revision));
        }
    }
    got
}

#[test]
fn progress_is_reported_only_when_every_watcher_has_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(64)).unwrap();
    for i in 0..30 {
        put(&engine, &format!("p/{i}"), "v");
    }
    let group = engine.watch_group(None);
    let live = group.watch(&prefix("p/", 0)).unwrap();
    assert_eq!(group.progress(), Some(31), "a new live watcher is current");
    let behind = group.watch(&prefix("p/", 1)).unwrap();
    assert_eq!(group.progress(), None, "one of them is replaying history");
    assert_eq!(group_events(&group, 30)[&behind], (2..=31).collect::<Vec<i64>>());
    // Everything was handed over and taken (the hub marks a watcher synced under the same
    // lock it sends with): now the rule allows an answer.
    assert_eq!(group.progress(), Some(31));
    put(&engine, "p/new", "v");
    assert_eq!(group.progress(), None, "an event is waiting in the queue");
    let got = group_events(&group, 2);
    assert_eq!((got[&live].as_slice(), got[&behind].as_slice()), (&[32][..], &[32][..]));
    assert_eq!(group.progress(), Some(32));
}

#[test]
fn a_slow_group_loses_nothing_for_any_of_its_watchers() {
    let dir = tempfile::tempdir().unwrap();
    // A buffer of two deliveries per watcher: the group falls behind almost at once.
    let engine = Engine::open(dir.path(), config(2)).unwrap();
    let group = engine.watch_group(None);
    let all = group.watch(&prefix("s/", 0)).unwrap();
    let some = group.watch(&prefix("s/1", 0)).unwrap();
    let mut expected_some = Vec::new();
    for i in 0..200 {
        let revision = put(&engine, &format!("s/{}", i % 3), &i.to_string());
        if i % 3 == 1 {
            expected_some.push(revision);
        }
    }
    let got = group_events(&group, 200 + expected_some.len());
    assert_eq!(
        got[&all],
        (2..=201).collect::<Vec<i64>>(),
        "complete, in order, exactly once"
    );
    assert_eq!(got[&some], expected_some);
}

#[test]
fn a_group_gets_each_revision_once_for_its_watchers_and_none_for_a_cancelled_one() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(64)).unwrap();
    let wakes = Arc::new(AtomicUsize::new(0));
    let counted = wakes.clone();
    let group = engine.watch_group(Some(Arc::new(move || {
        counted.fetch_add(1, Ordering::SeqCst);
    })));
    let ids: Vec<u64> = (0..3).map(|_| group.watch(&prefix("g/", 0)).unwrap()).collect();
    let other = group.watch(&prefix("h/", 0)).unwrap();
    let revision = put(&engine, "g/a", "1");
    let got = group_events(&group, 3);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), ids, "not {other}");
    assert!(got.values().all(|r| r == &[revision]));
    // The wake-up comes right after the delivery is queued, so it may land just after the
    // receive above: wait for it (bounded), then check there was exactly one.
    let deadline = Instant::now() + HANG;
    while wakes.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(
        wakes.load(Ordering::SeqCst),
        1,
        "one delivery, one wake-up, for three watchers"
    );
    group.cancel(ids[1]);
    let revision = put(&engine, "g/b", "2");
    let got = group_events(&group, 2);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![ids[0], ids[2]]);
    assert!(got.values().all(|r| r == &[revision]));
    drop(group);
    assert_eq!(engine.status().watchers, 0, "dropping the group cancels its watchers");
}

#[test]
fn a_key_put_and_deleted_in_one_revision_gives_both_events() {
    // etcd accepts [Txn{Put k}, Txn{DeleteRange k}] in one branch: k is put at R.0, deleted at R.1.
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(64)).unwrap();
    let from_start = engine.watch(&prefix("k", 0)).unwrap();
    let nested = |op| {
        RequestOp::Txn(TxnRequest {
            compare: vec![],
            success: vec![op],
            failure: vec![],
        })
    };
    let txn = TxnRequest {
        compare: vec![],
        success: vec![
            nested(RequestOp::Put(PutRequest {
                key: b"k".to_vec(),
                value: Bytes::from_static(b"brief"),
                ..PutRequest::default()
            })),
            nested(RequestOp::DeleteRange(DeleteRangeRequest {
                key: b"k".to_vec(),
                ..DeleteRangeRequest::default()
            })),
        ],
        failure: vec![],
    };
    let rev = engine.txn(txn).unwrap().revision;
    let live = events(&from_start, 2);
    assert_eq!(
        summary(&live),
        vec![(rev, "k".into(), EventKind::Put), (rev, "k".into(), EventKind::Delete)]
    );
    assert_eq!(live[0].kv.value, "brief");
    // The same from history, and the watcher after it is not stalled.
    put(&engine, "k", "later");
    let replay = engine.watch(&prefix("k", 1)).unwrap();
    assert_eq!(summary(&events(&replay, 3))[..2], summary(&live)[..]);
}

#[test]
fn progress_notifications_go_to_quiet_synced_watchers_that_asked() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(
        dir.path(),
        Config {
            // Only explicit ticks, so the test decides when one happens.
            watch_progress_interval: None,
            ..config(16)
        },
    )
    .unwrap();
    let asked = |key: &str| WatchRequest {
        progress_notify: true,
        ..prefix(key, 0)
    };
    let busy = engine.watch(&asked("busy/")).unwrap();
    let quiet = engine.watch(&asked("quiet/")).unwrap();
    let not_asked = engine.watch(&prefix("quiet/", 0)).unwrap();
    let rev = put(&engine, "busy/1", "v");
    assert_eq!(events(&busy, 1)[0].kv.mod_revision, rev);

    engine.maintenance().notify_progress();
    assert_eq!(
        quiet.try_recv(),
        Some(WatchResponse::Progress { revision: rev }),
        "nothing for it up to {rev}"
    );
    assert_eq!(busy.try_recv(), None, "it was sent events since the last tick");
    assert_eq!(not_asked.try_recv(), None, "it did not ask");

    // The next tick: the busy watcher has been quiet for a whole interval now.
    engine.maintenance().notify_progress();
    assert_eq!(busy.try_recv(), Some(WatchResponse::Progress { revision: rev }));
    assert_eq!(quiet.try_recv(), Some(WatchResponse::Progress { revision: rev }));

    // A watcher still catching up from history gets no progress: it has not seen `rev` yet.
    let behind = engine
        .watch(&WatchRequest {
            progress_notify: true,
            ..prefix("busy/", 1)
        })
        .unwrap();
    engine.maintenance().notify_progress();
    let first = behind.recv_timeout(HANG).unwrap();
    assert!(
        matches!(first, WatchResponse::Events { .. }),
        "history first: {first:?}"
    );
}

#[test]
fn large_revisions_fragment_within_the_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(16)).unwrap();
    let watch = engine.watch(&prefix("big/", 0)).unwrap();
    let value = "x".repeat(1000);
    let ops = (0..10)
        .map(|i| {
            RequestOp::Put(PutRequest {
                key: format!("big/{i}").into_bytes(),
                value: Bytes::copy_from_slice(value.as_bytes()),
                ..PutRequest::default()
            })
        })
        .collect();
    let txn = TxnRequest {
        success: ops,
        ..Default::default()
    };
    engine.txn(txn).unwrap();
    let all = events(&watch, 10);
    let fragments = cairn_engine::fragment_events(all.clone(), 2500);
    let sizes: Vec<usize> = fragments.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![2, 2, 2, 2, 2], "two 1 KB events per 2.5 KB fragment");
    assert_eq!(fragments.concat(), all, "in order, none lost");
    // An event larger than the limit travels alone rather than not at all.
    assert_eq!(cairn_engine::fragment_events(all.clone(), 10).len(), 10);
    assert_eq!(cairn_engine::fragment_events(all, 1 << 20).len(), 1);
}

#[test]
fn a_watch_is_an_iterator_of_its_responses() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(64)).unwrap();
    let first = put(&engine, "it/a", "1");
    put(&engine, "other", "x");
    put(&engine, "it/b", "2");
    put(&engine, "it/a", "3");
    let watch = engine
        .watch(&WatchRequest::prefix("it/").from_revision(first).with_prev_kv())
        .unwrap();
    let seen: Vec<(String, String, Option<String>)> = (&watch)
        .flat_map(|response| match response {
            WatchResponse::Events { events, .. } => events.to_vec(),
            other => panic!("not events: {other:?}"),
        })
        .map(|e| {
            let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
            (text(&e.kv.key), text(&e.kv.value), e.prev_kv.map(|p| text(&p.value)))
        })
        .take(3)
        .collect();
    assert_eq!(
        seen,
        vec![
            ("it/a".to_string(), "1".to_string(), None),
            ("it/b".to_string(), "2".to_string(), None),
            ("it/a".to_string(), "3".to_string(), Some("1".to_string())),
        ]
    );
}

#[test]
fn a_watch_is_an_async_stream_that_ends_when_the_engine_closes() {
    use tokio_stream::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(64)).unwrap();
    let start = put(&engine, "unwatched", "x") + 1;
    let mut watch = engine.watch(&WatchRequest::prefix("s/").from_revision(start)).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let (awaiting_tx, awaiting_rx) = std::sync::mpsc::channel::<()>();
    // The writes and the close happen on another thread while the task waits on the stream:
    // only the engine's wake-ups can move it.
    let writer = std::thread::spawn(move || {
        awaiting_rx.recv().unwrap();
        for (i, key) in ["s/a", "other", "s/b", "s/c"].iter().enumerate() {
            put(&engine, key, &i.to_string());
        }
        awaiting_rx.recv().unwrap();
        engine.close().unwrap();
    });
    let keys = runtime.block_on(async {
        let mut keys = Vec::new();
        awaiting_tx.send(()).unwrap();
        while keys.len() < 3 {
            let next = tokio::time::timeout(HANG, watch.next()).await.expect("woken");
            match next.expect("open") {
                WatchResponse::Events { events, .. } => {
                    keys.extend(events.iter().map(|e| String::from_utf8(e.kv.key.to_vec()).unwrap()))
                }
                other => panic!("not events: {other:?}"),
            }
        }
        awaiting_tx.send(()).unwrap();
        let end = tokio::time::timeout(HANG, watch.next())
            .await
            .expect("woken at the close");
        assert!(end.is_none(), "the stream ends with the engine: {end:?}");
        keys
    });
    writer.join().unwrap();
    assert_eq!(keys, ["s/a", "s/b", "s/c"]);
}
