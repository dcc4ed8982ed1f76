//! The members: one `cairn` (or etcd) process per network namespace, with its data directory
//! and log under the run's directory, killed (SIGKILL), paused (SIGSTOP) and restarted by
//! the nemesis.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::net::Net;

/// One member's process, if running.
#[derive(Debug)]
pub struct Member {
    pub name: String,
    pub dir: PathBuf,
    child: Option<Child>,
    paused: bool,
    /// The binary it runs, when not the cluster's (a member swapped by an upgrade).
    binary: Option<PathBuf>,
}

/// The cluster under test.
#[derive(Debug)]
pub struct Cluster {
    pub net: Net,
    pub members: Vec<Member>,
    binary: PathBuf,
    initial: String,
    /// Flags the binary takes beyond etcd 3.5.1's.
    extra: Vec<String>,
    /// Each member's data on an ext4 file system of this many MiB of its own (a sparse image
    /// loop-mounted, to fill or freeze), or on the run's directory.
    disk_mb: Option<u64>,
}

/// Where the members keep their data: each in a directory of its own under `root`; with
/// `disk_mb`, each on an ext4 file system of that many MiB of its own (a sparse image
/// loop-mounted, to fill or freeze).
#[derive(Debug, Clone, Copy)]
pub struct Data<'a> {
    pub root: &'a Path,
    pub disk_mb: Option<u64>,
}

impl Cluster {
    /// Starts `size` members of `binary` in `net`, their data as `data` says, and waits until
    /// each is healthy.
    pub fn start(binary: &Path, net: Net, size: usize, data: Data<'_>) -> Result<Cluster, String> {
        let Data { root, disk_mb } = data;
        let initial = (0..size)
            .map(|i| format!("m{i}=http://{}:2380", net.address(i)))
            .collect::<Vec<_>>()
            .join(",");
        let members = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                dir: root.join(format!("m{i}")),
                child: None,
                paused: false,
                binary: None,
            })
            .collect();
        // Frequent snapshots and a short catch-up margin: a member down for a few seconds of
        // writes comes back by a snapshot from the leader, not the log. etcd 3.5.1 has no
        // flag for the margin (it keeps 5,000 entries).
        let help = Command::new(binary)
            .arg("--help")
            .output()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        let help = String::from_utf8_lossy(&help.stdout).into_owned() + &String::from_utf8_lossy(&help.stderr);
        let mut extra = vec!["--snapshot-count".to_string(), "500".to_string()];
        // etcd 3.7 dropped the `experimental-` flags (and turns the hash checks on with feature
        // gates); etcd 3.5 has only them; cairn takes both.
        let (old_names, gates) = (help.contains("--experimental-"), help.contains("InitialCorruptCheck"));
        let flag = |name: &str| match old_names {
            true => format!("--experimental-{name}"),
            false => format!("--{name}"),
        };
        if help.contains("snapshot-catchup-entries") {
            extra.extend([flag("snapshot-catchup-entries"), "100".to_string()]);
        }
        // Every hash check the binary has, at short periods: faults must not make one see a
        // divergence that is not there (the report fails on a CORRUPT alarm).
        if gates && !old_names {
            extra.push("--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true".to_string());
        } else {
            if help.contains("initial-corrupt-check") {
                extra.push(flag("initial-corrupt-check"));
            }
            if help.contains("compact-hash-check") {
                extra.push(flag("compact-hash-check-enabled"));
            }
        }
        if help.contains("corrupt-check-time") {
            extra.push(format!("{}=10s", flag("corrupt-check-time")));
        }
        if help.contains("compact-hash-check") {
            extra.push(format!("{}=10s", flag("compact-hash-check-time")));
        }
        let mut cluster = Cluster {
            net,
            members,
            binary: binary.to_path_buf(),
            initial,
            extra,
            disk_mb,
        };
        if let Some(mb) = disk_mb {
            for member in &cluster.members {
                std::fs::create_dir_all(&member.dir).map_err(|e| e.to_string())?;
                let image = member.dir.with_extension("img").to_string_lossy().into_owned();
                let dir = member.dir.to_string_lossy().into_owned();
                crate::net::run(&["truncate", "-s", &format!("{mb}M"), &image])?;
                crate::net::run(&["mkfs.ext4", "-q", "-F", &image])?;
                // `discard`: blocks of deleted files (WAL segments, data files a
                // defragmentation replaced) are punched out of the sparse image, which
                // otherwise grows to its full size on the host's disk in a long run.
                crate::net::run(&["mount", "-o", "loop,discard", &image, &dir])?;
            }
        }
        for i in 0..size {
            cluster.spawn(i)?;
        }
        for i in 0..size {
            cluster.wait_healthy(i, Duration::from_secs(60))?;
        }
        Ok(cluster)
    }

    /// Member `i`'s client URL.
    pub fn client_url(&self, i: usize) -> String {
        format!("http://{}:2379", self.net.address(i))
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let address = self.net.address(i);
        let member = &mut self.members[i];
        std::fs::create_dir_all(&member.dir).map_err(|e| e.to_string())?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(member.dir.with_extension("log"))
            .map_err(|e| e.to_string())?;
        let client = format!("http://{address}:2379");
        let peer = format!("http://{address}:2380");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.net.namespace(i)])
            .arg(member.binary.as_ref().unwrap_or(&self.binary))
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(member.dir.join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial, "--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", member.name))?;
        member.child = Some(child);
        member.paused = false;
        Ok(())
    }

    /// Waits until member `i` answers `/health` with `"health":"true"`.
    pub fn wait_healthy(&mut self, i: usize, patience: Duration) -> Result<(), String> {
        let deadline = Instant::now() + patience;
        let address = format!("{}:2379", self.net.address(i));
        loop {
            if let Some(child) = self.members[i].child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!(
                        "{} exited ({status}):\n{}",
                        self.members[i].name,
                        self.log_tail(i)
                    ));
                }
            }
            if http_get(&address, "/health").is_some_and(|body| body.contains(r#""health":"true""#)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} not healthy within {patience:?}:\n{}",
                    self.members[i].name,
                    self.log_tail(i)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last lines of member `i`'s log.
    pub fn log_tail(&self, i: usize) -> String {
        let text = std::fs::read_to_string(self.members[i].dir.with_extension("log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// SIGKILL of member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.members[i].paused = false;
    }

    /// Stops member `i` as an operator does before an upgrade (SIGTERM, and a wait for it to
    /// exit), then starts it from its data directory running `binary`, and waits until it is
    /// healthy.
    pub fn swap(&mut self, i: usize, binary: &Path) -> Result<(), String> {
        if self.members[i].paused {
            self.pause(i, false);
        }
        if let Some(mut child) = self.members[i].child.take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{} did not stop within 30 s of SIGTERM", self.members[i].name));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.members[i].binary = Some(binary.to_path_buf());
        self.spawn(i)?;
        self.wait_healthy(i, Duration::from_secs(60))
    }

    /// Starts member `i` again from its data directory.
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        if self.members[i].child.is_none() {
            self.spawn(i)?;
        }
        Ok(())
    }

    /// Freezes member `i`'s file system (`fsfreeze`: every write to it waits), or thaws it: a
    /// stalled disk.
    pub fn freeze_disk(&self, i: usize, freeze: bool) -> Result<(), String> {
        let dir = self.members[i].dir.to_string_lossy().into_owned();
        crate::net::run(&["fsfreeze", if freeze { "-f" } else { "-u" }, &dir])
    }

    /// Whether each member has a disk of its own to fill.
    pub fn has_own_disks(&self) -> bool {
        self.disk_mb.is_some()
    }

    /// Starts member `i` again if its process exited by itself.
    pub fn restart_if_exited(&mut self, i: usize) -> Result<(), String> {
        let exited = self.members[i]
            .child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_some());
        if exited {
            self.members[i].child = None;
            self.spawn(i)?;
        }
        Ok(())
    }

    /// SIGSTOP (`pause`) or SIGCONT of member `i`.
    pub fn pause(&mut self, i: usize, pause: bool) {
        if let Some(child) = &self.members[i].child {
            let signal = if pause { "-STOP" } else { "-CONT" };
            let _ = Command::new("kill").args([signal, &child.id().to_string()]).status();
            self.members[i].paused = pause;
        }
    }

    /// Every member running, none paused.
    pub fn heal_processes(&mut self) -> Result<(), String> {
        for i in 0..self.members.len() {
            if self.members[i].paused {
                self.pause(i, false);
            }
            self.restart_if_exited(i)?;
            self.restart(i)?;
        }
        Ok(())
    }

    /// Stops every member.
    pub fn stop(&mut self) {
        for i in 0..self.members.len() {
            if self.members[i].paused {
                self.pause(i, false);
            }
            self.kill(i);
        }
        if self.disk_mb.is_some() {
            for member in &self.members {
                let dir = member.dir.to_string_lossy().into_owned();
                let _ = crate::net::run(&["fsfreeze", "-u", &dir]);
                let _ = crate::net::run(&["umount", "-l", &dir]);
                let _ = std::fs::remove_file(member.dir.with_extension("img"));
            }
            self.disk_mb = None;
        }
    }

    /// Fills member `i`'s disk but for `leave` bytes (a file named `ballast`); `false` to
    /// empty it again.
    pub fn fill_disk(&self, i: usize, fill: bool, leave: u64) -> Result<(), String> {
        let ballast = self.members[i].dir.join("ballast");
        if !fill {
            let _ = std::fs::remove_file(&ballast);
            return Ok(());
        }
        let out = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&self.members[i].dir)
            .output()
            .map_err(|e| e.to_string())?;
        let avail: u64 = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .ok_or("df gave no free space")?;
        let size = avail.saturating_sub(leave).max(4096).to_string();
        crate::net::run(&["fallocate", "-l", &size, &ballast.to_string_lossy()])
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `GET path` on `address` over HTTP/1.0: the body, or `None`.
pub fn http_get(address: &str, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&address.parse().ok()?, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string())
}
