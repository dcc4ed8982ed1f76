//! The harness the test files share: a fresh single-member cairn per test, on free loopback
//! ports, killed when dropped, and the assertion on a gRPC error.

// Each test file is its own crate and uses only part of this module.
#![allow(dead_code)]

use std::fmt::Debug;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, Error};
use tonic::Code;

/// The `cairn` binary: `$CAIRN_BIN`, or the main workspace's debug build (tests/run-all.sh
/// builds it before running these tests).
pub fn cairn_bin() -> std::path::PathBuf {
    let path = std::env::var_os("CAIRN_BIN").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/cairn"),
        std::path::PathBuf::from,
    );
    assert!(
        path.exists(),
        "no cairn binary at {}: build it (cargo build -p cairn-server) or set CAIRN_BIN",
        path.display()
    );
    path
}

/// How long anything may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One cairn process, killed when dropped.
pub struct Member {
    pub name: String,
    pub client_url: String,
    pub peer_url: String,
    dir: tempfile::TempDir,
    child: Child,
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Member {
    /// Starts a single-member cluster named `name` on free loopback ports and waits until it
    /// has a leader; returns it with a connected client.
    pub async fn start(name: &str) -> (Member, Client) {
        Member::start_with(name, &[]).await
    }

    /// As [`Member::start`], with `extra` flags on cairn's command line.
    pub async fn start_with(name: &str, extra: &[&str]) -> (Member, Client) {
        let dir = tempfile::tempdir().unwrap();
        let client_url = format!("http://127.0.0.1:{}", free_port());
        let peer_url = format!("http://127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.path().join("cairn.log")).unwrap();
        let child = Command::new(cairn_bin())
            .args(["--name", name])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut member = Member {
            name: name.to_string(),
            client_url,
            peer_url,
            dir,
            child,
        };
        let client = member.wait_ready().await;
        (member, client)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("cairn.log")).unwrap_or_default()
    }

    /// A new client of this member with `options` (`Client::connect` authenticates when they
    /// name a user).
    pub async fn connect(&self, options: Option<ConnectOptions>) -> Result<Client, Error> {
        Client::connect([self.client_url.as_str()], options).await
    }

    /// Retries connect + Status until the member answers with a leader, or the deadline.
    async fn wait_ready(&mut self) -> Client {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("cairn exited with {status}; log:\n{}", self.log());
            }
            let attempt = tokio::time::timeout(Duration::from_secs(2), async {
                let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(1));
                let mut client = Client::connect([self.client_url.as_str()], Some(options)).await?;
                let status = client.status().await?;
                Ok::<_, Error>((client, status))
            })
            .await;
            let last = match attempt {
                Ok(Ok((client, status))) if status.leader() != 0 => return client,
                Ok(Ok(_)) => "no leader yet".to_string(),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "connect + status timed out".to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "cairn not ready after {PATIENCE:?} ({last}); log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Asserts that `result` failed with gRPC `code` and exactly `message`.
#[track_caller]
pub fn assert_status<T: Debug>(result: Result<T, Error>, code: Code, message: &str) {
    match result {
        Err(Error::GRpcStatus(status)) => {
            assert_eq!((status.code(), status.message()), (code, message), "{status:?}");
        }
        other => panic!("expected gRPC {code:?} {message:?}, got {other:?}"),
    }
}

/// The next response of a watch stream, which must come within [`PATIENCE`].
pub async fn next_message(stream: &mut etcd_client::WatchStream) -> etcd_client::WatchResponse {
    tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("watch response in time")
        .expect("watch stream ok")
        .expect("watch stream open")
}
