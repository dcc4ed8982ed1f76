//! The etcd v3 gRPC services, one module each, over a shared [`crate::node::Node`].

use std::pin::Pin;

use tokio_stream::Stream;
use tonic::Status;

pub mod auth;
pub mod cluster;
pub mod kv;
pub mod lease;
pub mod maintenance;
pub mod watch;

/// A response stream fed by a task: `produce` gets the sending end.
pub fn async_stream<T, F, Fut>(produce: F) -> Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<Result<T, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(produce(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
