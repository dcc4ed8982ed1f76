//! etcd's HTTP/JSON gateway (grpc-gateway, as etcd 3.5 serves it) on the client port: each
//! `POST /v3/...` route is transcoded into the gRPC call it names and sent through the same
//! services gRPC clients reach (with their interceptors, auth and the learner check), and the
//! answer transcoded back:
//!
//! - request bodies are proto3 JSON, either field spelling, unknown fields ignored, 64-bit
//!   integers as numbers or strings, bytes in base64; only the first JSON value counts, and
//!   an empty body is an empty request;
//! - answers use the proto field names, leave out default values, write 64-bit integers as
//!   strings, bytes in base64 and enums by name, and escape `<`, `>` and `&` as Go does;
//! - streams (watch, lease keep-alive, snapshot, observe) answer one `{"result":…}` line
//!   per message; a watch stays open until the client goes, a keep-alive ends after the
//!   requests its body held;
//! - errors are grpc-gateway v1's: `{"error":…,"code":…,"message":…}` with the HTTP status
//!   of the gRPC code, and `{"error":{"grpc_code",…}}` as the last chunk of a stream;
//! - `/v3beta/` is `/v3/`; the token comes in `Authorization`, other metadata in
//!   `Grpc-Metadata-*` headers; CORS headers on every answer, and `OPTIONS` answered empty.

use std::convert::Infallible;
use std::sync::OnceLock;

use crate::transport::listen::Serves;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use bytes::{Buf, BufMut, BytesMut};
use http_body_util::BodyExt as _;
use prost::Message as _;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions};
use tonic::{Code, Status};

/// How a route's call streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One request, one answer.
    Unary,
    /// One request, a stream of answers (Snapshot, Observe).
    ServerStream,
    /// The body's requests, an answer to each, then the end (LeaseKeepAlive).
    Bidi,
    /// The body's requests, and answers until the client goes (Watch).
    BidiOpen,
}

/// Every route etcd 3.5 serves, in its order (the first match wins): path, service, method.
const ROUTES: &[(&str, &str, &str)] = &[
    ("/v3/kv/range", "etcdserverpb.KV", "Range"),
    ("/v3/kv/put", "etcdserverpb.KV", "Put"),
    ("/v3/kv/deleterange", "etcdserverpb.KV", "DeleteRange"),
    ("/v3/kv/txn", "etcdserverpb.KV", "Txn"),
    ("/v3/kv/compaction", "etcdserverpb.KV", "Compact"),
    ("/v3/watch", "etcdserverpb.Watch", "Watch"),
    ("/v3/lease/grant", "etcdserverpb.Lease", "LeaseGrant"),
    ("/v3/lease/revoke", "etcdserverpb.Lease", "LeaseRevoke"),
    ("/v3/kv/lease/revoke", "etcdserverpb.Lease", "LeaseRevoke"),
    ("/v3/lease/keepalive", "etcdserverpb.Lease", "LeaseKeepAlive"),
    ("/v3/lease/timetolive", "etcdserverpb.Lease", "LeaseTimeToLive"),
    ("/v3/kv/lease/timetolive", "etcdserverpb.Lease", "LeaseTimeToLive"),
    ("/v3/lease/leases", "etcdserverpb.Lease", "LeaseLeases"),
    ("/v3/kv/lease/leases", "etcdserverpb.Lease", "LeaseLeases"),
    ("/v3/cluster/member/add", "etcdserverpb.Cluster", "MemberAdd"),
    ("/v3/cluster/member/remove", "etcdserverpb.Cluster", "MemberRemove"),
    ("/v3/cluster/member/update", "etcdserverpb.Cluster", "MemberUpdate"),
    ("/v3/cluster/member/list", "etcdserverpb.Cluster", "MemberList"),
    ("/v3/cluster/member/promote", "etcdserverpb.Cluster", "MemberPromote"),
    ("/v3/maintenance/alarm", "etcdserverpb.Maintenance", "Alarm"),
    ("/v3/maintenance/status", "etcdserverpb.Maintenance", "Status"),
    ("/v3/maintenance/defragment", "etcdserverpb.Maintenance", "Defragment"),
    // HashKV is declared on this path too in etcd, and never reached: the first route wins.
    ("/v3/maintenance/hash", "etcdserverpb.Maintenance", "Hash"),
    ("/v3/maintenance/snapshot", "etcdserverpb.Maintenance", "Snapshot"),
    (
        "/v3/maintenance/transfer-leadership",
        "etcdserverpb.Maintenance",
        "MoveLeader",
    ),
    ("/v3/maintenance/downgrade", "etcdserverpb.Maintenance", "Downgrade"),
    ("/v3/auth/enable", "etcdserverpb.Auth", "AuthEnable"),
    ("/v3/auth/disable", "etcdserverpb.Auth", "AuthDisable"),
    ("/v3/auth/status", "etcdserverpb.Auth", "AuthStatus"),
    ("/v3/auth/authenticate", "etcdserverpb.Auth", "Authenticate"),
    ("/v3/auth/user/add", "etcdserverpb.Auth", "UserAdd"),
    ("/v3/auth/user/get", "etcdserverpb.Auth", "UserGet"),
    ("/v3/auth/user/list", "etcdserverpb.Auth", "UserList"),
    ("/v3/auth/user/delete", "etcdserverpb.Auth", "UserDelete"),
    ("/v3/auth/user/changepw", "etcdserverpb.Auth", "UserChangePassword"),
    ("/v3/auth/user/grant", "etcdserverpb.Auth", "UserGrantRole"),
    ("/v3/auth/user/revoke", "etcdserverpb.Auth", "UserRevokeRole"),
    ("/v3/auth/role/add", "etcdserverpb.Auth", "RoleAdd"),
    ("/v3/auth/role/get", "etcdserverpb.Auth", "RoleGet"),
    ("/v3/auth/role/list", "etcdserverpb.Auth", "RoleList"),
    ("/v3/auth/role/delete", "etcdserverpb.Auth", "RoleDelete"),
    ("/v3/auth/role/grant", "etcdserverpb.Auth", "RoleGrantPermission"),
    ("/v3/auth/role/revoke", "etcdserverpb.Auth", "RoleRevokePermission"),
    ("/v3/lock/lock", "v3lockpb.Lock", "Lock"),
    ("/v3/lock/unlock", "v3lockpb.Lock", "Unlock"),
    ("/v3/election/campaign", "v3electionpb.Election", "Campaign"),
    ("/v3/election/proclaim", "v3electionpb.Election", "Proclaim"),
    ("/v3/election/leader", "v3electionpb.Election", "Leader"),
    ("/v3/election/observe", "v3electionpb.Election", "Observe"),
    ("/v3/election/resign", "v3electionpb.Election", "Resign"),
];

/// A route resolved against the descriptors: the gRPC path it calls, its messages, its kind.
struct Route {
    method: axum::http::Uri,
    request: MessageDescriptor,
    response: MessageDescriptor,
    kind: Kind,
}

/// The message descriptors of cairn's .proto files, read once.
fn pool() -> Option<&'static DescriptorPool> {
    static POOL: OnceLock<Option<DescriptorPool>> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(crate::pb::DESCRIPTORS).ok())
        .as_ref()
}

/// The route at `path` (under `/v3/`), if there is one.
fn route(path: &str) -> Option<Route> {
    let (_, service, name) = ROUTES.iter().find(|(p, _, _)| *p == path)?;
    let method = pool()?
        .get_service_by_name(service)?
        .methods()
        .find(|m| m.name() == *name)?;
    let kind = match (method.is_client_streaming(), method.is_server_streaming()) {
        (true, _) if *name == "Watch" => Kind::BidiOpen,
        (true, _) => Kind::Bidi,
        (false, true) => Kind::ServerStream,
        (false, false) => Kind::Unary,
    };
    Some(Route {
        method: axum::http::Uri::try_from(format!("/{service}/{name}")).ok()?,
        request: method.input(),
        response: method.output(),
        kind,
    })
}

/// The gateway's routes (`/v3/*` and `/v3beta/*`), calling the gRPC services in `grpc`.
pub fn router<S>(grpc: S, max_body: usize) -> axum::Router
where
    S: GrpcService,
{
    let handler = move |request: Request<Body>| {
        let grpc = grpc.clone();
        async move { with_cors(serve(grpc, request, max_body).await) }
    };
    axum::Router::new()
        .route("/v3/{*rest}", axum::routing::any(handler.clone()))
        .route("/v3beta/{*rest}", axum::routing::any(handler))
}

/// etcd's default CORS headers (`--cors=*`), on every answer of the gateway.
fn with_cors(mut response: Response<Body>) -> Response<Body> {
    let headers = response.headers_mut();
    headers.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("accept, content-type, authorization"),
    );
    headers.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
    );
    headers.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    response
}

/// The member's gRPC services, as the gateway calls them.
pub trait GrpcService: Serves<Request<Body>> + Clone + Send + Sync + 'static {}

impl<S: Serves<Request<Body>> + Clone + Send + Sync + 'static> GrpcService for S {}

async fn serve<S: GrpcService>(grpc: S, request: Request<Body>, max_body: usize) -> Response<Body> {
    if request.method() == Method::OPTIONS {
        return plain(StatusCode::OK, "");
    }
    let path = request.uri().path();
    let path = match path.strip_prefix("/v3beta/") {
        Some(rest) => format!("/v3/{rest}"),
        None => path.to_string(),
    };
    let Some(route) = route(&path) else {
        return plain(StatusCode::NOT_FOUND, "Not Found\n");
    };
    if request.method() != Method::POST {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
    }
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, max_body).await {
        Ok(body) => body,
        Err(_) => return unary_error(&Status::invalid_argument("etcdserver: request is too large")),
    };
    let messages = match requests(&route, &body) {
        Ok(messages) => messages,
        // etcd decodes a stream's first request apart from gRPC: its error is a plain one.
        Err(e) if route.kind != Kind::Unary && route.kind != Kind::ServerStream => {
            return unary_error(&Status::unknown(e.message()));
        }
        Err(e) => return unary_error(&e),
    };
    let inner = call(&route, &parts.headers, parts.extensions, messages);
    let answer = match tower_service::Service::call(&mut grpc.clone(), inner).await {
        Ok(answer) => answer,
        Err(never) => match never {},
    };
    if route.kind == Kind::Unary {
        unary(answer, route.response).await
    } else {
        streamed(answer, route.response).await
    }
}

/// A text answer, as Go's `http.Error` writes one.
fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::from(text));
    *response.status_mut() = status;
    if !text.is_empty() {
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    }
    response
}

/// The body's requests, encoded: the first JSON value for a call with one request (none is
/// an empty request), every value for a stream of requests.
fn requests(route: &Route, body: &[u8]) -> Result<Vec<Bytes>, Status> {
    let desc = &route.request;
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<serde_json::Value>();
    let mut encoded = Vec::new();
    let streaming = matches!(route.kind, Kind::Bidi | Kind::BidiOpen);
    loop {
        let value = match values.next() {
            None => break,
            Some(Ok(value)) => value,
            // After the first of a stream's requests, etcd stops reading at a bad one.
            Some(Err(_)) if streaming && !encoded.is_empty() => break,
            Some(Err(e)) => return Err(Status::invalid_argument(e.to_string())),
        };
        let mut value = if value.is_null() { serde_json::json!({}) } else { value };
        // Unknown fields are ignored, as Go's jsonpb ignores them; an unknown enum name is
        // still refused, as there.
        drop_unknown_fields(&mut value, desc);
        let options = DeserializeOptions::new().deny_unknown_fields(true);
        let message = DynamicMessage::deserialize_with_options(desc.clone(), value, &options)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        encoded.push(Bytes::from(message.encode_to_vec()));
        if !streaming {
            break;
        }
    }
    if encoded.is_empty() && !streaming {
        encoded.push(Bytes::new());
    }
    Ok(encoded)
}

/// Removes the fields `desc` does not have (by either spelling), in nested messages too.
fn drop_unknown_fields(value: &mut serde_json::Value, desc: &MessageDescriptor) {
    let serde_json::Value::Object(fields) = value else {
        return;
    };
    fields.retain(|name, field| {
        let Some(known) = desc
            .get_field_by_json_name(name)
            .or_else(|| desc.get_field_by_name(name))
        else {
            return false;
        };
        if let prost_reflect::Kind::Message(nested) = known.kind() {
            match field {
                serde_json::Value::Array(items) if known.is_list() => {
                    items.iter_mut().for_each(|i| drop_unknown_fields(i, &nested));
                }
                other => drop_unknown_fields(other, &nested),
            }
        }
        true
    });
}

/// The gRPC request for `messages`: the caller's token (`Authorization`) and metadata
/// (`Grpc-Metadata-*`) as gRPC metadata, its connection's details (its certificate) as
/// they came. A watch's request stream stays open, as a gRPC client's would.
fn call(route: &Route, headers: &HeaderMap, extensions: axum::http::Extensions, messages: Vec<Bytes>) -> Request<Body> {
    let mut framed = BytesMut::new();
    for message in &messages {
        framed.put_u8(0);
        framed.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
        framed.put_slice(message);
    }
    let framed = framed.freeze();
    let body = if route.kind == Kind::BidiOpen {
        let open =
            tokio_stream::StreamExt::chain(tokio_stream::once(Ok::<_, Infallible>(framed)), tokio_stream::pending());
        Body::from_stream(open)
    } else {
        Body::from(framed)
    };
    let mut request = Request::new(body);
    *request.method_mut() = Method::POST;
    *request.uri_mut() = route.method.clone();
    *request.extensions_mut() = extensions;
    let inner = request.headers_mut();
    inner.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    inner.insert(header::TE, HeaderValue::from_static("trailers"));
    if let Some(token) = headers.get(header::AUTHORIZATION) {
        inner.insert(header::AUTHORIZATION, token.clone());
    }
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix("grpc-metadata-") {
            if let Ok(key) = HeaderName::from_bytes(key.as_bytes()) {
                inner.append(key, value.clone());
            }
        }
    }
    if let Some(timeout) = headers.get("grpc-timeout") {
        inner.insert("grpc-timeout", timeout.clone());
    }
    *request.version_mut() = axum::http::Version::HTTP_2;
    request
}

/// What a gRPC answer's body yields next.
enum Reply {
    Message(Bytes),
    /// The call ended: `None` for OK.
    End(Option<Status>),
}

/// A gRPC answer's body, read a message at a time.
struct Replies {
    body: Body,
    buffered: BytesMut,
}

impl Replies {
    async fn next(&mut self) -> Reply {
        loop {
            let header: Option<[u8; 4]> = self.buffered.get(1..5).and_then(|b| b.try_into().ok());
            if let Some(len) = header.map(u32::from_be_bytes) {
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                if self.buffered.len().saturating_sub(5) >= len {
                    self.buffered.advance(5);
                    return Reply::Message(self.buffered.split_to(len).freeze());
                }
            }
            match self.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.buffered.extend_from_slice(&data),
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            return Reply::End(failure(&trailers));
                        }
                    }
                },
                Some(Err(e)) => return Reply::End(Some(Status::internal(e.to_string()))),
                None => return Reply::End(None),
            }
        }
    }
}

impl Replies {
    /// A gRPC answer's messages, or the error its headers already carry (a call that failed
    /// before answering anything).
    fn of(answer: Response<Body>) -> Result<Replies, Status> {
        let (parts, body) = answer.into_parts();
        match failure(&parts.headers) {
            Some(status) => Err(status),
            None => Ok(Replies {
                body,
                buffered: BytesMut::new(),
            }),
        }
    }
}

/// The status in gRPC headers or trailers, unless it is OK.
fn failure(headers: &HeaderMap) -> Option<Status> {
    Status::from_header_map(headers).filter(|s| s.code() != Code::Ok)
}

/// A unary answer: its message as JSON, or its error.
async fn unary(answer: Response<Body>, response: MessageDescriptor) -> Response<Body> {
    let mut replies = match Replies::of(answer) {
        Ok(replies) => replies,
        Err(status) => return unary_error(&status),
    };
    let message = match replies.next().await {
        Reply::Message(message) => message,
        Reply::End(Some(status)) => return unary_error(&status),
        Reply::End(None) => return unary_error(&Status::internal("no answer")),
    };
    if let Reply::End(Some(status)) = replies.next().await {
        return unary_error(&status);
    }
    match to_json(&response, &message) {
        Ok(json) => json_response(StatusCode::OK, json, true),
        Err(e) => unary_error(&e),
    }
}

/// A streamed answer: a `{"result":…}` line per message, flushed one at a time. An error
/// before the first message is the answer's status; after it, the last chunk.
async fn streamed(answer: Response<Body>, response: MessageDescriptor) -> Response<Body> {
    let mut replies = match Replies::of(answer) {
        Ok(replies) => replies,
        Err(status) => return stream_error(&status),
    };
    let first = match replies.next().await {
        Reply::Message(message) => message,
        Reply::End(Some(status)) => return stream_error(&status),
        Reply::End(None) => return json_response(StatusCode::OK, Vec::new(), false),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(16);
    tokio::spawn(async move {
        let mut next = Reply::Message(first);
        loop {
            let chunk = match next {
                Reply::Message(message) => match to_json(&response, &message) {
                    Ok(json) => result_line(&json),
                    Err(e) => {
                        let _ = tx.send(Ok(Bytes::from(stream_error_body(&e)))).await;
                        return;
                    }
                },
                Reply::End(None) => return,
                Reply::End(Some(status)) => {
                    let _ = tx.send(Ok(Bytes::from(stream_error_body(&status)))).await;
                    return;
                }
            };
            if tx.send(Ok(chunk)).await.is_err() {
                return;
            }
            next = tokio::select! {
                reply = replies.next() => reply,
                // The client went away: the call ends with this task.
                () = tx.closed() => return,
            };
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        "grpc-metadata-content-type",
        HeaderValue::from_static("application/grpc"),
    );
    response
}

fn result_line(json: &[u8]) -> Bytes {
    let mut line = Vec::with_capacity(json.len() + 12);
    line.extend_from_slice(b"{\"result\":");
    line.extend_from_slice(json);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

fn json_response(status: StatusCode, body: Vec<u8>, from_grpc: bool) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if from_grpc {
        headers.insert(
            "grpc-metadata-content-type",
            HeaderValue::from_static("application/grpc"),
        );
    }
    response
}

/// A message as etcd's gateway writes it (jsonpb with `OrigName`).
fn to_json(desc: &MessageDescriptor, message: &[u8]) -> Result<Vec<u8>, Status> {
    let message = DynamicMessage::decode(desc.clone(), message).map_err(|e| Status::internal(e.to_string()))?;
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(true);
    let mut out = serde_json::Serializer::new(Vec::new());
    message
        .serialize_with_options(&mut out, &options)
        .map_err(|e| Status::internal(e.to_string()))?;
    Ok(go_escaped(out.into_inner()))
}

/// JSON as Go's encoder writes it: `<`, `>`, `&`, U+2028 and U+2029 escaped (they can only
/// be inside strings, so this changes no structure).
fn go_escaped(json: Vec<u8>) -> Vec<u8> {
    let text = match String::from_utf8(json) {
        Ok(text) => text,
        Err(e) => return e.into_bytes(),
    };
    if !text.contains(['<', '>', '&', '\u{2028}', '\u{2029}']) {
        return text.into_bytes();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out.into_bytes()
}

fn json_string(text: &str) -> String {
    String::from_utf8(go_escaped(serde_json::Value::from(text).to_string().into_bytes())).unwrap_or_default()
}

/// grpc-gateway v1's HTTP status for a gRPC code.
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// `{"error":…,"code":…,"message":…}` with the code's HTTP status.
fn unary_error(status: &Status) -> Response<Body> {
    let message = json_string(status.message());
    let body = format!(
        "{{\"error\":{message},\"code\":{},\"message\":{message}}}",
        i32::from(status.code())
    );
    json_response(http_status(status.code()), body.into_bytes(), false)
}

/// A stream's error chunk (no newline after it).
fn stream_error_body(status: &Status) -> Vec<u8> {
    let http = http_status(status.code());
    format!(
        "{{\"error\":{{\"grpc_code\":{},\"http_code\":{},\"message\":{},\"http_status\":{}}}}}",
        i32::from(status.code()),
        http.as_u16(),
        json_string(status.message()),
        json_string(http.canonical_reason().unwrap_or_default()),
    )
    .into_bytes()
}

/// A stream that failed before its first message: the error with its HTTP status.
fn stream_error(status: &Status) -> Response<Body> {
    json_response(http_status(status.code()), stream_error_body(status), false)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use super::*;

    fn descriptor(name: &str) -> MessageDescriptor {
        pool().unwrap().get_message_by_name(name).unwrap()
    }

    #[test]
    fn every_routes_messages_are_known() {
        for (path, _, _) in ROUTES {
            assert!(route(path).is_some(), "{path}");
        }
        assert_eq!(route("/v3/watch").unwrap().kind, Kind::BidiOpen);
        assert_eq!(route("/v3/lease/keepalive").unwrap().kind, Kind::Bidi);
        assert_eq!(route("/v3/election/observe").unwrap().kind, Kind::ServerStream);
    }

    #[test]
    fn answers_are_written_as_etcds_gateway_writes_them() {
        use crate::pb::etcdserverpb as pb;
        let answer = pb::RangeResponse {
            header: Some(pb::ResponseHeader {
                cluster_id: 1,
                member_id: u64::MAX,
                revision: 3,
                raft_term: 0,
            }),
            kvs: vec![crate::pb::mvccpb::KeyValue {
                key: "a<b>&c".into(),
                create_revision: 2,
                value: Bytes::new(),
                ..Default::default()
            }],
            more: false,
            count: 1,
        };
        let json = to_json(&descriptor("etcdserverpb.RangeResponse"), &answer.encode_to_vec()).unwrap();
        assert_eq!(
            String::from_utf8(json).unwrap(),
            r#"{"header":{"cluster_id":"1","member_id":"18446744073709551615","revision":"3"},"kvs":[{"key":"YTxiPiZj","create_revision":"2"}],"count":"1"}"#
        );
        let grant = pb::LeaseGrantResponse {
            header: Some(pb::ResponseHeader::default()),
            id: 7,
            ttl: 60,
            error: String::new(),
        };
        let json = to_json(&descriptor("etcdserverpb.LeaseGrantResponse"), &grant.encode_to_vec()).unwrap();
        assert_eq!(String::from_utf8(json).unwrap(), r#"{"header":{},"ID":"7","TTL":"60"}"#);
        assert_eq!(json_string("a<b"), r#""a\u003cb""#);
    }

    #[test]
    fn requests_take_either_spelling_numbers_as_strings_and_enums_by_name() {
        let range = route("/v3/kv/range").unwrap();
        let body = br#"{"key":"Zm9v","countOnly":true,"limit":"2","sort_order":"DESCEND","bogus":1} trailing"#;
        let encoded = requests(&range, body).unwrap();
        let decoded = crate::pb::etcdserverpb::RangeRequest::decode(encoded[0].clone()).unwrap();
        assert_eq!(decoded.key.as_ref(), b"foo");
        assert!(decoded.count_only);
        assert_eq!(decoded.limit, 2);
        assert_eq!(decoded.sort_order, 2);
        let empty = requests(&range, b"").unwrap();
        assert_eq!(empty, vec![Bytes::new()]);
        assert_eq!(requests(&range, b"null").unwrap(), vec![Bytes::new()]);
        let bad = requests(&range, br#"{"key":"Zm9v","#).unwrap_err();
        assert_eq!(bad.code(), Code::InvalidArgument);
        let watch = route("/v3/watch").unwrap();
        let two = requests(&watch, br#"{"create_request":{"key":"YQ=="}}{"progress_request":{}}"#).unwrap();
        assert_eq!(two.len(), 2);
    }
}
