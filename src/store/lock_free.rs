//! The default store: checks on existing keys take no lock.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash, RandomState};

use crossbeam_epoch::{self as epoch, Guard, Owned};
use crossbeam_utils::CachePadded;

use super::table::{MIN_BUCKETS, RawTable, max_used};
use super::{
    Checked, Key, KeyCap, Population, Room, Store, StoreKind, default_shards, retry_after_sweep,
};
use crate::algorithm::Algorithm;
use crate::cell::Cell;
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::{Mutex, lock};

/// The default store: keys in sharded open-addressing tables whose lookups
/// take no lock, each key's state in its algorithm's
/// [`Cell`](crate::cell::Cell) inline in the table (for GCRA: the key and one
/// `AtomicU64`, no allocation per key).
///
/// # Implementation details
///
/// A check on an existing key pins a `crossbeam-epoch` guard, loads the
/// shard's table pointer, probes for the key and runs the cell's check (for
/// GCRA and the fixed window, one compare-and-swap, and none on a denial). It
/// takes no lock and writes nothing shared but the cell.
///
/// Everything that changes a table's structure happens under the shard's
/// mutex, on a `#[cold]` path: inserting a new key, evicting idle keys, and
/// rebuilding the table (to grow, to shrink, or to clear evicted slots). A
/// rebuild moves each key by **retiring** its cell (`Cell::retire_into_new`,
/// a swap of the cell's word) and copying the last state into the new table,
/// then publishes the new table and hands the old one to the epoch collector.
/// A check that meets a retired cell, whether evicted or moved, goes to the
/// slow path, takes the shard's mutex, and looks the key up again in the
/// current table. So no admission is lost to a concurrent eviction or
/// rebuild. The cost is that checks on moved keys wait for an in-progress
/// rebuild of their shard.
///
/// # Memory
///
/// A table holds up to 7/8 of its buckets (as `hashbrown` does), at
/// `size_of::<(K, Cell)>() + 1` bytes per bucket: 17 for `u64` keys and
/// GCRA. Evicted slots are reclaimed when the table is next rebuilt, and a
/// rebuild sizes the table from the live keys, so it also shrinks.
///
/// # Hashing
///
/// Keys are hashed with std's `RandomState` (SipHash-1-3, keyed randomly per
/// store) unless [`with_hasher`](LockFree::with_hasher) chooses another.
/// Keys are usually chosen by clients, so by attackers, and `SipHash` is the
/// one designed to resist collisions an attacker tries to force; it is also
/// about a fifth of a keyed check's time (notes/04). Choose a faster seeded
/// hasher only for keys clients do not control.
#[derive(Debug, Clone)]
pub struct LockFree<H = RandomState> {
    shards: usize,
    hasher: H,
}

impl LockFree {
    /// `shards` shards, rounded up to a power of two (at least 1).
    #[must_use]
    pub fn new(shards: usize) -> Self {
        Self {
            shards: shards.max(1).next_power_of_two(),
            hasher: RandomState::new(),
        }
    }
}

impl<H> LockFree<H> {
    /// The same store hashing keys with `hasher`, cloned into every store
    /// built from this value (so limiters built from one value share its
    /// seed; `Builder::new` makes a fresh default per limiter). See
    /// "Hashing" above before choosing one.
    #[must_use]
    pub fn with_hasher<H2: BuildHasher>(self, hasher: H2) -> LockFree<H2> {
        LockFree {
            shards: self.shards,
            hasher,
        }
    }
}

impl Default for LockFree {
    /// Four shards per available core, rounded up to a power of two.
    fn default() -> Self {
        Self::new(default_shards())
    }
}

impl<H> StoreKind for LockFree<H>
where
    H: BuildHasher + Clone + fmt::Debug + Send + Sync + 'static,
{
    type Store<K: Key, A: Algorithm> = LockFreeStore<K, A, H>;

    fn build<K: Key, A: Algorithm>(&self, cap: Option<KeyCap>) -> LockFreeStore<K, A, H> {
        LockFreeStore {
            shards: (0..self.shards)
                .map(|_| CachePadded::new(Shard::new()))
                .collect(),
            hasher: self.hasher.clone(),
            population: Population::new(cap),
        }
    }
}

/// The store [`LockFree`] builds.
pub struct LockFreeStore<K, A: Algorithm, H = RandomState> {
    shards: Box<[PaddedShard<K, A::Cell>]>,
    hasher: H,
    population: Population,
}

/// A shard on its own cache line(s), so shards' writers never share one.
type PaddedShard<K, V> = CachePadded<Shard<K, V>>;

struct Shard<K, V> {
    table: epoch::Atomic<RawTable<K, V>>,
    writer: Mutex<Writer>,
}

/// A shard's writer-side bookkeeping, under its mutex.
#[derive(Debug)]
struct Writer {
    /// Live and deleted slots in the current table.
    used: usize,
    /// Live slots.
    live: usize,
}

impl<K, V> Shard<K, V> {
    fn new() -> Self {
        Self {
            table: epoch::Atomic::new(RawTable::with_buckets(MIN_BUCKETS)),
            writer: Mutex::new(Writer { used: 0, live: 0 }),
        }
    }

    /// The current table.
    #[inline]
    fn table<'g>(&self, guard: &'g Guard) -> &'g RawTable<K, V> {
        // Acquire: pairs with the Release store that published a rebuilt
        // table, so that its slots and control bytes are visible.
        let table = self.table.load(crate::sync::Ordering::Acquire, guard);
        // SAFETY: the pointer is never null (a shard starts with a table and
        // only ever replaces it with another), and the table it points to is
        // reclaimed only after every guard pinned before its replacement is
        // dropped.
        unsafe { table.deref() }
    }
}

impl<K, V> Drop for Shard<K, V> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other thread can reach the table any more,
        // so it can be taken without a guard.
        drop(unsafe {
            self.table
                .load(crate::sync::Ordering::Relaxed, epoch::unprotected())
                .into_owned()
        });
    }
}

impl<K: Key, A: Algorithm, H: BuildHasher> LockFreeStore<K, A, H> {
    #[inline]
    fn shard(&self, hash: u64) -> &Shard<K, A::Cell> {
        // Bits 32 and up pick the shard; a table uses the low bits and the
        // top 7 (`h2`), so the choices stay independent.
        #[allow(clippy::cast_possible_truncation)]
        let index = (hash >> 32) as usize & (self.shards.len() - 1);
        &self.shards[index]
    }

    /// The slow path: the shard's mutex held, look again, insert if absent.
    /// `swept`: the store was just swept for this check.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn check_locked<Q>(
        &self,
        shard: &Shard<K, A::Cell>,
        hash: u64,
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
        let mut guard_writer = lock(&shard.writer);
        let writer = &mut *guard_writer;
        let guard = epoch::pin();
        let mut table = shard.table(&guard);
        if let Some(cell) = table.find(hash, key) {
            // Under the mutex every live slot's cell is live: eviction and
            // rebuilds retire cells and unlink them in one critical section.
            if let Some(decision) = cell.check(algorithm, now_ns, cost)? {
                return Ok(Checked::Done(decision));
            }
        }
        // A new key: a fresh state has its whole burst, so a valid cost is
        // admitted; an invalid one returns here, before anything is stored.
        let fresh = algorithm
            .decide(&A::State::default(), now_ns, cost)?
            .decision();
        match self.population.make_room(swept) {
            Room::Reserved => {}
            Room::Full(cap) => return cap.when_full(fresh).map(Checked::Done),
            Room::SweepFirst => return Ok(Checked::SweepFirst),
        }
        if writer.used >= max_used(table.buckets()) {
            table = self.rebuild(shard, writer, algorithm, now_ns, &guard);
        }
        let cell = table.insert(hash, key.to_owned(), A::Cell::new(algorithm));
        writer.used += 1;
        writer.live += 1;
        // Others can find the cell from here on, so decide through it.
        match cell.check(algorithm, now_ns, cost)? {
            Some(decision) => Ok(Checked::Done(decision)),
            // Only a writer retires a cell, and we hold the writers' lock.
            None => Ok(Checked::Done(fresh)),
        }
    }

    /// Evicts the keys of the whole current table that are idle at
    /// `idle_at_ns` (and so at every later instant).
    fn sweep(
        &self,
        table: &RawTable<K, A::Cell>,
        live: &mut usize,
        algorithm: &A,
        idle_at_ns: u64,
    ) -> usize {
        let mut removed = 0;
        for (index, _, cell) in table.live() {
            if cell.retire_if_idle(algorithm, idle_at_ns) {
                table.mark_deleted(index);
                removed += 1;
            }
        }
        *live -= removed;
        self.population.release(removed);
        removed
    }

    /// Rebuilds the shard's table, sized for its live keys, and returns the
    /// new table. When live keys (not evicted slots) fill the table, it first
    /// evicts the keys idle for at least the algorithm's rest time: the
    /// amortized eviction, since a table fills only after a number of inserts
    /// proportional to its size. Keys idle for less (in use, between two
    /// requests) stay, so a working set is never evicted only to be
    /// re-inserted; and a rebuild that only clears evicted slots evicts
    /// nothing.
    fn rebuild<'g>(
        &self,
        shard: &Shard<K, A::Cell>,
        writer: &mut Writer,
        algorithm: &A,
        now_ns: u64,
        guard: &'g Guard,
    ) -> &'g RawTable<K, A::Cell> {
        let old = shard.table(guard);
        if (writer.live + 1) * 4 > max_used(old.buckets()) * 3 {
            let idle_at_ns = now_ns.saturating_sub(algorithm.rest_ns());
            self.sweep(old, &mut writer.live, algorithm, idle_at_ns);
        }
        // Room for the live keys and the one being inserted at no more than
        // 3/4 of the maximum load, so that the next rebuild is far off; when
        // nothing was evicted this doubles, as hashbrown does.
        let mut buckets = MIN_BUCKETS;
        while (writer.live + 1) * 4 > max_used(buckets) * 3 {
            buckets *= 2;
        }
        let new = RawTable::with_buckets(buckets);
        let mut moved = 0;
        for (index, key, cell) in old.live() {
            let hash = self.hasher.hash_one(key);
            let cell = cell
                .retire_into_new()
                .expect("under the writers' lock, a live slot's cell is live");
            new.insert(hash, old.take_key(index), cell);
            moved += 1;
        }
        writer.used = moved;
        writer.live = moved;
        // Release: publishes the new table's slots to checks that load the
        // pointer with Acquire (`Shard::table`).
        let old = shard
            .table
            .swap(Owned::new(new), crate::sync::Ordering::Release, guard);
        // SAFETY: the old table is unlinked: checks that still hold it were
        // pinned before the swap, and the collector destroys it only after
        // every such guard is dropped.
        unsafe { guard.defer_destroy(old) };
        shard.table(guard)
    }
}

impl<K: Key, A: Algorithm, H: BuildHasher + Send + Sync> Store<K, A> for LockFreeStore<K, A, H> {
    #[inline]
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
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            let guard = epoch::pin();
            if let Some(cell) = shard.table(&guard).find(hash, key) {
                if let Some(decision) = cell.check(algorithm, now_ns, cost)? {
                    return Ok(decision);
                }
            }
        }
        retry_after_sweep(
            &self.population,
            |swept| self.check_locked(shard, hash, key, algorithm, now_ns, cost, swept),
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
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        let guard = epoch::pin();
        if let Some(cell) = shard.table(&guard).find(hash, key) {
            if let Some(decision) = cell.peek(algorithm, now_ns, cost)? {
                return Ok(decision);
            }
            // Retired under us: evicted or moved. Ask again once no writer
            // is mid-change.
            let _writer = lock(&shard.writer);
            if let Some(cell) = shard.table(&guard).find(hash, key) {
                if let Some(decision) = cell.peek(algorithm, now_ns, cost)? {
                    return Ok(decision);
                }
            }
        }
        Ok(algorithm
            .decide(&A::State::default(), now_ns, cost)?
            .decision())
    }

    fn evict_idle(&self, algorithm: &A, now_ns: u64) -> usize {
        let guard = epoch::pin();
        self.shards
            .iter()
            .map(|shard| {
                let mut writer = lock(&shard.writer);
                self.sweep(shard.table(&guard), &mut writer.live, algorithm, now_ns)
            })
            .sum()
    }

    fn len(&self) -> usize {
        self.population.len()
    }
}

impl<K, A: Algorithm, H> fmt::Debug for LockFreeStore<K, A, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockFreeStore")
            .field("shards", &self.shards.len())
            .field("population", &self.population)
            .finish_non_exhaustive()
    }
}
