//! The pieces the crate's stores are built from, for a store written
//! outside the crate (a backend on another map) to keep the same promises
//! without writing them again.
//!
//! **For backend implementers, and under no semver promise**: these items
//! are hidden from the crate's documentation, and may change in any
//! release. A user of the crate's stores has no reason to touch them.
//!
//! * [`Population`], the exact count of keys under a
//!   [`KeyCap`](super::KeyCap);
//! * [`admit_new_key`], the new-key protocol (decide as a fresh key,
//!   reserve room under the cap, insert), and [`retry_after_sweep`], which
//!   sweeps the whole store when a new key finds it full;
//! * [`decide_fresh`] (an absent key's decision), [`rested_at`] (the
//!   horizon of a sweep before growth) and [`Held`] (a value held across
//!   user code that may panic).
//!
//! The crate's [`Cell`](crate::cell::Cell)s, public and documented, apply
//! an algorithm's arithmetic to one key's state and retire it, so that
//! eviction loses no admission. The stores on papaya, scc and flurry in the
//! repository's `peers` crate are built from these pieces, and pass the
//! conformance suite.

pub use super::discard::Held;
use super::{ChangeError, Generation, KeyCap, Lookup, WhenFull};
use crate::algorithm::{Algorithm, Carry, CarryAt, Verdict};
use crate::decision::Decision;
use crate::error::CheckError;

/// The keys a store holds and may still add, shared by its shards: exact
/// under concurrency (reserving room is a compare-and-swap on one counter).
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

/// What [`Population::make_room`] found for a new key.
enum MadeRoom<'a> {
    /// Room under the cap, reserved.
    Reserved(ReservedRoom<'a>),
    /// None: the cap, whose policy answers.
    Full(KeyCap),
    /// None yet: the caller sweeps the whole store and asks again.
    SweepFirst,
}

/// Room for one key, returned to the population when dropped unless
/// [`commit`](ReservedRoom::commit)ted: a panic in user code between
/// reserving the room and the insert (`Clone`, a rebuild's `Hash`) cannot
/// leak it.
#[must_use]
struct ReservedRoom<'a>(&'a Population);

impl ReservedRoom<'_> {
    /// The key is stored: the room is its own.
    fn commit(self) {
        std::mem::forget(self);
    }
}

impl Drop for ReservedRoom<'_> {
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
    pub(super) removed: usize,
}

impl Released<'_> {
    /// Counts one more key removed: call it as each key leaves the store.
    pub fn add(&mut self) {
        self.removed += 1;
    }
}

impl Drop for Released<'_> {
    fn drop(&mut self) {
        self.population.release(self.removed);
    }
}

/// The outcome of one attempt at a check under a store's lock (see
/// [`retry_after_sweep`]).
#[derive(Debug)]
pub enum Attempt {
    /// The check is decided: the decision to return.
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
    /// leaves nothing stored (the reserved room, committed only after this
    /// returns, then goes back).
    insert: Insert,
}

impl<S, Space, Value, Insert> std::fmt::Debug for NewKey<S, Space, Value, Insert> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewKey").finish_non_exhaustive()
    }
}

impl<S, Space, Value, Insert> NewKey<S, Space, Value, Insert> {
    /// Creates the steps, in their order; the bounds give the closures their
    /// types.
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
///    for a whole-store sweep first (see [`retry_after_sweep`]);
/// 3. make space, build the key's first state (the fresh decision applied)
///    and its value, copy the key, and insert the two. Every step that runs
///    user code comes before the insert, so a panic stores nothing, and the
///    reserved room, committed only after the insert, goes back. The value is
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
) -> Result<Attempt, CheckError>
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
        return Ok(Attempt::Done(decision));
    };
    match population.make_room(swept) {
        MadeRoom::Reserved(room) => {
            if let Err(refused) = (new_key.make_space)(&mut locked) {
                // Refused for now (the room reserved goes back with
                // `room`): a cap that admits untracked keys admits
                // this one too, as it would past the cap.
                return match population.cap {
                    Some(cap) if cap.when_full == WhenFull::AdmitUntracked => {
                        Ok(Attempt::Done(decision))
                    }
                    _ => Err(refused),
                };
            }
            algorithm.admit(state.get_mut(), admission);
            let value = Held::new((new_key.value)(state.take()));
            let owned = key.to_owned();
            (new_key.insert)(&mut locked, owned, value.take());
            room.commit();
            Ok(Attempt::Done(decision))
        }
        MadeRoom::Full(cap) => cap.outcome(decision).map(Attempt::Done),
        MadeRoom::SweepFirst => Ok(Attempt::SweepFirst),
    }
}

/// Decides for a key with no state (absent, or evicted: idle, so as
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

/// Checks that `from`'s states can be carried to `to` by `carry`, before a
/// store's [`change`](super::Store::change) touches anything: the
/// algorithm implements [`Algorithm::carry`], and no check has carried a
/// quota of its own on `from`'s states unless `carry` keeps them
/// unchanged.
///
/// # Errors
///
/// [`ChangeError::Unsupported`] and [`ChangeError::CarriedQuotas`].
pub fn check_carries<A: Algorithm>(
    from: &Generation<A>,
    to: &Generation<A>,
    carry: Carry,
    at: CarryAt,
) -> Result<(), ChangeError> {
    if carry != Carry::Unchanged && from.has_carried() {
        return Err(ChangeError::CarriedQuotas);
    }
    let fresh = Held::new(A::State::default());
    from.algorithm()
        .carry(to.algorithm(), carry, fresh.get(), at)
        .map(drop)
        .ok_or(ChangeError::Unsupported)
}

/// The strategy a change from `from` to `to` carries a shard's states by,
/// read once they can no longer change: `carry`, or [`Carry::Unchanged`] if
/// a check carrying a quota of its own has written to `from`'s states
/// meanwhile (the first such check, racing the change: its key is not the
/// limiter's quota's to rescale), and then `to` is marked too, so that
/// later changes keep every state unchanged.
pub fn carry_for<A: Algorithm>(from: &Generation<A>, to: &Generation<A>, carry: Carry) -> Carry {
    crate::sync::seq_cst_fence();
    if from.has_carried()
        && !crate::sync::canary::planted(crate::sync::canary::Canary::CarryIgnoresMark)
    {
        to.mark_carried();
        Carry::Unchanged
    } else {
        carry
    }
}

/// Returns the growth sweeps' horizon: keys idle at this instant have
/// rested for the algorithm's whole rest time, so a key between two
/// requests is never evicted only to be inserted again.
#[must_use]
pub fn rested_at<A: Algorithm>(algorithm: &A, now_ns: u64) -> u64 {
    now_ns.saturating_sub(algorithm.rest_ns())
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
    mut attempt: impl FnMut(bool) -> Result<Attempt, CheckError>,
    sweep_store: impl FnOnce() -> usize,
) -> Result<Decision, CheckError> {
    let mut sweep_store = Some(sweep_store);
    loop {
        let swept = sweep_store.is_none();
        match attempt(swept)? {
            Attempt::Done(decision) => return Ok(decision),
            Attempt::SweepFirst => {
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
    /// Creates an empty population, under `cap` if one is given.
    #[must_use]
    pub fn new(cap: Option<KeyCap>) -> Self {
        Self {
            len: crate::sync::AtomicUsize::new(0),
            cap,
            found_full: crate::sync::AtomicUsize::new(0),
        }
    }

    /// Reserves room for a new key. `MadeRoom::SweepFirst` asks the caller to
    /// release its shard, sweep the whole store (`Store::evict_idle`),
    /// report it with `swept`, and try again once (see `retry_after_sweep`).
    ///
    /// Sweeps are spaced so that a flood cannot make every request pay for
    /// the whole store: one in every `len / SWEEP_SPACING + 1` new keys that
    /// find the store full sweeps, and a sweep that freed at least
    /// `len / SWEEP_SPACING` keys makes the next one due at once (the keys it
    /// freed already paid for it). A new key so costs amortized
    /// `O(SWEEP_SPACING)` slot visits, never `O(len)`.
    fn make_room(&self, swept_already: bool) -> MadeRoom<'_> {
        match self.reserve_room() {
            Ok(room) => MadeRoom::Reserved(room),
            Err(cap) if swept_already => MadeRoom::Full(cap),
            Err(cap) => {
                // Relaxed: a spacing counter; racing increments only change
                // which new key runs the sweep.
                let found_full = self.found_full.fetch_add(1, crate::sync::Ordering::Relaxed);
                if found_full % (self.len() / SWEEP_SPACING + 1) == 0 {
                    MadeRoom::SweepFirst
                } else {
                    MadeRoom::Full(cap)
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
    fn reserve_room(&self) -> Result<ReservedRoom<'_>, KeyCap> {
        use crate::sync::Ordering;
        let Some(cap) = self.cap else {
            // Relaxed: a statistic with no cap to enforce.
            self.len.fetch_add(1, Ordering::Relaxed);
            return Ok(ReservedRoom(self));
        };
        // Relaxed: the count guards no other data; the CAS alone makes the
        // count exact (at most `max_keys` reserve room).
        self.len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |len| {
                (len < cap.max_keys.get()).then(|| len + 1)
            })
            .map(|_| ReservedRoom(self))
            .map_err(|_| cap)
    }

    /// Starts a count of keys removed, whose room goes back when it is
    /// dropped, also when a panic unwinds: a sweep runs the algorithm's
    /// `is_idle` (user code) between removals, and counts each as it makes
    /// it.
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

/// How often a new key that finds the store full may sweep the store for
/// idle keys (see `Population::make_room`).
const SWEEP_SPACING: usize = 8;
