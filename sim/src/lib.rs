//! A deterministic discrete-event simulation of rate limiters on fleets of
//! instances: tollgate's real local half and its script's Rust twin
//! against the published designs of its peers, under one traffic.
//!
//! Seeded, in virtual time, on one thread: a run is a function of its
//! [`Scenario`](scenario::Scenario).

pub mod designs;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod server;
pub mod slab;
pub mod tally;
pub mod world;
