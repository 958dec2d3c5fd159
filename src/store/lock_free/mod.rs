//! The default store, [`LockFree`]: keys in sharded open-addressing tables
//! whose lookups take no lock.
//!
//! A check on an existing key hashes it, enters a read section of the
//! store's read-copy-update (`sync::rcu`: stores to the thread's own
//! record and a compiler fence, no read-modify-write), loads the shard's table pointer, probes for the key and runs the cell's check (for
//! GCRA and the fixed window, one compare-and-swap, and none on a denial).
//! It takes no lock and writes nothing shared but the cell. A key absent
//! from the table, or whose cell was retired under the check (evicted, or
//! moved by a rebuild), is looked up again under the shard's mutex
//! (`Shard::with_cell`, and the check's slow path).
//!
//! Everything that changes a table's structure happens under the shard's
//! mutex, on a `#[cold]` path: inserting a new key, evicting idle keys, and
//! rebuilding the table (to grow, to shrink, or to clear evicted slots):
//! `rebuild.rs`. The table itself is `table.rs`; each shard's table
//! pointer, writer bookkeeping and the reclamation of replaced tables are
//! `shard.rs`.
//!
//! A table holds up to 15/16 of its buckets. A growing table grows by 9/8,
//! not 2, from bucket counts of any size, and each shard's sizes are offset
//! within that step (`table::Stagger`), so that the shards grow at
//! different key counts and the store's bytes per key stay near their
//! average at every count (`notes/06-bounded-memory.md` measures them).

mod rebuild;
mod shard;
mod table;

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use self::shard::{GRACE_ROUNDS, PROMPT_ROUNDS, Retired, Shard, Writer};
use self::table::{Stagger, max_used};
use super::kit::{
    Attempt, NewKey, Population, admit_new_key, check_carries, decide_fresh, retry_after_sweep,
};
use super::{
    ChangeError, Discarded, Generation, Key, KeyCap, Lookup, Store, StoreKind, Under,
    default_shards, shard_index,
};
use crate::algorithm::{Algorithm, Carry, CarryAt};
use crate::cell::{Cell, CellFor, Preferred};
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::canary::{self, Canary};
use crate::sync::{Mutex, lock, rcu};

/// The default store: checks on keys it holds take no lock, and write
/// nothing shared but the key's own state.
///
/// Keys live in sharded open-addressing tables, each key's state in a
/// [`Cell`] inline beside it: for GCRA and the fixed window, one atomic
/// word, so that an admission is one compare-and-swap and a denial a load
/// (no allocation per key: a bucket is `size_of::<(K, Cell)>() + 1` bytes,
/// 17 for `u64` keys and GCRA). Only a new key, an eviction or a table's
/// rebuild (to grow, or to drop evicted keys) takes its shard's lock.
///
/// Choose it unless a measurement says otherwise: it serves many threads
/// on hot and cold keys alike. The mutex stores
/// ([`GlobalMutex`](super::GlobalMutex), [`Sharded`](super::Sharded),
/// [`PerKey`](super::PerKey)) take a lock on every check, and are the
/// baselines it is measured against.
///
/// # Guarantees
///
/// Besides every store's (exact eviction, the key cap: see the
/// [module documentation](super)):
///
/// * **A check on a stored key waits for no lock**, except a check on a key
///   that a rebuild of its shard is moving at that moment, which waits for
///   the rebuild.
/// * **Memory is bounded at every instant**, not only once things settle:
///   a table holds keys in up to 15/16 of its buckets and grows in steps of
///   9/8, a table replaced by a rebuild is freed as soon as no check can
///   still be reading it, and a shard keeps at most two replaced tables
///   waiting for that. [`evict_idle`](Store::evict_idle) rebuilds the
///   shards it evicted from, so that the evicted keys' memory goes back.
/// * **A stalled check stalls no writer.** A key's `Eq` and `Borrow` run
///   inside the check (as for any map), and a check that stays there (an
///   `Eq` blocked on a lock, a thread descheduled mid-check) keeps replaced
///   tables from being freed, in every lock-free store of the process. No
///   writer waits for it beyond a bounded time: while it lasts, a new key
///   whose shard must be rebuilt to hold it is refused with
///   [`CheckError::Reclaiming`] (under
///   [`WhenFull::AdmitUntracked`](super::WhenFull::AdmitUntracked), decided
///   fresh and not stored), and stored keys are decided as ever.
///
/// # Hashing
///
/// Keys are hashed with std's `RandomState` (SipHash-1-3, keyed randomly per
/// store) unless [`with_hasher`](LockFree::with_hasher) chooses another.
/// Keys are usually chosen by clients, so by attackers, and `SipHash` is the
/// one designed to resist collisions an attacker tries to force. Choose a
/// faster seeded hasher only for keys clients do not control: on the 2-core
/// VM of tollgate's notes, seeded foldhash
/// (`LockFree::default().with_hasher(foldhash::fast::RandomState::default())`)
/// makes a keyed denial about 1.4–1.6× faster (`notes/08-results.md`,
/// "The defaults, chosen").
///
/// A weak hasher still spreads keys within a table (the table mixes each
/// hash before using it), but the shard is taken from the hash's bits 32
/// and up as the hasher gives them: a hasher that does not vary them (an
/// identity hash of integers below 2^32) puts every key in one shard, which
/// is correct but serialises every new key on one lock. A hasher with
/// collisions, or one a client can steer, makes every lookup long.
///
/// # Reclamation
///
/// A check reads its shard's table inside a read section: a few loads and
/// stores to its own thread's record, no read-modify-write and, on Linux,
/// no fence. A table replaced by a
/// growth or a compaction is freed once every section that could read it
/// has ended, which writers learn from a `membarrier(2)` (one per pass
/// over replaced tables; the process registers for it when it builds its
/// first lock-free store), or, where the kernel has no membarrier, from a
/// fence on both sides. A check stalled inside the store delays every
/// such free, never past a bound: see [`CheckError::Reclaiming`]. A
/// process that forks while other threads run leaves the child their
/// records, and whatever lock they held: use a lock-free store in the
/// child only if it execs, or if the parent forked before building one.
///
/// [`CheckError::Reclaiming`]: crate::CheckError::Reclaiming
///
/// # Example
///
/// ```
/// use tollgate::{Builder, Quota};
/// use tollgate::store::LockFree;
///
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // The default store, with 16 shards rather than four per core.
/// let limiter = Builder::new(Quota::per_second(5)?)
///     .store(LockFree::new(16))
///     .build::<u64>();
/// assert!(limiter.check(&7)?.is_allowed());
/// # Ok(())
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
pub struct LockFree<H = RandomState, P = Preferred> {
    shards: usize,
    hasher: H,
    cells: PhantomData<fn() -> P>,
}

impl LockFree {
    /// Creates the store kind with `shards` shards, rounded up to a power of
    /// two (at least 1).
    #[must_use]
    pub fn new(shards: usize) -> Self {
        Self {
            shards: shards.max(1).next_power_of_two(),
            hasher: RandomState::new(),
            cells: PhantomData,
        }
    }
}

impl<H, P> LockFree<H, P> {
    /// The same store hashing keys with `hasher`, cloned into every store
    /// built from this value (so limiters built from one value share its
    /// seed; `Builder::new` makes a fresh default per limiter). See
    /// "Hashing" above before choosing one.
    #[must_use]
    pub fn with_hasher<H2: BuildHasher>(self, hasher: H2) -> LockFree<H2, P> {
        LockFree {
            shards: self.shards,
            hasher,
            cells: PhantomData,
        }
    }

    /// The same store keeping each key's state in the cells `P2` chooses:
    /// [`Preferred`] (the default: a compare-and-swap word where the state
    /// packs into one) or [`AlwaysLocked`](crate::cell::AlwaysLocked) (a
    /// mutex for every algorithm), so that a benchmark can vary the cell
    /// alone on the same table.
    ///
    /// ```
    /// use tollgate::Builder;
    /// use tollgate::cell::AlwaysLocked;
    /// use tollgate::store::LockFree;
    ///
    /// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Builder::new(tollgate::Quota::per_second(5)?)
    ///     .store(LockFree::default().cells::<AlwaysLocked>())
    ///     .build::<u64>();
    /// assert!(limiter.check(&7)?.is_allowed());
    /// # Ok(())
    /// # }
    /// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
    /// ```
    #[must_use]
    pub fn cells<P2>(self) -> LockFree<H, P2> {
        LockFree {
            shards: self.shards,
            hasher: self.hasher,
            cells: PhantomData,
        }
    }
}

impl Default for LockFree {
    /// Four shards per available core, rounded up to a power of two.
    fn default() -> Self {
        Self::new(default_shards())
    }
}

impl<H: Clone, P> Clone for LockFree<H, P> {
    fn clone(&self) -> Self {
        Self {
            shards: self.shards,
            hasher: self.hasher.clone(),
            cells: PhantomData,
        }
    }
}

impl<H: fmt::Debug, P> fmt::Debug for LockFree<H, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockFree")
            .field("shards", &self.shards)
            .field("hasher", &self.hasher)
            .field("cells", &std::any::type_name::<P>())
            .finish()
    }
}

impl<K, A, H, P> StoreKind<K, A> for LockFree<H, P>
where
    K: Key,
    A: Algorithm,
    H: BuildHasher + Clone + fmt::Debug + Send + Sync + 'static,
    P: CellFor<A> + 'static,
{
    type Store = LockFreeStore<K, A, P::Cell, H>;

    fn build(&self, generation: Arc<Generation<A>>, cap: Option<KeyCap>) -> Self::Store {
        // The process's first store decides how readers and writers order
        // themselves (registering for membarrier: milliseconds, once), so
        // that no check pays it.
        rcu::prepare();
        LockFreeStore {
            shards: (0..self.shards)
                .map(|index| {
                    CachePadded::new(Shard::new(
                        Stagger::new(index, self.shards),
                        Arc::clone(&generation),
                    ))
                })
                .collect(),
            hasher: self.hasher.clone(),
            population: Population::new(cap),
            current: Mutex::new(generation),
            changing: Mutex::new(()),
        }
    }
}

/// A table's generation: every state in the table is in it.
pub(super) type Gen<A> = Arc<Generation<A>>;

/// A shard of keys in generation `Gen<A>`, on its own cache lines.
type PaddedShard<K, A, C> = CachePadded<Shard<K, C, Gen<A>>>;

/// The store [`LockFree`] builds.
pub struct LockFreeStore<K, A, C, H> {
    shards: Box<[PaddedShard<K, A, C>]>,
    hasher: H,
    population: Population,
    /// The generation new checks decide by, once a change has moved every
    /// shard to it.
    current: Mutex<Gen<A>>,
    /// Held by a change for its whole pass: changes follow one another.
    changing: Mutex<()>,
}

/// Under the shard's lock every live slot's cell is live: eviction and
/// rebuilds retire cells and unlink them in one critical section.
const LIVE_UNDER_LOCK: &str = "under the writers' lock, a live slot's cell is live";

impl<K, A, C, H> LockFreeStore<K, A, C, H>
where
    K: Key,
    A: Algorithm,
    C: Cell<A>,
    H: BuildHasher + Send + Sync,
{
    #[inline]
    fn shard(&self, hash: u64) -> &Shard<K, C, Gen<A>> {
        &self.shards[shard_index(hash, self.shards.len())]
    }

    /// The slow path: under the shard's mutex, look again, insert if absent;
    /// then free what a rebuild replaced, with the lock released.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn check_slow<Q: Lookup<K> + ?Sized, U: Under<A>, R>(
        &self,
        shard: &Shard<K, C, Gen<A>>,
        hash: u64,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
        finish: &impl Fn(&Generation<A>, &A, Decision) -> R,
    ) -> Result<R, CheckError> {
        let mut finished = None;
        retry_after_sweep(
            &self.population,
            |swept| {
                // Declared before the lock: dropped after it, even if user
                // code panics (a rebuild abandoned goes here).
                let mut discarded = Discarded::new();
                let mut writer = lock(&shard.writer);
                let checked = self.check_locked(
                    shard,
                    &mut writer,
                    &mut discarded,
                    (hash, key),
                    under,
                    now_ns,
                    cost,
                    swept,
                    |generation, algorithm, decision| {
                        finished = Some(finish(generation, algorithm, decision));
                    },
                );
                // A rebuild waited for the shard's last replaced table to be
                // free to go: free it now, so that a shard holds one replaced
                // table awaiting its grace period.
                discarded.extend(writer.take_graced());
                let waiting = !writer.retired.is_empty();
                drop(writer);
                drop(discarded);
                if waiting {
                    shard.reclaim(PROMPT_ROUNDS);
                }
                checked
            },
            || self.evict_idle(now_ns),
        )
        .map(|_| finished.expect("a decided check is finished"))
    }

    /// One attempt under the shard's lock (`writer` is its guarded data).
    /// `swept`: the store was just swept for this check. A decision is
    /// handed to `finish` with its generation and algorithm.
    #[allow(clippy::too_many_arguments)]
    fn check_locked<Q: Lookup<K> + ?Sized, U: Under<A>>(
        &self,
        shard: &Shard<K, C, Gen<A>>,
        writer: &mut Writer<K, C, Gen<A>>,
        discarded: &mut Discarded<Retired<K, C, Gen<A>>>,
        (hash, key): (u64, &Q),
        under: &U,
        now_ns: u64,
        cost: u32,
        swept: bool,
        mut finish: impl FnMut(&Generation<A>, &A, Decision),
    ) -> Result<Attempt, CheckError> {
        // SAFETY: our caller holds the lock for the whole call.
        let table = unsafe { shard.table_locked() };
        // Only lock holders replace the table, and a growth keeps its
        // generation: this one is every state's in the shard until we
        // release the lock.
        let generation = Arc::clone(table.meta());
        let algorithm = under.choose(&generation)?;
        if let Some(cell) = table.find(hash, key) {
            let decision = cell
                .check(&algorithm, now_ns, cost)?
                .expect(LIVE_UNDER_LOCK);
            finish(&generation, &algorithm, decision);
            return Ok(Attempt::Done(decision));
        }
        let attempt = admit_new_key(
            &self.population,
            &*algorithm,
            key,
            now_ns,
            cost,
            swept,
            NewKey::new(
                (writer, discarded, table),
                |(writer, discarded, table)| {
                    if writer.used >= max_used(table.buckets()) {
                        self.grow(shard, writer, discarded, now_ns)?;
                        // SAFETY: lock held, as above.
                        *table = unsafe { shard.table_locked() };
                    }
                    Ok(())
                },
                |state| C::with_state(&algorithm, state),
                |(writer, _, table), owned, cell| {
                    table.insert(hash, owned, cell);
                    writer.used += 1;
                    writer.live += 1;
                },
            ),
        )?;
        if let Attempt::Done(decision) = attempt {
            finish(&generation, &algorithm, decision);
        }
        Ok(attempt)
    }

    /// Runs `read` on `key`'s cell (`None`: the key is absent) and the
    /// generation of the table it is in, taking no lock: in a read
    /// section, left before this returns (no thread takes a shard lock
    /// inside one: see `shard::may_rebuild`), even when `read` or the
    /// key's `Eq` panics. `read` returns `None` for a retired cell (evicted
    /// or moved by a rebuild): then it runs once more under the shard's
    /// lock, where no writer is mid-change and every live slot's cell is
    /// live.
    fn read_key<Q: Lookup<K> + ?Sized, R>(
        &self,
        hash: u64,
        key: &Q,
        read: impl Fn(&Generation<A>, Option<&C>) -> Option<R>,
    ) -> R {
        let shard = self.shard(hash);
        {
            let section = rcu::enter();
            let table = shard.table(&section);
            let read = read(table.meta(), table.find(hash, key));
            table.assert_not_freed();
            if let Some(read) = read {
                return read;
            }
        }
        let _writer = lock(&shard.writer);
        // SAFETY: we hold the lock.
        let table = unsafe { shard.table_locked() };
        read(table.meta(), table.find(hash, key)).expect(LIVE_UNDER_LOCK)
    }
}

impl<K, A, C, H> Store<K, A> for LockFreeStore<K, A, C, H>
where
    K: Key,
    A: Algorithm,
    C: Cell<A>,
    H: BuildHasher + Send + Sync,
{
    // Always: left to itself, the compiler may call it out of line from
    // the limiter's `check`, a tenth more instructions a keyed denial
    // (`tollgate-lab --deny-loop 0 N` under callgrind; note 14).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn check_then<Q: Lookup<K> + ?Sized, U: Under<A>, R>(
        &self,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
        finish: impl Fn(&Generation<A>, &A, Decision) -> R,
    ) -> Result<R, CheckError> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            // `Shard::read_key`, written out: a decision returned from
            // inside the match reaches the caller in registers, where
            // nested enums cost two stack copies of it, one a stalled
            // store forward (a fifth of a denial on one thread). Left when
            // dropped, also when the key's `Eq` panics.
            let section = rcu::enter();
            let apart = canary::planted(Canary::GenerationApart).then(|| shard.table(&section));
            let table = shard.table(&section);
            if let Some(cell) = table.find(hash, key) {
                // The generation of the table the cell is in: a change
                // retires the cell before its state leaves this one.
                let generation = apart.map_or(table, |apart| apart).meta();
                let algorithm = under.choose(generation)?;
                let checked = cell.check(&algorithm, now_ns, cost);
                table.assert_not_freed();
                match checked {
                    Ok(Some(decision)) => return Ok(finish(generation, &algorithm, decision)),
                    Err(error) => return Err(error),
                    // Retired under us: evicted or moved.
                    Ok(None) => {}
                }
            }
        }
        // Absent, or retired under us: the slow path looks again under the
        // lock, and inserts if absent.
        self.check_slow(shard, hash, key, under, now_ns, cost, &finish)
    }

    fn peek<Q: Lookup<K> + ?Sized, U: Under<A>>(
        &self,
        key: &Q,
        under: &U,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let hash = self.hasher.hash_one(key);
        self.read_key(hash, key, |generation, cell| {
            let algorithm = match under.choose(generation) {
                Ok(algorithm) => algorithm,
                Err(error) => return Some(Err(error)),
            };
            match cell {
                Some(cell) => cell.peek(&algorithm, now_ns, cost).transpose(),
                None => Some(decide_fresh(&*algorithm, now_ns, cost).map(|v| v.decision())),
            }
        })
    }

    fn update<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        change: impl Fn(&Generation<A>, &A::State) -> Option<A::State>,
    ) -> bool {
        let hash = self.hasher.hash_one(key);
        self.read_key(hash, key, |generation, cell| match cell {
            Some(cell) => cell.update(generation.algorithm(), |state| change(generation, state)),
            None => Some(false),
        })
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
        if !self.may_convert_all() {
            return Err(ChangeError::Reclaiming);
        }
        let to = Arc::new(to.carried_from(&from));
        for shard in &*self.shards {
            self.convert(shard, &to, carry, at);
        }
        *lock(&self.current) = to;
        Ok(())
    }

    fn evict_idle(&self, now_ns: u64) -> usize {
        // Every shard is swept before any is compacted: compacting clones and
        // hashes keys (user code), and a panic there then leaves every idle
        // key evicted, as the call meant to.
        let removed = self
            .shards
            .iter()
            .map(|shard| {
                let mut writer = lock(&shard.writer);
                // SAFETY: we hold the lock.
                let table = unsafe { shard.table_locked() };
                self.sweep(table, &mut writer, now_ns)
            })
            .sum();
        // A shard whose rebuild panics (a key's `Hash` or `Clone`) keeps its
        // evicted slots; the others are still compacted, and the first
        // panic goes on once every shard was tried.
        let mut first_panic = None;
        for shard in &*self.shards {
            let compacted = catch_unwind(AssertUnwindSafe(|| {
                self.compact(shard);
            }));
            if let Err(panic) = compacted {
                first_panic.get_or_insert(panic);
            }
        }
        // Every shard's replaced table unlinked first, so that the first
        // reclaim's barrier serves them all: one barrier, not one a shard.
        for shard in &*self.shards {
            shard.reclaim(GRACE_ROUNDS);
        }
        if let Some(panic) = first_panic {
            resume_unwind(panic);
        }
        removed
    }

    fn len(&self) -> usize {
        self.population.len()
    }
}

impl<K, A, C, H> fmt::Debug for LockFreeStore<K, A, C, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockFreeStore")
            .field("shards", &self.shards.len())
            .field("population", &self.population)
            .finish_non_exhaustive()
    }
}
