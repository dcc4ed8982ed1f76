//! Any HTTP/2 `:authority` is accepted, as Go's server (and so etcd) accepts it
//! (`server/src/transport/http2/authority.rs`), over plaintext, TLS and mutual TLS:
//!
//! - etcd's Go client 3.5.0, which sends `#initially=[<endpoints>]`, 3.5.9, which sends it for
//!   several endpoints, and (over plaintext) 3.6 with grpc-go's `WithAuthority` set to such a
//!   value and to a URL, each running tests/goclients' round. Over TLS grpc-go also checks the
//!   server's certificate against an authority given with `WithAuthority`, so such a client
//!   fails against etcd 3.7.3 as well (its log: "rejected connection ... remote error: tls:
//!   bad certificate"), and is not run;
//! - etcdctl 3.4's per-endpoint commands, which send the endpoint's URL;
//! - raw HTTP/2 requests whose `:authority` is empty, `#initially=[…]` or a URL, sent as an
//!   HPACK literal that the client indexes and then as a reference to that index, so that the
//!   layer's decoder and h2's must stay in step across requests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;
#[path = "common/pki.rs"]
mod pki;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use cairn_server::internals::http2::frame::frame;
use cairn_server::pb::etcdserverpb::{PutRequest, RangeRequest, RangeResponse};
use common::Member;
use pki::{Ca, Pair, Usage};
use prost::Message;

/// How a member serves its clients, and what a client then needs.
#[derive(Clone, Copy, Debug)]
enum Transport {
    Plain,
    Tls,
    MutualTls,
}

const TRANSPORTS: [Transport; 3] = [Transport::Plain, Transport::Tls, Transport::MutualTls];

struct Setup {
    member: Member,
    /// Flags for a client: etcdctl's and the round's take the same names.
    client_flags: Vec<String>,
}

fn start(ca: &Ca, server: &Pair, client: &Pair, transport: Transport) -> Setup {
    let name = format!("authority-{transport:?}").to_lowercase();
    let cacert = format!("--cacert={}", ca.cert());
    match transport {
        Transport::Plain => Setup {
            member: Member::start(&name, &[]),
            client_flags: Vec::new(),
        },
        Transport::Tls => {
            let flags = [
                format!("--cert-file={}", server.cert()),
                format!("--key-file={}", server.key()),
                format!("--peer-cert-file={}", server.cert()),
                format!("--peer-key-file={}", server.key()),
                format!("--peer-trusted-ca-file={}", ca.cert()),
            ];
            Setup {
                member: Member::start_https(&name, &strs(&flags)),
                client_flags: vec![cacert],
            }
        }
        Transport::MutualTls => Setup {
            member: Member::start_https(&name, &strs(&pki::mtls_flags(ca, server))),
            client_flags: vec![
                cacert,
                format!("--cert={}", client.cert()),
                format!("--key={}", client.key()),
            ],
        },
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn certificates(dir: &Path) -> (Ca, Pair, Pair) {
    let ca = Ca::new(dir, "authority");
    let server = ca.issue("server", "cairn", &["127.0.0.1", "localhost"], Usage::Both);
    let client = ca.issue("client", "client", &[], Usage::Client);
    (ca, server, client)
}

#[test]
fn etcd_go_clients_odd_authorities_run_their_round_over_plaintext_tls_and_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, server, client) = certificates(dir.path());
    let rounds = ["v3.5.0", "v3.5.9", "v3.6"].map(|v| (v, common::go_round(v, dir.path())));
    for transport in TRANSPORTS {
        let setup = start(&ca, &server, &client, transport);
        let url = setup.member.client_url();
        // The same member twice, by address and by name (its certificate has both).
        let two = format!("{url},{}", url.replace("127.0.0.1", "localhost"));
        let mut runs = vec![
            // `#initially=[<url>]` of their own accord: 3.5.0 for one endpoint, 3.5.9 for two.
            ("v3.5.0", url.clone(), None),
            ("v3.5.9", two, None),
        ];
        if let Transport::Plain = transport {
            runs.push(("v3.6", url.clone(), Some(format!("#initially=[{url};{url}]"))));
            runs.push(("v3.6", url.clone(), Some(url.clone())));
        }
        for (i, (version, endpoints, authority)) in runs.iter().enumerate() {
            let binary = &rounds.iter().find(|(v, _)| v == version).unwrap().1;
            let mut command = Command::new(binary);
            command.arg(format!("--endpoints={endpoints}"));
            command.arg(format!("--prefix={transport:?}{i}/"));
            command.args(&setup.client_flags);
            if let Some(authority) = authority {
                command.arg(format!("--authority={authority}"));
            }
            let output = command.output().unwrap();
            assert!(
                output.status.success(),
                "{transport:?}, the {version} client with authority {authority:?}: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

#[test]
fn etcdctl_34s_per_endpoint_commands_with_a_url_endpoint_over_plaintext_tls_and_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, server, client) = certificates(dir.path());
    for transport in TRANSPORTS {
        let setup = start(&ca, &server, &client, transport);
        let url = setup.member.client_url();
        let etcdctl = |args: &[&str]| {
            let mut all = strs(&setup.client_flags);
            all.extend_from_slice(args);
            setup.member.etcdctl_at(&url, &all)
        };
        let status = common::json(etcdctl(&["endpoint", "status", "-w", "json"]));
        assert_eq!(status[0]["Endpoint"], url.as_str(), "{transport:?}");
        let hash = common::json(etcdctl(&["endpoint", "hashkv", "-w", "json"]));
        assert_eq!(hash[0]["Endpoint"], url.as_str(), "{transport:?}");
        assert_eq!(
            common::ok(etcdctl(&["defrag"])),
            format!("Finished defragmenting etcd member[{url}]\n"),
            "{transport:?}"
        );
        common::fails(etcdctl(&["move-leader", "1234"]), "etcdserver: bad leader transferee");
    }
}

/// A raw HTTP/2 connection to a member, plain or TLS, with an HPACK encoder that indexes as a
/// client's does and a decoder for the server's answers.
struct Raw {
    io: Box<dyn ReadWrite>,
    encoder: loona_hpack::Encoder<'static>,
    decoder: loona_hpack::Decoder<'static>,
    next_stream: u32,
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

impl Raw {
    fn connect(port: u16, tls: Option<&Ca>) -> Raw {
        let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut io: Box<dyn ReadWrite> = match tls {
            None => Box::new(tcp),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                let pem = std::fs::read(ca.cert()).unwrap();
                for cert in rustls_pemfile_certs(&pem) {
                    roots.add(cert).unwrap();
                }
                let mut config = rustls::ClientConfig::builder()
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                config.alpn_protocols = vec![b"h2".to_vec()];
                let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
                let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
                Box::new(rustls::StreamOwned::new(connection, tcp))
            }
        };
        io.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
        io.write_all(&frame(4, 0, 0, &[])).unwrap();
        Raw {
            io,
            encoder: loona_hpack::Encoder::new(),
            decoder: loona_hpack::Decoder::new(),
            next_stream: 1,
        }
    }

    /// A unary call of `method` with `message`, sent with `authority` as the client's
    /// encoder encodes it (indexed after its first time); its answer's message and
    /// grpc-status.
    fn call(&mut self, method: &str, message: &[u8], authority: &[u8]) -> (Vec<u8>, String) {
        let stream = self.next_stream;
        self.next_stream += 2;
        let path = format!("/etcdserverpb.KV/{method}");
        let headers: [(&[u8], &[u8]); 6] = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.as_bytes()),
            (b":authority", authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ];
        let block = self.encoder.encode(headers);
        const END_HEADERS: u8 = 4;
        const END_STREAM: u8 = 1;
        self.io.write_all(&frame(1, END_HEADERS, stream, &block)).unwrap();
        let mut body = vec![0];
        body.extend_from_slice(&(message.len() as u32).to_be_bytes());
        body.extend_from_slice(message);
        self.io.write_all(&frame(0, END_STREAM, stream, &body)).unwrap();
        let (mut data, mut status) = (Vec::new(), None);
        while status.is_none() {
            let mut head = [0u8; 9];
            self.io.read_exact(&mut head).unwrap();
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let on = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0u8; len];
            self.io.read_exact(&mut payload).unwrap();
            match head[3] {
                // HEADERS (the server sends neither padding nor priority).
                1 => {
                    for (name, value) in self.decoder.decode(&payload).unwrap() {
                        if on == stream && name == b"grpc-status" {
                            status = Some(String::from_utf8(value).unwrap());
                        }
                    }
                }
                0 if on == stream => data.extend_from_slice(&payload),
                // RST_STREAM: h2 refused the request.
                3 if on == stream => panic!("the stream was reset: {payload:?}"),
                7 => panic!("the connection was closed: GOAWAY {payload:?}"),
                _ => {}
            }
        }
        (data.get(5..).unwrap_or_default().to_vec(), status.unwrap())
    }
}

fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .map(|c| c.unwrap())
        .collect()
}

#[test]
fn raw_requests_with_any_authority_indexed_or_not_are_answered_over_plaintext_and_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, server, client) = certificates(dir.path());
    for transport in [Transport::Plain, Transport::Tls] {
        let setup = start(&ca, &server, &client, transport);
        let port = setup.member.client_port;
        let tls = matches!(transport, Transport::Tls).then_some(&ca);
        let mut c = Raw::connect(port, tls);
        let valid = format!("127.0.0.1:{port}");
        let authorities = [
            valid.clone(),
            format!("#initially=[http://127.0.0.1:{port};http://127.0.0.2:{port}]"),
            format!("http://127.0.0.1:{port}"),
            String::new(),
            valid,
        ];
        // Each authority twice: as a literal the encoder indexes, then by that index.
        for (i, authority) in authorities.iter().flat_map(|a| [a, a]).enumerate() {
            let key = format!("raw/{i}");
            let put = PutRequest {
                key: key.clone().into_bytes().into(),
                value: b"v".to_vec().into(),
                ..PutRequest::default()
            };
            let (_, status) = c.call("Put", &put.encode_to_vec(), authority.as_bytes());
            assert_eq!(status, "0", "{transport:?}, a put with authority {authority:?}");
            let range = RangeRequest {
                key: key.into_bytes().into(),
                ..RangeRequest::default()
            };
            let (answer, status) = c.call("Range", &range.encode_to_vec(), authority.as_bytes());
            assert_eq!(status, "0", "{transport:?}, a range with authority {authority:?}");
            let answer = RangeResponse::decode(&answer[..]).unwrap();
            assert_eq!(answer.kvs.len(), 1, "{transport:?}, {authority:?}");
        }
    }
}
