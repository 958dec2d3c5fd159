//! The designs simulated: tollgate's, and its peers' as published.

pub mod databricks;
pub mod doorman;
pub mod envoy;
pub mod gubernator;
pub mod tollgate;
