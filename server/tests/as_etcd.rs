//! The binary started under the name `etcd`, as kubeadm's static pod and etcd's operator run
//! it (here through a symlink named `etcd` in a temporary directory): etcd's `--version` lines
//! and etcd's default data directory, `<name>.etcd`; started as `cairn`, cairn's as before.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

mod common;

use common::{free_ports, http_get, PATIENCE};

/// A symlink named `name` to the cairn binary, in `dir`.
fn linked_as(dir: &Path, name: &str) -> PathBuf {
    let link = dir.join(name);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cairn"), &link).unwrap();
    link
}

fn run(program: &Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .env_remove("ETCD_DATA_DIR")
        .env_remove("ETCD_NAME")
        .output()
        .unwrap()
}

/// Starts `program --name <name>` with no `--data-dir`, in `cwd`, on free ports; once it
/// serves, stops it with SIGTERM. Retries on other ports if the ones picked were taken.
fn serve_once_in(cwd: &Path, program: &Path, name: &str) {
    for _attempt in 0..3 {
        let (client, peer) = free_ports();
        // A file, not a pipe nobody reads while the member runs.
        let log_path = cwd.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut child = Command::new(program)
            .current_dir(cwd)
            .args(["--name", name])
            .args([
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .env_remove("ETCD_DATA_DIR")
            .env_remove("ETCD_NAME")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + PATIENCE;
        let served = loop {
            if child.try_wait().unwrap().is_some() {
                break false;
            }
            if let Ok((200, body)) = http_get(client, "/health") {
                if body.contains(r#""health":"true""#) {
                    break true;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{} not healthy within {PATIENCE:?}",
                program.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        if served {
            let sent = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success());
        }
        let status = child.wait().unwrap();
        let stderr = std::fs::read_to_string(&log_path).unwrap();
        if served {
            assert!(
                status.success(),
                "{} stopped with {status}: {stderr}",
                program.display()
            );
            return;
        }
        if !stderr.contains("cannot listen on") {
            panic!("{} exited with {status}: {stderr}", program.display());
        }
    }
    panic!("the ports picked were taken three times");
}

/// etcd 3.5–3.7 print `etcd Version: X.Y.Z`, `Git SHA`, `Go Version`, `Go OS/Arch`; tools
/// parse the first line. cairn prints the etcd API it implements there, and its own version
/// on a line of its own.
#[test]
fn etcd_version_prints_etcds_lines_with_cairns_version_last() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = linked_as(dir.path(), "etcd");
    let output = run(&etcd, &["--version"]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "etcd Version: 3.6.0", "{stdout}");
    assert!(lines[1].starts_with("Git SHA: "), "{stdout}");
    assert!(lines[2].starts_with("Go Version: "), "{stdout}");
    assert!(lines[3].starts_with("Go OS/Arch: linux/"), "{stdout}");
    assert_eq!(lines[4], format!("cairn Version: {}", env!("CARGO_PKG_VERSION")));
    assert_eq!(lines.len(), 5, "{stdout}");
    // Go's boolean forms; with other flags, nothing is started.
    let output = run(&etcd, &["--name", "x", "--version=true"]);
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("etcd Version: 3.6.0\n"));
    assert!(!dir.path().join("x.etcd").exists());
    // Help is clap's, under etcd's name.
    let output = run(&etcd, &["--help"]);
    assert!(output.status.success(), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("Usage: etcd"),
        "{output:?}"
    );
}

/// Started as `cairn` (here through a symlink of that name), `--version` is cairn's own.
#[test]
fn cairn_version_stays_cairns() {
    let dir = tempfile::tempdir().unwrap();
    let cairn = linked_as(dir.path(), "cairn");
    let output = run(&cairn, &["--version"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        format!("cairn {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// etcd's default data directory is `<name>.etcd` in the working directory; kubeadm's
/// manifest gives `--data-dir`, but an operator's `etcd --name x` finds its data where etcd
/// would have put it.
#[test]
fn a_member_started_as_etcd_keeps_its_data_in_name_dot_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = linked_as(dir.path(), "etcd");
    serve_once_in(dir.path(), &etcd, "x");
    assert!(dir.path().join("x.etcd").is_dir());
    assert!(!dir.path().join("x.cairn").exists());
}

#[test]
fn a_member_started_as_cairn_keeps_its_data_in_name_dot_cairn() {
    let dir = tempfile::tempdir().unwrap();
    let cairn = linked_as(dir.path(), "cairn");
    serve_once_in(dir.path(), &cairn, "y");
    assert!(dir.path().join("y.cairn").is_dir());
    assert!(!dir.path().join("y.etcd").exists());
}
