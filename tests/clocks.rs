//! Clocks: the manual clock's arithmetic, the coarse clock's cache and
//! refresher, and what a lagging clock does to decisions.

// Ordinary tests use std's primitives; under the model-checking features the
// crate's primitives are loom's or shuttle's, usable only inside a model.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

use std::time::{Duration, Instant};

use tollgate::clock::{Clock, CoarseClock, ManualClock, MonotonicClock};
use tollgate::{Builder, Quota};

#[test]
fn manual_clock_moves_only_when_told_and_saturates() {
    let clock = ManualClock::new();
    assert_eq!(clock.now_ns(), 0);
    clock.advance(Duration::from_secs(2));
    clock.advance_ns(5);
    assert_eq!(clock.now_ns(), 2_000_000_005);
    clock.set_ns(u64::MAX - 1);
    clock.advance(Duration::from_secs(1));
    assert_eq!(clock.now_ns(), u64::MAX);
    clock.set(Duration::from_millis(3));
    assert_eq!(clock.now_ns(), 3_000_000);
}

#[test]
fn coarse_clock_reads_its_cache_until_refreshed() {
    let source = ManualClock::new();
    source.set_ns(1_000);
    let clock = CoarseClock::over(source.clone());
    assert_eq!(clock.now_ns(), 1_000);
    source.advance_ns(500);
    assert_eq!(clock.now_ns(), 1_000, "no refresh, no movement");
    assert_eq!(clock.refresh(), 1_500);
    assert_eq!(clock.clone().now_ns(), 1_500, "clones share the cache");
    // The cache never moves backwards, even if its source does.
    source.set_ns(10);
    assert_eq!(clock.refresh(), 1_500);
    assert_eq!(clock.now_ns(), 1_500);
}

#[test]
fn a_lagging_clock_only_makes_decisions_stricter() {
    let source = ManualClock::new();
    let clock = CoarseClock::over(source.clone());
    let limiter = Builder::new(Quota::per_second(1).unwrap())
        .clock(clock.clone())
        .build::<u64>();
    assert!(limiter.check(&1).unwrap().is_allowed());
    // A second passes, but the cache has not seen it: still denied.
    source.advance(Duration::from_secs(1));
    let stale = limiter.check(&1).unwrap();
    assert!(!stale.is_allowed());
    assert_eq!(stale.retry_after(), Duration::from_secs(1));
    clock.refresh();
    assert!(limiter.check(&1).unwrap().is_allowed());
}

#[test]
fn the_refresher_thread_keeps_the_cache_moving_and_stops_when_dropped() {
    let clock = CoarseClock::over(MonotonicClock::new());
    let first = clock.now_ns();
    let refresher = clock.spawn_refresher(Duration::from_millis(1)).unwrap();
    // Wait for behaviour, not for a time: the cache must move within a
    // generous deadline.
    let deadline = Instant::now() + Duration::from_secs(10);
    while clock.now_ns() == first {
        assert!(Instant::now() < deadline, "the refresher never refreshed");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(refresher);
    let stopped = clock.now_ns();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        clock.now_ns(),
        stopped,
        "refreshed after its handle was dropped"
    );
}

#[test]
fn tsc_clock_keeps_order_within_a_microsecond_and_agrees_with_the_os_clock() {
    use tollgate::clock::TscClock;
    let os = MonotonicClock::new();
    let tsc = TscClock::new();
    // The TSC clock's origin is later than the OS clock's by at most this.
    let origin_gap_ns = os.now_ns();
    // A thread moved to another core may read an instant a few ns before
    // its last (cores' counters differ by a few ticks; `TscClock`'s
    // "Order"): never a microsecond.
    let mut last = tsc.now_ns();
    for _ in 0..100_000 {
        let now = tsc.now_ns();
        assert!(now + 1_000 >= last, "stepped back {} ns", last - now);
        last = last.max(now);
    }
    std::thread::sleep(Duration::from_millis(20));
    // A sandwich of OS readings: preemption anywhere cannot break it. The
    // slack is 1 % of the span for calibration error (quanta's is ppm).
    let before_ns = os.now_ns();
    let tsc_ns = tsc.now_ns();
    let after_ns = os.now_ns();
    let slack_ns = after_ns / 100;
    assert!(
        tsc_ns + origin_gap_ns + slack_ns >= before_ns,
        "tsc {tsc_ns} < os {before_ns}"
    );
    assert!(
        tsc_ns <= after_ns + slack_ns,
        "tsc {tsc_ns} > os {after_ns}"
    );
}
