//! Dialing another member (a peer, or the leader a request is forwarded to) over `http://` or
//! `https://`, for tonic's channels.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_util::either::Either;
use tonic::codegen::http::Uri;
use tonic::transport::{Channel, Endpoint};

use super::Tls;

/// How long dialing a member may take, TCP and TLS together.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

type Stream = Either<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;

/// Dials `http://` URLs in plaintext and `https://` URLs with the port's TLS (which a URL of
/// that scheme needs).
#[derive(Clone, Debug, Default)]
pub struct Connector {
    tls: Option<Tls>,
}

impl Connector {
    /// Dials with `tls` for https URLs; with `None`, an https URL fails to connect.
    pub fn new(tls: Option<Tls>) -> Connector {
        Connector { tls }
    }

    /// A channel to `url` that connects when first used, and again after a failure.
    pub fn lazy_channel(&self, url: &str) -> Result<Channel, String> {
        let endpoint = Endpoint::from_shared(url.to_string()).map_err(|e| format!("{url}: {e}"))?;
        Ok(endpoint.connect_with_connector_lazy(self.clone()))
    }

    /// A channel to `url`, connected.
    pub async fn channel(&self, url: &str) -> Result<Channel, String> {
        let endpoint = Endpoint::from_shared(url.to_string()).map_err(|e| format!("{url}: {e}"))?;
        endpoint
            .connect_with_connector(self.clone())
            .await
            .map_err(|e| format!("{url}: {}", chain(&e)))
    }

    async fn dial(self, uri: Uri) -> std::io::Result<TokioIo<Stream>> {
        let host = uri.host().unwrap_or("127.0.0.1").trim_matches(['[', ']']).to_string();
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = TcpStream::connect((host.as_str(), port)).await?;
        tcp.set_nodelay(true)?;
        if !https {
            return Ok(TokioIo::new(Either::Left(tcp)));
        }
        let Some(tls) = &self.tls else {
            return Err(std::io::Error::other(format!(
                "{uri} is an https URL, but this member has no TLS configured for it"
            )));
        };
        let config = tls.client_config().map_err(std::io::Error::other)?;
        let name = rustls::pki_types::ServerName::try_from(host).map_err(std::io::Error::other)?;
        let stream = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
        Ok(TokioIo::new(Either::Right(stream)))
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<TokioIo<Stream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let dial = self.clone().dial(uri);
        Box::pin(async move {
            tokio::time::timeout(DIAL_TIMEOUT, dial)
                .await
                .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "dial timed out")))
        })
    }
}

/// An error with its causes, which tonic's transport error hides behind "transport error".
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
