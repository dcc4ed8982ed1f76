//! Binding the client, peer and metrics URLs, and serving a router on each, over TLS where
//! the URL is https.

use std::future::Future;

use crate::transport::tls::{Tls, TlsError, TlsListener};

use super::error::ServeError;

/// A listener bound to a URL's address, not yet serving.
pub(super) struct Bound {
    pub(super) url: String,
    pub(super) tcp: tokio::net::TcpListener,
}

pub(super) async fn bind(url: &str, options: crate::transport::listen::SocketOptions) -> Result<Bound, ServeError> {
    let (host, port) = socket_of(url)?;
    let tcp = crate::transport::listen::bind(&host, port, options)
        .await
        .map_err(|source| ServeError::Listen {
            url: url.to_string(),
            source,
        })?;
    Ok(Bound {
        url: url.to_string(),
        tcp,
    })
}

pub(super) async fn bind_all(
    urls: &[String],
    options: crate::transport::listen::SocketOptions,
) -> Result<Vec<Bound>, ServeError> {
    let mut bound = Vec::new();
    for url in urls {
        bound.push(bind(url, options).await?);
    }
    Ok(bound)
}

type Serving = tokio::task::JoinHandle<std::io::Result<()>>;

/// How one of the member's ports serves: its name (for errors), its TLS, and its HTTP/2
/// settings.
pub(super) struct Port<'a> {
    pub(super) name: &'static str,
    pub(super) tls: Option<&'a Tls>,
    pub(super) http2: crate::transport::listen::Http2,
}

/// Serves `router` on a bound listener of `port`, through its TLS if the URL is https, until
/// `stop`.
pub(super) fn serve_on(
    bound: Bound,
    port: &Port<'_>,
    router: impl crate::transport::listen::Routes,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<Serving, ServeError> {
    let (tls, http2, port) = (port.tls, port.http2, port.name);
    use crate::transport::listen::{serve, Accepting, ClientCert, Plain};
    if !bound.url.starts_with("https://") {
        let plain = Accepting {
            listener: Plain(bound.tcp),
            who: ClientCert::plain,
        };
        return Ok(tokio::spawn(serve(plain, router, http2, stop)));
    }
    let tls = tls.ok_or_else(|| {
        TlsError::Config(format!(
            "{} is https, but the {port} port has no certificate",
            bound.url
        ))
    })?;
    let listener = TlsListener::new(bound.tcp, tls.clone(), port).map_err(|source| ServeError::Listen {
        url: bound.url.clone(),
        source,
    })?;
    let tls = Accepting {
        listener,
        who: ClientCert::of_tls,
    };
    Ok(tokio::spawn(serve(tls, router, http2, stop)))
}

/// `host:port` of a URL the flags accepted.
pub(super) fn socket_of(url: &str) -> Result<(String, u16), ServeError> {
    let uri: tonic::codegen::http::Uri = url.parse().map_err(|e| ServeError::Other(format!("{url}: {e}")))?;
    let host = uri.host().unwrap_or("127.0.0.1").trim_matches(['[', ']']).to_string();
    let port = uri
        .port_u16()
        .ok_or_else(|| ServeError::Other(format!("{url} has no port")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(ServeError::Other(format!(
            "{url}: only http:// and https:// URLs are served"
        )));
    }
    Ok((host, port))
}
