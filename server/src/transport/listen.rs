//! Listening sockets and the HTTP server on them: a socket bound with etcd's socket options,
//! and each accepted connection served by hyper (HTTP/1.1 and HTTP/2, as the client asks)
//! with etcd's gRPC stream and keep-alive settings, until a stop is asked for; the
//! connections open then finish what they serve.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket};

use crate::config::KeepAlive;
use crate::transport::coalesce::Coalesced;
use crate::transport::http2::pings::PingPolicy;
use crate::transport::http2::Watched;

/// Pending connections the kernel queues before `accept` (Go's default on Linux reads
/// somaxconn; this is its usual value).
const BACKLOG: u32 = 4096;

/// How sockets are bound: etcd's `--socket-reuse-port` and `--socket-reuse-address`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketOptions {
    /// SO_REUSEPORT: several processes may bind the same port.
    pub reuse_port: bool,
    /// SO_REUSEADDR: an address in TIME_WAIT may be bound again. Go sets it on every
    /// listener on Unix whatever the flag says, and so does cairn; the flag is kept for
    /// etcd's command lines.
    pub reuse_address: bool,
}

/// A listening socket on `host:port` with `options`.
pub async fn bind(host: &str, port: u16, options: SocketOptions) -> std::io::Result<TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        match bind_addr(addr, options) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{host} has no address"))))
}

fn bind_addr(addr: SocketAddr, options: SocketOptions) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if options.reuse_port {
        socket.set_reuseport(true)?;
    }
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// HTTP/2's settings for every connection: etcd's `--max-concurrent-streams` and
/// `--grpc-keepalive-interval` / `--grpc-keepalive-timeout` / `--grpc-keepalive-min-time`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Http2 {
    /// Streams one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Pings to a quiet client, how long their answer may take, and how often a client may
    /// ping (policed by `http2::Watched`).
    pub keep_alive: KeepAlive,
}

/// The peer listener's settings: no limit on streams, pings not policed.
impl Default for Http2 {
    fn default() -> Self {
        Http2 {
            max_concurrent_streams: u32::MAX,
            keep_alive: KeepAlive {
                interval: Some(Duration::from_secs(7200)),
                timeout: Some(Duration::from_secs(20)),
                min_time: None,
            },
        }
    }
}

/// A listener, and how it names the client of a connection it accepted (its certificate's
/// common name), which handlers read as `ConnectInfo<ClientCert>`.
pub struct Accepting<L: axum::serve::Listener> {
    /// Where the connections come from.
    pub listener: L,
    /// Names a connection's client.
    pub who: fn(&L::Io) -> ClientCert,
}

/// Serves `router` on every connection `accepting` accepts until `stop` resolves, then waits
/// for the connections open to finish.
pub async fn serve<L, S>(
    accepting: Accepting<L>,
    router: S,
    http2: Http2,
    stop: impl Future<Output = ()> + Send,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    S: Routes,
{
    let Accepting { mut listener, who } = accepting;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(http2.max_concurrent_streams)
        .keep_alive_interval(http2.keep_alive.interval);
    if let Some(timeout) = http2.keep_alive.timeout {
        builder.http2().keep_alive_timeout(timeout);
    }
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let client = who(&io);
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            // A connection without a client certificate adds nothing: the extension would be
            // read as no certificate anyway, and each request would pay for inserting it.
            if client.0.is_some() {
                request.extensions_mut().insert(ConnectInfo(client.clone()));
            }
            tower_service::Service::call(&mut router.clone(), request)
        });
        let io = Watched::new(io, http2.keep_alive.min_time.map(PingPolicy::new));
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(Coalesced::new(io)), service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a client connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// What a listener serves: axum's router, or any service like it.
pub trait Routes: Serves<Request> + Clone + Send + Sync + 'static {}

impl<S: Serves<Request> + Clone + Send + Sync + 'static> Routes for S {}

/// A request as hyper hands it over.
type Request = hyper::Request<hyper::body::Incoming>;

/// A service that answers `R` with an HTTP response, never fails, and can be spawned.
pub trait Serves<R>:
    tower_service::Service<R, Response = axum::response::Response, Error = Infallible, Future: Send + 'static>
{
}

impl<R, S> Serves<R> for S where
    S: tower_service::Service<R, Response = axum::response::Response, Error = Infallible, Future: Send + 'static>
{
}

/// The client certificate's common name, if the connection presented a verified one: the
/// listener records it per connection (axum's `ConnectInfo`).
#[derive(Clone, Debug, Default)]
pub struct ClientCert(pub Option<Arc<str>>);

impl ClientCert {
    /// A plaintext connection has no certificate.
    pub fn plain(_: &tokio::net::TcpStream) -> ClientCert {
        ClientCert(None)
    }

    /// The common name of the certificate the client presented, verified in the handshake.
    pub fn of_tls(stream: &tokio_rustls::server::TlsStream<tokio::net::TcpStream>) -> ClientCert {
        let (_, connection) = stream.get_ref();
        let cn = connection
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|cert| crate::transport::tls::common_name(cert));
        ClientCert(cn.map(Arc::from))
    }
}

/// A plaintext listener with Nagle's algorithm off on every connection it accepts: small
/// responses (most gRPC answers) go out at once instead of waiting up to 40 ms for the
/// client's ACK.
#[derive(Debug)]
pub struct Plain(pub TcpListener);

impl axum::serve::Listener for Plain {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((tcp, remote)) => {
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                    }
                    return (tcp, remote);
                }
                Err(e) => {
                    // Out of file descriptors, or a connection reset before accept: pause
                    // rather than spin.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}
