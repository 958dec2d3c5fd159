//! A limiter's quota changed at runtime (`RateLimiter::set_quota`): each
//! strategy's arithmetic on every algorithm and store, exact counts under
//! 64 threads hammering across the change, reservations waiting through
//! it, and the changes refused.

#![cfg(not(any(feature = "loom", feature = "shuttle")))]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use tollgate::algorithm::{
    Algorithm, Carry, FixedWindow, Gcra, Refund, SlidingWindowCounter, SlidingWindowLog,
    TokenBucket,
};
use tollgate::cell::{CellFor, Preferred};
use tollgate::clock::ManualClock;
use tollgate::store::{ChangeError, GlobalMutex, LockFree, PerKey, Sharded, StoreKind};
use tollgate::{Builder, LayoutError, Quota, RateLimiter};

fn per_minute(limit: u32) -> Quota {
    Quota::per_minute(limit).unwrap()
}

/// Units `key` can take now, on a frozen clock: the admissions until the
/// first denial. A guard stops a limiter that never denies (every caller
/// asserts the exact count).
fn drain<A: Algorithm, C: tollgate::clock::Clock, S: StoreKind<String, A>>(
    limiter: &RateLimiter<String, A, C, S>,
    key: &str,
) -> u32 {
    let mut admitted = 0;
    while limiter.check(key).unwrap().is_allowed() {
        admitted += 1;
        if admitted > 1_000 {
            panic!("a limiter that never denies");
        }
    }
    admitted
}

/// A limiter of 10 a minute on `store`, whose key "used" took 4 units.
fn used_four<A: Algorithm, S: StoreKind<String, A>>(
    store: S,
) -> RateLimiter<String, A, ManualClock, S> {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(3_600));
    let limiter = Builder::new(per_minute(10))
        .algorithm::<A>()
        .clock(clock)
        .store(store)
        .build::<String>();
    for _ in 0..4 {
        assert!(limiter.check("used").unwrap().is_allowed());
    }
    limiter
}

/// What "used" (4 of 10 taken) and "fresh" can take after a change to
/// `to` by `carry`.
fn after_change<A: Algorithm, S: StoreKind<String, A>>(
    store: S,
    to: u32,
    carry: Carry,
) -> (u32, u32) {
    let limiter = used_four::<A, S>(store);
    limiter.set_quota(per_minute(to), carry).unwrap();
    assert_eq!(limiter.quota(), per_minute(to));
    (drain(&limiter, "used"), drain(&limiter, "fresh"))
}

/// What a direct limiter of 10 a minute that took 4 units can take after
/// a change to `to` by `carry`.
fn after_direct_change<A: Algorithm>(to: u32, carry: Carry) -> u32
where
    Preferred: CellFor<A>,
{
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(3_600));
    let mut limiter = Builder::new(per_minute(10))
        .algorithm::<A>()
        .clock(clock)
        .build_direct();
    for _ in 0..4 {
        assert!(limiter.check().unwrap().is_allowed());
    }
    limiter.set_quota(per_minute(to), carry).unwrap();
    assert_eq!(*limiter.quota(), per_minute(to));
    let mut admitted = 0;
    while limiter.check().unwrap().is_allowed() {
        admitted += 1;
        if admitted > 1_000 {
            panic!("a limiter that never denies");
        }
    }
    admitted
}

/// Every strategy on every store, and on a direct limiter, for one
/// algorithm: `raised` and `cut` are what "used" can take after 10 → 20
/// and 10 → 5, as (as is, proportional, unchanged).
fn strategies<A: Algorithm>(raised: [u32; 3], cut: [u32; 3])
where
    LockFree: StoreKind<String, A>,
    PerKey: StoreKind<String, A>,
    Sharded: StoreKind<String, A>,
    GlobalMutex: StoreKind<String, A>,
    Preferred: CellFor<A>,
{
    let carries = [Carry::AsIs, Carry::Proportional, Carry::Unchanged];
    for (index, carry) in carries.into_iter().enumerate() {
        for (to, expected) in [(20, raised[index]), (5, cut[index])] {
            let outcomes = [
                after_change::<A, _>(LockFree::default(), to, carry),
                after_change::<A, _>(PerKey::new(), to, carry),
                after_change::<A, _>(Sharded::default(), to, carry),
                after_change::<A, _>(GlobalMutex, to, carry),
            ];
            for (store, outcome) in outcomes.into_iter().enumerate() {
                assert_eq!(
                    outcome,
                    (expected, to),
                    "{} → {to} by {carry:?}, store {store}",
                    std::any::type_name::<A>()
                );
            }
            assert_eq!(
                after_direct_change::<A>(to, carry),
                expected,
                "{} → {to} by {carry:?}, direct",
                std::any::type_name::<A>()
            );
        }
    }
}

// 4 of 10 used. As is: 6 left, at most the new burst (5 after a cut).
// Proportional: 40 % used, of 20 (8) or of 5 (2, rounded up). Unchanged:
// GCRA and the token bucket keep 24 s booked, which is 8 units of 3 s or
// 2 of 12 s; the windows keep their count of 4.
#[test]
fn gcra_carries_by_each_strategy_on_every_store() {
    strategies::<Gcra>([6, 12, 12], [5, 3, 3]);
}

#[test]
fn token_bucket_carries_by_each_strategy_on_every_store() {
    strategies::<TokenBucket>([6, 12, 12], [5, 3, 3]);
}

#[test]
fn fixed_window_carries_by_each_strategy_on_every_store() {
    strategies::<FixedWindow>([6, 12, 16], [5, 3, 1]);
}

#[test]
fn sliding_window_counter_carries_by_each_strategy_on_every_store() {
    strategies::<SlidingWindowCounter>([6, 12, 16], [5, 3, 1]);
}

#[test]
fn sliding_log_carries_by_each_strategy_on_every_store() {
    strategies::<SlidingWindowLog>([6, 12, 16], [5, 3, 1]);
}

/// 64 threads hammer 8 keys on a frozen clock while the quota is raised
/// from 100 000 to 200 000 a minute, once they have taken a tenth of the old
/// one. Each admission tells the quota that decided it
/// (its limit): a key that took `u` units under the old quota takes
/// exactly what the strategy leaves it under the new one, whenever the
/// change fell.
fn hammered(carry: Carry, left: impl Fn(u32) -> u32) {
    const KEYS: usize = 8;
    const OLD: u32 = 100_000;
    const THREADS: usize = 64;
    let limiter = Arc::new(
        Builder::new(per_minute(OLD))
            .clock(ManualClock::new())
            .build::<usize>(),
    );
    let old: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let new: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let start = Arc::new(Barrier::new(THREADS));
    // The admission that brings the old quota's total to a tenth of the
    // keys' bursts makes its thread change the quota, amid the others.
    let taken = Arc::new(AtomicU32::new(0));
    let threads: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (limiter, old, new, start, taken) = (
                Arc::clone(&limiter),
                Arc::clone(&old),
                Arc::clone(&new),
                Arc::clone(&start),
                Arc::clone(&taken),
            );
            std::thread::spawn(move || {
                start.wait();
                // Keep checking until every key denies under the new quota.
                let mut denied_new = [false; KEYS];
                let mut round = thread;
                while denied_new.iter().any(|denied| !denied) {
                    let key = round % KEYS;
                    round += 1;
                    let decision = limiter.check(&key).unwrap();
                    let counts = match decision.limit() {
                        OLD => &old,
                        limit if limit == 2 * OLD => &new,
                        other => panic!("a limit of {other}"),
                    };
                    if decision.is_allowed() {
                        counts[key].fetch_add(1, Ordering::Relaxed);
                        if decision.limit() == OLD
                            && taken.fetch_add(1, Ordering::Relaxed) + 1 == OLD * 8 / 10
                        {
                            limiter.set_quota(per_minute(2 * OLD), carry).unwrap();
                        }
                    } else if decision.limit() == 2 * OLD {
                        denied_new[key] = true;
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    // The change fell while keys were part-used, or the test shows nothing.
    let part_used = old
        .iter()
        .filter(|count| (1..OLD).contains(&count.load(Ordering::Relaxed)))
        .count();
    let counts: Vec<u32> = old
        .iter()
        .map(|count| count.load(Ordering::Relaxed))
        .collect();
    assert!(
        part_used > 0,
        "every key was drained or untouched at the change: {counts:?}"
    );
    for key in 0..KEYS {
        let (old, new) = (
            old[key].load(Ordering::Relaxed),
            new[key].load(Ordering::Relaxed),
        );
        assert!(old <= OLD, "key {key}: {old} under the old quota");
        assert_eq!(
            new,
            left(old),
            "key {key}: {old} before, {new} after ({carry:?})"
        );
    }
}

#[test]
fn a_change_under_64_threads_keeps_exact_counts_as_is() {
    // Used u > 0 keeps its 100 000 − u free; a key untouched before gets
    // 200 000.
    hammered(Carry::AsIs, |used| {
        if used == 0 { 200_000 } else { 100_000 - used }
    });
}

#[test]
fn a_change_under_64_threads_keeps_exact_counts_in_proportion() {
    hammered(Carry::Proportional, |used| 200_000 - 2 * used);
}

/// Reservations waiting when the quota is cut keep their slots; the key's
/// booked time, theirs in it, is carried, so a check after the change
/// waits behind them at the new rate.
#[test]
fn reservations_keep_their_slots_across_a_change() {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(10));
    let limiter = Builder::new(Quota::per_second(1).unwrap())
        .clock(clock.clone())
        .build::<String>();
    let max_wait = Duration::from_secs(10);
    let mut first = limiter.reserve_n("k", 1, max_wait).unwrap();
    let second = limiter.reserve_n("k", 1, max_wait).unwrap();
    let third = limiter.reserve_n("k", 1, max_wait).unwrap();
    assert!(first.is_ready());
    assert_eq!(second.wait(), Duration::from_secs(1));
    assert_eq!(third.wait(), Duration::from_secs(2));
    // Cut to one every two seconds: of the 3 s booked, the tolerance's 1 s
    // is carried in proportion to the new tolerance (2 s), and the 2 s the
    // waiting reservations booked beyond it are kept as they are: 4 s.
    limiter
        .set_quota(
            Quota::new(1, Duration::from_secs(2)).unwrap(),
            Carry::Proportional,
        )
        .unwrap();
    assert_eq!(second.wait(), Duration::from_secs(1));
    assert_eq!(third.wait(), Duration::from_secs(2));
    let denied = limiter.check("k").unwrap();
    assert!(!denied.is_allowed());
    // A unit fits once the debt is down to the tolerance less its cost
    // (2 s − 2 s): in 4 s, one new interval after the last reservation's
    // slot.
    assert_eq!(denied.retry_after(), Duration::from_secs(4));
    // Abandoned after the change, a reservation gives nothing back: its
    // share of the carried time is no longer its cost.
    drop(third);
    assert_eq!(
        limiter.check("k").unwrap().retry_after(),
        Duration::from_secs(4)
    );
    assert_eq!(limiter.waiting_reservations(), 1);
    drop((first, second));
}

/// Before a change, an abandoned reservation gives its units back.
#[test]
fn reservations_abandoned_before_a_change_give_back() {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(10));
    let limiter = Builder::new(Quota::per_second(1).unwrap())
        .clock(clock)
        .build::<String>();
    let max_wait = Duration::from_secs(10);
    let first = limiter.reserve_n("k", 1, max_wait).unwrap();
    let second = limiter.reserve_n("k", 1, max_wait).unwrap();
    drop(second);
    limiter
        .set_quota(
            Quota::new(1, Duration::from_secs(2)).unwrap(),
            Carry::Proportional,
        )
        .unwrap();
    // 1 s booked, carried to 2 s: the tolerance, so a unit waits 2 s.
    assert_eq!(
        limiter.check("k").unwrap().retry_after(),
        Duration::from_secs(2)
    );
    drop(first);
}

/// A receipt from before a change gives nothing back after it: its
/// charge was counted by the old quota.
#[test]
fn receipts_do_not_cross_a_change() {
    let limiter = used_four::<Gcra, _>(LockFree::default());
    let (decision, receipt) = limiter.check_n_receipt("used", 1).unwrap();
    assert!(decision.is_allowed());
    limiter.set_quota(per_minute(20), Carry::AsIs).unwrap();
    assert_eq!(limiter.refund("used", receipt.unwrap()), Refund::Nothing);
    // 5 of 10 used, as is: 5 left.
    assert_eq!(drain(&limiter, "used"), 5);
}

/// A direct limiter's receipts do not cross its change either, and its
/// window algorithms keep their window.
#[test]
fn a_direct_limiter_s_receipts_and_window_stay_with_their_quota() {
    let mut limiter = Builder::new(per_minute(10))
        .clock(ManualClock::new())
        .build_direct();
    let (decision, receipt) = limiter.check_n_receipt(1).unwrap();
    assert!(decision.is_allowed());
    limiter.set_quota(per_minute(20), Carry::AsIs).unwrap();
    assert_eq!(limiter.refund(receipt.unwrap()), Refund::Nothing);
    // 1 of 10 used, as is: 9 left of 20.
    let mut admitted = 0;
    while limiter.check().unwrap().is_allowed() {
        admitted += 1;
    }
    assert_eq!(admitted, 9);

    let mut windowed = Builder::new(per_minute(10))
        .algorithm::<FixedWindow>()
        .clock(ManualClock::new())
        .build_direct();
    assert!(windowed.check().unwrap().is_allowed());
    assert_eq!(
        windowed.set_quota(Quota::per_second(10).unwrap(), Carry::AsIs),
        Err(ChangeError::Layout(LayoutError::WindowDiffers {
            limiter: Duration::from_secs(60),
            quota: Duration::from_secs(1),
        }))
    );
    assert_eq!(*windowed.quota(), per_minute(10));
    assert_eq!(windowed.peek().unwrap().remaining(), 8);
}

/// A window algorithm keeps its window: another is refused, and nothing
/// changes.
#[test]
fn a_change_of_window_is_refused_and_changes_nothing() {
    let limiter = used_four::<FixedWindow, _>(LockFree::default());
    assert_eq!(
        limiter.set_quota(Quota::per_second(10).unwrap(), Carry::AsIs),
        Err(ChangeError::Layout(LayoutError::WindowDiffers {
            limiter: Duration::from_secs(60),
            quota: Duration::from_secs(1),
        }))
    );
    assert_eq!(limiter.quota(), per_minute(10));
    assert_eq!(drain(&limiter, "used"), 6);
}

/// A change to the quota a limiter already has keeps every key exactly as
/// it was, by every strategy, as Redis's script does (it carries a key
/// only when the span or the burst differs): the decisions after it equal
/// those of a limiter never changed, even once the clock steps back to
/// before the instant of the change. A carry that rewrote a state as read
/// at the change (a window rolled on, a refill time moved) would decide
/// otherwise there.
fn a_change_to_the_same_quota_changes_nothing<A: Algorithm>()
where
    LockFree: StoreKind<String, A>,
{
    // 4 a burst window of 4 s: windows [3600 s, 3604 s), [3604 s, 3608 s).
    let quota = Quota::new(4, Duration::from_secs(4)).unwrap();
    let at = |ms: u64| ms * 1_000_000;
    for carry in [Carry::AsIs, Carry::Proportional, Carry::Unchanged] {
        let clock = ManualClock::new();
        let build = || {
            Builder::new(quota)
                .algorithm::<A>()
                .clock(clock.clone())
                .build::<String>()
        };
        let (changed, kept) = (build(), build());
        let mut decisions = [Vec::new(), Vec::new()];
        // Two units at the first window's start and two late in it; the
        // change half a second into the next window (the first two have
        // left a log, the refill has moved on); then readings back in the
        // first window and on.
        let steps = [
            (3_600_000, 2, false),
            (3_603_500, 2, false),
            (3_604_500, 0, true),
            (3_603_600, 1, false),
            (3_603_000, 2, false),
            (3_604_000, 1, false),
            (3_605_000, 1, false),
            (3_606_500, 2, false),
        ];
        for (ms, cost, change) in steps {
            clock.set_ns(at(ms));
            if change {
                changed.set_quota(quota, carry).unwrap();
                continue;
            }
            for (limiter, decisions) in [&changed, &kept].into_iter().zip(&mut decisions) {
                decisions.push(limiter.check_n("key", cost).unwrap());
            }
        }
        assert_eq!(
            decisions[0],
            decisions[1],
            "{} by {carry:?}",
            std::any::type_name::<A>()
        );
        assert!(
            decisions[0].iter().any(|decision| !decision.is_allowed()),
            "the trace reaches a denial"
        );
    }
}

#[test]
fn a_change_to_the_same_quota_keeps_every_key_as_it_was() {
    a_change_to_the_same_quota_changes_nothing::<Gcra>();
    a_change_to_the_same_quota_changes_nothing::<TokenBucket>();
    a_change_to_the_same_quota_changes_nothing::<FixedWindow>();
    a_change_to_the_same_quota_changes_nothing::<SlidingWindowCounter>();
    a_change_to_the_same_quota_changes_nothing::<SlidingWindowLog>();
}

/// The bursts whose interval over a minute is a whole number of
/// nanoseconds, so that the reference below is exact.
const BURSTS: [u32; 16] = [1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 16, 20, 24, 25, 30, 48];

/// What a key that used `used` of `from` a minute has free after a change
/// to `to` by `carry`, on a frozen clock: the reference the proptest holds
/// every algorithm to. `booked`: the algorithm keeps refill time (GCRA,
/// the token bucket), which `Unchanged` reads in the new intervals.
fn reference(from: u32, to: u32, used: u32, carry: Carry, booked: bool) -> u32 {
    if used == 0 {
        return to;
    }
    match carry {
        Carry::AsIs => (from - used).min(to),
        Carry::Proportional => to - (used * to).div_ceil(from),
        _ if booked => {
            // `used` intervals of 60/from s, read in intervals of 60/to s.
            let (interval, interval_to) = (60_000 / from, 60_000 / to);
            (to * interval_to).saturating_sub(used * interval) / interval_to
        }
        _ => to.saturating_sub(used),
    }
}

fn carries_as_the_reference<A: Algorithm>(
    from: u32,
    to: u32,
    used: u32,
    carry: Carry,
    booked: bool,
) -> Result<(), proptest::test_runner::TestCaseError>
where
    LockFree: StoreKind<String, A>,
{
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(3_600));
    let limiter = Builder::new(per_minute(from))
        .algorithm::<A>()
        .clock(clock)
        .build::<String>();
    for _ in 0..used {
        proptest::prop_assert!(limiter.check("k").unwrap().is_allowed());
    }
    limiter.set_quota(per_minute(to), carry).unwrap();
    let after = drain(&limiter, "k");
    proptest::prop_assert_eq!(after, reference(from, to, used, carry, booked));
    // The bound: the window spanning the change admits at most the larger
    // burst (nothing refills on a frozen clock).
    proptest::prop_assert!(used + after <= from.max(to));
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Every algorithm carries a key as the reference says, for bursts
    /// raised and cut, every use and every strategy.
    #[test]
    fn every_algorithm_carries_as_the_reference(
        from in proptest::sample::select(&BURSTS[..]),
        to in proptest::sample::select(&BURSTS[..]),
        used_share in 0.0..=1.0_f64,
        carry in proptest::sample::select(&[Carry::AsIs, Carry::Proportional, Carry::Unchanged][..]),
    ) {
        // The share of the burst used, rounded: 0 to `from`.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let used = (f64::from(from) * used_share).round() as u32;
        carries_as_the_reference::<Gcra>(from, to, used, carry, true)?;
        carries_as_the_reference::<TokenBucket>(from, to, used, carry, true)?;
        carries_as_the_reference::<FixedWindow>(from, to, used, carry, false)?;
        carries_as_the_reference::<SlidingWindowCounter>(from, to, used, carry, false)?;
        carries_as_the_reference::<SlidingWindowLog>(from, to, used, carry, false)?;
    }
}

/// A clock shared by every thread, whose next reading on a thread armed
/// with `ARMED` reports itself and waits to be released.
#[derive(Clone)]
struct Paused(Arc<std::sync::atomic::AtomicU64>);

/// How many readings to let pass, where to report the next one, and what
/// releases it.
type Arm = (
    usize,
    std::sync::mpsc::Sender<u64>,
    std::sync::mpsc::Receiver<()>,
);

thread_local! {
    static ARMED: std::cell::RefCell<Option<Arm>> = const { std::cell::RefCell::new(None) };
}

impl tollgate::clock::Clock for Paused {
    fn now_ns(&self) -> u64 {
        let now = self.0.load(Ordering::SeqCst);
        ARMED.with(|armed| {
            let mut armed = armed.borrow_mut();
            match armed.as_mut() {
                Some((0, _, _)) => {
                    let (_, read, release) = armed.take().expect("armed");
                    read.send(now).unwrap();
                    release.recv().unwrap();
                }
                Some((skip, _, _)) => *skip -= 1,
                None => {}
            }
        });
        now
    }

    fn ordered(&self) -> bool {
        true
    }

    /// One word, as `ManualClock`: readings in order exactly.
    fn disorder_ns(&self) -> u64 {
        0
    }
}

/// A key drained after the change began (its first clock reading) but
/// before its shard moved: the change reads the clock again for each
/// shard, once its states are frozen, so the key is carried at the instant
/// it was drained at.
fn drained_during_a_change<S: StoreKind<String, Gcra> + 'static>(store: S) -> (u32, u32) {
    let t0 = 1_000_000_000_000_u64;
    let time = Arc::new(std::sync::atomic::AtomicU64::new(t0));
    // 1 a second, burst 10; then 100 a second, burst 10, as is.
    let old = Quota::per_second(1).unwrap().with_burst(10).unwrap();
    let new = Quota::per_second(100).unwrap().with_burst(10).unwrap();
    let limiter = Arc::new(
        Builder::new(old)
            .clock(Paused(Arc::clone(&time)))
            .store(store)
            .build::<String>(),
    );
    let (read_tx, read_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel();
    let changer = {
        let limiter = Arc::clone(&limiter);
        std::thread::spawn(move || {
            ARMED.with(|armed| *armed.borrow_mut() = Some((0, read_tx, release_rx)));
            limiter.set_quota(new, Carry::AsIs).unwrap();
        })
    };
    assert_eq!(read_rx.recv().unwrap(), t0);
    time.store(t0 + 100_000_000, Ordering::SeqCst);
    let before = drain(&limiter, "k");
    release_tx.send(()).unwrap();
    changer.join().unwrap();
    (before, drain(&limiter, "k"))
}

#[test]
fn a_key_drained_while_a_change_runs_is_carried_at_its_instant() {
    for (store, outcome) in [
        ("lock-free", drained_during_a_change(LockFree::default())),
        ("sharded", drained_during_a_change(Sharded::default())),
        ("per-key", drained_during_a_change(PerKey::new())),
    ] {
        // Drained, it keeps 0 free as is, at the same instant.
        assert_eq!(outcome, (10, 0), "{store}");
    }
}

/// Keys checked under quotas of their own (tiers) are not the limiter's
/// quota's to rescale: a change as is or in proportion is refused, and
/// one that keeps every state unchanged leaves a drained tier key drained.
#[test]
fn a_limiter_whose_checks_carry_quotas_changes_only_unchanged() {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(3_600));
    let pro = per_minute(100);
    let limiter = Builder::new(per_minute(10))
        .algorithm::<FixedWindow>()
        .clock(clock)
        .build::<String>();
    let mut admitted = 0;
    while limiter.check_with("paying", &pro).unwrap().is_allowed() {
        admitted += 1;
    }
    assert_eq!(admitted, 100);
    for carry in [Carry::AsIs, Carry::Proportional] {
        assert_eq!(
            limiter.set_quota(per_minute(5), carry),
            Err(ChangeError::CarriedQuotas)
        );
    }
    assert_eq!(limiter.quota(), per_minute(10));
    limiter.set_quota(per_minute(5), Carry::Unchanged).unwrap();
    assert!(!limiter.check_with("paying", &pro).unwrap().is_allowed());
    // The mark goes on with the generation.
    assert_eq!(
        limiter.set_quota(per_minute(20), Carry::AsIs),
        Err(ChangeError::CarriedQuotas)
    );
}

static STALL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

thread_local! {
    static STALLER: std::cell::RefCell<Option<std::sync::mpsc::Sender<()>>> =
        const { std::cell::RefCell::new(None) };
}

/// A key whose comparison, on a thread armed with `STALLER`, blocks while
/// `STALL` is set: a check stalled inside the lock-free store.
#[derive(Clone, Debug)]
struct Stalling(u64);

impl std::hash::Hash for Stalling {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl PartialEq for Stalling {
    fn eq(&self, other: &Self) -> bool {
        if let Some(entered) = STALLER.with(|staller| staller.borrow_mut().take()) {
            entered.send(()).unwrap();
            while STALL.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.0 == other.0
    }
}

impl Eq for Stalling {}

/// A check stalled inside the lock-free store delays no change without a
/// bound: a change goes past the shard's replaced tables by one, a second
/// during the same stall is refused (nothing changed), and `quota` answers
/// throughout.
#[test]
fn a_stalled_check_holds_back_no_change_for_ever() {
    let limiter: Arc<RateLimiter<Stalling, Gcra, ManualClock, LockFree>> = Arc::new(
        Builder::new(Quota::per_second(10).unwrap())
            .clock(ManualClock::new())
            .store(LockFree::new(1))
            .build(),
    );
    assert!(limiter.check(&Stalling(1)).unwrap().is_allowed());
    STALL.store(true, Ordering::SeqCst);
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let stalled = {
        let limiter = Arc::clone(&limiter);
        std::thread::spawn(move || {
            STALLER.with(|staller| *staller.borrow_mut() = Some(entered_tx));
            assert!(limiter.check(&Stalling(1)).unwrap().is_allowed());
        })
    };
    entered_rx.recv().unwrap();
    let mut outcomes = Vec::new();
    for per_second in [20, 30, 40, 50] {
        outcomes.push(limiter.set_quota(Quota::per_second(per_second).unwrap(), Carry::AsIs));
        // Answers while the stall lasts.
        let _ = limiter.quota();
    }
    STALL.store(false, Ordering::SeqCst);
    stalled.join().unwrap();
    // The shard starts with no replaced table: two changes keep one each,
    // the third goes past the bound by one, the fourth is refused.
    assert_eq!(
        outcomes,
        vec![Ok(()), Ok(()), Ok(()), Err(ChangeError::Reclaiming)]
    );
    assert_eq!(limiter.quota(), Quota::per_second(40).unwrap());
    // Once the stall ends, changes go on.
    limiter
        .set_quota(Quota::per_second(50).unwrap(), Carry::AsIs)
        .unwrap();
}

/// The first check that carries a quota lands while a change runs, on a
/// shard not yet moved: that shard is carried unchanged, and so is every
/// later change's (the new generation is marked too).
#[test]
fn a_first_tier_check_racing_a_change_marks_the_new_generation() {
    use std::hash::BuildHasher;

    let hasher = foldhash::fast::FixedState::with_seed(7);
    // Two shards: the shard of a key is bit 32 of its hash.
    let shard = |key: &str| (hasher.hash_one(key) >> 32) & 1;
    let used = (0..)
        .map(|n| format!("used-{n}"))
        .find(|key| shard(key) == 0)
        .unwrap();
    let tier = (0..)
        .map(|n| format!("tier-{n}"))
        .find(|key| shard(key) == 1)
        .unwrap();
    let time = Arc::new(std::sync::atomic::AtomicU64::new(1_000_000_000_000));
    let limiter = Arc::new(
        Builder::new(per_minute(10))
            .clock(Paused(Arc::clone(&time)))
            .store(LockFree::new(2).with_hasher(hasher))
            .build::<String>(),
    );
    assert!(limiter.check(used.as_str()).unwrap().is_allowed());
    let (read_tx, read_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel();
    let changer = {
        let limiter = Arc::clone(&limiter);
        std::thread::spawn(move || {
            // The change's first reading is its probe, the second the
            // first shard's, under that shard's lock.
            ARMED.with(|armed| *armed.borrow_mut() = Some((1, read_tx, release_rx)));
            limiter.set_quota(per_minute(20), Carry::AsIs).unwrap();
        })
    };
    read_rx.recv().unwrap();
    // Shard 0 is being moved; shard 1 still holds the old generation.
    let pro = per_minute(100);
    assert!(
        limiter
            .check_with(tier.as_str(), &pro)
            .unwrap()
            .is_allowed()
    );
    release_tx.send(()).unwrap();
    changer.join().unwrap();
    // The first shard was carried as is: 1 of 10 used, 9 left of 20.
    assert_eq!(drain(&limiter, &used), 9);
    // The tier key's shard unchanged, and the next change refused as is.
    assert_eq!(
        limiter.set_quota(per_minute(40), Carry::AsIs),
        Err(ChangeError::CarriedQuotas)
    );
}

/// A peek under a quota of its own writes nothing, and leaves the limiter
/// free to change as is.
#[test]
fn a_peek_under_a_quota_of_its_own_does_not_mark() {
    let limiter = used_four::<Gcra, _>(LockFree::default());
    assert!(
        limiter
            .peek_with("used", &per_minute(100))
            .unwrap()
            .is_allowed()
    );
    limiter.set_quota(per_minute(20), Carry::AsIs).unwrap();
    assert_eq!(drain(&limiter, "used"), 6);
}
