//! Keyed stores for tollgate on general-purpose concurrent maps (papaya,
//! `scc::HashIndex`, flurry), written
//! from outside the library against its public [`Store`] trait, to measure
//! the purpose-built lock-free table against them on every axis (issue 13,
//! `notes/04-sync-strategies.md`).
//!
//! Each holds the same [`Cell`](tollgate::cell::Cell)s and applies the same
//! arithmetic as the crate's stores, and runs the same conformance suite
//! (`peers/tests`). Where a map makes one of the crate's promises
//! impossible, the store's documentation says which, and why.
//!
//! ```
//! use tollgate::{Builder, Quota};
//! use tollgate_peers::Papaya;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Builder::new(Quota::per_second(2)?)
//!     .store(Papaya::new())
//!     .build::<u64>();
//! assert!(limiter.check(&7)?.is_allowed());
//! assert!(limiter.check(&7)?.is_allowed());
//! assert!(!limiter.check(&7)?.is_allowed());
//! # Ok(())
//! # }
//! ```
//!
//! [`Store`]: tollgate::store::Store

#![deny(missing_docs, missing_debug_implementations, unsafe_code)]
#![warn(clippy::pedantic)]

mod map_store;
mod maps;

pub use map_store::{ConcurrentMap, FIRST_SWEEP_AT, MapFor, MapStore, OnMap, STRIPES};
pub use maps::{Flurry, FlurryMap, Papaya, PapayaMap, SccIndex, SccIndexMap};
