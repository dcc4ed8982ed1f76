//! The wire types and gRPC services generated from `server/proto` (etcd's v3 API, and cairn's
//! peer transport).

#![allow(
    missing_docs,
    clippy::all,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing
)]
#![allow(unused_qualifications, rust_2018_idioms, missing_debug_implementations)]

/// etcd's `mvccpb`: KeyValue and Event.
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

/// etcd's `authpb`.
pub mod authpb {
    tonic::include_proto!("authpb");
}

/// etcd's `etcdserverpb`: the v3 API's messages and services.
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// etcd's `v3electionpb`: the Election service.
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}

/// etcd's `v3lockpb`: the Lock service.
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}

/// The Watch service's server with cairn's own codec (see `api/watch/wire.rs`): what the
/// server registers instead of [`etcdserverpb::watch_server`], on the same route.
pub mod watch_wire {
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.Watch.rs"));
}

/// The descriptors of every message above (a `FileDescriptorSet`), for the HTTP/JSON
/// gateway, which transcodes between JSON and these messages by name.
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));

/// cairn's peer transport.
pub mod peer {
    tonic::include_proto!("cairnpeer");
}

/// The etcd API version cairn implements fully (what `Status.version` reports; clients such as
/// kube-apiserver parse it to decide what they may use).
pub const API_VERSION: &str = "3.6.0";
