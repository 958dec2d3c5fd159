//! The mutex baselines: one `Mutex<HashMap>`, or cache-padded shards of them.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hash, RandomState};

use crossbeam_utils::CachePadded;

use super::{
    Checked, Key, KeyCap, Population, Room, Store, StoreKind, default_shards, retry_after_sweep,
};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::{Mutex, MutexGuard, lock};

/// Every key in one `HashMap` behind one `Mutex`: correct, simple, and the
/// baseline the other stores are measured against. Every check on every key
/// serialises on the one lock.
///
/// The map's hasher is std's `RandomState`, seeded randomly per map, so an
/// attacker who chooses keys cannot precompute collisions.
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalMutex;

/// `N` independently locked `HashMap` shards, each on its own cache line; a
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

impl StoreKind for GlobalMutex {
    type Store<K: Key, A: Algorithm> = MutexStore<K, A>;

    fn build<K: Key, A: Algorithm>(&self, cap: Option<KeyCap>) -> MutexStore<K, A> {
        MutexStore::new(1, cap)
    }
}

impl StoreKind for Sharded {
    type Store<K: Key, A: Algorithm> = MutexStore<K, A>;

    fn build<K: Key, A: Algorithm>(&self, cap: Option<KeyCap>) -> MutexStore<K, A> {
        MutexStore::new(self.shards, cap)
    }
}

/// The store [`GlobalMutex`] (one shard) and [`Sharded`] build.
pub struct MutexStore<K, A: Algorithm> {
    shards: Box<[LockedShard<K, A::State>]>,
    /// Chooses a key's shard; unused with one shard.
    shard_hasher: RandomState,
    population: Population,
}

/// One shard: its lock and map on their own cache line(s).
type LockedShard<K, S> = CachePadded<Mutex<HashMap<K, S>>>;

impl<K: Key, A: Algorithm> MutexStore<K, A> {
    fn new(shards: usize, cap: Option<KeyCap>) -> Self {
        Self {
            shards: (0..shards)
                .map(|_| CachePadded::new(Mutex::new(HashMap::new())))
                .collect(),
            shard_hasher: RandomState::new(),
            population: Population::new(cap),
        }
    }

    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> MutexGuard<'_, HashMap<K, A::State>> {
        let index = if self.shards.len() == 1 {
            0
        } else {
            // The mask keeps the index below the shard count: truncation is
            // the point.
            #[allow(clippy::cast_possible_truncation)]
            let hash = self.shard_hasher.hash_one(key) as usize;
            hash & (self.shards.len() - 1)
        };
        lock(&self.shards[index])
    }

    /// Removes the shard's keys idle at `idle_at_ns` (and so at every later
    /// instant) and returns their room; gives back memory when the map has
    /// become mostly empty.
    fn sweep(&self, map: &mut HashMap<K, A::State>, algorithm: &A, idle_at_ns: u64) -> usize {
        let before = map.len();
        map.retain(|_, state| !algorithm.is_idle(state, idle_at_ns));
        let removed = before - map.len();
        self.population.release(removed);
        if map.len() < map.capacity() / 4 {
            map.shrink_to(map.len() * 2);
        }
        removed
    }
}

impl<K: Key, A: Algorithm> MutexStore<K, A> {
    /// One check under the key's shard lock; `swept`: the store was just
    /// swept for this check.
    fn check_once<Q>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
        swept: bool,
    ) -> Result<Checked, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Lookup, decision and write all happen under the shard's lock.
        let mut shard = self.shard(key);
        if let Some(state) = shard.get_mut(key) {
            return algorithm.check(state, now_ns, cost).map(Checked::Done);
        }
        // A new key: its state is the default, which has its whole burst, so
        // any valid cost is admitted. An invalid cost returns here, before
        // anything is stored.
        let mut state = A::State::default();
        let decision = algorithm.check(&mut state, now_ns, cost)?;
        // Before the map grows, make room by evicting keys idle for at least
        // the algorithm's rest time (keys between two requests stay):
        // amortized, since the map doubles each time it grows.
        if shard.len() == shard.capacity() {
            let idle_at_ns = now_ns.saturating_sub(algorithm.rest_ns());
            self.sweep(&mut shard, algorithm, idle_at_ns);
        }
        match self.population.make_room(swept) {
            Room::Reserved => {
                shard.insert(key.to_owned(), state);
                Ok(Checked::Done(decision))
            }
            Room::Full(cap) => cap.when_full(decision).map(Checked::Done),
            Room::SweepFirst => Ok(Checked::SweepFirst),
        }
    }
}

impl<K: Key, A: Algorithm> Store<K, A> for MutexStore<K, A> {
    fn check<Q>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        retry_after_sweep(
            &self.population,
            |swept| self.check_once(key, algorithm, now_ns, cost, swept),
            || self.evict_idle(algorithm, now_ns),
        )
    }

    fn peek<Q>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let shard = self.shard(key);
        let verdict = match shard.get(key) {
            Some(state) => algorithm.decide(state, now_ns, cost)?,
            None => algorithm.decide(&A::State::default(), now_ns, cost)?,
        };
        Ok(verdict.decision())
    }

    fn evict_idle(&self, algorithm: &A, now_ns: u64) -> usize {
        self.shards
            .iter()
            .map(|shard| self.sweep(&mut lock(shard), algorithm, now_ns))
            .sum()
    }

    fn len(&self) -> usize {
        self.population.len()
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
