//! Why a member could not start, or stopped.

use std::path::PathBuf;

use crate::config::BadFlag;
use crate::transport::tls::TlsError;

/// Why a member could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A flag's value does not make sense, alone or with the others.
    #[error(transparent)]
    Flag(#[from] BadFlag),
    /// The engine could not open (or create) its files in the data directory.
    #[error("cannot open data dir {dir}: {source}")]
    Open {
        /// The data directory (`--data-dir`).
        dir: PathBuf,
        /// Why the engine failed to open.
        source: cairn_engine::Error,
    },
    /// Discovery (DNS SRV or v3) did not give this member its initial cluster.
    #[error(transparent)]
    Discovery(#[from] crate::transport::discovery::DiscoveryError),
    /// A client, peer or metrics URL could not be bound, or its TLS listener set up.
    #[error("cannot listen on {url}: {source}")]
    Listen {
        /// The URL, as the flags give it.
        url: String,
        /// The socket's error.
        source: std::io::Error,
    },
    /// A port's TLS could not be set up: a certificate, key, CA or CRL file, or a TLS flag.
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// Anything else, as its message: a URL that cannot be served, a failed join, a data
    /// directory that cannot be written, an error closing the engine.
    #[error("{0}")]
    Other(String),
}
