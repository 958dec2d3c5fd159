use std::time::Duration;

use super::{Clock, saturating_nanos};
use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering};

/// A clock that moves only when told to: for tests, simulations and models.
///
/// Clones share one time, so a test keeps a clone and moves the time of the
/// limiter that owns the other. It starts at zero.
///
/// ```
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() {
/// use std::time::Duration;
/// use tollgate::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let limiter_side = clock.clone();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(limiter_side.now_ns(), 5_000_000);
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
///
/// # Orderings
///
/// Every access is `Relaxed`. A reading carries no other data with it, so
/// there is nothing for it to publish or acquire; each thread still sees the
/// value only move forward through the modification order of the one atomic
/// (read-read coherence), so a clock that is only advanced never appears to go
/// backwards to any single reader. A thread that reads it before another
/// thread's advance is visible reads the older time, which the limiters
/// tolerate (see [`Clock`]).
///
/// It is [`ordered`](Clock::ordered) until it is first set back
/// ([`set`](ManualClock::set) to an earlier time).
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_ns: Arc<AtomicU64>,
    /// Whether a `set` ever moved the time back: shared by clones, never
    /// cleared.
    set_back: Arc<AtomicBool>,
}

impl ManualClock {
    /// A clock at time zero.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by`, saturating at `u64::MAX` nanoseconds.
    pub fn advance(&self, by: Duration) {
        self.advance_ns(saturating_nanos(by));
    }

    /// Moves the clock forward by `by_ns` nanoseconds, saturating.
    pub fn advance_ns(&self, by_ns: u64) {
        // Relaxed: see the type's documentation. fetch_update is a CAS loop, so
        // concurrent advances are never lost and never wrap.
        let _ = self
            .now_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(now.saturating_add(by_ns))
            });
    }

    /// Sets the clock to `at` after its origin, forwards or backwards.
    ///
    /// Setting it backwards is how tests check that a limiter survives a clock
    /// reading older than its state.
    pub fn set(&self, at: Duration) {
        self.set_ns(saturating_nanos(at));
    }

    /// Sets the clock to `at_ns` nanoseconds after its origin.
    pub fn set_ns(&self, at_ns: u64) {
        // Relaxed: as above.
        if self.now_ns.swap(at_ns, Ordering::Relaxed) > at_ns {
            self.set_back.store(true, Ordering::Relaxed);
        }
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::Relaxed)
    }

    /// Until the time is first set back.
    fn ordered(&self) -> bool {
        !self.set_back.load(Ordering::Relaxed)
    }

    /// None: one word that only moves forward (until it is set back, when
    /// the readings are not ordered at all).
    fn disorder_ns(&self) -> u64 {
        0
    }
}
