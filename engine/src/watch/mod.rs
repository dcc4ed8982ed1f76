//! Watch: streams of the changes to a key or range, from any uncompacted revision.

pub(crate) mod feed;
pub(crate) mod hub;
pub(crate) mod stream;
