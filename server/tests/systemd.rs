//! cairn under systemd, as etcd's `Type=notify` unit runs etcd: `READY=1` on `$NOTIFY_SOCKET`
//! only once clients are served, `WATCHDOG=1` keep-alives when `WATCHDOG_USEC` asks for them,
//! `STOPPING=1` on SIGTERM; and `--log-outputs=systemd/journal` writing journald's native
//! protocol. Both sockets are bound by the test; journald's fixed path is the test's socket
//! inside a private mount namespace (`unshare`), so the host's /run is untouched.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;

use common::{free_ports, http_get};

/// How long a datagram may take to come: the member's whole start, in a debug build.
const PATIENCE: Duration = Duration::from_secs(60);

fn cairn_args(dir: &Path, client: u16, peer: u16) -> Vec<String> {
    vec![
        "--data-dir".into(),
        dir.join("data").display().to_string(),
        "--listen-client-urls".into(),
        format!("http://127.0.0.1:{client}"),
        "--advertise-client-urls".into(),
        format!("http://127.0.0.1:{client}"),
        "--listen-peer-urls".into(),
        format!("http://127.0.0.1:{peer}"),
        "--initial-advertise-peer-urls".into(),
        format!("http://127.0.0.1:{peer}"),
    ]
}

/// The next datagram on `socket`, as text.
fn next(socket: &UnixDatagram) -> String {
    let mut buf = vec![0u8; 1 << 16];
    let n = socket.recv(&mut buf).expect("a datagram within the patience");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// A member killed if the test fails before it stops it.
struct Running(Option<Child>);

impl Running {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("running")
    }

    /// The process, no longer killed on drop.
    fn take(mut self) -> Child {
        self.0.take().expect("running")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn terminate(child: &Child) {
    let sent = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(sent.success());
}

#[test]
fn ready_is_sent_once_clients_are_served_then_watchdog_keep_alives_then_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    let (client, peer) = free_ports();
    let mut child = Running(Some(
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(cairn_args(dir.path(), client, peer))
            .env("NOTIFY_SOCKET", &path)
            // 400 ms: keep-alives every 200 ms. No WATCHDOG_PID: the watchdog is this process's.
            .env("WATCHDOG_USEC", "400000")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    assert_eq!(next(&socket).trim(), "READY=1");
    // Ready means served: the client port answers at once, with a leader.
    let (status, body) = http_get(client, "/health").unwrap();
    assert_eq!((status, body.contains(r#""health":"true""#)), (200, true), "{body}");
    assert_eq!(next(&socket).trim(), "WATCHDOG=1");
    assert_eq!(next(&socket).trim(), "WATCHDOG=1");
    terminate(child.child());
    let mut after: Vec<String> = Vec::new();
    while after.last().map(|s| s.trim()) != Some("STOPPING=1") {
        after.push(next(&socket));
        assert!(after.len() < 100, "no STOPPING=1 after SIGTERM: {after:?}");
    }
    assert!(child.take().wait().unwrap().success());
}

#[test]
fn without_a_notify_socket_nothing_is_sent_and_the_member_serves() {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = free_ports();
    let mut child = Running(Some(
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(cairn_args(dir.path(), client, peer))
            .env_remove("NOTIFY_SOCKET")
            .env("WATCHDOG_USEC", "400000")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    let healthy = (0..1200).any(|_| {
        let ok = matches!(http_get(client, "/health"), Ok((200, _)));
        if !ok {
            std::thread::sleep(Duration::from_millis(50));
        }
        ok
    });
    assert!(healthy, "the member did not serve");
    terminate(child.child());
    assert!(child.take().wait().unwrap().success());
}

/// The fields of one entry in journald's native protocol: `KEY=value\n`, or `KEY\n`, a
/// little-endian u64 length, the value's bytes and `\n`. A malformed entry fails the test
/// with its bytes.
fn journal_fields(raw: &[u8]) -> Vec<(String, String)> {
    let malformed = || panic!("a malformed journal entry: {:?}", String::from_utf8_lossy(raw));
    let mut rest = raw;
    let mut fields = Vec::new();
    while let Some(end) = rest.iter().position(|b| *b == b'=' || *b == b'\n') {
        let key = String::from_utf8_lossy(&rest[..end]).into_owned();
        let value;
        if rest[end] == b'=' {
            let stop = rest[end..]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(rest.len(), |p| end + p);
            value = rest[end + 1..stop].to_vec();
            rest = rest.get(stop + 1..).unwrap_or_default();
        } else {
            let Some(len) = rest.get(end + 1..end + 9) else {
                malformed()
            };
            let len = u64::from_le_bytes(len.try_into().unwrap()) as usize;
            let Some(v) = rest.get(end + 9..end + 9 + len) else {
                malformed()
            };
            value = v.to_vec();
            rest = rest.get(end + 10 + len..).unwrap_or_default();
        }
        fields.push((key, String::from_utf8_lossy(&value).into_owned()));
    }
    fields
}

/// The next datagram on `socket`, as bytes.
fn next_raw(socket: &UnixDatagram) -> Vec<u8> {
    let mut buf = vec![0u8; 1 << 20];
    let n = socket.recv(&mut buf).expect("a datagram within the patience");
    buf.truncate(n);
    buf
}

#[test]
fn log_outputs_systemd_journal_writes_journalds_native_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    std::fs::create_dir(&journal).unwrap();
    let socket = UnixDatagram::bind(journal.join("socket")).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    let (client, peer) = free_ports();
    // In a private mount namespace, /run is a fresh tmpfs whose systemd/journal is the test's
    // folder: cairn finds the test's socket at journald's fixed path.
    let script = format!(
        "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal && \
         mount --bind {} /run/systemd/journal && exec \"$@\"",
        journal.display()
    );
    let mut child = Running(Some(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh"])
            .arg(env!("CARGO_BIN_EXE_cairn"))
            .args(cairn_args(dir.path(), client, peer))
            .args(["--log-outputs", "systemd/journal", "--log-level", "info"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("unshare (util-linux) runs the member in its own mount namespace; the test needs root"),
    ));
    let mut entries = Vec::new();
    loop {
        let fields = journal_fields(&next_raw(&socket));
        let serving = fields.iter().any(|(k, v)| k == "MESSAGE" && v == "serving");
        entries.push(fields);
        if serving {
            break;
        }
        assert!(entries.len() < 200, "no \"serving\" entry in {entries:?}");
    }
    let serving = entries.last().unwrap();
    let field = |name: &str| serving.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert_eq!(field("SYSLOG_IDENTIFIER"), Some("cairn"));
    assert_eq!(field("PRIORITY"), Some("6"), "info is syslog's 6");
    assert!(
        field("F_CLIENTS").is_some_and(|c| c.contains(&client.to_string())),
        "{serving:?}"
    );
    terminate(child.child());
    let out = child.take().wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn log_outputs_systemd_journal_without_journald_is_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = free_ports();
    // A private /run without journald's socket, whatever the host has.
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tmpfs tmpfs /run && exec \"$@\"",
            "sh",
        ])
        .arg(env!("CARGO_BIN_EXE_cairn"))
        .args(cairn_args(dir.path(), client, peer))
        .args(["--log-outputs", "systemd/journal"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot reach journald"), "{stderr}");
}
