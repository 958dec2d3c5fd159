//! [`Builder`]: chooses a limiter's parts.
//!
//! The builder's third type parameter records whether a keyed-only part (a
//! store or a key cap) was chosen: [`NoStoreChosen`] until then,
//! [`StoreChosen`] after. [`Builder::build_direct`] exists only on the
//! first, so a store or cap chosen for a direct limiter, which has neither,
//! is a compile error rather than a setting silently ignored:
//!
//! ```compile_fail,E0599
//! use std::num::NonZeroUsize;
//! use tollgate::{Builder, Quota};
//! use tollgate::store::WhenFull;
//!
//! let direct = Builder::new(Quota::per_second(5).unwrap())
//!     .max_keys(NonZeroUsize::new(10).unwrap(), WhenFull::Reject)
//!     .build_direct(); // no such method once a cap is chosen
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::num::NonZeroUsize;

use crate::algorithm::{Algorithm, Gcra};
use crate::cell::{Cell, CellFor, Preferred};
use crate::clock::{Clock, TscClock};
use crate::limiter::{DirectLimiter, RateLimiter};
use crate::quota::Quota;
use crate::store::{DefaultStore, Generation, Key, KeyCap, StoreKind, WhenFull};
use crate::sync::next_issuer;
use crate::wait::Queues;

/// Chooses a limiter's algorithm, clock, store and key cap; starts from the
/// defaults (GCRA, [`TscClock`], [`DefaultStore`], no cap).
///
/// ```
/// use std::num::NonZeroUsize;
/// use tollgate::{Builder, Quota};
/// use tollgate::algorithm::SlidingWindowLog;
/// use tollgate::clock::ManualClock;
/// use tollgate::store::WhenFull;
///
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = ManualClock::new();
/// let limiter = Builder::new(Quota::per_hour(5)?)
///     .algorithm::<SlidingWindowLog>()
///     .clock(clock.clone())
///     .max_keys(NonZeroUsize::new(10_000).unwrap(), WhenFull::Reject)
///     .build::<u64>();
/// for _ in 0..5 {
///     assert!(limiter.check(&42)?.is_allowed());
/// }
/// assert!(!limiter.check(&42)?.is_allowed());
/// # Ok(())
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
pub struct Builder<A = Gcra, C = TscClock, T = NoStoreChosen> {
    quota: Quota,
    clock: ChosenClock<C>,
    keyed: T,
    algorithm: PhantomData<fn() -> A>,
    /// The name a keyed limiter's counts go by (`Builder::metrics`).
    #[cfg(feature = "metrics")]
    metrics: Option<metrics::SharedString>,
}

/// A builder's clock: the one chosen, or the default, made only when a
/// limiter is built, so that a builder given another clock never builds
/// (and never calibrates) a [`TscClock`].
enum ChosenClock<C> {
    Chosen(C),
    Default(fn() -> C),
}

impl<C> ChosenClock<C> {
    fn into_clock(self) -> C {
        match self {
            Self::Chosen(clock) => clock,
            Self::Default(make) => make(),
        }
    }
}

impl<C: fmt::Debug> fmt::Debug for ChosenClock<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Chosen(clock) => clock.fmt(f),
            Self::Default(_) => f.write_str("the default clock, made when a limiter is built"),
        }
    }
}

/// The builder state before a store or a key cap is chosen: it builds keyed
/// limiters on the [`DefaultStore`], and direct limiters.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoStoreChosen;

/// The builder state once a store or a key cap is chosen: it builds keyed
/// limiters only.
#[derive(Debug, Clone)]
pub struct StoreChosen<S> {
    store: S,
    cap: Option<KeyCap>,
}

impl Builder {
    /// A builder with the defaults.
    #[must_use]
    pub fn new(quota: Quota) -> Self {
        Self {
            quota,
            clock: ChosenClock::Default(TscClock::new),
            keyed: NoStoreChosen,
            algorithm: PhantomData,
            #[cfg(feature = "metrics")]
            metrics: None,
        }
    }
}

impl<A: Algorithm, C: Clock, T> Builder<A, C, T> {
    /// Chooses the algorithm.
    #[must_use]
    pub fn algorithm<A2: Algorithm>(self) -> Builder<A2, C, T> {
        Builder {
            quota: self.quota,
            clock: self.clock,
            keyed: self.keyed,
            algorithm: PhantomData,
            #[cfg(feature = "metrics")]
            metrics: self.metrics,
        }
    }

    /// Chooses the clock.
    #[must_use]
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<A, C2, T> {
        Builder {
            quota: self.quota,
            clock: ChosenClock::Chosen(clock),
            keyed: self.keyed,
            algorithm: PhantomData,
            #[cfg(feature = "metrics")]
            metrics: self.metrics,
        }
    }

    /// Counts the keyed limiter's decisions for the `metrics` facade under
    /// the label `limiter="name"` (feature `metrics`; see
    /// [`crate::metrics`] for the names, and
    /// [`RateLimiter::publish_metrics`]). Without it a limiter counts
    /// nothing; a direct limiter counts nothing either way. Limiters of
    /// one name add up.
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn metrics(mut self, name: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        self.metrics = Some(match name.into() {
            std::borrow::Cow::Borrowed(name) => metrics::SharedString::const_str(name),
            std::borrow::Cow::Owned(name) => name.into(),
        });
        self
    }

    /// The builder with its keyed-only parts set to `keyed`.
    fn keyed<S>(self, keyed: StoreChosen<S>) -> Builder<A, C, StoreChosen<S>> {
        Builder {
            quota: self.quota,
            clock: self.clock,
            keyed,
            algorithm: PhantomData,
            #[cfg(feature = "metrics")]
            metrics: self.metrics,
        }
    }
}

impl<A: Algorithm, C: Clock> Builder<A, C, NoStoreChosen> {
    /// Chooses the store (keyed limiters only).
    #[must_use]
    pub fn store<S>(self, store: S) -> Builder<A, C, StoreChosen<S>> {
        self.keyed(StoreChosen { store, cap: None })
    }

    /// Caps the keys a keyed limiter holds at `max_keys`; `when_full` is
    /// what a new key past the cap gets, once idle keys are evicted. Keys
    /// already held are never evicted to make room unless idle, so their
    /// decisions never change.
    #[must_use]
    pub fn max_keys(
        self,
        max_keys: NonZeroUsize,
        when_full: WhenFull,
    ) -> Builder<A, C, StoreChosen<DefaultStore>> {
        self.store(DefaultStore::default())
            .max_keys(max_keys, when_full)
    }

    /// Builds a keyed limiter on the [`DefaultStore`].
    #[must_use]
    pub fn build<K: Key>(self) -> RateLimiter<K, A, C>
    where
        DefaultStore: StoreKind<K, A>,
    {
        self.store(DefaultStore::default()).build()
    }

    /// Builds a direct (single-budget) limiter with the [`Preferred`] cell.
    #[must_use]
    pub fn build_direct(self) -> DirectLimiter<A, C>
    where
        Preferred: CellFor<A>,
    {
        self.build_direct_with_cells()
    }

    /// Builds a direct limiter whose state lives in the cell `P` chooses
    /// (for example [`AlwaysLocked`](crate::cell::AlwaysLocked), to measure
    /// the atomic cell against a mutex).
    #[must_use]
    pub fn build_direct_with_cells<P: CellFor<A>>(self) -> DirectLimiter<A, C, P> {
        let algorithm = A::from_quota(&self.quota);
        DirectLimiter {
            cell: P::Cell::new(&algorithm),
            algorithm,
            queues: Queues::new(),
            issuer: next_issuer(),
            quota: self.quota,
            clock: self.clock.into_clock(),
        }
    }
}

impl<A: Algorithm, C: Clock, S> Builder<A, C, StoreChosen<S>> {
    /// Replaces the store (see [`Builder::store`]); the cap stays.
    #[must_use]
    pub fn store<S2>(self, store: S2) -> Builder<A, C, StoreChosen<S2>> {
        let cap = self.keyed.cap;
        self.keyed(StoreChosen { store, cap })
    }

    /// Caps the keys (see [`Builder::max_keys`]).
    #[must_use]
    pub fn max_keys(mut self, max_keys: NonZeroUsize, when_full: WhenFull) -> Self {
        self.keyed.cap = Some(KeyCap::new(max_keys, when_full));
        self
    }

    /// Builds a keyed limiter.
    #[must_use]
    pub fn build<K: Key>(self) -> RateLimiter<K, A, C, S>
    where
        S: StoreKind<K, A>,
    {
        let receipts = self
            .keyed
            .cap
            .is_none_or(|cap| cap.when_full() == WhenFull::Reject);
        let generation = std::sync::Arc::new(
            Generation::new(A::from_quota(&self.quota))
                .with_quota(self.quota)
                .with_receipts(receipts),
        );
        RateLimiter {
            clock: self.clock.into_clock(),
            store: self.keyed.store.build(generation, self.keyed.cap),
            receipts,
            quota: crate::sync::Mutex::new(self.quota),
            changing: crate::sync::Mutex::new(()),
            #[cfg(feature = "metrics")]
            counts: self
                .metrics
                .map(|name| Box::new(crate::metrics::Counts::new(name))),
            queues: Queues::new(),
        }
    }
}

impl<A, C: fmt::Debug, T: fmt::Debug> fmt::Debug for Builder<A, C, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut builder = f.debug_struct("Builder");
        builder
            .field("quota", &self.quota)
            .field("algorithm", &std::any::type_name::<A>())
            .field("clock", &self.clock)
            .field("keyed", &self.keyed);
        #[cfg(feature = "metrics")]
        builder.field("metrics", &self.metrics);
        builder.finish()
    }
}
