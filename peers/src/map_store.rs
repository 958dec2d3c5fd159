//! A keyed store on any concurrent map, built from tollgate's public pieces.

use std::fmt;
use std::hash::{BuildHasher, Hash, RandomState};
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tollgate::algorithm::{Algorithm, Carry, CarryAt};
use tollgate::cell::{Cell, CellFor, Preferred};
use tollgate::store::kit::{
    Attempt, NewKey, Population, admit_new_key, decide_fresh, rested_at, retry_after_sweep,
};
use tollgate::store::{ChangeError, Generation, Key, KeyCap, Lookup, Store, StoreKind, Under};
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
/// this store's, and for a denial no write to the cell (flurry's lookup
/// makes an owned key first: see [`Flurry`](crate::Flurry)). Everything
/// that changes which keys are held (a new key, an eviction) happens under
/// one of [`STRIPES`] mutexes, chosen by the key's hash: a sweep reads a
/// key's cell again under its stripe, retires it and removes the entry, and
/// a check that finds a retired cell looks again under the lock, where a
/// retired entry can only be one a panicking removal left (below), which it
/// removes. A new key goes through [`admit_new_key`], so the cap and its
/// policy are the crate's own. The key count is of live cells: a sweep
/// counts a key out for retiring its cell, whatever its removal does (the
/// room goes back when the sweep ends).
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
///   frees in batches, `scc`'s epochs once they advance), not
///   when [`evict_idle`](Store::evict_idle) returns; whether a table shrinks
///   is the map's choice.
/// * **User code inside the map.** These maps run keys' `Hash` and `Eq`
///   inside their inserts, removals and resizes (`scc` also `Clone` when it
///   copies entries, flurry `Ord` in its tree bins), and drop removed keys
///   inside their reclamation, on whichever thread drops a guard. The
///   crate's stores run user code only where a panic loses nothing (see
///   [`tollgate::store`], "User code"); here a panic unwinds through the
///   map, which makes no promise about it, and the store limits what it
///   can cost: a new key's insert that panics is undone before the panic
///   goes on, and an eviction's removal that panics leaves a retired entry,
///   counted out already, that the next check of the key or the next sweep
///   removes (`peers/tests/panics.rs` arms a panic at every call of both).
///   What remains: a panic in a removed key's `Drop` reaches whichever call
///   dropped the guard, not one of that key's; a panic that interrupts a
///   resize leaves the map as the map leaves it; a panic in `Eq` or `Ord`
///   during a lookup in one of flurry's tree bins (keys whose hashes
///   collide) leaves the lookup counted as the bin's reader for ever, so
///   that the next write restructuring the bin parks for ever holding the
///   bin's lock, and every later write to the bin blocks (flurry's
///   `TreeBin::find` counts readers with no guard); and a panic in both an
///   insert and its undo
///   leaves a key held but not counted. Keys whose user code cannot panic
///   (integers, strings) meet none of this.
pub struct OnMap<M, P = Preferred> {
    types: PhantomData<fn() -> (M, P)>,
}

/// A concurrent map, as a store on it needs it: look a key up, insert,
/// remove, and visit every entry, all through `&self` from many threads.
///
/// What the store relies on: a key inserted or removed under its stripe's
/// lock is seen so by the next `read` under the same lock; `for_each`
/// visits every entry present throughout its call (at least once); and a
/// read never sees one key's cell under another key.
pub trait ConcurrentMap<K, C>: Send + Sync {
    /// An empty map.
    fn empty() -> Self;

    /// Runs `read` on the cell of the key `key` borrows as, if held.
    fn read<Q: Lookup<K> + ?Sized, R>(&self, key: &Q, read: impl FnOnce(&C) -> R) -> Option<R>;

    /// Inserts `key` (absent: the caller holds its stripe) with `cell`.
    fn insert(&self, key: K, cell: C);

    /// Removes the key `key` borrows as, if held.
    fn remove<Q: Lookup<K> + ?Sized>(&self, key: &Q);

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

/// The fewest keys at which a growth sweep runs: the first runs when a new
/// key finds this many held, each later one when a new key finds twice
/// what the last left (at least this many).
pub const FIRST_SWEEP_AT: usize = 1_024;

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

    fn build(&self, generation: Arc<Generation<A>>, cap: Option<KeyCap>) -> Self::Store {
        MapStore {
            generation,
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
    /// The one generation: this store does not change its quota.
    generation: Arc<Generation<A>>,
    map: M,
    stripes: [Mutex<()>; STRIPES],
    /// Chooses a key's stripe (the maps' own hashes are not exposed).
    stripe_hasher: RandomState,
    population: Population,
    /// The key count at which the next growth sweep runs.
    next_sweep_at: AtomicUsize,
    keys: PhantomData<fn() -> K>,
    cells: PhantomData<fn() -> C>,
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
        self.growth_sweep(algorithm, now_ns);
        let stripe = self.stripe(key);
        let attempt = |swept| {
            let _stripe = lock(stripe);
            match self
                .map
                .read(key, |cell| cell.check(algorithm, now_ns, cost))
            {
                Some(Ok(Some(decision))) => return Ok(Attempt::Done(decision)),
                Some(Err(error)) => return Err(error),
                // Retired, under the stripe's lock: left by a sweep whose
                // removal panicked. Its room went back when it was retired
                // (see `sweep`), so it goes without releasing any, and the
                // key is decided as new: it was idle, as good as fresh.
                Some(Ok(None)) => self.map.remove(key),
                None => {}
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
                    |()| Ok(()),
                    |state| C::with_state(algorithm, state),
                    |(), owned, cell| self.insert_or_unwind(key, owned, cell),
                ),
            )
        };
        retry_after_sweep(&self.population, attempt, || self.evict_idle(now_ns))
    }

    /// Inserts a new key (its stripe held). The maps run user code inside an
    /// insert (the key's `Hash`, `Eq`, `Ord`, `Clone`, and other keys' `Drop`
    /// when a guard's drop reclaims): if it panics, the key is removed again
    /// before the panic goes on, so that it leaves with its reservation
    /// (`admit_new_key` commits the reservation only after this returns)
    /// and the count stays exact, unless the removal panics too.
    fn insert_or_unwind<Q: Lookup<K> + ?Sized>(&self, key: &Q, owned: K, cell: C) {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.map.insert(owned, cell))) {
            drop(catch_unwind(AssertUnwindSafe(|| self.map.remove(key))));
            resume_unwind(panic);
        }
    }

    /// The sweep before the map grows on its own: once the key count
    /// reaches twice what the last one left. One thread sweeps (it claims
    /// the schedule); the others go on without waiting.
    fn growth_sweep(&self, algorithm: &A, now_ns: u64) {
        /// Schedules the next growth sweep when dropped, also when the sweep
        /// panics.
        struct Reschedule<'a>(&'a AtomicUsize, &'a Population);

        impl Drop for Reschedule<'_> {
            fn drop(&mut self) {
                let next = self.1.len().saturating_mul(2).max(FIRST_SWEEP_AT);
                // Relaxed: a schedule; it orders no other data.
                self.0.store(next, Ordering::Relaxed);
            }
        }

        // Relaxed: as above.
        let due = self.next_sweep_at.load(Ordering::Relaxed);
        if self.population.len() < due
            || self
                .next_sweep_at
                .compare_exchange(due, usize::MAX, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let _reschedule = Reschedule(&self.next_sweep_at, &self.population);
        self.sweep(algorithm, rested_at(algorithm, now_ns));
    }

    /// Retires and removes every key idle at `idle_at_ns`, each under its
    /// stripe; returns how many. A key is counted out for its cell's
    /// retirement, before its entry is removed (the room goes back when
    /// the sweep ends): the count is of live cells,
    /// so a removal that panics (user code inside the map) leaves a retired
    /// entry that is counted out already, and that the next sweep, or the
    /// next check of the key, removes.
    fn sweep(&self, algorithm: &A, idle_at_ns: u64) -> usize {
        let mut released = self.population.releasing();
        let mut removed = 0;
        self.map.for_each(|key, _| {
            let _stripe = lock(self.stripe(key));
            // The cell is read again under the lock: the one `for_each`
            // passed may have been replaced since (a leftover retired entry
            // replaced by a check).
            let retired = self.map.read(key, |cell| {
                if cell.retire_if_idle(algorithm, idle_at_ns) {
                    Some(true)
                } else {
                    // Retired already (a leftover): `peek` answers `None`
                    // only for a retired cell.
                    matches!(cell.peek(algorithm, idle_at_ns, 1), Ok(None)).then_some(false)
                }
            });
            if let Some(retired_now) = retired.flatten() {
                if retired_now {
                    released.add();
                    removed += 1;
                }
                self.map.remove(key);
            }
        });
        removed
    }
}

impl<K: Key, A: Algorithm, C: Cell<A>, M: ConcurrentMap<K, C>> Store<K, A>
    for MapStore<K, A, C, M>
{
    #[inline]
    fn check_then<Q: Lookup<K> + ?Sized, U: Under<A>, R>(
        &self,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
        finish: impl Fn(&Generation<A>, &A, Decision) -> R,
    ) -> Result<R, CheckError> {
        let algorithm = under.choose(&self.generation)?;
        let found = self
            .map
            .read(key, |cell| cell.check(&algorithm, now_ns, cost));
        let decision = match found.transpose()?.flatten() {
            Some(decision) => decision,
            None => self.check_slow(key, &algorithm, now_ns, cost)?,
        };
        Ok(finish(&self.generation, &algorithm, decision))
    }

    fn peek<Q: Lookup<K> + ?Sized, U: Under<A>>(
        &self,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let algorithm = under.choose(&self.generation)?;
        let found = self
            .map
            .read(key, |cell| cell.peek(&algorithm, now_ns, cost));
        if let Some(decision) = found.transpose()?.flatten() {
            return Ok(decision);
        }
        // Absent, or retired: evicted, so idle, as good as fresh.
        Ok(decide_fresh(&*algorithm, now_ns, cost)?.decision())
    }

    fn update<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        change: impl Fn(&Generation<A>, &A::State) -> Option<A::State>,
    ) -> bool {
        // A retired cell was evicted (cells never move here): the key is
        // idle, as good as fresh, and left alone.
        let generation = &*self.generation;
        self.map
            .read(key, |cell| {
                cell.update(generation.algorithm(), |state| change(generation, state))
            })
            .flatten()
            .unwrap_or(false)
    }

    fn generation(&self) -> Arc<Generation<A>> {
        Arc::clone(&self.generation)
    }

    /// The peers' maps keep one generation.
    fn change(
        &self,
        _to: Generation<A>,
        _carry: Carry,
        _at: &dyn Fn() -> CarryAt,
    ) -> Result<(), ChangeError> {
        Err(ChangeError::StoreFixed)
    }

    fn evict_idle(&self, now_ns: u64) -> usize {
        self.sweep(self.generation.algorithm(), now_ns)
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
