//! How keys find their state.
//!
//! A [`Store`] maps keys to per-key state and applies an algorithm to it
//! under its own discipline. Every store runs the same conformance suite, so
//! a new store is checked by adding one line to `tests/conformance/main.rs`.
//!
//! * [`GlobalMutex`]: one mutex-guarded hash table. The baseline.
//! * [`Sharded`]: `N` cache-padded mutex-guarded shards.
//! * [`PerKey`]: one mutex-guarded table of `Arc`'d cells, locked only to
//!   find a key's cell.
//! * `LockFree`: the default; checks on existing keys take no lock (see its
//!   documentation).
//!
//! A key enters a store only when a request on it is admitted: a peek, an
//! invalid cost or a rejected new key never allocates, because a fresh key's
//! state is the algorithm's default and can be decided without storing it.
//!
//! # Bounded memory
//!
//! Keys are usually chosen by clients, so by attackers. Every store
//! therefore
//!
//! * **evicts idle keys exactly**: it removes only a key whose state decides
//!   as a fresh key's would ([`Algorithm::is_idle`]), so eviction never
//!   changes a decision. It does this amortized inside normal operation
//!   (before a shard's table grows, and when the cap is reached), and on
//!   demand with [`Store::evict_idle`], which also gives the memory back;
//! * **caps the number of keys** when asked ([`KeyCap`]), with an explicit
//!   policy for a new key that finds the store full ([`WhenFull`]).
//!
//! # User code
//!
//! A key's `Hash`, `Eq`, `Borrow`, `Clone` (or `ToOwned`) and `Drop`, a
//! `LockFree` store's `BuildHasher`, and an [`Algorithm`]'s methods are
//! user code, and may panic. A panic reaches the call that ran the code and
//! nothing else: every other key decides exactly as it would have,
//! [`Store::len`] stays exact, and no room under the cap is lost. A store
//! calls user code only where a panic loses nothing: before it changes
//! anything, between complete steps (each eviction is counted with the slot
//! it removes), or while it builds a new table that the panic then discards
//! (the lock-free store's rebuilds, the mutex stores' resizes), never while
//! it moves entries it could not put back. Keys a store discards (evicted
//! keys, a rebuilt table's old copies) are dropped after its locks are
//! released, each on its own, and a panic in their `Drop` is caught and
//! discarded: it has no caller to reach, and the request that happened to
//! trigger the eviction was decided already. `tests/panics.rs` arms a panic
//! at every call of every site in turn.
//!
//! A key's `Eq`, `Hash` and `Borrow` run inside the store's critical
//! sections (under a shard's lock, or a lock-free check's epoch guard): they
//! must not call back into the same limiter, which, like a `HashMap` key
//! whose `Eq` locks the map it is in, can deadlock. One that blocks delays
//! the checks that wait for it, and, on the lock-free store, the reclamation
//! of replaced tables (see [`LockFree`]'s "Memory"), but no writer waits for
//! it without a bound.
//!
//! # Writing a store outside the crate
//!
//! [`Store`] and [`StoreKind`] are open: a store built on another map plugs
//! into [`Builder::store`](crate::Builder::store) like the crate's own. The
//! pieces the crate's stores are built from are public too, so that such a
//! store keeps the same promises without writing them again:
//!
//! * the [`Cell`](crate::cell::Cell)s, which apply an algorithm's arithmetic
//!   to one key's state and retire it, so that eviction loses no admission;
//! * [`Population`], the exact count of keys under a [`KeyCap`];
//! * [`admit_new_key`], the new-key protocol (decide as a fresh key, reserve
//!   room, insert), and [`retry_after_sweep`], which sweeps the whole store
//!   when a new key finds it full;
//! * [`decide_fresh`] (an absent key's decision), [`rested_at`] (the horizon
//!   of a sweep before growth) and [`Held`] (a value held across user code
//!   that may panic).
//!
//! The store on papaya in the repository's `peers` crate is built this
//! way, and runs the conformance suite.

// The lock-free table reclaims memory with crossbeam-epoch, which runs under
// loom (with `--cfg crossbeam_loom`) but has no shuttle build: under shuttle
// the table compiles out and `PerKey`, built only on `crate::sync`, stands in
// for it.
#[cfg(not(feature = "shuttle"))]
#[allow(unsafe_code)]
mod lock_free;
mod mutex;
mod per_key;
#[cfg(not(feature = "shuttle"))]
#[allow(unsafe_code)]
mod table;

use std::borrow::Borrow;
use std::fmt::Debug;
use std::hash::Hash;
use std::num::NonZeroUsize;
use std::panic::{AssertUnwindSafe, catch_unwind};

#[cfg(not(feature = "shuttle"))]
pub use lock_free::LockFree;
pub use mutex::{GlobalMutex, Sharded};
pub use per_key::PerKey;

/// The store a limiter uses unless a [`Builder`](crate::Builder) chooses
/// one: [`LockFree`] (under the shuttle feature, [`PerKey`]).
#[cfg(not(feature = "shuttle"))]
pub type DefaultStore = LockFree;

/// The store a limiter uses unless a [`Builder`](crate::Builder) chooses
/// one: under the shuttle feature, [`PerKey`], the stand-in for the
/// lock-free store that shuttle can see into.
#[cfg(feature = "shuttle")]
pub type DefaultStore = PerKey;

use crate::algorithm::{Algorithm, Verdict};
use crate::decision::Decision;
use crate::error::CheckError;

/// A key type a store can hold: hashable, comparable, cloneable and
/// shareable across threads (integers, `String`, tuples, IP addresses, …).
///
/// `Clone` because the lock-free store clones each key into a rebuilt table
/// and lets the old table drop its own copy once no reader can see it, so no
/// key is ever read through a bitwise copy.
///
/// As for any `HashMap` key, a key whose `Hash` or `Eq` changes while it is
/// stored (through interior mutability) is a logic error: the decisions for
/// it are unspecified, but never unsound, and other keys are unaffected.
pub trait Key: Hash + Eq + Clone + Send + Sync + 'static {}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Key for K {}

/// A borrowed form of a key `K` that a limiter can be asked about: `K`
/// itself, or a type `K` borrows as (`str` for `String`, `[u8]` for
/// `Vec<u8>`). Implemented for every such type; it names the bound
/// `K: Borrow<Q>, Q: Hash + Eq + ToOwned<Owned = K>` once.
pub trait Lookup<K>: Hash + ToOwned<Owned = K> + private::Sealed<K> {
    /// Whether `stored` is the key this one borrows as.
    fn matches(&self, stored: &K) -> bool;
}

impl<K, Q> Lookup<K> for Q
where
    K: Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    #[inline]
    fn matches(&self, stored: &K) -> bool {
        stored.borrow() == self
    }
}

mod private {
    use std::borrow::Borrow;
    use std::hash::Hash;

    /// Seals [`Lookup`](super::Lookup): its blanket implementation is the
    /// only one.
    pub trait Sealed<K> {}

    impl<K, Q> Sealed<K> for Q
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
    }
}

/// What a store does with a new key when it already holds its cap of keys
/// and none it examined was idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WhenFull {
    /// Fail closed: the new key's check returns
    /// [`CheckError::StoreFull`]. Existing keys keep working. The default.
    #[default]
    Reject,
    /// Fail open: decide the new key as a fresh key and do not store it. It
    /// gets its full burst on every request until a slot frees up, so a
    /// flood of new keys is not limited; existing keys keep their state.
    AdmitUntracked,
}

/// A cap on the number of keys a store holds, and what a new key past it
/// gets. Built by [`Builder::max_keys`](crate::Builder::max_keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyCap {
    max_keys: NonZeroUsize,
    when_full: WhenFull,
}

impl KeyCap {
    /// At most `max_keys` keys; `when_full` for a new key past them.
    #[must_use]
    pub const fn new(max_keys: NonZeroUsize, when_full: WhenFull) -> Self {
        Self {
            max_keys,
            when_full,
        }
    }

    /// The most keys held at once.
    #[must_use]
    pub const fn max_keys(&self) -> NonZeroUsize {
        self.max_keys
    }

    /// What a new key past the cap gets.
    #[must_use]
    pub const fn when_full(&self) -> WhenFull {
        self.when_full
    }

    /// The outcome for a new key that found the store full, given the
    /// decision a fresh key gets.
    fn outcome(self, fresh: Decision) -> Result<Decision, CheckError> {
        match self.when_full {
            WhenFull::Reject => Err(CheckError::StoreFull {
                max_keys: self.max_keys.get(),
            }),
            WhenFull::AdmitUntracked => Ok(fresh),
        }
    }
}

/// A map from keys to per-key state, and the discipline that applies an
/// algorithm to it.
pub trait Store<K: Key, A: Algorithm>: Debug + Send + Sync {
    /// Decides `cost` units for `key` at `now_ns` and, if admitted, consumes
    /// them; read, decide and write are atomic with respect to every other
    /// check on the same key.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::decide`], and [`CheckError::StoreFull`] for a new key
    /// past a rejecting cap; nothing is consumed or stored on error.
    fn check<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError>;

    /// The decision `check` would return, consuming and storing nothing (for
    /// a new key: the decision of a fresh key, whatever the cap).
    ///
    /// # Errors
    ///
    /// As [`Algorithm::decide`].
    fn peek<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError>;

    /// Removes every key that is idle at `now_ns` and gives back the memory
    /// they held; returns how many.
    fn evict_idle(&self, algorithm: &A, now_ns: u64) -> usize;

    /// Replaces `key`'s state with `new` if it is `current`, atomically
    /// with respect to every check of the key; returns whether it did. A
    /// key the store does not hold (never admitted, or evicted: idle) is
    /// left alone. Runs the key's `Hash`, `Eq` and `Borrow`, and the
    /// state's `PartialEq` and `Clone`, before anything changes.
    ///
    /// The primitive behind giving an admission back
    /// ([`RateLimiter::refund`](crate::RateLimiter::refund)): it succeeds
    /// only if no other admission landed on the key since `current`.
    fn compare_exchange<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        algorithm: &A,
        current: &A::State,
        new: &A::State,
    ) -> bool
    where
        A::State: PartialEq + Clone;

    /// How many keys are stored.
    fn len(&self) -> usize;

    /// Whether no key is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A kind of store, with its configuration: builds the store for keys `K`
/// and algorithm `A`.
pub trait StoreKind<K: Key, A: Algorithm>: Debug + Clone + Send + Sync + 'static {
    /// The store this kind builds.
    type Store: Store<K, A>;

    /// Builds an empty store, capped if `cap` is given.
    fn build(&self, cap: Option<KeyCap>) -> Self::Store;
}

/// The keys a store holds and may still add, shared by its shards: exact
/// under concurrency (a reservation is a compare-and-swap on one counter).
///
/// [`admit_new_key`] reserves room in it for each key it inserts; a store
/// returns the room of each key it removes through
/// [`releasing`](Population::releasing), and reports its length with
/// [`len`](Population::len).
#[derive(Debug)]
pub struct Population {
    len: crate::sync::AtomicUsize,
    cap: Option<KeyCap>,
    /// New keys that found the store full: spaces out the sweeps they run.
    found_full: crate::sync::AtomicUsize,
}

/// What [`Population::make_room`] found.
enum Room<'a> {
    Reserved(Reservation<'a>),
    Full(KeyCap),
    SweepFirst,
}

/// Room for one key, returned to the population when dropped unless
/// [`commit`](Reservation::commit)ted: a panic in user code between the
/// reservation and the insert (`Clone`, a rebuild's `Hash`) cannot leak it.
#[must_use]
struct Reservation<'a>(&'a Population);

impl Reservation<'_> {
    /// The key is stored: the room is its own.
    fn commit(self) {
        std::mem::forget(self);
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.0.release(1);
    }
}

/// Keys removed, whose room goes back to the population when this is
/// dropped (see [`Population::releasing`]): one atomic operation for a whole
/// sweep, and exact even when the sweep panics half-way.
#[must_use]
#[derive(Debug)]
pub struct Released<'a> {
    population: &'a Population,
    removed: usize,
}

impl Released<'_> {
    /// One more key removed: call it as each key leaves the store.
    pub fn add(&mut self) {
        self.removed += 1;
    }
}

impl Drop for Released<'_> {
    fn drop(&mut self) {
        self.population.release(self.removed);
    }
}

/// One attempt at a check under a store's lock.
#[derive(Debug)]
pub enum Checked {
    /// Decided.
    Done(Decision),
    /// A new key found the store full and a sweep is due: release the lock,
    /// sweep the whole store, try again.
    SweepFirst,
}

/// How a store adds a new key, for [`admit_new_key`]: three steps on what
/// the store holds under its lock (`S`).
pub struct NewKey<S, Space, Value, Insert> {
    /// What the store holds under its lock: its table and bookkeeping.
    locked: S,
    /// Makes space for one more key (a sweep, a rebuild, a resize): may run
    /// user code (`Hash`, `Clone`, `is_idle`), and nothing is owned yet. It
    /// may refuse with the check's error (the lock-free store's
    /// [`CheckError::Reclaiming`]): nothing is stored, and the room reserved
    /// under the cap goes back.
    make_space: Space,
    /// Makes what the store keeps beside the key from the key's first state
    /// (its cell, or the state itself).
    value: Value,
    /// Stores the key and its value. The crate's stores run no user code
    /// here; a store whose map does may let it panic, provided the panic
    /// leaves nothing stored (the reservation, committed only after this
    /// returns, then goes back).
    insert: Insert,
}

impl<S, Space, Value, Insert> std::fmt::Debug for NewKey<S, Space, Value, Insert> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewKey").finish_non_exhaustive()
    }
}

impl<S, Space, Value, Insert> NewKey<S, Space, Value, Insert> {
    /// The steps, in their order; the bounds give the closures their types.
    pub const fn new<K, State, V>(
        locked: S,
        make_space: Space,
        value: Value,
        insert: Insert,
    ) -> Self
    where
        Space: FnOnce(&mut S) -> Result<(), CheckError>,
        Value: FnOnce(State) -> V,
        Insert: FnOnce(&mut S, K, V),
    {
        Self {
            locked,
            make_space,
            value,
            insert,
        }
    }
}

/// The new-key protocol, written once for every store. Runs under the lock
/// that serialises inserts of the key, after a lookup found it absent:
///
/// 1. decide as a fresh key: a fresh state has its whole burst, so a valid
///    cost is admitted, and an invalid one returns here, before anything is
///    stored, as does a denial (a fresh state an algorithm from outside the
///    crate makes may deny: an absent key decides the same);
/// 2. reserve room under the cap, or answer with the cap's policy, or ask
///    for a whole-store sweep first (see [`Population::make_room`]);
/// 3. make space, build the key's first state (the fresh decision applied)
///    and its value, copy the key, and insert the two. Every step that runs
///    user code comes before the insert, so a panic stores nothing, and the
///    reservation, committed only after the insert, goes back. The value is
///    [`Held`] while the key is copied.
///
/// The key is decided here, before anyone else can find it, so a store
/// returns this decision for it.
///
/// # Errors
///
/// As [`Algorithm::decide`], and [`CheckError::StoreFull`] for a new key
/// past a rejecting cap; nothing is stored then.
pub fn admit_new_key<K, Q, A, S, V>(
    population: &Population,
    algorithm: &A,
    key: &Q,
    now_ns: u64,
    cost: u32,
    swept: bool,
    new_key: NewKey<
        S,
        impl FnOnce(&mut S) -> Result<(), CheckError>,
        impl FnOnce(A::State) -> V,
        impl FnOnce(&mut S, K, V),
    >,
) -> Result<Checked, CheckError>
where
    Q: Lookup<K> + ?Sized,
    A: Algorithm,
{
    let mut locked = new_key.locked;
    let mut state = Held::new(A::State::default());
    let fresh = algorithm.decide(state.get(), now_ns, cost)?;
    let decision = fresh.decision();
    let Verdict::Allow { admission, .. } = fresh else {
        // A fresh state that denies (an algorithm defined outside the
        // crate may start empty) is what an absent key already decides:
        // storing it would change nothing but spend room.
        return Ok(Checked::Done(decision));
    };
    match population.make_room(swept) {
        Room::Reserved(reservation) => {
            if let Err(refused) = (new_key.make_space)(&mut locked) {
                // Refused for now (the room reserved goes back with
                // `reservation`): a cap that admits untracked keys admits
                // this one too, as it would past the cap.
                return match population.cap {
                    Some(cap) if cap.when_full == WhenFull::AdmitUntracked => {
                        Ok(Checked::Done(decision))
                    }
                    _ => Err(refused),
                };
            }
            algorithm.admit(state.get_mut(), admission);
            let value = Held::new((new_key.value)(state.take()));
            let owned = key.to_owned();
            (new_key.insert)(&mut locked, owned, value.take());
            reservation.commit();
            Ok(Checked::Done(decision))
        }
        Room::Full(cap) => cap.outcome(decision).map(Checked::Done),
        Room::SweepFirst => Ok(Checked::SweepFirst),
    }
}

/// The verdict for a key with no state (absent, or evicted: idle, so as
/// good as fresh). The fresh state is [`Held`]: its `Drop` is user code.
///
/// # Errors
///
/// As [`Algorithm::decide`].
pub fn decide_fresh<A: Algorithm>(
    algorithm: &A,
    now_ns: u64,
    cost: u32,
) -> Result<Verdict<A::Admission>, CheckError> {
    algorithm.decide(Held::new(A::State::default()).get(), now_ns, cost)
}

/// The growth sweeps' horizon: keys idle at this instant have rested for
/// the algorithm's whole rest time, so a key between two requests is never
/// evicted only to be inserted again.
#[must_use]
pub fn rested_at<A: Algorithm>(algorithm: &A, now_ns: u64) -> u64 {
    now_ns.saturating_sub(algorithm.rest_ns())
}

/// A value held across user code that may panic. If it does, the value is
/// dropped with any panic of its own `Drop` caught and discarded: a second
/// panic while the first unwinds would abort the process.
#[derive(Debug)]
pub struct Held<T>(Option<T>);

impl<T> Held<T> {
    /// Holds `value`.
    pub const fn new(value: T) -> Self {
        Self(Some(value))
    }

    /// The value.
    ///
    /// # Panics
    ///
    /// Never: only `take` empties the holder, and it consumes it.
    #[must_use]
    pub fn get(&self) -> &T {
        self.0.as_ref().expect("held until taken")
    }

    /// The value, to change.
    ///
    /// # Panics
    ///
    /// Never: only `take` empties the holder, and it consumes it.
    pub fn get_mut(&mut self) -> &mut T {
        self.0.as_mut().expect("held until taken")
    }

    /// The value, no longer held.
    ///
    /// # Panics
    ///
    /// Never: only `take` empties the holder, and it consumes it.
    #[must_use]
    pub fn take(mut self) -> T {
        self.0.take().expect("held until taken")
    }
}

impl<T> Drop for Held<T> {
    fn drop(&mut self) {
        if let Some(value) = self.0.take() {
            drop(catch_unwind(AssertUnwindSafe(move || drop(value))));
        }
    }
}

/// Runs `attempt` (which takes its shard's lock itself, and is told whether
/// the store was just swept); when it asks, sweeps the whole store with
/// `sweep_store` (no shard lock held; it returns how many keys it removed)
/// and tries once more. Told that the store was swept, [`admit_new_key`]
/// never asks again, so the loop ends.
///
/// # Errors
///
/// Those of `attempt`.
///
/// # Panics
///
/// If `attempt` asks for a sweep again after being told the store was
/// swept: it did not pass that on to [`admit_new_key`]. A store bug, which
/// would otherwise loop for ever.
pub fn retry_after_sweep(
    population: &Population,
    mut attempt: impl FnMut(bool) -> Result<Checked, CheckError>,
    sweep_store: impl FnOnce() -> usize,
) -> Result<Decision, CheckError> {
    let mut sweep_store = Some(sweep_store);
    loop {
        let swept = sweep_store.is_none();
        match attempt(swept)? {
            Checked::Done(decision) => return Ok(decision),
            Checked::SweepFirst => {
                let sweep_store = sweep_store
                    .take()
                    .expect("a sweep asked for after the store was swept: pass `swept` on");
                let scanned = population.len();
                population.swept(sweep_store(), scanned);
            }
        }
    }
}

impl Population {
    /// No keys yet, under `cap` if one is given.
    #[must_use]
    pub fn new(cap: Option<KeyCap>) -> Self {
        Self {
            len: crate::sync::AtomicUsize::new(0),
            cap,
            found_full: crate::sync::AtomicUsize::new(0),
        }
    }

    /// Reserves room for a new key. `Room::SweepFirst` asks the caller to
    /// release its shard, sweep the whole store (`Store::evict_idle`),
    /// report it with `swept`, and try again once (see `retry_after_sweep`).
    ///
    /// Sweeps are spaced so that a flood cannot make every request pay for
    /// the whole store: one in every `len / SWEEP_SPACING + 1` new keys that
    /// find the store full sweeps, and a sweep that freed at least
    /// `len / SWEEP_SPACING` keys makes the next one due at once (the keys it
    /// freed already paid for it). A new key so costs amortized
    /// `O(SWEEP_SPACING)` slot visits, never `O(len)`.
    fn make_room(&self, swept_already: bool) -> Room<'_> {
        match self.reserve() {
            Ok(reservation) => Room::Reserved(reservation),
            Err(cap) if swept_already => Room::Full(cap),
            Err(cap) => {
                // Relaxed: a spacing counter; racing increments only change
                // which new key runs the sweep.
                let found_full = self.found_full.fetch_add(1, crate::sync::Ordering::Relaxed);
                if found_full % (self.len() / SWEEP_SPACING + 1) == 0 {
                    Room::SweepFirst
                } else {
                    Room::Full(cap)
                }
            }
        }
    }

    /// Records a whole-store sweep that freed `freed` of `scanned` keys.
    fn swept(&self, freed: usize, scanned: usize) {
        if freed > 0 && freed >= scanned / SWEEP_SPACING {
            self.found_full.store(0, crate::sync::Ordering::Relaxed);
        }
    }

    /// Reserves room for one more key; the cap when it is reached.
    fn reserve(&self) -> Result<Reservation<'_>, KeyCap> {
        use crate::sync::Ordering;
        let Some(cap) = self.cap else {
            // Relaxed: a statistic with no cap to enforce.
            self.len.fetch_add(1, Ordering::Relaxed);
            return Ok(Reservation(self));
        };
        // Relaxed: the count guards no other data; the CAS alone makes the
        // reservations exact (at most `max_keys` succeed).
        self.len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |len| {
                (len < cap.max_keys.get()).then(|| len + 1)
            })
            .map(|_| Reservation(self))
            .map_err(|_| cap)
    }

    /// A count of keys removed, whose room goes back when it is dropped,
    /// also when a panic unwinds: a sweep runs the algorithm's `is_idle`
    /// (user code) between removals, and counts each as it makes it.
    pub fn releasing(&self) -> Released<'_> {
        Released {
            population: self,
            removed: 0,
        }
    }

    /// Returns `removed` keys' room.
    fn release(&self, removed: usize) {
        if removed > 0 {
            self.len.fetch_sub(removed, crate::sync::Ordering::Relaxed);
        }
    }

    /// How many keys are held: exact once no insert or removal is in
    /// flight.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len.load(crate::sync::Ordering::Relaxed)
    }

    /// Whether no key is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a store discarded (evicted keys, replaced tables), dropped when this
/// is, after the store's locks are released: declared before a lock is
/// taken, it is dropped after the lock's guard even when a panic unwinds.
/// Each item is dropped on its own, in parts ([`Discard`]), and a panic in
/// a `Drop` is caught and discarded: the store's state is consistent, the request that triggered
/// the eviction was decided already, and there is no caller the panic
/// belongs to (see "User code" above). Caught one item at a time, two
/// panicking `Drop`s, or one during another panic's unwinding, do not abort
/// the process.
struct Discarded<T: Discard>(Vec<T>);

/// Something a store discards: dropped in parts, each under its own
/// `catch_unwind`, so that two panicking parts (a key's `Drop` and its
/// state's) cannot abort the process, as drop glue would, dropping the
/// second while the first unwinds. Returns the first panic.
trait Discard {
    fn discard(self) -> Option<Box<dyn std::any::Any + Send>>;
}

impl<T: Discard> Discarded<T> {
    const fn new() -> Self {
        Self(Vec::new())
    }

    fn push(&mut self, item: T) {
        self.0.push(item);
    }

    // The lock-free store's: shuttle builds only the mutex stores.
    #[cfg(not(feature = "shuttle"))]
    fn extend(&mut self, items: impl IntoIterator<Item = T>) {
        self.0.extend(items);
    }
}

impl<T: Discard> Drop for Discarded<T> {
    fn drop(&mut self) {
        for item in self.0.drain(..) {
            // The payload of a caught panic is dropped here too; a payload
            // whose own `Drop` panics aborts, as a double panic does anywhere.
            drop(item.discard());
        }
    }
}

/// Drops a key and the value stored beside it, each on its own: if the
/// key's `Drop` panics, the value is still dropped, and a panic in its
/// `Drop` too cannot abort the process (drop glue would drop the value
/// while the key's panic unwinds). Returns the first panic.
fn drop_pair<K, V>(key: K, value: V) -> Option<Box<dyn std::any::Any + Send>> {
    let key = catch_unwind(AssertUnwindSafe(move || drop(key)));
    let value = catch_unwind(AssertUnwindSafe(move || drop(value)));
    key.err().or(value.err())
}

/// Resumes the first panic a store caught while dropping its keys, once
/// every key is dropped: it reaches whoever dropped the store. Unless a panic
/// is unwinding already: a second would abort, so this one is discarded.
fn resume_first_panic(first_panic: Option<Box<dyn std::any::Any + Send>>) {
    if let Some(panic) = first_panic {
        if !std::thread::panicking() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// How often a new key that finds the store full may sweep the store for
/// idle keys (see `Population::make_room`).
const SWEEP_SPACING: usize = 8;

/// The default shard count: four per available core, a power of two.
fn default_shards() -> usize {
    std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .saturating_mul(4)
        .next_power_of_two()
}

/// The shard of `hash` among `shards` (a power of two). Bits 32 and up pick
/// the shard; the lock-free table's home bucket uses the low 32 bits and
/// its control byte the top 7 (of the hash mixed, `table::mix`), and a
/// mutex shard's `HashMap` its own, so the choices stay independent.
#[inline]
fn shard_index(hash: u64, shards: usize) -> usize {
    // The mask keeps the index below the shard count: truncation is the
    // point.
    #[allow(clippy::cast_possible_truncation)]
    let high = (hash >> 32) as usize;
    high & (shards - 1)
}
