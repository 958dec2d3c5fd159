use std::fmt;

use super::Clock;

/// A clock on the CPU's time-stamp counter, through `quanta` (feature
/// `tsc`): a reading is an `rdtsc` and a scaling, a few nanoseconds, where
/// [`MonotonicClock`](super::MonotonicClock) costs a vDSO call.
///
/// # Resolution and error
///
/// `quanta` calibrates the counter against the OS monotonic clock when the
/// clock is created, and uses the counter only if the CPU reports an
/// invariant TSC; otherwise it falls back to the OS clock. Readings are
/// nanoseconds scaled from ticks. The scaling's error is the calibration's
/// (parts per million), so over long spans a TSC clock drifts from
/// `Instant` by that much: a quota's rate is enforced to that precision.
/// Readings from one clock are monotonic.
///
/// ```
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() {
/// use tollgate::clock::{Clock, TscClock};
///
/// let clock = TscClock::new();
/// let first = clock.now_ns();
/// assert!(clock.now_ns() >= first);
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
#[derive(Clone)]
pub struct TscClock {
    clock: quanta::Clock,
    origin: u64,
}

impl TscClock {
    /// A calibrated TSC clock whose origin is now.
    #[must_use]
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self { clock, origin }
    }
}

impl Default for TscClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TscClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

impl fmt::Debug for TscClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TscClock").finish_non_exhaustive()
    }
}
