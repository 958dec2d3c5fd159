//! The heap's peak while the churn workloads (`waves.rs`) run, measured
//! once for `tests/memory.rs`, which asserts the memory bound on it, and
//! the lab (`lab/src/memory.rs`), which reports it. The binary that includes
//! this file installs `counting_alloc::Counting` as its global allocator and
//! includes `waves.rs`, in modules of those names.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};

use tollgate::algorithm::Gcra;
use tollgate::clock::ManualClock;
use tollgate::store::{StoreKind, WhenFull};
use tollgate::{Builder, CheckError, Quota};

use crate::counting_alloc;
use crate::waves::{flood, waves};

fn live_bytes() -> u64 {
    counting_alloc::live().0
}

/// The settled heap of a limiter on `store` holding `keys` keys of one
/// request each: the live table a peak is measured against. `evict_idle`
/// (nothing is idle) frees the tables its growth replaced; `settle` runs
/// before each reading of the heap (see `churn_peak_settled`).
pub fn table_for<S: StoreKind<u64, Gcra>>(
    store: S,
    quota: Quota,
    keys: u64,
    settle: &dyn Fn(),
) -> u64 {
    settle();
    let before = live_bytes();
    let limiter = Builder::new(quota)
        .store(store)
        .clock(ManualClock::new())
        .build::<u64>();
    for key in 0..keys {
        assert!(limiter.check(&key).expect("unit cost").is_allowed());
    }
    assert_eq!(limiter.evict_idle(), 0);
    settle();
    let settled = live_bytes() - before;
    drop(limiter);
    settled
}

/// The heap's peak while `run` runs (on a clock of its own), above the
/// heap before it, and what it returns.
fn peak_while<R>(run: impl FnOnce(&ManualClock) -> R) -> (u64, R) {
    let clock = ManualClock::new();
    let before = live_bytes();
    counting_alloc::reset_peak();
    let result = run(&clock);
    (counting_alloc::peak() - before, result)
}

/// A run's heap peak against the live table.
#[derive(Debug, Clone, Copy)]
pub struct Peak {
    /// The most bytes live at once during the run, above the heap before
    /// it: measured at every allocation, with no settling.
    pub peak: u64,
    /// The most keys the store held (at the end of a wave, or the cap).
    pub most_keys: u64,
    /// The settled heap of the same store holding `most_keys` keys.
    pub table: u64,
}

impl std::fmt::Display for Peak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "peak {} B against {} B settled for {} keys: {:.2}x",
            self.peak,
            self.table,
            self.most_keys,
            self.ratio()
        )
    }
}

impl Peak {
    /// The peak as a multiple of the live table.
    pub fn ratio(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let ratio = self.peak as f64 / self.table as f64;
        ratio
    }
}

/// [`waves`](crate::waves::waves()) (40 of them) on `store` with `threads` threads, GCRA at one
/// request a second (a burst of 1: a one-off key has rested a second after
/// its request, so each wave's growth sweeps evict the last wave's).
pub fn churn_peak<S: StoreKind<u64, Gcra>>(store: S, threads: u64) -> Peak {
    churn_peak_settled(store, threads, || {})
}

/// [`churn_peak`], running `settle` before the run and before each reading
/// of its live table's heap: for a store whose map frees what it dropped
/// only when a process-wide collector gets round to it (`scc`'s), which
/// would otherwise free earlier work's memory inside a measure.
pub fn churn_peak_settled<S: StoreKind<u64, Gcra>>(
    store: S,
    threads: u64,
    settle: impl Fn(),
) -> Peak {
    let quota = Quota::per_second(1).expect("valid");
    settle();
    let (peak, most_keys) = peak_while(|clock| {
        let limiter = Builder::new(quota)
            .store(store.clone())
            .clock(clock.clone())
            .build::<u64>();
        let mut most_keys = 0;
        // A new key the lock-free store refuses while a descheduled reader
        // holds its replaced tables (`Reclaiming`: rare, and only under
        // load) is no failure of the bound; anything else is.
        waves(
            threads,
            40,
            clock,
            |key| match limiter.check(&key) {
                Ok(_) | Err(CheckError::Reclaiming) => {}
                Err(error) => panic!("key {key}: {error}"),
            },
            || most_keys = most_keys.max(limiter.len() as u64),
        );
        most_keys
    });
    Peak {
        peak,
        most_keys,
        table: table_for(store, quota, most_keys, &settle),
    }
}

/// What a capped flood did.
#[derive(Debug, Clone, Copy)]
pub struct Flood {
    /// The heap against the table for the cap.
    pub peak: Peak,
    /// Flood keys admitted.
    pub admitted: usize,
    /// Flood keys that got `StoreFull`.
    pub full: usize,
    /// Flood keys the lock-free store refused while a descheduled reader
    /// held its replaced tables (`Reclaiming`).
    pub refused: usize,
}

/// [`flood`](crate::waves::flood()) of `keys` keys with `threads` threads on `store` capped at
/// `cap` keys (rejecting), GCRA at 10 a second: a key is idle 100 ms after
/// its request, so at 2 µs a key about 50 000 are live at once.
pub fn flood_peak<S: StoreKind<u64, Gcra>>(store: S, threads: u64, keys: u64, cap: u64) -> Flood {
    let quota = Quota::per_second(10).expect("valid");
    let (admitted, full, refused) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let (peak, ()) = peak_while(|clock| {
        let limiter = Builder::new(quota)
            .store(store.clone())
            .clock(clock.clone())
            .max_keys(
                NonZeroUsize::new(usize::try_from(cap).expect("fits")).expect("nonzero"),
                WhenFull::Reject,
            )
            .build::<u64>();
        flood(threads, keys, clock, |key| {
            // Relaxed: read after the scope joins the threads.
            match limiter.check(&key) {
                Ok(decision) => {
                    assert!(decision.is_allowed());
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                Err(CheckError::StoreFull { .. }) => {
                    full.fetch_add(1, Ordering::Relaxed);
                }
                Err(CheckError::Reclaiming) => {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                Err(error) => panic!("{error}"),
            }
        });
        assert!(limiter.len() as u64 <= cap);
    });
    Flood {
        peak: Peak {
            peak,
            most_keys: cap,
            table: table_for(store, quota, cap, &|| {}),
        },
        admitted: admitted.into_inner(),
        full: full.into_inner(),
        refused: refused.into_inner(),
    }
}
