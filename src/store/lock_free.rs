//! The default store: checks on existing keys take no lock.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use crossbeam_utils::CachePadded;

use super::table::{MIN_BUCKETS, RawTable, Room, Stagger, buckets_for, max_used};
use super::{
    Checked, Discard, Discarded, Key, KeyCap, Lookup, NewKey, Population, Store, StoreKind,
    admit_new_key, decide_fresh, default_shards, rested_at, retry_after_sweep, shard_index,
};
use crate::algorithm::Algorithm;
use crate::cell::{Cell, CellFor, Preferred};
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::canary::{self, Canary};
use crate::sync::epoch::{self, Guard, Owned, Shared};
use crate::sync::{Arc, AtomicBool, Backoff, Mutex, Ordering, lock, wait_step};

/// The default store: keys in sharded open-addressing tables whose lookups
/// take no lock, each key's state in a [`Cell`] inline in the table (for
/// GCRA: the key and one `AtomicU64`, no allocation per key).
///
/// # Implementation details
///
/// A check on an existing key hashes it, pins an epoch guard, loads the
/// shard's table pointer, probes for the key and runs the cell's check (for
/// GCRA and the fixed window, one compare-and-swap, and none on a denial). It
/// takes no lock and writes nothing shared but the cell.
///
/// Everything that changes a table's structure happens under the shard's
/// mutex, on a `#[cold]` path: inserting a new key, evicting idle keys, and
/// rebuilding the table (to grow, to shrink, or to clear evicted slots). A
/// rebuild runs in two phases. First it hashes and **clones** every live key
/// into a new table, beside vacant cells (which hold no state, so creating
/// and dropping them runs no user code); this is the only user code a
/// rebuild runs, and a panic in it frees the new table, after the lock is
/// released, and leaves the old one untouched. Then, with no user code, it **retires** each old cell
/// ([`Cell::retire_into_new`], a swap of the cell's word) into the new
/// table, and publishes the new table. A check that meets a retired cell,
/// whether evicted or moved, goes to the slow path, takes the shard's
/// mutex, and looks the key up again in the current table, so no admission
/// is lost to a concurrent eviction or rebuild. The cost is that checks on
/// moved keys wait for an in-progress rebuild of their shard.
///
/// # Memory
///
/// A table holds up to 15/16 of its buckets, at `size_of::<(K, Cell)>() +
/// 1` bytes per bucket: 17 for `u64` keys and GCRA. A rebuild sizes the new
/// table for the live keys, so it grows, shrinks, or just clears evicted
/// slots. A growing table grows by 9/8, not 2, from bucket counts of any
/// size, and each shard's sizes are offset within that step, so that the
/// shards grow at different key counts. A table past its first few sizes
/// is 82–94 % full; with the default shards (8 on 2 cores), from 100 000
/// keys up, the store stays under 20 bytes a key for `u64` and GCRA at
/// every count (`notes/06` measures it; one shard alone swings from 18 to
/// 20.4). A table that fills with evicted slots before it needs to grow
/// (keys coming and going) is rebuilt with a quarter of its room free
/// instead, so that clearing them copies at most three keys for each new
/// one (`tests/stores.rs::rebuilds_copy_a_bounded_number_of_keys_per_insert`).
///
/// A table takes a key's home bucket and control byte from its hash mixed
/// first (a folded multiply), so a weak `BuildHasher` (an identity hash of
/// small integers) still spreads keys over the table. The shard comes from
/// the hash's bits 32 and up as the hasher gives them: a hasher that does
/// not vary them (that identity hash again, below 2^32) puts every key in
/// one shard, which is correct but loses the shards' parallel writers and
/// their staggering (the one-shard figures). A hasher with collisions, or
/// one a client can steer, makes probes long whatever the mixing, which is
/// why the default is `SipHash`.
///
/// A replaced table is freed once no check can still be reading it: its
/// readers are tracked by an epoch collector private to tollgate. A shard
/// keeps at most two replaced tables awaiting reclamation: a rebuild that
/// finds two first waits, for a bounded number of rounds, until one of them
/// is free to go (for checks already inside it to finish: nanoseconds to
/// microseconds, unless one is descheduled), so memory is bounded at every
/// instant, not only after settling. The thread that replaced a table
/// then frees it itself as soon as it can, outside every lock, so a key's
/// `Drop` never runs under a shard lock, nor inside an unrelated check.
/// [`evict_idle`](Store::evict_idle) rebuilds every shard it evicted from
/// (and smaller, when the table has at least four times the buckets its
/// remaining keys need: about 18 % full or less), so the evicted keys go, and
/// waits, again for a bounded number of rounds, until the tables it
/// replaced are freed.
///
/// The bound on memory holds at every instant, whatever checks do: a key's
/// `Eq` and `Borrow` run inside a check's epoch guard, and a check that
/// stays there (an `Eq` blocked on a lock, or a thread descheduled in
/// mid-probe) holds back the reclamation of every lock-free store in the
/// process until it leaves. The waits are bounded, so that such a check
/// stalls no writer and can deadlock none, and a rebuild whose shard's two
/// replaced tables are still read when its wait runs out is **refused**:
/// the new key that needed it gets [`CheckError::Reclaiming`] (or, under a
/// cap that admits untracked keys, a fresh decision) and nothing is stored,
/// evicted keys keep their slots, and stored keys are decided as ever. So a
/// shard never holds more than two replaced tables; the price of a long
/// stall is that new keys are refused once their shard's table is full,
/// until the stalled check leaves (the first writer after it frees the
/// tables and rebuilds).
///
/// # Hashing
///
/// Keys are hashed with std's `RandomState` (SipHash-1-3, keyed randomly per
/// store) unless [`with_hasher`](LockFree::with_hasher) chooses another.
/// Keys are usually chosen by clients, so by attackers, and `SipHash` is the
/// one designed to resist collisions an attacker tries to force; it is also
/// about a fifth of a keyed check's time (notes/04). Choose a faster seeded
/// hasher only for keys clients do not control.
pub struct LockFree<H = RandomState, P = Preferred> {
    shards: usize,
    hasher: H,
    cells: PhantomData<fn() -> P>,
}

impl LockFree {
    /// `shards` shards, rounded up to a power of two (at least 1).
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

    fn build(&self, cap: Option<KeyCap>) -> Self::Store {
        LockFreeStore {
            shards: (0..self.shards)
                .map(|index| CachePadded::new(Shard::new(Stagger::new(index, self.shards))))
                .collect(),
            hasher: self.hasher.clone(),
            population: Population::new(cap),
            algorithm: PhantomData,
        }
    }
}

/// The store [`LockFree`] builds.
pub struct LockFreeStore<K, A, C, H> {
    shards: Box<[CachePadded<Shard<K, C>>]>,
    hasher: H,
    population: Population,
    algorithm: PhantomData<fn() -> A>,
}

/// Under the shard's lock every live slot's cell is live: eviction and
/// rebuilds retire cells and unlink them in one critical section.
const LIVE_UNDER_LOCK: &str = "under the writers' lock, a live slot's cell is live";

/// How many rounds a writer drives the collector to free the table it just
/// replaced, after releasing the lock, before it leaves that to the shard's
/// next writer. With no check in flight, one or two suffice: the epoch must
/// advance twice past the one in which the table was unlinked.
const PROMPT_ROUNDS: usize = 2;

/// How many rounds (each a flush of the collector and a backoff step: spins,
/// then yields) a rebuild waits for the shard's last replaced table to be
/// free to go, and `evict_idle` for the tables it replaced, before going on
/// without it. A bound, not a wait until done: a check that stays inside a
/// table (a key's `Eq` blocked on a lock, maybe one the waiting thread
/// holds) would otherwise stall every writer of every lock-free store, or
/// deadlock. A check merely in flight leaves within a few rounds.
#[cfg(not(feature = "loom"))]
const GRACE_ROUNDS: usize = 64;

/// Under loom, two rounds, so that a wait a model reaches can also give up
/// within the model; loom would explore the interleavings of every one of
/// 64 rounds.
#[cfg(feature = "loom")]
const GRACE_ROUNDS: usize = 2;

/// The most replaced tables a shard keeps awaiting their grace period. One
/// would do while checks pass through the tables; a reader descheduled
/// while pinned (an ordinary preemption on a busy host) holds them for a
/// scheduler's time slice, long beside a wait of `GRACE_ROUNDS`, and with
/// one a second rebuild in that slice would refuse a new key with no real
/// stall. Two let a rebuild pass such a preemption; a third is refused.
const MAX_RETIRED: usize = 2;

/// How many rounds a rebuild that finds `MAX_RETIRED` replaced tables
/// waits for one of them before it is refused. Most rounds end in a yield
/// (`Backoff::snooze`), which hands the processor to other runnable
/// threads, a descheduled reader among them: on a 2-core host with twelve
/// checking threads, 64 rounds still refused thousands of new keys in 8 s
/// (notes/06, `lab/examples/oversubscribed.rs`), and a debug build's churn
/// on a loaded host refused some after 1 024; after this many, a few in
/// hundreds of thousands. A real stall pays this once per shard (tens of
/// milliseconds); the waits after it are `STALLED_ROUNDS`.
#[cfg(not(feature = "loom"))]
const REFUSAL_ROUNDS: usize = 16_384;

/// Under loom, as `GRACE_ROUNDS`.
#[cfg(feature = "loom")]
const REFUSAL_ROUNDS: usize = GRACE_ROUNDS;

/// How many rounds a rebuild waits once a wait for the same replaced table
/// ran out (`Writer::stalled`): enough for the collector to advance twice
/// when nothing is pinned any more, so that the first writer after a stall
/// ends frees the table and rebuilds, and few enough that while the stall
/// lasts a refused key costs a few flushes, not a whole wait.
const STALLED_ROUNDS: usize = 4;

/// `evict_idle` rebuilds a shard's table smaller when the table has at
/// least this many times the buckets its live keys need (sized with a
/// quarter of its room free, `Room::Churning`): far enough that a table
/// just grown (9/8 of the size its keys need, or just rebuilt with a
/// quarter free) is never shrunk straight back.
const COMPACT_FACTOR: usize = 4;

struct Shard<K, C> {
    table: epoch::Atomic<RawTable<K, C>>,
    writer: Mutex<Writer<K, C>>,
    /// Where this shard's table sizes sit within a growth step.
    stagger: Stagger,
}

/// A shard's writer-side bookkeeping, under its mutex.
struct Writer<K, C> {
    /// Live and deleted slots in the current table.
    used: usize,
    /// Live slots.
    live: usize,
    /// Replaced tables not yet freed: fewer than [`MAX_RETIRED`] before a
    /// rebuild, at most that many after it (see [`may_rebuild`]).
    retired: Vec<Retired<K, C>>,
    /// A wait for the replaced table's grace period ran out: later
    /// rebuilds wait `STALLED_ROUNDS`, not `REFUSAL_ROUNDS`, so that while a
    /// check stays stalled a refused key costs a few flushes of the
    /// collector, not a whole wait under the shard's lock each.
    stalled: bool,
}

impl<K, C> Writer<K, C> {
    /// Takes out the replaced tables whose grace period has elapsed, to be
    /// freed once the lock is released.
    fn take_graced(&mut self) -> Vec<Retired<K, C>> {
        let (graced, waiting) = std::mem::take(&mut self.retired)
            .into_iter()
            .partition(Retired::grace_elapsed);
        self.retired = waiting;
        graced
    }
}

/// A table unlinked by a rebuild, freed when this is dropped. Dropped only
/// once its grace period has elapsed (no check can still be reading the
/// table), or with the whole store (`&mut`, so no check at all).
struct Retired<K, C> {
    table: *const RawTable<K, C>,
    /// Set by the epoch collector once every guard that could have loaded
    /// the table before it was unlinked has been dropped.
    grace: Arc<AtomicBool>,
}

// SAFETY: a `Retired` owns its table (no other owner frees it), so sending
// it sends the table, which is Send when its keys and cells are Send and
// Sync; the flag is an `Arc<AtomicBool>`.
unsafe impl<K: Send + Sync, C: Send + Sync> Send for Retired<K, C> {}

impl<K, C> Retired<K, C> {
    /// Takes ownership of `table`, just unlinked, and asks the collector to
    /// flag it once no guard pinned before now remains.
    fn new(table: Shared<'_, RawTable<K, C>>) -> Self {
        // The canary frees the table without waiting for its readers.
        let grace = Arc::new(AtomicBool::new(canary::planted(Canary::FreeWithoutGrace)));
        let flag = Arc::clone(&grace);
        let guard = epoch::pin();
        // Release: pairs with the Acquire load in `grace_elapsed`, so the
        // thread that sees the flag and frees the table does so after every
        // reader of it unpinned (the collector runs this only then). The
        // deferred function only sets a flag: collection, which may run in
        // any pin, never runs user code.
        guard.defer(move || flag.store(true, Ordering::Release));
        // Hands the deferred function to the collector's global queue now,
        // rather than when this thread's bag fills, and tries to advance the
        // epoch once.
        guard.flush();
        Self {
            table: table.as_raw(),
            grace,
        }
    }

    /// Takes ownership of `table`, which was never published (a rebuild
    /// abandoned by a panic), to be freed outside the lock: no check ever
    /// saw it, so its grace period has elapsed already.
    fn unpublished(table: RawTable<K, C>) -> Self {
        // SAFETY: a guard is needed only to load from an `Atomic`; this
        // pointer is never shared.
        let unprotected = unsafe { epoch::unprotected() };
        Self {
            table: Owned::new(table).into_shared(unprotected).as_raw(),
            grace: Arc::new(AtomicBool::new(true)),
        }
    }

    fn grace_elapsed(&self) -> bool {
        self.grace.load(Ordering::Acquire)
    }
}

impl<K, C> Drop for Retired<K, C> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Owned::new` (through the shard's
        // `epoch::Atomic`, or `unpublished`), and it is freed only here,
        // once. No check can read it: a `Retired` is dropped only after its
        // grace period, or with the store itself (see the type's doc).
        let table = unsafe { Shared::from(self.table).into_owned() };
        // The store discarded these keys: a panic in their `Drop` has no
        // caller to reach (see `store::Discarded`).
        table.into_box().discard();
    }
}

impl<K, C> Discard for Retired<K, C> {
    /// Frees the table; its `Drop` discards every panic already.
    fn discard(self) -> Option<Box<dyn std::any::Any + Send>> {
        drop(self);
        None
    }
}

impl<K, C> Shard<K, C> {
    fn new(stagger: Stagger) -> Self {
        Self {
            stagger,
            table: epoch::Atomic::new(RawTable::with_buckets(MIN_BUCKETS)),
            writer: Mutex::new(Writer {
                used: 0,
                live: 0,
                retired: Vec::new(),
                stalled: false,
            }),
        }
    }

    /// The current table, for a check.
    #[inline]
    fn table<'g>(&self, guard: &'g Guard) -> &'g RawTable<K, C> {
        // Acquire: pairs with the Release swap that published a rebuilt
        // table, so that its slots and control bytes are visible.
        let table = self.table.load(Ordering::Acquire, guard);
        // SAFETY: the pointer is never null (a shard starts with a table and
        // only ever replaces it with another), and a replaced table is freed
        // only after every guard pinned before its replacement is dropped.
        unsafe { table.deref() }
    }

    /// The current table, for its writer.
    ///
    /// # Safety
    ///
    /// The caller holds `self.writer` for as long as it uses the reference.
    /// Only a holder of that lock replaces the table or frees a replaced
    /// one, so the table cannot go away under it, even once replaced.
    unsafe fn table_locked(&self) -> &RawTable<K, C> {
        // SAFETY: as documented; no guard is needed for a table that no
        // other thread can free.
        let unprotected = unsafe { epoch::unprotected() };
        // Relaxed: the last swap was made under the lock we hold, whose
        // acquisition orders us after it.
        let table = self.table.load(Ordering::Relaxed, unprotected);
        // SAFETY: never null (see `table`), and not freed while we hold the
        // lock (above).
        unsafe { table.deref() }
    }

    /// Frees the shard's replaced tables once no check can see them. Runs
    /// with no lock held, so the tables' keys are dropped outside every
    /// lock. Drives the collector for up to `rounds` rounds until every table
    /// replaced before the call may go; what may not yet is left to the
    /// shard's next writer.
    fn reclaim(&self, rounds: usize) {
        let pending: Vec<Arc<AtomicBool>> = lock(&self.writer)
            .retired
            .iter()
            .map(|retired| Arc::clone(&retired.grace))
            .collect();
        if pending.is_empty() {
            return;
        }
        // Acquire: as in `Retired::grace_elapsed`.
        wait_for_grace(rounds, || {
            pending.iter().all(|grace| grace.load(Ordering::Acquire))
        });
        // Taken out under the lock, freed after it (the guard is a
        // temporary of this statement).
        let graced = lock(&self.writer).take_graced();
        drop(graced);
    }
}

impl<K, C> Drop for Shard<K, C> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other thread can reach the table any more,
        // so it can be taken without a guard. (The retired tables go with
        // `writer`: see `Retired`.)
        drop(unsafe {
            self.table
                .load(Ordering::Relaxed, epoch::unprotected())
                .into_owned()
        });
    }
}

/// Drives the collector, for up to `rounds` rounds, until `done`; returns
/// whether it is. Each round pins, flushes (which tries to advance the epoch
/// and runs the deferred functions that may run, which only set flags: no
/// user code) and takes a backoff step. A thread that holds a guard (a check
/// whose user code called back into a limiter) keeps the epoch from
/// advancing, so it does not wait at all.
///
/// Called under a shard's lock too (`may_rebuild`). That cannot deadlock:
/// the wait is bounded, and no thread takes a shard lock while it holds a
/// guard, so the guards it waits for are dropped without this lock (unless
/// user code inside a check blocks, which the bound is for).
fn wait_for_grace(rounds: usize, done: impl Fn() -> bool) -> Grace {
    if done() {
        return Grace::Done;
    }
    if epoch::is_pinned() {
        return Grace::Pinned;
    }
    let backoff = Backoff::new();
    for _ in 0..rounds {
        epoch::pin().flush();
        if done() {
            return Grace::Done;
        }
        wait_step(&backoff);
    }
    Grace::RanOut
}

/// How a wait for a grace period ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grace {
    Done,
    /// Not waited for: this thread holds a guard itself.
    Pinned,
    /// Still not elapsed after every round.
    RanOut,
}

/// Whether the shard (lock held) may rebuild: whether, once the replaced
/// tables whose grace period has elapsed are taken out (into `discarded`,
/// freed after the lock), it holds fewer than [`MAX_RETIRED`]. When it
/// holds that many, waits for one of them for a bounded time
/// (`REFUSAL_ROUNDS`, or `STALLED_ROUNDS` after a wait ran out) and refuses if
/// none goes: a check stalled inside them holds them, and a rebuild would
/// keep one more (the canary rebuilds all the same, keeping every table, as
/// the second version did).
fn may_rebuild<K, C>(writer: &mut Writer<K, C>, discarded: &mut Discarded<Retired<K, C>>) -> bool {
    discarded.extend(writer.take_graced());
    if writer.retired.len() < MAX_RETIRED || canary::planted(Canary::KeepEveryReplacedTable) {
        // Reclamation moved on: whatever stalled it has left.
        writer.stalled = false;
        return true;
    }
    let rounds = if writer.stalled {
        STALLED_ROUNDS
    } else {
        REFUSAL_ROUNDS
    };
    let retired = &writer.retired;
    let waited = wait_for_grace(rounds, || retired.iter().any(Retired::grace_elapsed));
    // Only a wait that ran out marks the shard stalled: a thread already
    // inside a check (user code calling back into a limiter) cannot wait
    // for its own guard, which says nothing of the others.
    writer.stalled = waited == Grace::RanOut;
    discarded.extend(writer.take_graced());
    writer.retired.len() < MAX_RETIRED
}

impl<K, A, C, H> LockFreeStore<K, A, C, H>
where
    K: Key,
    A: Algorithm,
    C: Cell<A>,
    H: BuildHasher + Send + Sync,
{
    #[inline]
    fn shard(&self, hash: u64) -> &Shard<K, C> {
        &self.shards[shard_index(hash, self.shards.len())]
    }

    /// The slow path: under the shard's mutex, look again, insert if absent;
    /// then free what a rebuild replaced, with the lock released.
    #[cold]
    #[inline(never)]
    fn check_slow<Q: Lookup<K> + ?Sized>(
        &self,
        shard: &Shard<K, C>,
        hash: u64,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
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
                    hash,
                    key,
                    algorithm,
                    now_ns,
                    cost,
                    swept,
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
            || self.evict_idle(algorithm, now_ns),
        )
    }

    /// One attempt under the shard's lock (`writer` is its guarded data).
    /// `swept`: the store was just swept for this check.
    #[allow(clippy::too_many_arguments)]
    fn check_locked<Q: Lookup<K> + ?Sized>(
        &self,
        shard: &Shard<K, C>,
        writer: &mut Writer<K, C>,
        discarded: &mut Discarded<Retired<K, C>>,
        hash: u64,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
        swept: bool,
    ) -> Result<Checked, CheckError> {
        // SAFETY: our caller holds the lock for the whole call.
        let table = unsafe { shard.table_locked() };
        if let Some(cell) = table.find(hash, key) {
            let decision = cell.check(algorithm, now_ns, cost)?.expect(LIVE_UNDER_LOCK);
            return Ok(Checked::Done(decision));
        }
        admit_new_key(
            &self.population,
            algorithm,
            key,
            now_ns,
            cost,
            swept,
            NewKey::new(
                (writer, discarded, table),
                |(writer, discarded, table)| {
                    if writer.used >= max_used(table.buckets()) {
                        self.grow(shard, writer, discarded, algorithm, now_ns)?;
                        // SAFETY: lock held, as above.
                        *table = unsafe { shard.table_locked() };
                    }
                    Ok(())
                },
                |state| C::with_state(algorithm, state),
                |(writer, _, table), owned, cell| {
                    table.insert(hash, owned, cell);
                    writer.used += 1;
                    writer.live += 1;
                },
            ),
        )
    }

    /// Evicts the keys of `table` (the shard's current one, lock held) that
    /// are idle at `idle_at_ns`, and so at every later instant; returns how
    /// many. Runs no user code.
    fn sweep(
        &self,
        table: &RawTable<K, C>,
        writer: &mut Writer<K, C>,
        algorithm: &A,
        idle_at_ns: u64,
    ) -> usize {
        let mut released = self.population.releasing();
        for (index, _, cell) in table.live() {
            // `is_idle` is the algorithm's code: each eviction is counted as
            // it happens, so that a panic there leaves the counts exact.
            let evict = if canary::planted(Canary::EvictWithoutTombstone) {
                cell.is_idle_unretired(algorithm, idle_at_ns)
            } else {
                // The tombstone: retire first, so that a check holding the
                // cell finds it retired and looks again.
                cell.retire_if_idle(algorithm, idle_at_ns)
            };
            if evict {
                table.mark_deleted(index);
                writer.live -= 1;
                released.add();
            }
        }
        released.removed
    }

    /// Rebuilds `shard` without its evicted slots, so that their keys and
    /// states are freed, and smaller if it is far larger than its keys
    /// need (`evict_idle`).
    fn compact(&self, shard: &Shard<K, C>, algorithm: &A) {
        // Declared before the lock: dropped after it, even if a rebuild's
        // user code panics.
        let mut discarded = Discarded::new();
        let mut writer = lock(&shard.writer);
        // SAFETY: we hold the lock.
        let table = unsafe { shard.table_locked() };
        let needed = buckets_for(writer.live, Room::Churning, shard.stagger);
        // A rebuild refused (the last replaced table is still read) leaves
        // the evicted slots in place: their keys stay in this table, which
        // does not grow, until a later compaction or growth.
        let buckets = if table.buckets() >= COMPACT_FACTOR * needed {
            Some(needed)
        } else {
            (writer.used > writer.live).then(|| table.buckets())
        };
        if let Some(buckets) = buckets.filter(|_| may_rebuild(&mut writer, &mut discarded)) {
            self.rebuild(shard, &mut writer, &mut discarded, algorithm, buckets);
        }
        discarded.extend(writer.take_graced());
        drop(writer);
        drop(discarded);
    }

    /// Makes room for one more key in a full table (lock held). When live
    /// keys (not evicted slots) fill it, first evicts the keys idle for at
    /// least the algorithm's rest time: the amortized eviction, since a
    /// table fills only after a number of inserts proportional to its size.
    /// Keys idle for less (in use, between two requests) stay, so a working
    /// set is never evicted only to be re-inserted; and a rebuild that only
    /// clears evicted slots evicts nothing. Then rebuilds for the live keys
    /// and the one being inserted.
    ///
    /// # Errors
    ///
    /// [`CheckError::Reclaiming`] when the rebuild is refused (see
    /// [`rebuild`](Self::rebuild)).
    fn grow(
        &self,
        shard: &Shard<K, C>,
        writer: &mut Writer<K, C>,
        discarded: &mut Discarded<Retired<K, C>>,
        algorithm: &A,
        now_ns: u64,
    ) -> Result<(), CheckError> {
        // Before the sweep: a rebuild refused would waste it, and the next
        // new key would sweep again, all under the lock.
        if !may_rebuild(writer, discarded) {
            return Err(CheckError::Reclaiming);
        }
        // SAFETY: our caller holds the lock.
        let table = unsafe { shard.table_locked() };
        if (writer.live + 1) * 4 > max_used(table.buckets()) * 3 {
            self.sweep(table, writer, algorithm, rested_at(algorithm, now_ns));
        }
        // A table that would not need to grow for its live keys filled up
        // with evicted slots: keys are going as well as coming, and the new
        // table gets the room for that (`Room`).
        let growing = buckets_for(writer.live + 1, Room::Growing, shard.stagger);
        let buckets = if growing <= table.buckets() {
            buckets_for(writer.live + 1, Room::Churning, shard.stagger)
        } else {
            growing
        };
        self.rebuild(shard, writer, discarded, algorithm, buckets);
        Ok(())
    }

    /// Replaces the shard's table (lock held) with one of `buckets` buckets
    /// holding its live keys and their states. See "Implementation details"
    /// on [`LockFree`] for the two phases. A rebuild abandoned by a panic
    /// leaves its unpublished table in `discarded`, which the caller
    /// declared before it took the lock, so that it is freed after the lock
    /// is released.
    ///
    /// Its caller asked [`may_rebuild`] first.
    fn rebuild(
        &self,
        shard: &Shard<K, C>,
        writer: &mut Writer<K, C>,
        discarded: &mut Discarded<Retired<K, C>>,
        algorithm: &A,
        buckets: usize,
    ) {
        // SAFETY: our caller holds the lock.
        let old = unsafe { shard.table_locked() };
        // A rebuild that took tombstones for live slots would size for them.
        let buckets = if canary::planted(Canary::RebuildCopiesTombstone) {
            buckets.max(buckets_for(
                old.live().count(),
                Room::Growing,
                shard.stagger,
            ))
        } else {
            buckets
        };
        // Phase 1, user code (`BuildHasher`, `Hash`, `Clone`): each key is
        // copied beside a vacant cell, whose creation and drop run no user
        // code. A panic leaves the shard as it was, and `new`, never
        // published, goes with its copies to `discarded`.
        let mut new = RawTable::with_buckets(buckets);
        // Where each key went, in the order `old.live()` gives them: phase 2
        // walks `old.live()` again, and nothing changes the old table in
        // between (we hold the lock, and only its holders write). One
        // `usize` a key, the list's share of the peak (`notes/06`).
        let mut moves = Vec::with_capacity(writer.live);
        let copied = catch_unwind(AssertUnwindSafe(|| {
            for (_, key, _) in old.live() {
                let hash = self.hasher.hash_one(key);
                let (new_index, _) = new.insert(hash, key.clone(), C::vacant());
                moves.push(new_index);
            }
        }));
        if let Err(panic) = copied {
            discarded.push(Retired::unpublished(new));
            resume_unwind(panic);
        }
        // Phase 2, no user code: retire each old cell into the new table,
        // in place of the vacant one. A check that reaches a retired cell
        // waits for our lock and finds the key in the new table.
        debug_assert_eq!(old.live().count(), moves.len());
        for ((_, _, old_cell), &new_index) in old.live().zip(&moves) {
            let cell = old_cell.retire_into_new().unwrap_or_else(|| {
                assert!(
                    canary::planted(Canary::RebuildCopiesTombstone),
                    "{LIVE_UNDER_LOCK}"
                );
                C::new(algorithm)
            });
            new.set_value(new_index, cell);
        }
        writer.used = moves.len();
        writer.live = moves.len();
        // SAFETY: only lock holders replace the table, and we hold the lock;
        // the old table is handed to `Retired`, which frees it after its
        // grace period.
        let unprotected = unsafe { epoch::unprotected() };
        // The canary starts the old table's grace period while checks can
        // still load it.
        let early = canary::planted(Canary::RetireBeforeUnlink)
            .then(|| Retired::new(shard.table.load(Ordering::Relaxed, unprotected)));
        // Release: publishes the new table's slots to checks that load the
        // pointer with Acquire (`Shard::table`).
        let publish = if canary::planted(Canary::RelaxedTableSwap) {
            Ordering::Relaxed
        } else {
            Ordering::Release
        };
        let replaced = shard.table.swap(Owned::new(new), publish, unprotected);
        if let Some(early) = &early {
            debug_assert_eq!(early.table, replaced.as_raw());
        }
        writer
            .retired
            .push(early.unwrap_or_else(|| Retired::new(replaced)));
    }
}

impl<K, A, C, H> Store<K, A> for LockFreeStore<K, A, C, H>
where
    K: Key,
    A: Algorithm,
    C: Cell<A>,
    H: BuildHasher + Send + Sync,
{
    #[inline]
    fn check<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
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
        // Absent, or retired under us: the guard is dropped before the lock
        // is taken (see `may_rebuild`).
        self.check_slow(shard, hash, key, algorithm, now_ns, cost)
    }

    fn peek<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        let found = {
            let guard = epoch::pin();
            match shard.table(&guard).find(hash, key) {
                Some(cell) => match cell.peek(algorithm, now_ns, cost)? {
                    Some(decision) => return Ok(decision),
                    None => true,
                },
                None => false,
            }
        };
        if found {
            // Retired under us: evicted or moved. Ask again once no writer
            // is mid-change (the guard is dropped first: see `may_rebuild`).
            let _writer = lock(&shard.writer);
            // SAFETY: we hold the lock.
            if let Some(cell) = unsafe { shard.table_locked() }.find(hash, key) {
                return Ok(cell.peek(algorithm, now_ns, cost)?.expect(LIVE_UNDER_LOCK));
            }
        }
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
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        let found = {
            let guard = epoch::pin();
            match shard.table(&guard).find(hash, key) {
                Some(cell) => match cell.compare_exchange(algorithm, current, new) {
                    Some(replaced) => return replaced,
                    None => true,
                },
                None => false,
            }
        };
        if !found {
            return false;
        }
        // Retired under us: evicted or moved. Look again once no writer is
        // mid-change (the guard is dropped first: see `may_rebuild`).
        let _writer = lock(&shard.writer);
        // SAFETY: we hold the lock.
        unsafe { shard.table_locked() }
            .find(hash, key)
            .is_some_and(|cell| {
                cell.compare_exchange(algorithm, current, new)
                    .expect(LIVE_UNDER_LOCK)
            })
    }

    fn evict_idle(&self, algorithm: &A, now_ns: u64) -> usize {
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
                self.sweep(table, &mut writer, algorithm, now_ns)
            })
            .sum();
        // A shard whose rebuild panics (a key's `Hash` or `Clone`) keeps its
        // evicted slots; the others are still compacted, and the first
        // panic goes on once every shard was tried.
        let mut first_panic = None;
        for shard in &*self.shards {
            let compacted = catch_unwind(AssertUnwindSafe(|| {
                self.compact(shard, algorithm);
            }));
            if let Err(panic) = compacted {
                first_panic.get_or_insert(panic);
            }
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
