//! TLS on the client, peer and metrics ports, set up as etcd's `transport.TLSInfo` sets it up,
//! with rustls.
//!
//! A [`Tls`] is one port's certificate files and rules. Its server and client configurations
//! are built from the files and rebuilt whenever one of them changes on disk: every handshake
//! looks at the files' metadata first, so a rotated certificate, key, CA bundle or CRL is used
//! from the next handshake on (etcd re-reads them on every handshake), at the cost of a few
//! `stat` calls rather than a parse.
//!
//! - [`listener`]: accepting TLS connections, each handshake in a task of its own and bounded in
//!   time, failures logged and never fatal.
//! - [`connect`]: dialing peers and leaders over http or https.
//! - `verify`: etcd's checks beyond the chain: the CRL, allowed CNs and hostnames.
//! - [`self_signed`]: `--auto-tls` and `--peer-auto-tls`.

mod config;
pub mod connect;
pub mod listener;
pub mod self_signed;
mod verify;

pub use crate::config::TlsFiles as Files;
pub use config::{Protocols, Tls, TlsError};
pub use connect::Connector;
pub use listener::TlsListener;
pub use verify::common_name;
