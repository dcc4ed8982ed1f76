//! `--grpc-keepalive-min-time`, enforced as grpc-go's server enforces it: a client that pings
//! too often gets a GOAWAY with ENHANCE_YOUR_CALM and `too_many_pings`, and its connection
//! ends; one that keeps to the minimum while it has a stream open is left alone. Spoken in
//! raw HTTP/2 frames, so that every byte the server sends is read as a frame.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use cairn_server::internals::http2::frame::frame;
use common::Member;

const PING: u8 = 6;
const GOAWAY: u8 = 7;
const HEADERS: u8 = 1;

/// A client connection, opened with HTTP/2's preface and an empty SETTINGS.
struct Client(TcpStream);

impl Client {
    fn connect(port: u16) -> Client {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
        s.write_all(&frame(4, 0, 0, &[])).unwrap();
        Client(s)
    }

    /// The server's next frame: its type, flags, stream and payload; `None` at the end of
    /// the connection.
    fn next(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        match self.0.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
            Err(e) => panic!("reading a frame: {e}"),
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        self.0.read_exact(&mut payload).unwrap();
        Some((head[3], head[4], stream, payload))
    }

    /// Reads frames until one of type `kind`.
    fn until(&mut self, kind: u8) -> Option<(u8, u32, Vec<u8>)> {
        while let Some((k, flags, stream, payload)) = self.next() {
            if k == kind {
                return Some((flags, stream, payload));
            }
        }
        None
    }

    fn ping(&mut self, n: u8) {
        self.0.write_all(&frame(PING, 0, 0, &[n; 8])).unwrap();
    }

    /// Opens stream 1 as a Watch call, and leaves it open.
    fn open_watch(&mut self) {
        let mut block = Vec::new();
        for (name, value) in [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/etcdserverpb.Watch/Watch"),
            (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ] {
            // HPACK: a literal without indexing, with a new name, neither Huffman-coded.
            block.push(0);
            block.push(name.len() as u8);
            block.extend_from_slice(name.as_bytes());
            block.push(value.len() as u8);
            block.extend_from_slice(value.as_bytes());
        }
        const END_HEADERS: u8 = 4;
        self.0.write_all(&frame(HEADERS, END_HEADERS, 1, &block)).unwrap();
    }
}

/// Reads the GOAWAY the server sends, checks it is grpc-go's for too many pings, and that
/// the connection then ends.
fn expect_too_many_pings(c: &mut Client, last_stream: u32) {
    let (_, stream, payload) = c.until(GOAWAY).expect("a GOAWAY");
    assert_eq!(stream, 0);
    assert_eq!(&payload[..4], &last_stream.to_be_bytes(), "the last stream processed");
    assert_eq!(&payload[4..8], &11u32.to_be_bytes(), "ENHANCE_YOUR_CALM");
    assert_eq!(&payload[8..], b"too_many_pings");
    while c.next().is_some() {}
}

#[test]
fn a_client_without_a_stream_that_pings_again_and_again_is_sent_away() {
    let m = Member::start("pings-idle", &["--grpc-keepalive-min-time=1ms"]);
    let mut c = Client::connect(m.client_port);
    // Without a stream open, grpc-go allows one ping in two hours, whatever the minimum.
    for n in 0..4 {
        c.ping(n);
    }
    expect_too_many_pings(&mut c, 0);
}

#[test]
fn pings_at_the_minimum_on_a_stream_are_answered_and_quicker_ones_sent_away() {
    let m = Member::start("pings-stream", &["--grpc-keepalive-min-time=200ms"]);
    let mut c = Client::connect(m.client_port);
    c.open_watch();
    // Each ping after the last one's answer and a pause five times the minimum: never a
    // strike, however the server's reads are timed.
    for n in 0..5 {
        c.ping(n);
        let (flags, _, payload) = c.until(PING).expect("the ping's answer");
        assert_eq!((flags, payload), (1, vec![n; 8]), "an ACK of ping {n}");
        std::thread::sleep(Duration::from_secs(1));
    }
    // Four at once: the first is on time, the next three are strikes, and the third strike
    // sends the client away.
    for n in 10..14 {
        c.ping(n);
    }
    expect_too_many_pings(&mut c, 1);
}

#[test]
fn the_peer_port_leaves_pings_alone() {
    let m = Member::start("pings-peer", &[]);
    let mut c = Client::connect(m.peer_port);
    for n in 0..6 {
        c.ping(n);
    }
    // Every ping answered, in order: a GOAWAY would have ended the connection first.
    for n in 0..6 {
        let (flags, _, payload) = c.until(PING).expect("the ping's answer");
        assert_eq!((flags, payload), (1, vec![n; 8]));
    }
}
