//! Rate limiters whose hot paths are lock-free, whose atomic protocols are
//! model-checked, and whose performance claims are numbers anyone can re-run.
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
//! # Layers
//!
//! * [`clock`]: where time comes from ([`Clock`](clock::Clock), nanoseconds
//!   as `u64`).
//! * [`algorithm`]: five algorithms as pure functions of (state, now, cost).
//! * [`cell`]: one key's state under a discipline: a compare-and-swap word
//!   ([`Atomic`](cell::Atomic)) or a mutex ([`Locked`](cell::Locked)), and
//!   which algorithm gets which.
//! * [`store`]: how keys find their state.
//! * [`RateLimiter`] and [`DirectLimiter`]: the façade, built by [`Builder`].
//!
//! # The contract
//!
//! Every check returns a [`Decision`] or, for a cost no wait could admit, a
//! [`CheckError`]. A denial consumes nothing; `retry_after` is exact and
//! rounded up; `retry_after <= reset_after`; a clock reading older than a
//! key's state never admits more than a newer one. `notes/00-contract.md` in
//! the repository argues each rule.

#![deny(unsafe_op_in_unsafe_fn, missing_docs, missing_debug_implementations)]
// Unsafe code lives in two modules only (the lock-free table and the store
// that reclaims it), each allowing it locally; every block states its safety
// argument. `sync` is the one door for concurrency primitives.
#![deny(unsafe_code)]
#![warn(clippy::pedantic, clippy::undocumented_unsafe_blocks)]
#![allow(clippy::module_name_repetitions)]

pub mod algorithm;
pub mod builder;
pub mod cell;
pub mod clock;
mod decision;
mod error;
mod limiter;
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
    /// A guard of tollgate's epoch collector, held until dropped. Opaque:
    /// it offers no `defer`, so that the collector still runs only the
    /// store's own deferred functions, which set a flag and nothing else.
    #[must_use]
    #[derive(Debug)]
    pub struct Pinned(#[allow(dead_code)] crossbeam_epoch::Guard);

    /// Pins this thread on tollgate's epoch collector, the one the
    /// lock-free store's checks pin (`sync::epoch`, private to the crate so
    /// that no other library's guard stalls it). While the guard lives, a
    /// check's own pin on this thread nests: crossbeam counts the guard,
    /// with no atomic read-modify-write, no unpin store and no collection.
    /// It also keeps every table any store retires from being freed (past
    /// the one a shard's writer otherwise leaves), and a new key's check on
    /// this thread then takes a shard lock while pinned, so that other
    /// writers' grace waits run out their bound: hold it only around checks
    /// of keys already stored, and briefly.
    pub fn pin() -> Pinned {
        Pinned(crate::sync::epoch::pin())
    }

    /// Whether this thread holds a guard of tollgate's collector.
    #[must_use]
    pub fn is_pinned() -> bool {
        crate::sync::epoch::is_pinned()
    }
}

pub use builder::Builder;
pub use decision::Decision;
pub use error::{CheckError, QuotaError};
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
