//! Several limits on one request, all or nothing: [`check_all`].

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use crate::algorithm::{Algorithm, Receipt, Refund};
use crate::cell::CellFor;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::CheckError;
use crate::limiter::{DirectLimiter, RateLimiter};
use crate::store::{Key, Lookup, StoreKind};

/// One limit of a request that [`check_all`] checks against several: a
/// limiter, the key it checks and the units the request costs there. Made
/// by [`RateLimiter::on`] and [`DirectLimiter::on_budget`]; any mix of
/// algorithms, stores and clocks goes in one call, each as a
/// `&dyn Charge`.
pub trait Charge {
    /// Checks the request against this limit, with a receipt for an
    /// admission.
    ///
    /// # Errors
    ///
    /// As the limiter's `check_n`.
    fn charge(&self) -> Result<(Decision, Option<Receipt>), CheckError>;

    /// Gives back the admission `receipt` came with (the limiter's
    /// `refund`).
    fn give_back(&self, receipt: Receipt) -> Refund;
}

/// A keyed limiter's part in [`check_all`] ([`RateLimiter::on`]).
pub struct On<'a, K: Key, Q: ?Sized, A: Algorithm, C: Clock, S: StoreKind<K, A>> {
    limiter: &'a RateLimiter<K, A, C, S>,
    key: &'a Q,
    cost: u32,
}

impl<K: Key, Q: ?Sized, A: Algorithm, C: Clock, S: StoreKind<K, A>> On<'_, K, Q, A, C, S> {
    /// The request costs `cost` units under this limit (one by default).
    #[must_use]
    pub fn cost(self, cost: u32) -> Self {
        Self { cost, ..self }
    }
}

impl<K, Q, A, C, S> Charge for On<'_, K, Q, A, C, S>
where
    K: Key,
    Q: Lookup<K> + ?Sized,
    A: Algorithm,
    C: Clock,
    S: StoreKind<K, A>,
{
    fn charge(&self) -> Result<(Decision, Option<Receipt>), CheckError> {
        self.limiter.check_n_receipt(self.key, self.cost)
    }

    fn give_back(&self, receipt: Receipt) -> Refund {
        self.limiter.refund(self.key, receipt)
    }
}

impl<K: Key, Q: ?Sized, A: Algorithm, C: Clock, S: StoreKind<K, A>> fmt::Debug
    for On<'_, K, Q, A, C, S>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("On")
            .field("limiter", self.limiter)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl<K: Key, A: Algorithm, C: Clock, S: StoreKind<K, A>> RateLimiter<K, A, C, S> {
    /// This limiter's part in [`check_all`]: `key`, at one unit (see
    /// [`On::cost`]).
    pub fn on<'a, Q: Lookup<K> + ?Sized>(&'a self, key: &'a Q) -> On<'a, K, Q, A, C, S> {
        On {
            limiter: self,
            key,
            cost: 1,
        }
    }
}

/// A direct limiter's part in [`check_all`] ([`DirectLimiter::on_budget`]).
pub struct OnBudget<'a, A: Algorithm, C: Clock, P: CellFor<A>> {
    limiter: &'a DirectLimiter<A, C, P>,
    cost: u32,
}

impl<A: Algorithm, C: Clock, P: CellFor<A>> OnBudget<'_, A, C, P> {
    /// The request costs `cost` units under this limit (one by default).
    #[must_use]
    pub fn cost(self, cost: u32) -> Self {
        Self { cost, ..self }
    }
}

impl<A: Algorithm, C: Clock, P: CellFor<A>> Charge for OnBudget<'_, A, C, P> {
    fn charge(&self) -> Result<(Decision, Option<Receipt>), CheckError> {
        self.limiter.check_n_receipt(self.cost)
    }

    fn give_back(&self, receipt: Receipt) -> Refund {
        self.limiter.refund(receipt)
    }
}

impl<A: Algorithm, C: Clock, P: CellFor<A>> fmt::Debug for OnBudget<'_, A, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnBudget")
            .field("limiter", self.limiter)
            .field("cost", &self.cost)
            .finish()
    }
}

impl<A: Algorithm, C: Clock, P: CellFor<A>> DirectLimiter<A, C, P> {
    /// This limiter's part in [`check_all`], at one unit (see
    /// [`OnBudget::cost`]).
    pub fn on_budget(&self) -> OnBudget<'_, A, C, P> {
        OnBudget {
            limiter: self,
            cost: 1,
        }
    }
}

/// What [`check_all`] decided: each limit's decision, and which refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllChecked<const N: usize> {
    /// Each limit's decision, in the order given: an admission (given back
    /// if a later limit refused), the refusing limit's denial, and `None`
    /// for the limits after it, which were not checked.
    pub decisions: [Option<Decision>; N],
    /// The limit that refused the request; `None` if every limit admitted
    /// it.
    pub refused: Option<usize>,
}

impl<const N: usize> AllChecked<N> {
    /// Whether every limit admitted the request.
    #[must_use]
    pub const fn is_allowed(&self) -> bool {
        self.refused.is_none()
    }
}

/// A limit that could not decide in [`check_all`]: its index and error.
/// The limits before it were given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("limit {limit} could not decide: {error}")]
pub struct AllError {
    /// The limit's index.
    pub limit: usize,
    /// Its error.
    pub error: CheckError,
}

/// Checks a request against several limits, all or nothing: in order, and
/// at the first that refuses (or cannot decide) the admissions of those
/// before it are given back ([`RateLimiter::refund`]), and the limits
/// after it are not checked. A request one limit refuses is charged
/// nowhere: in full by the window algorithms, and by GCRA and the token
/// bucket in full unless other requests were admitted on the same key
/// meanwhile, then all but the time elapsed since (microseconds, for a
/// refusal at once).
///
/// Requests checked meanwhile may see the charges before they are given
/// back, and be refused where they would not have been (over-denial); none
/// is admitted where it would not have been (no over-admission). Put the
/// most specific limits first: what they refuse never reaches the shared
/// ones. A panic in a limit's user code (a key's `Hash`) gives back the
/// admissions before it, then reaches the caller. A limiter whose key cap
/// admits new keys untracked
/// ([`WhenFull::AdmitUntracked`](crate::store::WhenFull::AdmitUntracked))
/// makes no receipts: its admissions stay charged when a later limit
/// refuses.
///
/// ```
/// use tollgate::algorithm::FixedWindow;
/// use tollgate::{Builder, Quota, RateLimiter, check_all};
///
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_user: RateLimiter<String> = RateLimiter::keyed(Quota::per_minute(100)?);
/// let per_tenant = Builder::new(Quota::per_minute(2)?)
///     .algorithm::<FixedWindow>()
///     .build::<String>();
///
/// for _ in 0..2 {
///     assert!(check_all([&per_user.on("alice"), &per_tenant.on("acme")])?.is_allowed());
/// }
/// let refused = check_all([&per_user.on("alice"), &per_tenant.on("acme")])?;
/// assert_eq!(refused.refused, Some(1));
/// // The tenant's refusal charged alice nothing: 98 of 100 left.
/// assert_eq!(per_user.peek("alice")?.remaining(), 97);
/// # Ok(())
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
///
/// # Errors
///
/// [`AllError`] for a limit that could not decide (a cost above its burst,
/// a new key past a rejecting key cap): the limits before it are given
/// back.
///
/// # Panics
///
/// As the limiters' `check_n`, for their user code.
pub fn check_all<const N: usize>(limits: [&dyn Charge; N]) -> Result<AllChecked<N>, AllError> {
    let mut decisions = [None; N];
    let mut receipts = [const { None }; N];
    let refused = charge_all(&limits, &mut decisions, &mut receipts)?;
    Ok(AllChecked { decisions, refused })
}

/// What [`check_all_slice`] decided: as [`AllChecked`], for a number of
/// limits known only at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllCheckedSlice {
    /// Each limit's decision, in the order given (see
    /// [`AllChecked::decisions`]).
    pub decisions: Vec<Option<Decision>>,
    /// The limit that refused the request; `None` if every limit admitted
    /// it.
    pub refused: Option<usize>,
}

impl AllCheckedSlice {
    /// Whether every limit admitted the request.
    #[must_use]
    pub const fn is_allowed(&self) -> bool {
        self.refused.is_none()
    }
}

/// [`check_all`] over a slice: for a number of limits known only at run
/// time (a rate-limit service's request, whose descriptors each match a
/// limit). The same all-or-nothing, in the same order.
///
/// ```
/// use tollgate::{Charge, Quota, RateLimiter, check_all_slice};
///
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_user: RateLimiter<String> = RateLimiter::keyed(Quota::per_minute(1)?);
/// let users = ["alice", "bob"];
/// let checks: Vec<_> = users.iter().map(|user| per_user.on(*user)).collect();
/// let limits: Vec<&dyn Charge> = checks.iter().map(|check| check as &dyn Charge).collect();
/// assert!(check_all_slice(&limits)?.is_allowed());
/// // Alice's limit refuses: bob's admission is given back.
/// let refused = check_all_slice(&limits)?;
/// assert_eq!(refused.refused, Some(0));
/// assert_eq!(per_user.peek("bob")?.remaining(), 0);
/// # Ok(())
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
///
/// # Errors
///
/// As [`check_all`].
///
/// # Panics
///
/// As [`check_all`].
pub fn check_all_slice(limits: &[&dyn Charge]) -> Result<AllCheckedSlice, AllError> {
    let mut decisions = vec![None; limits.len()];
    let mut receipts: Vec<Option<Receipt>> =
        std::iter::repeat_with(|| None).take(limits.len()).collect();
    let refused = charge_all(limits, &mut decisions, &mut receipts)?;
    Ok(AllCheckedSlice { decisions, refused })
}

/// Charges `limits` in order into `decisions`, holding each admission's
/// receipt in `receipts` (as long as `limits`) until every limit admitted;
/// returns the limit that refused, if one did.
fn charge_all(
    limits: &[&dyn Charge],
    decisions: &mut [Option<Decision>],
    receipts: &mut [Option<Receipt>],
) -> Result<Option<usize>, AllError> {
    let held = Held { limits, receipts };
    for (index, limit) in limits.iter().enumerate() {
        let (decision, receipt) = limit.charge().map_err(|error| AllError {
            limit: index,
            error,
        })?;
        decisions[index] = Some(decision);
        if !decision.is_allowed() {
            return Ok(Some(index));
        }
        held.receipts[index] = receipt;
    }
    held.receipts.iter_mut().for_each(|receipt| *receipt = None);
    Ok(None)
}

/// The admissions made so far, given back when dropped: on a refusal, an
/// error or a panic. Emptied when every limit admitted.
struct Held<'a, 'r> {
    limits: &'a [&'a dyn Charge],
    receipts: &'r mut [Option<Receipt>],
}

impl Drop for Held<'_, '_> {
    fn drop(&mut self) {
        // Every admission is given back, even past a refund whose user code
        // (the key's `Hash`) panics; the first such panic then goes on,
        // unless one is already unwinding (a second would abort the
        // process), and then that one's units stay charged.
        let mut panicked = None;
        for (limit, receipt) in self.limits.iter().zip(self.receipts.iter_mut()).rev() {
            if let Some(receipt) = receipt.take() {
                let given = catch_unwind(AssertUnwindSafe(|| limit.give_back(receipt)));
                if let Err(payload) = given {
                    panicked.get_or_insert(payload);
                }
            }
        }
        if let Some(payload) = panicked
            && !std::thread::panicking()
        {
            resume_unwind(payload);
        }
    }
}
