//! Giving an admission back (`check_n_receipt` and `refund`): for every
//! algorithm that makes receipts (GCRA, the token bucket, the fixed window)
//! and on every store, a refunded admission leaves every decision at its
//! instant and after exactly as if it had never happened, an older reading
//! never admits more units than it would have, and an admission that
//! others followed is never taken back.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

#[path = "support/builders.rs"]
mod builders;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use builders::limiter;
use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::clock::ManualClock;
use tollgate::store::{GlobalMutex, LockFree, PerKey, Sharded, StoreKind};
use tollgate::{Builder, Quota};

/// A refund of the last admission restores the key: the decisions of the
/// next 40 checks, spread over two refill times, equal those of a
/// reference limiter that never saw the refunded admission.
fn refunds_restore_the_key<A, S>(store: S)
where
    A: Algorithm<State: PartialEq + Clone>,
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
    assert!(subject.refund(&7, receipt));
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
}

/// An admission that another followed stays charged, on every store: the
/// later one was decided with it counted.
fn a_followed_admission_stays_charged<A, S>(store: S)
where
    A: Algorithm<State: PartialEq + Clone>,
    S: StoreKind<u64, A>,
{
    let clock = ManualClock::new();
    let subject = limiter::<A, _>(Quota::per_hour(3).unwrap(), store, &clock);
    let (_, first) = subject.check_n_receipt(&1, 1).unwrap();
    assert!(subject.check(&1).unwrap().is_allowed());
    assert!(!subject.refund(&1, first.unwrap()));
    assert!(subject.check(&1).unwrap().is_allowed());
    assert!(
        !subject.check(&1).unwrap().is_allowed(),
        "exactly 3 admitted"
    );
    // A key never admitted has nothing to give back.
    let (_, other) = subject.check_n_receipt(&3, 1).unwrap();
    assert!(!subject.refund(&2, other.unwrap()));
}

#[test]
fn a_followed_admission_stays_charged_on_every_store() {
    on_every_store!(a_followed_admission_stays_charged, Gcra);
    on_every_store!(a_followed_admission_stays_charged, TokenBucket);
    on_every_store!(a_followed_admission_stays_charged, FixedWindow);
}

/// A denial has nothing to give back.
fn a_denial_gives_no_receipt<A>()
where
    A: Algorithm<State: PartialEq + Clone>,
    LockFree: StoreKind<u64, A>,
{
    let clock = ManualClock::new();
    let subject = limiter::<A, _>(Quota::per_hour(1).unwrap(), LockFree::new(1), &clock);
    assert!(subject.check_n_receipt(&1, 1).unwrap().1.is_some());
    let (denied, receipt) = subject.check_n_receipt(&1, 1).unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(receipt, None);
}

/// An admission of an algorithm that cannot tell its state from its
/// decision comes without a receipt.
fn an_admission_gives_no_receipt<A>()
where
    A: Algorithm<State: PartialEq + Clone>,
    LockFree: StoreKind<u64, A>,
{
    let clock = ManualClock::new();
    let subject = limiter::<A, _>(Quota::per_hour(1).unwrap(), LockFree::new(1), &clock);
    let (allowed, receipt) = subject.check_n_receipt(&1, 1).unwrap();
    assert!(allowed.is_allowed());
    assert_eq!(receipt, None);
}

#[test]
fn denials_and_algorithms_without_receipts_give_none() {
    a_denial_gives_no_receipt::<Gcra>();
    a_denial_gives_no_receipt::<TokenBucket>();
    a_denial_gives_no_receipt::<FixedWindow>();
    an_admission_gives_no_receipt::<SlidingWindowCounter>();
    an_admission_gives_no_receipt::<SlidingWindowLog>();
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
    assert!(direct.refund(receipt.unwrap()));
    assert!(direct.check_n(2).unwrap().is_allowed());
    assert!(!direct.check().unwrap().is_allowed());
}

/// Eight threads admit on one key and give back every other admission
/// they made, racing: each refund succeeds only if no admission followed,
/// so the units kept are exactly the admissions minus the refunds, and
/// never more than the burst (the clock is frozen).
fn racing_refunds_never_admit_more_than_the_burst<A>()
where
    A: Algorithm<State: PartialEq + Clone>,
    LockFree: StoreKind<u64, A>,
{
    let quota = Quota::per_hour(50).unwrap();
    let clock = ManualClock::new();
    let subject = limiter::<A, _>(quota, LockFree::new(1), &clock);
    let kept = AtomicU32::new(0);
    let refunded = AtomicU32::new(0);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for attempt in 0..200 {
                    let (decision, receipt) = subject.check_n_receipt(&9, 1).unwrap();
                    if !decision.is_allowed() {
                        continue;
                    }
                    if attempt % 2 == 0 && subject.refund(&9, receipt.unwrap()) {
                        refunded.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    kept.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(kept.load(Ordering::Relaxed), 50);
    assert!(!subject.check(&9).unwrap().is_allowed());
    // Refunds happened (a refund that never succeeds would pass the
    // count): each gave back exactly one unit.
    assert!(refunded.load(Ordering::Relaxed) > 0);
}

#[test]
fn racing_refunds_never_admit_more_than_the_burst_for_each_algorithm() {
    racing_refunds_never_admit_more_than_the_burst::<Gcra>();
    racing_refunds_never_admit_more_than_the_burst::<TokenBucket>();
    racing_refunds_never_admit_more_than_the_burst::<FixedWindow>();
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
    A: Algorithm<State: PartialEq + Clone>,
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
    assert!(subject.refund(&1, receipt.unwrap()));
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
