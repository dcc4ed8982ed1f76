//! Discovery end to end: three cairn members started without `--initial-cluster` bootstrap one
//! cluster, from DNS SRV records (served by a DNS server in this test, inside a network and
//! mount namespace of the test's own, where it is the resolver `/etc/resolv.conf` names), and
//! through v3 discovery services (a cairn member, and etcd 3.7.3, which tests/run-all.sh
//! builds into target/etcd-3.7). What a member is refused, it is refused with etcd's words.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::BTreeSet;
use std::net::UdpSocket;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use hickory_resolver::proto::op::{Message, ResponseCode};
use hickory_resolver::proto::rr::rdata::{A, SRV};
use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};

mod common;
#[path = "common/pki.rs"]
mod pki;
#[path = "common/process.rs"]
mod process;

use common::{Member, PATIENCE};

/// A cairn process started with discovery flags: unlike [`Member`], it is not waited for when
/// started (it is not healthy before the others have registered too).
struct Candidate {
    name: String,
    client_port: u16,
    peer_port: u16,
    log: PathBuf,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Candidate {
    /// Member `name`, not started yet, on free ports.
    fn new(name: &str) -> Candidate {
        let (client_port, peer_port) = common::free_ports();
        let dir = tempfile::tempdir().unwrap();
        Candidate {
            name: name.to_string(),
            client_port,
            peer_port,
            log: dir.path().join(format!("{name}.log")),
            child: None,
            dir,
        }
    }

    /// Starts member `name` on free ports, advertising its peer URL on `peer_host` (an
    /// address or a name), with `extra` flags.
    fn start(name: &str, peer_host: &str, extra: &[&str]) -> Candidate {
        let mut c = Candidate::new(name);
        c.spawn(peer_host, extra);
        c
    }

    /// Starts the process (again, after it stopped).
    fn spawn(&mut self, peer_host: &str, extra: &[&str]) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{}", self.peer_port)])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://{peer_host}:{}", self.peer_port),
            ])
            .args(extra)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    fn log_text(&self) -> String {
        common::readable_log(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Waits until the member answers `/health` with a leader.
    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + PATIENCE * 2;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("{} exited with {status}:\n{}", self.name, self.log_text());
            }
            if let Ok((200, body)) = common::http_get(self.client_port, "/health") {
                if body.contains(r#""health":"true""#) {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{} not healthy in time:\n{}",
                self.name,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the process to exit by itself: its status and log.
    fn wait_exit(&mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + PATIENCE;
        let child = self.child.as_mut().unwrap();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return (status, self.log_text());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{} did not exit:\n{}", self.name, self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, and wait for the exit.
    fn stop(&mut self) {
        let child = self.child.as_mut().unwrap();
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(sent.success());
        self.wait_exit();
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            if std::thread::panicking() {
                eprintln!("--- {}'s log ---\n{}", self.name, self.log_text());
            }
        }
    }
}

/// A refused member exits with a failure, its log saying `why`.
#[track_caller]
fn refused(mut c: Candidate, why: &str) {
    let (status, log) = c.wait_exit();
    assert!(!status.success(), "{} started:\n{log}", c.name);
    assert!(log.contains(why), "{}: wanted {why:?} in:\n{log}", c.name);
}

/// Checks that `members` (all healthy) are one cluster: each lists all of them, by name once
/// each has published it, with the peer URLs `peer_urls` (by name); a write on one is read on
/// another.
fn one_cluster(members: &mut [Candidate], peer_urls: &[(String, String)]) {
    for m in members.iter_mut() {
        m.wait_healthy();
    }
    let want: BTreeSet<(String, String)> = peer_urls.iter().cloned().collect();
    let deadline = Instant::now() + PATIENCE;
    for m in members.iter() {
        loop {
            let list = common::json(common::etcdctl(&m.endpoint(), &["member", "list", "-w", "json"], None));
            let got: BTreeSet<(String, String)> = list["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| {
                    let name = x["name"].as_str().unwrap_or_default().to_string();
                    let url = x["peerURLs"][0].as_str().unwrap_or_default().to_string();
                    (name, url)
                })
                .collect();
            if got == want {
                break;
            }
            assert!(Instant::now() < deadline, "{} lists {got:?}, not {want:?}", m.name);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let (first, last) = (members.first().unwrap(), members.last().unwrap());
    common::ok(common::etcdctl(&first.endpoint(), &["put", "discovered", "yes"], None));
    let got = common::ok(common::etcdctl(
        &last.endpoint(),
        &["get", "discovered", "--print-value-only"],
        None,
    ));
    assert_eq!(got.trim(), "yes");
}

/// etcdctl against a discovery service that may still be starting: retried until it works.
fn etcdctl_until_ok(endpoint: &str, args: &[&str]) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let out = common::etcdctl(endpoint, args, None);
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            Instant::now() < deadline,
            "etcdctl {args:?} at {endpoint}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The registrations under `token` on the discovery service at `endpoint`: (key, value).
fn registrations(endpoint: &str, token: &str) -> Vec<(String, String)> {
    let prefix = format!("/_etcd/registry/{token}/members");
    let range = common::json(common::etcdctl(
        endpoint,
        &["get", &prefix, "--prefix", "-w", "json"],
        None,
    ));
    common::kvs(&range)
}

/// Three members bootstrap one cluster through the discovery service at `service`, under
/// `token`; then a fourth is refused (the cluster is full), and a member of a token without a
/// size is refused at once.
fn bootstrap_through(service: &str, token: &str) {
    etcdctl_until_ok(service, &["put", &format!("/_etcd/registry/{token}/_config/size"), "3"]);
    let flags = ["--discovery-endpoints", service, "--discovery-token", token];
    let mut members: Vec<Candidate> = ["d1", "d2", "d3"]
        .iter()
        .map(|name| Candidate::start(name, "127.0.0.1", &flags))
        .collect();
    let urls: Vec<(String, String)> = members
        .iter()
        .map(|m| (m.name.clone(), format!("http://127.0.0.1:{}", m.peer_port)))
        .collect();
    one_cluster(&mut members, &urls);
    // etcd's layout: a key per member, under its ID in hex, holding name=peer-URL.
    let registered = registrations(service, token);
    let values: BTreeSet<String> = registered.iter().map(|(_, v)| v.clone()).collect();
    let want: BTreeSet<String> = urls.iter().map(|(n, u)| format!("{n}={u}")).collect();
    assert_eq!(values, want);
    let listed = common::json(common::etcdctl(
        &members[0].endpoint(),
        &["member", "list", "-w", "json"],
        None,
    ));
    for (key, value) in &registered {
        let id = key.rsplit('/').next().unwrap();
        let member = listed["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| format!("{:x}", m["ID"].as_u64().unwrap()) == id);
        let member = member.unwrap_or_else(|| panic!("{key} is no member's ID: {listed}"));
        assert_eq!(
            value,
            &format!(
                "{}={}",
                member["name"].as_str().unwrap(),
                member["peerURLs"][0].as_str().unwrap()
            )
        );
    }
    // A restart reads the cluster from the data directory: no discovery, even with the
    // service gone.
    members[0].stop();
    members[0].spawn(
        "127.0.0.1",
        &[
            "--discovery-endpoints",
            "http://127.0.0.1:1",
            "--discovery-token",
            token,
        ],
    );
    members[0].wait_healthy();
    assert!(members[0]
        .log_text()
        .contains("discovery is ignored since the cluster is already initialized"));
    refused(
        Candidate::start("d4", "127.0.0.1", &flags),
        "failed to join discovery cluster (discovery: cluster is full)",
    );
    refused(
        Candidate::start(
            "lost",
            "127.0.0.1",
            &[
                "--discovery-endpoints",
                service,
                "--discovery-token",
                &format!("{token}-unset"),
            ],
        ),
        "failed to join discovery cluster (discovery: size key not found)",
    );
}

#[test]
fn three_members_bootstrap_one_cluster_through_a_cairn_discovery_service() {
    let service = Member::start("discovery", &[]);
    bootstrap_through(&service.client_url(), "cairn-token");
}

#[test]
fn three_members_bootstrap_one_cluster_through_an_etcd_discovery_service() {
    let etcd = process::etcd_tool("etcd-3.7", "etcd", "tests/etcd-3.7/build.sh");
    let service = process::Server::start("etcd 3.7", &etcd, &[]);
    bootstrap_through(&service.client_url, "etcd-token");
}

#[test]
fn an_etcd_member_bootstraps_through_a_cairn_discovery_service_and_registers_as_cairn_members_do() {
    let service = Member::start("discovery", &[]);
    service.ok(&["put", "/_etcd/registry/mixed/_config/size", "1"]);
    let etcd = process::etcd_tool("etcd-3.7", "etcd", "tests/etcd-3.7/build.sh");
    let (client, peer) = common::free_ports();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("etcd.log");
    let mut child = Command::new(etcd)
        .args(["--name", "e1"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
        .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args([
            "--discovery-endpoints",
            &service.client_url(),
            "--discovery-token",
            "mixed",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let endpoint = format!("127.0.0.1:{client}");
    let deadline = Instant::now() + PATIENCE;
    let listed = loop {
        let out = common::etcdctl(&endpoint, &["member", "list", "-w", "json"], None);
        if out.status.success() {
            break common::json(out);
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!(
                "etcd did not bootstrap:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let registered = registrations(&service.client_url(), "mixed");
    let _ = child.kill();
    let _ = child.wait();
    let id = listed["members"][0]["ID"].as_u64().unwrap();
    assert_eq!(
        registered,
        [(
            format!("/_etcd/registry/mixed/members/{id:x}"),
            format!("e1=http://127.0.0.1:{peer}")
        )]
    );
}

#[test]
fn a_member_discovers_over_mutual_tls_as_a_user_and_wrong_credentials_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ca = pki::Ca::new(dir.path(), "disco");
    let server = ca.issue("server", "discovery", &["127.0.0.1"], pki::Usage::Both);
    let client = ca.issue("client", "joiner", &[], pki::Usage::Client);
    let flags = pki::mtls_flags(&ca, &server);
    let service = Member::start_https("discovery", &flags.iter().map(String::as_str).collect::<Vec<_>>());
    let url = service.client_url();
    let tls = [
        format!("--cacert={}", ca.cert()),
        format!("--cert={}", client.cert()),
        format!("--key={}", client.key()),
    ];
    let admin = |args: &[&str]| {
        let all: Vec<&str> = tls
            .iter()
            .map(String::as_str)
            .chain(["--user=root:rootpw"])
            .chain(args.iter().copied())
            .collect();
        common::ok(common::etcdctl(&url, &all, None))
    };
    let setup: [&[&str]; 8] = [
        &["user", "add", "root:rootpw"],
        &["user", "add", "joiner:joinpw"],
        &["role", "add", "registry"],
        &[
            "role",
            "grant-permission",
            "registry",
            "readwrite",
            "/_etcd/registry/",
            "--prefix",
        ],
        &["user", "grant-role", "joiner", "registry"],
        &["auth", "enable"],
        &["put", "/_etcd/registry/secure/_config/size", "1"],
        &["put", "/_etcd/registry/closed/_config/size", "1"],
    ];
    for args in setup {
        admin(args);
    }
    let secure = [
        format!("--discovery-endpoints={url}"),
        format!("--discovery-cacert={}", ca.cert()),
        format!("--discovery-cert={}", client.cert()),
        format!("--discovery-key={}", client.key()),
    ];
    let with = |token: &str, user: &str| -> Vec<String> {
        let mut all = secure.to_vec();
        all.extend([format!("--discovery-token={token}"), format!("--discovery-user={user}")]);
        all
    };
    let args = with("secure", "joiner:joinpw");
    let mut member = Candidate::start(
        "alone",
        "127.0.0.1",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    member.wait_healthy();
    let registered = common::kvs(&common::json(common::etcdctl(
        &url,
        &tls.iter()
            .map(String::as_str)
            .chain([
                "--user=root:rootpw",
                "get",
                "/_etcd/registry/secure/members",
                "--prefix",
                "-w",
                "json",
            ])
            .collect::<Vec<_>>(),
        None,
    )));
    assert_eq!(registered.len(), 1);
    assert_eq!(registered[0].1, format!("alone=http://127.0.0.1:{}", member.peer_port));
    // Wrong credentials are not retried: no backoff could make them right.
    let args = with("closed", "joiner:wrong");
    refused(
        Candidate::start("wrong", "127.0.0.1", &args.iter().map(String::as_str).collect::<Vec<_>>()),
        "failed to join discovery cluster (discovery: the discovery service refused: etcdserver: authentication failed, invalid user ID or password",
    );
    // Nor is a user the registry is closed to (joiner may write only under /_etcd/registry/,
    // a user without the role nowhere).
    admin(&["user", "add", "nobody:nobodypw"]);
    let args = with("closed", "nobody:nobodypw");
    refused(
        Candidate::start(
            "nobody",
            "127.0.0.1",
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        ),
        "etcdserver: permission denied",
    );
}

#[test]
fn discovery_flags_are_checked_as_etcd_checks_them() {
    let with = |args: &[&str], why: &str| refused(Candidate::start("flags", "127.0.0.1", args), why);
    with(
        &["--discovery-token=t"],
        "both --discovery-token and --discovery-endpoints must be set",
    );
    with(
        &[
            "--discovery-endpoints=http://127.0.0.1:1,,http://127.0.0.1:2",
            "--discovery-token=t",
        ],
        "must not contain empty endpoints",
    );
    with(
        &[
            "--discovery-srv=cairn.invalid",
            "--initial-cluster=flags=http://127.0.0.1:1",
        ],
        r#"multiple discovery or bootstrap flags are set. Choose one of "initial-cluster", "discovery-endpoints" or "discovery-srv""#,
    );
}

// ---- DNS SRV ----

/// Set in the copy of this test binary that runs inside the private namespaces.
const IN_NAMESPACE: &str = "CAIRN_DISCOVERY_TEST_IN_NAMESPACE";

/// Runs `test` again in a copy of this binary inside network and mount namespaces of its own
/// (`unshare`, as root): there port 53 of 127.0.0.1 is free for the test's DNS server and
/// `/etc/resolv.conf` can name it, without touching the machine's. Returns whether it did so
/// (the caller is then done); false in the copy, which runs the test itself.
fn rerun_in_private_namespaces(test: &str) -> bool {
    if std::env::var_os(IN_NAMESPACE).is_some() {
        return false;
    }
    let out = Command::new("unshare")
        .args(["--net", "--mount", "--propagation", "private"])
        .arg(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(IN_NAMESPACE, "1")
        .output()
        .expect("unshare (util-linux) gives the test its own network; the test needs root");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test} in its namespaces failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    true
}

/// Inside the namespaces: the loopback up, and `/etc/resolv.conf` naming 127.0.0.1 (a file
/// bind-mounted over it, seen in this mount namespace only).
fn private_network(dir: &std::path::Path) {
    let run = |program: &str, args: &[&str]| {
        let status = Command::new(program).args(args).status().unwrap();
        assert!(status.success(), "{program} {args:?}: {status}");
    };
    run("ip", &["link", "set", "lo", "up"]);
    let conf = dir.join("resolv.conf");
    std::fs::write(&conf, "nameserver 127.0.0.1\noptions timeout:1 attempts:3\n").unwrap();
    run("mount", &["--bind", conf.to_str().unwrap(), "/etc/resolv.conf"]);
}

/// A DNS server for a fixed set of records, answering over UDP on 127.0.0.1:53 until the test
/// process ends: what is asked and exists is answered; a name with no record of the type asked
/// is answered empty, one with no record at all NXDOMAIN.
fn serve_dns(records: Vec<Record>) {
    let socket = UdpSocket::bind("127.0.0.1:53").unwrap();
    std::thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buffer) else {
                return;
            };
            let Ok(query) = Message::from_vec(&buffer[..n]) else {
                continue;
            };
            let mut answer = Message::response(query.metadata.id, query.metadata.op_code);
            answer.metadata.authoritative = true;
            answer.metadata.recursion_desired = query.metadata.recursion_desired;
            answer.metadata.recursion_available = true;
            let mut known = false;
            for q in &query.queries {
                answer.add_query(q.clone());
                let name = q.name().to_ascii().to_lowercase();
                for r in records.iter().filter(|r| r.name.to_ascii().to_lowercase() == name) {
                    known = true;
                    if r.record_type() == q.query_type() || q.query_type() == RecordType::ANY {
                        answer.add_answer(r.clone());
                    }
                }
            }
            if !known {
                answer.metadata.response_code = ResponseCode::NXDomain;
            }
            if let Ok(bytes) = answer.to_vec() {
                let _ = socket.send_to(&bytes, from);
            }
        }
    });
}

fn name(n: &str) -> Name {
    Name::from_ascii(n).unwrap()
}

#[test]
fn three_members_bootstrap_one_cluster_from_dns_srv_records() {
    if rerun_in_private_namespaces("three_members_bootstrap_one_cluster_from_dns_srv_records") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    private_network(dir.path());
    let flags = ["--discovery-srv", "cairn.test", "--discovery-srv-name", "c1"];
    // m1 advertises its peer URL by name, the others by address: either way it is recognised
    // among the records' targets once resolved.
    let mut members = vec![Candidate::new("m1"), Candidate::new("m2"), Candidate::new("m3")];
    let mut records = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let target = format!("m{}.cairn.test.", i + 1);
        records.push(Record::from_rdata(
            name("_etcd-server-c1._tcp.cairn.test."),
            60,
            RData::SRV(SRV::new(0, 10, m.peer_port, name(&target))),
        ));
        records.push(Record::from_rdata(name(&target), 60, RData::A(A::new(127, 0, 0, 1))));
    }
    // A record without the suffix: not looked at.
    records.push(Record::from_rdata(
        name("_etcd-server._tcp.cairn.test."),
        60,
        RData::SRV(SRV::new(0, 10, 1, name("other.cairn.test."))),
    ));
    serve_dns(records);
    for (m, host) in members.iter_mut().zip(["m1.cairn.test", "127.0.0.1", "127.0.0.1"]) {
        m.spawn(host, &flags);
    }
    let urls: Vec<(String, String)> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.name.clone(), format!("http://m{}.cairn.test:{}", i + 1, m.peer_port)))
        .collect();
    one_cluster(&mut members, &urls);
    // A member whose advertised peer URL no record names is not one of them.
    refused(
        Candidate::start("stranger", "127.0.0.1", &flags),
        r#"cannot find local etcd member "stranger" in SRV records"#,
    );
    // A domain with no records at all.
    refused(
        Candidate::start("nowhere", "127.0.0.1", &["--discovery-srv", "nowhere.test"]),
        "error querying DNS SRV records for _etcd-server-ssl lookup _etcd-server-ssl._tcp.nowhere.test: no such host",
    );
}
