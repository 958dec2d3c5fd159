//! The script and what each algorithm passes it.
//!
//! One Lua script (`lua/limits.lua`) holds all five algorithms, so that a
//! request checked against several limits is decided in one call, all or
//! nothing. An algorithm's whole configuration is a one-letter code and two
//! integers in microseconds, computed here once from the [`Quota`].

use tollgate::Quota;
use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};

use crate::error::ConfigError;

/// The Lua source the limiters run, published for audit.
pub const SCRIPT: &str = include_str!("lua/limits.lua");

/// The latest instant the script distinguishes: 2^52 µs after the clock's
/// origin (year 2112 for Unix time). Later readings are read as it.
pub const END_OF_TIME_US: u64 = 1 << 52;

/// The longest span the script holds: 2^51 µs, about 71 years. With
/// [`END_OF_TIME_US`], every stored instant stays below 2^53.
pub const MAX_SPAN_US: u64 = 1 << 51;

/// The largest product the sliding window counter forms (its burst plus one
/// times its window), so that its sums stay below 2^53.
const MAX_PRODUCT_US: u64 = 1 << 52;

/// One limit's arguments to the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScriptLimit {
    /// Which algorithm, as the script names it.
    pub(crate) code: &'static str,
    /// The emission interval (GCRA, token bucket) or the window (the window
    /// algorithms), in microseconds rounded up.
    pub(crate) span_us: u64,
    /// The burst.
    pub(crate) burst: u32,
}

mod sealed {
    pub trait Sealed {}
}

/// An algorithm the script implements: the five of [`tollgate::algorithm`].
///
/// Its quota is converted to whole microseconds, every rounding up (a longer
/// interval or window admits less, never more): the Redis limiter enforces
/// the quota exactly to the microsecond.
pub trait Scripted: Algorithm + sealed::Sealed {
    /// The letter that selects the algorithm in the script (and in keys).
    #[doc(hidden)]
    const CODE: &'static str;
    /// Whether the span is the emission interval (else the burst window).
    #[doc(hidden)]
    const BY_INTERVAL: bool;
}

macro_rules! scripted {
    ($($algorithm:ty => $code:literal, $by_interval:literal;)*) => {$(
        impl sealed::Sealed for $algorithm {}
        impl Scripted for $algorithm {
            const CODE: &'static str = $code;
            const BY_INTERVAL: bool = $by_interval;
        }
    )*};
}

scripted! {
    Gcra => "g", true;
    TokenBucket => "t", true;
    FixedWindow => "f", false;
    SlidingWindowCounter => "c", false;
    SlidingWindowLog => "l", false;
}

impl ScriptLimit {
    pub(crate) fn new<A: Scripted>(quota: &Quota) -> Result<Self, ConfigError> {
        let (what, span) = if A::BY_INTERVAL {
            ("emission interval", quota.emission_interval())
        } else {
            ("burst window", quota.burst_window())
        };
        // A quota's spans are at most 2^62 ns: the micros fit a u64.
        let span_us = u64::try_from(span.as_nanos().div_ceil(1_000)).unwrap_or(u64::MAX);
        let burst = quota.burst();
        let too_large = |what, value, limit| Err(ConfigError::QuotaTooLarge { what, value, limit });
        let refill_us = u64::from(burst).saturating_mul(span_us);
        if span_us > MAX_SPAN_US {
            return too_large(what, span_us, MAX_SPAN_US);
        }
        if A::BY_INTERVAL && refill_us > MAX_SPAN_US {
            return too_large("burst times the emission interval", refill_us, MAX_SPAN_US);
        }
        let product = u64::from(burst).saturating_add(1).saturating_mul(span_us);
        if A::CODE == "c" && product > MAX_PRODUCT_US {
            return too_large("burst plus one times the window", product, MAX_PRODUCT_US);
        }
        // The log counts the units admitted since its list was last empty;
        // at most one unit a microsecond keeps that count below 2^53 for
        // 2^52 µs (notes/10).
        if A::CODE == "l" && u64::from(burst) > span_us {
            return too_large(
                "sliding log burst (at most one unit a microsecond of window)",
                u64::from(burst),
                span_us,
            );
        }
        Ok(Self {
            code: A::CODE,
            span_us,
            burst,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate::Quota;
    use tollgate::algorithm::{Gcra, SlidingWindowLog};

    use super::ScriptLimit;
    use crate::error::ConfigError;

    #[test]
    fn a_log_admits_at_most_one_unit_a_microsecond_of_window() {
        let dense = Quota::new(1_001, Duration::from_millis(1)).unwrap();
        assert!(matches!(
            ScriptLimit::new::<SlidingWindowLog>(&dense),
            Err(ConfigError::QuotaTooLarge {
                value: 1_001,
                limit: 1_000,
                ..
            })
        ));
        let just = Quota::new(1_000, Duration::from_millis(1)).unwrap();
        assert!(ScriptLimit::new::<SlidingWindowLog>(&just).is_ok());
        assert!(ScriptLimit::new::<Gcra>(&dense).is_ok());
    }
}
