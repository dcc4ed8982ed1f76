//! The etcd flags that change how a member serves, each doing what etcd's does:
//! `--listen-client-http-urls`, `--enable-grpc-gateway`, `--cors`, `--host-whitelist`,
//! `--max-concurrent-streams`, `--socket-reuse-port`, `--strict-reconfig-check`,
//! `--max-learners` and `--unsafe-no-fsync`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;

use common::{free_ports, http_get, Member};

/// A member started by hand (its flags move HTTP off the client URL, where the harness
/// looks for health): killed on drop.
struct Custom(Child);

impl Drop for Custom {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The ports of a member started by hand: its client and peer URLs', and the one where
/// `/health` answers.
#[derive(Clone, Copy)]
struct Ports {
    client: u16,
    peer: u16,
    health: u16,
}

/// Starts cairn on `ports` with `extra`, and waits until `/health` answers 200.
fn start(dir: &std::path::Path, ports: Ports, extra: &[&str]) -> Custom {
    start_with_env(dir, ports, extra, &[])
}

/// [`start`], with `env` added to cairn's environment.
fn start_with_env(dir: &std::path::Path, ports: Ports, extra: &[&str], env: &[(&str, &str)]) -> Custom {
    let Ports {
        client,
        peer,
        health: health_port,
    } = ports;
    let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
        .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(extra)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut member = Custom(child);
    for _ in 0..1200 {
        if let Ok((200, _)) = http_get(health_port, "/health") {
            return member;
        }
        assert!(member.0.try_wait().unwrap().is_none(), "cairn exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("not healthy on port {health_port}");
}

/// HTTP/1.1 to a member's port.
#[derive(Clone, Copy)]
struct Http(u16);

impl Http {
    /// One request with `headers`: the status, the response's headers (lower-cased names) and
    /// its body.
    fn request(
        self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, Vec<(String, String)>, String) {
        let Http(port) = self;
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut text = format!(
            "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            text += &format!("{k}: {v}\r\n");
        }
        text += "\r\n";
        text += body;
        stream.write_all(text.as_bytes()).unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let mut lines = head.lines();
        let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
        let headers = lines
            .filter_map(|l| l.split_once(": "))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
            .collect();
        (status, headers, body.to_string())
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[test]
fn http_urls_take_the_http_endpoints_off_the_client_urls() {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = free_ports();
    let http = free_ports().0;
    let ports = Ports {
        client,
        peer,
        health: http,
    };
    let _member = start(
        dir.path(),
        ports,
        &["--listen-client-http-urls", &format!("http://127.0.0.1:{http}")],
    );
    // gRPC stays on the client URL...
    let endpoint = format!("127.0.0.1:{client}");
    common::ok(common::etcdctl(&endpoint, &["put", "k", "v"], None));
    // ...and HTTP is only on the HTTP URL, the gateway included.
    assert_eq!(http_get(client, "/health").unwrap().0, 404);
    let (status, _, body) = Http(http).request("POST", "/v3/kv/range", &[], r#"{"key":"aw=="}"#);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""value":"dg==""#), "{body}");
}

#[test]
fn without_the_gateway_its_paths_are_not_found_and_health_still_answers() {
    let m = Member::start("nogw", &["--enable-grpc-gateway=false"]);
    let (status, _, _) = Http(m.client_port).request("POST", "/v3/kv/range", &[], r#"{"key":"aw=="}"#);
    assert_eq!(status, 404);
    assert_eq!(m.get("/health").0, 200);
}

#[test]
fn cors_and_the_host_whitelist_guard_the_http_endpoints_as_etcds_do() {
    let m = Member::start(
        "cors",
        &["--cors=https://a.example", "--host-whitelist=allowed.example,127.0.0.1"],
    );
    let http = Http(m.client_port);
    // DNS rebinding: a Host not on the list is refused, whatever its port.
    let (status, _, body) = http.request("GET", "/health", &[("Host", "evil.example:2379")], "");
    assert_eq!(status, 421);
    assert!(body.contains("CVE-2018-5702"), "{body}");
    let (status, headers, _) = http.request(
        "GET",
        "/health",
        &[("Host", "allowed.example:2379"), ("Origin", "https://a.example")],
        "",
    );
    assert_eq!(status, 200);
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some("https://a.example")
    );
    assert_eq!(
        header(&headers, "access-control-allow-methods"),
        Some("POST, GET, OPTIONS, PUT, DELETE")
    );
    let (_, headers, _) = http.request(
        "GET",
        "/health",
        &[("Host", "127.0.0.1"), ("Origin", "https://b.example")],
        "",
    );
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        None,
        "an origin not allowed"
    );
    let (status, _, _) = http.request("OPTIONS", "/v3/kv/put", &[("Host", "127.0.0.1")], "");
    assert_eq!(status, 200, "a preflight is answered");
    // gRPC is not HTTP's to guard: etcdctl connects whatever its authority.
    m.ok(&["put", "k", "v"]);
}

#[test]
fn by_default_every_origin_and_host_is_allowed() {
    let m = Member::start("open", &[]);
    let (status, headers, _) = Http(m.client_port).request("GET", "/health", &[("Host", "anything.example")], "");
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "access-control-allow-origin"), Some("*"));
}

/// The server's HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS (`None` if it sends none), read off
/// the connection preface.
fn max_concurrent_streams(port: u16) -> Option<u32> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    // An empty SETTINGS frame.
    stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).unwrap();
    assert_eq!(head[3], 4, "the server's first frame is SETTINGS");
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).unwrap();
    payload
        .chunks_exact(6)
        .find(|s| u16::from_be_bytes([s[0], s[1]]) == 3)
        .map(|s| u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
}

#[test]
fn max_concurrent_streams_is_what_the_server_tells_each_connection() {
    let m = Member::start("streams", &["--max-concurrent-streams=7"]);
    assert_eq!(max_concurrent_streams(m.client_port), Some(7));
    let m = Member::start("unlimited", &[]);
    assert_eq!(max_concurrent_streams(m.client_port), Some(u32::MAX), "etcd's default");
}

#[test]
fn socket_reuse_port_lets_the_member_share_a_port_bound_with_so_reuseport() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (shared, peer) = free_ports();
    let _holder = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseport(true).unwrap();
        socket.bind(([127, 0, 0, 1], shared).into()).unwrap();
        socket.listen(16).unwrap()
    });
    let dir = tempfile::tempdir().unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--data-dir")
        .arg(dir.path().join("a"))
        .args(["--listen-client-urls", &format!("http://127.0.0.1:{shared}")])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cannot listen on"));
    let health = free_ports().0;
    let ports = Ports {
        client: shared,
        peer,
        health,
    };
    let _member = start(
        dir.path(),
        ports,
        &[
            "--socket-reuse-port",
            "--listen-client-http-urls",
            &format!("http://127.0.0.1:{health}"),
        ],
    );
}

#[test]
fn strict_reconfig_check_refuses_a_voter_the_started_members_cannot_carry() {
    let m = Member::start("strict", &[]);
    // A lone member may add its second voter (etcd's special case)...
    m.ok(&["member", "add", "second", "--peer-urls=http://127.0.0.1:1"]);
    // ...but two voters of which one has not started cannot take a third.
    m.fails(
        &["member", "add", "third", "--peer-urls=http://127.0.0.1:2"],
        "re-configuration failed due to not enough started members",
    );
    // (Without the check the proposal would go to Raft and never commit: the unit tests of
    // `reconfig` cover `--strict-reconfig-check=false`.)
}

#[test]
fn max_learners_bounds_the_learners_with_etcds_error() {
    let m = Member::start("learners", &[]);
    m.ok(&["member", "add", "l1", "--learner", "--peer-urls=http://127.0.0.1:1"]);
    m.fails(
        &["member", "add", "l2", "--learner", "--peer-urls=http://127.0.0.1:2"],
        "too many learner members in cluster",
    );
    let m = Member::start("learners2", &["--max-learners=2"]);
    m.ok(&["member", "add", "l1", "--learner", "--peer-urls=http://127.0.0.1:1"]);
    m.ok(&["member", "add", "l2", "--learner", "--peer-urls=http://127.0.0.1:2"]);
}

/// `etcd_disk_wal_fsync_duration_seconds_count` from `/metrics`.
fn wal_fsyncs(m: &Member) -> u64 {
    let (_, text) = m.get("/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix("etcd_disk_wal_fsync_duration_seconds_count "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn unsafe_no_fsync_answers_writes_without_a_wal_fsync() {
    let m = Member::start("nofsync", &["--unsafe-no-fsync"]);
    let before = wal_fsyncs(&m);
    for i in 0..5 {
        m.ok(&["put", &format!("k{i}"), "v"]);
    }
    assert_eq!(wal_fsyncs(&m), before, "no fsync for five puts");
    let m = Member::start("fsync", &[]);
    let before = wal_fsyncs(&m);
    m.ok(&["put", "k", "v"]);
    assert!(wal_fsyncs(&m) > before, "a put is fsynced by default");
}

/// The body of `GET path`, as bytes (a profile is binary).
fn get_bytes(port: u16, path: &str) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&raw[..split])
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    (status, raw[split + 4..].to_vec())
}

/// What `go tool pprof <flag>` prints of the profile in `file`; it must read it.
fn go_tool_pprof(flag: &str, file: &std::path::Path) -> String {
    let read = Command::new("go")
        .args(["tool", "pprof", flag])
        .arg(file)
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("go (tests/run-all.sh needs it) reads the profile");
    assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
    String::from_utf8_lossy(&read.stdout).into_owned()
}

#[test]
fn enable_pprof_serves_a_cpu_profile_go_tool_pprof_reads() {
    let m = Member::start("pprof", &["--enable-pprof"]);
    let (status, profile) = get_bytes(m.client_port, "/debug/pprof/profile?seconds=1");
    assert_eq!(status, 200);
    assert_eq!(profile.get(..2), Some(&[0x1f, 0x8b][..]), "gzipped, as Go's are");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cpu.pb.gz");
    std::fs::write(&file, &profile).unwrap();
    let text = go_tool_pprof("-raw", &file);
    assert!(text.contains("PeriodType: cpu nanoseconds"), "{text}");
    let m = Member::start("nopprof", &[]);
    assert_eq!(get_bytes(m.client_port, "/debug/pprof/profile?seconds=1").0, 404);
}

/// The heap profile is jemalloc's, which samples from startup with `--enable-pprof`: what the
/// member allocated while starting, and still holds, is in it under cairn's own function
/// names. jemalloc samples at random, so the member samples every 4 KiB on average rather
/// than 512 KiB: a started member holds a few MB, and 512 KiB's handful of samples could
/// all miss cairn's functions.
#[test]
fn enable_pprof_serves_a_heap_profile_of_cairns_allocations_go_tool_pprof_reads() {
    use pprof::protos::Message;
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = free_ports();
    let sampling = [("_RJEM_MALLOC_CONF", "lg_prof_sample:12")];
    let ports = Ports {
        client,
        peer,
        health: client,
    };
    let _member = start_with_env(dir.path(), ports, &["--enable-pprof"], &sampling);
    let (status, index) = http_get(client, "/debug/pprof/").unwrap();
    assert_eq!(status, 200);
    assert!(
        index.lines().any(|l| l.starts_with("heap: live allocations")),
        "{index}"
    );
    let (status, headers, _) = Http(client).request("HEAD", "/debug/pprof/heap", &[], "");
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "content-type"), Some("application/octet-stream"));
    let (status, gzipped) = get_bytes(client, "/debug/pprof/heap");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&gzipped));
    assert_eq!(gzipped.get(..2), Some(&[0x1f, 0x8b][..]), "gzipped, as Go's are");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gzipped.as_slice())
        .read_to_end(&mut raw)
        .unwrap();
    let profile = pprof::protos::Profile::decode(raw.as_slice()).unwrap();
    let string = |i: i64| profile.string_table[usize::try_from(i).unwrap()].as_str();
    let types: Vec<_> = profile
        .sample_type
        .iter()
        .map(|t| (string(t.ty), string(t.unit)))
        .collect();
    assert_eq!(types, [("inuse_space", "bytes")]);
    assert!(
        profile.sample.iter().any(|s| s.value.iter().any(|&v| v > 0)),
        "{profile:?}"
    );
    let cairns = profile
        .location
        .iter()
        .flat_map(|l| &l.line)
        .filter_map(|line| profile.function.iter().find(|f| f.id == line.function_id))
        .map(|f| string(f.name))
        .filter(|name| name.contains("cairn"))
        .count();
    assert!(cairns > 0, "no location in a function of cairn's: {profile:?}");

    let file = dir.path().join("heap.pb.gz");
    std::fs::write(&file, &gzipped).unwrap();
    let text = go_tool_pprof("-top", &file);
    assert!(text.contains("Type: inuse_space"), "{text}");
}
