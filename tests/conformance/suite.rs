//! The conformance suite: properties every algorithm on every store must
//! hold. Each function takes a factory `(quota, clock) -> limiter` so that
//! `conformance!` in `tests/conformance/main.rs` can run it over any combination.

/// Calls `$runner!(<its own arguments> <every test of the suite>,)`: the
/// one list of the suite's key-generic tests, so that every runner (the
/// in-process stores here, the Redis backend in `redis/tests`) runs all of
/// them.
macro_rules! with_suite_tests {
    ($runner:ident ! ( $($arguments:tt)* )) => {
        $runner! {
            $($arguments)*
            allows_up_to_burst,
            rejects_past_burst_while_clock_frozen,
            replenishes_fully_after_reset,
            retry_after_is_exact,
            isolates_keys,
            remaining_is_exact,
            retry_after_only_when_denied,
            check_n_is_atomic,
            invalid_cost_is_an_error,
            peek_consumes_nothing,
            exact_count_under_contention,
            exact_multi_unit_count_under_contention,
            burst_differs_from_limit,
            clock_going_backwards,
            survives_the_end_of_time,
            many_keys_each_get_exactly_their_burst,
        }
    };
}
pub(crate) use with_suite_tests;

use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::store::Key;
use tollgate::{CheckError, Decision, Quota};

use crate::contention::admitted_under_contention;

/// The limiter interface the suite drives, over one key type.
pub trait Subject<K>: Sync {
    fn check_n(&self, key: &K, n: u32) -> Result<Decision, CheckError>;
    fn peek(&self, key: &K) -> Result<Decision, CheckError>;
    fn len(&self) -> usize;

    fn check(&self, key: &K) -> Decision {
        self.check_n(key, 1).expect("a unit cost is always valid")
    }
}

impl<K, A, S> Subject<K> for tollgate::RateLimiter<K, A, ManualClock, S>
where
    K: Key + Clone,
    A: tollgate::algorithm::Algorithm,
    S: tollgate::store::StoreKind<K, A>,
{
    fn check_n(&self, key: &K, n: u32) -> Result<Decision, CheckError> {
        tollgate::RateLimiter::check_n(self, key, n)
    }
    fn peek(&self, key: &K) -> Result<Decision, CheckError> {
        tollgate::RateLimiter::peek(self, key)
    }
    fn len(&self) -> usize {
        tollgate::RateLimiter::len(self)
    }
}

fn quota(limit: u32, window: Duration) -> Quota {
    Quota::new(limit, window).expect("valid test quota")
}

/// Admits unit requests until the first denial; returns the count and the
/// denial.
fn drain<K, L: Subject<K>>(limiter: &L, key: &K) -> (u32, Decision) {
    let mut admitted = 0;
    loop {
        let decision = limiter.check(key);
        if !decision.is_allowed() {
            return (admitted, decision);
        }
        admitted += 1;
        // A guard against a limiter that never denies, not a bound on the
        // count: every caller asserts the exact count it expects.
        if admitted > 1_000_000 {
            panic!("drain never ended");
        }
    }
}

/// Unit requests the key would admit right now: a peek's `remaining` counts
/// after the check it predicts.
fn available_now<K, L: Subject<K>>(limiter: &L, key: &K) -> u32 {
    let peeked = limiter.peek(key).expect("a unit peek is always valid");
    peeked.remaining() + u32::from(peeked.is_allowed())
}

/// Asserts the shape every decision has, allowed or denied.
fn assert_well_formed(decision: &Decision) {
    assert!(decision.remaining() <= decision.limit(), "{decision:?}");
    if decision.is_allowed() {
        assert_eq!(decision.retry_after(), Duration::ZERO, "{decision:?}");
    } else {
        assert!(decision.retry_after() > Duration::ZERO, "{decision:?}");
        assert!(
            decision.retry_after() <= decision.reset_after(),
            "{decision:?}"
        );
    }
}

/// A fresh key admits exactly the burst, counting `remaining` down by one.
pub fn allows_up_to_burst<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let limiter = make(quota(5, Duration::from_secs(1)), ManualClock::new());
    for expected_remaining in (0..5).rev() {
        let decision = limiter.check(&1);
        assert!(decision.is_allowed());
        assert_eq!(decision.limit(), 5);
        assert_eq!(decision.remaining(), expected_remaining);
        assert_well_formed(&decision);
    }
    assert!(!limiter.check(&1).is_allowed());
}

/// Past the burst, a frozen clock denies forever with remaining 0, and every
/// denial is the same decision: nothing rises without time passing.
pub fn rejects_past_burst_while_clock_frozen<L: Subject<u64>>(
    make: impl Fn(Quota, ManualClock) -> L,
) {
    let limiter = make(quota(5, Duration::from_secs(1)), ManualClock::new());
    let (admitted, first_denial) = drain(&limiter, &1);
    assert_eq!(admitted, 5);
    assert_eq!(first_denial.remaining(), 0);
    assert_well_formed(&first_denial);
    for _ in 0..1_000 {
        assert_eq!(limiter.check(&1), first_denial);
        assert_eq!(limiter.peek(&1).unwrap(), first_denial);
    }
}

/// Waiting `reset_after` restores the whole burst, and exactly the burst.
pub fn replenishes_fully_after_reset<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let clock = ManualClock::new();
    let limiter = make(quota(4, Duration::from_secs(1)), clock.clone());
    let (admitted, denial) = drain(&limiter, &1);
    assert_eq!(admitted, 4);
    clock.advance(denial.reset_after());
    assert_eq!(available_now(&limiter, &1), 4);
    assert_eq!(drain(&limiter, &1).0, 4);
}

/// `retry_after` is exact: one nanosecond early is denied, on time is
/// admitted. Checked for unit and multi-unit costs, at many points in a
/// key's life, so that each algorithm's wait formula is pinned to the
/// nanosecond (a `Retry-After` one nanosecond short fails here).
pub fn retry_after_is_exact<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let clock = ManualClock::new();
    // 7 per 3 s: an emission interval that does not divide evenly.
    let limiter = make(quota(7, Duration::from_secs(3)), clock.clone());
    let mut checked = 0;
    for round in 0..40_u64 {
        let cost = 1 + (round % 3) as u32;
        // Wander through the key's life: some admissions, odd gaps.
        clock.advance_ns(round * 137_000_001);
        let mut denial = limiter.check_n(&1, cost).unwrap();
        while denial.is_allowed() {
            denial = limiter.check_n(&1, cost).unwrap();
        }
        assert_well_formed(&denial);
        let wait_ns = u64::try_from(denial.retry_after().as_nanos()).unwrap();
        clock.advance_ns(wait_ns - 1);
        let early = limiter.check_n(&1, cost).unwrap();
        assert!(
            !early.is_allowed(),
            "round {round}: admitted 1 ns before retry_after: {denial:?}"
        );
        clock.advance_ns(1);
        let on_time = limiter.check_n(&1, cost).unwrap();
        assert!(
            on_time.is_allowed(),
            "round {round}: denied at retry_after: {denial:?} then {on_time:?}"
        );
        checked += 1;
    }
    assert_eq!(checked, 40);
}

/// Draining one key leaves every other key untouched.
pub fn isolates_keys<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let limiter = make(quota(3, Duration::from_secs(60)), ManualClock::new());
    assert_eq!(drain(&limiter, &1).0, 3);
    assert_eq!(drain(&limiter, &2).0, 3);
    assert!(!limiter.check(&1).is_allowed());
    assert_eq!(available_now(&limiter, &3), 3);
    assert_eq!(limiter.len(), 2);
}

/// String keys, looked up by `&String`: the same isolation.
pub fn isolates_string_keys<L: Subject<String>>(make: impl Fn(Quota, ManualClock) -> L) {
    let limiter = make(quota(2, Duration::from_secs(60)), ManualClock::new());
    let alice = "alice".to_owned();
    let bob = "bob".to_owned();
    assert_eq!(drain(&limiter, &alice).0, 2);
    assert_eq!(drain(&limiter, &bob).0, 2);
    assert_eq!(limiter.len(), 2);
}

/// `remaining` is exactly how many unit requests would be admitted next, at
/// every point in a key's life, and a peek agrees with the check it predicts.
pub fn remaining_is_exact<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let clock = ManualClock::new();
    let limiter = make(quota(9, Duration::from_secs(2)), clock.clone());
    for step in 0..60_u64 {
        clock.advance_ns(step * 41_000_003);
        let predicted = available_now(&limiter, &1);
        let (admitted, denial) = drain(&limiter, &1);
        assert_eq!(admitted, predicted, "step {step}");
        assert_eq!(denial.remaining(), 0);
        // Leave some capacity in use for the next step.
        clock.advance_ns(step * 7_000_001);
        let peeked = limiter.peek(&1).unwrap();
        let checked = limiter.check(&1);
        assert_eq!(peeked.is_allowed(), checked.is_allowed());
        assert_well_formed(&checked);
    }
}

/// Allowed decisions carry no wait; denials carry `0 < retry <= reset`.
pub fn retry_after_only_when_denied<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let clock = ManualClock::new();
    let limiter = make(quota(6, Duration::from_secs(1)), clock.clone());
    let mut denials = 0;
    for step in 0..500_u64 {
        clock.advance_ns(step % 5 * 23_000_000);
        let cost = 1 + (step % 4) as u32;
        let decision = limiter.check_n(&1, cost).unwrap();
        assert_well_formed(&decision);
        denials += u32::from(!decision.is_allowed());
    }
    assert!(denials > 0, "the workload must reach denials to test them");
}

/// `check_n` is all or nothing: a cost that does not fit consumes nothing.
pub fn check_n_is_atomic<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let limiter = make(quota(5, Duration::from_secs(10)), ManualClock::new());
    let first = limiter.check_n(&1, 3).unwrap();
    assert!(first.is_allowed());
    assert_eq!(first.remaining(), 2);
    let too_big = limiter.check_n(&1, 3).unwrap();
    assert!(!too_big.is_allowed());
    assert_eq!(too_big.remaining(), 2);
    assert_eq!(available_now(&limiter, &1), 2);
    let rest = limiter.check_n(&1, 2).unwrap();
    assert!(rest.is_allowed());
    assert_eq!(rest.remaining(), 0);
}

/// A cost of 0, above the burst, or `u32::MAX` is an error, consumes nothing
/// and stores no key.
pub fn invalid_cost_is_an_error<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let limiter = make(quota(5, Duration::from_secs(1)), ManualClock::new());
    assert_eq!(limiter.check_n(&1, 0), Err(CheckError::ZeroCost));
    assert_eq!(
        limiter.check_n(&1, 6),
        Err(CheckError::InsufficientCapacity {
            cost: 6,
            capacity: 5
        })
    );
    assert_eq!(
        limiter.check_n(&1, u32::MAX),
        Err(CheckError::InsufficientCapacity {
            cost: u32::MAX,
            capacity: 5
        })
    );
    assert_eq!(limiter.len(), 0);
    // The same on a key that exists.
    assert!(limiter.check(&1).is_allowed());
    assert_eq!(limiter.check_n(&1, 0), Err(CheckError::ZeroCost));
    assert!(limiter.check_n(&1, u32::MAX).is_err());
    assert_eq!(available_now(&limiter, &1), 4);
}

/// Peeking never consumes and never stores a key.
pub fn peek_consumes_nothing<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let limiter = make(quota(3, Duration::from_secs(1)), ManualClock::new());
    for _ in 0..100 {
        let peeked = limiter.peek(&1).unwrap();
        assert!(peeked.is_allowed());
        assert_eq!(
            peeked.remaining(),
            2,
            "a peek reports the state after the check it predicts"
        );
    }
    assert_eq!(limiter.len(), 0);
    assert_eq!(drain(&limiter, &1).0, 3);
}

/// 64 threads × 20 checks on one key with a frozen clock admit exactly the
/// burst. Exact equality, never `<=`: a lost update (two threads reading the
/// same count and both writing count + 1) makes a limiter admit *more*, a
/// deadlock or a dropped admission makes it admit *fewer*, and an upper bound
/// passes for the second. The clock never moves, so no refill can blur the
/// count: it is determined.
pub fn exact_count_under_contention<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let limiter = make(quota(100, Duration::from_secs(3600)), ManualClock::new());
    let admitted = admitted_under_contention(64, 20, || limiter.check(&7).is_allowed());
    assert_eq!(admitted, 100);
    assert_eq!(available_now(&limiter, &7), 0);
    assert_eq!(limiter.len(), 1);
}

/// The same with multi-unit costs: 3 units a request against 100 admits
/// exactly 33 requests (99 units); the last unit never fits a cost of 3.
pub fn exact_multi_unit_count_under_contention<L: Subject<u64>>(
    make: impl Fn(Quota, ManualClock) -> L,
) {
    let limiter = make(quota(100, Duration::from_secs(3600)), ManualClock::new());
    let admitted =
        admitted_under_contention(16, 10, || limiter.check_n(&7, 3).unwrap().is_allowed());
    assert_eq!(admitted, 33);
    assert_eq!(available_now(&limiter, &7), 1);
}

/// Burst is a separate dial from the limit, both below and above it.
pub fn burst_differs_from_limit<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let small = make(
        Quota::per_second(10).unwrap().with_burst(3).unwrap(),
        ManualClock::new(),
    );
    let (admitted, denial) = drain(&small, &1);
    assert_eq!(admitted, 3);
    assert_eq!(denial.limit(), 3);

    let large = make(
        Quota::per_second(10).unwrap().with_burst(25).unwrap(),
        ManualClock::new(),
    );
    let (admitted, denial) = drain(&large, &1);
    assert_eq!(admitted, 25);
    assert_eq!(denial.limit(), 25);
}

/// A clock reading older than the state: no underflow, no refill, no
/// corruption. Drained, it still denies; once the clock returns, the key
/// decides exactly as it did before the clock went back.
pub fn clock_going_backwards<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let clock = ManualClock::new();
    let limiter = make(quota(5, Duration::from_secs(1)), clock.clone());
    clock.set(Duration::from_secs(10));
    let (admitted, denial_at_10s) = drain(&limiter, &1);
    assert_eq!(admitted, 5);
    for back_to in [
        Duration::from_secs(9),
        Duration::from_millis(1),
        Duration::ZERO,
    ] {
        clock.set(back_to);
        let decision = limiter.check(&1);
        assert!(
            !decision.is_allowed(),
            "a backwards reading refilled the key"
        );
        assert_eq!(decision.remaining(), 0);
        assert_well_formed(&decision);
    }
    clock.set(Duration::from_secs(10));
    assert_eq!(limiter.check(&1), denial_at_10s);

    // A partly used key: a backwards reading admits no more than the
    // reading at 20 s reports. (A bound, not an equality: GCRA stores no
    // "now" and sees an older reading as more debt, so it admits fewer; the
    // exact figure for each algorithm is pinned in tests/algorithms.rs.)
    clock.set(Duration::from_secs(20));
    assert!(limiter.check_n(&1, 2).unwrap().is_allowed());
    let remaining_at_20s = available_now(&limiter, &1);
    assert_eq!(remaining_at_20s, 3);
    clock.set(Duration::from_secs(15));
    let (backwards, _) = drain(&limiter, &1);
    assert!(
        backwards <= remaining_at_20s,
        "backwards reading admitted {backwards}"
    );
}

/// Readings near the end of `u64` time neither panic nor wrap a key back to
/// fresh: time stops at `END_OF_TIME_NS` and the key stays exact.
pub fn survives_the_end_of_time<L: Subject<u64>>(make: impl Fn(Quota, ManualClock) -> L) {
    let clock = ManualClock::new();
    let limiter = make(quota(5, Duration::from_secs(1)), clock.clone());
    clock.set_ns(u64::MAX - 1_000);
    assert_eq!(drain(&limiter, &1).0, 5);
    clock.set_ns(u64::MAX);
    let decision = limiter.check(&1);
    assert_well_formed(&decision);
    assert_eq!(decision.remaining(), 0);
}

/// 10 000 keys each get exactly their own burst.
pub fn many_keys_each_get_exactly_their_burst<L: Subject<u64>>(
    make: impl Fn(Quota, ManualClock) -> L,
) {
    let limiter = make(quota(3, Duration::from_secs(60)), ManualClock::new());
    for key in 0..10_000_u64 {
        let (admitted, denial) = drain(&limiter, &key);
        assert_eq!(admitted, 3, "key {key}");
        assert_eq!(denial.remaining(), 0);
    }
    assert_eq!(limiter.len(), 10_000);
    for key in 0..10_000_u64 {
        assert!(!limiter.check(&key).is_allowed(), "key {key}");
    }
}
