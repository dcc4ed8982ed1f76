//! Accepting TLS connections. Each handshake runs in a task of its own, bounded in time and in
//! number, so a client that stalls or sends garbage holds up nobody else; a failed handshake is
//! logged with the client's address and why, and the connection is closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;

use super::Tls;

/// How long a handshake may take (etcd's bound too).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; connections beyond wait in the kernel's backlog.
const HANDSHAKES: usize = 256;
/// What a plain HTTP/1 request on a TLS port gets back (Go's server sends the same).
const HTTP_ON_TLS: &[u8] = b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// A TLS listener for `axum::serve`: yields connections whose handshake succeeded.
#[derive(Debug)]
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl TlsListener {
    /// Accepts on `tcp`, handshaking with `tls`; `port` names the port in log lines.
    pub fn new(tcp: TcpListener, tls: Tls, port: &'static str) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(HANDSHAKES);
        let accepting = tokio::spawn(accept_loop(tcp, tls, port, tx));
        Ok(TlsListener {
            ready,
            local,
            accepting,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop ended (only when the listener itself is dropped).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

async fn accept_loop(
    tcp: TcpListener,
    tls: Tls,
    port: &'static str,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let permits = Arc::new(Semaphore::new(HANDSHAKES));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (stream, remote) = tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before accept: pause
                    // rather than spin, as hyper's servers do.
                    tracing::warn!(port, error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = ready.closed() => return,
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let (tls, ready) = (tls.clone(), ready.clone());
        tokio::spawn(async move {
            let outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&tls, stream, remote)).await;
            drop(permit);
            match outcome {
                Ok(Ok(connection)) => {
                    let _ = ready.send((connection, remote)).await;
                }
                Ok(Err(reason)) => {
                    tracing::warn!(port, %remote, %reason, "TLS handshake refused; connection closed");
                }
                Err(_) => {
                    tracing::warn!(port, %remote, timeout = ?HANDSHAKE_TIMEOUT, "TLS handshake timed out; connection closed");
                }
            }
        });
    }
}

async fn handshake(tls: &Tls, mut stream: TcpStream, remote: SocketAddr) -> Result<TlsStream<TcpStream>, String> {
    // A TLS connection opens with a handshake record (type 22). Anything else is a plaintext
    // client (or garbage): say so rather than relay rustls's "corrupt message".
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(0) => return Err("the client closed the connection before a handshake".into()),
        Ok(_) if first[0] != 22 => {
            if first[0].is_ascii_uppercase() {
                let _ = stream.write_all(HTTP_ON_TLS).await;
            }
            return Err("not a TLS handshake: a plaintext client on a TLS port?".into());
        }
        Ok(_) => {}
        Err(e) => return Err(e.to_string()),
    }
    let config = tls
        .server_config()
        .map_err(|e| format!("cannot load this port's certificates: {e}"))?;
    let connection = tokio_rustls::TlsAcceptor::from(config)
        .accept(stream)
        .await
        .map_err(|e| e.to_string())?;
    if tls.files().check_client_san {
        check_client_san(&connection, remote).await?;
    }
    Ok(connection)
}

/// etcd's peer check: a client certificate that names addresses or hosts must name the one the
/// connection comes from (a DNS name counts if it resolves to that address).
async fn check_client_san(connection: &TlsStream<TcpStream>, remote: SocketAddr) -> Result<(), String> {
    use x509_parser::extensions::GeneralName;
    let Some(cert) = connection.get_ref().1.peer_certificates().and_then(|c| c.first()) else {
        return Ok(());
    };
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
        return Err("the client certificate does not parse".into());
    };
    let names = match parsed.subject_alternative_name() {
        Ok(Some(san)) => san.value.general_names.clone(),
        _ => return Ok(()),
    };
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    for name in &names {
        match name {
            GeneralName::DNSName(d) => dns.push(d.to_string()),
            GeneralName::IPAddress(bytes) => ips.push(bytes.to_vec()),
            _ => {}
        }
    }
    if dns.is_empty() && ips.is_empty() {
        return Ok(());
    }
    let ip = remote.ip().to_canonical();
    let octets = match ip {
        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
        std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    if ips.contains(&octets) {
        return Ok(());
    }
    for host in &dns {
        if let Ok(addrs) = tokio::net::lookup_host((host.as_str(), 0)).await {
            if addrs.into_iter().any(|a| a.ip().to_canonical() == ip) {
                return Ok(());
            }
        }
    }
    Err(format!(
        "the client certificate's SANs ({dns:?} and {} addresses) do not name {ip}, where it connects from",
        ips.len()
    ))
}
