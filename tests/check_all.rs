//! Several limits on one request, all or nothing (`check_all`): any mix of
//! algorithms, stores and limiters; a request one limit refuses (or that
//! fails, or panics in a limit's user code) is charged by none, exactly;
//! under 64 threads the shared limit admits exactly its burst and the
//! others hold exactly what it admitted.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

#[path = "support/builders.rs"]
mod builders;
#[path = "support/contention.rs"]
mod contention;

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use builders::limiter;
use contention::admitted_under_contention;
use tollgate::algorithm::{FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket};
use tollgate::clock::ManualClock;
use tollgate::store::{GlobalMutex, LockFree, PerKey, Sharded};
use tollgate::{AllError, Builder, Charge, CheckError, Quota, check_all, check_all_slice};

/// Five limits of five algorithms on four stores and one direct limiter:
/// the third (3 an hour) refuses the fourth request, and every other limit
/// then holds exactly the three admitted, its units given back in full.
#[test]
fn a_refused_request_is_charged_by_no_limit_of_any_algorithm() {
    let clock = ManualClock::new();
    let hourly = |n| Quota::per_hour(n).unwrap();
    let gcra = limiter::<Gcra, _>(hourly(10), LockFree::new(2), &clock);
    let bucket = limiter::<TokenBucket, _>(hourly(10), GlobalMutex, &clock);
    let window = limiter::<FixedWindow, _>(hourly(3), Sharded::new(2), &clock);
    let counter = limiter::<SlidingWindowCounter, _>(hourly(10), PerKey::new(), &clock);
    let log = Builder::new(hourly(10))
        .algorithm::<SlidingWindowLog>()
        .clock(clock.clone())
        .build_direct();
    for request in 0..6 {
        let checked = check_all([
            &gcra.on(&1),
            &bucket.on(&1),
            &window.on(&1),
            &counter.on(&1),
            &log.on_budget(),
        ])
        .unwrap();
        assert_eq!(checked.is_allowed(), request < 3, "request {request}");
        if request >= 3 {
            assert_eq!(checked.refused, Some(2));
            assert!(checked.decisions[3].is_none() && checked.decisions[4].is_none());
            assert!(checked.decisions[0].unwrap().is_allowed());
        }
    }
    // 10 − 3 units left on each, so a peek predicts 6 after its check.
    assert_eq!(gcra.peek(&1).unwrap().remaining(), 6);
    assert_eq!(bucket.peek(&1).unwrap().remaining(), 6);
    assert_eq!(counter.peek(&1).unwrap().remaining(), 6);
    assert_eq!(log.peek().unwrap().remaining(), 6);
    assert!(!window.peek(&1).unwrap().is_allowed());
}

/// The same over a slice (`check_all_slice`), as many limits as a request
/// brings: the fourth of six refuses after three admissions, the
/// requests' costs differ, and every other limit holds exactly what the
/// admitted requests cost; the limits after the refusal are not checked.
#[test]
fn a_slice_of_limits_is_all_or_nothing_too() {
    let clock = ManualClock::new();
    let hourly = |n| Quota::per_hour(n).unwrap();
    let window = limiter::<FixedWindow, _>(hourly(6), Sharded::new(2), &clock);
    let gcra = limiter::<Gcra, _>(hourly(100), LockFree::new(2), &clock);
    let keys = [1_u64, 2, 3, 4, 5, 6];
    for request in 0..5 {
        let mut checks: Vec<Box<dyn Charge + '_>> = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            if index == 3 {
                checks.push(Box::new(window.on(key).cost(2)));
            } else {
                checks.push(Box::new(gcra.on(key)));
            }
        }
        let limits: Vec<&dyn Charge> = checks.iter().map(|check| &**check).collect();
        let checked = check_all_slice(&limits).unwrap();
        assert_eq!(checked.is_allowed(), request < 3, "request {request}");
        assert_eq!(checked.decisions.len(), 6);
        if request >= 3 {
            assert_eq!(checked.refused, Some(3));
            assert!(checked.decisions[4..].iter().all(Option::is_none));
        }
    }
    // Three admitted: each GCRA key took 3 of 100, the window 6 of 6.
    for key in [1, 2, 3, 5, 6] {
        assert_eq!(gcra.peek(&key).unwrap().remaining(), 96, "key {key}");
    }
    assert!(!window.peek(&4).unwrap().is_allowed());
}

/// A limit that cannot decide (a cost above its burst) is an error naming
/// it, and the limits before it are given back.
#[test]
fn an_error_gives_back_the_limits_before_it() {
    let clock = ManualClock::new();
    let first = limiter::<FixedWindow, _>(Quota::per_hour(5).unwrap(), LockFree::new(1), &clock);
    let second = limiter::<Gcra, _>(Quota::per_hour(2).unwrap(), LockFree::new(1), &clock);
    let failed = check_all([&first.on(&1).cost(2), &second.on(&1).cost(3)]).unwrap_err();
    assert_eq!(
        failed,
        AllError {
            limit: 1,
            error: CheckError::InsufficientCapacity {
                cost: 3,
                capacity: 2
            },
        }
    );
    assert_eq!(first.peek(&1).unwrap().remaining(), 4);
}

/// A key whose `Hash` panics while `PANIC` is set.
#[derive(Clone, PartialEq, Eq)]
struct Flaky(u64);

static PANIC: AtomicBool = AtomicBool::new(false);

impl Hash for Flaky {
    fn hash<H: Hasher>(&self, state: &mut H) {
        assert!(!PANIC.load(Ordering::Relaxed), "the key's Hash panicked");
        self.0.hash(state);
    }
}

/// A panic in a later limit's user code gives the admissions before it
/// back, then reaches the caller.
#[test]
fn a_panic_in_a_later_limit_gives_back_the_limits_before_it() {
    let clock = ManualClock::new();
    let first =
        limiter::<SlidingWindowLog, _>(Quota::per_hour(5).unwrap(), LockFree::new(1), &clock);
    let flaky = Builder::new(Quota::per_hour(5).unwrap())
        .clock(clock.clone())
        .build::<Flaky>();
    assert!(flaky.check(&Flaky(1)).unwrap().is_allowed());
    PANIC.store(true, Ordering::Relaxed);
    let panicked = std::panic::catch_unwind(|| {
        let _ = check_all([&first.on(&1), &flaky.on(&Flaky(1))]);
    });
    PANIC.store(false, Ordering::Relaxed);
    assert!(panicked.is_err());
    assert_eq!(first.peek(&1).unwrap().remaining(), 4);
    assert_eq!(flaky.peek(&Flaky(1)).unwrap().remaining(), 3);
}

/// 64 threads send requests through a per-user limit (100 an hour, a
/// sliding log) and a shared one (50 an hour, a fixed window), with the
/// clock frozen: exactly 50 are admitted, and the per-user limit holds
/// exactly those 50, every refused request's unit given back.
#[test]
fn under_contention_the_limits_hold_exactly_what_all_admitted() {
    let clock = ManualClock::new();
    let per_user =
        limiter::<SlidingWindowLog, _>(Quota::per_hour(100).unwrap(), LockFree::new(2), &clock);
    let shared = limiter::<FixedWindow, _>(Quota::per_hour(50).unwrap(), LockFree::new(2), &clock);
    let admitted = admitted_under_contention(64, 20, || {
        check_all([&per_user.on(&7), &shared.on(&0)])
            .unwrap()
            .is_allowed()
    });
    assert_eq!(admitted, 50);
    assert_eq!(per_user.peek(&7).unwrap().remaining(), 49);
}

/// The same with GCRA per user: a refund that others followed gives back
/// all but the 1 µs clock margin, so the per-user limit holds the 50
/// admitted and a microsecond per such refund, which the next admission's
/// wait shows to the nanosecond.
#[test]
fn under_contention_gcra_keeps_only_the_clock_margin_of_each_refusal() {
    let clock = ManualClock::new();
    let per_user = limiter::<Gcra, _>(Quota::per_hour(100).unwrap(), LockFree::new(2), &clock);
    let shared = limiter::<FixedWindow, _>(Quota::per_hour(50).unwrap(), LockFree::new(2), &clock);
    let admitted = admitted_under_contention(64, 20, || {
        check_all([&per_user.on(&7), &shared.on(&0)])
            .unwrap()
            .is_allowed()
    });
    assert_eq!(admitted, 50);
    // 36 s intervals: the 50 admitted owe 30 min, and each refused
    // request's refund that another admission followed 1 µs more (the clock
    // is frozen, so no time elapsed): whole microseconds, at most one per
    // refused request. A peek predicts its own admission's debt.
    let peeked = per_user.peek(&7).unwrap();
    let owed = peeked.reset_after() - Duration::from_secs(36);
    let margins = owed.checked_sub(Duration::from_secs(30 * 60)).unwrap();
    assert_eq!(margins.as_nanos() % 1_000, 0, "{margins:?}");
    assert!(
        margins <= Duration::from_micros(64 * 20 - 50),
        "{margins:?}"
    );
    // 30 min of the hour's tolerance are free, less the margins: 50 units
    // without any, 49 with.
    let free = if margins.is_zero() { 50 } else { 49 };
    assert_eq!(peeked.remaining(), free - 1);
}
