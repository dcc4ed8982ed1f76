//! cairn's etcd-compatible server: a thin tonic layer over the embedded engine
//! ([`cairn_engine`]), HTTP health and metrics, and the `cairn` binary's configuration.

#![warn(missing_docs)]

pub mod access;
pub mod api;
pub mod compactor;
pub mod convert;
pub mod corruption;
pub mod discovery;
pub mod disk_check;
pub mod errors;
pub mod flags;
pub mod forward;
pub mod gateway;
pub mod grpc_body;
pub mod http;
pub mod http2;
pub mod http_access;
pub mod ids;
pub mod jwt;
pub mod listen;
pub mod logging;
pub mod metrics;
pub mod node;
pub mod pb;
pub mod peer;
pub mod pprof;
pub mod promoter;
pub mod server;
pub mod snapshot_tool;
pub mod systemd;
pub mod tls;
pub mod tracing_export;
pub mod validate;
pub mod versions;
