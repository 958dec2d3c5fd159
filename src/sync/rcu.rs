//! Read-copy-update for the lock-free table, with asymmetric fences: a
//! reader's section costs a few loads and stores to its own thread's record
//! and a compiler fence (no read-modify-write, no shared write), and the
//! writer, which is rare and already on a cold path, pays a heavy barrier
//! for both sides (the design of liburcu's `urcu-memb` flavour).
//!
//! # Readers
//!
//! Every thread that enters a section gets a **record** from a
//! process-wide registry: a cache-padded `state` word, even outside a
//! section and odd inside one, and the thread's nesting count. Entering
//! the outermost section stores `state + 1` (odd) and then, on the light
//! side, issues only a compiler fence; leaving it stores `state + 1` again
//! (even, `Release`). Nested sections (a lab's held section, user code
//! calling back into a limiter from inside a check) only count. The state
//! only grows, so each section of a record has its own odd value, and a
//! writer that saw the value change knows that section ended.
//!
//! Records are allocated once, linked into the registry, and never freed
//! while the process lives: a thread that exits releases its record, and
//! the next thread to need one takes it again. A thread holds its record
//! from its first section until it exits, so the registry holds as many
//! records as the most threads alive at once that ever entered a section
//! (plus the records of threads that exited inside a section, which stay
//! taken: see below).
//!
//! # Writers
//!
//! A writer unlinks a table (a `Release` swap of the shard's pointer), then
//! takes a [`Ticket`]. The table may be freed once every section that
//! could have loaded the pointer before the swap has ended:
//!
//! 1. [`Ticket::snapshot`] first makes sure a **heavy barrier** has run
//!    since the ticket was taken: `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`,
//!    which runs a full memory barrier on every CPU running one of the
//!    process's threads. It pairs with every reader's compiler fence: a
//!    reader whose entry store is not visible to the snapshot below entered
//!    after the barrier, so its load of the table pointer, ordered after
//!    its entry by the compiler fence and by the barrier, sees the swap and
//!    the new table. Barriers are counted (`BARRIERS`): a ticket names the
//!    first barrier that begins after it, and one barrier serves every
//!    ticket taken before it began, so a pass over several replaced tables
//!    issues at most one.
//! 2. Then it reads every record's state (`Acquire`) and keeps those that
//!    were odd: the sections the table may still be read in.
//! 3. [`Snapshot::elapsed`] reads them again: once each has changed, each
//!    of those sections has ended (its `Release` exit store, read with
//!    `Acquire`, orders its reads before the free).
//!
//! # When there is no membarrier
//!
//! `membarrier` is Linux's (4.14 and later for the expedited command), and
//! a seccomp filter or an old kernel can refuse it. The decision is taken
//! once per process, when the first lock-free store is built ([`prepare`])
//! or at the first barrier, whichever comes first (`mode`, a `OnceLock`),
//! and never changes; readers never take it. A reader takes
//! the light side only once it has read that decision as
//! [`Mode::Membarrier`]; until then, and always when the decision is
//! [`Mode::Fences`], it issues a full `fence(SeqCst)` after its entry store.
//! A writer always reads the decision through the `OnceLock` (which orders
//! it after the decision), and issues `membarrier` under `Membarrier` and a
//! `fence(SeqCst)` under `Fences`. Every pairing is then sound: a light
//! reader exists only under `Membarrier`, whose writers all use the heavy
//! barrier; and a reader with a full fence is ordered against a writer with
//! either (its fence pairs with the writer's `SeqCst` fence, and the
//! heavy barrier is at least one).
//!
//! A barrier the kernel refuses after the registration succeeded (a
//! seccomp filter installed later, say) cannot be replaced by a fence, since
//! light readers skipped theirs: the grace periods that need it do not
//! elapse (a snapshot without its barrier never does), and every later
//! writer tries the barrier again. What was unlinked stays allocated, and
//! the store's bounds on what it keeps turn that into refused new keys,
//! never a use after free and never a panic.
//!
//! Under Miri there is no `membarrier`: readers and writers both fence
//! (`SeqCst`), the `Fences` mode. Under loom neither: the reader's entry is
//! an exchange and the writer's barrier a read-modify-write of every record,
//! which give the barrier's guarantee in a form loom checks
//! (`loom_entry` says why not fences).
//!
//! # Threads that exit, stall or panic
//!
//! * A section is left by its guard's `Drop`, so a panic in user code
//!   inside a check (a key's `Eq`) leaves it on unwinding.
//! * A thread descheduled inside a section stalls every grace period that
//!   begins while it is there (the store's waits are bounded for that:
//!   `store::lock_free::shard`).
//! * A thread's record is released by its thread-local's destructor. If a
//!   guard is still alive then (a guard kept in another thread-local, whose
//!   destructor runs later), the record is released when that guard is
//!   dropped; a guard leaked with `mem::forget` keeps its record odd and
//!   taken for good, as a section that never ends must. A thread whose
//!   thread-local is already gone (a section entered from another
//!   thread-local's destructor) takes a record from the registry for each
//!   outermost section and gives it back when the section ends.
//! * `fork` is out of scope: a child process of a multi-threaded parent
//!   inherits records that threads which no longer exist hold.

use std::marker::PhantomData;

use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicBool as StdAtomicBool, AtomicUsize as StdAtomicUsize};

use super::canary::{self, Canary};
use super::{AtomicBool, AtomicUsize, Mutex, Ordering, lock};

/// One thread's record in the registry.
struct Record {
    /// Twice the sections this record has been through, plus one while
    /// inside one: odd inside a section. Written only by the thread that
    /// holds the record; read by writers.
    state: AtomicUsize,
    /// The guards the holding thread has alive on this record. Only ever
    /// touched by that thread (std atomics, so that loom does not count
    /// them as scheduling points).
    nesting: StdAtomicUsize,
    /// The holding thread's thread-local is gone: the record is released
    /// when its last guard is dropped.
    orphaned: StdAtomicBool,
    /// Held by a thread (a loom atomic: it passes a record from an exiting
    /// thread to a new one).
    taken: AtomicBool,
}

impl Record {
    fn new() -> Self {
        Self {
            state: AtomicUsize::new(0),
            nesting: StdAtomicUsize::new(0),
            orphaned: StdAtomicBool::new(false),
            taken: AtomicBool::new(true),
        }
    }

    /// Enters a section (the holding thread only).
    #[inline]
    fn enter(&self) {
        let nesting = self.nesting.load(Ordering::Relaxed);
        // A guard count past `usize::MAX` needs `mem::forget` in a loop.
        let Some(next) = nesting.checked_add(1) else {
            panic!("too many nested read sections");
        };
        self.nesting.store(next, Ordering::Relaxed);
        if nesting == 0 {
            // Only this thread writes `state`.
            let state = self.state.load(Ordering::Relaxed);
            debug_assert_eq!(state & 1, 0, "entering a section inside one");
            // The order that matters, this store before the section's loads
            // (of the table pointer), is the fence's, or the writer's heavy
            // barrier's. Release: a snapshot that reads this odd value also
            // reads past the previous section's exit (a plain store on x86,
            // `stlr` on aarch64).
            #[cfg(not(feature = "loom"))]
            {
                self.state.store(state.wrapping_add(1), Ordering::Release);
                reader_fence();
            }
            #[cfg(feature = "loom")]
            loom_entry(&self.state, state.wrapping_add(1));
        }
    }

    /// Leaves a section (the holding thread only).
    #[inline]
    fn leave(&self) {
        let nesting = self.nesting.load(Ordering::Relaxed) - 1;
        self.nesting.store(nesting, Ordering::Relaxed);
        if nesting == 0 {
            let state = self.state.load(Ordering::Relaxed);
            // Release: the section's reads happen before a writer that reads
            // this store (`Acquire`) frees what they read.
            let exit = if canary::planted(Canary::RelaxedSectionExit) {
                Ordering::Relaxed
            } else {
                Ordering::Release
            };
            self.state.store(state.wrapping_add(1), exit);
            if self.orphaned.load(Ordering::Relaxed) {
                self.release();
            }
        }
    }

    /// Gives the record back to the registry (its thread is done with it).
    fn release(&self) {
        // Release: the next thread to take it (`Acquire`) sees its state.
        self.taken.store(false, Ordering::Release);
    }
}

/// Every record ever allocated. A mutex, not a lock-free list: it is taken
/// only when a thread takes a record (its first section) and by writers'
/// snapshots, both rare; readers never touch it.
struct Registry(Mutex<Vec<&'static Record>>);

#[cfg(not(feature = "loom"))]
fn registry() -> &'static Registry {
    static REGISTRY: Registry = Registry(Mutex::new(Vec::new()));
    &REGISTRY
}

// loom resets statics between executions through its own lazy_static.
#[cfg(feature = "loom")]
fn registry() -> &'static Registry {
    loom::lazy_static! {
        static ref REGISTRY: Registry = Registry(Mutex::new(Vec::new()));
    }
    &REGISTRY
}

/// Takes a released record, or allocates one and links it in.
#[cold]
fn take_record() -> &'static Record {
    let mut records = lock(&registry().0);
    for &record in records.iter() {
        // Acquire: pairs with `Record::release`.
        if record
            .taken
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            record.orphaned.store(false, Ordering::Relaxed);
            return record;
        }
    }
    // Never freed: readers' guards and writers' snapshots refer to records
    // with no lifetime to track, and a record is reused, not freed.
    // Padded to its own cache lines: its thread writes it on every section.
    let record: &'static Record = Box::leak(Box::new(CachePadded::new(Record::new())));
    records.push(record);
    record
}

/// The thread's record, released when the thread exits.
struct Local(&'static Record);

impl Drop for Local {
    fn drop(&mut self) {
        let record = self.0;
        if record.nesting.load(Ordering::Relaxed) == 0 {
            record.release();
        } else {
            // A guard outlives the thread-local: it releases the record.
            record.orphaned.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(not(feature = "loom"))]
std::thread_local! {
    static LOCAL: Local = Local(take_record());
}

#[cfg(feature = "loom")]
loom::thread_local! {
    static LOCAL: Local = Local(take_record());
}

/// A read section, left when dropped. Not `Send`: the record it entered is
/// its thread's.
#[must_use]
pub(crate) struct Guard {
    record: &'static Record,
    not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").finish_non_exhaustive()
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        self.record.leave();
    }
}

/// Enters a read section: whatever is loaded inside it from a pointer that
/// writers unlink with a swap and retire with a [`Ticket`] stays valid
/// until the guard is dropped.
#[inline]
pub(crate) fn enter() -> Guard {
    let record = LOCAL.try_with(|local| local.0).unwrap_or_else(|_| {
        // The thread-local is gone (a section entered from a thread-local's
        // destructor): a record for this section, released when it ends.
        let record = take_record();
        record.orphaned.store(true, Ordering::Relaxed);
        record
    });
    record.enter();
    Guard {
        record,
        not_send: PhantomData,
    }
}

/// Whether the current thread is inside a section (a guard of it is alive):
/// a grace period it waits for would wait for itself.
#[inline]
pub(crate) fn is_inside() -> bool {
    LOCAL
        .try_with(|local| local.0.nesting.load(Ordering::Relaxed) > 0)
        .unwrap_or(false)
}

/// How the process orders readers' entries against writers' snapshots.
#[cfg(not(feature = "loom"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Readers: a compiler fence; writers: `membarrier`.
    #[cfg_attr(any(miri, not(target_os = "linux")), allow(dead_code))]
    Membarrier,
    /// Readers and writers: `fence(SeqCst)`.
    Fences,
}

/// The light side's switch, read on every outermost entry: `true` once the
/// mode is known to be `Membarrier`. A stale `false` costs a fence, never
/// soundness.
/// On a line of its own: every outermost entry reads it, and nothing may
/// write near it (the barrier count beside it did, on every barrier).
#[cfg(all(target_os = "linux", not(any(feature = "loom", miri))))]
static LIGHT: CachePadded<std::sync::atomic::AtomicBool> =
    CachePadded::new(std::sync::atomic::AtomicBool::new(false));

/// The process's mode, decided once.
#[cfg(not(feature = "loom"))]
fn mode() -> Mode {
    #[cfg(all(target_os = "linux", not(any(feature = "loom", miri))))]
    {
        static MODE: std::sync::OnceLock<Mode> = std::sync::OnceLock::new();
        *MODE.get_or_init(|| {
            let mode = if membarrier::register() {
                Mode::Membarrier
            } else {
                Mode::Fences
            };
            // Set inside the initialisation, so a reader that sees it was
            // ordered after a registration that succeeded; writers read the
            // `OnceLock`, never this flag.
            LIGHT.store(mode == Mode::Membarrier, Ordering::Relaxed);
            mode
        })
    }
    #[cfg(not(all(target_os = "linux", not(any(feature = "loom", miri)))))]
    {
        Mode::Fences
    }
}

/// Decides the process's mode now (see the module documentation), so that
/// the first check does not pay for the registration: a lock-free store
/// calls it when it is built. Until it has run, every reader fences.
pub(crate) fn prepare() {
    #[cfg(not(feature = "loom"))]
    let _ = mode();
}

/// The reader's side of the barrier, after its entry store.
#[cfg(not(feature = "loom"))]
#[inline]
fn reader_fence() {
    if canary::planted(Canary::ReaderEntryWithoutFence) {
        return;
    }
    #[cfg(all(target_os = "linux", not(any(feature = "loom", miri))))]
    if LIGHT.load(Ordering::Relaxed) {
        // The writer's membarrier orders the rest; the compiler must not
        // move the section's loads above the entry store.
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        return;
    }
    heavy_reader_fence();
}

/// Under loom, the entry's store and the barrier it pairs with, as an
/// exchange (`AcqRel`), which reads the latest value of the record: the
/// writer's barrier is a read-modify-write of every record too
/// (`heavy_barrier`), so either the barrier reads the entry (the writer's
/// snapshot sees the section), or the entry reads the barrier's (and the
/// section happens after the writer's swap, and loads the new table). This
/// is what the heavy barrier guarantees, in a form loom checks as the C++
/// memory model has it. Not `SeqCst` fences, as Miri's build runs: loom
/// makes every `SeqCst` fence synchronise with all earlier ones, which
/// orders far more than the hardware does and
/// hides real bugs (a `Relaxed` publication of the new table,
/// `Canary::RelaxedTableSwap`, is caught only without them).
#[cfg(feature = "loom")]
fn loom_entry(state: &AtomicUsize, odd: usize) {
    if canary::planted(Canary::ReaderEntryWithoutFence) {
        // The canary: a plain store, which pairs with nothing.
        state.store(odd, Ordering::Relaxed);
    } else {
        state.swap(odd, Ordering::AcqRel);
    }
}

/// A reader's full fence: before the mode is known (no lock-free store
/// built yet: [`prepare`]), or without membarrier. Always sound.
#[cfg(not(feature = "loom"))]
#[cold]
#[inline(never)]
fn heavy_reader_fence() {
    super::fence(Ordering::SeqCst);
}

/// The writer's barrier: orders every reader's entry store that is not yet
/// visible after the writer's swap (see the module documentation). Returns
/// whether it ran: `false` only if the kernel refused the membarrier.
fn heavy_barrier() -> bool {
    if canary::planted(Canary::WriterWithoutBarrier) {
        return true;
    }
    #[cfg(feature = "loom")]
    for record in lock(&registry().0).iter() {
        // See `loom_entry`.
        record.state.fetch_add(0, Ordering::AcqRel);
    }
    #[cfg(not(feature = "loom"))]
    match mode() {
        #[cfg(all(target_os = "linux", not(miri)))]
        Mode::Membarrier => return membarrier::private_expedited(),
        _ => super::fence(Ordering::SeqCst),
    }
    true
}

/// The count of heavy barriers completed. Held while one runs, so that a
/// ticket read under it names a barrier that begins after it.
struct Barriers(Mutex<u64>);

#[cfg(not(feature = "loom"))]
fn barriers() -> &'static Barriers {
    static BARRIERS: Barriers = Barriers(Mutex::new(0));
    &BARRIERS
}

#[cfg(feature = "loom")]
fn barriers() -> &'static Barriers {
    loom::lazy_static! {
        static ref BARRIERS: Barriers = Barriers(Mutex::new(0));
    }
    &BARRIERS
}

/// How many heavy barriers have completed (also `lab_hooks::barriers`).
pub(crate) fn barriers_done() -> u64 {
    *lock(&barriers().0)
}

/// Taken right after a pointer's swap unlinked an object: the grace period
/// of everything unlinked before it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket {
    /// The first barrier that began after the ticket was taken.
    barrier: u64,
}

/// Takes a ticket: call it after the unlinking swap, on the same thread.
pub(crate) fn ticket() -> Ticket {
    // Under the lock no barrier is running, so the next one (numbered
    // `done + 1`) begins after this unlock, and so after the swap.
    let done = *lock(&barriers().0);
    Ticket { barrier: done + 1 }
}

impl Ticket {
    /// The barrier the ticket waits for: a later ticket's barrier serves it.
    pub(crate) fn barrier_number(self) -> u64 {
        self.barrier
    }

    /// Whether a barrier that began after the ticket has completed (without
    /// issuing one).
    pub(crate) fn served(self) -> bool {
        barriers_done() >= self.barrier
    }

    /// Makes sure a barrier began after the ticket and has completed, issuing
    /// one if none has: one barrier serves every ticket taken before it
    /// began. Returns whether one has (`false` only if the kernel refused
    /// it: see the module documentation).
    pub(crate) fn barrier(self) -> bool {
        let mut done = lock(&barriers().0);
        if *done < self.barrier && heavy_barrier() {
            *done += 1;
        }
        *done >= self.barrier
    }

    /// The sections that may still read what was unlinked before the ticket:
    /// after the barrier, those inside a section now. Without the barrier,
    /// a snapshot that never elapses.
    pub(crate) fn snapshot(self) -> Snapshot {
        if !self.barrier() {
            return Snapshot {
                sections: Vec::new(),
                barriered: false,
            };
        }
        let records = lock(&registry().0);
        Snapshot {
            sections: records
                .iter()
                .filter_map(|&record| {
                    // Acquire: a section that ended already (even) had its
                    // reads ordered before this load.
                    let state = record.state.load(Ordering::Acquire);
                    (state & 1 == 1).then_some((record, state))
                })
                .collect(),
            barriered: true,
        }
    }
}

/// The sections a grace period waits for: each record that was inside one,
/// with the state it had then.
pub(crate) struct Snapshot {
    sections: Vec<(&'static Record, usize)>,
    /// Taken after its ticket's barrier; without it, it never elapses.
    barriered: bool,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("sections", &self.sections.len())
            .field("barriered", &self.barriered)
            .finish()
    }
}

impl Snapshot {
    /// Whether it was taken after its ticket's barrier: one that was not is
    /// taken again, after another try at the barrier.
    pub(crate) fn barriered(&self) -> bool {
        self.barriered
    }

    /// Whether every section of the snapshot has ended.
    pub(crate) fn elapsed(&self) -> bool {
        // Acquire: pairs with the exit store (`Record::leave`), so the
        // section's reads happen before whatever the caller frees.
        self.barriered
            && self
                .sections
                .iter()
                .all(|(record, state)| record.state.load(Ordering::Acquire) != *state)
    }
}

/// The registry's records: `(allocated, held by a thread)` (the tests'
/// bound on it, through `lab_hooks`).
#[cfg_attr(not(feature = "lab-hooks"), allow(dead_code))]
pub(crate) fn records() -> (usize, usize) {
    let records = lock(&registry().0);
    let held = records
        .iter()
        .filter(|record| record.taken.load(Ordering::Acquire))
        .count();
    (records.len(), held)
}

#[cfg(all(target_os = "linux", not(any(feature = "loom", miri))))]
mod membarrier {
    //! The two `membarrier(2)` commands the light side needs.

    /// `MEMBARRIER_CMD_QUERY`.
    const QUERY: libc::c_long = 0;
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`.
    const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    /// `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`.
    const REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    fn membarrier(command: libc::c_long) -> libc::c_long {
        // SAFETY: `membarrier(cmd, flags, cpu_id)` reads and writes no
        // memory of ours; an unknown command or a refusal is an error
        // return (`-1`), never undefined behaviour.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                command,
                0 as libc::c_long,
                0 as libc::c_long,
            )
        }
    }

    /// Whether the kernel offers the expedited private barrier and took this
    /// process's registration for it.
    pub(super) fn register() -> bool {
        let commands = membarrier(QUERY);
        commands >= 0
            && commands & PRIVATE_EXPEDITED != 0
            && commands & REGISTER_PRIVATE_EXPEDITED != 0
            && membarrier(REGISTER_PRIVATE_EXPEDITED) == 0
    }

    /// A full barrier on every CPU running one of the process's threads;
    /// whether the kernel ran it. Registered (`register`) before any reader
    /// went light, and a registration is never undone, so only a filter
    /// installed since (seccomp) can refuse it; a fence would not do then
    /// (the light readers skipped theirs), so the caller's grace period
    /// does not elapse.
    pub(super) fn private_expedited() -> bool {
        #[cfg(test)]
        if REFUSED.get() {
            return false;
        }
        membarrier(PRIVATE_EXPEDITED) == 0
    }

    #[cfg(test)]
    std::thread_local! {
        /// The tests' refusal, as a seccomp filter would: this thread's
        /// barriers only, so that other tests' stores are not touched.
        pub(super) static REFUSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn sections_nest_and_end() {
        assert!(!is_inside());
        let outer = enter();
        let record = outer.record;
        let state = record.state.load(Ordering::Relaxed);
        assert_eq!(state & 1, 1);
        {
            let _inner = enter();
            assert_eq!(
                record.state.load(Ordering::Relaxed),
                state,
                "a nested entry stores nothing"
            );
        }
        assert!(is_inside());
        drop(outer);
        assert!(!is_inside());
        assert_eq!(record.state.load(Ordering::Relaxed), state + 1);
    }

    #[test]
    fn a_snapshot_waits_for_the_sections_inside() {
        let (entered, leave) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let (entered_tx, entered_rx) = entered;
        let (leave_tx, leave_rx) = leave;
        let reader = std::thread::spawn(move || {
            let guard = enter();
            entered_tx.send(()).unwrap();
            leave_rx.recv().unwrap();
            drop(guard);
        });
        entered_rx.recv().unwrap();
        let snapshot = ticket().snapshot();
        assert!(!snapshot.elapsed(), "a section inside at the snapshot");
        leave_tx.send(()).unwrap();
        reader.join().unwrap();
        assert!(snapshot.elapsed());
        assert!(records().0 >= 1);
    }

    #[cfg(all(target_os = "linux", not(miri)))]
    #[test]
    fn a_refused_barrier_leaves_the_grace_period_open_and_is_tried_again() {
        assert_eq!(
            mode(),
            Mode::Membarrier,
            "this test needs membarrier(2)'s private expedited command (Linux 4.14 or later, \
             not filtered by seccomp)"
        );
        membarrier::REFUSED.set(true);
        // A ticket no other thread's barrier can serve.
        let far = Ticket { barrier: u64::MAX };
        assert!(!far.barrier());
        let refused = far.snapshot();
        assert!(!refused.barriered());
        assert!(
            !refused.elapsed(),
            "no section inside, but no barrier either"
        );
        membarrier::REFUSED.set(false);
        assert!(ticket().snapshot().barriered(), "tried again, it runs");
    }
}
