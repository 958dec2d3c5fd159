//! The direct (single-budget) limiter over its preferred cell (atomic for
//! GCRA and the fixed window, locked for the others) and over a locked cell
//! for every algorithm: exact counts under contention, atomic multi-unit
//! checks.

// Ordinary tests use std's primitives; under the model-checking features the
// crate's primitives are loom's or shuttle's, usable only inside a model.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

#[path = "support/contention.rs"]
mod contention;

use std::time::Duration;

use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::cell::{AlwaysLocked, CellFor, Preferred};
use tollgate::clock::ManualClock;
use tollgate::{Builder, DirectLimiter, Quota};

use contention::admitted_under_contention;

fn direct<A: Algorithm, P: CellFor<A>>(
    quota: Quota,
    clock: &ManualClock,
) -> DirectLimiter<A, ManualClock, P> {
    Builder::new(quota)
        .algorithm::<A>()
        .clock(clock.clone())
        .build_direct_with_cells::<P>()
}

/// 64 threads × 20 checks with a frozen clock admit exactly the burst
/// (`assert_eq!`: a lost update admits more, a lost admission fewer).
fn exact_count_under_contention<A: Algorithm, P: CellFor<A>>() {
    let limiter = direct::<A, P>(Quota::per_hour(100).unwrap(), &ManualClock::new());
    let admitted = admitted_under_contention(64, 20, || limiter.check().unwrap().is_allowed());
    assert_eq!(admitted, 100);
}

/// All or nothing, then refilled after `reset_after`.
fn check_n_is_atomic_and_refills<A: Algorithm, P: CellFor<A>>() {
    let clock = ManualClock::new();
    let limiter = direct::<A, P>(Quota::per_second(5).unwrap(), &clock);
    assert!(limiter.check_n(4).unwrap().is_allowed());
    let denied = limiter.check_n(2).unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(denied.remaining(), 1);
    let last = limiter.check().unwrap();
    assert_eq!(last.remaining(), 0);
    clock.advance(last.reset_after());
    assert!(limiter.check_n(5).unwrap().is_allowed());
    assert_eq!(limiter.quota().burst(), 5);
    assert!(!limiter.peek().unwrap().is_allowed());
    clock.advance(Duration::from_secs(3600));
    assert_eq!(limiter.peek().unwrap().remaining(), 4);
}

macro_rules! direct_tests {
    ($($name:ident: $algorithm:ty),* $(,)?) => {
        $(
            mod $name {
                use super::*;

                #[test]
                fn exact_count_under_contention() {
                    super::exact_count_under_contention::<$algorithm, Preferred>();
                }

                #[test]
                fn check_n_is_atomic_and_refills() {
                    super::check_n_is_atomic_and_refills::<$algorithm, Preferred>();
                }

                #[test]
                fn locked_exact_count_under_contention() {
                    super::exact_count_under_contention::<$algorithm, AlwaysLocked>();
                }

                #[test]
                fn locked_check_n_is_atomic_and_refills() {
                    super::check_n_is_atomic_and_refills::<$algorithm, AlwaysLocked>();
                }
            }
        )*
    };
}

direct_tests!(
    fixed_window: FixedWindow,
    token_bucket: TokenBucket,
    sliding_log: SlidingWindowLog,
    sliding_counter: SlidingWindowCounter,
    gcra: Gcra,
);
