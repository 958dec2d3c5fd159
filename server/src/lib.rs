//! tollgate as a rate-limit service: Envoy's rate-limit protocol (RLS v3
//! over gRPC) and envoyproxy/ratelimit's configuration, decided by
//! tollgate's limiters.
//!
//! [`config`] reads and matches envoyproxy/ratelimit's files, [`limits`]
//! matches a request's descriptors to the rules' limiters, kept across
//! reloads, on a backend: [`memory`] (this process, the default) or
//! [`remote`] (Redis, shared by every process on it), one of which a
//! [`service`] runs on; [`rls`] answers Envoy's protocol over gRPC,
//! [`http`] serves `/metrics`, a JSON check and a health check, and
//! [`stats`] counts what was decided, and [`load`] is a load generator
//! for any such service (notes/15).

#![deny(missing_docs, missing_debug_implementations, unsafe_code)]
#![warn(clippy::pedantic)]
#![allow(clippy::module_name_repetitions)]

pub mod config;
pub mod http;
pub mod limits;
pub mod load;
pub mod memory;
pub mod remote;
pub mod rls;
pub mod service;
pub mod stats;
