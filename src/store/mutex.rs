//! The mutex baselines: one mutex-guarded hash table, or cache-padded shards
//! of them; and the table both they and the per-key store use.

use std::any::Any;
use std::fmt;
use std::hash::{BuildHasher, Hash, RandomState};
use std::marker::PhantomData;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use super::kit::{
    Attempt, NewKey, Population, admit_new_key, decide_fresh, rested_at, retry_after_sweep,
};
use super::{
    Discard, Discarded, Key, KeyCap, Lookup, Store, StoreKind, default_shards, drop_pair,
    resume_first_panic, shard_index,
};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::{Mutex, MutexGuard, lock};

/// Every key in one hash table behind one `Mutex`: correct, simple, and the
/// baseline the other stores are measured against. Every check on every key
/// serialises on the one lock.
///
/// Keys are hashed with std's `RandomState`, seeded randomly per store, so
/// an attacker who chooses keys cannot precompute collisions.
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalMutex;

/// `N` independently locked hash tables, each on its own cache line; a
/// key's shard is chosen by a randomly seeded hash. Checks on keys in
/// different shards proceed in parallel; one hot key still serialises.
#[derive(Debug, Clone, Copy)]
pub struct Sharded {
    shards: usize,
}

impl Sharded {
    /// Creates the store kind with `shards` shards, rounded up to a power of
    /// two (at least 1).
    #[must_use]
    pub fn new(shards: usize) -> Self {
        Self {
            shards: shards.max(1).next_power_of_two(),
        }
    }
}

impl Default for Sharded {
    /// Four shards per available core, rounded up to a power of two.
    fn default() -> Self {
        Self::new(default_shards())
    }
}

impl<K: Key, A: Algorithm> StoreKind<K, A> for GlobalMutex {
    type Store = MutexStore<K, A>;

    fn build(&self, cap: Option<KeyCap>) -> MutexStore<K, A> {
        MutexStore::new(1, cap)
    }
}

impl<K: Key, A: Algorithm> StoreKind<K, A> for Sharded {
    type Store = MutexStore<K, A>;

    fn build(&self, cap: Option<KeyCap>) -> MutexStore<K, A> {
        MutexStore::new(self.shards, cap)
    }
}

/// A key and its value in a [`Table`].
pub(super) struct Entry<K, V> {
    pub(super) key: K,
    pub(super) value: V,
}

impl<K, V> Discard for Entry<K, V> {
    fn discard(self) -> Option<Box<dyn Any + Send>> {
        drop_pair(self.key, self.value)
    }
}

/// A hash table of keys and values, used under a mutex, that never loses an
/// entry to a panicking `Hash`.
///
/// hashbrown calls the hasher (a key's `Hash`, user code) when it moves
/// entries. When it grows or shrinks into a new allocation, a panic frees
/// the new one and leaves the table as it was. But when tombstones (left by
/// removals) fill at least half the table, it rehashes **in place**, and a
/// panic there drops the entries being moved: other keys' states, lost. So a
/// removal marks the table untidy, and [`tidy`](Table::tidy) resizes it to
/// fit its entries and one more before anything is inserted. Afterwards
/// either the new allocation has no tombstones, or the entries already fill
/// more than half of it, and since only inserts come before the next
/// removal, hashbrown can only grow it, by resizing. A panic in `tidy`
/// leaves the table untidy, to be tidied before the next insert.
pub(super) struct Table<K, V> {
    entries: HashTable<Entry<K, V>>,
    untidy: bool,
}

impl<K, V> Default for Table<K, V> {
    fn default() -> Self {
        Self {
            entries: HashTable::new(),
            untidy: false,
        }
    }
}

impl<K, V> Table<K, V> {
    /// Empties the table, dropping each entry on its own: if a key's `Drop`
    /// panics, the others are still dropped. Returns the first panic.
    pub(super) fn clear(&mut self) -> Option<Box<dyn Any + Send>> {
        let mut first_panic = None;
        for entry in std::mem::take(&mut self.entries) {
            if let Some(panic) = entry.discard() {
                first_panic.get_or_insert(panic);
            }
        }
        first_panic
    }
}

impl<K: Hash, V> Table<K, V> {
    /// The entry of `key` (whose hash is `hash`).
    pub(super) fn find_mut<Q: Lookup<K> + ?Sized>(
        &mut self,
        hash: u64,
        key: &Q,
    ) -> Option<&mut Entry<K, V>> {
        self.entries.find_mut(hash, |entry| key.matches(&entry.key))
    }

    /// Whether the next insert would grow the table.
    fn is_full(&self) -> bool {
        self.entries.len() == self.entries.capacity()
    }

    /// Makes room for one more entry. Before the table would grow, first
    /// `sweep`s it (evicting keys idle for at least the algorithm's rest
    /// time, so that keys between two requests stay): amortized, since the
    /// table doubles each time it grows. Then tidies, and grows if still
    /// full. Calls the keys' `Hash` and the algorithm's `is_idle`, so it
    /// comes before the new entry exists: a panic here drops nothing of the
    /// caller's.
    pub(super) fn make_room(&mut self, hasher: &RandomState, sweep: impl FnOnce(&mut Self)) {
        if self.is_full() {
            sweep(self);
        }
        self.tidy(hasher);
        self.entries.reserve(1, |entry| hasher.hash_one(&entry.key));
    }

    /// Inserts `entry`, absent, whose key's hash is `hash`, after
    /// [`make_room`](Table::make_room): with room for it and no tombstones
    /// to clear, hashbrown places it without calling the hasher, so no user
    /// code runs.
    pub(super) fn insert(&mut self, hash: u64, entry: Entry<K, V>, hasher: &RandomState) {
        debug_assert!(!self.untidy && self.entries.len() < self.entries.capacity());
        self.entries
            .insert_unique(hash, entry, |entry| hasher.hash_one(&entry.key));
    }

    /// Removes the entries `evict` chooses into `evicted` (declared by the
    /// caller before it took the lock, so that they are dropped after it),
    /// returning their room to `population`, counted one at a time: `evict`
    /// runs the algorithm's code, and a panic there leaves the counts exact.
    /// Returns how many were removed.
    pub(super) fn sweep(
        &mut self,
        population: &Population,
        evicted: &mut Discarded<Entry<K, V>>,
        evict: impl FnMut(&mut Entry<K, V>) -> bool,
    ) -> usize {
        let mut released = population.releasing();
        for entry in self.entries.extract_if(evict) {
            self.untidy = true;
            released.add();
            evicted.push(entry);
        }
        released.removed
    }

    /// Clears the tombstones removals left, and gives their memory back (see
    /// the type's documentation).
    pub(super) fn tidy(&mut self, hasher: &RandomState) {
        if self.untidy {
            self.entries
                .shrink_to(self.entries.len() + 1, |entry| hasher.hash_one(&entry.key));
            self.untidy = false;
        }
    }
}

/// The store [`GlobalMutex`] (one shard) and [`Sharded`] build.
pub struct MutexStore<K, A: Algorithm> {
    shards: Box<[LockedShard<K, A::State>]>,
    hasher: RandomState,
    population: Population,
    algorithm: PhantomData<fn() -> A>,
}

/// One shard: its lock and table on their own cache line(s).
type LockedShard<K, S> = CachePadded<Mutex<Table<K, S>>>;

impl<K: Key, A: Algorithm> MutexStore<K, A> {
    fn new(shards: usize, cap: Option<KeyCap>) -> Self {
        Self {
            shards: (0..shards)
                .map(|_| CachePadded::new(Mutex::new(Table::default())))
                .collect(),
            hasher: RandomState::new(),
            population: Population::new(cap),
            algorithm: PhantomData,
        }
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Table<K, A::State>> {
        lock(&self.shards[shard_index(hash, self.shards.len())])
    }

    /// Evicts the shard's keys idle at `idle_at_ns` (and so at every later
    /// instant) into `evicted`, to be dropped with the lock released;
    /// returns how many.
    fn sweep(
        &self,
        table: &mut Table<K, A::State>,
        evicted: &mut Discarded<Entry<K, A::State>>,
        algorithm: &A,
        idle_at_ns: u64,
    ) -> usize {
        table.sweep(&self.population, evicted, |entry| {
            algorithm.is_idle(&entry.value, idle_at_ns)
        })
    }

    /// One check under the key's shard lock; `swept`: the store was just
    /// swept for this check.
    fn check_once<Q: Lookup<K> + ?Sized>(
        &self,
        hash: u64,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
        swept: bool,
    ) -> Result<Attempt, CheckError> {
        // Declared before the lock, so dropped after it even when a panic
        // unwinds: evicted keys' `Drop` never runs under the lock.
        let mut evicted = Discarded::new();
        // Lookup, decision and write all happen under the shard's lock.
        let mut shard = self.shard(hash);
        if let Some(entry) = shard.find_mut(hash, key) {
            return algorithm
                .check(&mut entry.value, now_ns, cost)
                .map(Attempt::Done);
        }
        let checked = admit_new_key(
            &self.population,
            algorithm,
            key,
            now_ns,
            cost,
            swept,
            NewKey::new(
                (&mut shard, &mut evicted),
                |(shard, evicted)| {
                    shard.make_room(&self.hasher, |table| {
                        self.sweep(table, evicted, algorithm, rested_at(algorithm, now_ns));
                    });
                    Ok(())
                },
                |state| state,
                |(shard, _), key, value| shard.insert(hash, Entry { key, value }, &self.hasher),
            ),
        );
        drop(shard);
        drop(evicted);
        checked
    }
}

impl<K: Key, A: Algorithm> Store<K, A> for MutexStore<K, A> {
    fn check<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let hash = self.hasher.hash_one(key);
        retry_after_sweep(
            &self.population,
            |swept| self.check_once(hash, key, algorithm, now_ns, cost, swept),
            || self.evict_idle(algorithm, now_ns),
        )
    }

    fn peek<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash);
        let verdict = match shard.find_mut(hash, key) {
            Some(entry) => algorithm.decide(&entry.value, now_ns, cost)?,
            None => decide_fresh(algorithm, now_ns, cost)?,
        };
        Ok(verdict.decision())
    }

    fn update<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        _algorithm: &A,
        change: impl Fn(&A::State) -> Option<A::State>,
    ) -> bool {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash);
        let Some(entry) = shard.find_mut(hash, key) else {
            return false;
        };
        let Some(changed) = change(&entry.value) else {
            return false;
        };
        let replaced = std::mem::replace(&mut entry.value, changed);
        // The replaced state's `Drop` (user code) after the lock.
        drop(shard);
        drop(replaced);
        true
    }

    fn evict_idle(&self, algorithm: &A, now_ns: u64) -> usize {
        let mut evicted = Discarded::new();
        // Every shard is swept before any is tidied: tidying hashes keys
        // (user code), and a panic there then leaves every idle key evicted,
        // as the call meant to (the shards not yet tidied are tidied before
        // their next insert).
        let removed = self
            .shards
            .iter()
            .map(|shard| self.sweep(&mut lock(shard), &mut evicted, algorithm, now_ns))
            .sum();
        for shard in &*self.shards {
            lock(shard).tidy(&self.hasher);
        }
        removed
    }

    fn len(&self) -> usize {
        self.population.len()
    }
}

impl<K, A: Algorithm> Drop for MutexStore<K, A> {
    /// Drops every shard's keys, then lets the first panic among their
    /// `Drop`s go on to whoever dropped the store.
    fn drop(&mut self) {
        let mut first_panic = None;
        for shard in &*self.shards {
            if let Some(panic) = lock(shard).clear() {
                first_panic.get_or_insert(panic);
            }
        }
        resume_first_panic(first_panic);
    }
}

impl<K, A: Algorithm> fmt::Debug for MutexStore<K, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutexStore")
            .field("shards", &self.shards.len())
            .field("population", &self.population)
            .finish_non_exhaustive()
    }
}
