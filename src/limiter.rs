//! The public façade: keyed and direct limiters, and their builder.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;

use crate::algorithm::{Algorithm, Gcra};
use crate::cell::Cell;
use crate::clock::{Clock, MonotonicClock};
use crate::decision::Decision;
use crate::error::CheckError;
use crate::quota::Quota;
use crate::store::{DefaultStore, Key, KeyCap, Store, StoreKind, WhenFull};

/// A rate limiter with one quota per key: each key (a user, an IP address, an
/// API token) gets its own budget.
///
/// Built by [`RateLimiter::keyed`] with the defaults (GCRA, the default store,
/// the monotonic clock), or by a [`Builder`] that chooses each part.
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
    C: Clock = MonotonicClock,
    S: StoreKind = DefaultStore,
> {
    quota: Quota,
    algorithm: A,
    clock: C,
    store: S::Store<K, A>,
}

impl<K: Key> RateLimiter<K> {
    /// A keyed limiter with the defaults: GCRA on the [`DefaultStore`] store, the
    /// monotonic clock, no key cap (idle keys are still evicted as the store
    /// grows).
    #[must_use]
    pub fn keyed(quota: Quota) -> Self {
        Builder::new(quota).build()
    }
}

impl<K: Key, A: Algorithm, C: Clock, S: StoreKind> RateLimiter<K, A, C, S> {
    /// Checks one unit request for `key`, consuming it if admitted.
    ///
    /// # Errors
    ///
    /// [`CheckError::StoreFull`] for a new key past a rejecting key cap
    /// ([`Builder::max_keys`]). Never a cost error: every quota admits a
    /// unit.
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n(key, 1)
    }

    /// Checks a request costing `n` units for `key`, atomically: either all
    /// `n` are consumed or none is.
    ///
    /// # Errors
    ///
    /// [`CheckError::ZeroCost`] for `n == 0`,
    /// [`CheckError::InsufficientCapacity`] for `n` above the burst (no wait
    /// would admit it), and [`CheckError::StoreFull`] for a new key past a
    /// rejecting key cap ([`Builder::max_keys`]). Nothing is consumed, and
    /// no key is stored, on error.
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, n: u32) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.store
            .check(key, &self.algorithm, self.clock.now_ns(), n)
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
    pub fn peek<Q>(&self, key: &Q) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.store
            .peek(key, &self.algorithm, self.clock.now_ns(), 1)
    }

    /// The quota every key is held to.
    #[must_use]
    pub fn quota(&self) -> &Quota {
        &self.quota
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
    /// (see [`Algorithm::is_idle`]), so no later decision changes; returns how
    /// many. Stores also do this amortized as they grow; call it to give
    /// memory back after a burst of one-off keys.
    pub fn evict_idle(&self) -> usize {
        self.store.evict_idle(&self.algorithm, self.clock.now_ns())
    }
}

impl<K: Key, A: Algorithm, C: Clock, S: StoreKind> fmt::Debug for RateLimiter<K, A, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("quota", &self.quota)
            .field("algorithm", &self.algorithm)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// Only stores retire cells (eviction, migration); a direct limiter's cell is
/// private and never retired, so its checks always decide.
const NEVER_RETIRED: &str = "a direct limiter never retires its cell";

/// A rate limiter for one shared budget (one upstream, one queue), with no
/// key lookup.
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
pub struct DirectLimiter<A: Algorithm = Gcra, C: Clock = MonotonicClock> {
    quota: Quota,
    algorithm: A,
    clock: C,
    cell: A::Cell,
}

impl DirectLimiter {
    /// A direct limiter with the defaults: GCRA, the monotonic clock.
    #[must_use]
    pub fn direct(quota: Quota) -> Self {
        Builder::new(quota).build_direct()
    }
}

impl<A: Algorithm, C: Clock> DirectLimiter<A, C> {
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

    /// The quota the limiter enforces.
    #[must_use]
    pub fn quota(&self) -> &Quota {
        &self.quota
    }
}

impl<A: Algorithm, C: Clock> fmt::Debug for DirectLimiter<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectLimiter")
            .field("quota", &self.quota)
            .field("algorithm", &self.algorithm)
            .field("cell", &self.cell)
            .finish_non_exhaustive()
    }
}

/// Chooses a limiter's algorithm, clock, store and key cap; starts from the
/// defaults (GCRA, [`MonotonicClock`], [`DefaultStore`], no cap).
///
/// ```
/// use tollgate::{Builder, Quota};
/// use tollgate::algorithm::SlidingWindowLog;
/// use tollgate::clock::ManualClock;
///
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = ManualClock::new();
/// let limiter = Builder::new(Quota::per_hour(5)?)
///     .algorithm::<SlidingWindowLog>()
///     .clock(clock.clone())
///     .build::<u64>();
/// for _ in 0..5 {
///     assert!(limiter.check(&42)?.is_allowed());
/// }
/// assert!(!limiter.check(&42)?.is_allowed());
/// # Ok(())
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
pub struct Builder<A = Gcra, C = MonotonicClock, S = DefaultStore> {
    quota: Quota,
    clock: C,
    store: S,
    cap: Option<KeyCap>,
    algorithm: PhantomData<fn() -> A>,
}

impl Builder {
    /// A builder with the defaults.
    #[must_use]
    pub fn new(quota: Quota) -> Self {
        Self {
            quota,
            clock: MonotonicClock::new(),
            store: DefaultStore::default(),
            cap: None,
            algorithm: PhantomData,
        }
    }
}

impl<A: Algorithm, C: Clock, S: StoreKind> Builder<A, C, S> {
    /// Chooses the algorithm.
    #[must_use]
    pub fn algorithm<A2: Algorithm>(self) -> Builder<A2, C, S> {
        Builder {
            quota: self.quota,
            clock: self.clock,
            store: self.store,
            cap: self.cap,
            algorithm: PhantomData,
        }
    }

    /// Chooses the clock.
    #[must_use]
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<A, C2, S> {
        Builder {
            quota: self.quota,
            clock,
            store: self.store,
            cap: self.cap,
            algorithm: PhantomData,
        }
    }

    /// Chooses the store (keyed limiters only).
    #[must_use]
    pub fn store<S2: StoreKind>(self, store: S2) -> Builder<A, C, S2> {
        Builder {
            quota: self.quota,
            clock: self.clock,
            store,
            cap: self.cap,
            algorithm: PhantomData,
        }
    }

    /// Caps the keys a keyed limiter holds at `max_keys`. A new key past the
    /// cap, once idle keys are evicted, gets the [`when_full`](Builder::when_full)
    /// policy ([`WhenFull::Reject`] unless chosen otherwise). Existing keys are
    /// never evicted to make room unless idle, so their decisions never change.
    #[must_use]
    pub fn max_keys(mut self, max_keys: std::num::NonZeroUsize) -> Self {
        self.cap = Some(KeyCap {
            max_keys: max_keys.get(),
            when_full: self.cap.map_or(WhenFull::default(), |cap| cap.when_full),
        });
        self
    }

    /// What a new key gets past the cap set by
    /// [`max_keys`](Builder::max_keys) (no effect without one).
    #[must_use]
    pub fn when_full(mut self, when_full: WhenFull) -> Self {
        if let Some(cap) = &mut self.cap {
            cap.when_full = when_full;
        }
        self
    }

    /// Builds a keyed limiter.
    #[must_use]
    pub fn build<K: Key>(self) -> RateLimiter<K, A, C, S> {
        RateLimiter {
            algorithm: A::from_quota(&self.quota),
            quota: self.quota,
            clock: self.clock,
            store: self.store.build(self.cap),
        }
    }

    /// Builds a direct (single-budget) limiter; the store is not used.
    #[must_use]
    pub fn build_direct(self) -> DirectLimiter<A, C> {
        let algorithm = A::from_quota(&self.quota);
        DirectLimiter {
            cell: A::Cell::new(&algorithm),
            algorithm,
            quota: self.quota,
            clock: self.clock,
        }
    }
}

impl<A, C: fmt::Debug, S: fmt::Debug> fmt::Debug for Builder<A, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("quota", &self.quota)
            .field("algorithm", &std::any::type_name::<A>())
            .field("clock", &self.clock)
            .field("store", &self.store)
            .field("cap", &self.cap)
            .finish()
    }
}
