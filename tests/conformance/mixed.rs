//! The conformance suite with mixed quotas: limiters built with another
//! quota than the test's, every check carrying the test's own. Used by
//! `conformance!(mixed ...)` (`store_suite.rs`).

use tollgate::clock::ManualClock;
use tollgate::store::Key;
use tollgate::{CheckError, Decision, Quota};

use crate::suite::Subject;

/// A limiter built with another quota than the test's, every check
/// carrying the test's own (`check_n_with`, `peek_with`): the suite with
/// mixed quotas, in which each key must be held to the quota its checks
/// carry exactly as a limiter built with it would hold it.
pub struct Quoted<L> {
    pub limiter: L,
    pub quota: Quota,
}

impl<K, A, S> Subject<K> for Quoted<tollgate::RateLimiter<K, A, ManualClock, S>>
where
    K: Key + Clone,
    A: tollgate::algorithm::Algorithm,
    S: tollgate::store::StoreKind<K, A>,
{
    fn check_n(&self, key: &K, n: u32) -> Result<Decision, CheckError> {
        self.limiter.check_n_with(key, n, &self.quota)
    }
    fn peek(&self, key: &K) -> Result<Decision, CheckError> {
        self.limiter.peek_with(key, &self.quota)
    }
    fn len(&self) -> usize {
        self.limiter.len()
    }
}

/// The limiter's own quota when checks carry `quota`: another burst and
/// rate over the same burst window (which the window algorithms require),
/// with a smaller burst where `quota`'s allows (a sliding window counter
/// whose word packs the limiter's burst must pack the carried one too).
pub fn other_quota(quota: Quota) -> Quota {
    let burst = if quota.burst() > 1 {
        quota.burst() / 2
    } else {
        2
    };
    Quota::new(burst, quota.burst_window()).expect("a burst window holds at least its burst in ns")
}
