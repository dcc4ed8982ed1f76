//! The `cairn` command line: etcd's flags read from their `ETCD_*` environment variables, and
//! bad flags or an unusable data dir refused with a clear message and a non-zero exit, before
//! anything is served.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::process::{Command, Output};

mod common;

fn cairn(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cairn"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn refused(output: &Output, needle: &str) {
    assert!(!output.status.success(), "it should have failed: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
}

#[test]
fn bad_flags_are_refused_with_the_flag_named() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let data = data.to_str().unwrap();
    refused(
        &cairn(
            &[
                "--data-dir",
                data,
                "--heartbeat-interval",
                "100",
                "--election-timeout",
                "200",
            ],
            &[],
        ),
        "--election-timeout",
    );
    refused(
        &cairn(&["--data-dir", data, "--listen-client-urls", "not-a-url"], &[]),
        "--listen-client-urls",
    );
    refused(
        &cairn(
            &["--data-dir", data, "--initial-cluster", "other=http://127.0.0.1:1"],
            &[],
        ),
        "--initial-cluster",
    );
    refused(
        &cairn(&["--data-dir", data, "--initial-cluster-state", "maybe"], &[]),
        "initial-cluster-state",
    );
    refused(
        &cairn(&["--data-dir", data, "--auto-compaction-retention", "soon"], &[]),
        "--auto-compaction-retention",
    );
    refused(&cairn(&["--no-such-flag"], &[]), "--no-such-flag");
    // etcd 3.5 and later have one logger, zap, and refuse the others thus.
    refused(
        &cairn(&["--data-dir", data, "--logger", "capnslog"], &[]),
        "--logger=capnslog is removed in v3.5",
    );
    refused(
        &cairn(&["--data-dir", data, "--logger=bunyan"], &[]),
        "unknown logger option \"bunyan\"",
    );
    refused(
        &cairn(&["--data-dir", data, "--log-outputs", "/no/such/dir/cairn.log"], &[]),
        "--log-outputs: cannot open /no/such/dir/cairn.log",
    );
    assert!(
        !std::path::Path::new(data).exists(),
        "nothing was created for a refused start"
    );
}

#[test]
fn flags_come_from_etcd_environment_variables_too() {
    // The variable is read: a bad value in it is refused, naming the flag.
    refused(&cairn(&[], &[("ETCD_ELECTION_TIMEOUT", "1")]), "--election-timeout");
    refused(&cairn(&[], &[("ETCD_LISTEN_PEER_URLS", "nope")]), "--listen-peer-urls");
    refused(&cairn(&[], &[("ETCD_INITIAL_CLUSTER_STATE", "sideways")]), "sideways");
}

#[test]
fn an_unusable_data_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let output = cairn(
        &[
            "--data-dir",
            file.to_str().unwrap(),
            "--listen-client-urls",
            "http://127.0.0.1:0",
            "--listen-peer-urls",
            "http://127.0.0.1:0",
        ],
        &[],
    );
    refused(&output, "a-file");
}

#[test]
fn snapshot_tools_refuse_a_damaged_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snap.db");
    // 512 + 32 bytes: shaped like a snapshot with its hash, but the hash is wrong.
    std::fs::write(&file, vec![7u8; 544]).unwrap();
    let restored = dir.path().join("restored");
    let output = cairn(
        &[
            "snapshot",
            "restore",
            file.to_str().unwrap(),
            "--data-dir",
            restored.to_str().unwrap(),
        ],
        &[],
    );
    refused(&output, "sha256");
    assert!(!restored.exists(), "a failed restore leaves nothing behind");
    refused(&cairn(&["snapshot", "status", file.to_str().unwrap()], &[]), "sha256");
}

/// etcd's `--logger=zap --log-outputs=stderr,<file>`: every line goes to both, the file without
/// terminal colours.
#[test]
fn logs_go_to_every_output_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cairn.log");
    let outputs = format!("stderr,{}", file.display());
    let mut m = common::Member::start("logs", &["--logger=zap", "--log-outputs", &outputs]);
    assert!(m.stop().success());
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(written.contains("serving name=logs"), "{written}");
    assert!(!written.contains('\x1b'), "colours in a file: {written}");
    assert!(m.log_text().contains("serving"), "stderr: {}", m.log_text());
}
