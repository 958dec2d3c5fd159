//! [`Limit`]: the one trait the layer asks, implemented by the in-process
//! limiters and (feature `redis`) the Redis backend.

use std::error::Error;
use std::future::{Future, ready};

use tollgate::algorithm::{Algorithm, Receipt, Refund};
use tollgate::cell::CellFor;
use tollgate::clock::Clock;
use tollgate::store::{Key, StoreKind};
use tollgate::{CheckError, Decision, DirectLimiter, LayoutError, Quota, RateLimiter};

/// A limiter the layer can check a request against, whatever decides it:
/// an in-process [`RateLimiter`] or [`DirectLimiter`], or a backend that
/// answers over the network (with feature `redis`, `tollgate_redis::RedisLimiter`).
///
/// A limiter that can decide without waiting (every in-process one) says so
/// through [`check_now`](Limit::check_now), and the layer then checks it
/// with no future and no allocation; [`check_n`](Limit::check_n) is for the
/// others.
///
/// ```
/// use tollgate::algorithm::Refund;
/// use tollgate::{Quota, RateLimiter};
/// use tollgate_http::Limit;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter: RateLimiter<u64> = RateLimiter::keyed(Quota::per_second(1)?);
/// let checked = limiter.check_now(&7, 1, None).expect("decided in process")?;
/// assert!(checked.decision.is_allowed());
/// assert_eq!(checked.quota, Some(Quota::per_second(1)?));
/// // GCRA admissions can be given back (as can the token bucket's and the
/// // fixed window's).
/// assert_eq!(Limit::refund(&limiter, &7, checked.receipt.unwrap()), Refund::Full);
/// assert_eq!(Limit::<u64>::quota(&limiter).limit(), 1);
/// # Ok(())
/// # }
/// ```
pub trait Limit<K: ?Sized>: Send + Sync + 'static {
    /// What gives an admission back ([`refund`](Limit::refund)) when a
    /// later rule refuses the same request; [`NoReceipt`] for a limiter
    /// that cannot.
    type Receipt: Send + Sync + 'static;

    /// Returns the quota the limiter enforces: what `RateLimit-Policy`
    /// advertises for the decisions it makes by it (the rule writes that
    /// item once). A decision made by another quota says so in
    /// [`Checked::quota`].
    fn quota(&self) -> Quota;

    /// Whether checks can carry `quota` instead of the limiter's own (a
    /// rule's [`Tiers`](crate::Tiers)). By default none can.
    ///
    /// # Errors
    ///
    /// The [`LayoutError`] every check carrying `quota` would fail with;
    /// by default [`LayoutError::Unsupported`].
    fn accepts(&self, quota: &Quota) -> Result<(), LayoutError> {
        let _ = quota;
        Err(LayoutError::Unsupported)
    }

    /// Checks `cost` units for `key`, under `quota` if given (one the
    /// limiter [`accepts`](Limit::accepts)) and its own otherwise,
    /// deciding now if this limiter can without waiting; `None` if it must
    /// be asked through [`check_n`](Limit::check_n).
    fn check_now(
        &self,
        key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> Option<Result<Checked<Self::Receipt>, Failure>> {
        let _ = (key, cost, quota);
        None
    }

    /// Checks as [`check_now`](Limit::check_now) does, for an admission
    /// that is never given back (the layer's last rule, which no later one
    /// can refuse): a limiter whose receipts cost time to make may skip
    /// them. By default, [`check_now`](Limit::check_now).
    fn check_now_without_receipt(
        &self,
        key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> Option<Result<Checked<Self::Receipt>, Failure>> {
        self.check_now(key, cost, quota)
    }

    /// Checks `cost` units for `key` (all or nothing), under `quota` as
    /// [`check_now`](Limit::check_now), waiting for the backend's answer.
    fn check_n(
        &self,
        key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> impl Future<Output = Result<Checked<Self::Receipt>, Failure>> + Send;

    /// Checks as [`check_n`](Limit::check_n) does, for an admission that
    /// is never given back, as
    /// [`check_now_without_receipt`](Limit::check_now_without_receipt). By
    /// default, [`check_n`](Limit::check_n).
    fn check_n_without_receipt(
        &self,
        key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> impl Future<Output = Result<Checked<Self::Receipt>, Failure>> + Send {
        self.check_n(key, cost, quota)
    }

    /// Gives back the admission `receipt` came with, as far as the
    /// limiter can without admitting more than its quota (see
    /// [`RateLimiter::refund`]); returns how much.
    fn refund(&self, key: &K, receipt: Self::Receipt) -> Refund {
        let _ = (key, receipt);
        Refund::Nothing
    }
}

/// A limiter's decision, the quota that made it, and for an admission it
/// can give back, the receipt to give it back with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked<R> {
    /// The decision.
    pub decision: Decision,
    /// The quota that made the decision, which `RateLimit-Policy` then
    /// advertises: the limiter's own ([`Limit::quota`]), unless its backend
    /// could not decide and a failure policy decided in its place by
    /// another (Redis's `OnFailure::Local`, a share of the quota in
    /// process). `None` when no quota counted the request (a failure policy
    /// that admits or denies without counting): the response then carries
    /// no field for the rule, as nothing it could advertise is enforced.
    pub quota: Option<Quota>,
    /// For [`Limit::refund`].
    pub receipt: Option<R>,
}

/// The receipt of a limiter that cannot give admissions back: there is
/// none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoReceipt {}

/// Why a limiter gave no decision.
///
/// Its message names its cause (the backend's error included), which
/// `source` does not return again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// The cost is above the burst (or zero): no wait could admit it.
    #[error(transparent)]
    Cost(CheckError),
    /// A new key found the limiter's key cap reached
    /// ([`WhenFull::Reject`](tollgate::store::WhenFull::Reject)).
    #[error("the limiter tracks its maximum of {max_keys} keys; a new key was rejected")]
    Full {
        /// The cap.
        max_keys: usize,
    },
    /// The backend could not decide (Redis unreachable, timed out, behind
    /// an open circuit breaker) and its own failure policy returned an
    /// error; or an in-process store could not hold a new key now
    /// ([`CheckError::Reclaiming`]: a check stalled inside it holds back
    /// reclamation).
    #[error("the limiter's backend is unavailable: {0}")]
    Unavailable(Box<dyn Error + Send + Sync>),
}

impl From<CheckError> for Failure {
    fn from(error: CheckError) -> Self {
        match error {
            CheckError::StoreFull { max_keys } => Failure::Full { max_keys },
            // The limiter cannot track the key now (a check stalled inside
            // its store holds back reclamation): it cannot decide, and the
            // layer's `OnUnavailable` policy answers.
            CheckError::Reclaiming => Failure::Unavailable(Box::new(error)),
            other => Failure::Cost(other),
        }
    }
}

/// Decides in process, at once. Every admission comes with a receipt (see
/// [`Algorithm::receipt`]), so a request a later rule refuses is given back
/// here: in full for the window algorithms, and for GCRA and the token
/// bucket in full unless other admissions followed on the key, then all
/// but the time elapsed since ([`RateLimiter::refund`]).
impl<K, A, C, S> Limit<K> for RateLimiter<K, A, C, S>
where
    K: Key,
    A: Algorithm,
    C: Clock + 'static,
    S: StoreKind<K, A>,
{
    type Receipt = Receipt;

    fn quota(&self) -> Quota {
        RateLimiter::quota(self)
    }

    fn accepts(&self, quota: &Quota) -> Result<(), LayoutError> {
        RateLimiter::accepts(self, quota)
    }

    #[inline]
    fn check_now(
        &self,
        key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> Option<Result<Checked<Self::Receipt>, Failure>> {
        Some(quoted(self.check_n_receipt_quoted(key, cost, quota)))
    }

    #[inline]
    fn check_now_without_receipt(
        &self,
        key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> Option<Result<Checked<Self::Receipt>, Failure>> {
        let checked = self.check_n_quoted(key, cost, quota);
        Some(quoted(
            checked.map(|(decision, quota)| (decision, None, quota)),
        ))
    }

    fn check_n(
        &self,
        key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> impl Future<Output = Result<Checked<Self::Receipt>, Failure>> + Send {
        ready(quoted(self.check_n_receipt_quoted(key, cost, quota)))
    }

    fn refund(&self, key: &K, receipt: Self::Receipt) -> Refund {
        RateLimiter::refund(self, key, receipt)
    }
}

/// Reads an in-process keyed check's outcome, with the quota that decided
/// it, as the layer does.
#[inline]
fn quoted<R>(
    outcome: Result<(Decision, Option<R>, Quota), CheckError>,
) -> Result<Checked<R>, Failure> {
    outcome
        .map(|(decision, receipt, quota)| Checked {
            decision,
            quota: Some(quota),
            receipt,
        })
        .map_err(Failure::from)
}

/// Reads an in-process check's outcome, decided by `quota`, as the layer
/// does.
#[inline]
fn checked<R>(
    outcome: Result<(Decision, Option<R>), CheckError>,
    quota: &Quota,
) -> Result<Checked<R>, Failure> {
    outcome
        .map(|(decision, receipt)| Checked {
            decision,
            quota: Some(*quota),
            receipt,
        })
        .map_err(Failure::from)
}

/// A direct limiter's check, refused when it carries a quota.
#[inline]
fn direct_checked<A, C, P, R>(
    limiter: &DirectLimiter<A, C, P>,
    quota: Option<&Quota>,
    check: impl FnOnce() -> Result<(Decision, Option<R>), CheckError>,
) -> Result<Checked<R>, Failure>
where
    A: Algorithm,
    C: Clock,
    P: CellFor<A>,
{
    if quota.is_some() {
        return Err(Failure::from(CheckError::Layout(LayoutError::Unsupported)));
    }
    checked(check(), DirectLimiter::quota(limiter))
}

/// Holds every request to one budget: the key is ignored.
impl<K, A, C, P> Limit<K> for DirectLimiter<A, C, P>
where
    K: ?Sized,
    A: Algorithm,
    C: Clock + 'static,
    P: CellFor<A> + 'static,
    P::Cell: 'static,
{
    type Receipt = Receipt;

    fn quota(&self) -> Quota {
        *DirectLimiter::quota(self)
    }

    /// One budget has one quota: a carried one is refused
    /// ([`LayoutError::Unsupported`], as [`Limit::accepts`] says).
    #[inline]
    fn check_now(
        &self,
        _key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> Option<Result<Checked<Self::Receipt>, Failure>> {
        Some(direct_checked(self, quota, || self.check_n_receipt(cost)))
    }

    #[inline]
    fn check_now_without_receipt(
        &self,
        _key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> Option<Result<Checked<Self::Receipt>, Failure>> {
        Some(direct_checked(self, quota, || {
            self.check_n(cost).map(|decision| (decision, None))
        }))
    }

    fn check_n(
        &self,
        _key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> impl Future<Output = Result<Checked<Self::Receipt>, Failure>> + Send {
        ready(direct_checked(self, quota, || self.check_n_receipt(cost)))
    }

    fn refund(&self, _key: &K, receipt: Self::Receipt) -> Refund {
        DirectLimiter::refund(self, receipt)
    }
}

#[cfg(feature = "redis")]
mod redis {
    use std::future::Future;

    use tollgate::algorithm::Refund;
    use tollgate::{CheckError, LayoutError, Quota};
    use tollgate_redis::{Enforced, Error, RedisLimiter, RedisReceipt, Scripted};

    use super::{Checked, Failure, Limit};

    /// Decides every check in one round trip; the limiter's own
    /// [`OnFailure`](tollgate_redis::OnFailure) policy decides first when
    /// Redis cannot, and only its `Error` policy reaches the layer, as
    /// [`Failure::Unavailable`]. A decision carries the quota that made it
    /// ([`Enforced`]): under `OnFailure::Local`, the share in process.
    ///
    /// An admission Redis decided comes with a receipt
    /// ([`RedisReceipt`]): when a later rule refuses the request, it is
    /// given back in a task of its own, undone if no one wrote on the key
    /// since. The response cannot wait for it, so its fields count no unit
    /// given back ([`refund`](Limit::refund) says
    /// [`Refund::Nothing`](tollgate::algorithm::Refund::Nothing), the units
    /// known back when it returns). An admission the local half or the
    /// failure policy decided stays charged.
    impl<K, A> Limit<K> for RedisLimiter<A>
    where
        K: AsRef<[u8]> + Sync + ?Sized,
        A: Scripted,
    {
        type Receipt = RedisReceipt;

        fn quota(&self) -> Quota {
            RedisLimiter::quota(self)
        }

        /// A window algorithm's quota of another window, a quota the
        /// script cannot hold, and any quota on a limiter deciding locally
        /// (a `Mode` other than `Exact`) are refused: the first as its
        /// [`LayoutError`], the others as [`LayoutError::Unsupported`].
        fn accepts(&self, quota: &Quota) -> Result<(), LayoutError> {
            match RedisLimiter::accepts(self, quota) {
                Ok(()) => Ok(()),
                Err(Error::Check(CheckError::Layout(error))) => Err(error),
                Err(_) => Err(LayoutError::Unsupported),
            }
        }

        fn check_n(
            &self,
            key: &K,
            cost: u32,
            quota: Option<&Quota>,
        ) -> impl Future<Output = Result<Checked<RedisReceipt>, Failure>> + Send {
            let key = key.as_ref();
            let carried = quota.copied();
            async move {
                self.check_n_receipt(key, cost, carried.as_ref())
                    .await
                    .map(|(enforced, receipt)| checked(enforced, receipt))
                    .map_err(failure)
            }
        }

        fn check_n_without_receipt(
            &self,
            key: &K,
            cost: u32,
            quota: Option<&Quota>,
        ) -> impl Future<Output = Result<Checked<RedisReceipt>, Failure>> + Send {
            let key = key.as_ref();
            let carried = quota.copied();
            async move {
                match &carried {
                    Some(quota) => self.check_n_enforced_with(key, cost, quota).await,
                    None => self.check_n_enforced(key, cost).await,
                }
                .map(|enforced| checked(enforced, None))
                .map_err(failure)
            }
        }

        fn refund(&self, _key: &K, receipt: RedisReceipt) -> Refund {
            receipt.refund_later();
            Refund::Nothing
        }
    }

    fn checked(enforced: Enforced, receipt: Option<RedisReceipt>) -> Checked<RedisReceipt> {
        Checked {
            decision: enforced.decision,
            quota: enforced.quota,
            receipt,
        }
    }

    /// The layer's failure for a Redis error: an invalid cost is the
    /// check's, everything else Redis's being out of reach.
    fn failure(error: Error) -> Failure {
        match error {
            Error::Check(error) => Failure::from(error),
            other => Failure::Unavailable(Box::new(other)),
        }
    }
}

/// Shares one limiter (the same budget behind several layers, or a layer
/// and a handler).
impl<K, L> Limit<K> for std::sync::Arc<L>
where
    K: ?Sized,
    L: Limit<K>,
{
    type Receipt = L::Receipt;

    fn quota(&self) -> Quota {
        (**self).quota()
    }

    fn accepts(&self, quota: &Quota) -> Result<(), LayoutError> {
        (**self).accepts(quota)
    }

    #[inline]
    fn check_now(
        &self,
        key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> Option<Result<Checked<L::Receipt>, Failure>> {
        (**self).check_now(key, cost, quota)
    }

    #[inline]
    fn check_now_without_receipt(
        &self,
        key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> Option<Result<Checked<L::Receipt>, Failure>> {
        (**self).check_now_without_receipt(key, cost, quota)
    }

    fn check_n(
        &self,
        key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> impl Future<Output = Result<Checked<L::Receipt>, Failure>> + Send {
        (**self).check_n(key, cost, quota)
    }

    fn check_n_without_receipt(
        &self,
        key: &K,
        cost: u32,
        quota: Option<&Quota>,
    ) -> impl Future<Output = Result<Checked<L::Receipt>, Failure>> + Send {
        (**self).check_n_without_receipt(key, cost, quota)
    }

    fn refund(&self, key: &K, receipt: L::Receipt) -> Refund {
        (**self).refund(key, receipt)
    }
}
