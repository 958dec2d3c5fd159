//! Limiter builders shared by the integration tests.

use tollgate::algorithm::Algorithm;
use tollgate::clock::ManualClock;
use tollgate::store::StoreKind;
use tollgate::{Builder, Quota, RateLimiter};

/// A keyed limiter with `u64` keys: algorithm `A` on `store`, reading a clone
/// of `clock`.
pub fn limiter<A: Algorithm, S: StoreKind<u64, A>>(
    quota: Quota,
    store: S,
    clock: &ManualClock,
) -> RateLimiter<u64, A, ManualClock, S> {
    Builder::new(quota)
        .algorithm::<A>()
        .store(store)
        .clock(clock.clone())
        .build()
}
