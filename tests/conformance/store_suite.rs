//! The conformance suite's runner for in-process stores, shared by
//! `tests/conformance/main.rs` and the stores on other maps (`peers/tests`).

/// `conformance!(name, Algorithm, store)`: a module `name` that runs every
/// test of the suite (`suite.rs`) on `u64` keys, and `isolates_string_keys`
/// on `String` keys, over limiters of `Algorithm` on `store` (an expression
/// of a `StoreKind`), each on a `ManualClock`; a fourth argument, a trait,
/// bounds the key types further (`Ord`, for a map that needs it). Its users have `mod suite`
/// and `mod contention` (`tests/support/contention.rs`) at their root, and
/// `#[macro_use] mod store_suite` (this file). `conformance!(mixed name,
/// Algorithm, store)` runs the same tests on limiters built with another
/// quota (`mixed::other_quota`), every check carrying the test's.
macro_rules! conformance {
    ($name:ident, $algorithm:ty, $store:expr $(, $key_bound:path)?) => {
        mod $name {
            use tollgate::clock::ManualClock;
            use tollgate::store::Key;
            use tollgate::{Builder, Quota, RateLimiter};

            use super::*;

            #[allow(clippy::type_complexity)]
            fn make<K: Key $(+ $key_bound)?>(
                quota: Quota,
                clock: ManualClock,
            ) -> RateLimiter<K, $algorithm, ManualClock, impl tollgate::store::StoreKind<K, $algorithm>> {
                Builder::new(quota)
                    .algorithm::<$algorithm>()
                    .clock(clock)
                    .store($store)
                    .build::<K>()
            }

            suite::with_suite_tests!(conformance!(@tests));

            #[test]
            fn isolates_string_keys() {
                suite::isolates_string_keys(make::<String>);
            }
        }
    };
    (mixed $name:ident, $algorithm:ty, $store:expr) => {
        mod $name {
            use tollgate::clock::ManualClock;
            use tollgate::store::Key;
            use tollgate::{Builder, Quota, RateLimiter};

            use super::*;

            #[allow(clippy::type_complexity)]
            fn make<K: Key>(
                quota: Quota,
                clock: ManualClock,
            ) -> mixed::Quoted<RateLimiter<K, $algorithm, ManualClock, impl tollgate::store::StoreKind<K, $algorithm>>> {
                let limiter = Builder::new(mixed::other_quota(quota))
                    .algorithm::<$algorithm>()
                    .clock(clock)
                    .store($store)
                    .build::<K>();
                assert_eq!(limiter.accepts(&quota), Ok(()), "{quota:?}");
                mixed::Quoted { limiter, quota }
            }

            suite::with_suite_tests!(conformance!(@tests));

            #[test]
            fn isolates_string_keys() {
                suite::isolates_string_keys(make::<String>);
            }
        }
    };
    (@tests $($test:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                suite::$test(make::<u64>);
            }
        )*
    };
}
