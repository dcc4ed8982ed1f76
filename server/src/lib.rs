//! cairn's etcd-compatible server: a thin tonic layer over the embedded engine
//! ([`cairn_engine`]), HTTP health and metrics, and the `cairn` binary's configuration.
//!
//! An embedder runs a member with [`serve`] and a [`config::Flags`] (what etcd's flags and
//! config file set), and talks to it with the clients in [`pb`]. The rest is the member's
//! own, private; docs/releases.md says what is stable.
//!
//! ```no_run
//! use clap::Parser;
//!
//! # async fn run() -> Result<(), cairn_server::ServeError> {
//! let cli = cairn_server::config::Cli::parse_from(["cairn", "--data-dir", "my.cairn"]);
//! cairn_server::serve(cli.flags).await // until SIGTERM or SIGINT
//! # }
//! ```
//!
//! The crate is built in floors, each importing only its own and the ones below it
//! (`tools/import-graph` checks it; docs/design.md draws them):
//!
//! - the ground: [`pb`] (the wire's messages), [`errors`] (etcd's errors), [`ids`];
//! - [`config`]: the flags, their `ETCD_*` variables and the config file;
//! - [`transport`]: listeners, TLS, the HTTP/2 layer, the peer transport, calls sent on to the
//!   leader, discovery;
//! - [`api`]: the services (the v3 API, the gateway, health and metrics) over the member they
//!   share ([`api::node::Node`]);
//! - [`job`]: what runs in the background (compaction, learner promotion, divergence checks,
//!   the cluster version);
//! - [`run`]: assembling and running a member from its flags, and the offline tools; the
//!   `cairn` binary (`main.rs`) sits on top.

#![warn(missing_docs)]

mod api;
pub mod config;
mod errors;
mod ids;
mod job;
pub mod pb;
mod run;
mod transport;

pub use run::run_command_line;
pub use run::server::{serve, ServeError};

/// The server's internals, for its own tests and fuzz targets (the `internals` feature). Not
/// a stable API: they change in any release.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    pub use crate::api::{pprof, validate};
    /// etcd's errors on the wire.
    pub mod errors {
        pub use crate::errors::status;
    }
    pub use crate::run::{disk_check, logging, snapshot_tool, tracing_export};
    pub use crate::transport::{http2, tls};
}
