//! Criterion benches of the embedded engine (issue #3's list): a durable put (one fdatasync
//! each, so this is mostly the disk), a single-key get, a range over 1,000 keys with limit 100
//! and its count, a count-only range, a compare-and-swap txn, and one put delivered to 1,000
//! watchers (the put's fsync included).
//!
//! Kept short (10 samples, 2 s each); reads are pure CPU on the in-memory index and the
//! mapped data files.
//!
//! The `maintenance` group: compacting a store of 1M revisions (1,000 keys with 1,000 versions
//! each) down to the newest version of each, all at once (the engine does the same work in
//! bounded steps), and defragmenting an engine whose 100,000 revisions were compacted to
//! 1,000 live keys, while another thread keeps writing.

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use cairn_engine::Store;
use cairn_engine::{
    Compare, CompareResult, CompareTarget, Config, Engine, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};

fn put(key: &[u8], value: &[u8]) -> PutRequest {
    PutRequest {
        key: key.to_vec(),
        value: Bytes::copy_from_slice(value),
        ..PutRequest::default()
    }
}

fn engine_benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config {
        lease_check_interval: None,
        ..Config::default()
    };
    let engine = Engine::open(dir.path(), config).expect("open");
    let value = vec![7u8; 256];
    // 1,000 keys of 8 bytes with 256-byte values, written concurrently so loading is quick.
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (engine, value) = (&engine, &value);
            s.spawn(move || {
                for i in (t..1000).step_by(8) {
                    engine.write(put(format!("k{i:07}").as_bytes(), value)).expect("load");
                }
            });
        }
    });

    let mut group = c.benchmark_group("engine");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    let mut n = 0u64;
    group.bench_function("put/durable/256B", |b| {
        b.iter(|| {
            n += 1;
            engine
                .write(put(format!("p{}", n % 1000).as_bytes(), &value))
                .expect("put")
        })
    });
    let get = RangeRequest {
        key: b"k0000500".to_vec(),
        ..RangeRequest::default()
    };
    group.bench_function("get", |b| b.iter(|| black_box(engine.range(&get).expect("get"))));
    let page = RangeRequest {
        key: b"k".to_vec(),
        range_end: b"l".to_vec(),
        limit: 100,
        ..RangeRequest::default()
    };
    group.bench_function("range/1000keys/limit100", |b| {
        b.iter(|| black_box(engine.range(&page).expect("range")))
    });
    let count = RangeRequest {
        count_only: true,
        ..page.clone()
    };
    group.bench_function("range/1000keys/count_only", |b| {
        b.iter(|| black_box(engine.range(&count).expect("count")))
    });
    group.bench_function("txn/cas", |b| {
        b.iter(|| {
            let current = engine.range(&get).expect("get");
            let mod_revision = current.kvs.first().map_or(0, |kv| kv.mod_revision);
            let txn = TxnRequest {
                compare: vec![Compare {
                    key: get.key.clone(),
                    range_end: vec![],
                    target: CompareTarget::Mod(mod_revision),
                    result: CompareResult::Equal,
                }],
                success: vec![RequestOp::Put(put(&get.key, &value))],
                failure: vec![],
            };
            engine.txn(txn).expect("txn")
        })
    });
    // Watch fan-out: one put delivered to 1,000 watchers of its prefix.
    let watchers: Vec<cairn_engine::Watch> = (0..1000)
        .map(|_| {
            engine
                .watch(&cairn_engine::WatchRequest {
                    key: b"w/".to_vec(),
                    range_end: cairn_engine::prefix_end(b"w/"),
                    ..cairn_engine::WatchRequest::default()
                })
                .expect("watch")
        })
        .collect();
    group.bench_function("watch/fanout/1000", |b| {
        b.iter(|| {
            engine.write(put(b"w/k", &value)).expect("put");
            for w in &watchers {
                black_box(w.recv_timeout(Duration::from_secs(10)).expect("event"));
            }
        })
    });
    group.finish();
}

/// A store of `keys` keys with `versions` versions each, `keys` puts per revision.
fn store_with_history(keys: usize, versions: usize) -> Store {
    let mut store = Store::new();
    let value = Bytes::from(vec![7u8; 32]);
    for _ in 0..versions {
        let mut w = store.write();
        for k in 0..keys {
            w.put(format!("k{k:07}").as_bytes(), value.clone(), 0).expect("put");
        }
        w.end();
    }
    store
}

/// An engine in `dir` with 1,000 keys written 100 times each, compacted to the newest.
fn engine_with_garbage(dir: &std::path::Path) -> Engine {
    let config = Config {
        lease_check_interval: None,
        data_file_size: 4 << 20,
        ..Config::default()
    };
    let engine = Engine::open(dir, config).expect("open");
    let value = vec![7u8; 256];
    for _ in 0..100 {
        for batch in 0..10 {
            let ops = (0..100)
                .map(|k| RequestOp::Put(put(format!("k{:07}", batch * 100 + k).as_bytes(), &value)))
                .collect();
            engine
                .txn(TxnRequest {
                    success: ops,
                    ..TxnRequest::default()
                })
                .expect("load");
        }
    }
    engine.compact(engine.current_revision()).expect("compact");
    engine.maintenance().wait_compacted().expect("sweep");
    engine
}

fn maintenance_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("maintenance");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_millis(100));
    group.bench_function("compact/1M-revisions", |b| {
        b.iter_batched(
            || store_with_history(1000, 1000),
            |mut store| {
                let at = store.current_revision();
                store.compact(at).expect("compact");
                store
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("defragment/100k-revisions-while-writing", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().expect("tempdir");
                let engine = engine_with_garbage(dir.path());
                (dir, engine)
            },
            |(dir, engine)| {
                let done = std::sync::atomic::AtomicBool::new(false);
                std::thread::scope(|s| {
                    s.spawn(|| {
                        let mut i = 0u64;
                        while !done.load(std::sync::atomic::Ordering::Relaxed) {
                            engine.write(put(format!("w{i}").as_bytes(), b"v")).expect("put");
                            i += 1;
                        }
                    });
                    black_box(engine.maintenance().defragment().expect("defragment"));
                    done.store(true, std::sync::atomic::Ordering::Relaxed);
                });
                (dir, engine)
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, engine_benches, maintenance_benches);
criterion_main!(benches);
