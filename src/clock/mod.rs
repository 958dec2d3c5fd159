//! Time sources.
//!
//! Every limiter reads time through a [`Clock`]: monotonic nanoseconds as a
//! `u64` counted from the clock's own origin. Nothing else in the crate reads
//! the system time, so tests and model checkers drive a [`ManualClock`] and see
//! exactly the instants they chose.
//!
//! A clock is a measured choice, not a detail: reading a precise clock costs
//! more than a whole lock-free denial.
//!
//! | clock | a reading | resolution, error |
//! |---|---|---|
//! | [`TscClock`] (default) | `rdtsc` and a scaling; the OS clock where the CPU has no invariant TSC | calibrated against the OS clock; ppm drift |
//! | [`MonotonicClock`] | std `Instant`: a vDSO call | the OS clock's, nanoseconds |
//! | [`CoarseClock`] | one atomic load | lags by up to its refresh interval; only ever stricter |
//! | [`ManualClock`] | one atomic load | exactly what a test set |

mod coarse;
mod manual;
mod monotonic;
#[cfg(feature = "tokio")]
mod tokio;
mod tsc;

#[cfg(feature = "tokio")]
pub use self::tokio::TokioClock;
pub use coarse::{CoarseClock, Refresher};
pub use manual::ManualClock;
pub use monotonic::MonotonicClock;
pub use tsc::TscClock;

/// A source of monotonic time in nanoseconds since the clock's origin.
///
/// Readings from one clock should not decrease when read from one thread in
/// sequence. The limiters tolerate a reading older than the state they hold
/// (a clock shared between threads can hand two threads readings in the
/// opposite order to the order in which they reach the state, and a
/// [`TscClock`] read on another core can fall a few ticks behind): such a
/// reading never admits more than the newer one would, and never
/// underflows.
pub trait Clock: Send + Sync {
    /// Nanoseconds elapsed since this clock's origin.
    fn now_ns(&self) -> u64;

    /// Whether readings stand in the order they are taken, by any
    /// threads, to within a microsecond: a reading a thread takes after
    /// it saw another thread's check (the state that check wrote from its
    /// own reading) is never more than 1 µs before that check's reading.
    /// What lets a refund count the time elapsed since an admission that
    /// others followed ([`RateLimiter::refund`](crate::RateLimiter::refund),
    /// GCRA and the token bucket). `false` by default, which only makes
    /// such refunds give back nothing.
    ///
    /// The crate's clocks say `true` (`ManualClock` until it is set back):
    /// a reading of the time-stamp counter or the OS clock reflects the
    /// instant it is taken, out of order by the CPU's pipeline at most; a
    /// cached reading (`CoarseClock`, `ManualClock`) is one word that only
    /// moves forward, which the refund loads after the key's state behind
    /// an acquire fence, while each admission's word depends on the reading
    /// it was computed from. That last step relies on hardware that keeps
    /// a store after the load it depends on and makes every store visible
    /// to all threads at once (x86-64, `AArch64`), not on the language's
    /// memory model: the admissions' compare-and-swaps stay `Relaxed`.
    fn ordered(&self) -> bool {
        false
    }

    /// How far a reading a thread takes after it saw another thread's
    /// check may stand before that check's reading: 1 µs for a clock whose
    /// readings are [`ordered`](Clock::ordered) (0 for `ManualClock`, one
    /// word that only moves forward), and 0 for one that is not, whose
    /// disorder is unknown. A quota change carries each state at both ends
    /// of that span ([`CarryAt`](crate::algorithm::CarryAt)).
    fn disorder_ns(&self) -> u64 {
        if self.ordered() { 1_000 } else { 0 }
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }

    fn ordered(&self) -> bool {
        (**self).ordered()
    }

    fn disorder_ns(&self) -> u64 {
        (**self).disorder_ns()
    }
}

impl<C: Clock + ?Sized> Clock for crate::sync::Arc<C> {
    #[inline]
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }

    fn ordered(&self) -> bool {
        (**self).ordered()
    }

    fn disorder_ns(&self) -> u64 {
        (**self).disorder_ns()
    }
}

impl<C: Clock + ?Sized> Clock for Box<C> {
    #[inline]
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }

    fn ordered(&self) -> bool {
        (**self).ordered()
    }

    fn disorder_ns(&self) -> u64 {
        (**self).disorder_ns()
    }
}

/// The last instant the algorithms distinguish: 2^63 ns, about 292 years
/// after a clock's origin. Later readings are read as this one, so time
/// stops there and a key behaves as under a frozen clock (exact, never
/// refilled) instead of wrapping. [`Quota`](crate::Quota) keeps every span
/// at or below [`MAX_SPAN_NS`], so `END_OF_TIME_NS + 2 × span` never
/// overflows a `u64`.
pub const END_OF_TIME_NS: u64 = 1 << 63;

/// The longest span a quota may imply (a window, or a drained key's refill
/// time): 2^62 ns, about 146 years.
pub const MAX_SPAN_NS: u64 = 1 << 62;

/// A clock reading, clamped to [`END_OF_TIME_NS`].
#[inline]
pub(crate) fn clamp_time(now_ns: u64) -> u64 {
    now_ns.min(END_OF_TIME_NS)
}

/// Converts a [`Duration`](std::time::Duration) to whole nanoseconds,
/// saturating at `u64::MAX` (about 584 years).
#[inline]
pub(crate) fn saturating_nanos(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
