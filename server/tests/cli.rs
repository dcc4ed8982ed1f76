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
    refused(&cairn(&["--data-dir", data, "--log-format=xml"], &[]), "--log-format");
    refused(
        &cairn(&["--data-dir", data, "--warning-apply-duration=soon"], &[]),
        "--warning-apply-duration",
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

/// etcd's `--logger=zap --log-outputs=stderr,<file>`: every line goes to both, and by default
/// as etcd's JSON lines (`level`, `ts`, `caller`, `msg`, then the fields), the settings in
/// effect logged first.
#[test]
fn logs_go_to_every_output_named_as_etcds_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cairn.log");
    let outputs = format!("stderr,{}", file.display());
    let mut m = common::Member::start("logs", &["--logger=zap", "--log-outputs", &outputs]);
    assert!(m.stop().success());
    let written = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<serde_json::Value> = written
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for line in &lines {
        assert!(
            ["debug", "info", "warn", "error"].contains(&line["level"].as_str().unwrap()),
            "{line}"
        );
        assert!(line["ts"].as_str().unwrap().ends_with('Z'), "{line}");
        assert!(line["caller"].as_str().unwrap().contains(".rs:"), "{line}");
    }
    let settings = lines.iter().find(|l| l["msg"] == "starting a cairn server").unwrap();
    assert_eq!(settings["name"], "logs");
    assert_eq!(settings["warning-apply-duration"], "100ms");
    assert_eq!(settings["snapshot-count"], 10000);
    let serving = lines.iter().find(|l| l["msg"] == "serving").unwrap();
    assert_eq!(serving["name"], "logs");
    // stderr got the same lines.
    let stderr = m.log_text();
    let first = stderr
        .lines()
        .find(|l| l.starts_with("starting a cairn server"))
        .unwrap();
    assert!(first.contains(" name=logs "), "stderr: {stderr}");
}

/// `--log-format=console`: lines for people, not JSON.
#[test]
fn the_console_format_is_not_json() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cairn.log");
    let outputs = file.display().to_string();
    let mut m = common::Member::start("console", &["--log-format=console", "--log-outputs", &outputs]);
    assert!(m.stop().success());
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(written.contains("serving name=console"), "{written}");
    assert!(written.lines().all(|l| !l.starts_with('{')), "{written}");
    assert!(!written.contains('\x1b'), "colours in a file: {written}");
    // Nor on stderr when it is not a terminal (here a pipe), NO_COLOR or not.
    let dir = tempfile::tempdir().unwrap();
    let not_a_dir = dir.path().join("a-file");
    std::fs::write(&not_a_dir, b"").unwrap();
    let output = cairn(
        &["--log-format=console", "--data-dir", not_a_dir.to_str().unwrap()],
        &[],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("starting a cairn server"), "{stderr}");
    assert!(!stderr.contains('\x1b'), "colours in a pipe: {stderr}");
}

/// A KV request slower than `--warning-apply-duration` is logged with how long it took; at
/// a threshold no request reaches, none is.
#[test]
fn slow_requests_are_logged_with_their_duration() {
    let m = common::Member::start("slow", &["--warning-apply-duration=1ns"]);
    m.etcdctl(&["put", "k", "v"]);
    m.etcdctl(&["get", "k"]);
    let log = m.log_text();
    let slow: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("apply request took too long "))
        .collect();
    assert_eq!(slow.len(), 2, "{log}");
    assert!(slow[0].contains(" request=put key_size:1 value_size:1 "), "{log}");
    assert!(
        slow[1].contains(" request=read-only range key_size:1 count:1 "),
        "{log}"
    );
    assert!(slow.iter().all(|l| l.contains(" took=")), "{log}");
    let quiet = common::Member::start("quiet", &["--warning-apply-duration=1h"]);
    quiet.etcdctl(&["put", "k", "v"]);
    quiet.etcdctl(&["get", "k"]);
    assert!(!quiet.log_text().contains("took too long"), "{}", quiet.log_text());
}

/// Every directory and file below `dir`, with its permission bits.
fn modes(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, u32)>) {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = entry.metadata().unwrap();
        out.push((entry.path(), meta.permissions().mode() & 0o777));
        if meta.is_dir() {
            modes(&entry.path(), out);
        }
    }
}

#[test]
fn the_data_directory_is_the_members_user_alone_as_etcds_is() {
    use std::os::unix::fs::PermissionsExt;
    let mut m = common::Member::start("private", &[]);
    m.ok(&["put", "k", "v"]);
    m.stop();
    let top = std::fs::metadata(&m.data_dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(top, 0o700, "{}", m.data_dir.display());
    let mut found = Vec::new();
    modes(&m.data_dir, &mut found);
    assert!(found.len() > 3, "{found:?}");
    let readable: Vec<_> = found.iter().filter(|(_, mode)| mode & 0o077 != 0).collect();
    assert!(readable.is_empty(), "readable by others: {readable:?}");
}
