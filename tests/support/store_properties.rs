//! Store properties beyond the contract, generic over the store: exact idle
//! eviction, the key cap under a flood and with nothing idle, and growth
//! sweeps that spare a working set. Run over the crate's stores by
//! `tests/stores.rs`, and over the stores on other maps by `peers/tests`.

use std::num::NonZeroUsize;

use tollgate::algorithm::{Algorithm, Gcra};
use tollgate::clock::ManualClock;
use tollgate::store::{GlobalMutex, StoreKind, WhenFull};
use tollgate::{Builder, CheckError, Quota};

use crate::builders::limiter;

/// A deterministic irregular workload: (advance ns, key, cost).
fn workload() -> impl Iterator<Item = (u64, u64, u32)> {
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    (0..20_000).map(move |_| {
        // xorshift64: a fixed sequence, no dependency needed.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let advance_ns = if seed % 5 == 0 {
            seed % 900_000_000
        } else {
            seed % 3_000_000
        };
        (advance_ns, (seed >> 20) % 40, 1 + (seed >> 40) as u32 % 3)
    })
}

/// Eviction removes only keys whose state decides as a fresh key's: the same
/// workload with `evict_idle` after every step makes identical decisions,
/// and it does evict.
pub fn eviction_changes_no_decision<A: Algorithm, S: StoreKind<u64, A>>(store: S) {
    let quota = Quota::per_second(5).unwrap();
    let (clock, evicting_clock) = (ManualClock::new(), ManualClock::new());
    let keeping = limiter::<A, S>(quota, store.clone(), &clock);
    let evicting = limiter::<A, S>(quota, store, &evicting_clock);
    let mut evicted = 0;
    for (step, (advance_ns, key, cost)) in workload().enumerate() {
        clock.advance_ns(advance_ns);
        evicting_clock.advance_ns(advance_ns);
        assert_eq!(
            keeping.check_n(&key, cost),
            evicting.check_n(&key, cost),
            "step {step}"
        );
        evicted += evicting.evict_idle();
    }
    assert!(
        evicted > 1_000,
        "the workload must make keys idle: {evicted}"
    );
    assert!(evicting.len() < keeping.len());
}

/// 2 000 000 distinct keys flood a limiter capped at 100 000 keys while a
/// victim key keeps working: the store never holds more than the cap, idle
/// flood keys are evicted to make room, and the victim's decisions are the
/// ones it gets without any flood.
pub fn flood_respects_the_cap<S: StoreKind<u64, Gcra>>(store: S) {
    const CAP: usize = 100_000;
    let quota = Quota::per_second(10).unwrap();
    let clock = ManualClock::new();
    let flooded = Builder::new(quota)
        .store(store)
        .clock(clock.clone())
        .max_keys(NonZeroUsize::new(CAP).unwrap(), WhenFull::Reject)
        .build::<u64>();
    let quiet_clock = ManualClock::new();
    let quiet = limiter::<Gcra, GlobalMutex>(quota, GlobalMutex, &quiet_clock);
    let victim = u64::MAX;
    let (mut admitted, mut full) = (0_u32, 0_u32);
    for flood_key in 0..2_000_000_u64 {
        // 2 µs per flood request: a flood key is idle 100 ms (one interval)
        // after its request, so 50 000 are live at any time, under the cap.
        clock.advance_ns(2_000);
        quiet_clock.advance_ns(2_000);
        match flooded.check(&flood_key) {
            Ok(decision) => admitted += u32::from(decision.is_allowed()),
            Err(CheckError::StoreFull { max_keys }) => {
                assert_eq!(max_keys, CAP);
                full += 1;
            }
            Err(error) => panic!("{error}"),
        }
        if flood_key % 997 == 0 {
            assert_eq!(
                flooded.check(&victim),
                quiet.check(&victim),
                "flood key {flood_key}"
            );
        }
        if flood_key % 65_536 == 0 {
            assert!(flooded.len() <= CAP, "{} keys", flooded.len());
        }
    }
    assert!(flooded.len() <= CAP);
    // 50 000 live at a time never reach the cap: every flood key admitted.
    assert_eq!((admitted, full), (2_000_000, 0));
}

/// With a frozen clock no key ever becomes idle: exactly `cap` new keys are
/// admitted, every later one is rejected (or admitted untracked), and the
/// keys already held keep their exact budgets.
pub fn cap_is_exact_when_nothing_is_idle<S: StoreKind<u64, Gcra>>(store: S) {
    let quota = Quota::per_hour(2).unwrap();
    let cap = NonZeroUsize::new(1_000).unwrap();
    let rejecting = Builder::new(quota)
        .store(store.clone())
        .clock(ManualClock::new())
        .max_keys(cap, WhenFull::Reject)
        .build::<u64>();
    let admitted = (0..5_000_u64)
        .filter(|key| {
            rejecting
                .check(key)
                .is_ok_and(|decision| decision.is_allowed())
        })
        .count();
    assert_eq!(admitted, 1_000);
    assert_eq!(rejecting.len(), 1_000);
    assert_eq!(
        rejecting.check(&4_999),
        Err(CheckError::StoreFull { max_keys: 1_000 })
    );
    // Held keys are untouched: each has exactly one unit left.
    assert!(rejecting.check(&0).unwrap().is_allowed());
    assert!(!rejecting.check(&0).unwrap().is_allowed());

    let open = Builder::new(quota)
        .store(store)
        .clock(ManualClock::new())
        .max_keys(cap, WhenFull::AdmitUntracked)
        .build::<u64>();
    for key in 0..5_000_u64 {
        assert!(open.check(&key).unwrap().is_allowed());
    }
    assert_eq!(open.len(), 1_000);
    // An untracked key gets a fresh budget every time: the policy's price.
    assert!(open.check(&4_999).unwrap().is_allowed());
    assert!(open.check(&4_999).unwrap().is_allowed());
    assert!(open.check(&4_999).unwrap().is_allowed());
}

/// Growth sweeps evict only keys idle for at least the quota's rest time: a
/// working set checked in rotation (each key idle between its requests) is
/// not evicted and re-inserted while new keys force the table to grow. Found
/// by a benchmark that spent most of its time re-inserting its own keys.
pub fn working_set_survives_growth<S: StoreKind<u64, Gcra>>(store: S) {
    // 1 000 per second, burst 1 000: a key rests (is surely idle) 1 s after
    // its last admission, and is idle 1 ms after a single one.
    let clock = ManualClock::new();
    let limiter = limiter::<Gcra, S>(Quota::per_second(1_000).unwrap(), store, &clock);
    for round in 0..20_u64 {
        for key in 0..500_u64 {
            clock.advance_ns(10_000);
            assert!(limiter.check(&key).unwrap().is_allowed());
        }
        // 1 000 new keys per round force rebuilds and growth sweeps.
        for new_key in 0..1_000_u64 {
            assert!(
                limiter
                    .check(&(1_000_000 + round * 1_000 + new_key))
                    .unwrap()
                    .is_allowed()
            );
        }
    }
    // Nothing has rested for 1 s (the whole run spans 0.1 s): all kept.
    assert_eq!(limiter.len(), 500 + 20 * 1_000);
    clock.advance(std::time::Duration::from_secs(2));
    assert_eq!(limiter.evict_idle(), 20_500);
    assert_eq!(limiter.len(), 0);
}
