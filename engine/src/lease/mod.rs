//! Leases: the lessor and the requests that change it.

pub(crate) mod lessor;
