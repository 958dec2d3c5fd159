//! The quota: a sustained rate and a burst, chosen separately.

use std::time::Duration;

use crate::clock::MAX_SPAN_NS;
use crate::error::QuotaError;

/// How much traffic a key may send: a sustained rate of `limit` requests per
/// `window`, and a `burst` (the most requests admitted at once), which is
/// `limit` unless [`with_burst`](Quota::with_burst) chooses otherwise.
///
/// Every algorithm reads the same quota:
///
/// * GCRA and the token bucket admit `burst` at once and then one request per
///   [`emission_interval`](Quota::emission_interval);
/// * the window algorithms admit at most `burst` per
///   [`burst_window`](Quota::burst_window), which is `window` itself when the
///   burst equals the limit.
///
/// All of a quota's derived numbers are computed and range-checked here, once,
/// so that no check can overflow or divide by zero later.
///
/// # Rounding
///
/// Time is counted in whole nanoseconds. The emission interval
/// `window / limit` is rounded **up** (3 per second is one request every
/// 333 333 334 ns), so the rate a limiter enforces is never above the one
/// configured; it is below it by less than one nanosecond per interval (a
/// relative shortfall under `1 / emission_interval_ns`, 3 parts per billion
/// for 3 per second). `burst_window` is rounded up likewise.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() -> Result<(), tollgate::QuotaError> {
/// let quota = Quota::per_second(10)?.with_burst(3)?;
/// assert_eq!(quota.emission_interval(), Duration::from_millis(100));
/// assert_eq!(quota.burst(), 3);
/// assert_eq!(quota.burst_window(), Duration::from_millis(300));
///
/// assert!(Quota::per_minute(0).is_err());
/// # Ok(())
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u32,
    window_ns: u64,
    burst: u32,
    emission_interval_ns: u64,
    burst_window_ns: u64,
}

impl Quota {
    /// `limit` requests per `window`, with a burst of `limit`.
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroLimit`], [`QuotaError::ZeroWindow`],
    /// [`QuotaError::WindowTooLong`] (beyond 2^62 ns, about 146 years),
    /// [`QuotaError::EmissionIntervalTooShort`] (more than one request per
    /// nanosecond) or [`QuotaError::BurstTooLarge`].
    pub fn new(limit: u32, window: Duration) -> Result<Self, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if window.is_zero() {
            return Err(QuotaError::ZeroWindow);
        }
        let window_ns = u64::try_from(window.as_nanos())
            .ok()
            .filter(|&window_ns| window_ns <= MAX_SPAN_NS)
            .ok_or(QuotaError::WindowTooLong { window })?;
        if window_ns < u64::from(limit) {
            return Err(QuotaError::EmissionIntervalTooShort { limit, window });
        }
        Self::derive(limit, window_ns, limit)
    }

    /// `limit` requests per second.
    ///
    /// # Errors
    ///
    /// As [`Quota::new`].
    pub fn per_second(limit: u32) -> Result<Self, QuotaError> {
        Self::new(limit, Duration::from_secs(1))
    }

    /// `limit` requests per minute.
    ///
    /// # Errors
    ///
    /// As [`Quota::new`].
    pub fn per_minute(limit: u32) -> Result<Self, QuotaError> {
        Self::new(limit, Duration::from_secs(60))
    }

    /// `limit` requests per hour.
    ///
    /// # Errors
    ///
    /// As [`Quota::new`].
    pub fn per_hour(limit: u32) -> Result<Self, QuotaError> {
        Self::new(limit, Duration::from_secs(3600))
    }

    /// The same sustained rate with a different burst: the most requests a
    /// fresh (or fully rested) key is admitted at once.
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroBurst`], or [`QuotaError::BurstTooLarge`] when
    /// `burst` emission intervals exceed 2^62 ns (about 146 years).
    pub fn with_burst(self, burst: u32) -> Result<Self, QuotaError> {
        Self::derive(self.limit, self.window_ns, burst)
    }

    /// Computes and range-checks every derived number. `limit >= 1` and
    /// `window_ns >= limit` hold on entry.
    fn derive(limit: u32, window_ns: u64, burst: u32) -> Result<Self, QuotaError> {
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        let emission_interval_ns = window_ns.div_ceil(u64::from(limit));
        let too_large = QuotaError::BurstTooLarge {
            burst,
            emission_interval: Duration::from_nanos(emission_interval_ns),
        };
        // burst × emission_interval is the refill time of a drained key; every
        // algorithm's arithmetic stays within it, so it is held to
        // MAX_SPAN_NS (see `clock::END_OF_TIME_NS`).
        u64::from(burst)
            .checked_mul(emission_interval_ns)
            .filter(|&refill_ns| refill_ns <= MAX_SPAN_NS)
            .ok_or(too_large)?;
        // window × burst / limit, rounded up, computed exactly in u128. It is
        // at most burst × emission_interval, which was just checked to fit.
        let burst_window_ns =
            (u128::from(window_ns) * u128::from(burst)).div_ceil(u128::from(limit));
        let burst_window_ns = u64::try_from(burst_window_ns).map_err(|_| too_large)?;
        Ok(Self {
            limit,
            window_ns,
            burst,
            emission_interval_ns,
            burst_window_ns,
        })
    }

    /// Requests per window, the sustained rate's numerator.
    #[must_use]
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// The window the rate is expressed over.
    #[must_use]
    pub const fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns)
    }

    /// The most requests admitted at once.
    #[must_use]
    pub const fn burst(&self) -> u32 {
        self.burst
    }

    /// The time one request's worth of capacity takes to refill:
    /// `window / limit`, rounded up to the nanosecond.
    #[must_use]
    pub const fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.emission_interval_ns)
    }

    /// The window over which the window algorithms admit `burst` requests:
    /// `window × burst / limit`, rounded up (`window` itself when the burst is
    /// the limit).
    #[must_use]
    pub const fn burst_window(&self) -> Duration {
        Duration::from_nanos(self.burst_window_ns)
    }

    pub(crate) const fn emission_interval_ns(&self) -> u64 {
        self.emission_interval_ns
    }

    pub(crate) const fn burst_window_ns(&self) -> u64 {
        self.burst_window_ns
    }
}
