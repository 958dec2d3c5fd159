//! The mutex baselines: one mutex-guarded hash table, or cache-padded shards
//! of them; and the table both they and the per-key store use.

use std::any::Any;
use std::fmt;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use super::kit::{
    Attempt, NewKey, Population, admit_new_key, carry_for, check_carries, decide_fresh, rested_at,
    retry_after_sweep,
};
use super::{
    ChangeError, Discard, Discarded, Generation, Key, KeyCap, Lookup, Store, StoreKind, Under,
    default_shards, discard_each, drop_pair, resume_first_panic, shard_index,
};
use crate::algorithm::{Algorithm, Carry, CarryAt};
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

    fn build(&self, generation: Arc<Generation<A>>, cap: Option<KeyCap>) -> MutexStore<K, A> {
        MutexStore::new(1, generation, cap)
    }
}

impl<K: Key, A: Algorithm> StoreKind<K, A> for Sharded {
    type Store = MutexStore<K, A>;

    fn build(&self, generation: Arc<Generation<A>>, cap: Option<KeyCap>) -> MutexStore<K, A> {
        MutexStore::new(self.shards, generation, cap)
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

    /// Every entry's value, in the table's order.
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.entries.iter_mut().map(|entry| &mut entry.value)
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
    shards: Box<[LockedShard<K, A>]>,
    hasher: RandomState,
    population: Population,
    /// The generation new checks decide by, once a change has moved every
    /// shard to it.
    current: Mutex<Arc<Generation<A>>>,
    /// Held by a change for its whole pass: changes follow one another.
    changing: Mutex<()>,
}

/// One shard: its lock, its table and their generation, on their own cache
/// line(s).
type LockedShard<K, A> = CachePadded<Mutex<InShard<K, A>>>;

/// What one shard's lock guards: its keys' states and their generation.
struct InShard<K, A: Algorithm> {
    generation: Arc<Generation<A>>,
    table: Table<K, A::State>,
}

impl<K: Key, A: Algorithm> MutexStore<K, A> {
    fn new(shards: usize, generation: Arc<Generation<A>>, cap: Option<KeyCap>) -> Self {
        Self {
            shards: (0..shards)
                .map(|_| {
                    CachePadded::new(Mutex::new(InShard {
                        generation: Arc::clone(&generation),
                        table: Table::default(),
                    }))
                })
                .collect(),
            hasher: RandomState::new(),
            population: Population::new(cap),
            current: Mutex::new(generation),
            changing: Mutex::new(()),
        }
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, InShard<K, A>> {
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
    /// swept for this check. A decision is handed to `finish` with its
    /// generation and algorithm.
    #[allow(clippy::too_many_arguments)]
    fn check_once<Q: Lookup<K> + ?Sized, U: Under<A>>(
        &self,
        hash: u64,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
        swept: bool,
        mut finish: impl FnMut(&Generation<A>, &A, Decision),
    ) -> Result<Attempt, CheckError> {
        // Declared before the lock, so dropped after it even when a panic
        // unwinds: evicted keys' `Drop` never runs under the lock.
        let mut evicted = Discarded::new();
        // Lookup, decision and write all happen under the shard's lock.
        let mut guard = self.shard(hash);
        let InShard { generation, table } = &mut *guard;
        let algorithm = under.choose(generation)?;
        if let Some(entry) = table.find_mut(hash, key) {
            let decision = algorithm.check(&mut entry.value, now_ns, cost)?;
            finish(generation, &algorithm, decision);
            return Ok(Attempt::Done(decision));
        }
        let own = generation.algorithm();
        let checked = admit_new_key(
            &self.population,
            &*algorithm,
            key,
            now_ns,
            cost,
            swept,
            NewKey::new(
                (&mut *table, &mut evicted),
                |(table, evicted)| {
                    table.make_room(&self.hasher, |table| {
                        self.sweep(table, evicted, own, rested_at(own, now_ns));
                    });
                    Ok(())
                },
                |state| state,
                |(table, _), key, value| table.insert(hash, Entry { key, value }, &self.hasher),
            ),
        );
        if let Ok(Attempt::Done(decision)) = &checked {
            finish(generation, &algorithm, *decision);
        }
        drop(algorithm);
        drop(guard);
        drop(evicted);
        checked
    }
}

impl<K: Key, A: Algorithm> Store<K, A> for MutexStore<K, A> {
    fn check_then<Q: Lookup<K> + ?Sized, U: Under<A>, R>(
        &self,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
        finish: impl Fn(&Generation<A>, &A, Decision) -> R,
    ) -> Result<R, CheckError> {
        let hash = self.hasher.hash_one(key);
        let mut finished = None;
        retry_after_sweep(
            &self.population,
            |swept| {
                self.check_once(
                    hash,
                    key,
                    under,
                    now_ns,
                    cost,
                    swept,
                    |generation, algorithm, decision| {
                        finished = Some(finish(generation, algorithm, decision));
                    },
                )
            },
            || self.evict_idle(now_ns),
        )
        .map(|_| finished.expect("a decided check is finished"))
    }

    fn peek<Q: Lookup<K> + ?Sized, U: Under<A>>(
        &self,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let hash = self.hasher.hash_one(key);
        let mut guard = self.shard(hash);
        let InShard { generation, table } = &mut *guard;
        let algorithm = under.choose(generation)?;
        let verdict = match table.find_mut(hash, key) {
            Some(entry) => algorithm.decide(&entry.value, now_ns, cost)?,
            None => decide_fresh(&*algorithm, now_ns, cost)?,
        };
        Ok(verdict.decision())
    }

    fn update<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        change: impl Fn(&Generation<A>, &A::State) -> Option<A::State>,
    ) -> bool {
        let hash = self.hasher.hash_one(key);
        let mut guard = self.shard(hash);
        let InShard { generation, table } = &mut *guard;
        let Some(entry) = table.find_mut(hash, key) else {
            return false;
        };
        let Some(changed) = change(generation, &entry.value) else {
            return false;
        };
        let replaced = std::mem::replace(&mut entry.value, changed);
        // The replaced state's `Drop` (user code) after the lock.
        drop(guard);
        drop(replaced);
        true
    }

    fn generation(&self) -> Arc<Generation<A>> {
        Arc::clone(&lock(&self.current))
    }

    fn change(
        &self,
        to: Generation<A>,
        carry: Carry,
        at: &dyn Fn() -> CarryAt,
    ) -> Result<(), ChangeError> {
        let _changing = lock(&self.changing);
        let from = self.generation();
        check_carries(&from, &to, carry, at())?;
        let to = Arc::new(to.carried_from(&from));
        for shard in &*self.shards {
            let mut guard = lock(shard);
            let InShard { generation, table } = &mut *guard;
            let (from, to_algorithm) = (generation.algorithm(), to.algorithm());
            // Under the lock the states are frozen: the instant and the
            // strategy are read now.
            let carry = carry_for(generation, &to, carry);
            let at = at();
            // The algorithm's code first, changing nothing: a panic leaves
            // the shard in its generation, every state as it was.
            let carried: Vec<A::State> = table
                .values_mut()
                .map(|state| {
                    from.carry(to_algorithm, carry, state, at)
                        .expect("`Algorithm::carry` returned None after carrying a fresh state")
                })
                .collect();
            let replaced: Vec<A::State> = table
                .values_mut()
                .zip(carried)
                .map(|(state, carried)| std::mem::replace(state, carried))
                .collect();
            *generation = Arc::clone(&to);
            // The replaced states' `Drop` (user code) after the lock, each
            // on its own: a panic there changes nothing.
            drop(guard);
            discard_each(replaced);
        }
        *lock(&self.current) = to;
        Ok(())
    }

    fn evict_idle(&self, now_ns: u64) -> usize {
        let mut evicted = Discarded::new();
        // Every shard is swept before any is tidied: tidying hashes keys
        // (user code), and a panic there then leaves every idle key evicted,
        // as the call meant to (the shards not yet tidied are tidied before
        // their next insert).
        let removed = self
            .shards
            .iter()
            .map(|shard| {
                let mut guard = lock(shard);
                let InShard { generation, table } = &mut *guard;
                self.sweep(table, &mut evicted, generation.algorithm(), now_ns)
            })
            .sum();
        for shard in &*self.shards {
            lock(shard).table.tidy(&self.hasher);
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
            if let Some(panic) = lock(shard).table.clear() {
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
