//! tollgate's contract over Redis: every instance of a service shares one
//! count per key.
//!
//! [`RedisLimiter`] decides each check in one round trip, with one
//! server-side script holding all five of tollgate's algorithms in integer
//! microseconds ([`SCRIPT`]); it returns the same [`Decision`](tollgate::Decision)
//! and the same cost errors as the in-process limiters. The repository's
//! design notes argue the arithmetic, the clock and the key encoding.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, missing_debug_implementations, unsafe_code)]
#![warn(clippy::pedantic)]
#![allow(clippy::module_name_repetitions)]

mod connection;
mod error;
mod failure;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod key;
mod limiter;
mod local;
#[cfg(feature = "metrics")]
mod metrics;
mod script;

pub use connection::{Connection, Options};
pub use error::{ConfigError, Error};
pub use failure::{Enforced, OnFailure, Unavailable};
pub use limiter::{
    Builder, Decisions, RedisLimiter, RedisReceipt, RedisReservation, Request, check_all,
};
pub use local::Mode;
pub use script::{END_OF_TIME_US, MAX_SPAN_US, SCRIPT, Scripted};

// The README's example is a doctest too (compiled, not run: it needs a
// server).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
