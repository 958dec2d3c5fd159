use std::time::Instant;

use super::{Clock, saturating_nanos};

/// The default clock: std [`Instant`], counted from the moment the clock was
/// created.
///
/// Its resolution is the platform's monotonic clock (`CLOCK_MONOTONIC` on
/// Linux: nanoseconds); a reading costs a vDSO call, tens of nanoseconds, which
/// is more than a lock-free denial costs.
///
/// ```
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() {
/// use tollgate::clock::{Clock, MonotonicClock};
///
/// let clock = MonotonicClock::new();
/// let first = clock.now_ns();
/// assert!(clock.now_ns() >= first);
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    #[must_use]
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        saturating_nanos(self.origin.elapsed())
    }

    /// `Instant` never runs backwards.
    fn ordered(&self) -> bool {
        true
    }
}
