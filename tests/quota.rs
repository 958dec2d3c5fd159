//! Every bad input to a constructor or a check is a typed error, never a
//! panic.

// Ordinary tests use std's primitives; under the model-checking features the
// crate's primitives are loom's or shuttle's, usable only inside a model.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

use std::time::Duration;

use tollgate::{CheckError, DirectLimiter, Quota, QuotaError};

#[test]
fn zero_limit_is_rejected_by_every_constructor() {
    assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroLimit));
    assert_eq!(Quota::per_minute(0), Err(QuotaError::ZeroLimit));
    assert_eq!(Quota::per_hour(0), Err(QuotaError::ZeroLimit));
    assert_eq!(
        Quota::new(0, Duration::from_secs(1)),
        Err(QuotaError::ZeroLimit)
    );
}

#[test]
fn zero_window_is_rejected() {
    assert_eq!(Quota::new(5, Duration::ZERO), Err(QuotaError::ZeroWindow));
}

#[test]
fn zero_burst_is_rejected() {
    let quota = Quota::per_second(5).unwrap();
    assert_eq!(quota.with_burst(0), Err(QuotaError::ZeroBurst));
}

#[test]
fn an_emission_interval_under_one_nanosecond_is_rejected() {
    // 1 000 000 001 per second is 0.999… ns apart.
    assert_eq!(
        Quota::per_second(1_000_000_001),
        Err(QuotaError::EmissionIntervalTooShort {
            limit: 1_000_000_001,
            window: Duration::from_secs(1)
        })
    );
    assert_eq!(
        Quota::new(2, Duration::from_nanos(1)),
        Err(QuotaError::EmissionIntervalTooShort {
            limit: 2,
            window: Duration::from_nanos(1)
        })
    );
    // Exactly one nanosecond apart is the finest quota there is.
    let finest = Quota::per_second(1_000_000_000).unwrap();
    assert_eq!(finest.emission_interval(), Duration::from_nanos(1));
}

#[test]
fn windows_beyond_the_time_range_are_rejected() {
    let window = Duration::from_secs(u64::MAX);
    assert_eq!(
        Quota::new(1, window),
        Err(QuotaError::WindowTooLong { window })
    );
    // 2^62 ns is the longest window; one nanosecond more is refused.
    let longest = Duration::from_nanos(1 << 62);
    assert!(Quota::new(1, longest).is_ok());
    let too_long = longest + Duration::from_nanos(1);
    assert_eq!(
        Quota::new(1, too_long),
        Err(QuotaError::WindowTooLong { window: too_long })
    );
}

#[test]
fn a_burst_whose_refill_time_overflows_is_rejected() {
    let quota = Quota::per_hour(1).unwrap();
    assert_eq!(
        quota.with_burst(u32::MAX),
        Err(QuotaError::BurstTooLarge {
            burst: u32::MAX,
            emission_interval: Duration::from_secs(3600)
        })
    );
    // A large burst at a fine rate fits.
    assert!(
        Quota::per_second(1_000_000)
            .unwrap()
            .with_burst(u32::MAX)
            .is_ok()
    );
}

#[test]
fn errors_name_the_bad_field() {
    assert!(QuotaError::ZeroLimit.to_string().contains("limit"));
    assert!(QuotaError::ZeroWindow.to_string().contains("window"));
    assert!(QuotaError::ZeroBurst.to_string().contains("burst"));
    let error = Quota::per_second(2_000_000_000).unwrap_err();
    assert!(error.to_string().contains("emission interval"), "{error}");
    assert!(CheckError::ZeroCost.to_string().contains("peek"));
}

#[test]
fn emission_interval_rounds_up() {
    // 3 per second: 333 333 333.3 ns, rounded up so the enforced rate never
    // exceeds the configured one.
    let quota = Quota::per_second(3).unwrap();
    assert_eq!(quota.emission_interval(), Duration::from_nanos(333_333_334));
    // 7 per minute with a burst of 2: the burst window is 60 s × 2 / 7,
    // rounded up.
    let quota = Quota::per_minute(7).unwrap().with_burst(2).unwrap();
    assert_eq!(quota.burst_window(), Duration::from_nanos(17_142_857_143));
    assert_eq!(quota.window(), Duration::from_secs(60));
    assert_eq!(quota.limit(), 7);
}

#[test]
fn invalid_costs_on_a_direct_limiter_are_errors() {
    let limiter = DirectLimiter::direct(Quota::per_second(4).unwrap());
    assert_eq!(limiter.check_n(0), Err(CheckError::ZeroCost));
    assert_eq!(
        limiter.check_n(5),
        Err(CheckError::InsufficientCapacity {
            cost: 5,
            capacity: 4
        })
    );
    assert_eq!(
        limiter.check_n(u32::MAX),
        Err(CheckError::InsufficientCapacity {
            cost: u32::MAX,
            capacity: 4
        })
    );
    // Nothing consumed: a peek still predicts 3 remaining after one unit.
    assert_eq!(limiter.peek().unwrap().remaining(), 3);
}

#[test]
fn limiters_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<tollgate::RateLimiter<String>>();
    assert_send_sync::<tollgate::RateLimiter<u64, tollgate::algorithm::SlidingWindowLog>>();
    assert_send_sync::<DirectLimiter>();
}
