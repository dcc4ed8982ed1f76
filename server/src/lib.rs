//! cairn's etcd-compatible server: a thin tonic layer over the embedded engine
//! ([`cairn_engine`]), HTTP health and metrics, and the `cairn` binary's configuration.
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

pub mod api;
pub mod config;
pub mod errors;
pub mod ids;
pub mod job;
pub mod pb;
pub mod run;
pub mod transport;
