//! The workloads that churn a store's keys, written once and in terms of a
//! `check` closure only, so that they run against any limiter: the memory
//! tests and the lab (through `churn.rs`).

use std::sync::Barrier;
use std::time::Duration;

use tollgate::clock::ManualClock;

/// Keys checked in every wave.
pub const STEADY_KEYS: u64 = 5_000;
/// Keys seen once, in one wave only.
pub const ONE_OFF_KEYS_PER_WAVE: u64 = 5_000;

/// The churn that breaks the bound of a store that leaves replaced tables
/// waiting in a thread's garbage bag: each wave advances the clock 2 s,
/// admits 5 000 keys never seen before (one request each), then checks the
/// 5 000 steady keys twice each. The requests run on `threads` threads
/// that live for the whole run, as a server's do (a thread that exits can
/// hand its deferred garbage on, which would hide the defect), each
/// taking its share of every wave; between waves, the calling thread moves
/// the clock and runs `after_wave` (to sample the store's size). `check` is
/// one request. Keys of wave `w` are `STEADY_KEYS + w × 5 000 + i`.
pub fn waves(
    threads: u64,
    waves: u64,
    clock: &ManualClock,
    check: impl Fn(u64) + Sync,
    mut after_wave: impl FnMut(),
) {
    let parties = usize::try_from(threads).expect("a thread count") + 1;
    let (start, end) = (Barrier::new(parties), Barrier::new(parties));
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let (check, start, end) = (&check, &start, &end);
            scope.spawn(move || {
                let share = |count: u64| (thread..count).step_by(threads as usize);
                for wave in 0..waves {
                    start.wait();
                    let first_one_off = STEADY_KEYS + wave * ONE_OFF_KEYS_PER_WAVE;
                    for index in share(ONE_OFF_KEYS_PER_WAVE) {
                        check(first_one_off + index);
                    }
                    for _ in 0..2 {
                        for steady in share(STEADY_KEYS) {
                            check(steady);
                        }
                    }
                    end.wait();
                }
            });
        }
        for _ in 0..waves {
            clock.advance(Duration::from_secs(2));
            start.wait();
            end.wait();
            after_wave();
        }
    });
}

/// A flood of `keys` distinct keys, one request each, split between
/// `threads` threads, each advancing the shared clock 2 µs per key it
/// sends: 2 µs per key in all.
pub fn flood(threads: u64, keys: u64, clock: &ManualClock, check: impl Fn(u64) + Sync) {
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let check = &check;
            scope.spawn(move || {
                for key in (thread..keys).step_by(threads as usize) {
                    clock.advance_ns(2_000);
                    check(key);
                }
            });
        }
    });
}
