//! The transports floor: how bytes reach a member and leave it. Listeners and their socket
//! options, TLS, cairn's HTTP/2 layer below h2, the peer transport (Raft messages, snapshots,
//! peer questions), calls a follower sends on to the leader, and finding the initial cluster.
//! Imports only the configuration floor and the ground.

pub mod coalesce;
pub mod discovery;
pub mod forward;
pub mod grpc_body;
pub mod grpc_unary;
pub mod http2;
pub mod http_access;
pub mod listen;
pub mod peer;
pub mod peer_metrics;
pub mod tls;
