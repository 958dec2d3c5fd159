//! The workloads that churn a store's keys, written once: `tests/memory.rs`
//! asserts the memory bound on them, and the lab (`lab/src/memory.rs`)
//! reports their peaks.

use std::time::Duration;

use tollgate::clock::ManualClock;

/// Keys checked in every wave.
pub const STEADY_KEYS: u64 = 5_000;
/// Keys seen once, in one wave only.
pub const ONE_OFF_KEYS_PER_WAVE: u64 = 5_000;

/// The churn that broke the bound in review: each wave advances the clock
/// 2 s, admits 5 000 keys never seen before (one request each), then checks
/// the 5 000 steady keys twice each. With `threads` above 1, each wave's
/// requests are split between that many threads. `check` is one request;
/// `after_wave` runs between waves on the calling thread (to sample the
/// store's size). Keys of wave `w` are `STEADY_KEYS + w × 5 000 + i`.
pub fn waves(
    threads: u64,
    waves: u64,
    clock: &ManualClock,
    check: impl Fn(u64) + Sync,
    mut after_wave: impl FnMut(),
) {
    for wave in 0..waves {
        clock.advance(Duration::from_secs(2));
        let first_one_off = STEADY_KEYS + wave * ONE_OFF_KEYS_PER_WAVE;
        std::thread::scope(|scope| {
            for thread in 0..threads {
                let check = &check;
                scope.spawn(move || {
                    for index in (thread..ONE_OFF_KEYS_PER_WAVE).step_by(threads as usize) {
                        check(first_one_off + index);
                    }
                    for _ in 0..2 {
                        for steady in (thread..STEADY_KEYS).step_by(threads as usize) {
                            check(steady);
                        }
                    }
                });
            }
        });
        after_wave();
    }
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
