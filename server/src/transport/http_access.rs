//! Who may call the HTTP endpoints (health, metrics, the JSON gateway; never gRPC), as etcd's
//! access controller decides: on a plaintext port, a request whose Host is not in
//! `--host-whitelist` is refused with 421 (DNS rebinding, CVE-2018-5702); every answer
//! carries CORS headers for an origin `--cors` allows; a preflight `OPTIONS` is answered 200.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::config::HttpAccess;

/// The hostname of a Host header, without its port (IPv6 literals keep their brackets).
fn hostname(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// etcd's explanation for a refused Host.
fn refusal(host: &str) -> String {
    format!(
        "etcd received your request, but the Host header was unrecognized.\n\n\
         To fix this, choose one of the following options:\n\
         - Enable TLS, then any HTTP request will be allowed.\n\
         - Add the hostname you want to use to the whitelist in settings.\n  \
         - e.g. etcd --host-whitelist {host:?}\n\n\
         This requirement has been added to help prevent \"DNS Rebinding\" attacks (CVE-2018-5702).\n"
    )
}

/// Wraps `router` in the access checks; `secure` says the port is TLS (no Host check then).
pub fn layer(router: axum::Router, access: HttpAccess, secure: bool) -> axum::Router {
    let access = Arc::new(access);
    router.layer(axum::middleware::from_fn(move |request: Request, next: Next| {
        let access = access.clone();
        async move { control(&access, secure, request, next).await }
    }))
}

async fn control(access: &HttpAccess, secure: bool, request: Request, next: Next) -> Response {
    if !secure {
        if let Some(hosts) = &access.hosts {
            let host = request
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .or_else(|| request.uri().authority().map(|a| a.as_str()))
                .unwrap_or_default();
            let name = hostname(host);
            if !hosts.iter().any(|h| h == name || h == host) {
                tracing::warn!(host = %name, "rejecting HTTP request to prevent DNS rebinding attacks");
                return (StatusCode::MISDIRECTED_REQUEST, refusal(name)).into_response();
            }
        }
    }
    let origin = match &access.cors {
        None => Some(HeaderValue::from_static("*")),
        Some(allowed) => request
            .headers()
            .get(header::ORIGIN)
            .filter(|o| o.to_str().is_ok_and(|o| allowed.iter().any(|a| a == o)))
            .cloned(),
    };
    let preflight = request.method() == Method::OPTIONS;
    let mut response = match preflight {
        true => StatusCode::OK.into_response(),
        false => next.run(request).await,
    };
    if let Some(origin) = origin {
        let headers = response.headers_mut();
        headers.append(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
        );
        headers.append(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.append(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("accept, content-type, authorization"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_port_is_not_part_of_its_name() {
        assert_eq!(hostname("example.com:2379"), "example.com");
        assert_eq!(hostname("example.com"), "example.com");
        assert_eq!(hostname("[::1]:2379"), "[::1]");
        assert_eq!(hostname("[::1]"), "[::1]");
    }
}
