//! How keys find their state.
//!
//! A [`Store`] maps keys to per-key state and applies an algorithm to it
//! under its own discipline. Every store runs the same conformance suite, so
//! a new store is checked by adding one line to `tests/conformance/main.rs`.
//!
//! * [`GlobalMutex`]: one `Mutex<HashMap>`. The baseline.
//! * [`Sharded`]: `N` cache-padded `Mutex<HashMap>` shards.
//! * [`PerKey`]: one `Mutex<HashMap>` of `Arc`'d cells, locked only to find
//!   a key's cell.
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
//!   demand with [`Store::evict_idle`];
//! * **caps the number of keys** when asked ([`KeyCap`]), with an explicit
//!   policy for a new key that finds the store full ([`WhenFull`]).

// The lock-free table reclaims memory with crossbeam-epoch, which model
// checkers cannot see into (loom runs its threads on one OS thread, so the
// epoch's thread-locals would be shared): under the model-checking features it
// compiles out, and `PerKey`, built only on `crate::sync`, stands in for it.
#[cfg(not(any(feature = "loom", feature = "shuttle")))]
#[allow(unsafe_code)]
mod lock_free;
mod mutex;
mod per_key;
#[cfg(not(any(feature = "loom", feature = "shuttle")))]
#[allow(unsafe_code)]
mod table;

use std::borrow::Borrow;
use std::fmt::Debug;
use std::hash::Hash;

#[cfg(not(any(feature = "loom", feature = "shuttle")))]
pub use lock_free::{LockFree, LockFreeStore};
pub use mutex::{GlobalMutex, MutexStore, Sharded};
pub use per_key::{PerKey, PerKeyStore};

/// The store a limiter uses unless a [`Builder`](crate::Builder) chooses
/// one: [`LockFree`] (under the model-checking features, [`PerKey`]).
#[cfg(not(any(feature = "loom", feature = "shuttle")))]
pub type DefaultStore = LockFree;

/// The store a limiter uses unless a [`Builder`](crate::Builder) chooses
/// one: under the model-checking features, [`PerKey`], the stand-in for
/// the lock-free store that model checkers can see into.
#[cfg(any(feature = "loom", feature = "shuttle"))]
pub type DefaultStore = PerKey;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::CheckError;

/// A key type a store can hold: hashable, comparable and shareable across
/// threads (integers, `String`, tuples, IP addresses, …).
pub trait Key: Hash + Eq + Send + Sync + 'static {}

impl<K: Hash + Eq + Send + Sync + 'static> Key for K {}

/// What a store does with a new key when it already holds
/// [`KeyCap::max_keys`] keys and none it examined was idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WhenFull {
    /// Fail closed: the new key's check returns
    /// [`CheckError::StoreFull`]. Existing keys keep working. The default.
    #[default]
    Reject,
    /// Fail open: decide the new key as a fresh key and do not store it. It
    /// gets its full burst on every request until a slot frees up, so a
    /// flood of new keys is not limited; existing keys keep their state.
    AdmitUntracked,
}

/// A cap on the number of keys a store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyCap {
    /// The most keys held at once.
    pub max_keys: usize,
    /// What happens to a new key past the cap.
    pub when_full: WhenFull,
}

/// A map from keys to per-key state, and the discipline that applies an
/// algorithm to it.
pub trait Store<K: Key, A: Algorithm>: Debug + Send + Sync {
    /// Decides `cost` units for `key` at `now_ns` and, if admitted, consumes
    /// them; read, decide and write are atomic with respect to every other
    /// check on the same key.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::decide`], and [`CheckError::StoreFull`] for a new key
    /// past a rejecting cap; nothing is consumed or stored on error.
    fn check<Q>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized;

    /// The decision `check` would return, consuming and storing nothing (for
    /// a new key: the decision of a fresh key, whatever the cap).
    ///
    /// # Errors
    ///
    /// As [`Algorithm::decide`].
    fn peek<Q>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized;

    /// Removes every key that is idle at `now_ns`; returns how many.
    fn evict_idle(&self, algorithm: &A, now_ns: u64) -> usize;

    /// How many keys are stored.
    fn len(&self) -> usize;

    /// Whether no key is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A kind of store, with its configuration: builds the store for any key and
/// algorithm.
pub trait StoreKind: Debug + Clone + Send + Sync + 'static {
    /// The store this kind builds.
    type Store<K: Key, A: Algorithm>: Store<K, A>;

    /// Builds an empty store, capped if `cap` is given.
    fn build<K: Key, A: Algorithm>(&self, cap: Option<KeyCap>) -> Self::Store<K, A>;
}

/// The keys a store may still add, shared by its shards: exact under
/// concurrency (a reservation is a compare-and-swap on one counter).
#[derive(Debug)]
struct Population {
    len: crate::sync::AtomicUsize,
    cap: Option<KeyCap>,
    /// New keys that found the store full: spaces out the sweeps they run.
    found_full: crate::sync::AtomicUsize,
}

/// What [`Population::make_room`] found.
enum Room {
    Reserved,
    Full(KeyCap),
    SweepFirst,
}

/// One attempt at a check under a shard's lock.
enum Checked {
    Done(Decision),
    /// A new key found the store full and a sweep is due: release the shard,
    /// sweep the whole store, try again.
    SweepFirst,
}

/// Runs `attempt` (which takes its shard's lock itself, and is told whether
/// the store was just swept); when it asks, sweeps the whole store with
/// `sweep_store` (no shard lock held) and tries once more. Told that the
/// store was swept, `make_room` never asks again, so the loop ends.
fn retry_after_sweep(
    population: &Population,
    mut attempt: impl FnMut(bool) -> Result<Checked, CheckError>,
    sweep_store: impl FnOnce() -> usize,
) -> Result<Decision, CheckError> {
    let mut sweep_store = Some(sweep_store);
    loop {
        let swept = sweep_store.is_none();
        match attempt(swept)? {
            Checked::Done(decision) => return Ok(decision),
            Checked::SweepFirst => {
                if let Some(sweep_store) = sweep_store.take() {
                    let scanned = population.len();
                    population.swept(sweep_store(), scanned);
                }
            }
        }
    }
}

impl Population {
    fn new(cap: Option<KeyCap>) -> Self {
        Self {
            len: crate::sync::AtomicUsize::new(0),
            cap,
            found_full: crate::sync::AtomicUsize::new(0),
        }
    }

    /// Reserves room for a new key. `Room::SweepFirst` asks the caller to
    /// release its shard, sweep the whole store (`Store::evict_idle`),
    /// report it with `swept`, and try again once (see `retry_after_sweep`).
    ///
    /// Sweeps are spaced so that a flood cannot make every request pay for
    /// the whole store: one in every `len / SWEEP_SPACING + 1` new keys that
    /// find the store full sweeps, and a sweep that freed at least
    /// `len / SWEEP_SPACING` keys makes the next one due at once (the keys it
    /// freed already paid for it). A new key so costs amortized
    /// `O(SWEEP_SPACING)` slot visits, never `O(len)`.
    fn make_room(&self, swept_already: bool) -> Room {
        match self.reserve() {
            Ok(()) => Room::Reserved,
            Err(cap) if swept_already => Room::Full(cap),
            Err(cap) => {
                // Relaxed: a spacing counter; racing increments only change
                // which new key runs the sweep.
                let found_full = self.found_full.fetch_add(1, crate::sync::Ordering::Relaxed);
                if found_full % (self.len() / SWEEP_SPACING + 1) == 0 {
                    Room::SweepFirst
                } else {
                    Room::Full(cap)
                }
            }
        }
    }

    /// Records a whole-store sweep that freed `freed` of `scanned` keys.
    fn swept(&self, freed: usize, scanned: usize) {
        if freed > 0 && freed >= scanned / SWEEP_SPACING {
            self.found_full.store(0, crate::sync::Ordering::Relaxed);
        }
    }

    /// Reserves room for one more key; the cap when it is reached.
    fn reserve(&self) -> Result<(), KeyCap> {
        use crate::sync::Ordering;
        let Some(cap) = self.cap else {
            // Relaxed: a statistic with no cap to enforce.
            self.len.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        // Relaxed: the count guards no other data; the CAS alone makes the
        // reservations exact (at most `max_keys` succeed).
        self.len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |len| {
                (len < cap.max_keys).then_some(len + 1)
            })
            .map(drop)
            .map_err(|_| cap)
    }

    /// Returns `removed` keys' room.
    fn release(&self, removed: usize) {
        if removed > 0 {
            self.len.fetch_sub(removed, crate::sync::Ordering::Relaxed);
        }
    }

    fn len(&self) -> usize {
        self.len.load(crate::sync::Ordering::Relaxed)
    }
}

impl KeyCap {
    /// The outcome for a new key that found the store full, given the
    /// decision a fresh key gets.
    fn when_full(self, fresh: Decision) -> Result<Decision, CheckError> {
        match self.when_full {
            WhenFull::Reject => Err(CheckError::StoreFull {
                max_keys: self.max_keys,
            }),
            WhenFull::AdmitUntracked => Ok(fresh),
        }
    }
}

/// How often a new key that finds the store full may sweep the store for
/// idle keys (see `Population::make_room`).
const SWEEP_SPACING: usize = 8;

/// The default shard count: four per available core, a power of two.
fn default_shards() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .saturating_mul(4)
        .next_power_of_two()
}
