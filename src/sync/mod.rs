//! The one door for concurrency primitives.
//!
//! Every atomic, `Mutex`, `Arc`, `UnsafeCell`, read section (`rcu`) and
//! `Backoff` whose behaviour a model checker must see is imported from here
//! and from nowhere else. This module alone knows which implementation is
//! in use:
//!
//! * std, normally (and crossbeam-utils' `Backoff`, a spin loop);
//! * loom's under `--features loom`, so that loom models explore every
//!   interleaving of the crate's own code (`model-tests/loom.rs`), the
//!   lock-free table and its read-copy-update (`rcu`, built on these
//!   primitives alone) included. The models build only with
//!   `--cfg tollgate_loom`; without it the loom feature still builds, so
//!   that `cargo test --features loom` can compile and hand over to the
//!   models' real build, `cargo loom` (`model-tests/cargo_loom.rs`); such a
//!   library works only inside a loom model, as it does with the cfg;
//! * shuttle's under `--features shuttle` (`model-tests/shuttle.rs`). The
//!   lock-free table and its read-copy-update compile out there (their
//!   models are loom's), and `PerKey` is the default store.
//!
//! [`lock`] is the only way the crate takes a mutex. It ignores poisoning,
//! which is sound because no critical section leaves a half-written state
//! when user code panics inside it. User code under a lock (a key's `Hash`,
//! `Eq`, `Borrow`, `Clone`, the algorithm's `is_idle`) runs either before
//! the section changes anything, or between complete steps: each eviction
//! updates the counts with the slot it removes, a rebuild clones into a
//! table no one can see before it changes the shard, and a mutex store's
//! table resizes into a new allocation that a panic frees
//! (`tests/panics.rs` arms a panic at each of these calls in turn).

#[cfg(all(feature = "loom", feature = "shuttle"))]
compile_error!(
    "the `loom` and `shuttle` features exclude each other: \
     each replaces the crate's primitives with its own model checker's"
);

// std also when both features are on, so that the compile_error above is the
// only error reported.
#[cfg(any(
    not(any(feature = "loom", feature = "shuttle")),
    all(feature = "loom", feature = "shuttle")
))]
mod primitives {
    pub(crate) use std::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering, fence,
    };
    pub(crate) use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
}

#[cfg(all(feature = "loom", not(feature = "shuttle")))]
mod primitives {
    pub(crate) use loom::sync::atomic::{
        AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering,
    };
    pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
    pub(crate) use std::sync::PoisonError;
}

#[cfg(all(feature = "shuttle", not(feature = "loom")))]
mod primitives {
    pub(crate) use shuttle::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use shuttle::sync::{Arc, Mutex, MutexGuard};
    pub(crate) use std::sync::PoisonError;
}

pub(crate) use crossbeam_utils::Backoff;
#[cfg(not(feature = "shuttle"))]
pub(crate) use primitives::{AtomicPtr, AtomicU8};
// The read-copy-update's fences: not under loom, whose build models them
// otherwise (`rcu::loom_entry`).
#[cfg(not(any(feature = "shuttle", feature = "loom")))]
pub(crate) use primitives::fence;
pub(crate) use primitives::{Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};

/// A sequentially consistent fence: orders a generation's "a check carried
/// a quota" mark before that check's compare-and-swap, and a quota
/// change's read of the mark after its retiring swap
/// (`store::Generation::mark_carried`, `kit::carry_for`). shuttle's
/// executions are sequentially consistent: nothing to order there.
#[inline]
pub(crate) fn seq_cst_fence() {
    #[cfg(any(
        not(any(feature = "loom", feature = "shuttle")),
        all(feature = "loom", feature = "shuttle")
    ))]
    std::sync::atomic::fence(Ordering::SeqCst);
    #[cfg(all(feature = "loom", not(feature = "shuttle")))]
    loom::sync::atomic::fence(Ordering::SeqCst);
}

/// The acquire fence a refund puts between its load of a key's state and
/// its clock reading (`RateLimiter::refund`, `Clock::ordered`). shuttle's
/// executions are sequentially consistent: nothing to order there.
#[inline]
pub(crate) fn acquire_fence() {
    #[cfg(any(
        not(any(feature = "loom", feature = "shuttle")),
        all(feature = "loom", feature = "shuttle")
    ))]
    std::sync::atomic::fence(Ordering::Acquire);
    #[cfg(all(feature = "loom", not(feature = "shuttle")))]
    loom::sync::atomic::fence(Ordering::Acquire);
}

/// A new limiter's receipt stamp: unique in the process (a `u64` counter
/// does not wrap), so that a refund finds its own limiter's receipts. Not
/// a protocol the models check: std's atomic under them too.
pub(crate) fn next_issuer() -> std::num::NonZeroU64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let issuer = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::num::NonZeroU64::new(issuer).unwrap_or(std::num::NonZeroU64::MAX)
}

/// Locks `mutex`, recovering the guard if a previous holder panicked.
///
/// See the module documentation for why ignoring poison is sound here.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(primitives::PoisonError::into_inner)
}

/// std's `UnsafeCell` with loom's API (`with`, `with_mut`), so that the
/// table's slot accesses are checked by loom for data races under
/// `--features loom` and compile to plain pointer accesses otherwise.
#[cfg(not(any(feature = "loom", feature = "shuttle")))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(any(feature = "loom", feature = "shuttle")))]
impl<T> UnsafeCell<T> {
    #[inline]
    pub(crate) const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    /// Runs `read` on a pointer for shared access.
    #[inline]
    pub(crate) fn with<R>(&self, read: impl FnOnce(*const T) -> R) -> R {
        read(self.0.get())
    }

    /// Runs `write` on a pointer for exclusive access.
    #[inline]
    pub(crate) fn with_mut<R>(&self, write: impl FnOnce(*mut T) -> R) -> R {
        write(self.0.get())
    }
}

#[cfg(feature = "loom")]
pub(crate) use loom::cell::UnsafeCell;

/// The lock-free table's read-copy-update: readers' sections and the
/// grace periods its writers wait for (`rcu.rs`).
#[cfg(not(feature = "shuttle"))]
#[allow(unsafe_code)]
pub(crate) mod rcu;

/// Planted bugs for the canaries of the loom models (`model-tests/loom.rs`)
/// and the shuttle tests (`model-tests/shuttle.rs`): each is a one-line
/// deviation from a protocol, switched on by a model before it runs, so
/// that a green run of the real models is known to be able to fail.
/// Compiled only under `--features loom` or `shuttle`; everywhere else
/// [`canary::planted`] is a constant `false` and the deviations compile out.
pub mod canary {
    /// A deviation from the protocol.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[cfg_attr(not(any(feature = "loom", feature = "shuttle")), allow(dead_code))]
    pub enum Canary {
        /// Publishes a slot's control byte with `Relaxed` instead of
        /// `Release`: a lookup can read the slot before it is written.
        RelaxedPublish,
        /// Evicts a key (marks its slot deleted) without retiring its cell
        /// first: a concurrent admission lands in a cell no lookup reaches.
        EvictWithoutTombstone,
        /// A rebuild copies evicted (tombstoned) slots as if they were live.
        RebuildCopiesTombstone,
        /// A replaced table is freed at once, without waiting for the checks
        /// that may still be reading it.
        FreeWithoutGrace,
        /// A rebuild takes the old table's snapshot of readers before it
        /// unlinks it: a check that enters its section in between loads a
        /// table whose grace period began before the check did, and the
        /// free may overtake it.
        RetireBeforeUnlink,
        /// A reader enters its section without the fence that orders its
        /// entry store before its load of the table pointer (`sync::rcu`):
        /// a writer's snapshot can miss the reader that goes on to load
        /// the table it frees.
        ReaderEntryWithoutFence,
        /// A writer takes its snapshot of readers without the barrier
        /// (`sync::rcu`): it can miss a reader whose entry store it does not
        /// see yet, though the reader loads the unlinked table.
        WriterWithoutBarrier,
        /// A reader leaves its section with a `Relaxed` store
        /// (`sync::rcu`): a writer that reads the change frees the table
        /// with nothing ordering the section's reads of it before the free.
        RelaxedSectionExit,
        /// A rebuild whose shard's last replaced table is still read goes on
        /// and keeps one more: a reader stalled inside a check lets
        /// replaced tables pile up without bound.
        KeepEveryReplacedTable,
        /// A rebuild publishes its new table with a `Relaxed` swap: a check
        /// that loads the pointer can read a moved cell before its move.
        RelaxedTableSwap,
        /// A check takes the generation it decides by from a load of its
        /// shard's table made before the one it finds the key's cell in
        /// (`store::lock_free`): a quota change between the two loads has
        /// it decide a carried state by the old quota's algorithm.
        GenerationApart,
        /// A quota change on the per-key store copies each cell's state
        /// into a new cell without retiring the old one
        /// (`store::per_key`): a check that found the old cell before the
        /// change admits into a cell no lookup reaches any more.
        ChangeWithoutRetire,
        /// A quota change carries a shard by its strategy without reading
        /// again, once the shard is frozen, whether a check carrying a
        /// quota of its own wrote to it (`store::kit::carry_for`): the
        /// first tier check racing the change has its key rescaled.
        CarryIgnoresMark,
        /// An admission on an atomic cell stores its word instead of
        /// compare-and-swapping it: two checks that decided on the same
        /// word both admit (the lost update; `crate::cell::Atomic`).
        StoreInsteadOfCas,
        /// A change to an atomic cell (a refund) stores its word instead of
        /// compare-and-swapping it: an admission that landed between its
        /// load and its store is lost (`crate::cell::Atomic::update`).
        UpdateWithoutCas,
        /// An abandoned reservation moves the TAT back but leaves the later
        /// reservations' slots where they were (`crate::wait`).
        CancelWithoutShift,
        /// An abandoned reservation gives nothing back.
        CancelWithoutRefund,
        /// An abandoned reservation stays queued (its slot still moved
        /// along) until a later one leaves through it: a storm of
        /// reservations made and dropped behind one waiter grows the queue
        /// without bound.
        CancelKeepsEntry,
        /// A lease's units never expire: a unit is spent after its deadline
        /// (`crate::remote`).
        LeaseNeverExpires,
        /// The deny cache denies one interval past the instant the remote
        /// would admit (`crate::remote`).
        DenyCacheOutlives,
        /// The deny cache denies a request that just fits (`>=` for `>`)
        /// (`crate::remote`).
        DenyAtTheBoundary,
        /// A lease's unit is spent up to one interval past its deadline: a
        /// slack of one nobody asked for (`crate::remote`).
        LeaseOneLate,
        /// A claim gives back one unit more than its lease has left: one
        /// already spent (`crate::remote`).
        GiveBackSpent,
        /// A check carrying another quota than the view's claims a word
        /// that holds lease units (`crate::remote`): its call gives them
        /// back at its own interval, not the one they were granted at.
        TierClaimsLease,
        /// An ask's reply is installed whatever generation the key's word
        /// is in (`crate::remote`): a lease granted under the quota before
        /// a change is spent by the rules of the one after.
        ReplyAcrossChange,
        /// The clocks' offset is read without checking that no writer
        /// overtook the read (`crate::remote`'s `Offset`): a torn pair.
        OffsetTornRead,
        /// The bound of the remote's clock falls back with it: a new
        /// round trip's pair replaces the old one without its floor, and
        /// on the local clock a check decides at its own reading even when
        /// a later one was sent already (`crate::remote`'s `Offset`): a
        /// unit expired under the old bound is spent again.
        BoundFallsBack,
        /// A hold is written into the word of a call that granted a lease
        /// (not kept beside it until the lease is spent): the lease's
        /// slots move up to the hold's floor (`crate::remote`'s holds).
        HoldMovesLease,
    }

    #[cfg(any(feature = "loom", feature = "shuttle"))]
    std::thread_local! {
        // loom and shuttle run a model's threads on the test's own OS
        // thread, so a canary planted by the test is seen by every thread
        // of its model and by no other test running in parallel.
        static PLANTED: std::cell::Cell<Option<Canary>> = const { std::cell::Cell::new(None) };
    }

    /// Plants `canary` (or none) for the models this thread runs next.
    #[cfg(any(feature = "loom", feature = "shuttle"))]
    pub fn plant(canary: Option<Canary>) {
        PLANTED.with(|planted| planted.set(canary));
    }

    /// Whether `canary` is planted.
    #[cfg(any(feature = "loom", feature = "shuttle"))]
    pub(crate) fn planted(canary: Canary) -> bool {
        PLANTED.with(|planted| planted.get() == Some(canary))
    }

    #[cfg(any(feature = "loom", feature = "shuttle"))]
    std::thread_local! {
        // Holds (`crate::remote`) the models this thread ran decided, and
        // those a claim found running and wrote into its key's word.
        static HOLDS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }

    /// Counts a hold decided (`crate::remote`), or one a claim found
    /// running (`at_claim`), so that a model can show it took some.
    #[cfg(any(feature = "loom", feature = "shuttle"))]
    pub(crate) fn held(at_claim: bool) {
        HOLDS.with(|holds| {
            let (decided, found) = holds.get();
            holds.set(if at_claim {
                (decided, found + 1)
            } else {
                (decided + 1, found)
            });
        });
    }

    /// Counts nothing outside the model builds.
    #[cfg(not(any(feature = "loom", feature = "shuttle")))]
    #[inline]
    pub(crate) const fn held(_at_claim: bool) {}

    /// How many holds the models this thread ran decided, and how many a
    /// claim found running.
    #[cfg(any(feature = "loom", feature = "shuttle"))]
    pub fn holds() -> (u64, u64) {
        HOLDS.with(std::cell::Cell::get)
    }

    /// Whether `canary` is planted: never, outside the model builds.
    #[cfg(not(any(feature = "loom", feature = "shuttle")))]
    #[inline]
    pub(crate) const fn planted(_canary: Canary) -> bool {
        false
    }
}

/// One step of a wait for another thread's progress: `backoff`'s spin, then
/// yield. Under loom, a loom yield, since loom explores a waiting loop only
/// if each turn yields to the threads it waits for.
#[cfg(not(feature = "shuttle"))]
#[inline]
pub(crate) fn wait_step(backoff: &Backoff) {
    #[cfg(feature = "loom")]
    {
        let _ = backoff;
        loom::thread::yield_now();
    }
    #[cfg(not(feature = "loom"))]
    backoff.snooze();
}
