//! `--enable-log-rotation` end to end, as etcd rotates its log through lumberjack: a member
//! logging to one file with `{"maxsize": 1, "maxbackups": 2}` is made to log several megabytes
//! (debug lines for every put), then its folder is read: rotated files named
//! `cairn-<time>.log` appear, no more than the 2 newest are kept, and every file holds whole
//! JSON lines within the megabyte.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::PutRequest;

mod common;

use common::{Member, PATIENCE};

/// `maxsize` 1, in bytes.
const MAX_BYTES: u64 = 1024 * 1024;
/// Puts sent at once, on one connection.
const BATCH: usize = 64;
/// Batches sent at most before the test gives up: some 60 MB of debug lines, far more than
/// the four rotations it waits for.
const MOST_BATCHES: usize = 1000;

/// The rotated files in `dir`: lumberjack's `cairn-2006-01-02T15-04-05.000.log`.
fn rotated(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name != "cairn.log")
        .inspect(|name| {
            let stamp = name
                .strip_prefix("cairn-")
                .and_then(|n| n.strip_suffix(".log"))
                .unwrap_or_else(|| panic!("not a rotated log's name: {name}"));
            let shape: String = stamp
                .chars()
                .map(|c| if c.is_ascii_digit() { '0' } else { c })
                .collect();
            assert_eq!(shape, "0000-00-00T00-00-00.000", "{name}");
        })
        .collect()
}

/// Puts in batches until at least `rotations` rotated files have been seen in `dir`: every
/// name seen.
async fn log_until_rotated(url: String, dir: &Path, rotations: usize) -> BTreeSet<String> {
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut seen = BTreeSet::new();
    for batch in 0..MOST_BATCHES {
        let mut puts = tokio::task::JoinSet::new();
        for i in 0..BATCH {
            let mut kv = KvClient::new(channel.clone());
            puts.spawn(async move {
                let put = PutRequest {
                    key: format!("key-{i}").into_bytes().into(),
                    value: format!("value-{batch}").into_bytes().into(),
                    ..PutRequest::default()
                };
                kv.put(put).await
            });
        }
        while let Some(put) = puts.join_next().await {
            put.unwrap().unwrap();
        }
        seen.extend(rotated(dir));
        if seen.len() >= rotations {
            return seen;
        }
    }
    panic!("fewer than {rotations} rotations after {MOST_BATCHES} batches of puts: {seen:?}");
}

#[test]
fn a_member_logging_megabytes_keeps_the_two_newest_rotated_files_of_whole_lines() {
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("cairn.log");
    let mut member = Member::start(
        "rotating",
        &[
            &format!("--log-outputs={}", log.display()),
            "--enable-log-rotation",
            r#"--log-rotation-config-json={"maxsize": 1, "maxbackups": 2}"#,
            "--log-level=debug",
        ],
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Four rotations: the two oldest are beyond maxbackups.
    let seen = runtime.block_on(log_until_rotated(member.client_url(), logs.path(), 4));
    // The mill prunes in the background, once per rotation: wait for it.
    let deadline = Instant::now() + PATIENCE;
    let mut kept = rotated(logs.path());
    while kept.len() > 2 {
        assert!(Instant::now() < deadline, "more than 2 rotated files kept: {kept:?}");
        std::thread::sleep(Duration::from_millis(20));
        kept = rotated(logs.path());
    }
    // The two newest are kept (names sort by time), whatever rotated meanwhile: none of the
    // older ones seen.
    let second_newest = seen.iter().rev().nth(1).unwrap();
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(
        kept.iter().all(|name| name >= second_newest),
        "older rotated files kept: {kept:?} of {seen:?}"
    );
    // Stopped, so no line is being written while the files are read.
    assert!(member.stop().success());
    let mut files: Vec<String> = rotated(logs.path()).into_iter().collect();
    files.push("cairn.log".into());
    for name in files {
        let text = std::fs::read_to_string(logs.path().join(&name)).unwrap();
        assert!(text.len() as u64 <= MAX_BYTES, "{name}: {} bytes", text.len());
        assert!(text.ends_with('\n'), "{name} ends in a partial line");
        for line in text.lines() {
            let fields: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{name}: not a JSON line ({e}): {line}"));
            assert!(
                fields["level"].is_string() && fields["msg"].is_string(),
                "{name}: {line}"
            );
        }
    }
}
