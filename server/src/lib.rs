//! tollgate as a rate-limit service: Envoy's rate-limit protocol (RLS v3
//! over gRPC) and envoyproxy/ratelimit's configuration, decided by
//! tollgate's limiters.
//!
//! [`config`] reads and matches envoyproxy/ratelimit's files, [`limits`]
//! decides a request in memory, [`rls`] answers Envoy's protocol over
//! gRPC, [`http`] serves `/metrics`, a JSON check and a health check, and
//! [`stats`] counts what was decided (notes/15).

#![deny(missing_docs, missing_debug_implementations, unsafe_code)]
#![warn(clippy::pedantic)]
#![allow(clippy::module_name_repetitions)]

pub mod config;
pub mod http;
pub mod limits;
pub mod rls;
pub mod stats;
