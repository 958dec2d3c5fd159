//! Checks that carry their own quota (`check_with` and its kin): what a
//! key's state means under another quota, for each algorithm, with exact
//! counts; the quotas a limiter refuses, and that a refused check stores
//! nothing; quotas mixed on one key under contention; eviction of keys
//! only other quotas checked; and receipts under a carried quota. The
//! conformance suite runs every store with mixed quotas besides
//! (`tests/conformance`, the `mixed` rows).
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

#[path = "support/builders.rs"]
mod builders;
#[path = "support/contention.rs"]
mod contention;

use std::time::Duration;

use builders::limiter;
use contention::admitted_under_contention;
use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, Refund, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::clock::ManualClock;
use tollgate::store::{GlobalMutex, LockFree, PerKey, Sharded, StoreKind};
use tollgate::{CheckError, LayoutError, Quota, RateLimiter};

/// Unit requests admitted under `quota` until the first denial.
fn drain<A: Algorithm, S: StoreKind<u64, A>>(
    limiter: &RateLimiter<u64, A, ManualClock, S>,
    key: u64,
    quota: &Quota,
) -> u32 {
    let mut admitted = 0;
    while limiter.check_with(&key, quota).unwrap().is_allowed() {
        admitted += 1;
        // A guard against a limiter that never denies, not a bound on the
        // count: every caller asserts the exact count it expects.
        if admitted > 1_000_000 {
            panic!("never denied");
        }
    }
    admitted
}

/// 5 and 10 a minute, both in bursts over one minute: the window
/// algorithms' tiers.
fn free_and_pro() -> (Quota, Quota) {
    (
        Quota::per_minute(5).unwrap(),
        Quota::per_minute(10).unwrap(),
    )
}

/// The window algorithms keep a key's count: 5 units drained under the free
/// quota leave exactly 5 more under the pro quota, and the free quota then
/// reads a window counting 10 against its 5.
fn windows_keep_their_counts<A: Algorithm, S: StoreKind<u64, A>>(store: S) {
    let (free, pro) = free_and_pro();
    let clock = ManualClock::new();
    let limiter = limiter::<A, _>(free, store, &clock);
    assert_eq!(drain(&limiter, 1, &free), 5);
    assert_eq!(drain(&limiter, 1, &pro), 5);
    let denial = limiter.check_with(&1, &free).unwrap();
    assert!(!denial.is_allowed());
    assert_eq!((denial.limit(), denial.remaining()), (5, 0));
    // Under the pro quota first: the free quota then finds nothing left.
    assert_eq!(drain(&limiter, 2, &pro), 10);
    assert_eq!(drain(&limiter, 2, &free), 0);
    // Past the window (two, for the sliding ones), both start afresh.
    clock.advance(Duration::from_secs(120));
    assert_eq!(drain(&limiter, 1, &pro), 10);
    assert_eq!(limiter.len(), 2);
}

/// GCRA and the token bucket keep the refill time a key booked: 5 units
/// drained under 5 a minute book 60 s; 10 a minute in bursts of 20 holds
/// 120 s, of which 60 s are left, 10 of its 6 s intervals. Under 10 a
/// minute in bursts of 10 (60 s), nothing is left.
fn booked_time_is_kept<A: Algorithm, S: StoreKind<u64, A>>(store: S) {
    let (free, pro) = free_and_pro();
    let pro_burst = pro.with_burst(20).unwrap();
    let clock = ManualClock::new();
    let limiter = limiter::<A, _>(free, store, &clock);
    assert_eq!(drain(&limiter, 1, &free), 5);
    assert_eq!(drain(&limiter, 1, &pro), 0);
    assert_eq!(drain(&limiter, 1, &pro_burst), 10);
    // 60 s later the 120 s booked have 60 s left: the free quota (60 s)
    // has nothing, the bursty pro quota 10 intervals again.
    clock.advance(Duration::from_secs(60));
    assert_eq!(drain(&limiter, 1, &free), 0);
    assert_eq!(drain(&limiter, 1, &pro_burst), 10);
    // Drained under the pro quota, the free quota waits out its share:
    // one 12 s interval after the 6 s pro interval booked.
    clock.advance(Duration::from_secs(120));
    assert_eq!(drain(&limiter, 2, &pro), 10);
    let denial = limiter.check_with(&2, &free).unwrap();
    assert_eq!(denial.retry_after(), Duration::from_secs(12));
}

macro_rules! on_every_store {
    ($test:ident, $algorithm:ty) => {
        $test::<$algorithm, _>(LockFree::new(2));
        $test::<$algorithm, _>(GlobalMutex);
        $test::<$algorithm, _>(Sharded::new(2));
        $test::<$algorithm, _>(PerKey::new());
    };
}

#[test]
fn the_window_algorithms_read_a_key_by_its_counts() {
    on_every_store!(windows_keep_their_counts, FixedWindow);
    on_every_store!(windows_keep_their_counts, SlidingWindowCounter);
    on_every_store!(windows_keep_their_counts, SlidingWindowLog);
}

#[test]
fn gcra_and_the_token_bucket_read_a_key_by_its_booked_time() {
    on_every_store!(booked_time_is_kept, Gcra);
    on_every_store!(booked_time_is_kept, TokenBucket);
}

/// A refused quota is an error before anything is stored or consumed.
fn refused<A: Algorithm>(limiter_quota: Quota, carried: Quota, expected: LayoutError)
where
    tollgate::cell::Preferred: tollgate::cell::CellFor<A>,
{
    let clock = ManualClock::new();
    let limiter = limiter::<A, _>(limiter_quota, LockFree::new(2), &clock);
    assert_eq!(limiter.accepts(&carried), Err(expected));
    assert_eq!(
        limiter.check_with(&1, &carried),
        Err(CheckError::Layout(expected))
    );
    assert_eq!(
        limiter.check_n_with(&1, 1, &carried),
        Err(CheckError::Layout(expected))
    );
    assert_eq!(
        limiter.peek_with(&1, &carried),
        Err(CheckError::Layout(expected))
    );
    assert_eq!(
        limiter.check_n_receipt_with(&1, 1, &carried).map(|_| ()),
        Err(CheckError::Layout(expected))
    );
    assert!(limiter.is_empty());
}

#[test]
fn the_window_algorithms_refuse_another_window() {
    let minute = Quota::per_minute(5).unwrap();
    let second = Quota::per_second(5).unwrap();
    let differs = LayoutError::WindowDiffers {
        limiter: Duration::from_secs(60),
        quota: Duration::from_secs(1),
    };
    refused::<FixedWindow>(minute, second, differs);
    refused::<SlidingWindowCounter>(minute, second, differs);
    refused::<SlidingWindowLog>(minute, second, differs);
    // The burst window is what counts: 10 a minute in bursts of 5 counts
    // in windows of 30 s.
    let half_minute = LayoutError::WindowDiffers {
        limiter: Duration::from_secs(60),
        quota: Duration::from_secs(30),
    };
    refused::<FixedWindow>(
        minute,
        Quota::per_minute(10).unwrap().with_burst(5).unwrap(),
        half_minute,
    );
    // The same window in another rate and burst is accepted.
    let clock = ManualClock::new();
    let windows = limiter::<FixedWindow, _>(minute, LockFree::new(2), &clock);
    assert_eq!(
        windows.accepts(&Quota::per_hour(60).unwrap().with_burst(1).unwrap()),
        Ok(())
    );
    // GCRA and the token bucket accept every quota.
    let gcra = limiter::<Gcra, _>(minute, LockFree::new(2), &clock);
    assert_eq!(
        gcra.accepts(&Quota::per_second(1_000_000_000).unwrap()),
        Ok(())
    );
    let bucket = limiter::<TokenBucket, _>(minute, LockFree::new(2), &clock);
    assert_eq!(bucket.accepts(&Quota::per_hour(1).unwrap()), Ok(()));
}

/// A sliding window counter whose states pack into a word (a 1 s window:
/// two 15-bit counts) takes every burst that fits the word, and refuses a
/// larger one; one that does not pack takes every burst of its window.
#[test]
fn a_packed_sliding_window_counter_refuses_a_burst_its_word_cannot_hold() {
    let packs = Quota::per_second(1_000).unwrap();
    assert!(SlidingWindowCounter::from_quota(&packs).packs());
    let largest = Quota::new(32_767, Duration::from_secs(1)).unwrap();
    let too_large = Quota::new(32_768, Duration::from_secs(1)).unwrap();
    refused::<SlidingWindowCounter>(
        packs,
        too_large,
        LayoutError::BurstDoesNotPack {
            burst: 32_768,
            max: 32_767,
        },
    );
    let clock = ManualClock::new();
    let narrow = limiter::<SlidingWindowCounter, _>(packs, LockFree::new(2), &clock);
    assert_eq!(narrow.accepts(&largest), Ok(()));
    assert_eq!(drain(&narrow, 1, &largest), 32_767);

    let unpacked = Quota::per_second(100_000).unwrap();
    assert!(!SlidingWindowCounter::from_quota(&unpacked).packs());
    let wide = limiter::<SlidingWindowCounter, _>(unpacked, LockFree::new(2), &clock);
    assert_eq!(wide.accepts(&packs), Ok(()));
    assert_eq!(drain(&wide, 1, &packs), 1_000);
    assert_eq!(drain(&wide, 1, &unpacked), 99_000);
}

/// 64 threads on one key, half under the free quota and half under the
/// pro quota, with a frozen clock: the window algorithms admit exactly the
/// pro burst in all (every admission under either quota counts once, and
/// the pro threads check enough to fill it), and under the free quota
/// at most its burst.
fn mixed_quotas_on_one_key<A: Algorithm, S: StoreKind<u64, A>>(store: S) {
    let free = Quota::per_hour(100).unwrap();
    let pro = Quota::per_hour(1_000).unwrap();
    let clock = ManualClock::new();
    let limiter = limiter::<A, _>(free, store, &clock);
    let free_admitted = std::sync::atomic::AtomicU32::new(0);
    let thread = std::sync::atomic::AtomicU32::new(0);
    let admitted = admitted_under_contention(64, 40, || {
        // Each thread picks its quota by its first call's turn.
        thread_local!(static PRO: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) });
        let pro_thread = PRO.with(|cell| {
            cell.get().unwrap_or_else(|| {
                let pro = thread.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2 == 0;
                cell.set(Some(pro));
                pro
            })
        });
        if pro_thread {
            limiter.check_with(&7, &pro).unwrap().is_allowed()
        } else {
            let allowed = limiter.check_with(&7, &free).unwrap().is_allowed();
            if allowed {
                free_admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            allowed
        }
    });
    assert_eq!(admitted, 1_000);
    assert!(free_admitted.into_inner() <= 100);
    assert_eq!(limiter.peek_with(&7, &pro).unwrap().remaining(), 0);
    assert_eq!(limiter.len(), 1);
}

#[test]
fn mixed_quotas_on_one_key_count_every_admission_once() {
    on_every_store!(mixed_quotas_on_one_key, FixedWindow);
    on_every_store!(mixed_quotas_on_one_key, SlidingWindowCounter);
    on_every_store!(mixed_quotas_on_one_key, SlidingWindowLog);
}

/// 32 threads on key 1 under the free quota and 32 on key 2 under the pro
/// quota, every algorithm, a frozen clock: exactly each burst.
fn each_key_gets_its_quota_under_contention<A: Algorithm, S: StoreKind<u64, A>>(store: S) {
    let free = Quota::per_hour(100).unwrap();
    let pro = Quota::per_hour(1_000).unwrap();
    let clock = ManualClock::new();
    let limiter = limiter::<A, _>(free, store, &clock);
    let admitted = std::thread::scope(|scope| {
        let free_side = scope.spawn(|| {
            admitted_under_contention(32, 40, || {
                limiter.check_with(&1, &free).unwrap().is_allowed()
            })
        });
        let pro_side = scope.spawn(|| {
            admitted_under_contention(32, 40, || {
                limiter.check_with(&2, &pro).unwrap().is_allowed()
            })
        });
        (free_side.join().unwrap(), pro_side.join().unwrap())
    });
    assert_eq!(admitted, (100, 1_000));
}

#[test]
fn each_key_is_held_to_its_quota_under_contention() {
    on_every_store!(each_key_gets_its_quota_under_contention, Gcra);
    on_every_store!(each_key_gets_its_quota_under_contention, TokenBucket);
    on_every_store!(each_key_gets_its_quota_under_contention, FixedWindow);
    on_every_store!(
        each_key_gets_its_quota_under_contention,
        SlidingWindowCounter
    );
    on_every_store!(each_key_gets_its_quota_under_contention, SlidingWindowLog);
}

/// A key only another quota checked is evicted by the limiter's own
/// judgement exactly when it is idle: not one nanosecond before.
fn evicted_when_idle<A: Algorithm, S: StoreKind<u64, A>>(
    store: S,
    limiter_quota: Quota,
    carried: Quota,
    idle_after: Duration,
) {
    let clock = ManualClock::new();
    clock.set_ns(1);
    let limiter = limiter::<A, _>(limiter_quota, store, &clock);
    assert!(limiter.check_with(&1, &carried).unwrap().is_allowed());
    clock.advance(idle_after - Duration::from_nanos(1));
    assert_eq!(limiter.evict_idle(), 0);
    assert_eq!(limiter.len(), 1);
    clock.advance(Duration::from_nanos(1));
    assert_eq!(limiter.evict_idle(), 1);
    assert!(limiter.is_empty());
}

#[test]
fn keys_other_quotas_checked_are_evicted_exactly_when_idle() {
    let free = Quota::per_minute(5).unwrap();
    // One unit books one 6 min interval, where the limiter's own books 12 s.
    let slow = Quota::per_hour(10).unwrap();
    let minute = Duration::from_secs(60);
    // Started 1 ns into the window: the window ends 1 ns short of a minute on.
    let window = minute - Duration::from_nanos(1);
    let store = LockFree::new(2);
    let pro = Quota::per_minute(1_000).unwrap();
    let six_minutes = Duration::from_secs(360);
    evicted_when_idle::<Gcra, _>(store.clone(), free, slow, six_minutes);
    evicted_when_idle::<TokenBucket, _>(store.clone(), free, slow, six_minutes);
    evicted_when_idle::<FixedWindow, _>(store.clone(), free, pro, window);
    evicted_when_idle::<SlidingWindowLog, _>(store.clone(), free, pro, minute);
    evicted_when_idle::<SlidingWindowCounter, _>(store, free, pro, window + minute);
    evicted_when_idle::<Gcra, _>(GlobalMutex, free, slow, six_minutes);
    evicted_when_idle::<Gcra, _>(Sharded::new(2), free, slow, six_minutes);
    evicted_when_idle::<Gcra, _>(PerKey::new(), free, slow, six_minutes);
}

/// A receipt made under a carried quota gives the admission back: the
/// key then decides as if it had never happened.
fn receipts_under_a_carried_quota<A: Algorithm, S: StoreKind<u64, A>>(store: S) {
    let (free, pro) = free_and_pro();
    let clock = ManualClock::new();
    let limiter = limiter::<A, _>(free, store, &clock);
    assert_eq!(drain(&limiter, 1, &pro), 10);
    // Two windows on: the sliding counter's drained window weighs nothing.
    clock.advance(Duration::from_secs(120));
    let (decision, receipt) = limiter.check_n_receipt_with(&1, 1, &pro).unwrap();
    assert!(decision.is_allowed());
    assert_eq!(
        limiter.refund(&1, receipt.expect("a receipt")),
        Refund::Full
    );
    let again = limiter.check_with(&1, &pro).unwrap();
    assert_eq!(again, decision);
}

#[test]
fn receipts_give_back_under_a_carried_quota() {
    on_every_store!(receipts_under_a_carried_quota, Gcra);
    on_every_store!(receipts_under_a_carried_quota, TokenBucket);
    on_every_store!(receipts_under_a_carried_quota, FixedWindow);
    on_every_store!(receipts_under_a_carried_quota, SlidingWindowCounter);
    on_every_store!(receipts_under_a_carried_quota, SlidingWindowLog);
}
