//! shuttle tests: the keyed limiter with 3–8 threads on hot and distinct
//! keys, under shuttle's random scheduler and its PCT scheduler (depth 3),
//! 10 000 executions each. The stores here are the ones shuttle can see
//! into: `PerKey` (the lock-free store's stand-in: the same retire-then-unlink
//! protocol, whose lock is a shuttle scheduling point) and the mutex stores.
//! Canaries (the racy cell, check-then-insert with two fresh cells) must be
//! caught at the same settings.
//!
//! Run: `cargo test --release --features shuttle --test shuttle`.

#![cfg(feature = "shuttle")]

#[path = "schedules.rs"]
mod schedules;

use std::collections::HashMap;

use shuttle::sync::atomic::{AtomicU64, Ordering};
use shuttle::sync::{Arc, Mutex};
use shuttle::thread;
use tollgate::algorithm::{Algorithm, Gcra, PackedAlgorithm, TokenBucket, Verdict};
use tollgate::clock::ManualClock;
use tollgate::store::{GlobalMutex, PerKey, Sharded, StoreKind};
use tollgate::{Builder, Quota, RateLimiter};

const EXECUTIONS: usize = 10_000;

/// Runs `test` under the random scheduler, then under PCT, each for
/// `EXECUTIONS` executions, and prints the time taken.
fn both_schedulers(name: &str, test: impl Fn() + Send + Sync + Clone + 'static) {
    schedules::random_then_pct(name, EXECUTIONS, test);
}

fn limiter<A: Algorithm, S: StoreKind<u64, A>>(
    quota: Quota,
    store: S,
) -> Arc<RateLimiter<u64, A, ManualClock, S>> {
    Arc::new(
        Builder::new(quota)
            .algorithm::<A>()
            .store(store)
            .clock(ManualClock::new())
            .build(),
    )
}

/// `threads` threads × `checks` unit checks on one key with a burst of
/// `burst` and a frozen clock: exactly `burst` admitted.
fn hot_key<A: Algorithm, S: StoreKind<u64, A> + Default>(
    threads: usize,
    checks: usize,
    burst: u32,
) {
    let limiter = limiter::<A, S>(Quota::per_hour(burst).unwrap(), S::default());
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                (0..checks)
                    .filter(|_| limiter.check(&0).unwrap().is_allowed())
                    .count()
            })
        })
        .collect();
    let admitted: usize = handles
        .into_iter()
        .map(|handle| handle.join().unwrap())
        .sum();
    assert_eq!(
        admitted, burst as usize,
        "hot key: admitted {admitted} against a burst of {burst}"
    );
}

#[test]
fn hot_key_gcra_per_key_four_threads() {
    both_schedulers("hot key, GCRA, per-key, 4 threads", || {
        hot_key::<Gcra, PerKey>(4, 3, 5)
    });
}

#[test]
fn hot_key_token_bucket_per_key_three_threads() {
    both_schedulers("hot key, token bucket, per-key, 3 threads", || {
        hot_key::<TokenBucket, PerKey>(3, 3, 4);
    });
}

#[test]
fn hot_key_gcra_sharded_eight_threads() {
    both_schedulers("hot key, GCRA, sharded, 8 threads", || {
        hot_key::<Gcra, Sharded>(8, 2, 5)
    });
}

/// Eight threads, each with its own key (burst 2, checked 3 times) and one
/// shared key (checked once each, burst 2): every own key admits exactly 2,
/// the shared key exactly 2 in total.
fn distinct_keys<S: StoreKind<u64, Gcra> + Default>() {
    let limiter = limiter::<Gcra, S>(Quota::per_hour(2).unwrap(), S::default());
    let handles: Vec<_> = (1..=8_u64)
        .map(|own| {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                let own_admitted = (0..3)
                    .filter(|_| limiter.check(&own).unwrap().is_allowed())
                    .count();
                let shared_admitted = usize::from(limiter.check(&0).unwrap().is_allowed());
                (own_admitted, shared_admitted)
            })
        })
        .collect();
    let mut shared = 0;
    for handle in handles {
        let (own_admitted, shared_admitted) = handle.join().unwrap();
        assert_eq!(own_admitted, 2, "an own key admitted {own_admitted}");
        shared += shared_admitted;
    }
    assert_eq!(shared, 2, "the shared key admitted {shared}");
    assert_eq!(limiter.len(), 9);
}

#[test]
fn distinct_keys_per_key_eight_threads() {
    both_schedulers("distinct keys, per-key, 8 threads", distinct_keys::<PerKey>);
}

#[test]
fn distinct_keys_global_mutex_eight_threads() {
    both_schedulers(
        "distinct keys, global mutex, 8 threads",
        distinct_keys::<GlobalMutex>,
    );
}

/// Eviction races checks: key 7 admitted at 0 s and rested at 1 s; three
/// threads check it while a fourth evicts idle keys twice: exactly one
/// admitted (the burst is 1), whether in the old cell or a fresh one.
#[test]
fn eviction_races_checks_per_key() {
    both_schedulers("eviction vs 3 checks, per-key", || {
        let clock = ManualClock::new();
        let limiter = Arc::new(
            Builder::new(Quota::per_second(1).unwrap())
                .store(PerKey::new())
                .clock(clock.clone())
                .build::<u64>(),
        );
        assert!(limiter.check(&7).unwrap().is_allowed());
        clock.set_ns(1_000_000_000);
        let checkers: Vec<_> = (0..3)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                thread::spawn(move || usize::from(limiter.check(&7).unwrap().is_allowed()))
            })
            .collect();
        let evictor = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                limiter.evict_idle();
                limiter.evict_idle();
            })
        };
        evictor.join().unwrap();
        let admitted: usize = checkers
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .sum();
        assert_eq!(
            admitted, 1,
            "eviction: admitted {admitted} from one rested unit"
        );
    });
}

/// Three threads check one key (4 an hour, a frozen clock) four times each
/// while a fourth raises the quota to 8, carried as is. Each admission
/// tells the quota that decided it (its limit): a key that took `u` under
/// the old quota takes exactly `4 − u` under the new (all 8 if `u = 0`), so
/// no admission is lost in a cell the change left behind, none is decided
/// by the wrong quota, and none is carried twice.
fn checks_race_a_change<S: StoreKind<u64, Gcra> + Default>(
    canary: Option<tollgate::canary::Canary>,
) {
    tollgate::canary::plant(canary);
    let limiter = limiter::<Gcra, S>(Quota::per_hour(4).unwrap(), S::default());
    let checkers: Vec<_> = (0..3)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                let (mut old, mut new) = (0_u32, 0_u32);
                for _ in 0..4 {
                    let decision = limiter.check(&0).unwrap();
                    if decision.is_allowed() {
                        match decision.limit() {
                            4 => old += 1,
                            _ => new += 1,
                        }
                    }
                }
                (old, new)
            })
        })
        .collect();
    let changer = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || {
            limiter
                .set_quota(
                    Quota::per_hour(8).unwrap(),
                    tollgate::algorithm::Carry::AsIs,
                )
                .unwrap();
        })
    };
    changer.join().unwrap();
    let (old, new) = checkers
        .into_iter()
        .map(|checker| checker.join().unwrap())
        .fold((0, 0), |(old, new), (o, n)| (old + o, new + n));
    tollgate::canary::plant(None);
    let expected = if old == 0 { 8 } else { 4 - old.min(4) };
    assert!(old <= 4, "a change: {old} admitted under a burst of 4");
    assert_eq!(
        new, expected,
        "a change: {old} under the old quota, then {new} under the new"
    );
}

#[test]
fn checks_race_a_change_per_key() {
    both_schedulers("a change racing checks, per-key", || {
        checks_race_a_change::<PerKey>(None);
    });
}

#[test]
fn checks_race_a_change_sharded() {
    both_schedulers("a change racing checks, sharded", || {
        checks_race_a_change::<Sharded>(None);
    });
}

/// Canary: the per-key store's change copies cells without retiring them.
#[test]
#[should_panic(expected = "a change:")]
fn canary_change_without_retire_is_caught() {
    both_schedulers("canary: change without retire", || {
        checks_race_a_change::<PerKey>(Some(tollgate::canary::Canary::ChangeWithoutRetire));
    });
}

/// Canary: read-decide-write with a plain store. Four threads, a burst of 1.
#[test]
#[should_panic(expected = "racy cell admitted")]
fn canary_racy_cell_is_caught() {
    both_schedulers("canary: racy cell", || {
        let algorithm = Arc::new(Gcra::from_quota(&Quota::per_hour(1).unwrap()));
        let word = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (algorithm, word) = (Arc::clone(&algorithm), Arc::clone(&word));
                thread::spawn(move || {
                    let seen = word.load(Ordering::Relaxed);
                    match algorithm.decide(&algorithm.unpack(seen), 0, 1).unwrap() {
                        Verdict::Allow { admission, .. } => {
                            word.store(algorithm.pack(&admission), Ordering::Relaxed); // the bug
                            1
                        }
                        Verdict::Deny(_) => 0,
                    }
                })
            })
            .collect();
        let admitted: u32 = handles
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .sum();
        assert_eq!(
            admitted, 1,
            "racy cell admitted {admitted} against a burst of 1"
        );
    });
}

/// Canary: check-then-insert that releases the lock between the lookup and
/// the insert. Three threads, one new key, a burst of 1.
#[test]
#[should_panic(expected = "two cells for one key")]
fn canary_check_then_insert_is_caught() {
    both_schedulers("canary: check, unlock, insert", || {
        let algorithm = Arc::new(Gcra::from_quota(&Quota::per_hour(1).unwrap()));
        let map: Arc<Mutex<HashMap<u64, Arc<AtomicU64>>>> = Arc::new(Mutex::new(HashMap::new()));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let (algorithm, map) = (Arc::clone(&algorithm), Arc::clone(&map));
                thread::spawn(move || {
                    let existing = map.lock().unwrap().get(&9).cloned();
                    let word = existing.unwrap_or_else(|| {
                        let fresh = Arc::new(AtomicU64::new(0)); // the bug: lock released
                        map.lock().unwrap().insert(9, Arc::clone(&fresh));
                        fresh
                    });
                    let seen = word.load(Ordering::Relaxed);
                    match algorithm.decide(&algorithm.unpack(seen), 0, 1).unwrap() {
                        Verdict::Allow { admission, .. } => u32::from(
                            word.compare_exchange(
                                seen,
                                algorithm.pack(&admission),
                                Ordering::Relaxed,
                                Ordering::Relaxed,
                            )
                            .is_ok(),
                        ),
                        Verdict::Deny(_) => 0,
                    }
                })
            })
            .collect();
        let admitted: u32 = handles
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .sum();
        assert_eq!(admitted, 1, "two cells for one key: admitted {admitted}");
    });
}

/// The reservation protocol (`tollgate::wait`) under concurrency: on a
/// key drained at `t0`, two waiters keep their reservations; two others
/// look once (counting an admission if their slot has come) and give
/// theirs up; a thread checks; and one moves the clock on by an interval,
/// at any point of the schedule. Whatever the interleaving:
///
/// * the admitted slots (the kept ones, and the given-up ones that were
///   seen due, hence kept too) are the next ones after `t0`, one interval
///   apart, none twice (nothing over-admitted, nothing lost to the
///   abandoned ones);
/// * a reservation after them all takes the slot right after the last.
fn waiting(canary: Option<tollgate::canary::Canary>) {
    use std::time::Duration;

    use shuttle::sync::atomic::AtomicUsize;

    tollgate::canary::plant(canary);
    let interval = Duration::from_millis(100);
    let t0 = Duration::from_secs(100);
    let clock = ManualClock::new();
    clock.set(t0);
    let limiter = Arc::new(
        Builder::new(Quota::per_second(10).unwrap().with_burst(2).unwrap())
            .clock(clock.clone())
            .build::<u64>(),
    );
    for _ in 0..2 {
        assert!(limiter.check(&7).unwrap().is_allowed());
    }
    // The instant a reservation's slot is, from a reading and its wait.
    let slot_of = |clock: &ManualClock, wait: Duration| {
        Duration::from_nanos(tollgate::clock::Clock::now_ns(clock)) + wait
    };
    let given_up = Arc::new(AtomicUsize::new(0));
    let keepers: Vec<_> = (0..2)
        .map(|_| {
            let (limiter, given_up, clock) =
                (Arc::clone(&limiter), Arc::clone(&given_up), clock.clone());
            thread::spawn(move || {
                let kept = limiter.reserve_n(&7, 1, Duration::from_secs(10)).unwrap();
                // Once the others have given up and the clock has moved, so
                // that the clock holds still while the slot is read.
                while given_up.load(Ordering::Acquire) < 3 {
                    thread::yield_now();
                }
                let slot = slot_of(&clock, kept.wait());
                // Kept to the end: its units stay reserved.
                std::mem::forget(kept);
                slot
            })
        })
        .collect();
    let quitters: Vec<_> = (0..2)
        .map(|_| {
            let (limiter, given_up, clock) =
                (Arc::clone(&limiter), Arc::clone(&given_up), clock.clone());
            thread::spawn(move || {
                let mut reservation = limiter.reserve_n(&7, 1, Duration::from_secs(10)).unwrap();
                // Seen due: admitted, and kept however it is dropped.
                let admitted = reservation
                    .is_ready()
                    .then(|| slot_of(&clock, Duration::ZERO));
                drop(reservation);
                given_up.fetch_add(1, Ordering::Release);
                admitted
            })
        })
        .collect();
    let checker = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.check(&7).unwrap().is_allowed())
    };
    let advancer = {
        let (clock, given_up) = (clock.clone(), Arc::clone(&given_up));
        thread::spawn(move || {
            clock.advance(interval);
            given_up.fetch_add(1, Ordering::Release);
        })
    };
    let seen_due: Vec<Duration> = quitters
        .into_iter()
        .filter_map(|quitter| quitter.join().unwrap())
        .collect();
    advancer.join().unwrap();
    let checked = checker.join().unwrap();
    let mut kept: Vec<Duration> = keepers
        .into_iter()
        .map(|keeper| keeper.join().unwrap())
        .collect();
    kept.sort();
    let next = limiter.reserve_n(&7, 1, Duration::from_secs(10)).unwrap();
    let next_slot = slot_of(&clock, next.wait());
    std::mem::forget(next);
    // The slots before the kept ones went to admissions that came due by
    // the clock step (one slot, at `t0 + interval`, can): a check, or a
    // given-up reservation seen due, or dropped once due without being
    // looked at again.
    let first = kept[0];
    let held = (first.saturating_sub(t0).as_nanos() / interval.as_nanos()).saturating_sub(1);
    assert!(
        held <= 1 && held >= (seen_due.len() + usize::from(checked)) as u128,
        "the slots: {held} held before the kept ones, {} seen due, check admitted: {checked}",
        seen_due.len()
    );
    assert_eq!(
        (kept, next_slot),
        (vec![first, first + interval], first + interval * 2),
        "the slots: kept reservations on the next ones, the one after them next"
    );
}

#[test]
fn waiting_keeps_order_and_loses_no_slot() {
    both_schedulers("waiting: 2 kept, 2 given up, a check, a clock step", || {
        waiting(None);
    });
}

#[test]
#[should_panic(expected = "the slots")]
fn canary_cancel_without_shift_is_caught() {
    both_schedulers("canary: cancel without shift", || {
        waiting(Some(tollgate::canary::Canary::CancelWithoutShift));
    });
}

#[test]
#[should_panic(expected = "the slots")]
fn canary_cancel_without_refund_is_caught() {
    both_schedulers("canary: cancel without refund", || {
        waiting(Some(tollgate::canary::Canary::CancelWithoutRefund));
    });
}

/// A storm of abandoned reservations behind one waiter: the waiter holds
/// the front slot with the clock frozen while two threads each make and
/// drop three reservations behind it. Whatever the interleaving:
///
/// * at every instant after a thread's drop, the queue holds at most the
///   front and the other thread's one (what callers hold);
/// * at the end it holds the front alone, and the next reservation takes
///   the slot right after it (every storm slot was given back).
fn storm(canary: Option<tollgate::canary::Canary>) {
    use std::time::Duration;

    tollgate::canary::plant(canary);
    let interval = Duration::from_millis(100);
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(100));
    let limiter = Arc::new(
        Builder::new(Quota::per_second(10).unwrap().with_burst(1).unwrap())
            .clock(clock.clone())
            .build::<u64>(),
    );
    assert!(limiter.check(&7).unwrap().is_allowed());
    let front = limiter.reserve_n(&7, 1, Duration::from_secs(10)).unwrap();
    assert_eq!(front.wait(), interval);
    let stormers: Vec<_> = (0..2)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || {
                for _ in 0..3 {
                    drop(limiter.reserve_n(&7, 1, Duration::from_secs(10)).unwrap());
                    let queued = limiter.waiting_reservations();
                    assert!(queued <= 2, "the storm: {queued} queued behind one waiter");
                }
            })
        })
        .collect();
    for stormer in stormers {
        stormer.join().unwrap();
    }
    let next = limiter.reserve_n(&7, 1, Duration::from_secs(10)).unwrap();
    assert_eq!(
        (limiter.waiting_reservations(), front.wait(), next.wait()),
        (2, interval, interval * 2),
        "the storm: the front and the next alone queued, back to back"
    );
}

#[test]
fn a_cancel_storm_leaves_only_the_held_reservations() {
    both_schedulers(
        "waiting: a storm of 2 x 3 dropped behind one waiter",
        || {
            storm(None);
        },
    );
}

#[test]
#[should_panic(expected = "the storm")]
fn canary_cancel_keeps_entry_is_caught() {
    both_schedulers("canary: cancel keeps its entry", || {
        storm(Some(tollgate::canary::Canary::CancelKeepsEntry));
    });
}
