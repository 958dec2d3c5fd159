//! A shard of the lock-free store: its table, its writers' lock and
//! bookkeeping, and the tables it replaced, kept until no check can read
//! them.
//!
//! A replaced table is freed once no check can still be reading it: its
//! readers are tracked by tollgate's own read-copy-update (`sync::rcu`):
//! each check is a read section, and a replaced table's grace period
//! ends once every section that was inside when it was unlinked has left. A shard keeps at most [`MAX_RETIRED`] replaced tables (one more while a quota change went past a stall: [`may_convert`])
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
//! a check's read section, and a check that stays there (an `Eq` blocked on
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

use super::table::{MIN_BUCKETS, RawTable, Stagger};
use crate::store::{Discard, Discarded};
use crate::sync::canary::{self, Canary};
use crate::sync::rcu::{self, Guard, Snapshot, Ticket};

use crate::sync::{Arc, AtomicPtr, Backoff, Mutex, Ordering, lock, wait_step};

/// How many rounds a writer waits for the grace period of the table it just
/// replaced, after releasing the lock, before it leaves that to the shard's
/// next writer. With no check in flight the first look suffices (the
/// snapshot finds no section); a check in flight leaves within a round or
/// two.
pub(super) const PROMPT_ROUNDS: usize = 2;

/// How many rounds (each a look at the sections of the grace period's
/// snapshot and a backoff step: spins, then yields) a rebuild waits for the
/// shard's last replaced table to be free to go, and `evict_idle` for the tables it replaced, before going on
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
/// inside its section (an ordinary preemption on a busy host) holds them for a
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
/// ran out (`Writer::stalled`): enough for a look at the snapshot once the
/// stalled section has left, so that the first writer after a stall ends
/// frees the table and rebuilds, and few enough that while the stall lasts
/// a refused key costs a few looks, not a whole wait.
const STALLED_ROUNDS: usize = 4;

pub(super) struct Shard<K, C, M> {
    /// The current table: never null, from `Box::into_raw`, replaced only
    /// under `writer` and freed only through a [`Retired`] (or with the
    /// shard).
    pub(super) table: AtomicPtr<RawTable<K, C, M>>,
    pub(super) writer: Mutex<Writer<K, C, M>>,
    /// Where this shard's table sizes sit within a growth step.
    pub(super) stagger: Stagger,
}

/// A shard's writer-side bookkeeping, under its mutex.
pub(super) struct Writer<K, C, M> {
    /// Live and deleted slots in the current table.
    pub(super) used: usize,
    /// Live slots.
    pub(super) live: usize,
    /// Replaced tables not yet freed: fewer than [`MAX_RETIRED`] before a
    /// rebuild, at most that many after it (see [`may_rebuild`]), or one
    /// more after a quota change that went past a stall ([`may_convert`]).
    pub(super) retired: Vec<Retired<K, C, M>>,
    /// A wait for the replaced table's grace period ran out: later
    /// rebuilds wait `STALLED_ROUNDS`, not `REFUSAL_ROUNDS`, so that while a
    /// check stays stalled a refused key costs a few looks at its
    /// section, not a whole wait under the shard's lock each.
    stalled: bool,
}

impl<K, C, M> Writer<K, C, M> {
    /// Takes out the replaced tables whose grace period has elapsed, to be
    /// freed once the lock is released. Issues no barrier (it runs under the
    /// shard's lock, on a new key's path): a table whose ticket no barrier
    /// has served yet waits for `Shard::reclaim`'s, issued without the lock.
    pub(super) fn take_graced(&mut self) -> Vec<Retired<K, C, M>> {
        let mut graced = Vec::new();
        let mut index = 0;
        while index < self.retired.len() {
            if self.retired[index].grace_elapsed(false) {
                graced.push(self.retired.swap_remove(index));
            } else {
                index += 1;
            }
        }
        graced
    }
}

/// A table unlinked by a rebuild, freed when this is dropped. Dropped only
/// once its grace period has elapsed (no check can still be reading the
/// table), or with the whole store (`&mut`, so no check at all).
pub(super) struct Retired<K, C, M> {
    /// From `Box::into_raw`; owned by this value alone.
    pub(super) table: *mut RawTable<K, C, M>,
    grace: GracePeriod,
}

/// Where a replaced table's grace period stands.
enum GracePeriod {
    /// Unlinked: the sections to wait for are not yet known.
    Unlinked(Ticket),
    /// The sections that were inside when the snapshot was taken, after the
    /// ticket's barrier, and have not all left.
    Waiting(Arc<Snapshot>),
    /// Every section that could read the table has left.
    Elapsed,
}

// SAFETY: a `Retired` owns its table (no other owner frees it), so sending
// it sends the table, which is Send when its keys and cells are Send and
// Sync; the snapshot holds only `'static` records of atomics.
unsafe impl<K: Send + Sync, C: Send + Sync, M: Send + Sync> Send for Retired<K, C, M> {}

impl<K, C, M> Retired<K, C, M> {
    /// Takes ownership of `table`, just unlinked from its shard by a swap
    /// on this thread (the ticket must come after the swap).
    pub(super) fn unlinked(table: *mut RawTable<K, C, M>) -> Self {
        let grace = if canary::planted(Canary::FreeWithoutGrace) {
            // The canary frees the table without waiting for its readers.
            GracePeriod::Elapsed
        } else {
            GracePeriod::Unlinked(rcu::ticket())
        };
        Self { table, grace }
    }

    /// The canary `RetireBeforeUnlink`: the table's snapshot of sections is
    /// taken while it is still the shard's, before the swap that unlinks it.
    pub(super) fn before_unlink(table: *mut RawTable<K, C, M>) -> Self {
        Self {
            table,
            grace: GracePeriod::Waiting(Arc::new(rcu::ticket().snapshot())),
        }
    }

    /// Takes ownership of `table`, which was never published (a rebuild
    /// abandoned by a panic), to be freed outside the lock: no check ever
    /// saw it, so its grace period has elapsed already.
    pub(super) fn unpublished(table: RawTable<K, C, M>) -> Self {
        Self {
            table: Box::into_raw(Box::new(table)),
            grace: GracePeriod::Elapsed,
        }
    }

    /// The ticket of a table whose snapshot is not taken yet.
    fn ticket(&self) -> Option<Ticket> {
        match self.grace {
            GracePeriod::Unlinked(ticket) => Some(ticket),
            _ => None,
        }
    }

    /// Whether a snapshot can be taken without issuing a barrier: the
    /// ticket's has completed, or the snapshot is taken already.
    fn served(&self) -> bool {
        self.ticket().is_none_or(Ticket::served)
    }

    /// The snapshot of the sections the grace period waits for, taken now
    /// if it was not (issuing the barrier if none has run since the ticket:
    /// one serves every table unlinked before it began); `None` once the
    /// grace period is known to have elapsed. If the kernel refused the
    /// barrier, a snapshot that never elapses, and the ticket is kept for
    /// the next try.
    fn snapshot(&mut self) -> Option<Arc<Snapshot>> {
        if let GracePeriod::Unlinked(ticket) = self.grace {
            let snapshot = Arc::new(ticket.snapshot());
            if !snapshot.barriered() {
                return Some(snapshot);
            }
            self.grace = GracePeriod::Waiting(snapshot);
        }
        match &self.grace {
            GracePeriod::Waiting(snapshot) => Some(Arc::clone(snapshot)),
            _ => None,
        }
    }

    /// Whether the grace period has elapsed (taking the snapshot first, as
    /// [`snapshot`](Self::snapshot)); with `issue` false, a table whose
    /// ticket no barrier has served is not, rather than issue one.
    fn grace_elapsed(&mut self, issue: bool) -> bool {
        if let GracePeriod::Unlinked(ticket) = self.grace
            && !issue
            && !ticket.served()
        {
            return false;
        }
        match self.snapshot() {
            Some(snapshot) if !snapshot.elapsed() => false,
            _ => {
                self.grace = GracePeriod::Elapsed;
                true
            }
        }
    }
}

impl<K, C, M> Drop for Retired<K, C, M> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::into_raw` (a table published
        // in the shard's pointer, or `unpublished`), and it is freed only
        // here, once. No check can read it: a `Retired` is dropped only after
        // its grace period, or with the store itself (see the type's doc).
        let table = unsafe { Box::from_raw(self.table) };
        // Under loom the table is poisoned and kept, not freed: a check that
        // still reads it fails the assertion `RawTable::assert_not_freed`,
        // rather than reading freed memory.
        #[cfg(feature = "loom")]
        {
            table.poison();
            std::mem::forget(table);
        }
        // The store discarded these keys: a panic in their `Drop` has no
        // caller to reach (see `store::Discarded`).
        #[cfg(not(feature = "loom"))]
        table.discard();
    }
}

impl<K, C, M> Discard for Retired<K, C, M> {
    /// Frees the table; its `Drop` discards every panic already.
    fn discard(self) -> Option<Box<dyn std::any::Any + Send>> {
        drop(self);
        None
    }
}

impl<K, C, M> Shard<K, C, M> {
    pub(super) fn new(stagger: Stagger, meta: M) -> Self {
        Self {
            stagger,
            table: AtomicPtr::new(Box::into_raw(Box::new(RawTable::with_buckets(
                MIN_BUCKETS,
                meta,
            )))),
            writer: Mutex::new(Writer {
                used: 0,
                live: 0,
                retired: Vec::new(),
                stalled: false,
            }),
        }
    }

    /// The current table, for a check inside the read section `_section`.
    #[inline]
    pub(super) fn table<'g>(&self, _section: &'g Guard) -> &'g RawTable<K, C, M> {
        // Acquire: pairs with the Release swap that published a rebuilt
        // table, so that its slots and control bytes are visible.
        let table = self.table.load(Ordering::Acquire);
        // SAFETY: the pointer is never null (a shard starts with a table and
        // only ever replaces it with another), and a replaced table is freed
        // only after its grace period: once every section that was inside
        // when it was unlinked has left (`sync::rcu`). This section entered
        // before this load: either a writer's snapshot sees it inside (and
        // the table stays until the guard, borrowed for `'g`, is dropped), or
        // its load comes after the unlinking swap and reads a later table.
        unsafe { &*table }
    }

    /// The current table, for its writer.
    ///
    /// # Safety
    ///
    /// The caller holds `self.writer` for as long as it uses the reference.
    /// Only a holder of that lock replaces the table or frees a replaced
    /// one, so the table cannot go away under it, even once replaced.
    pub(super) unsafe fn table_locked(&self) -> &RawTable<K, C, M> {
        // Relaxed: the last swap was made under the lock we hold, whose
        // acquisition orders us after it.
        let table = self.table.load(Ordering::Relaxed);
        // SAFETY: never null (see `table`), and not freed while we hold the
        // lock (as documented): no section is needed for a table that no
        // other thread can free.
        unsafe { &*table }
    }

    /// Frees the shard's replaced tables once no check can see them. Runs
    /// with no lock held, so the tables' keys are dropped outside every
    /// lock. Waits for up to `rounds` rounds until every table replaced
    /// before the call may go; what may not yet is left to the shard's next
    /// writer.
    pub(super) fn reclaim(&self, rounds: usize) {
        // The barrier that every pending table's snapshot needs, issued
        // with the shard's lock released.
        let ticket = lock(&self.writer)
            .retired
            .iter()
            .filter_map(Retired::ticket)
            .max_by_key(|ticket| ticket.barrier_number());
        if let Some(ticket) = ticket {
            // A refusal is tried again by the snapshots below.
            ticket.barrier();
        }
        // The snapshots, taken under the lock and waited for without it. A
        // table another writer unlinked since that barrier has a ticket no
        // barrier served yet: it waits for a later pass, so that no barrier
        // is issued under the lock.
        let pending: Vec<Arc<Snapshot>> = lock(&self.writer)
            .retired
            .iter_mut()
            .filter(|retired| retired.served())
            .filter_map(Retired::snapshot)
            .collect();
        if pending.is_empty() {
            return;
        }
        wait_for_grace(rounds, || pending.iter().all(|snapshot| snapshot.elapsed()));
        // Taken out under the lock, freed after it (the guard is a
        // temporary of this statement).
        let graced = lock(&self.writer).take_graced();
        drop(graced);
    }
}

impl<K, C, M> Drop for Shard<K, C, M> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other thread can reach the table any more,
        // and the pointer came from `Box::into_raw` and is freed only here
        // (a replaced one goes through `Retired`, with `writer`).
        drop(unsafe { Box::from_raw(self.table.load(Ordering::Relaxed)) });
    }
}

/// Waits, for up to `rounds` rounds, until `done`; returns whether it is.
/// Each round takes a backoff step and looks again (`done` reads the
/// records of the sections a grace period waits for: no user code). A
/// thread inside a section itself (a check whose user code called back
/// into a limiter) would wait for its own section, so it does not wait at
/// all.
///
/// Called under a shard's lock too (`may_rebuild`). That cannot deadlock:
/// the wait is bounded, and no thread takes a shard lock inside a section,
/// so the sections it waits for are left without this lock (unless user
/// code inside a check blocks, which the bound is for).
fn wait_for_grace(rounds: usize, mut done: impl FnMut() -> bool) -> Grace {
    if done() {
        return Grace::Done;
    }
    if rcu::is_inside() {
        return Grace::Pinned;
    }
    let backoff = Backoff::new();
    for _ in 0..rounds {
        wait_step(&backoff);
        if done() {
            return Grace::Done;
        }
    }
    Grace::RanOut
}

/// How a wait for a grace period ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grace {
    Done,
    /// Not waited for: this thread is inside a section itself.
    Pinned,
    /// Still not elapsed after every round.
    RanOut,
}

/// Whether a quota change may rebuild the shard (lock held): as
/// [`may_rebuild`], or past it by one replaced table. A change goes ahead
/// while a stalled check holds the shard's replaced tables, keeping one
/// more than a growth may (at most `MAX_RETIRED + 1`, and only until they
/// are freed: growths wait meanwhile), rather than wait for the stall
/// without a bound; a second change during the same stall is refused.
pub(super) fn may_convert<K, C, M>(
    writer: &mut Writer<K, C, M>,
    discarded: &mut Discarded<Retired<K, C, M>>,
) -> bool {
    may_rebuild(writer, discarded) || writer.retired.len() <= MAX_RETIRED
}

/// Whether the shard (lock held) may rebuild: whether, once the replaced
/// tables whose grace period has elapsed are taken out (into `discarded`,
/// freed after the lock), it holds fewer than [`MAX_RETIRED`]. When it
/// holds that many, waits for one of them for a bounded time
/// (`REFUSAL_ROUNDS`, or `STALLED_ROUNDS` after a wait ran out) and refuses if
/// none goes: a check stalled inside them holds them, and a rebuild would
/// keep one more (the canary rebuilds all the same, keeping every table).
pub(super) fn may_rebuild<K, C, M>(
    writer: &mut Writer<K, C, M>,
    discarded: &mut Discarded<Retired<K, C, M>>,
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
    let retired = &mut writer.retired;
    // The one wait under the lock that may issue a barrier: the shard is
    // full of replaced tables, and a rebuild is refused unless one goes.
    let waited = wait_for_grace(rounds, || {
        retired.iter_mut().any(|table| table.grace_elapsed(true))
    });
    // Only a wait that ran out marks the shard stalled: a thread already
    // inside a check (user code calling back into a limiter) cannot wait
    // for its own section, which says nothing of the others.
    writer.stalled = waited == Grace::RanOut;
    discarded.extend(writer.take_graced());
    writer.retired.len() < MAX_RETIRED
}
