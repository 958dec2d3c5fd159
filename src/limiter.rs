//! The public façade: keyed and direct limiters, and their builder.

use std::fmt;
use std::num::NonZeroU64;

use crate::algorithm::{Algorithm, Carry, CarryAt, Gcra, Receipt, Refund};
use crate::builder::Builder;
use crate::cell::{Cell, CellFor, Preferred};
use crate::clock::{Clock, TscClock};
use crate::decision::Decision;
use crate::error::{CheckError, LayoutError};
use crate::quota::Quota;
use crate::store::{
    Carried, ChangeError, DefaultStore, Generation, Key, Lookup, Own, Store, StoreKind, Under,
};
use crate::sync::acquire_fence;
use crate::sync::{Mutex, lock};
use crate::wait::Queues;

/// A rate limiter with one quota per key: each key (a user, an IP address, an
/// API token) gets its own budget.
///
/// Built by [`RateLimiter::keyed`] with the defaults (GCRA, the default store,
/// the [`TscClock`]), or by a [`Builder`] that chooses each part.
///
/// ```
/// use tollgate::{Quota, RateLimiter};
///
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter: RateLimiter<String> = RateLimiter::keyed(Quota::per_minute(2)?);
///
/// assert!(limiter.check("alice")?.is_allowed());
/// assert!(limiter.check("alice")?.is_allowed());
/// let third = limiter.check("alice")?;
/// assert!(!third.is_allowed());
/// assert!(third.retry_after().as_millis() > 0);
///
/// // Keys are independent.
/// assert!(limiter.check("bob")?.is_allowed());
/// # Ok(())
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
pub struct RateLimiter<
    K: Key,
    A: Algorithm = Gcra,
    C: Clock = TscClock,
    S: StoreKind<K, A> = DefaultStore,
> {
    pub(crate) clock: C,
    /// The keys' states, and the generation (algorithm, quota and receipt
    /// stamp) each is in ([`Generation`]).
    pub(crate) store: S::Store,
    /// Whether admissions carry receipts: not under a
    /// [`WhenFull::AdmitUntracked`](crate::store::WhenFull::AdmitUntracked)
    /// cap, which admits keys it does not store, so that an admission's
    /// receipt could match another's state.
    pub(crate) receipts: bool,
    /// The quota new checks are held to, once a change has carried every
    /// key to it.
    pub(crate) quota: Mutex<Quota>,
    /// Held by [`set_quota`](RateLimiter::set_quota) for a whole change:
    /// changes follow one another.
    pub(crate) changing: Mutex<()>,
    /// The counts for the `metrics` facade (`Builder::metrics`).
    #[cfg(feature = "metrics")]
    pub(crate) counts: Option<Box<crate::metrics::Counts>>,
    /// The keys with reservations waiting for their slot (GCRA only; see
    /// `crate::wait`). Empty, and allocating nothing per key, otherwise.
    pub(crate) queues: Queues<K>,
}

impl<K: Key> RateLimiter<K> {
    /// A keyed limiter with the defaults: GCRA on the [`DefaultStore`] store, the
    /// [`TscClock`], no key cap (idle keys are still evicted as the store
    /// grows).
    #[must_use]
    pub fn keyed(quota: Quota) -> Self {
        Builder::new(quota).build()
    }
}

impl<K: Key, A: Algorithm, C: Clock, S: StoreKind<K, A>> RateLimiter<K, A, C, S> {
    /// Checks one unit request for `key`, consuming it if admitted.
    ///
    /// # Errors
    ///
    /// [`CheckError::StoreFull`] for a new key past a rejecting key cap
    /// ([`Builder::max_keys`]), and [`CheckError::Reclaiming`] for a new key
    /// the lock-free store cannot hold while a check stalled inside it holds
    /// back reclamation (temporary). Never a cost error: every quota admits
    /// a unit.
    ///
    /// # Panics
    ///
    /// Only if user code the check runs panics: this key's `Hash`, `Eq`,
    /// `Borrow` or (for a new key) `ToOwned`, the store's hasher, the
    /// algorithm's code, or, when this check makes the store grow or sweep
    /// it, other keys' `Hash` and `Clone` (which a rebuild runs). The panic
    /// reaches this caller only: this key is not stored if it was new, and
    /// every other key, [`len`](RateLimiter::len) and the cap are exact.
    #[inline]
    pub fn check<Q: Lookup<K> + ?Sized>(&self, key: &Q) -> Result<Decision, CheckError> {
        self.check_n(key, 1)
    }

    /// Checks a request costing `n` units for `key`, atomically: either all
    /// `n` are consumed or none is.
    ///
    /// # Errors
    ///
    /// [`CheckError::ZeroCost`] for `n == 0`,
    /// [`CheckError::InsufficientCapacity`] for `n` above the burst (no wait
    /// would admit it), [`CheckError::StoreFull`] for a new key past a
    /// rejecting key cap ([`Builder::max_keys`]), and
    /// [`CheckError::Reclaiming`] for a new key the lock-free store cannot
    /// hold now (see [`check`](RateLimiter::check)). Nothing is consumed,
    /// and no key is stored, on error.
    #[inline]
    pub fn check_n<Q: Lookup<K> + ?Sized>(&self, key: &Q, n: u32) -> Result<Decision, CheckError> {
        self.counted(self.store.check(key, &Own, self.clock.now_ns(), n), n)
    }

    /// Checks one unit request for `key` under `quota` instead of the
    /// limiter's own: a quota per key, per tier or per route, with every
    /// key in one store.
    ///
    /// A key's state is one, whatever quota checks it: checked under
    /// another quota later, it is read as it stands (GCRA and the token
    /// bucket keep the refill time the key has booked, the window
    /// algorithms the units counted in each window; see
    /// [`Algorithm::for_quota`]). A key checked under one quota only is
    /// held to that quota exactly, as a limiter built with it would hold
    /// it; the limiter's memory per key does not change.
    ///
    /// ```
    /// use tollgate::{Quota, RateLimiter};
    ///
    /// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let free = Quota::per_minute(2)?;
    /// let pro = Quota::per_minute(100)?;
    /// let limiter: RateLimiter<String> = RateLimiter::keyed(free);
    ///
    /// // A paying user: checked under the pro quota.
    /// for _ in 0..100 {
    ///     assert!(limiter.check_with("paying", &pro)?.is_allowed());
    /// }
    /// assert!(!limiter.check_with("paying", &pro)?.is_allowed());
    ///
    /// // Everyone else under the limiter's own.
    /// assert!(limiter.check("visitor")?.is_allowed());
    /// assert_eq!(limiter.check("visitor")?.limit(), 2);
    /// # Ok(())
    /// # }
    /// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`check`](RateLimiter::check), and [`CheckError::Layout`] for a
    /// quota the limiter's algorithm cannot read its states by: the window
    /// algorithms take quotas of their own burst window only, and a sliding
    /// window counter whose states pack into a word only bursts that fit
    /// it ([`accepts`](RateLimiter::accepts) tells beforehand).
    ///
    /// # Panics
    ///
    /// As [`check`](RateLimiter::check).
    #[inline]
    pub fn check_with<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        quota: &Quota,
    ) -> Result<Decision, CheckError> {
        self.check_n_with(key, 1, quota)
    }

    /// [`check_n`](RateLimiter::check_n) under `quota`, as
    /// [`check_with`](RateLimiter::check_with).
    ///
    /// # Errors
    ///
    /// As [`check_n`](RateLimiter::check_n) (the cost judged against
    /// `quota`'s burst) and [`check_with`](RateLimiter::check_with).
    ///
    /// # Panics
    ///
    /// As [`check`](RateLimiter::check).
    #[inline]
    pub fn check_n_with<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        n: u32,
        quota: &Quota,
    ) -> Result<Decision, CheckError> {
        let carried = Carried(quota);
        self.counted(self.store.check(key, &carried, self.clock.now_ns(), n), n)
    }

    /// [`peek`](RateLimiter::peek) under `quota`, as
    /// [`check_with`](RateLimiter::check_with).
    ///
    /// # Errors
    ///
    /// As [`check_with`](RateLimiter::check_with).
    ///
    /// # Panics
    ///
    /// As [`check`](RateLimiter::check).
    #[inline]
    pub fn peek_with<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        quota: &Quota,
    ) -> Result<Decision, CheckError> {
        self.store.peek(key, quota, self.clock.now_ns(), 1)
    }

    /// Whether checks can carry `quota`
    /// ([`check_with`](RateLimiter::check_with)): what to ask when a tier's
    /// quota is configured, rather than on its first request.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::algorithm::FixedWindow;
    /// use tollgate::{Builder, LayoutError, Quota};
    ///
    /// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Builder::new(Quota::per_minute(60)?)
    ///     .algorithm::<FixedWindow>()
    ///     .build::<String>();
    /// assert!(limiter.accepts(&Quota::per_minute(6_000)?).is_ok());
    /// assert_eq!(
    ///     limiter.accepts(&Quota::per_second(100)?),
    ///     Err(LayoutError::WindowDiffers {
    ///         limiter: Duration::from_secs(60),
    ///         quota: Duration::from_secs(1),
    ///     }),
    /// );
    /// # Ok(())
    /// # }
    /// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// The [`LayoutError`] every check carrying `quota` would return.
    pub fn accepts(&self, quota: &Quota) -> Result<(), LayoutError> {
        self.store
            .generation()
            .algorithm()
            .for_quota(quota)
            .map(drop)
    }

    /// The decision [`check`](RateLimiter::check) would return for `key` now,
    /// consuming nothing and storing nothing.
    ///
    /// Like every decision, its [`remaining`](Decision::remaining) counts
    /// after the check it predicts: a fresh key with a burst of 5 peeks as
    /// allowed with 4 remaining. The units available right now are
    /// `remaining + 1` when it is allowed and `remaining` when it is denied.
    ///
    /// # Errors
    ///
    /// As [`check`](RateLimiter::check).
    #[inline]
    pub fn peek<Q: Lookup<K> + ?Sized>(&self, key: &Q) -> Result<Decision, CheckError> {
        self.store.peek(key, &Own, self.clock.now_ns(), 1)
    }

    /// [`check_n`](RateLimiter::check_n), and for an admission a receipt
    /// for [`refund`](RateLimiter::refund) ([`Algorithm::receipt`]). A
    /// limiter whose key cap admits
    /// new keys untracked ([`WhenFull::AdmitUntracked`](crate::store::WhenFull::AdmitUntracked))
    /// gives none: an untracked admission stores nothing to give back.
    ///
    /// ```
    /// use tollgate::algorithm::Refund;
    /// use tollgate::{Quota, RateLimiter};
    ///
    /// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter: RateLimiter<String> = RateLimiter::keyed(Quota::per_hour(1)?);
    /// let (decision, receipt) = limiter.check_n_receipt("alice", 1)?;
    /// assert!(decision.is_allowed());
    /// // Another limit refused the request: give this admission back.
    /// assert_eq!(limiter.refund("alice", receipt.unwrap()), Refund::Full);
    /// assert!(limiter.check("alice")?.is_allowed());
    /// # Ok(())
    /// # }
    /// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`check_n`](RateLimiter::check_n).
    #[inline]
    #[allow(clippy::type_complexity)]
    pub fn check_n_receipt<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        n: u32,
    ) -> Result<(Decision, Option<Receipt>), CheckError> {
        self.check_by_receipt(key, &Own, n)
    }

    /// [`check_n_receipt`](RateLimiter::check_n_receipt) under `quota`, as
    /// [`check_with`](RateLimiter::check_with). The receipt gives back to
    /// the key whatever quota checks it next.
    ///
    /// # Errors
    ///
    /// As [`check_n_with`](RateLimiter::check_n_with).
    ///
    /// # Panics
    ///
    /// As [`check`](RateLimiter::check).
    #[inline]
    #[allow(clippy::type_complexity)]
    pub fn check_n_receipt_with<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        n: u32,
        quota: &Quota,
    ) -> Result<(Decision, Option<Receipt>), CheckError> {
        self.check_by_receipt(key, &Carried(quota), n)
    }

    /// A check by the algorithm `under` chooses, and its receipt.
    #[inline]
    #[allow(clippy::type_complexity)]
    fn check_by_receipt<Q: Lookup<K> + ?Sized, U: Under<A>>(
        &self,
        key: &Q,
        under: &U,
        n: u32,
    ) -> Result<(Decision, Option<Receipt>), CheckError> {
        let now_ns = self.clock.now_ns();
        let checked = self.store.check_receipt(key, under, now_ns, n);
        let decision = self.counted(
            checked
                .as_ref()
                .map(|(decision, _)| *decision)
                .map_err(|error| *error),
            n,
        )?;
        let receipt = checked.ok().and_then(|(_, receipt)| receipt);
        Ok((decision, receipt))
    }

    /// [`check_n`](RateLimiter::check_n) (under `quota` if given, as
    /// [`check_n_with`](RateLimiter::check_n_with)), and the quota that
    /// decided it: the one the check carried, or the limiter's own as it
    /// stood for the key's state ([`set_quota`](RateLimiter::set_quota)
    /// may change it at any moment, so that [`quota`](RateLimiter::quota)
    /// read beside the check may be another). What a layer in front of a
    /// server advertises with the decision.
    ///
    /// # Errors
    ///
    /// As [`check_n_with`](RateLimiter::check_n_with).
    ///
    /// # Panics
    ///
    /// As [`check`](RateLimiter::check).
    #[inline]
    pub fn check_n_quoted<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        n: u32,
        quota: Option<&Quota>,
    ) -> Result<(Decision, Quota), CheckError> {
        let checked = self.quoted_then(key, n, quota, |_, _, decision, (quota, _)| {
            (decision, quota)
        });
        self.counted_with(checked, n, |(decision, _)| decision)
    }

    /// [`check_n_quoted`](RateLimiter::check_n_quoted) with the receipt
    /// of [`check_n_receipt`](RateLimiter::check_n_receipt).
    ///
    /// # Errors
    ///
    /// As [`check_n_with`](RateLimiter::check_n_with).
    ///
    /// # Panics
    ///
    /// As [`check`](RateLimiter::check).
    #[inline]
    #[allow(clippy::type_complexity)]
    pub fn check_n_receipt_quoted<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        n: u32,
        quota: Option<&Quota>,
    ) -> Result<(Decision, Option<Receipt>, Quota), CheckError> {
        let checked = self.quoted_then(
            key,
            n,
            quota,
            |generation, algorithm, decision, (quota, now_ns)| {
                (
                    decision,
                    generation.receipt(algorithm, &decision, now_ns, n),
                    quota,
                )
            },
        );
        self.counted_with(checked, n, |(decision, _, _)| decision)
    }

    /// A check under `quota` (or the limiter's own), and `finish` of its
    /// generation, algorithm, decision, and the quota that decided it with
    /// the reading it was decided at.
    #[inline]
    fn quoted_then<Q: Lookup<K> + ?Sized, R>(
        &self,
        key: &Q,
        n: u32,
        quota: Option<&Quota>,
        finish: impl Fn(&Generation<A>, &A, Decision, (Quota, u64)) -> R,
    ) -> Result<R, CheckError> {
        let now_ns = self.clock.now_ns();
        let quoted = |generation: &Generation<A>, algorithm: &A, decision: Decision| {
            let quota = quota.or(generation.quota()).copied().expect(QUOTED);
            finish(generation, algorithm, decision, (quota, now_ns))
        };
        match quota {
            None => self.store.check_then(key, &Own, now_ns, n, quoted),
            Some(quota) => self
                .store
                .check_then(key, &Carried(quota), now_ns, n, quoted),
        }
    }

    /// Gives back the admission `receipt` came with (a request another
    /// limit refused), as far as it can without admitting more than the
    /// quota; returns how much ([`Refund`]).
    ///
    /// - The window algorithms give it all back ([`Refund::Full`]) while
    ///   the key counts in its window (or, for the sliding counter, the one
    ///   after): every decision from then on is the one it would have been
    ///   without that admission. Once the window has passed there is
    ///   nothing left to give back ([`Refund::Nothing`]).
    /// - GCRA and the token bucket give it all back if no other admission
    ///   followed it on the key. If others did, they give back its refill
    ///   time less the time elapsed since it was decided (and a
    ///   microsecond's margin for the clock): [`Refund::Partial`], nearly
    ///   all of it for a refund made at once.
    ///
    /// A receipt of another limiter (or made by hand) gives back nothing.
    /// One of this limiter's used with another key would take that key's
    /// units: a receipt belongs to its key (and to the key as it was: one
    /// whose `Hash` or `Eq` changed since gives the units to whichever key
    /// it now equals).
    ///
    /// Between the admission and its refund, other checks of the key see
    /// it charged: they may be denied where they would not have been
    /// (over-denial), never admitted where they would not have been. See
    /// note 11, "All or nothing", for the argument and its one exception:
    /// a window algorithm's check whose clock reading was older than the
    /// window the key already counted in stays charged in that window.
    ///
    /// # Panics
    ///
    /// As [`check`](RateLimiter::check), for this key's user code.
    #[allow(clippy::needless_pass_by_value)] // consumed: a receipt gives back once
    pub fn refund<Q: Lookup<K> + ?Sized>(&self, key: &Q, receipt: Receipt) -> Refund {
        if !self.receipts {
            return Refund::Nothing;
        }
        refund_through(|released| {
            self.store.update(key, |generation, state| {
                released(generation.release(state, &receipt, release_reading(&self.clock)))
            })
        })
    }

    /// Replaces the quota every key is held to, at once and without losing
    /// what keys have used: each stored key's state is carried over by
    /// `carry` ([`Carry`]: as is, in proportion, or unchanged), and checks
    /// that begin after this returns decide by `quota`.
    ///
    /// ```
    /// use tollgate::algorithm::Carry;
    /// use tollgate::clock::ManualClock;
    /// use tollgate::{Builder, Quota};
    ///
    /// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Builder::new(Quota::per_minute(10)?)
    ///     .clock(ManualClock::new())
    ///     .build::<String>();
    /// for _ in 0..4 {
    ///     assert!(limiter.check("alice")?.is_allowed());
    /// }
    /// // Raised to 20 a minute: alice keeps the 6 units she had left (as
    /// // is), where a new key has the whole new burst.
    /// limiter.set_quota(Quota::per_minute(20)?, Carry::AsIs)?;
    /// assert_eq!(limiter.peek("alice")?.remaining() + 1, 6);
    /// assert_eq!(limiter.peek("bob")?.remaining() + 1, 20);
    /// # Ok(())
    /// # }
    /// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
    /// ```
    ///
    /// Each key moves atomically with respect to its checks: a check
    /// decides wholly under the old quota, before its key moves, or wholly
    /// under the new one. Keys move shard by shard, so while this runs a
    /// check of one key may see the new quota and a check of another the
    /// old. Receipts of admissions before the change give nothing back
    /// after it ([`refund`](RateLimiter::refund)): a refused request that
    /// spans a change stays charged (over-denial, never over-admission).
    /// Reservations already waiting keep their slots: the time they booked
    /// beyond the tolerance is kept as it is, so that checks after the
    /// change come after them. Each shard's states are carried at a clock
    /// reading taken once they can no longer change, at whichever end of
    /// the clock's disorder leaves them more used
    /// ([`Clock::disorder_ns`](crate::clock::Clock::disorder_ns)).
    ///
    /// A limiter whose checks have carried quotas of their own
    /// ([`check_with`](RateLimiter::check_with), tiers) changes only by
    /// [`Carry::Unchanged`], which keeps every state as it is, whatever
    /// quota checked it: the store does not know which keys are a tier's,
    /// and rescaling a tier key by this limiter's quota could hand it units
    /// its own quota never gave. (Should a check carry a quota for the
    /// first time while a change runs, the shards moved after it are
    /// carried unchanged.)
    ///
    /// It takes each shard's lock in turn and rebuilds the shard (the
    /// lock-free store) or rewrites its states: a pass over every key. On
    /// the lock-free and per-key stores, retiring a locked cell (the token
    /// bucket's and the sliding log's) takes the cell's own lock, so a
    /// thread stalled inside such a key's check, or a refund's clock
    /// reading that blocks, holds the change until it goes on, and with it
    /// the shard's new keys (the lock-free store) or every key's lookup
    /// (the per-key store, whose one table lock the change holds).
    /// [`quota`](RateLimiter::quota) answers the old quota until it
    /// returns.
    ///
    /// # Errors
    ///
    /// [`ChangeError::Layout`] for a quota the limiter's states cannot be
    /// read by ([`accepts`](RateLimiter::accepts): the window algorithms
    /// keep their burst window), [`ChangeError::Unsupported`] for an
    /// algorithm that does not carry states ([`Algorithm::carry`]),
    /// [`ChangeError::CarriedQuotas`] for a strategy other than
    /// [`Carry::Unchanged`] on a limiter whose checks carried quotas,
    /// [`ChangeError::StoreFixed`] for a store that cannot change, and
    /// [`ChangeError::Reclaiming`] while a check stalled inside the
    /// lock-free store holds back a shard that a change already went past
    /// during the same stall (a change goes past a stall once, keeping one
    /// replaced table more than growth may). Nothing changes on error.
    ///
    /// # Panics
    ///
    /// If the algorithm's code panics while carrying a state (never the
    /// crate's algorithms): the shards already moved stay under `quota`,
    /// the others under the old one, every key exactly under one of them,
    /// and [`quota`](RateLimiter::quota) still reports the old one. Also
    /// if other keys' `Hash` or `Clone` panic in a rebuild, as for
    /// [`check`](RateLimiter::check).
    pub fn set_quota(&self, quota: Quota, carry: Carry) -> Result<(), ChangeError> {
        let _changing = lock(&self.changing);
        let from = self.store.generation();
        let algorithm = from.algorithm().for_quota(&quota)?;
        let at = || {
            // After the load (the store's lock, or its retiring swap) that
            // froze the states: ordered after their writers' readings
            // (`Clock::ordered`), to within the clock's disorder.
            acquire_fence();
            CarryAt {
                now_ns: self.clock.now_ns(),
                disorder_ns: self.clock.disorder_ns(),
            }
        };
        self.store.change(
            Generation::new(algorithm)
                .with_quota(quota)
                .with_receipts(from.issuer().is_some()),
            carry,
            &at,
        )?;
        *lock(&self.quota) = quota;
        Ok(())
    }

    /// The quota every key is held to (the last one
    /// [`set_quota`](RateLimiter::set_quota) set).
    #[must_use]
    pub fn quota(&self) -> Quota {
        *lock(&self.quota)
    }

    /// How many keys hold state (keys that have been admitted at least once).
    #[must_use]
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether no key holds state.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// Removes every key whose state is indistinguishable from a fresh key's
    /// (see [`Algorithm::is_idle`]), so no later decision changes, and gives
    /// their memory back; returns how many. Stores also do this amortized as
    /// they grow; call it to give memory back after a burst of one-off keys.
    ///
    /// On the lock-free store it also rebuilds every shard it evicted from,
    /// smaller when the shard's table has at least four times the buckets
    /// its remaining keys need (about 18 % full or less), and waits until the
    /// tables it replaced are freed: for checks already in flight, not for
    /// new ones, and for a bounded number of rounds, so that a check stalled
    /// inside a table (a key's `Eq` blocked on a lock) cannot hold it. What
    /// such a check holds back is freed by a later writer of the shard.
    pub fn evict_idle(&self) -> usize {
        let evicted = self.store.evict_idle(self.clock.now_ns());
        #[cfg(feature = "metrics")]
        if let Some(counts) = &self.counts {
            counts.count_evicted(evicted);
        }
        evicted
    }

    /// Hands this limiter's counts to the `metrics` recorder installed
    /// (feature `metrics`; counted only for a limiter built with
    /// [`Builder::metrics`]): call it before the recorder renders them
    /// (a `/metrics` handler). The check path writes no shared line to
    /// count; this call adds up every thread's counts. See
    /// [`crate::metrics`] for the names.
    #[cfg(feature = "metrics")]
    pub fn publish_metrics(&self) {
        if let Some(counts) = &self.counts {
            counts.publish(Some(self.len()));
        }
    }

    /// Counts a check's `outcome` of `n` units (feature `metrics`, for a
    /// limiter built with [`Builder::metrics`]; otherwise nothing).
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    fn counted(
        &self,
        outcome: Result<Decision, CheckError>,
        n: u32,
    ) -> Result<Decision, CheckError> {
        #[cfg(feature = "metrics")]
        if let Some(counts) = &self.counts {
            counts.count(&outcome, n);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = n;
        outcome
    }

    /// Counts a check's `outcome` of `n` units, whose decision `decision`
    /// finds, as [`counted`](Self::counted).
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    fn counted_with<T>(
        &self,
        outcome: Result<T, CheckError>,
        n: u32,
        decision: impl Fn(&T) -> &Decision,
    ) -> Result<T, CheckError> {
        #[cfg(feature = "metrics")]
        if let Some(counts) = &self.counts {
            counts.count(
                &outcome
                    .as_ref()
                    .map(|checked| *decision(checked))
                    .map_err(|error| *error),
                n,
            );
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (n, decision);
        outcome
    }
}

impl<K: Key, A: Algorithm, C: Clock, S: StoreKind<K, A>> fmt::Debug for RateLimiter<K, A, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("quota", &self.quota())
            .field("generation", &self.store.generation())
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// Gives back an admission through `update` (a store's or a cell's,
/// applying a change atomically with every check; whether it changed the
/// state), which hands each release it computes ([`Algorithm::release`])
/// to the function it is given, and installs the state that returns.
/// Returns how much it gave back.
fn refund_through<S>(
    update: impl FnOnce(&dyn Fn(Option<(S, Refund)>) -> Option<S>) -> bool,
) -> Refund {
    let given = std::cell::Cell::new(Refund::Nothing);
    let changed = update(&|released| {
        let (released, refund) = released?;
        given.set(refund);
        Some(released)
    });
    if changed {
        given.get()
    } else {
        Refund::Nothing
    }
}

/// The reading a release is measured to ([`Algorithm::release`]), taken
/// after the state was loaded, if the clock's readings are ordered.
fn release_reading(clock: &impl Clock) -> Option<u64> {
    clock.ordered().then(|| {
        // The reading must come after the load of the state (on weakly
        // ordered hardware a load of a clock's cached word could otherwise
        // be served first): every admission the state holds computed its
        // word from its own reading, so that reading precedes its write,
        // which this load saw (`Clock::ordered`).
        acquire_fence();
        clock.now_ns()
    })
}

/// A keyed limiter's generations carry their quota (`Builder::build`,
/// `RateLimiter::set_quota`).
const QUOTED: &str = "a limiter's generations carry their quota";

/// Only stores retire cells (eviction, migration); a direct limiter's cell is
/// private and never retired, so its checks always decide.
const NEVER_RETIRED: &str = "a direct limiter never retires its cell";

/// A rate limiter for one shared budget (one upstream, one queue), with no
/// key lookup. Its state is one [`Cell`], chosen by `P` (see
/// [`Builder::build_direct_with_cells`]).
///
/// ```
/// use tollgate::{Builder, Quota};
/// use tollgate::algorithm::TokenBucket;
///
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Builder::new(Quota::per_second(100)?)
///     .algorithm::<TokenBucket>()
///     .build_direct();
/// let decision = limiter.check_n(40)?;
/// assert!(decision.is_allowed());
/// assert_eq!(decision.remaining(), 60);
/// # Ok(())
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
pub struct DirectLimiter<A: Algorithm = Gcra, C: Clock = TscClock, P: CellFor<A> = Preferred> {
    pub(crate) quota: Quota,
    pub(crate) algorithm: A,
    pub(crate) clock: C,
    pub(crate) cell: P::Cell,
    /// Reservations waiting for their slot (GCRA only; `crate::wait`).
    pub(crate) queues: Queues<()>,
    /// The stamp of this limiter's receipts.
    pub(crate) issuer: NonZeroU64,
}

impl DirectLimiter {
    /// A direct limiter with the defaults: GCRA, the [`TscClock`].
    #[must_use]
    pub fn direct(quota: Quota) -> Self {
        Builder::new(quota).build_direct()
    }
}

impl<A: Algorithm, C: Clock, P: CellFor<A>> DirectLimiter<A, C, P> {
    /// Checks one unit request, consuming it if admitted.
    ///
    /// # Errors
    ///
    /// As [`check_n`](DirectLimiter::check_n); never for a unit cost today.
    #[inline]
    pub fn check(&self) -> Result<Decision, CheckError> {
        self.check_n(1)
    }

    /// Checks a request costing `n` units, atomically.
    ///
    /// # Errors
    ///
    /// [`CheckError::ZeroCost`] for `n == 0`, and
    /// [`CheckError::InsufficientCapacity`] for `n` above the burst.
    #[inline]
    #[allow(clippy::missing_panics_doc)] // NEVER_RETIRED: an internal invariant
    pub fn check_n(&self, n: u32) -> Result<Decision, CheckError> {
        let decision = self.cell.check(&self.algorithm, self.clock.now_ns(), n)?;
        Ok(decision.expect(NEVER_RETIRED))
    }

    /// The decision [`check`](DirectLimiter::check) would return now,
    /// consuming nothing.
    ///
    /// # Errors
    ///
    /// As [`check`](DirectLimiter::check).
    #[inline]
    #[allow(clippy::missing_panics_doc)] // NEVER_RETIRED: an internal invariant
    pub fn peek(&self) -> Result<Decision, CheckError> {
        let decision = self.cell.peek(&self.algorithm, self.clock.now_ns(), 1)?;
        Ok(decision.expect(NEVER_RETIRED))
    }

    /// [`check_n`](DirectLimiter::check_n) with a receipt for
    /// [`refund`](DirectLimiter::refund), as
    /// [`RateLimiter::check_n_receipt`].
    ///
    /// # Errors
    ///
    /// As [`check_n`](DirectLimiter::check_n).
    #[inline]
    #[allow(clippy::missing_panics_doc)] // NEVER_RETIRED: an internal invariant
    #[allow(clippy::type_complexity)]
    pub fn check_n_receipt(&self, n: u32) -> Result<(Decision, Option<Receipt>), CheckError> {
        let now_ns = self.clock.now_ns();
        let decision = self
            .cell
            .check(&self.algorithm, now_ns, n)?
            .expect(NEVER_RETIRED);
        let receipt = self.algorithm.receipt(&decision, now_ns, n);
        Ok((
            decision,
            receipt.map(|receipt| receipt.issued_by(self.issuer)),
        ))
    }

    /// Gives back the admission `receipt` came with, as
    /// [`RateLimiter::refund`].
    #[allow(clippy::missing_panics_doc)] // NEVER_RETIRED: an internal invariant
    #[allow(clippy::needless_pass_by_value)] // consumed: a receipt gives back once
    pub fn refund(&self, receipt: Receipt) -> Refund {
        if receipt.issuer() != Some(self.issuer) {
            return Refund::Nothing;
        }
        refund_through(|released| {
            self.cell
                .update(&self.algorithm, |state| {
                    let now_ns = release_reading(&self.clock);
                    released(self.algorithm.release(state, &receipt, now_ns))
                })
                .expect(NEVER_RETIRED)
        })
    }

    /// The quota the limiter enforces.
    #[must_use]
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// Replaces the quota, the budget's state carried over by `carry`, as
    /// [`RateLimiter::set_quota`] carries each key's.
    ///
    /// It takes `&mut self`: a direct limiter is one cell, and its checks
    /// reach it with no indirection a change could swap, so a change needs
    /// the limiter to itself (no check or reservation can be in flight). A
    /// limiter shared between threads changes through a keyed limiter
    /// instead, keyed by `()`, whose `set_quota` takes `&self`. Receipts
    /// made before the change give nothing back after it.
    ///
    /// ```
    /// use tollgate::algorithm::Carry;
    /// use tollgate::clock::ManualClock;
    /// use tollgate::{Builder, Quota};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut limiter = Builder::new(Quota::per_minute(3)?)
    ///     .clock(ManualClock::new())
    ///     .build_direct();
    /// assert!(limiter.check()?.is_allowed());
    /// // One of 3 used, 2 free; as is, 2 stay free, now of 6.
    /// limiter.set_quota(Quota::per_minute(6)?, Carry::AsIs)?;
    /// assert_eq!(limiter.quota().burst(), 6);
    /// assert!(limiter.check()?.is_allowed());
    /// assert!(limiter.check()?.is_allowed());
    /// assert!(!limiter.check()?.is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ChangeError::Layout`] for a quota the state cannot be read by (the
    /// window algorithms keep their burst window) and
    /// [`ChangeError::Unsupported`] for an algorithm that does not carry
    /// states. Nothing changes on error.
    ///
    /// # Panics
    ///
    /// If the clock, or the algorithm's code while carrying the state,
    /// panics (never the crate's algorithms); nothing has changed then. A
    /// panic in the old state's or algorithm's `Drop` is caught: the change
    /// is made.
    pub fn set_quota(&mut self, quota: Quota, carry: Carry) -> Result<(), ChangeError> {
        let algorithm = self.algorithm.for_quota(&quota)?;
        let at = CarryAt {
            now_ns: self.clock.now_ns(),
            disorder_ns: self.clock.disorder_ns(),
        };
        let cell = self
            .cell
            .carried(&self.algorithm, &algorithm, carry, at)
            .ok_or(ChangeError::Unsupported)?;
        let old = (
            std::mem::replace(&mut self.cell, cell),
            std::mem::replace(&mut self.algorithm, algorithm),
        );
        self.quota = quota;
        self.issuer = crate::sync::next_issuer();
        // The old state's and algorithm's `Drop` once the change is whole:
        // a panic there changes nothing.
        drop(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
            move || drop(old),
        )));
        Ok(())
    }
}

impl<A: Algorithm, C: Clock, P: CellFor<A>> fmt::Debug for DirectLimiter<A, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectLimiter")
            .field("quota", &self.quota)
            .field("algorithm", &self.algorithm)
            .field("cell", &self.cell)
            .finish_non_exhaustive()
    }
}
