//! Giving an admission back (`check_n_receipt` and `refund`): for every
//! algorithm and on every store, a refunded admission that nothing
//! followed leaves every decision at its instant and after exactly as if
//! it had never happened; one that others followed is given back in full
//! by the window algorithms and, by GCRA and the token bucket, all but the
//! time elapsed since it (and the clock margin), to the nanosecond; an
//! older reading never admits more units than it would have; and racing
//! refunds never admit more than the burst.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

#[path = "support/builders.rs"]
mod builders;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use builders::limiter;
use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, Refund, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::clock::ManualClock;
use tollgate::store::{GlobalMutex, LockFree, PerKey, Sharded, StoreKind};
use tollgate::{Builder, Quota};

/// A refund of the last admission restores the key: the decisions of the
/// next 40 checks, spread over two refill times, equal those of a
/// reference limiter that never saw the refunded admission.
fn refunds_restore_the_key<A, S>(store: S)
where
    A: Algorithm,
    S: StoreKind<u64, A>,
{
    let quota = Quota::per_second(4).unwrap().with_burst(3).unwrap();
    let clock = ManualClock::new();
    clock.set_ns(5_000_000_000);
    let subject = limiter::<A, _>(quota, store.clone(), &clock);
    let reference = limiter::<A, _>(quota, store, &clock);
    for _ in 0..2 {
        assert!(subject.check(&7).unwrap().is_allowed());
        assert!(reference.check(&7).unwrap().is_allowed());
    }
    let (decision, receipt) = subject.check_n_receipt(&7, 1).unwrap();
    assert!(decision.is_allowed());
    let receipt = receipt.expect("this algorithm's admissions carry a receipt");
    clock.advance(Duration::from_millis(30));
    // Consumed: a receipt gives back once (the type system holds it).
    assert_eq!(subject.refund(&7, receipt), Refund::Full);
    for step in 0..40 {
        clock.advance(Duration::from_millis(37));
        let cost = 1 + step % 3;
        assert_eq!(
            subject.check_n(&7, cost).unwrap(),
            reference.check_n(&7, cost).unwrap(),
            "step {step}"
        );
    }
}

/// Every store, for one algorithm.
macro_rules! on_every_store {
    ($test:ident, $algorithm:ty) => {
        $test::<$algorithm, _>(LockFree::new(2));
        $test::<$algorithm, _>(Sharded::default());
        $test::<$algorithm, _>(GlobalMutex);
        $test::<$algorithm, _>(PerKey::new());
    };
}

#[test]
fn refunds_restore_the_key_on_every_store() {
    on_every_store!(refunds_restore_the_key, Gcra);
    on_every_store!(refunds_restore_the_key, TokenBucket);
    on_every_store!(refunds_restore_the_key, FixedWindow);
    on_every_store!(refunds_restore_the_key, SlidingWindowCounter);
    on_every_store!(refunds_restore_the_key, SlidingWindowLog);
}

/// The window algorithms give an admission that another followed back in
/// full: 3 an hour, one admitted and refunded after another, leave
/// exactly 2 more, and a key never admitted has nothing to give back.
fn a_followed_admission_is_given_back_in_full<A, S>(store: S)
where
    A: Algorithm,
    S: StoreKind<u64, A>,
{
    let clock = ManualClock::new();
    let subject = limiter::<A, _>(Quota::per_hour(3).unwrap(), store, &clock);
    let (_, first) = subject.check_n_receipt(&1, 1).unwrap();
    assert!(subject.check(&1).unwrap().is_allowed());
    assert_eq!(subject.refund(&1, first.unwrap()), Refund::Full);
    assert!(subject.check(&1).unwrap().is_allowed());
    assert!(subject.check(&1).unwrap().is_allowed());
    assert!(
        !subject.check(&1).unwrap().is_allowed(),
        "exactly 3 admitted"
    );
    let (_, other) = subject.check_n_receipt(&3, 1).unwrap();
    assert_eq!(subject.refund(&2, other.unwrap()), Refund::Nothing);
}

#[test]
fn the_window_algorithms_give_a_followed_admission_back_in_full_on_every_store() {
    on_every_store!(a_followed_admission_is_given_back_in_full, FixedWindow);
    on_every_store!(
        a_followed_admission_is_given_back_in_full,
        SlidingWindowCounter
    );
    on_every_store!(a_followed_admission_is_given_back_in_full, SlidingWindowLog);
}

/// GCRA and the token bucket give an admission that another followed back
/// less the time elapsed since it and the 1 µs clock margin: 3 an hour
/// (20 min intervals), two admitted at 0 s and the first refunded at 10 s
/// leave the key owing 20 min + 1 µs at 10 s, where a key that never saw
/// the first admission owes 19 min 50 s. So it admits the burst's third
/// unit 1 µs late, and its next 10 s + 1 µs later than that key would.
/// Refunded an interval later, nothing is left to give back.
fn a_followed_admission_is_given_back_but_the_elapsed_time<A, S>(store: S)
where
    A: Algorithm,
    S: StoreKind<u64, A>,
{
    let clock = ManualClock::new();
    let subject = limiter::<A, _>(Quota::per_hour(3).unwrap(), store, &clock);
    let (_, first) = subject.check_n_receipt(&1, 1).unwrap();
    assert!(subject.check(&1).unwrap().is_allowed());
    clock.advance(Duration::from_secs(10));
    assert_eq!(subject.refund(&1, first.unwrap()), Refund::Partial);
    assert!(subject.check(&1).unwrap().is_allowed());
    let late = subject.check(&1).unwrap();
    assert!(!late.is_allowed());
    assert_eq!(late.retry_after(), Duration::from_micros(1));
    clock.advance(Duration::from_micros(1));
    assert!(subject.check(&1).unwrap().is_allowed());
    assert_eq!(
        subject.check(&1).unwrap().retry_after(),
        Duration::from_secs(20 * 60)
    );
    // Refunded an interval later, nothing is left to give back.
    let (_, late) = subject.check_n_receipt(&3, 1).unwrap();
    assert!(subject.check(&3).unwrap().is_allowed());
    clock.advance(Duration::from_secs(20 * 60));
    assert_eq!(subject.refund(&3, late.unwrap()), Refund::Nothing);
}

#[test]
fn gcra_and_the_token_bucket_give_a_followed_admission_back_but_the_elapsed_time() {
    on_every_store!(
        a_followed_admission_is_given_back_but_the_elapsed_time,
        Gcra
    );
    on_every_store!(
        a_followed_admission_is_given_back_but_the_elapsed_time,
        TokenBucket
    );
}

/// A denial has nothing to give back.
fn a_denial_gives_no_receipt<A>()
where
    A: Algorithm,
    LockFree: StoreKind<u64, A>,
{
    let clock = ManualClock::new();
    let subject = limiter::<A, _>(Quota::per_hour(1).unwrap(), LockFree::new(1), &clock);
    assert!(subject.check_n_receipt(&1, 1).unwrap().1.is_some());
    let (denied, receipt) = subject.check_n_receipt(&1, 1).unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(receipt, None);
}

#[test]
fn denials_give_no_receipt() {
    a_denial_gives_no_receipt::<Gcra>();
    a_denial_gives_no_receipt::<TokenBucket>();
    a_denial_gives_no_receipt::<FixedWindow>();
    a_denial_gives_no_receipt::<SlidingWindowCounter>();
    a_denial_gives_no_receipt::<SlidingWindowLog>();
}

/// A window algorithm's check whose reading is older than the window the
/// key already counts in is counted in that window, where its refund,
/// made from the reading's window, cannot find it: it stays charged until
/// that window ends (the documented exception, note 11).
fn a_stale_reading_stays_charged<A>()
where
    A: Algorithm,
    LockFree: StoreKind<u64, A>,
{
    let clock = ManualClock::new();
    let subject = limiter::<A, _>(Quota::per_second(2).unwrap(), LockFree::new(1), &clock);
    clock.set_ns(1_500_000_000);
    assert!(subject.check(&1).unwrap().is_allowed());
    clock.set_ns(900_000_000);
    let (stale, receipt) = subject.check_n_receipt(&1, 1).unwrap();
    assert!(stale.is_allowed());
    assert_eq!(subject.refund(&1, receipt.unwrap()), Refund::Nothing);
    clock.set_ns(1_500_000_000);
    assert!(!subject.check(&1).unwrap().is_allowed());
}

#[test]
fn a_window_algorithms_stale_reading_stays_charged() {
    a_stale_reading_stays_charged::<FixedWindow>();
    a_stale_reading_stays_charged::<SlidingWindowCounter>();
}

#[test]
fn an_untracking_cap_gives_no_receipts() {
    let clock = ManualClock::new();
    let capped = Builder::new(Quota::per_hour(5).unwrap())
        .clock(clock)
        .max_keys(
            std::num::NonZeroUsize::new(1).unwrap(),
            tollgate::store::WhenFull::AdmitUntracked,
        )
        .build::<u64>();
    let (decision, receipt) = capped.check_n_receipt(&1, 1).unwrap();
    assert!(decision.is_allowed());
    assert_eq!(receipt, None);
    // Past the cap, admitted untracked: nothing stored, nothing to give.
    let (untracked, receipt) = capped.check_n_receipt(&2, 1).unwrap();
    assert!(untracked.is_allowed());
    assert_eq!(receipt, None);
}

#[test]
fn a_direct_limiter_refunds_too() {
    let clock = ManualClock::new();
    let direct = Builder::new(Quota::per_hour(2).unwrap())
        .clock(clock.clone())
        .build_direct();
    let (_, receipt) = direct.check_n_receipt(2).unwrap();
    assert_eq!(direct.refund(receipt.unwrap()), Refund::Full);
    assert!(direct.check_n(2).unwrap().is_allowed());
    assert!(!direct.check().unwrap().is_allowed());
}

/// Eight threads admit on one key and give back every other admission
/// they made, racing, with the clock frozen. The window algorithms give
/// each back in full, so the units kept are exactly the burst. GCRA and the
/// token bucket give back in full an admission nothing followed, and
/// otherwise all but the 1 µs clock margin, so the units kept are the
/// burst less the whole intervals the margins left add up to.
fn racing_refunds_never_admit_more_than_the_burst<A>()
where
    A: Algorithm,
    LockFree: StoreKind<u64, A>,
{
    let quota = Quota::per_hour(50).unwrap();
    let clock = ManualClock::new();
    let subject = limiter::<A, _>(quota, LockFree::new(1), &clock);
    let kept = AtomicU32::new(0);
    let full = AtomicU32::new(0);
    let partial = AtomicU32::new(0);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for attempt in 0..200 {
                    let (decision, receipt) = subject.check_n_receipt(&9, 1).unwrap();
                    if !decision.is_allowed() {
                        continue;
                    }
                    if attempt % 2 == 0 {
                        let given = match subject.refund(&9, receipt.unwrap()) {
                            Refund::Full => &full,
                            Refund::Partial => &partial,
                            Refund::Nothing => panic!("a refund at once gives something back"),
                        };
                        given.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    kept.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let partial = u64::from(partial.into_inner());
    let interval_ns = quota.emission_interval().as_nanos() as u64;
    let lost = u32::try_from((partial * 1_000).div_ceil(interval_ns)).unwrap();
    assert_eq!(kept.into_inner(), 50 - lost);
    assert!(!subject.check(&9).unwrap().is_allowed());
    // Refunds happened (a refund that never gives back would pass the
    // count).
    assert!(full.into_inner() + u32::try_from(partial).unwrap() > 0);
}

#[test]
fn racing_refunds_never_admit_more_than_the_burst_for_each_algorithm() {
    racing_refunds_never_admit_more_than_the_burst::<Gcra>();
    racing_refunds_never_admit_more_than_the_burst::<TokenBucket>();
    racing_refunds_never_admit_more_than_the_burst::<FixedWindow>();
    racing_refunds_never_admit_more_than_the_burst::<SlidingWindowCounter>();
    racing_refunds_never_admit_more_than_the_burst::<SlidingWindowLog>();
}

/// A refund can leave a state no check writes (an empty window, a full
/// bucket dated `last`): it is idle only from its own instant on, so that
/// an older reading (a clock stepped back, another thread's) cannot evict
/// it and then admit as a fresh key would. Against a reference limiter
/// that never saw the refunded admission, after a refund at `refund_s`: an
/// eviction at the older reading `older_s` removes no more, and the
/// checks at `older_s` and then `later_s` admit as many units (the older
/// reading's may be counted at the state's own instant, so the two need
/// not admit at the same reading).
fn an_older_reading_cannot_evict_what_a_refund_left<A>(instants_s: [f64; 4])
where
    A: Algorithm,
    LockFree: StoreKind<u64, A>,
{
    let [admit_s, refund_s, older_s, later_s] = instants_s;
    let quota = Quota::per_second(1).unwrap();
    let clock = ManualClock::new();
    let at = |seconds: f64| clock.set_ns((seconds * 1e9) as u64);
    let subject = limiter::<A, _>(quota, LockFree::new(1), &clock);
    let reference = limiter::<A, _>(quota, LockFree::new(1), &clock);
    at(admit_s);
    assert!(subject.check(&1).unwrap().is_allowed());
    assert!(reference.check(&1).unwrap().is_allowed());
    at(refund_s);
    let (decision, receipt) = subject.check_n_receipt(&1, 1).unwrap();
    assert!(decision.is_allowed());
    assert_eq!(subject.refund(&1, receipt.unwrap()), Refund::Full);
    at(older_s);
    assert_eq!(subject.evict_idle(), reference.evict_idle());
    let mut admitted = [0, 0];
    for instant in [older_s, later_s] {
        at(instant);
        for (count, limiter) in admitted.iter_mut().zip([&subject, &reference]) {
            *count += u32::from(limiter.check(&1).unwrap().is_allowed());
        }
    }
    assert_eq!(admitted[0], admitted[1], "subject, reference");
    assert_eq!(admitted[1], 1);
}

#[test]
fn an_older_reading_cannot_evict_what_a_refund_left_for_each_algorithm() {
    an_older_reading_cannot_evict_what_a_refund_left::<FixedWindow>([0.5, 1.2, 0.9, 1.3]);
    an_older_reading_cannot_evict_what_a_refund_left::<TokenBucket>([0.0, 1.0, 0.5, 1.5]);
}

/// A reservation waiting for its slot was placed with an earlier admission
/// counted: a partial refund of that admission must not let plain checks
/// in ahead of it. 1 a second in bursts of 10, at 100 s: 10 admitted, 10
/// reserved for 110 s, the first refunded (followed by the reservation, so
/// only in part). Without the guard, 6 units at 106 s were admitted and the
/// reservation still served at 110 s: 16 units in 4 s, where a limiter
/// that saw only those two admits the first and refuses the second.
#[test]
fn a_partial_refund_never_lets_checks_in_ahead_of_a_reservation() {
    const S: u64 = 1_000_000_000;
    let clock = ManualClock::new();
    clock.set_ns(100 * S);
    let subject = limiter::<Gcra, _>(
        Quota::per_second(1).unwrap().with_burst(10).unwrap(),
        LockFree::new(1),
        &clock,
    );
    let (_, first) = subject.check_n_receipt(&1, 10).unwrap();
    let mut reservation = subject.reserve_n(&1, 10, Duration::from_secs(20)).unwrap();
    assert!(!reservation.is_ready());
    assert_eq!(subject.refund(&1, first.unwrap()), Refund::Nothing);
    clock.set_ns(106 * S + 1_000);
    assert!(!subject.check_n(&1, 6).unwrap().is_allowed());
    clock.set_ns(110 * S);
    assert!(reservation.is_ready());
}

/// A refund takes only its own limiter's receipts: another limiter's (or a
/// direct limiter's) gives nothing back, whatever the algorithms.
#[test]
fn a_receipt_of_another_limiter_gives_nothing_back() {
    let clock = ManualClock::new();
    let gcra = limiter::<Gcra, _>(Quota::per_hour(3).unwrap(), LockFree::new(1), &clock);
    let window = limiter::<FixedWindow, _>(Quota::per_hour(3).unwrap(), LockFree::new(1), &clock);
    let direct = Builder::new(Quota::per_hour(3).unwrap())
        .algorithm::<FixedWindow>()
        .clock(clock.clone())
        .build_direct();
    for _ in 0..3 {
        assert!(window.check(&1).unwrap().is_allowed());
        assert!(direct.check().unwrap().is_allowed());
    }
    let (_, foreign) = gcra.check_n_receipt(&1, 1).unwrap();
    assert_eq!(window.refund(&1, foreign.unwrap()), Refund::Nothing);
    let (_, foreign) = gcra.check_n_receipt(&1, 1).unwrap();
    assert_eq!(direct.refund(foreign.unwrap()), Refund::Nothing);
    assert!(!window.check(&1).unwrap().is_allowed());
    assert!(!direct.check().unwrap().is_allowed());
}
