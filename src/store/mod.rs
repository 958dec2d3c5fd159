//! How keys find their state.
//!
//! A [`Store`] maps keys to per-key state and applies an algorithm to it
//! under its own discipline. Every store in the crate passes the same
//! conformance suite, which a new store joins with one line.
//!
//! * [`GlobalMutex`]: one mutex-guarded hash table. The baseline.
//! * [`Sharded`]: `N` cache-padded mutex-guarded shards.
//! * [`PerKey`]: one mutex-guarded table of `Arc`'d cells, locked only to
//!   find a key's cell.
//! * `LockFree`: the default; checks on existing keys take no lock (see its
//!   documentation).
//!
//! A key enters a store only when a request on it is admitted: a peek, an
//! invalid cost or a rejected new key never allocates, because a fresh key's
//! state is the algorithm's default and can be decided without storing it.
//!
//! # Bounded memory
//!
//! Keys are usually chosen by clients, so by attackers. Every store
//! therefore
//!
//! * **evicts idle keys exactly**: it removes only a key whose state decides
//!   as a fresh key's would ([`Algorithm::is_idle`]), so eviction never
//!   changes a decision. It does this amortized inside normal operation
//!   (before a shard's table grows, and when the cap is reached), and on
//!   demand with [`Store::evict_idle`], which also gives the memory back;
//! * **caps the number of keys** when asked ([`KeyCap`]), with an explicit
//!   policy for a new key that finds the store full ([`WhenFull`]).
//!
//! # User code
//!
//! A key's `Hash`, `Eq`, `Borrow`, `Clone` (or `ToOwned`) and `Drop`, a
//! `LockFree` store's `BuildHasher`, and an [`Algorithm`]'s methods are
//! user code, and may panic. A panic reaches the call that ran the code and
//! nothing else: every other key decides exactly as it would have,
//! [`Store::len`] stays exact, and no room under the cap is lost. A store
//! calls user code only where a panic loses nothing: before it changes
//! anything, between complete steps (each eviction is counted with the slot
//! it removes), or while it builds a new table that the panic then discards
//! (the lock-free store's rebuilds, the mutex stores' resizes), never while
//! it moves entries it could not put back. Keys a store discards (evicted
//! keys, a rebuilt table's old copies) are dropped after its locks are
//! released, each on its own, and a panic in their `Drop` is caught and
//! discarded: it has no caller to reach, and the request that happened to
//! trigger the eviction was decided already. The crate's tests arm a panic
//! at every call of every site in turn.
//!
//! A key's `Eq`, `Hash` and `Borrow` run inside the store's critical
//! sections (under a shard's lock, or a lock-free check's read section): they
//! must not call back into the same limiter, which, like a `HashMap` key
//! whose `Eq` locks the map it is in, can deadlock. One that blocks delays
//! the checks that wait for it, and, on the lock-free store, the reclamation
//! of replaced tables (see [`LockFree`]'s "Guarantees"), but no writer waits for
//! it without a bound.
//!
//! # Writing a store outside the crate
//!
//! [`Store`] and [`StoreKind`] are open: a store built on another map plugs
//! into [`Builder::store`](crate::Builder::store) like the crate's own. It
//! can hold the crate's [`Cell`](crate::cell::Cell)s, which apply an
//! algorithm's arithmetic to one key's state and retire it, so that
//! eviction loses no admission. The rest of what the crate's stores are
//! built from (the exact key count under a cap, the new-key protocol, the
//! whole-store sweep when a new key finds the store full) is in the module
//! `tollgate::store::kit`, hidden from these pages: it is for backend
//! implementers, documented in its source, and under no semver promise.

mod discard;
#[doc(hidden)]
pub mod kit;
// The lock-free table and its read-copy-update (`sync::rcu`) run under loom
// but compile out under shuttle, where `PerKey`, built only on
// `crate::sync`, stands in for the table.
#[cfg(not(feature = "shuttle"))]
#[allow(unsafe_code)]
mod lock_free;
mod mutex;
mod per_key;

use std::borrow::Borrow;
use std::fmt::Debug;
use std::hash::Hash;
use std::num::NonZeroUsize;

use self::discard::{Discard, Discarded, discard_each, drop_pair, resume_first_panic};
#[cfg(not(feature = "shuttle"))]
pub use lock_free::LockFree;
pub use mutex::{GlobalMutex, Sharded};
pub use per_key::PerKey;

/// The store a limiter uses unless a [`Builder`](crate::Builder) chooses
/// one: [`LockFree`] (under the shuttle feature, [`PerKey`]).
#[cfg(not(feature = "shuttle"))]
pub type DefaultStore = LockFree;

/// The store a limiter uses unless a [`Builder`](crate::Builder) chooses
/// one: under the shuttle feature, [`PerKey`], the stand-in for the
/// lock-free store that shuttle can see into.
#[cfg(feature = "shuttle")]
pub type DefaultStore = PerKey;

use std::num::NonZeroU64;
use std::sync::Arc;

use crate::algorithm::{Algorithm, Carry, CarryAt, Receipt};
use crate::decision::Decision;
use crate::error::{CheckError, LayoutError};
use crate::quota::Quota;

/// A key type a store can hold: hashable, comparable, cloneable and
/// shareable across threads (integers, `String`, tuples, IP addresses, …).
///
/// `Clone` because the lock-free store clones each key into a rebuilt table
/// and lets the old table drop its own copy once no reader can see it, so no
/// key is ever read through a bitwise copy.
///
/// As for any `HashMap` key, a key whose `Hash` or `Eq` changes while it is
/// stored (through interior mutability) is a logic error: the decisions for
/// it are unspecified, but never unsound, and other keys' checks are
/// unaffected. One exception: a receipt given back
/// ([`RateLimiter::refund`](crate::RateLimiter::refund)) through such a key
/// gives its units to whichever key it now equals, as a receipt given back
/// with another key does.
pub trait Key: Hash + Eq + Clone + Send + Sync + 'static {}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Key for K {}

/// A borrowed form of a key `K` that a limiter can be asked about: `K`
/// itself, or a type `K` borrows as (`str` for `String`, `[u8]` for
/// `Vec<u8>`). Implemented for every such type; it names the bound
/// `K: Borrow<Q>, Q: Hash + Eq + ToOwned<Owned = K>` once.
pub trait Lookup<K>: Hash + ToOwned<Owned = K> + private::Sealed<K> {
    /// Whether `stored` is the key this one borrows as.
    fn matches(&self, stored: &K) -> bool;
}

impl<K, Q> Lookup<K> for Q
where
    K: Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    #[inline]
    fn matches(&self, stored: &K) -> bool {
        stored.borrow() == self
    }
}

mod private {
    use std::borrow::Borrow;
    use std::hash::Hash;

    /// Seals [`Lookup`](super::Lookup): its blanket implementation is the
    /// only one.
    pub trait Sealed<K> {}

    impl<K, Q> Sealed<K> for Q
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
    }
}

/// What a store does with a new key when it already holds its cap of keys
/// and none it examined was idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WhenFull {
    /// Fails closed: the new key's check returns
    /// [`CheckError::StoreFull`]. Existing keys keep working. The default.
    #[default]
    Reject,
    /// Fails open: decide the new key as a fresh key and do not store it. It
    /// gets its full burst on every request until a slot frees up, so a
    /// flood of new keys is not limited; existing keys keep their state.
    AdmitUntracked,
}

/// A cap on the number of keys a store holds, and what a new key past it
/// gets. Built by [`Builder::max_keys`](crate::Builder::max_keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyCap {
    max_keys: NonZeroUsize,
    when_full: WhenFull,
}

impl KeyCap {
    /// Creates a cap of `max_keys` keys, with `when_full` for a new key past
    /// them.
    #[must_use]
    pub const fn new(max_keys: NonZeroUsize, when_full: WhenFull) -> Self {
        Self {
            max_keys,
            when_full,
        }
    }

    /// The most keys held at once.
    #[must_use]
    pub const fn max_keys(&self) -> NonZeroUsize {
        self.max_keys
    }

    /// What a new key past the cap gets.
    #[must_use]
    pub const fn when_full(&self) -> WhenFull {
        self.when_full
    }

    /// The outcome for a new key that found the store full, given the
    /// decision a fresh key gets.
    fn outcome(self, fresh: Decision) -> Result<Decision, CheckError> {
        match self.when_full {
            WhenFull::Reject => Err(CheckError::StoreFull {
                max_keys: self.max_keys.get(),
            }),
            WhenFull::AdmitUntracked => Ok(fresh),
        }
    }
}

/// What a store decides by: the algorithm its keys' states are kept in,
/// the quota it was built from (for a limiter's), and the stamp its
/// receipts carry.
///
/// A store holds one generation at a time and every key's state is in it.
/// [`Store::change`] moves every key to a new one (a limiter's
/// [`set_quota`](crate::RateLimiter::set_quota)), carrying each state over;
/// a check decides by the generation the state it reads is in, so that no
/// state is ever read by another generation's algorithm than its own.
#[derive(Debug)]
pub struct Generation<A> {
    algorithm: A,
    quota: Option<Quota>,
    /// Unique in the process: what receipts and reservations are stamped
    /// with.
    number: NonZeroU64,
    receipts: bool,
    /// A check has carried a quota of its own on states of this generation
    /// (or of one it was changed from): its states are no longer all the
    /// limiter's own quota's.
    carried: crate::sync::AtomicBool,
}

impl<A: Algorithm> Generation<A> {
    /// A new generation of `algorithm`, numbered anew, whose admissions
    /// come with receipts. Receipts (and reservations) of one generation
    /// are given back by that generation only: a change makes those of the
    /// one before give back nothing.
    #[must_use]
    pub fn new(algorithm: A) -> Self {
        Self {
            algorithm,
            quota: None,
            number: crate::sync::next_issuer(),
            receipts: true,
            carried: crate::sync::AtomicBool::new(false),
        }
    }

    /// Whether a check has carried a quota of its own on this generation's
    /// states (or on those of one it was changed from).
    #[must_use]
    pub fn has_carried(&self) -> bool {
        // Acquire: a check that reads the mark another set keeps its
        // write to the key's state after this read (see `mark_carried`).
        self.carried.load(crate::sync::Ordering::Acquire)
    }

    /// Marks that a check carries a quota of its own on this generation's
    /// states, before the check writes one. A change reads the mark after
    /// it froze the states it carries (`kit::carry_for`: its retiring swap
    /// or the shard's lock, then a sequentially consistent fence): a check
    /// whose write it froze set the mark before that write (the store and
    /// its fence), or read it set (an acquire load, which keeps the write
    /// after it). That last case, a mark another thread set, rests on
    /// hardware that makes a store visible to every thread at once and
    /// keeps a write after an acquire load (x86-64, `AArch64`), as
    /// `Clock::ordered` does, not on the language's memory model alone.
    #[inline]
    pub fn mark_carried(&self) {
        if !self.has_carried() {
            self.carried.store(true, crate::sync::Ordering::Release);
            crate::sync::seq_cst_fence();
        }
    }

    /// The same generation, marked as one whose states checks carrying
    /// their own quotas wrote, if `from` was.
    #[must_use]
    pub fn carried_from(self, from: &Self) -> Self {
        if from.has_carried() {
            self.carried.store(true, crate::sync::Ordering::Relaxed);
        }
        self
    }

    /// The same generation, labelled with the quota its algorithm was
    /// built from.
    #[must_use]
    pub fn with_quota(self, quota: Quota) -> Self {
        Self {
            quota: Some(quota),
            ..self
        }
    }

    /// The same generation, making receipts or not (a store that admits
    /// keys it does not track makes none: a receipt could match another
    /// admission's state).
    #[must_use]
    pub fn with_receipts(self, receipts: bool) -> Self {
        Self { receipts, ..self }
    }

    /// The quota the algorithm was built from, if it was labelled with it
    /// (a limiter's generations are).
    #[must_use]
    pub const fn quota(&self) -> Option<&Quota> {
        self.quota.as_ref()
    }

    /// The generation's number, unique in the process.
    #[must_use]
    pub const fn number(&self) -> NonZeroU64 {
        self.number
    }

    /// The algorithm the states are kept in.
    #[must_use]
    pub const fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The stamp of this generation's receipts: its number, if it makes
    /// receipts.
    #[must_use]
    pub const fn issuer(&self) -> Option<NonZeroU64> {
        if self.receipts {
            Some(self.number)
        } else {
            None
        }
    }

    /// The receipt of a check by `algorithm` (this generation's or one it
    /// chose, [`Under`]), stamped as this generation's; `None` for a
    /// denial or a generation that makes none.
    #[must_use]
    pub fn receipt(
        &self,
        algorithm: &A,
        decision: &Decision,
        now_ns: u64,
        cost: u32,
    ) -> Option<Receipt> {
        let issuer = self.issuer()?;
        Some(algorithm.receipt(decision, now_ns, cost)?.issued_by(issuer))
    }

    /// `receipt`'s admission taken out of `state` by this generation's
    /// algorithm ([`Algorithm::release`]), if the receipt is this
    /// generation's.
    pub(crate) fn release(
        &self,
        state: &A::State,
        receipt: &Receipt,
        now_ns: Option<u64>,
    ) -> Option<(A::State, crate::algorithm::Refund)> {
        if self.issuer().is_none() || self.issuer() != receipt.issuer() {
            return None;
        }
        self.algorithm.release(state, receipt, now_ns)
    }
}

/// The algorithm a check decides by, chosen from the generation of the
/// state it reads: the generation's own ([`Own`]), one for a quota the
/// check carries (a [`Quota`]: [`Algorithm::for_quota`]), or another of
/// the same layout.
pub trait Under<A: Algorithm> {
    /// The algorithm chosen: a reference to the generation's, or one
    /// derived from it ([`Derived`]).
    type Chosen<'g>: std::ops::Deref<Target = A>
    where
        A: 'g;

    /// The algorithm, from the generation's.
    ///
    /// # Errors
    ///
    /// [`CheckError::Layout`] when the generation cannot read its states
    /// by the one asked for.
    fn choose<'g>(&self, generation: &'g Generation<A>) -> Result<Self::Chosen<'g>, CheckError>;
}

/// An algorithm [`Under::choose`] derived from a generation's.
#[derive(Debug)]
pub struct Derived<A>(pub A);

impl<A> std::ops::Deref for Derived<A> {
    type Target = A;

    #[inline]
    fn deref(&self) -> &A {
        &self.0
    }
}

/// A check under the generation's own quota.
#[derive(Debug, Clone, Copy, Default)]
pub struct Own;

impl<A: Algorithm> Under<A> for Own {
    type Chosen<'g> = &'g A;

    #[inline]
    fn choose<'g>(&self, generation: &'g Generation<A>) -> Result<&'g A, CheckError> {
        Ok(&generation.algorithm)
    }
}

/// A peek (or any read) under a quota of its own, read in the generation's
/// layout.
impl<A: Algorithm> Under<A> for Quota {
    type Chosen<'g> = Derived<A>;

    #[inline]
    fn choose(&self, generation: &Generation<A>) -> Result<Derived<A>, CheckError> {
        Ok(Derived(generation.algorithm.for_quota(self)?))
    }
}

/// A check that carries a quota of its own and may write the key's state
/// under it: as a [`Quota`], and it marks the generation
/// ([`Generation::mark_carried`]), so that a change of the limiter's quota
/// leaves its states unchanged.
#[derive(Debug, Clone, Copy)]
pub struct Carried<'q>(pub &'q Quota);

impl<A: Algorithm> Under<A> for Carried<'_> {
    type Chosen<'g> = Derived<A>;

    #[inline]
    fn choose(&self, generation: &Generation<A>) -> Result<Derived<A>, CheckError> {
        let algorithm = generation.algorithm.for_quota(self.0)?;
        generation.mark_carried();
        Ok(Derived(algorithm))
    }
}

/// Why [`Store::change`] refused a change; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChangeError {
    /// The new quota cannot be read in the store's layout (see
    /// [`Algorithm::for_quota`]).
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The algorithm does not carry states over
    /// ([`Algorithm::carry`] returned `None`).
    #[error("the limiter's algorithm does not carry states to another quota")]
    Unsupported,
    /// The store cannot change its generation.
    #[error("the store does not change its quota")]
    StoreFixed,
    /// A check stalled inside the lock-free store holds back the
    /// reclamation of a shard that a change during the same stall already
    /// went past (see [`LockFree`]'s "Reclamation"): try again once it
    /// leaves.
    #[error("a stalled check holds back reclamation; a quota change must wait for it")]
    Reclaiming,
    /// Checks have carried quotas of their own (tiers): their keys' states
    /// are not the limiter's quota's to rescale, so only
    /// [`Carry::Unchanged`] is taken.
    #[error(
        "checks have carried their own quotas: only `Carry::Unchanged` changes this limiter's quota"
    )]
    CarriedQuotas,
}

/// A map from keys to per-key state, and the discipline that applies an
/// algorithm to it.
pub trait Store<K: Key, A: Algorithm>: Debug + Send + Sync {
    /// Decides `cost` units for `key` at `now_ns`, by the algorithm `under`
    /// chooses from the generation of the key's state, and, if admitted,
    /// consumes them; read, decide and write are atomic with respect to
    /// every other check on the same key. Returns what `finish` makes of
    /// the decision, given the generation and the algorithm that decided
    /// it (called once per decided check).
    ///
    /// # Errors
    ///
    /// As [`Algorithm::decide`] and [`Under::choose`], and
    /// [`CheckError::StoreFull`] for a new key past a rejecting cap;
    /// nothing is consumed or stored on error.
    fn check_then<Q: Lookup<K> + ?Sized, U: Under<A>, R>(
        &self,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
        finish: impl Fn(&Generation<A>, &A, Decision) -> R,
    ) -> Result<R, CheckError>;

    /// [`check_then`](Store::check_then), returning the decision.
    ///
    /// # Errors
    ///
    /// As [`check_then`](Store::check_then).
    // Always: left to itself, the compiler may call it out of line from
    // the limiter's `check`, a tenth more instructions a keyed denial
    // (`tollgate-lab --deny-loop 0 N` under callgrind; note 14).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn check<Q: Lookup<K> + ?Sized, U: Under<A>>(
        &self,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        self.check_then(key, under, now_ns, cost, |_, _, decision| decision)
    }

    /// [`check`](Store::check), and for an admission its receipt, made
    /// and stamped by the generation that decided it
    /// ([`Generation::receipt`]).
    ///
    /// # Errors
    ///
    /// As [`check_then`](Store::check_then).
    #[inline]
    #[allow(clippy::type_complexity)]
    fn check_receipt<Q: Lookup<K> + ?Sized, U: Under<A>>(
        &self,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
    ) -> Result<(Decision, Option<Receipt>), CheckError> {
        self.check_then(
            key,
            under,
            now_ns,
            cost,
            |generation, algorithm, decision| {
                let receipt = generation.receipt(algorithm, &decision, now_ns, cost);
                (decision, receipt)
            },
        )
    }

    /// The decision `check` would return, consuming and storing nothing (for
    /// a new key: the decision of a fresh key, whatever the cap).
    ///
    /// # Errors
    ///
    /// As [`check`](Store::check).
    fn peek<Q: Lookup<K> + ?Sized, U: Under<A>>(
        &self,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError>;

    /// Removes every key that is idle at `now_ns` and gives back the memory
    /// they held; returns how many.
    fn evict_idle(&self, now_ns: u64) -> usize;

    /// Replaces `key`'s state with what `change` makes of it (given the
    /// generation the state is in), atomically with respect to every check
    /// of the key; returns whether it did (`change` returned a state). A
    /// key the store does not hold (never admitted, or evicted: idle) is
    /// left alone, and `change` is not called. Runs the key's `Hash`, `Eq`
    /// and `Borrow`, and `change`, before anything changes; `change` may
    /// run more than once (see [`Cell::update`](crate::cell::Cell::update)).
    ///
    /// The primitive behind giving an admission back
    /// ([`RateLimiter::refund`](crate::RateLimiter::refund)).
    fn update<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        change: impl Fn(&Generation<A>, &A::State) -> Option<A::State>,
    ) -> bool;

    /// Replaces `key`'s state with `new` if it is `current`, as
    /// [`update`](Store::update) does; returns whether it did. Runs the
    /// state's `PartialEq` and `Clone` before anything changes.
    fn compare_exchange<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        current: &A::State,
        new: &A::State,
    ) -> bool
    where
        A::State: PartialEq + Clone,
    {
        self.update(key, |_, state| (state == current).then(|| new.clone()))
    }

    /// The generation new checks decide by.
    fn generation(&self) -> Arc<Generation<A>>;

    /// Moves every key to `to`, each state carried over by `carry`
    /// ([`Algorithm::carry`]) at what `at` returns, called once the states
    /// it carries can no longer change (each shard's, under its lock),
    /// atomically with respect to each key's checks: a check decides
    /// wholly before its key moves, or wholly after. Checks that begin after it returns decide by `to`. `to`'s
    /// algorithm must be one of the current one's
    /// [`for_quota`](Algorithm::for_quota) (its layout).
    ///
    /// # Errors
    ///
    /// [`ChangeError`]; nothing changed.
    fn change(
        &self,
        to: Generation<A>,
        carry: Carry,
        at: &dyn Fn() -> CarryAt,
    ) -> Result<(), ChangeError>;

    /// How many keys are stored.
    fn len(&self) -> usize;

    /// Whether no key is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A kind of store, with its configuration: builds the store for keys `K`
/// and algorithm `A`.
pub trait StoreKind<K: Key, A: Algorithm>: Debug + Clone + Send + Sync + 'static {
    /// The store this kind builds.
    type Store: Store<K, A>;

    /// Builds an empty store deciding by `generation`, capped if `cap` is
    /// given.
    fn build(&self, generation: Arc<Generation<A>>, cap: Option<KeyCap>) -> Self::Store;
}

/// The default shard count: four per available core, a power of two.
fn default_shards() -> usize {
    std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .saturating_mul(4)
        .next_power_of_two()
}

/// The shard of `hash` among `shards` (a power of two). Bits 32 and up pick
/// the shard; the lock-free table's home bucket uses the low 32 bits and
/// its control byte the top 7 (of the hash mixed, `lock_free::table::mix`), and a
/// mutex shard's `HashMap` its own, so the choices stay independent.
#[inline]
fn shard_index(hash: u64, shards: usize) -> usize {
    // The mask keeps the index below the shard count: truncation is the
    // point.
    #[allow(clippy::cast_possible_truncation)]
    let high = (hash >> 32) as usize;
    high & (shards - 1)
}
