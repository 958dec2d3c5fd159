//! tollgate as a rate-limit service: Envoy's rate-limit protocol (RLS v3
//! over gRPC) and envoyproxy/ratelimit's configuration, decided by
//! tollgate's limiters.
//!
//! Work in progress: the configuration ([`config`]) is read and matched;
//! the service that answers on it comes next (notes/15).

#![deny(missing_docs, missing_debug_implementations, unsafe_code)]
#![warn(clippy::pedantic)]
#![allow(clippy::module_name_repetitions)]

pub mod config;
pub mod limits;
pub mod rls;
