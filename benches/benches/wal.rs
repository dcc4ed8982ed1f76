//! Criterion benches of the WAL: frame encoding and decoding (pure CPU), buffered batch appends
//! (the writer thread and a `write` into the page cache) and durable single appends (one
//! fdatasync each) on the real file system, in a temporary directory removed afterwards.
//!
//! Kept short (10 samples, 2 s each) so `cargo bench -p cairn-benches` finishes in well under a
//! minute; `fsync-latency` is the tool for fdatasync numbers worth quoting.

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use cairn_wal::{decode_frame, Config, Durability, FrameKind, LogIndex, Record, Wal};
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};

const PAYLOAD_SIZES: [usize; 2] = [256, 4 << 10];
/// Records per buffered append.
const BATCH: usize = 64;
/// Payload of each appended record.
const RECORD_SIZE: usize = 256;
/// An arbitrary chain seed: frames are never checked against a zero seed only.
const SEED: u32 = 0x5eed_c0de;

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ 0xA5).collect()
}

fn frames(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame");
    for size in PAYLOAD_SIZES {
        let data = payload(size);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("encode", size), &data, |b, data| {
            let mut out = Vec::with_capacity(size + 64);
            b.iter(|| {
                out.clear();
                black_box(FrameKind::Entry.encode(&mut out, 42, black_box(data), SEED))
            });
        });
        let mut encoded = Vec::new();
        FrameKind::Entry.encode(&mut encoded, 42, &data, SEED);
        group.bench_with_input(BenchmarkId::new("decode", size), &encoded, |b, encoded| {
            b.iter(|| black_box(decode_frame(black_box(encoded), SEED).map(|(f, n)| (f.index, n))));
        });
    }
    group.finish();
}

/// A fresh log in its own temporary directory. Bench setup has no error path: it panics.
#[allow(clippy::expect_used)]
fn open_wal(config: Config) -> (tempfile::TempDir, Wal) {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let wal = Wal::open(dir.path(), config)
        .and_then(cairn_wal::Replay::finish)
        .expect("open a wal");
    (dir, wal)
}

#[allow(clippy::expect_used)]
fn appends(c: &mut Criterion) {
    let mut group = c.benchmark_group("wal");
    let data = Bytes::from(payload(RECORD_SIZE));

    // 256 MiB segments: a rotation every ~0.9 M records, so its cost barely shows per batch.
    let (dir, wal) = open_wal(Config {
        segment_size: 256 << 20,
        ..Config::default()
    });
    let mut next = 1u64;
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function(
        BenchmarkId::new("append_buffered", format!("{BATCH}x{RECORD_SIZE}B")),
        |b| {
            b.iter_batched(
                || {
                    let batch: Vec<Record> = (0..BATCH as u64)
                        .map(|i| Record::Entry {
                            index: LogIndex(next + i),
                            payload: data.clone(),
                        })
                        .collect();
                    next += BATCH as u64;
                    batch
                },
                |batch| {
                    wal.append(batch, Durability::Buffered)
                        .and_then(cairn_wal::Ticket::wait)
                        .expect("buffered append")
                },
                BatchSize::SmallInput,
            );
        },
    );
    drop(wal);
    drop(dir);

    let (dir, wal) = open_wal(Config::default());
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("append_durable", format!("1x{RECORD_SIZE}B")), |b| {
        b.iter(|| {
            wal.append_next(vec![data.clone()], Durability::Durable)
                .and_then(cairn_wal::Ticket::wait)
                .expect("durable append")
        });
    });
    drop(wal);
    drop(dir);
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = frames, appends
}
criterion_main!(benches);
