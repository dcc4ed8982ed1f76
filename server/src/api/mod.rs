//! The services floor: the etcd v3 gRPC services, one module each, over the member they
//! share ([`node::Node`]); who may call them ([`access`]); the HTTP/JSON gateway; health,
//! metrics and profiles over HTTP. Imports the transports and configuration floors and the
//! ground, never the jobs or the binary.

use std::pin::Pin;

use tokio_stream::Stream;
use tonic::Status;

pub mod access;
pub mod auth;
pub mod cluster;
pub mod concurrency;
pub mod convert;
pub mod downgrade;
pub mod gateway;
pub mod http;
pub mod jwt;
pub mod kv;
pub mod lease;
pub mod maintenance;
pub mod metrics;
pub mod node;
pub mod pprof;
pub mod validate;
pub mod watch;

/// A boxed response stream.
pub type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Whether a call asked that a leader be known (`hasleader: true` metadata, which etcd's
/// clients send with `WithRequireLeader`).
pub fn wants_leader(metadata: &tonic::metadata::MetadataMap) -> bool {
    asks_for_leader(metadata.get(HASLEADER).map(|v| v.as_bytes()))
}

/// The metadata key of [`wants_leader`].
pub const HASLEADER: &str = "hasleader";

/// Whether the value of a call's `hasleader` metadata, if any, asks that a leader be known.
pub fn asks_for_leader(value: Option<&[u8]>) -> bool {
    value == Some(b"true")
}

/// `stream`, ended with etcd's "no leader" once the member has had none for
/// [`crate::api::node::NO_LEADER_TIMEOUTS`] election timeouts, if the call asked for a leader (as
/// etcd's stream interceptor ends them): a client watching through a member cut off from the
/// others learns it and goes to another, instead of waiting for events that never come.
pub fn leader_bound<T: Send + 'static>(
    node: &node::Node,
    metadata: &tonic::metadata::MetadataMap,
    stream: ResponseStream<T>,
) -> ResponseStream<T> {
    if !wants_leader(metadata) {
        return stream;
    }
    let mut leaderless = node.leaderless.subscribe();
    let lost = Box::pin(async move {
        if leaderless.changed().await.is_err() {
            // The member is stopping; the stream ends with the server.
            std::future::pending::<()>().await;
        }
    });
    Box::pin(LeaderBound {
        stream,
        lost,
        ended: false,
    })
}

/// See [`leader_bound`].
struct LeaderBound<T> {
    stream: ResponseStream<T>,
    lost: Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    ended: bool,
}

impl<T> Stream for LeaderBound<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Self::Item>> {
        if self.ended {
            return std::task::Poll::Ready(None);
        }
        if self.lost.as_mut().poll(cx).is_ready() {
            self.ended = true;
            return std::task::Poll::Ready(Some(Err(crate::errors::Refusal::NoLeader.into())));
        }
        self.stream.as_mut().poll_next(cx)
    }
}

/// A response stream fed by a task: `produce` gets the sending end.
pub fn async_stream<T, F, Fut>(produce: F) -> ResponseStream<T>
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<Result<T, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(produce(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
