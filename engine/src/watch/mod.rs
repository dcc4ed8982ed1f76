//! Watch: streams of the changes to a key or range, from any uncompacted revision.

pub(crate) mod hub;
