//! The mutex baselines: one mutex-guarded hash table, or cache-padded shards
//! of them.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::marker::PhantomData;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use super::{
    Checked, Key, KeyCap, Lookup, NewKey, Population, Store, StoreKind, admit_new_key,
    default_shards, drop_discarded, retry_after_sweep, shard_index,
};
use crate::algorithm::{Algorithm, Verdict};
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
    /// `shards` shards, rounded up to a power of two (at least 1).
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

/// A key, its hash and its value in a mutex-guarded table. The hash is
/// computed once, before the lock is taken, and kept: growing or shrinking
/// the table rehashes from it, so a table never calls a key's `Hash` while
/// it moves entries (a panic there could lose other keys' states).
pub(super) struct Entry<K, V> {
    pub(super) hash: u64,
    pub(super) key: K,
    pub(super) value: V,
}

impl<K, V> Entry<K, V> {
    /// The stored hash, for the table's rehashing.
    pub(super) fn hash(&self) -> u64 {
        self.hash
    }
}

/// Finds `key` (whose hash is `hash`) in `table`: the stored hash first, so
/// that `Eq` runs only on likely matches.
pub(super) fn find_mut<'t, K, V, Q: Lookup<K> + ?Sized>(
    table: &'t mut HashTable<Entry<K, V>>,
    hash: u64,
    key: &Q,
) -> Option<&'t mut Entry<K, V>> {
    table.find_mut(hash, |entry| entry.hash == hash && key.matches(&entry.key))
}

/// Removes the entries `evict` chooses and returns them, to be dropped once
/// the lock is released; gives memory back when the table has become mostly
/// empty. Runs no user code: `evict` is the store's, and rehashing uses the
/// stored hashes.
pub(super) fn sweep_table<K, V>(
    table: &mut HashTable<Entry<K, V>>,
    population: &Population,
    evict: impl FnMut(&mut Entry<K, V>) -> bool,
) -> Vec<Entry<K, V>> {
    let evicted: Vec<_> = table.extract_if(evict).collect();
    population.release(evicted.len());
    if table.len() < table.capacity() / 4 {
        table.shrink_to(table.len() * 2, Entry::hash);
    }
    evicted
}

/// Drops a table's entries one at a time. If a key's `Drop` panics, the
/// table's iterator, dropped as the panic unwinds, drops the rest and frees
/// the table; `HashTable`'s own drop would leak them. The panic then goes on
/// to whoever dropped the store.
pub(super) fn drop_entries<K, V>(table: HashTable<Entry<K, V>>) {
    for entry in table {
        drop(entry);
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
type LockedShard<K, S> = CachePadded<Mutex<HashTable<Entry<K, S>>>>;

impl<K: Key, A: Algorithm> MutexStore<K, A> {
    fn new(shards: usize, cap: Option<KeyCap>) -> Self {
        Self {
            shards: (0..shards)
                .map(|_| CachePadded::new(Mutex::new(HashTable::new())))
                .collect(),
            hasher: RandomState::new(),
            population: Population::new(cap),
            algorithm: PhantomData,
        }
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, HashTable<Entry<K, A::State>>> {
        lock(&self.shards[shard_index(hash, self.shards.len())])
    }

    /// Evicts the shard's keys idle at `idle_at_ns` (and so at every later
    /// instant); returns them, to be dropped with the lock released.
    fn sweep(
        &self,
        table: &mut HashTable<Entry<K, A::State>>,
        algorithm: &A,
        idle_at_ns: u64,
    ) -> Vec<Entry<K, A::State>> {
        sweep_table(table, &self.population, |entry| {
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
    ) -> Result<Checked, CheckError> {
        // Declared before the lock, so dropped after it even when a panic
        // unwinds: evicted keys' `Drop` never runs under the lock.
        let mut evicted = Vec::new();
        // Lookup, decision and write all happen under the shard's lock.
        let mut shard = self.shard(hash);
        if let Some(entry) = find_mut(&mut shard, hash, key) {
            return algorithm
                .check(&mut entry.value, now_ns, cost)
                .map(Checked::Done);
        }
        let new_key = admit_new_key(&self.population, algorithm, now_ns, cost, swept, |fresh| {
            // Before the table grows, make room by evicting keys idle for
            // at least the algorithm's rest time (keys between two
            // requests stay): amortized, since the table doubles each
            // time it grows.
            if shard.len() == shard.capacity() {
                let idle_at_ns = now_ns.saturating_sub(algorithm.rest_ns());
                evicted = self.sweep(&mut shard, algorithm, idle_at_ns);
            }
            let mut state = A::State::default();
            if let Verdict::Allow { admission, .. } = fresh {
                algorithm.admit(&mut state, admission);
            }
            // `to_owned` is user code: if it panics, nothing is inserted
            // and the reservation goes back.
            let entry = Entry {
                hash,
                key: key.to_owned(),
                value: state,
            };
            shard.insert_unique(hash, entry, Entry::hash);
            fresh.decision()
        });
        drop(shard);
        drop_discarded(evicted);
        match new_key? {
            NewKey::Stored(decision) => Ok(Checked::Done(decision)),
            NewKey::Checked(checked) => Ok(checked),
        }
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
        let verdict = match find_mut(&mut shard, hash, key) {
            Some(entry) => algorithm.decide(&entry.value, now_ns, cost)?,
            None => algorithm.decide(&A::State::default(), now_ns, cost)?,
        };
        Ok(verdict.decision())
    }

    fn evict_idle(&self, algorithm: &A, now_ns: u64) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let evicted = self.sweep(&mut lock(shard), algorithm, now_ns);
                let removed = evicted.len();
                drop_discarded(evicted);
                removed
            })
            .sum()
    }

    fn len(&self) -> usize {
        self.population.len()
    }
}

impl<K, A: Algorithm> Drop for MutexStore<K, A> {
    fn drop(&mut self) {
        for shard in &*self.shards {
            drop_entries(std::mem::take(&mut *lock(shard)));
        }
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
