//! The jobs floor: what a member runs in the background beside its services. Each job is a
//! task over the member ([`crate::api::node::Node`]) that runs until the member stops.

pub mod compactor;
pub mod corruption;
pub mod promoter;
pub mod versions;
