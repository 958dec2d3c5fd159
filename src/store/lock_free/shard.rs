//! A shard of the lock-free store: its table, its writers' lock and
//! bookkeeping, and the tables it replaced, kept until no check can read
//! them.
//!
//! A replaced table is freed once no check can still be reading it: its
//! readers are tracked by an epoch collector private to tollgate
//! (`sync::epoch`). A shard keeps at most [`MAX_RETIRED`] replaced tables
//! awaiting reclamation: a rebuild that finds that many first waits, for a
//! bounded number of rounds, until one of them is free to go (for checks
//! already inside it to finish: nanoseconds to microseconds, unless one is
//! descheduled), so memory is bounded at every instant, not only after
//! settling. The thread that replaced a table then frees it itself as soon
//! as it can, outside every lock, so a key's `Drop` never runs under a
//! shard lock, nor inside an unrelated check. `evict_idle` rebuilds every
//! shard it evicted from (and smaller, when the table has at least
//! `COMPACT_FACTOR` times the buckets its remaining keys need), so the
//! evicted keys go, and waits, again for a bounded number of rounds, until
//! the tables it replaced are freed.
//!
//! The bound holds whatever checks do: a key's `Eq` and `Borrow` run inside
//! a check's epoch guard, and a check that stays there (an `Eq` blocked on
//! a lock, or a thread descheduled in mid-probe) holds back the
//! reclamation of every lock-free store in the process until it leaves.
//! The waits are bounded, so that such a check stalls no writer and can
//! deadlock none, and a rebuild whose shard's replaced tables are still
//! read when its wait runs out is **refused** ([`may_rebuild`]): the new
//! key that needed it gets `CheckError::Reclaiming` (or, under a cap that
//! admits untracked keys, a fresh decision) and nothing is stored, evicted
//! keys keep their slots, and stored keys are decided as ever. The price of
//! a long stall is that new keys are refused once their shard's table is
//! full, until the stalled check leaves (the first writer after it frees
//! the tables and rebuilds).

use super::LIVE_UNDER_LOCK;
use super::table::{MIN_BUCKETS, RawTable, Stagger};
use crate::store::{Discard, Discarded, Lookup};
use crate::sync::canary::{self, Canary};
use crate::sync::epoch::{self, Guard, Owned, Shared};
use crate::sync::{Arc, AtomicBool, Backoff, Mutex, Ordering, lock, wait_step};

/// How many rounds a writer drives the collector to free the table it just
/// replaced, after releasing the lock, before it leaves that to the shard's
/// next writer. With no check in flight, one or two suffice: the epoch must
/// advance twice past the one in which the table was unlinked.
pub(super) const PROMPT_ROUNDS: usize = 2;

/// How many rounds (each a flush of the collector and a backoff step: spins,
/// then yields) a rebuild waits for the shard's last replaced table to be
/// free to go, and `evict_idle` for the tables it replaced, before going on
/// without it. A bound, not a wait until done: a check that stays inside a
/// table (a key's `Eq` blocked on a lock, maybe one the waiting thread
/// holds) would otherwise stall every writer of every lock-free store, or
/// deadlock. A check merely in flight leaves within a few rounds.
#[cfg(not(feature = "loom"))]
pub(super) const GRACE_ROUNDS: usize = 64;

/// Under loom, two rounds, so that a wait a model reaches can also give up
/// within the model; loom would explore the interleavings of every one of
/// 64 rounds.
#[cfg(feature = "loom")]
pub(super) const GRACE_ROUNDS: usize = 2;

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
/// checking threads, 64 rounds still refuse thousands of new keys in 8 s
/// (notes/06, `lab/examples/oversubscribed.rs`), and 1 024 still refuse
/// some in a debug build's churn on a loaded host; after this many, a few
/// in hundreds of thousands. A real stall pays this once per shard (tens of
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

pub(super) struct Shard<K, C> {
    pub(super) table: epoch::Atomic<RawTable<K, C>>,
    pub(super) writer: Mutex<Writer<K, C>>,
    /// Where this shard's table sizes sit within a growth step.
    pub(super) stagger: Stagger,
}

/// What [`Shard::find_cell`] found.
pub(super) enum CellRead<R> {
    /// The key's cell, live: what the read returned.
    Live(R),
    /// The key's cell, retired under the read: evicted or moved.
    Retired,
    /// No cell: the key is not in the table.
    Absent,
}

/// A shard's writer-side bookkeeping, under its mutex.
pub(super) struct Writer<K, C> {
    /// Live and deleted slots in the current table.
    pub(super) used: usize,
    /// Live slots.
    pub(super) live: usize,
    /// Replaced tables not yet freed: fewer than [`MAX_RETIRED`] before a
    /// rebuild, at most that many after it (see [`may_rebuild`]).
    pub(super) retired: Vec<Retired<K, C>>,
    /// A wait for the replaced table's grace period ran out: later
    /// rebuilds wait `STALLED_ROUNDS`, not `REFUSAL_ROUNDS`, so that while a
    /// check stays stalled a refused key costs a few flushes of the
    /// collector, not a whole wait under the shard's lock each.
    stalled: bool,
}

impl<K, C> Writer<K, C> {
    /// Takes out the replaced tables whose grace period has elapsed, to be
    /// freed once the lock is released.
    pub(super) fn take_graced(&mut self) -> Vec<Retired<K, C>> {
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
pub(super) struct Retired<K, C> {
    pub(super) table: *const RawTable<K, C>,
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
    pub(super) fn new(table: Shared<'_, RawTable<K, C>>) -> Self {
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
    pub(super) fn unpublished(table: RawTable<K, C>) -> Self {
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
    pub(super) fn new(stagger: Stagger) -> Self {
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
    pub(super) fn table<'g>(&self, guard: &'g Guard) -> &'g RawTable<K, C> {
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
    pub(super) unsafe fn table_locked(&self) -> &RawTable<K, C> {
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

    /// Runs `read` on `key`'s cell in the current table, taking no lock:
    /// under an epoch guard, dropped before this returns (no thread takes
    /// a shard lock while pinned: see [`may_rebuild`]). `read` returns
    /// `None` for a retired cell.
    #[inline]
    pub(super) fn find_cell<Q: Lookup<K> + ?Sized, R>(
        &self,
        hash: u64,
        key: &Q,
        read: impl FnOnce(&C) -> Option<R>,
    ) -> CellRead<R> {
        let guard = epoch::pin();
        match self.table(&guard).find(hash, key) {
            Some(cell) => read(cell).map_or(CellRead::Retired, CellRead::Live),
            None => CellRead::Absent,
        }
    }

    /// Runs `read` on `key`'s cell as [`find_cell`](Self::find_cell) does
    /// and, when the cell was retired under it (evicted, or moved by a
    /// rebuild), once more under the shard's lock, where no writer is
    /// mid-change and every live slot's cell is live. `None` when the key is
    /// absent: never admitted, or evicted (idle, so as good as fresh).
    pub(super) fn with_cell<Q: Lookup<K> + ?Sized, R>(
        &self,
        hash: u64,
        key: &Q,
        read: impl Fn(&C) -> Option<R>,
    ) -> Option<R> {
        match self.find_cell(hash, key, &read) {
            CellRead::Live(read) => return Some(read),
            CellRead::Absent => return None,
            CellRead::Retired => {}
        }
        let _writer = lock(&self.writer);
        // SAFETY: we hold the lock.
        unsafe { self.table_locked() }
            .find(hash, key)
            .map(|cell| read(cell).expect(LIVE_UNDER_LOCK))
    }

    /// Frees the shard's replaced tables once no check can see them. Runs
    /// with no lock held, so the tables' keys are dropped outside every
    /// lock. Drives the collector for up to `rounds` rounds until every table
    /// replaced before the call may go; what may not yet is left to the
    /// shard's next writer.
    pub(super) fn reclaim(&self, rounds: usize) {
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
/// keep one more (the canary rebuilds all the same, keeping every table).
pub(super) fn may_rebuild<K, C>(
    writer: &mut Writer<K, C>,
    discarded: &mut Discarded<Retired<K, C>>,
) -> bool {
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
