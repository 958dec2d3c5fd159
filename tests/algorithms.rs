//! Properties of one algorithm each, not of the contract: the boundary burst,
//! Retry-After rounding, refill under denial, and each algorithm's own
//! arithmetic.

// Ordinary tests use std's primitives; under the model-checking features the
// crate's primitives are loom's or shuttle's, usable only inside a model.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

#[path = "support/scenarios.rs"]
mod scenarios;

use std::time::Duration;

use tollgate::Quota;
use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, SlidingWindowLogState,
    TokenBucket,
};
use tollgate::cell::{CellFor, Preferred};
use tollgate::clock::ManualClock;

use scenarios::{boundary_burst, drain, hammered, limiter, retry_after_at_3_per_second};

/// 100 per minute; one anchor request at t = 0; drain at 59.999 s; drain at
/// 60.000 s. The fixed window admits 199 inside that 1 ms: windows are
/// aligned to the clock's origin, the anchor used one of window 0's 100, the
/// drain at 59.999 s took the other 99, and window 1 opened at 60 s with a
/// fresh 100. Each window kept its promise of 100; the span did not.
#[test]
fn fixed_window_admits_199_across_the_boundary() {
    assert_eq!(boundary_burst::<FixedWindow>(true), 199);
}

/// Without the anchor, window 0's whole 100 lands in the last millisecond:
/// 200, twice the limit, in 1 ms.
#[test]
fn fixed_window_admits_200_across_the_boundary_without_an_anchor() {
    assert_eq!(boundary_burst::<FixedWindow>(false), 200);
}

/// Token bucket and GCRA: the bucket refilled to 100 by 59.999 s (the anchor's
/// token came back long ago); 1 ms refills 1/600 of a token: 100 in the span.
#[test]
fn token_bucket_and_gcra_admit_the_burst_across_the_boundary() {
    assert_eq!(boundary_burst::<TokenBucket>(true), 100);
    assert_eq!(boundary_burst::<Gcra>(true), 100);
}

/// Sliding log: 99 at 59.999 s beside the anchor; at 60.000 s the anchor has
/// left the window (0, 60 s], so exactly one more: 100.
#[test]
fn sliding_log_admits_exactly_the_limit_across_the_boundary() {
    assert_eq!(boundary_burst::<SlidingWindowLog>(true), 100);
}

/// Sliding counter: 99 at 59.999 s; at 60.000 s the previous window's 100
/// weighs 1 × 100, so nothing: 99, under the limit (its estimate errs low).
#[test]
fn sliding_counter_stays_under_the_limit_across_the_boundary() {
    assert_eq!(boundary_burst::<SlidingWindowCounter>(true), 99);
}

/// 3 per second: the wait for one token is 333 333 333.3 ns. Rounded up it
/// is 333 333 334 ns and a retry then succeeds; truncated (333 333 333) the
/// bucket would be 0.000000001 s short and this test fails.
#[test]
fn retry_after_rounds_up_for_token_bucket_and_gcra() {
    for result in [
        retry_after_at_3_per_second::<TokenBucket>(),
        retry_after_at_3_per_second::<Gcra>(),
    ] {
        assert_eq!(result, (Duration::from_nanos(333_333_334), false, true));
    }
}

/// The window algorithms at 3 per second: the fixed window and the log wait
/// for the window to roll; the counter waits into the next window until the
/// drained window's weight, 3 × (1 − e), leaves room for one: e ≥ 1/3,
/// rounded up to 333 333 334 ns. Its wait exceeds one window, as it must.
#[test]
fn retry_after_for_the_window_algorithms() {
    let one_second = Duration::from_secs(1);
    assert_eq!(
        retry_after_at_3_per_second::<FixedWindow>(),
        (one_second, false, true)
    );
    assert_eq!(
        retry_after_at_3_per_second::<SlidingWindowLog>(),
        (one_second, false, true)
    );
    assert_eq!(
        retry_after_at_3_per_second::<SlidingWindowCounter>(),
        (one_second + Duration::from_nanos(333_333_334), false, true)
    );
}

/// Refill is a function of time, not of the decision: hammered at 100× its
/// rate for 60 s, a bucket of 10/s with a burst of 5 admits exactly
/// burst + rate × T = 5 + 10 × 60. A bucket that lost the time between
/// denials would admit far fewer.
#[test]
fn token_bucket_refill_advances_on_denial() {
    assert_eq!(hammered::<TokenBucket>(60), 5 + 10 * 60);
    assert_eq!(hammered::<Gcra>(60), 5 + 10 * 60);
}

/// The window algorithms under the same hammering: burst 5 at 10 per second
/// is 5 per 500 ms window. The checks fall at every millisecond from 0 to
/// 60 000 ms: each of the 120 windows before 60 s admits its first 5 checks,
/// and the check at exactly 60 s opens window 121 and is admitted: 601.
///
/// The sliding counter admits 482: under sustained load its previous window
/// always weighs something before the window's end, so the estimate is never
/// a whole number and at most burst − 1 = 4 fit per window. The first window
/// admits 5, the next 119 admit 4 each, and the check at 60 s is admitted
/// (the previous 4 weigh 4 at e = 0, leaving room for 1): 5 + 476 + 1. It
/// enforces (burst − 1) / window, 8 per second here, under the nominal 10.
#[test]
fn window_algorithms_under_sustained_load() {
    assert_eq!(hammered::<FixedWindow>(60), 5 * 120 + 1);
    assert_eq!(hammered::<SlidingWindowLog>(60), 5 * 120 + 1);
    assert_eq!(hammered::<SlidingWindowCounter>(60), 5 + 119 * 4 + 1);
}

/// The exact effect of a clock reading older than the state (the contract
/// only bounds it). 5 per second; 2 admitted at 20 s; the clock reads 15 s.
/// GCRA stores no "now": at 15 s its TAT (20.4 s) is a debt of 5.4 s, past
/// its 1 s tolerance, so it admits nothing until the clock catches up. The
/// others store when they last saw time and treat the reading as "no time
/// has passed": the 3 left at 20 s.
#[test]
fn a_backwards_reading_is_exactly_this_strict() {
    fn backwards<A: Algorithm>() -> u32
    where
        Preferred: CellFor<A>,
    {
        let clock = ManualClock::new();
        let limiter = limiter::<A>(Quota::per_second(5).unwrap(), &clock);
        clock.set(Duration::from_secs(20));
        assert!(limiter.check_n(&1, 2).unwrap().is_allowed());
        clock.set(Duration::from_secs(15));
        drain(&limiter, 1)
    }
    assert_eq!(backwards::<Gcra>(), 0);
    assert_eq!(backwards::<TokenBucket>(), 3);
    assert_eq!(backwards::<FixedWindow>(), 3);
    assert_eq!(backwards::<SlidingWindowLog>(), 3);
    assert_eq!(backwards::<SlidingWindowCounter>(), 3);
}

/// GCRA and the token bucket are the same arithmetic over different state:
/// identical decisions on an irregular workload.
#[test]
fn gcra_and_token_bucket_decide_identically() {
    let quota = Quota::new(7, Duration::from_secs(3))
        .unwrap()
        .with_burst(4)
        .unwrap();
    let (gcra, bucket) = (Gcra::from_quota(&quota), TokenBucket::from_quota(&quota));
    let (mut gcra_state, mut bucket_state) = (Default::default(), Default::default());
    let mut now_ns = 0_u64;
    for step in 0..10_000_u64 {
        now_ns += step * 7_919 % 600_000_000;
        let cost = 1 + (step % 4) as u32;
        assert_eq!(
            gcra.check(&mut gcra_state, now_ns, cost),
            bucket.check(&mut bucket_state, now_ns, cost),
            "step {step}"
        );
    }
}

/// The log's ring grows on demand and never past the burst: a key that sent
/// little holds little, a key at its limit holds exactly `burst` timestamps.
#[test]
fn sliding_log_memory_is_bounded_by_the_burst() {
    let log = SlidingWindowLog::from_quota(&Quota::per_minute(100).unwrap());
    let mut state = SlidingWindowLogState::default();
    assert_eq!(state.capacity(), 0, "a fresh key allocates nothing");
    assert!(log.check(&mut state, 0, 3).unwrap().is_allowed());
    assert!(state.capacity() >= 3 && state.capacity() < 100);
    for _ in 0..97 {
        assert!(log.check(&mut state, 1, 1).unwrap().is_allowed());
    }
    assert_eq!(state.len(), 100);
    assert_eq!(state.capacity(), 100);
    // A minute later the window has emptied; refilling it reuses the ring.
    for _ in 0..100 {
        assert!(
            log.check(&mut state, 60_000_000_001, 1)
                .unwrap()
                .is_allowed()
        );
    }
    assert_eq!(state.capacity(), 100);
}

/// A denial writes nothing: the state after 100 denials equals the state
/// before, for every algorithm whose state is comparable.
#[test]
fn denials_leave_the_state_untouched() {
    fn denials_write_nothing<A: Algorithm>()
    where
        A::State: Clone + PartialEq,
    {
        let algorithm = A::from_quota(&Quota::per_second(5).unwrap());
        let mut state = A::State::default();
        for _ in 0..5 {
            assert!(algorithm.check(&mut state, 0, 1).unwrap().is_allowed());
        }
        let drained = state.clone();
        for step in 0..100 {
            assert!(
                !algorithm
                    .check(&mut state, step * 1_000, 1)
                    .unwrap()
                    .is_allowed()
            );
        }
        assert_eq!(state, drained);
    }
    denials_write_nothing::<FixedWindow>();
    denials_write_nothing::<TokenBucket>();
    denials_write_nothing::<Gcra>();
    denials_write_nothing::<SlidingWindowLog>();
    denials_write_nothing::<SlidingWindowCounter>();
}
