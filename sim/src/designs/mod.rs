//! The designs simulated: tollgate's, and its peers' as published.

pub mod envoy;
pub mod tollgate;
