//! Each key's cell behind an `Arc` in one mutex-guarded table: the table's
//! lock is held only to find or insert the cell.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::marker::PhantomData;

use super::kit::{
    Attempt, Held, NewKey, Population, admit_new_key, decide_fresh, rested_at, retry_after_sweep,
};
use super::mutex::{Entry, Table};
use super::{Discarded, Key, KeyCap, Lookup, Store, StoreKind, resume_first_panic};
use crate::algorithm::Algorithm;
use crate::cell::{Cell, CellFor, Preferred};
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::{Arc, Mutex, lock};

/// Every key's [`Cell`] in an `Arc`, inside one mutex-guarded hash table.
/// The lock is held only to find a key's cell (or insert a new one); the
/// check runs on the cell after the lock is released, which for GCRA and
/// the fixed window is a compare-and-swap with no lock at all.
///
/// It pays an allocation per key (the `Arc`) and one shared lock per
/// lookup: a baseline between [`Sharded`](super::Sharded), whose checks
/// run under the lock, and [`LockFree`](super::LockFree), whose lookups
/// take none.
// It evicts with the lock-free store's retire-then-unlink protocol, built
// only from `crate::sync` primitives, so it is also the shuttle tests'
// stand-in for the lock-free store (whose table and read-copy-update
// compile out under shuttle): under `--features shuttle` it is the default
// store.
pub struct PerKey<P = Preferred> {
    cells: PhantomData<fn() -> P>,
}

impl PerKey {
    /// The per-key store with the [`Preferred`] cells.
    #[must_use]
    pub const fn new() -> Self {
        Self { cells: PhantomData }
    }
}

impl<P> PerKey<P> {
    /// The same store keeping each key's state in the cells `P2` chooses
    /// (see [`LockFree::cells`](super::LockFree::cells)).
    #[must_use]
    pub const fn cells<P2>(self) -> PerKey<P2> {
        PerKey { cells: PhantomData }
    }
}

impl Default for PerKey {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> Clone for PerKey<P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P> Copy for PerKey<P> {}

impl<P> fmt::Debug for PerKey<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerKey")
            .field("cells", &std::any::type_name::<P>())
            .finish()
    }
}

impl<K: Key, A: Algorithm, P: CellFor<A> + 'static> StoreKind<K, A> for PerKey<P> {
    type Store = PerKeyStore<K, A, P::Cell>;

    fn build(&self, cap: Option<KeyCap>) -> Self::Store {
        PerKeyStore {
            table: Mutex::new(Table::default()),
            hasher: RandomState::new(),
            population: Population::new(cap),
            algorithm: PhantomData,
        }
    }
}

/// The store [`PerKey`] builds.
pub struct PerKeyStore<K, A, C> {
    table: Mutex<Table<K, Arc<C>>>,
    hasher: RandomState,
    population: Population,
    algorithm: PhantomData<fn() -> A>,
}

/// What a lookup under the lock found.
enum Found<C> {
    Cell(Arc<C>),
    /// The key was absent and the check needs no cell: decided already (a
    /// new key, stored or past the cap), or a sweep comes first.
    NoCell(Attempt),
}

impl<K: Key, A: Algorithm, C: Cell<A>> PerKeyStore<K, A, C> {
    /// Retires and unlinks the cells idle at `idle_at_ns` into `evicted`,
    /// to be dropped with the lock released; returns how many. Retiring
    /// first is the protocol: a check that already holds the cell's `Arc`
    /// finds it retired and looks again, so its admission cannot land in a
    /// cell no lookup can reach.
    fn sweep(
        &self,
        table: &mut Table<K, Arc<C>>,
        evicted: &mut Discarded<Entry<K, Arc<C>>>,
        algorithm: &A,
        idle_at_ns: u64,
    ) -> usize {
        table.sweep(&self.population, evicted, |entry| {
            entry.value.retire_if_idle(algorithm, idle_at_ns)
        })
    }

    /// The key's cell, inserting a fresh one for a new key (table lock
    /// held); `swept`: the store was just swept for this check. What a
    /// growth sweep evicts goes to `evicted`, which the caller declared
    /// before it took the lock, so that it is dropped after the lock is
    /// released even when a panic unwinds.
    #[allow(clippy::too_many_arguments)]
    fn find_or_insert<Q: Lookup<K> + ?Sized>(
        &self,
        table: &mut Table<K, Arc<C>>,
        evicted: &mut Discarded<Entry<K, Arc<C>>>,
        hash: u64,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
        swept: bool,
    ) -> Result<Found<C>, CheckError> {
        if let Some(entry) = table.find_mut(hash, key) {
            return Ok(Found::Cell(Arc::clone(&entry.value)));
        }
        // A new key is decided here, under the lock, on its unshared cell.
        admit_new_key(
            &self.population,
            algorithm,
            key,
            now_ns,
            cost,
            swept,
            NewKey::new(
                (table, evicted),
                |(table, evicted)| {
                    table.make_room(&self.hasher, |table| {
                        self.sweep(table, evicted, algorithm, rested_at(algorithm, now_ns));
                    });
                    Ok(())
                },
                |state| Arc::new(C::with_state(algorithm, state)),
                |(table, _), key, value| table.insert(hash, Entry { key, value }, &self.hasher),
            ),
        )
        .map(Found::NoCell)
    }
}

impl<K: Key, A: Algorithm, C: Cell<A>> Store<K, A> for PerKeyStore<K, A, C> {
    fn check<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let hash = self.hasher.hash_one(key);
        let attempt = |swept| loop {
            let mut evicted = Discarded::new();
            let found = self.find_or_insert(
                &mut lock(&self.table),
                &mut evicted,
                hash,
                key,
                algorithm,
                now_ns,
                cost,
                swept,
            );
            drop(evicted);
            // Held: if an eviction unlinked the cell meanwhile, this may be
            // its last reference, and dropping it drops the evicted state
            // (user code), whose panic is the store's to discard.
            let cell = Held::new(match found? {
                Found::Cell(cell) => cell,
                Found::NoCell(checked) => return Ok(checked),
            });
            // The lock is released: the check runs on the cell alone.
            if let Some(decision) = cell.get().check(algorithm, now_ns, cost)? {
                return Ok(Attempt::Done(decision));
            }
            // Retired by an eviction after we found it: look again.
        };
        retry_after_sweep(&self.population, attempt, || {
            self.evict_idle(algorithm, now_ns)
        })
    }

    fn peek<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let hash = self.hasher.hash_one(key);
        // Held, as in `check`.
        let cell = lock(&self.table)
            .find_mut(hash, key)
            .map(|entry| Held::new(Arc::clone(&entry.value)));
        if let Some(decision) = cell
            .map(|cell| cell.get().peek(algorithm, now_ns, cost))
            .transpose()?
            .flatten()
        {
            return Ok(decision);
        }
        // Absent, or retired (evicted: idle, so as good as fresh).
        Ok(decide_fresh(algorithm, now_ns, cost)?.decision())
    }

    fn update<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        change: impl Fn(&A::State) -> Option<A::State>,
    ) -> bool {
        let hash = self.hasher.hash_one(key);
        // Held, as in `check`.
        let cell = lock(&self.table)
            .find_mut(hash, key)
            .map(|entry| Held::new(Arc::clone(&entry.value)));
        // A retired cell was evicted (this store never moves cells): the
        // key is idle, as good as fresh, and left alone.
        cell.and_then(|cell| cell.get().update(algorithm, change))
            .unwrap_or(false)
    }

    fn evict_idle(&self, algorithm: &A, now_ns: u64) -> usize {
        // Declared before the lock: dropped after it, even if `tidy` panics.
        let mut evicted = Discarded::new();
        let mut table = lock(&self.table);
        let removed = self.sweep(&mut table, &mut evicted, algorithm, now_ns);
        table.tidy(&self.hasher);
        removed
    }

    fn len(&self) -> usize {
        self.population.len()
    }
}

impl<K, A, C> Drop for PerKeyStore<K, A, C> {
    fn drop(&mut self) {
        resume_first_panic(lock(&self.table).clear());
    }
}

impl<K, A, C> fmt::Debug for PerKeyStore<K, A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerKeyStore")
            .field("population", &self.population)
            .finish_non_exhaustive()
    }
}
