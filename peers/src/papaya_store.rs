//! The keyed store on papaya's lock-free map.

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
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

/// Keys in a [`papaya::HashMap`], each key's state in the same [`Cell`] the
/// crate's stores hold (for GCRA and the fixed window, one `AtomicU64`).
///
/// # Implementation details
///
/// A check on a held key pins papaya's guard, finds the key's cell and runs
/// the cell's check: no lock, and for a denial no write. Everything that
/// changes which keys are held (a new key, an eviction) happens under one of
/// [`STRIPES`] mutexes, chosen by the key's hash, so that under a stripe's
/// lock every cell in the map is live: a sweep retires a cell and removes it
/// in one critical section, and a check that finds a retired cell looks
/// again under the lock. A new key goes through [`admit_new_key`], so the
/// cap and its policy are the crate's own.
///
/// # Where it differs from the crate's stores
///
/// * **Growth is papaya's.** papaya resizes its table on its own, with no
///   hook before it grows, so the sweep of idle keys that the crate's
///   stores run before a table grows runs here when the number of keys
///   reaches twice what the last sweep left (at least 1 024): the same
///   amortized cost, at a different moment.
/// * **Memory goes back late, and not all of it.** A removed key is freed by
///   papaya's reclamation (seize) once every guard that could see it is
///   dropped and its thread's batch of retired entries fills, not when
///   [`evict_idle`](Store::evict_idle) returns; papaya's table never shrinks.
/// * **User code inside the map.** papaya hashes and compares keys inside
///   `insert`, `remove` and its resizes, and drops removed keys inside its
///   reclamation, on whichever thread runs it. A key whose `Hash`, `Eq` or
///   `Drop` panics there unwinds through papaya, which makes no promise about
///   it; the crate's stores run that code only where a panic loses nothing
///   (see [`tollgate::store`], "User code"). Keys whose user code cannot
///   panic (integers, strings) are unaffected.
pub struct Papaya<P = Preferred> {
    cells: PhantomData<fn() -> P>,
}

/// How many mutexes serialise the changes to the map, by key hash.
pub const STRIPES: usize = 64;

/// The fewest keys at which a growth sweep runs.
const FIRST_SWEEP_AT: usize = 1_024;

impl Papaya {
    /// The store with the [`Preferred`] cells.
    #[must_use]
    pub const fn new() -> Self {
        Self { cells: PhantomData }
    }
}

impl Default for Papaya {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> Clone for Papaya<P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P> Copy for Papaya<P> {}

impl<P> fmt::Debug for Papaya<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Papaya")
            .field("cells", &std::any::type_name::<P>())
            .finish()
    }
}

impl<K: Key, A: Algorithm, P: CellFor<A> + 'static> StoreKind<K, A> for Papaya<P> {
    type Store = PapayaStore<K, A, P::Cell>;

    fn build(&self, cap: Option<KeyCap>) -> Self::Store {
        PapayaStore {
            map: papaya::HashMap::new(),
            stripes: std::array::from_fn(|_| Mutex::new(())),
            stripe_hasher: RandomState::new(),
            population: Population::new(cap),
            next_sweep_at: AtomicUsize::new(FIRST_SWEEP_AT),
            algorithm: PhantomData,
        }
    }
}

/// The store [`Papaya`] builds.
pub struct PapayaStore<K, A, C> {
    map: papaya::HashMap<K, C>,
    stripes: [Mutex<()>; STRIPES],
    /// Chooses a key's stripe (the map's own hash is not exposed).
    stripe_hasher: RandomState,
    population: Population,
    /// The key count at which the next growth sweep runs.
    next_sweep_at: AtomicUsize,
    algorithm: PhantomData<fn() -> A>,
}

/// A borrowed key as papaya looks it up: hashes as the key does (`Lookup`
/// borrows consistently with `Hash`) and compares with [`Lookup::matches`].
struct ByLookup<'a, Q: ?Sized>(&'a Q);

impl<Q: Hash + ?Sized> Hash for ByLookup<'_, Q> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl<K, Q: Lookup<K> + ?Sized> papaya::Equivalent<K> for ByLookup<'_, Q> {
    fn equivalent(&self, key: &K) -> bool {
        self.0.matches(key)
    }
}

/// A stripe's lock: the unit value it guards cannot be left inconsistent by
/// a panic, so a poisoned lock is as good as any.
fn lock(stripe: &Mutex<()>) -> MutexGuard<'_, ()> {
    stripe.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K: Key, A: Algorithm, C: Cell<A>> PapayaStore<K, A, C> {
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
            let map = self.map.pin();
            if let Some(cell) = map.get(&ByLookup(key)) {
                let decision = cell.check(algorithm, now_ns, cost)?;
                return Ok(Checked::Done(decision.expect(LIVE_UNDER_LOCK)));
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
                    |(), key, cell| {
                        map.insert(key, cell);
                    },
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
        let map = self.map.pin();
        let mut removed = 0;
        for (key, cell) in &map {
            let _stripe = lock(self.stripe(key));
            // Only a stripe's holder removes a key, so the cell found is
            // still the key's: retiring it first makes a check that holds
            // it look again, under this lock, after the removal.
            if cell.retire_if_idle(algorithm, idle_at_ns) {
                map.remove(key);
                released.add();
                removed += 1;
            }
        }
        removed
    }
}

/// Under a stripe's lock every cell its keys have in the map is live: only
/// a sweep retires cells, and it removes each under the same lock.
const LIVE_UNDER_LOCK: &str = "under the stripe's lock, a key's cell is live";

impl<K: Key, A: Algorithm, C: Cell<A>> Store<K, A> for PapayaStore<K, A, C> {
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
            .pin()
            .get(&ByLookup(key))
            .map(|cell| cell.check(algorithm, now_ns, cost));
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
            .pin()
            .get(&ByLookup(key))
            .map(|cell| cell.peek(algorithm, now_ns, cost));
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
            .pin()
            .get(&ByLookup(key))
            .and_then(|cell| cell.compare_exchange(algorithm, current, new))
            .unwrap_or(false)
    }

    fn evict_idle(&self, algorithm: &A, now_ns: u64) -> usize {
        self.sweep(algorithm, now_ns)
    }

    fn len(&self) -> usize {
        self.population.len()
    }
}

impl<K, A, C> fmt::Debug for PapayaStore<K, A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PapayaStore")
            .field("population", &self.population)
            .finish_non_exhaustive()
    }
}
