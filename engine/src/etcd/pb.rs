//! The protobuf messages etcd keeps in its bbolt buckets (field numbers as in etcd's
//! `mvccpb`, `leasepb` and `authpb`; the wire format is the same from 3.4 to 3.7).

/// `mvccpb.KeyValue`: a value of the `key` bucket.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub(crate) create_revision: i64,
    #[prost(int64, tag = "3")]
    pub(crate) mod_revision: i64,
    #[prost(int64, tag = "4")]
    pub(crate) version: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub(crate) value: Vec<u8>,
    #[prost(int64, tag = "6")]
    pub(crate) lease: i64,
}

/// `leasepb.Lease`: a value of the `lease` bucket.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Lease {
    #[prost(int64, tag = "1")]
    pub(crate) id: i64,
    #[prost(int64, tag = "2")]
    pub(crate) ttl: i64,
    #[prost(int64, tag = "3")]
    pub(crate) remaining_ttl: i64,
}

/// `authpb.UserAddOptions`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct UserOptions {
    #[prost(bool, tag = "1")]
    pub(crate) no_password: bool,
}

/// `authpb.User`: a value of the `authUsers` bucket.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct User {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) name: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) password: Vec<u8>,
    #[prost(string, repeated, tag = "3")]
    pub(crate) roles: Vec<String>,
    #[prost(message, optional, tag = "4")]
    pub(crate) options: Option<UserOptions>,
}

/// `authpb.Permission`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Permission {
    /// READ 0, WRITE 1, READWRITE 2.
    #[prost(int32, tag = "1")]
    pub(crate) perm_type: i32,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) key: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    pub(crate) range_end: Vec<u8>,
}

/// `authpb.Role`: a value of the `authRoles` bucket.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Role {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) name: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) key_permission: Vec<Permission>,
}
