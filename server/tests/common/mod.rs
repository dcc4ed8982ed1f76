//! The harness the end-to-end tests share: a `cairn` process with its own temporary data
//! directory on free loopback ports, counted as started once `GET /health` answers 200 with
//! `"health":"true"`; the real etcdctl (3.4, Debian's `etcd-client`) pointed at it; and a tiny
//! HTTP/1.1 GET over a plain `TcpStream`. A member's stderr goes to a log file beside its data
//! directory, printed when a test fails while the member runs. Dropping a [`Member`] kills its
//! process (SIGKILL); [`Member::stop`] asks it to stop (SIGTERM) instead.

// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long anything may take (a start, a stop, an expected line) before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(30);
/// Where Debian's etcd-client puts etcdctl.
pub const ETCDCTL: &str = "/usr/bin/etcdctl";
/// Attempts to start a member on fresh ports when the ports picked were taken meanwhile.
const START_ATTEMPTS: usize = 3;

/// Two distinct free ports on 127.0.0.1, for a member's client and peer URLs. They are free
/// when picked; another process may take one before the member binds it (the caller retries).
pub fn free_ports() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
}

/// Whether process `pid` holds a listening TCP socket on `port` (from /proc: the sockets
/// among its open files, and the kernel's table of listening ones).
pub fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let sockets: std::collections::HashSet<String> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let port = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                // local address, state (0A: listening), inode
                matches!((fields.get(1), fields.get(3), fields.get(9)),
                (Some(local), Some(&"0A"), Some(inode)) if local.ends_with(&port) && sockets.contains(*inode))
            })
    })
}

/// One `cairn` process and everything it owns on disk.
pub struct Member {
    pub name: String,
    /// The member's data directory (`--data-dir`), inside `root`.
    pub data_dir: PathBuf,
    pub client_port: u16,
    pub peer_port: u16,
    /// Client and peer URLs are https (the test gives the certificate flags); health is then
    /// read on a plaintext `--listen-metrics-urls` port.
    pub https: bool,
    pub metrics_port: u16,
    /// Flags beyond the name, data directory and URLs, given again on a restart.
    extra: Vec<String>,
    /// The `cairn` binary it runs: this build's, or an earlier release's (tests/upgrade).
    binary: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// Holds the data directory and the log; deleted last.
    _root: tempfile::TempDir,
}

/// Why a start attempt failed.
enum StartFailure {
    /// A port was taken between picking it and binding it: try others.
    PortTaken,
    /// Anything else, with what to tell.
    Other(String),
}

impl Member {
    /// Starts a new single-member cluster named `name` with `extra` flags on a fresh data
    /// directory, and waits until it is healthy.
    pub fn start(name: &str, extra: &[&str]) -> Member {
        Member::start_prepared(name, extra, |_, _| {})
    }

    /// Like [`Member::start`], but runs `prepare(data_dir, peer_url)` before each attempt on a
    /// data directory that does not exist yet (to restore a snapshot into it, say, for a member
    /// with that peer URL).
    pub fn start_prepared(name: &str, extra: &[&str], prepare: impl Fn(&Path, &str)) -> Member {
        Member::start_with(name, extra, false, prepare)
    }

    /// Like [`Member::start`], with https client and peer URLs: `extra` gives the certificate
    /// flags. Health is read on a plaintext metrics URL.
    pub fn start_https(name: &str, extra: &[&str]) -> Member {
        Member::start_with(name, extra, true, |_, _| {})
    }

    fn start_with(name: &str, extra: &[&str], https: bool, prepare: impl Fn(&Path, &str)) -> Member {
        let mut member = Member::new(name, extra, https);
        for attempt in 1..=START_ATTEMPTS {
            (member.client_port, member.peer_port) = free_ports();
            member.metrics_port = free_ports().0;
            if member.data_dir.exists() {
                std::fs::remove_dir_all(&member.data_dir).unwrap();
            }
            prepare(&member.data_dir, &member.peer_url());
            let logged_before = member.spawn();
            match member.wait_started(logged_before) {
                Ok(()) => return member,
                Err(StartFailure::PortTaken) if attempt < START_ATTEMPTS => continue,
                Err(StartFailure::PortTaken) => panic!(
                    "{name}: its ports were taken {START_ATTEMPTS} times:\n{}",
                    member.log_text()
                ),
                Err(StartFailure::Other(why)) => panic!("{name} did not start: {why}\n{}", member.log_text()),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Starts members named `names` as one new cluster, bootstrapped together with
    /// `--initial-cluster` (kept among their flags with `extra`), and waits until every one is
    /// healthy. `prepare(data_dir, name, initial_cluster)` runs first for each member, on a data
    /// directory that does not exist yet (to restore a snapshot into it, say).
    pub fn start_cluster(names: &[&str], extra: &[&str], prepare: impl Fn(&Path, &str, &str)) -> Vec<Member> {
        let own = Path::new(env!("CARGO_BIN_EXE_cairn"));
        let members: Vec<(&str, &Path, &[&str])> = names.iter().map(|n| (*n, own, extra)).collect();
        Member::start_cluster_of(&members, prepare)
    }

    /// Like [`Member::start_cluster`], each member `(name, binary, extra flags)` with a binary
    /// and flags of its own.
    pub fn start_cluster_of(members: &[(&str, &Path, &[&str])], prepare: impl Fn(&Path, &str, &str)) -> Vec<Member> {
        for attempt in 1..=START_ATTEMPTS {
            let mut members: Vec<Member> = members
                .iter()
                .map(|(name, binary, extra)| {
                    let mut m = Member::new(name, extra, false);
                    m.binary = binary.to_path_buf();
                    m
                })
                .collect();
            for m in &mut members {
                (m.client_port, m.peer_port) = free_ports();
            }
            let initial: Vec<String> = members.iter().map(|m| format!("{}={}", m.name, m.peer_url())).collect();
            let initial = initial.join(",");
            for m in &mut members {
                m.extra.extend(["--initial-cluster".to_string(), initial.clone()]);
                prepare(&m.data_dir, &m.name, &initial);
            }
            // All are started before any is waited for: none is healthy before a quorum runs.
            let logged_before: Vec<usize> = members.iter_mut().map(Member::spawn).collect();
            let mut failed = None;
            for (m, from) in members.iter_mut().zip(logged_before) {
                if let Err(why) = m.wait_started(from) {
                    failed = Some((m.name.clone(), m.log_text(), why));
                    break;
                }
            }
            match failed {
                None => return members,
                Some((_, _, StartFailure::PortTaken)) if attempt < START_ATTEMPTS => continue,
                Some((name, log, StartFailure::PortTaken)) => {
                    panic!("{name}: its ports were taken {START_ATTEMPTS} times:\n{log}")
                }
                Some((name, log, StartFailure::Other(why))) => panic!("{name} did not start: {why}\n{log}"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// A member not started yet, with its data directory and log in a new temporary directory.
    fn new(name: &str, extra: &[&str], https: bool) -> Member {
        let root = tempfile::tempdir().unwrap();
        Member {
            name: name.to_string(),
            data_dir: root.path().join("data"),
            client_port: 0,
            peer_port: 0,
            https,
            metrics_port: 0,
            extra: extra.iter().map(|s| (*s).to_string()).collect(),
            binary: PathBuf::from(env!("CARGO_BIN_EXE_cairn")),
            log: root.path().join(format!("{name}.log")),
            child: None,
            _root: root,
        }
    }

    /// Starts the member again as [`Member::restart`] does, running `binary` from now on (an
    /// upgrade, or a downgrade).
    pub fn restart_as(&mut self, binary: &Path) {
        self.binary = binary.to_path_buf();
        self.restart();
    }

    /// Starts the member again on the same data directory and ports (its peer URL is part of
    /// the membership stored there), after [`Member::stop`], and waits until it is healthy.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "{} is still running", self.name);
        let logged_before = self.spawn();
        match self.wait_started(logged_before) {
            Ok(()) => {}
            Err(StartFailure::PortTaken) => panic!("{}: its ports were taken:\n{}", self.name, self.log_text()),
            Err(StartFailure::Other(why)) => panic!("{} did not restart: {why}\n{}", self.name, self.log_text()),
        }
    }

    /// Starts the process: how much of the log was written before it.
    fn spawn(&mut self) -> usize {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        // What this attempt logs starts here.
        let logged_before = self.log_text().len();
        let child = Command::new(&self.binary)
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--listen-client-urls", &self.client_url()])
            .args(["--advertise-client-urls", &self.client_url()])
            .args(["--listen-peer-urls", &self.peer_url()])
            .args(["--initial-advertise-peer-urls", &self.peer_url()])
            .args(if self.https {
                vec![
                    "--listen-metrics-urls".to_string(),
                    format!("http://127.0.0.1:{}", self.metrics_port),
                ]
            } else {
                vec![]
            })
            .args(&self.extra)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        logged_before
    }

    /// Waits until the process just spawned is healthy, or fails to start.
    fn wait_started(&mut self, logged_before: usize) -> Result<(), StartFailure> {
        let pid = self.child.as_ref().map_or(0, Child::id);
        let deadline = Instant::now() + PATIENCE;
        loop {
            let child = self.child.as_mut().unwrap();
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                let log = self.log_text();
                if log
                    .get(logged_before..)
                    .unwrap_or_default()
                    .contains("cannot listen on")
                {
                    return Err(StartFailure::PortTaken);
                }
                return Err(StartFailure::Other(format!("process {pid} exited with {status}")));
            }
            let health_port = if self.https {
                self.metrics_port
            } else {
                self.client_port
            };
            if let Ok((200, body)) = http_get(health_port, "/health") {
                // Healthy, and this process: another test's member may have been given the same
                // port (free_ports releases it before cairn binds it) and answer for it, while
                // this one fails to listen.
                if body.contains(r#""health":"true""#) && listens_on(pid, health_port) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(StartFailure::Other(format!("not healthy within {PATIENCE:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Asks the process to stop (SIGTERM) and waits for it to exit: its exit status.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("the member is not running");
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM {} failed", child.id());
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} did not stop within {PATIENCE:?} of SIGTERM\n{}",
                    self.name,
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().unwrap().is_none(),
            None => false,
        }
    }

    fn scheme(&self) -> &'static str {
        if self.https {
            "https"
        } else {
            "http"
        }
    }

    pub fn client_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.client_port)
    }

    /// The client endpoint as `host:port`, without a scheme.
    pub fn client_addr(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub fn peer_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.peer_port)
    }

    /// What the member wrote to stderr so far, each JSON line read back as text (see
    /// [`readable_log`]).
    pub fn log_text(&self) -> String {
        readable_log(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// `GET path` on the client port: the status code and body.
    #[track_caller]
    pub fn get(&self, path: &str) -> (u16, String) {
        match http_get(self.client_port, path) {
            Ok(answer) => answer,
            Err(e) => panic!("GET {path} on {}: {e}", self.name),
        }
    }

    /// etcdctl with this member's client URL as its endpoint.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        etcdctl(&self.client_url(), args, None)
    }

    /// etcdctl with `endpoint` (a URL or `host:port`) as its endpoint.
    pub fn etcdctl_at(&self, endpoint: &str, args: &[&str]) -> Output {
        etcdctl(endpoint, args, None)
    }

    /// etcdctl reading `input` on its stdin (`txn`).
    pub fn etcdctl_stdin(&self, args: &[&str], input: &str) -> Output {
        etcdctl(&self.client_url(), args, Some(input))
    }

    /// etcdctl, which must succeed: its stdout.
    #[track_caller]
    pub fn ok(&self, args: &[&str]) -> String {
        ok(self.etcdctl(args))
    }

    /// etcdctl with `-w json`, which must succeed: its output parsed.
    #[track_caller]
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let args: Vec<&str> = args.iter().copied().chain(["-w", "json"]).collect();
        json(self.etcdctl(&args))
    }

    /// etcdctl, which must fail with `needle` in its stderr: the stderr.
    #[track_caller]
    pub fn fails(&self, args: &[&str], needle: &str) -> String {
        fails(self.etcdctl(args), needle)
    }

    /// The store's current revision, from the header of a linearizable read.
    #[track_caller]
    pub fn revision(&self) -> i64 {
        self.json(&["get", "revision-probe"])["header"]["revision"]
            .as_i64()
            .unwrap()
    }

    /// A long-running etcdctl (`watch`), whose stdout is read line by line.
    pub fn etcdctl_lines(&self, args: &[&str]) -> Lines {
        let mut child = etcdctl_command(&self.client_url(), args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let (err_tx, err_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            let _ = err_tx.send(text);
        });
        Lines {
            child,
            lines: rx,
            stderr: err_rx,
            seen: Vec::new(),
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let running = self.child.is_some();
        self.kill();
        if running && std::thread::panicking() {
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!("--- last lines of {}'s log ---\n{}", self.name, tail.join("\n"));
        }
    }
}

/// The stdout of a long-running etcdctl, line by line, with a deadline.
pub struct Lines {
    child: Child,
    lines: Receiver<String>,
    stderr: Receiver<String>,
    /// Every line read so far.
    seen: Vec<String>,
}

impl Lines {
    /// Reads lines until one equals `last` (inclusive): every line read by this call.
    pub fn until(&mut self, last: &str) -> Vec<String> {
        self.until_match(|line| line == last)
    }

    /// Reads lines until one satisfies `done` (inclusive): every line read by this call.
    pub fn until_match(&mut self, done: impl Fn(&str) -> bool) -> Vec<String> {
        let deadline = Instant::now() + PATIENCE;
        let start = self.seen.len();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let last = done(&line);
                    self.seen.push(line);
                    if last {
                        return self.seen[start..].to_vec();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("not the line awaited within {PATIENCE:?}; read so far: {:?}", self.seen)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let _ = self.child.wait();
                    let stderr = self.stderr.recv_timeout(PATIENCE).unwrap_or_default();
                    panic!(
                        "etcdctl ended before the line awaited; read: {:?}\nstderr: {stderr}",
                        self.seen
                    )
                }
            }
        }
    }

    /// Waits for the process to end by itself: its exit status and stderr.
    pub fn wait_exit(&mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let stderr = self.stderr.recv_timeout(PATIENCE).unwrap_or_default();
                return (status, stderr);
            }
            assert!(Instant::now() < deadline, "etcdctl did not exit within {PATIENCE:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends the process SIGTERM and waits for it to end.
    pub fn terminate(&mut self) {
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM {} failed", self.child.id());
        self.wait_exit();
    }

    /// Every stdout line the process printed, once it has ended.
    pub fn rest(&mut self) -> Vec<String> {
        self.seen.extend(self.lines.iter());
        self.seen.clone()
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn etcdctl_command(endpoint: &str, args: &[&str]) -> Command {
    assert!(
        Path::new(ETCDCTL).exists(),
        "{ETCDCTL} is missing: run tests/run-all.sh, which installs Debian's etcd-client"
    );
    etcdctl_of(Path::new(ETCDCTL), endpoint, args)
}

/// The etcdctl at `bin` (any version) against `endpoint`, v3 API, with generous timeouts that
/// `args` may override (a later flag wins), and nothing from the caller's `ETCDCTL_*`
/// environment.
pub fn etcdctl_of(bin: &Path, endpoint: &str, args: &[&str]) -> Command {
    let mut command = Command::new(bin);
    // Only what this harness says: no endpoint or format from the caller's environment.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("ETCDCTL_") {
            command.env_remove(name);
        }
    }
    command
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        // Generous: two cores shared with builds and other tests.
        .args(["--dial-timeout=10s", "--command-timeout=30s"])
        .args(args);
    command
}

/// Runs etcdctl against `endpoint`, with `input` on its stdin if given.
pub fn etcdctl(endpoint: &str, args: &[&str], input: Option<&str>) -> Output {
    let mut command = etcdctl_command(endpoint, args);
    let Some(input) = input else {
        return command.stdin(Stdio::null()).output().unwrap();
    };
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// The stdout of a command that must have succeeded.
#[track_caller]
pub fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "etcdctl failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The stdout of a command that must have succeeded, parsed as JSON.
#[track_caller]
pub fn json(output: Output) -> serde_json::Value {
    let text = ok(output);
    match serde_json::from_str(&text) {
        Ok(value) => value,
        Err(e) => panic!("not JSON ({e}): {text}"),
    }
}

/// The stderr of a command that must have failed with `needle` in its stderr.
#[track_caller]
pub fn fails(output: Output, needle: &str) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "etcdctl succeeded where it should fail with {needle:?}:\nstdout: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(stderr.contains(needle), "no {needle:?} in etcdctl's stderr:\n{stderr}");
    stderr
}

/// `GET path` on 127.0.0.1:`port` over HTTP/1.1: the status code and body.
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| invalid("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("no status line"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    if chunked {
        body = dechunk(&body).ok_or_else(|| invalid("bad chunked body"))?;
    }
    let body = String::from_utf8(body).map_err(|_| invalid("body is not UTF-8"))?;
    Ok((status, body))
}

/// A chunked HTTP/1.1 body, joined.
fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let eol = raw.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&raw[..eol]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[eol + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

/// Decodes standard base64 (how etcdctl's JSON carries keys and values) as UTF-8 text.
pub fn b64(encoded: &str) -> String {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {encoded:?}"),
        }
    };
    let mut bytes = Vec::new();
    for chunk in encoded.trim_end_matches('=').as_bytes().chunks(4) {
        let n = chunk.iter().fold(0u32, |acc, c| (acc << 6) | value(*c)) << (6 * (4 - chunk.len()));
        let decoded = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        bytes.extend_from_slice(&decoded[..chunk.len().saturating_sub(1)]);
    }
    String::from_utf8(bytes).unwrap()
}

/// A key-value pair as a range response carries it, decoded.
#[derive(Debug, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: String,
    pub create: i64,
    pub modified: i64,
    pub version: i64,
    pub lease: u64,
}

/// The `kvs` of a JSON range response (absent numbers are etcd's omitted zeroes).
pub fn kv_list(range: &serde_json::Value) -> Vec<Kv> {
    let number = |v: &serde_json::Value| v.as_i64().unwrap_or(0);
    range["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| Kv {
                    key: b64(kv["key"].as_str().unwrap()),
                    value: b64(kv["value"].as_str().unwrap_or("")),
                    create: number(&kv["create_revision"]),
                    modified: number(&kv["mod_revision"]),
                    version: number(&kv["version"]),
                    lease: kv["lease"].as_u64().unwrap_or(0),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The `(key, value)` pairs of a JSON range response's `kvs`, decoded.
pub fn kvs(range: &serde_json::Value) -> Vec<(String, String)> {
    range["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| {
                    (
                        b64(kv["key"].as_str().unwrap()),
                        b64(kv["value"].as_str().unwrap_or("")),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A log of etcd's JSON lines as text, a line each: the message, then the other fields as
/// `key=value`, strings as they were logged rather than JSON-escaped, so a test looks for
/// what was said, not how it was quoted. Lines that are not JSON are kept as they are.
pub fn readable_log(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(line) {
            Ok(fields) => {
                out.push_str(fields.get("msg").and_then(|m| m.as_str()).unwrap_or_default());
                for (key, value) in &fields {
                    if !["level", "ts", "caller", "msg"].contains(&key.as_str()) {
                        match value {
                            serde_json::Value::String(s) => out.push_str(&format!(" {key}={s}")),
                            other => out.push_str(&format!(" {key}={other}")),
                        }
                    }
                }
            }
            Err(_) => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Builds tests/goclients' round against the etcd Go client `version` ("v3.6" is its go.mod,
/// the others its `<version>.mod`), with the module sums committed there.
pub fn go_round(version: &str, out: &Path) -> PathBuf {
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/goclients");
    let binary = out.join(format!("round-{version}"));
    let mut go = Command::new("go");
    go.current_dir(&module)
        .env("GOTOOLCHAIN", "local")
        .args(["build", "-mod=readonly"]);
    if version != "v3.6" {
        go.arg(format!("-modfile={version}.mod"));
    }
    let built = go.arg("-o").arg(&binary).arg(".").output();
    let built = built.unwrap_or_else(|e| panic!("cannot run go ({e}): tests/run-all.sh needs Go 1.26"));
    assert!(
        built.status.success(),
        "building the {version} round failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    binary
}
