//! Scenarios written once: `tests/algorithms.rs` asserts their
//! exact results and the lab (`lab/src/main.rs`) prints them as tables.

use std::time::Duration;

use tollgate::algorithm::Algorithm;
use tollgate::cell::{CellFor, Preferred};
use tollgate::clock::ManualClock;
use tollgate::{Builder, Quota, RateLimiter};

/// A keyed limiter with algorithm `A` on the default store and a manual clock.
pub fn limiter<A: Algorithm>(quota: Quota, clock: &ManualClock) -> RateLimiter<u64, A, ManualClock>
where
    Preferred: CellFor<A>,
{
    Builder::new(quota)
        .algorithm::<A>()
        .clock(clock.clone())
        .build()
}

/// Unit checks on `key` until the first denial; how many were admitted.
pub fn drain<A: Algorithm>(limiter: &RateLimiter<u64, A, ManualClock>, key: u64) -> u32
where
    Preferred: CellFor<A>,
{
    let mut admitted = 0;
    while limiter.check(&key).expect("unit cost").is_allowed() {
        admitted += 1;
    }
    admitted
}

/// The boundary burst: 100 per minute. With `anchor`, one request at t = 0;
/// then at one minute minus 1 ms the key is drained, and 1 ms later drained
/// again. Returns how many were admitted inside that 1 ms span.
pub fn boundary_burst<A: Algorithm>(anchor: bool) -> u32
where
    Preferred: CellFor<A>,
{
    let clock = ManualClock::new();
    let limiter = limiter::<A>(Quota::per_minute(100).expect("valid"), &clock);
    if anchor {
        assert!(limiter.check(&1).expect("unit cost").is_allowed());
    }
    clock.set(Duration::from_secs(60) - Duration::from_millis(1));
    let before_boundary = drain(&limiter, 1);
    clock.advance(Duration::from_millis(1));
    before_boundary + drain(&limiter, 1)
}

/// What a client is told at 3 per second after draining a key at t = 0, and
/// what happens when it obeys: (retry_after, admitted 1 ns early, admitted on
/// time).
pub fn retry_after_at_3_per_second<A: Algorithm>() -> (Duration, bool, bool)
where
    Preferred: CellFor<A>,
{
    let clock = ManualClock::new();
    let limiter = limiter::<A>(Quota::per_second(3).expect("valid"), &clock);
    drain(&limiter, 1);
    let denial = limiter.check(&1).expect("unit cost");
    assert!(!denial.is_allowed());
    let retry_after = denial.retry_after();
    clock.set(retry_after - Duration::from_nanos(1));
    let early = limiter.check(&1).expect("unit cost").is_allowed();
    clock.set(retry_after);
    let on_time = limiter.check(&1).expect("unit cost").is_allowed();
    (retry_after, early, on_time)
}

/// A key of 10 per second with a burst of 5, hammered every millisecond (100×
/// its rate) for `seconds`: how many were admitted.
pub fn hammered<A: Algorithm>(seconds: u64) -> u32
where
    Preferred: CellFor<A>,
{
    let clock = ManualClock::new();
    let limiter = limiter::<A>(
        Quota::per_second(10)
            .expect("valid")
            .with_burst(5)
            .expect("valid"),
        &clock,
    );
    let mut admitted = 0;
    for _ in 0..=seconds * 1_000 {
        admitted += u32::from(limiter.check(&1).expect("unit cost").is_allowed());
        clock.advance(Duration::from_millis(1));
    }
    admitted
}
