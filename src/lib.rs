//! Rate limiters that decide exactly, on hot paths without locks, with
//! memory bounded at every instant.
//!
//! Five algorithms sit behind one contract, each one's arithmetic written
//! once as a pure function; every store applies it, and one conformance
//! suite holds them all to the same properties. Limits shared across
//! processes live in the companion crates [`tollgate-redis`] and, in front
//! of a server, [`tollgate-http`].
//!
//! # Quick start
//!
//! ```
//! use tollgate::{Quota, RateLimiter};
//!
//! # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 100 requests per minute per key, bursts of up to 10.
//! let quota = Quota::per_minute(100)?.with_burst(10)?;
//! let limiter: RateLimiter<String> = RateLimiter::keyed(quota);
//!
//! let decision = limiter.check("203.0.113.7")?;
//! if decision.is_allowed() {
//!     // serve; tell the client how many remain
//!     assert_eq!(decision.remaining(), 9);
//! } else {
//!     // reject with `Retry-After: decision.retry_after()`
//! }
//! # Ok(())
//! # }
//! # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
//! ```
//!
//! # Choosing the parts
//!
//! [`RateLimiter::keyed`] and [`DirectLimiter::direct`] give the defaults;
//! a [`Builder`] chooses each part, and its types keep a keyed-only part (a
//! store, a key cap) off a direct limiter at compile time.
//!
//! **Keyed or direct.** A [`RateLimiter<K>`](RateLimiter) keeps one budget
//! per key (a client address, an API key, a user id); a [`DirectLimiter`]
//! keeps one budget for everything (an upstream's rate), in one atomic
//! word.
//!
//! **The algorithm** ([`algorithm`]). The default, [`Gcra`](algorithm::Gcra),
//! is exact, keeps one timestamp a key and denies without writing; choose
//! another for its semantics:
//!
//! | algorithm | state a key | admits in any window of the quota's length |
//! |---|---|---|
//! | [`Gcra`](algorithm::Gcra) (default) | one timestamp | the burst, then one per interval |
//! | [`TokenBucket`](algorithm::TokenBucket) | a deficit and a time | the same, as a bucket that refills |
//! | [`SlidingWindowLog`](algorithm::SlidingWindowLog) | a timestamp an admission | exactly the limit |
//! | [`SlidingWindowCounter`](algorithm::SlidingWindowCounter) | a window and two counts | about the limit: the previous window's count, weighted |
//! | [`FixedWindow`](algorithm::FixedWindow) | a window and a count | up to twice the limit across a boundary |
//!
//! **The store** ([`store`]), keyed limiters only. The default,
//! [`LockFree`](store::LockFree), is a sharded open-addressing table: a
//! check on a known key takes no lock, and memory is reclaimed as the table
//! grows. [`Sharded`](store::Sharded) and [`GlobalMutex`](store::GlobalMutex)
//! are mutex maps (the baselines the lock-free store is measured against),
//! and [`PerKey`](store::PerKey) keeps each key's state behind its own
//! `Arc`.
//!
//! **The key cap.** Keys are attacker-chosen: [`Builder::max_keys`] bounds
//! how many a store holds, evicting keys whose state decides as a fresh
//! key's would first, and [`WhenFull`](store::WhenFull) says what a new key
//! past the cap gets (an error, or a fresh key's decision, untracked).
//! Idle keys are also evicted as a store grows, and on demand with
//! [`RateLimiter::evict_idle`]; no background thread is needed.
//!
//! ```
//! use std::num::NonZeroUsize;
//! use tollgate::algorithm::SlidingWindowLog;
//! use tollgate::store::{Sharded, WhenFull};
//! use tollgate::{Builder, CheckError, Quota};
//!
//! # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let logins = Builder::new(Quota::per_hour(5)?)
//!     .algorithm::<SlidingWindowLog>() // never 6 in any hour
//!     .store(Sharded::default())
//!     .max_keys(NonZeroUsize::new(100_000).unwrap(), WhenFull::Reject)
//!     .build::<u64>();
//! match logins.check(&42) {
//!     Ok(decision) => assert!(decision.is_allowed()),
//!     Err(CheckError::StoreFull { .. }) => { /* shed the new client */ }
//!     Err(other) => return Err(other.into()),
//! }
//! # Ok(())
//! # }
//! # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
//! ```
//!
//! **The clock** ([`clock`]). [`TscClock`](clock::TscClock) by default: the
//! CPU's time-stamp counter, read in a few nanoseconds, calibrated once a
//! process (0.6 ms in most processes on the notes' VM), and the OS clock
//! where the CPU has no invariant TSC; [`MonotonicClock`](clock::MonotonicClock)
//! is std's `Instant`, a vDSO call; [`CoarseClock`](clock::CoarseClock)
//! reads a cached value a background thread refreshes;
//! [`ManualClock`](clock::ManualClock) moves only when told, for tests:
//!
//! ```
//! use std::time::Duration;
//! use tollgate::clock::ManualClock;
//! use tollgate::{Builder, Quota};
//!
//! # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new();
//! let limiter = Builder::new(Quota::per_second(3)?)
//!     .clock(clock.clone())
//!     .build_direct();
//! for _ in 0..3 {
//!     assert!(limiter.check()?.is_allowed());
//! }
//! let denied = limiter.check()?;
//! // Exact, rounded up to the nanosecond: a retry then succeeds.
//! assert_eq!(denied.retry_after(), Duration::from_nanos(333_333_334));
//! clock.advance(denied.retry_after());
//! assert!(limiter.check()?.is_allowed());
//! # Ok(())
//! # }
//! # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
//! ```
//!
//! # Waiting
//!
//! With the `tokio` feature, `until_ready` waits for a GCRA limiter's next
//! slot instead of denying: waiters are served in arrival order with no
//! polling, and a wait dropped before its slot gives the slot back (see
//! [`wait`]). Without tokio, [`RateLimiter::reserve_n`] reserves a slot and
//! says when it comes.
//!
//! # Several limits on one request
//!
//! [`RateLimiter::check_n_receipt`] admits and returns a receipt, and
//! [`RateLimiter::refund`] gives the units back if nothing was admitted on
//! the key since: check a per-user limit, then a per-route one, and refund
//! the first when the second denies.
//!
//! # Beyond one process, and in front of a server
//!
//! Three instances of a service, each with its own limiter of 100, admit
//! 300. [`tollgate-redis`] shares one count per key through Redis
//! (standalone or Cluster), with the same [`Decision`]: one script holds
//! the five algorithms, and for GCRA an exact deny cache and leases decide
//! most checks locally without ever admitting more than Redis alone would
//! ([`remote`] is their local half). [`tollgate-http`] is a tower layer for
//! axum, hyper and tonic over either: key extraction (peer address,
//! trusted proxies, headers), the IETF `RateLimit` fields, `Retry-After`,
//! problem details and gRPC status.
//!
//! # The contract
//!
//! Every check returns a [`Decision`] or, for a cost no wait could admit, a
//! [`CheckError`]. A denial consumes nothing; `retry_after` is exact and
//! rounded up; `retry_after <= reset_after`; a clock reading older than a
//! key's state never admits more than a newer one. A panic in a key's
//! `Hash`, `Eq`, `Borrow` or `Clone` reaches only the call that ran it:
//! every other key decides exactly as before.
//!
//! # Features
//!
//! All off by default, so that a user who does not ask compiles none of
//! their dependencies:
//!
//! * `tokio`: `until_ready` and `clock::TokioClock`, on tokio's timer;
//! * `metrics`: `Builder::metrics` and `RateLimiter::publish_metrics`,
//!   a limiter's counts for the `metrics` facade (see `tollgate::metrics`);
//! * `loom`, `shuttle`: the model checks' builds (`cargo loom`); a library
//!   built with either works only inside its model checker.
//!
//! [`tollgate-redis`]: https://docs.rs/tollgate-redis
//! [`tollgate-http`]: https://docs.rs/tollgate-http

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(unsafe_op_in_unsafe_fn, missing_docs, missing_debug_implementations)]
// Unsafe code lives in three modules only (the lock-free table, the store
// that reclaims it and its read-copy-update, `sync::rcu`), each allowing it
// locally; every block states its safety
// argument. `sync` is the one door for concurrency primitives.
#![deny(unsafe_code)]
#![warn(clippy::pedantic, clippy::undocumented_unsafe_blocks)]
#![allow(clippy::module_name_repetitions)]

pub mod algorithm;
mod all;
pub mod builder;
pub mod cell;
pub mod clock;
mod decision;
mod error;
mod limiter;
#[cfg(feature = "metrics")]
pub mod metrics;
mod quota;
pub mod remote;
pub mod store;
mod sync;
pub mod wait;

/// Hooks for tollgate's own lab, behind the `lab-hooks` feature: not part
/// of the API, under no semver promise.
#[cfg(all(feature = "lab-hooks", not(feature = "shuttle")))]
#[doc(hidden)]
pub mod lab_hooks {
    /// A read section of the lock-free store's read-copy-update, held until
    /// dropped. Not `Send`.
    #[must_use]
    #[derive(Debug)]
    pub struct Pinned(#[allow(dead_code)] crate::sync::rcu::Guard);

    /// Enters a read section on this thread, of the read-copy-update the
    /// lock-free store's checks enter (`sync::rcu`, private to the crate).
    /// While it is held, a check's own section on this thread nests: a
    /// count in the thread's record, with no store another thread reads and
    /// no fence. It also keeps every table any store retires from being
    /// freed (past the one a shard's writer otherwise leaves), and a new
    /// key's check on this thread then takes a shard lock inside a section,
    /// so that other writers' grace waits run out their bound: hold it only
    /// around checks of keys already stored, and briefly.
    pub fn pin() -> Pinned {
        Pinned(crate::sync::rcu::enter())
    }

    /// Whether this thread is inside a section of tollgate's read-copy-update.
    #[must_use]
    pub fn is_pinned() -> bool {
        crate::sync::rcu::is_inside()
    }

    /// A grace period of tollgate's read-copy-update, begun by
    /// [`grace_period`]: it has elapsed once every section that was inside
    /// when it began has left (`tests/barriers.rs`).
    #[derive(Debug)]
    pub struct GracePeriod(crate::sync::rcu::Snapshot);

    /// Begins a grace period now (as a writer does after unlinking a table:
    /// the heavy barrier, then a snapshot of the sections inside).
    #[must_use]
    pub fn grace_period() -> GracePeriod {
        GracePeriod(crate::sync::rcu::ticket().snapshot())
    }

    impl GracePeriod {
        /// Whether every section inside when it began has left.
        #[must_use]
        pub fn elapsed(&self) -> bool {
            self.0.elapsed()
        }
    }

    /// How many heavy barriers the process has completed (each serves every
    /// replaced table unlinked before it began).
    #[must_use]
    pub fn barriers() -> u64 {
        crate::sync::rcu::barriers_done()
    }

    /// The registry's records: `(allocated, held by a thread)`. Records are
    /// never freed; a thread that exits gives its record back for the next.
    #[must_use]
    pub fn records() -> (usize, usize) {
        crate::sync::rcu::records()
    }
}

pub use all::{
    AllChecked, AllCheckedSlice, AllError, Charge, On, OnBudget, check_all, check_all_slice,
};
pub use builder::Builder;
pub use decision::Decision;
pub use error::{CheckError, LayoutError, QuotaError};
pub use limiter::{DirectLimiter, RateLimiter};
pub use quota::Quota;
/// The canaries' switch (see `model-tests/loom.rs` and
/// `model-tests/shuttle.rs`); loom and shuttle builds only.
#[cfg(any(feature = "loom", feature = "shuttle"))]
#[doc(hidden)]
pub use sync::canary;

// The README's examples are doctests too, except under the model-checking
// features, whose primitives work only inside a model.
#[cfg(all(doctest, not(any(feature = "loom", feature = "shuttle"))))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
