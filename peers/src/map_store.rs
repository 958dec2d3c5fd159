//! A keyed store on any concurrent map, built from tollgate's public pieces.

use std::fmt;
use std::hash::{BuildHasher, Hash, RandomState};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tollgate::algorithm::Algorithm;
use tollgate::cell::{Cell, CellFor, Preferred};
use tollgate::store::{
    Checked, Key, KeyCap, Lookup, NewKey, Population, Store, StoreKind, admit_new_key,
    decide_fresh, rested_at, retry_after_sweep,
};
use tollgate::{CheckError, Decision};

/// Keys in a concurrent map `M` (see [`MapFor`]), each key's state in the
/// same [`Cell`] the crate's stores hold (for GCRA and the fixed window, one
/// `AtomicU64`): [`Papaya`](crate::Papaya), [`SccIndex`](crate::SccIndex)
/// and [`Flurry`](crate::Flurry).
///
/// # Implementation details
///
/// A check on a held key finds the key's cell in the map (a lookup under
/// the map's own reclamation guard) and runs the cell's check: no lock of
/// this store's, and for a denial no write. Everything that changes which
/// keys are held (a new key, an eviction) happens under one of [`STRIPES`]
/// mutexes, chosen by the key's hash, so that under a stripe's lock every
/// cell in the map is live: a sweep retires a cell and removes it in one
/// critical section, and a check that finds a retired cell looks again
/// under the lock. A new key goes through [`admit_new_key`], so the cap and
/// its policy are the crate's own.
///
/// # Where it differs from the crate's stores
///
/// * **Growth is the map's.** None of these maps has a hook before it
///   grows, so the sweep of idle keys that the crate's stores run before a
///   table grows runs here when the number of keys reaches twice what the
///   last sweep left (at least 1 024): the same amortized cost, at another
///   moment.
/// * **Memory goes back late, and not all of it.** A removed key is freed
///   by the map's reclamation once no guard can see it (papaya's seize
///   frees in batches, `scc`'s and flurry's epochs once they advance), not
///   when [`evict_idle`](Store::evict_idle) returns; whether a table shrinks
///   is the map's choice.
/// * **User code inside the map.** These maps hash and compare keys inside
///   their inserts, removals and resizes, and drop removed keys inside their
///   reclamation, on whichever thread runs it. A key whose `Hash`, `Eq` or
///   `Drop` panics there unwinds through the map, which makes no promise
///   about it; the crate's stores run that code only where a panic loses
///   nothing (see [`tollgate::store`], "User code"). Keys whose user code
///   cannot panic (integers, strings) are unaffected.
pub struct OnMap<M, P = Preferred> {
    types: PhantomData<fn() -> (M, P)>,
}

/// A concurrent map, as a store on it needs it: look a key up, insert,
/// remove, and visit every entry, all through `&self` from many threads.
pub trait ConcurrentMap<K, C>: Send + Sync {
    /// An empty map.
    fn empty() -> Self;

    /// Runs `read` on the cell of the key `key` borrows as, if held.
    fn read<Q: Lookup<K> + ?Sized, R>(&self, key: &Q, read: impl FnOnce(&C) -> R) -> Option<R>;

    /// Inserts `key` (absent: the caller holds its stripe) with `cell`.
    fn insert(&self, key: K, cell: C);

    /// Removes `key`.
    fn remove(&self, key: &K);

    /// Visits every entry; `visit` may remove the entry it visits.
    fn for_each(&self, visit: impl FnMut(&K, &C));
}

/// Chooses the map for keys `K` and cells `C`: implemented by the markers
/// [`Papaya`](crate::Papaya)'s, [`SccIndex`](crate::SccIndex)'s and
/// [`Flurry`](crate::Flurry)'s stores are named with.
pub trait MapFor<K, C> {
    /// The map.
    type Map: ConcurrentMap<K, C>;
}

/// How many mutexes serialise the changes to the map, by key hash.
pub const STRIPES: usize = 64;

/// The fewest keys at which a growth sweep runs.
const FIRST_SWEEP_AT: usize = 1_024;

impl<M> OnMap<M> {
    /// The store with the [`Preferred`] cells.
    #[must_use]
    pub const fn new() -> Self {
        Self { types: PhantomData }
    }
}

impl<M, P> OnMap<M, P> {
    /// The same store keeping each key's state in the cells `P2` chooses
    /// (see `tollgate::store::LockFree::cells`).
    #[must_use]
    pub const fn cells<P2>(self) -> OnMap<M, P2> {
        OnMap { types: PhantomData }
    }
}

impl<M> Default for OnMap<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M, P> Clone for OnMap<M, P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M, P> Copy for OnMap<M, P> {}

impl<M, P> fmt::Debug for OnMap<M, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnMap")
            .field("map", &std::any::type_name::<M>())
            .field("cells", &std::any::type_name::<P>())
            .finish()
    }
}

impl<K, A, M, P> StoreKind<K, A> for OnMap<M, P>
where
    K: Key,
    A: Algorithm,
    P: CellFor<A> + 'static,
    M: MapFor<K, P::Cell> + 'static,
{
    type Store = MapStore<K, A, P::Cell, M::Map>;

    fn build(&self, cap: Option<KeyCap>) -> Self::Store {
        MapStore {
            map: M::Map::empty(),
            stripes: std::array::from_fn(|_| Mutex::new(())),
            stripe_hasher: RandomState::new(),
            population: Population::new(cap),
            next_sweep_at: AtomicUsize::new(FIRST_SWEEP_AT),
            keys: PhantomData,
            cells: PhantomData,
        }
    }
}

/// The store [`OnMap`] builds.
pub struct MapStore<K, A, C, M> {
    map: M,
    stripes: [Mutex<()>; STRIPES],
    /// Chooses a key's stripe (the maps' own hashes are not exposed).
    stripe_hasher: RandomState,
    population: Population,
    /// The key count at which the next growth sweep runs.
    next_sweep_at: AtomicUsize,
    keys: PhantomData<fn() -> K>,
    cells: PhantomData<fn() -> (A, C)>,
}

/// A stripe's lock: the unit value it guards cannot be left inconsistent by
/// a panic, so a poisoned lock is as good as any.
fn lock(stripe: &Mutex<()>) -> MutexGuard<'_, ()> {
    stripe.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K: Key, A: Algorithm, C: Cell<A>, M: ConcurrentMap<K, C>> MapStore<K, A, C, M> {
    fn stripe<Q: Hash + ?Sized>(&self, key: &Q) -> &Mutex<()> {
        // The modulo keeps the index below the stripe count: truncation is
        // the point.
        #[allow(clippy::cast_possible_truncation)]
        let index = (self.stripe_hasher.hash_one(key) % STRIPES as u64) as usize;
        &self.stripes[index]
    }

    /// A new key, or one whose cell was retired under us: look again and
    /// insert under the key's stripe.
    #[cold]
    fn check_slow<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        if self.population.len() >= self.next_sweep_at.load(Ordering::Relaxed) {
            self.sweep(algorithm, rested_at(algorithm, now_ns));
            let next = (2 * self.population.len()).max(FIRST_SWEEP_AT);
            // Relaxed: a schedule; racing sweeps only sweep twice.
            self.next_sweep_at.store(next, Ordering::Relaxed);
        }
        let stripe = self.stripe(key);
        let attempt = |swept| {
            let _stripe = lock(stripe);
            if let Some(decision) = self
                .map
                .read(key, |cell| cell.check(algorithm, now_ns, cost))
            {
                return Ok(Checked::Done(decision?.expect(LIVE_UNDER_LOCK)));
            }
            admit_new_key(
                &self.population,
                algorithm,
                key,
                now_ns,
                cost,
                swept,
                NewKey::new(
                    (),
                    |()| {},
                    |state| C::with_state(algorithm, state),
                    |(), key, cell| self.map.insert(key, cell),
                ),
            )
        };
        retry_after_sweep(&self.population, attempt, || {
            self.evict_idle(algorithm, now_ns)
        })
    }

    /// Retires and removes every key idle at `idle_at_ns`, each under its
    /// stripe; returns how many.
    fn sweep(&self, algorithm: &A, idle_at_ns: u64) -> usize {
        let mut released = self.population.releasing();
        let mut removed = 0;
        self.map.for_each(|key, cell| {
            let _stripe = lock(self.stripe(key));
            // Only a stripe's holder removes a key, so the cell found is
            // still the key's: retiring it first makes a check that holds
            // it look again, under this lock, after the removal.
            if cell.retire_if_idle(algorithm, idle_at_ns) {
                self.map.remove(key);
                released.add();
                removed += 1;
            }
        });
        removed
    }
}

/// Under a stripe's lock every cell its keys have in the map is live: only
/// a sweep retires cells, and it removes each under the same lock.
const LIVE_UNDER_LOCK: &str = "under the stripe's lock, a key's cell is live";

impl<K: Key, A: Algorithm, C: Cell<A>, M: ConcurrentMap<K, C>> Store<K, A>
    for MapStore<K, A, C, M>
{
    #[inline]
    fn check<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let found = self
            .map
            .read(key, |cell| cell.check(algorithm, now_ns, cost));
        if let Some(decision) = found.transpose()?.flatten() {
            return Ok(decision);
        }
        self.check_slow(key, algorithm, now_ns, cost)
    }

    fn peek<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let found = self
            .map
            .read(key, |cell| cell.peek(algorithm, now_ns, cost));
        if let Some(decision) = found.transpose()?.flatten() {
            return Ok(decision);
        }
        // Absent, or retired: evicted, so idle, as good as fresh.
        Ok(decide_fresh(algorithm, now_ns, cost)?.decision())
    }

    fn compare_exchange<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        current: &A::State,
        new: &A::State,
    ) -> bool
    where
        A::State: PartialEq + Clone,
    {
        // A retired cell was evicted (cells never move here): the key is
        // idle, as good as fresh, and not replaced.
        self.map
            .read(key, |cell| cell.compare_exchange(algorithm, current, new))
            .flatten()
            .unwrap_or(false)
    }

    fn evict_idle(&self, algorithm: &A, now_ns: u64) -> usize {
        self.sweep(algorithm, now_ns)
    }

    fn len(&self) -> usize {
        self.population.len()
    }
}

impl<K, A, C, M> fmt::Debug for MapStore<K, A, C, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MapStore")
            .field("population", &self.population)
            .finish_non_exhaustive()
    }
}
