//! A unary gRPC call framed by hand: its one request message read from the body, its answer
//! written as one message and the OK trailers, or as a trailers-only error.
//!
//! tonic's server serves a unary call through the machinery of a stream: a decoder with an
//! 8 KiB buffer that the request is copied into, an encoder with another, a boxed future per
//! call and its request converted twice. A put or a range is one small message each way, so
//! cairn frames unary calls itself and keeps tonic for the streams. What a client sees is what
//! tonic gives it: the same headers and trailers, and the same status and message for a
//! compressed, oversized, truncated or undecodable request.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{self, HeaderMap, HeaderValue};
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use prost::Message;
use tonic::metadata::MetadataMap;
use tonic::Status;

/// A gRPC message's prefix: the compressed flag and the payload's length.
const PREFIX: usize = 5;

/// Serves one unary call: reads `request`'s message (refusing one over `limit` bytes), hands
/// it to `handler` and frames its answer.
pub async fn serve<Req, Resp, F, Fut>(request: Request, limit: usize, handler: F) -> Response
where
    Req: Message + Default,
    Resp: Message,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let (parts, body) = request.into_parts();
    if let Err(status) = identity_encoding(&parts.headers) {
        return status.into_http();
    }
    let (message, trailers) = match read(body, limit).await {
        Ok(read) => read,
        Err(status) => return status.into_http(),
    };
    let message = match Req::decode(message) {
        Ok(message) => message,
        Err(error) => return Status::internal(error.to_string()).into_http(),
    };
    let mut headers = parts.headers;
    headers.extend(trailers.unwrap_or_default());
    let request = tonic::Request::from_parts(MetadataMap::from_headers(headers), parts.extensions, message);
    answer(handler(request).await)
}

/// Refuses a request compressed with anything but `identity`: cairn accepts no compression,
/// and says so as tonic does.
fn identity_encoding(headers: &HeaderMap) -> Result<(), Status> {
    match headers.get("grpc-encoding").map(HeaderValue::as_bytes) {
        None | Some(b"identity") => Ok(()),
        Some(other) => {
            let name = String::from_utf8_lossy(other);
            let mut status =
                Status::unimplemented(format!("Content is compressed with `{name}` which isn't supported"));
            status.metadata_mut().insert(
                "grpc-accept-encoding",
                tonic::metadata::MetadataValue::from_static("identity"),
            );
            Err(status)
        }
    }
}

/// The payload of the body's first message, and the request's trailers if it sent any. The
/// body is read to its end; messages after the first are ignored, as grpc-go's server does.
async fn read(mut body: Body, limit: usize) -> Result<(Bytes, Option<HeaderMap>), Status> {
    // Most requests arrive in one DATA frame, taken as it is; a message split over several
    // is gathered in `joined`.
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    let mut length: Option<usize> = None;
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Status::from_error(e.into()))?;
        let chunk = match frame.into_data() {
            Ok(chunk) => chunk,
            Err(frame) => {
                trailers = frame.into_trailers().ok();
                continue;
            }
        };
        let held = joined.as_ref().map_or(first.len(), BytesMut::len);
        if length.is_some_and(|len| held >= PREFIX + len) {
            continue; // a later message
        }
        match (&mut joined, first.is_empty()) {
            (Some(joined), _) => joined.extend_from_slice(&chunk),
            (None, true) => first = chunk,
            (None, false) => {
                let mut both = BytesMut::with_capacity(first.len() + chunk.len());
                both.extend_from_slice(&first);
                both.extend_from_slice(&chunk);
                joined = Some(both);
            }
        }
        if length.is_none() {
            length = prefix(joined.as_deref().unwrap_or(&first), limit)?;
        }
    }
    let mut held = joined.map_or(first, BytesMut::freeze);
    match length {
        Some(len) if held.len() >= PREFIX + len => Ok((held.split_off(PREFIX).split_to(len), trailers)),
        _ if held.is_empty() => Err(Status::internal("Missing request message.")),
        _ => Err(Status::internal("Unexpected EOF decoding stream.")),
    }
}

/// The payload length of the message `held` begins with, once its prefix has arrived; a
/// compressed message or one over `limit` bytes is refused, with tonic's words.
fn prefix(held: &[u8], limit: usize) -> Result<Option<usize>, Status> {
    let Some(&[flag, a, b, c, d]) = held.first_chunk::<PREFIX>() else {
        return Ok(None);
    };
    match flag {
        0 => {}
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ))
        }
        f => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1), while sending request"
            )))
        }
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if len > limit {
        return Err(Status::out_of_range(format!(
            "Error, decoded message length too large: found {len} bytes, the limit is: {limit} bytes"
        )));
    }
    Ok(Some(len))
}

/// A handler's answer as the response: its message and the OK trailers, or its error as a
/// trailers-only response.
pub fn answer<M: Message>(answer: Result<tonic::Response<M>, Status>) -> Response {
    let (metadata, message, extensions) = match answer {
        Ok(response) => response.into_parts(),
        Err(status) => return status.into_http(),
    };
    let len = message.encoded_len();
    let Ok(prefix_len) = u32::try_from(len) else {
        return Status::resource_exhausted(format!("a response of {len} bytes is over gRPC's 4 GiB")).into_http();
    };
    let mut framed = BytesMut::with_capacity(PREFIX + len);
    framed.put_u8(0);
    framed.put_u32(prefix_len);
    message.encode_raw(&mut framed);
    let mut response = Response::new(Body::new(OneMessage {
        message: Some(framed.freeze()),
        ended: false,
    }));
    let mut headers = metadata.into_headers();
    for reserved in ["te", "grpc-message", "grpc-message-type", "grpc-status"] {
        headers.remove(reserved);
    }
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    *response.headers_mut() = headers;
    *response.extensions_mut() = extensions;
    response
}

/// A unary answer's body: its message, then the OK trailers.
struct OneMessage {
    message: Option<Bytes>,
    ended: bool,
}

impl hyper::body::Body for OneMessage {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(message) = self.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        if std::mem::replace(&mut self.ended, true) {
            return Poll::Ready(None);
        }
        let mut trailers = HeaderMap::with_capacity(1);
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    /// Unknown, as tonic's: with an exact size, hyper would add a `content-length`.
    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::etcdserverpb::{RangeRequest, RangeResponse};

    fn framed(flag: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn request(chunks: Vec<Vec<u8>>, headers: &[(&'static str, &'static str)]) -> Request {
        let frames = chunks
            .into_iter()
            .map(|c| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(c))));
        let body = Body::new(http_body_util::StreamBody::new(tokio_stream::iter(
            frames.collect::<Vec<_>>(),
        )));
        let mut request = Request::new(body);
        for (name, value) in headers {
            request.headers_mut().insert(*name, HeaderValue::from_static(value));
        }
        request
    }

    /// Serves `request` with a handler that echoes the range's key and limit.
    async fn echo(request: Request) -> Response {
        serve(request, 64, |r: tonic::Request<RangeRequest>| async move {
            let r = r.into_inner();
            Ok(tonic::Response::new(RangeResponse {
                count: r.limit,
                kvs: vec![crate::pb::mvccpb::KeyValue {
                    key: r.key,
                    ..Default::default()
                }],
                ..Default::default()
            }))
        })
        .await
    }

    /// The code and message of a trailers-only answer.
    fn status(response: &Response) -> (i32, String) {
        let status = Status::from_header_map(response.headers()).expect("a trailers-only answer");
        (status.code() as i32, status.message().to_string())
    }

    #[tokio::test]
    async fn a_message_split_anywhere_is_answered_with_one_message_and_ok_trailers() {
        let payload = RangeRequest {
            key: b"k".to_vec().into(),
            limit: 7,
            ..Default::default()
        }
        .encode_to_vec();
        let whole = framed(0, &payload);
        for split in 0..=whole.len() {
            let (a, b) = whole.split_at(split);
            let response = echo(request(vec![a.to_vec(), b.to_vec()], &[])).await;
            assert_eq!(response.headers()["content-type"], "application/grpc");
            assert!(response.headers().get("content-length").is_none());
            let mut body = response.into_body();
            let data = body.frame().await.unwrap().unwrap().into_data().unwrap();
            let answer = RangeResponse::decode(data.get(PREFIX..).unwrap()).unwrap();
            assert_eq!(
                (answer.count, &answer.kvs[0].key[..]),
                (7, &b"k"[..]),
                "split at {split}"
            );
            assert_eq!(data.get(1..PREFIX).unwrap(), (data.len() as u32 - 5).to_be_bytes());
            let trailers = body.frame().await.unwrap().unwrap().into_trailers().unwrap();
            assert_eq!(trailers["grpc-status"], "0");
            assert!(body.frame().await.is_none());
        }
    }

    #[tokio::test]
    async fn a_later_message_is_ignored() {
        let one = framed(
            0,
            &RangeRequest {
                limit: 1,
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let two = framed(
            0,
            &RangeRequest {
                limit: 2,
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let response = echo(request(vec![[one, two].concat()], &[])).await;
        let data = response
            .into_body()
            .frame()
            .await
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap();
        assert_eq!(RangeResponse::decode(data.get(PREFIX..).unwrap()).unwrap().count, 1);
    }

    #[tokio::test]
    async fn bad_requests_get_tonics_status_and_message() {
        // The request's DATA frames, its headers, and the code and message it is answered.
        type Case = (Vec<Vec<u8>>, &'static [(&'static str, &'static str)], i32, &'static str);
        let cases: Vec<Case> = vec![
            (vec![], &[], 13, "Missing request message."),
            (vec![vec![0, 0, 0]], &[], 13, "Unexpected EOF decoding stream."),
            (
                vec![framed(0, &[1, 2, 3])[..6].to_vec()],
                &[],
                13,
                "Unexpected EOF decoding stream.",
            ),
            (
                vec![framed(1, b"x")],
                &[],
                13,
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ),
            (
                vec![framed(0, &[0; 65])],
                &[],
                11,
                "Error, decoded message length too large: found 65 bytes, the limit is: 64 bytes",
            ),
            (
                vec![framed(0, b"")],
                &[("grpc-encoding", "gzip")],
                12,
                "Content is compressed with `gzip` which isn't supported",
            ),
        ];
        for (chunks, headers, code, message) in cases {
            let response = echo(request(chunks, headers)).await;
            assert_eq!(status(&response), (code, message.to_string()));
        }
        // Bytes that are no RangeRequest: prost's error, as Internal.
        let response = echo(request(vec![framed(0, &[0xff, 0xff])], &[])).await;
        assert_eq!(status(&response).0, 13);
    }

    #[tokio::test]
    async fn an_error_is_answered_trailers_only() {
        let response = serve(
            request(vec![framed(0, b"")], &[]),
            64,
            |_: tonic::Request<RangeRequest>| async {
                Err::<tonic::Response<RangeResponse>, _>(Status::failed_precondition("no"))
            },
        )
        .await;
        assert_eq!(status(&response), (9, "no".to_string()));
        assert!(hyper::body::Body::is_end_stream(&response.into_body()));
    }
}
