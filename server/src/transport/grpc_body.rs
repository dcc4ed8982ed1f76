//! A gRPC call's bodies watched as they pass, for what follows calls from outside the
//! services: the gRPC metrics (`metrics::grpc`) and the tracing spans (`tracing_export`).
//!
//! A call ends in one of three ways, and an [`Observer`] of its response hears of it once:
//! with the `grpc-status` of the trailers (or of the headers, for a trailers-only answer,
//! which the caller reads with [`trailers_only_status`] before the body); with an end and no
//! status, which a gRPC client reads as Unknown; or with the body dropped before either,
//! when the client went away, which grpc-go reports as Canceled.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::HeaderMap;
use hyper::body::{Body as HttpBody, Frame, SizeHint};

/// `grpc-status` of a call that ended without one: Unknown.
pub const UNKNOWN: &[u8] = b"2";
/// `grpc-status` of a call whose client went away first: Canceled.
pub const CANCELED: &[u8] = b"1";

/// What a watched body tells as it passes.
pub trait Observer: Send + Unpin + 'static {
    /// A chunk of the body's data.
    fn data(&mut self, _chunk: &[u8]) {}

    /// The call ended with `status`, carried by `headers` (empty for [`UNKNOWN`] and
    /// [`CANCELED`]). Told of a response's body only, and once.
    fn ended(&mut self, _status: &[u8], _headers: &HeaderMap) {}
}

/// The status of a trailers-only answer (an error before any message): the response's
/// `headers` carry it, and its body none.
pub fn trailers_only_status(headers: &HeaderMap) -> Option<&[u8]> {
    headers.get("grpc-status").map(|s| s.as_bytes())
}

/// A body with an [`Observer`].
pub struct Observed<O: Observer> {
    inner: Body,
    observer: O,
    /// Whether this is a response's body, whose end is the call's.
    response: bool,
    /// Invariant: the observer has been told the call ended.
    ended: bool,
}

impl<O: Observer> std::fmt::Debug for Observed<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed")
            .field("response", &self.response)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl<O: Observer> Observed<O> {
    /// A request's body: the observer sees its data.
    pub fn request(inner: Body, observer: O) -> Body {
        Body::new(Observed {
            inner,
            observer,
            response: false,
            ended: false,
        })
    }

    /// A response's body: the observer sees its data and the call's end.
    pub fn response(inner: Body, observer: O) -> Body {
        Body::new(Observed {
            inner,
            observer,
            response: true,
            ended: false,
        })
    }

    fn end(&mut self, status: &[u8], headers: &HeaderMap) {
        if self.response && !self.ended {
            self.ended = true;
            self.observer.ended(status, headers);
        }
    }
}

impl<O: Observer> HttpBody for Observed<O> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.observer.data(data);
                }
                if let Some(trailers) = frame.trailers_ref() {
                    this.end(trailers_only_status(trailers).unwrap_or(UNKNOWN), trailers);
                }
            }
            Poll::Ready(None) => this.end(UNKNOWN, &HeaderMap::new()),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<O: Observer> Drop for Observed<O> {
    fn drop(&mut self) {
        self.end(CANCELED, &HeaderMap::new());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use http_body_util::BodyExt;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<String>>>);

    impl Observer for Log {
        fn data(&mut self, chunk: &[u8]) {
            self.0.lock().unwrap().push(format!("data {}", chunk.len()));
        }
        fn ended(&mut self, status: &[u8], _: &HeaderMap) {
            self.0
                .lock()
                .unwrap()
                .push(format!("ended {}", String::from_utf8_lossy(status)));
        }
    }

    fn with_trailers(status: &'static str) -> Body {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static(status));
        let frames = vec![
            Ok::<_, std::convert::Infallible>(Frame::data(bytes::Bytes::from_static(b"abc"))),
            Ok(Frame::trailers(trailers)),
        ];
        Body::new(http_body_util::StreamBody::new(tokio_stream::iter(frames)))
    }

    #[tokio::test]
    async fn a_response_tells_its_data_and_its_trailers_status_once() {
        let log = Log::default();
        let body = Observed::response(with_trailers("5"), log.clone());
        body.collect().await.unwrap();
        assert_eq!(*log.0.lock().unwrap(), ["data 3", "ended 5"]);
    }

    #[tokio::test]
    async fn a_response_without_a_status_ends_unknown_and_one_dropped_early_canceled() {
        let log = Log::default();
        Observed::response(Body::from("xy"), log.clone())
            .collect()
            .await
            .unwrap();
        assert_eq!(*log.0.lock().unwrap(), ["data 2", "ended 2"]);

        let log = Log::default();
        drop(Observed::response(with_trailers("0"), log.clone()));
        assert_eq!(*log.0.lock().unwrap(), ["ended 1"]);
    }

    #[tokio::test]
    async fn a_requests_end_is_not_the_calls() {
        let log = Log::default();
        Observed::request(with_trailers("0"), log.clone())
            .collect()
            .await
            .unwrap();
        assert_eq!(*log.0.lock().unwrap(), ["data 3"]);
    }
}
