//! Panic injection: a panic armed at each call of user code in turn, on
//! every store. User code is a key's `Hash`, `Eq`, `Borrow`, `Clone` (and
//! `ToOwned`) and `Drop`, the lock-free store's `BuildHasher`, and the
//! algorithm's own code (here `is_idle`, of an algorithm wrapping GCRA); the
//! workload runs it in checks and peeks, mid-rebuild (growth), mid-sweep
//! (an `evict_idle` that rebuilds the lock-free table, which clones and
//! hashes the keys it keeps) and when discarded keys are dropped.
//!
//! For every site and every call index `n` of that site in the workload, a
//! run arms a panic at the `n`-th call, and each operation is compared with
//! an untrapped reference limiter that skips the one call that panicked.
//! Every decision, every `len()` and every eviction count must be equal:
//! the panic reached its caller and changed nothing else. A final phase
//! fills the store to its cap: exactly `cap - len()` new keys are admitted,
//! so no room was leaked. Keys dropped by the store (evicted ones, a rebuilt
//! table's old copies) never reach a caller: their panics are caught and
//! discarded, and the store's state is unaffected. Keys dropped with the
//! limiter panic in the dropper, after every other key is dropped.

// Ordinary tests use std's primitives; under the model-checking features the
// crate's primitives are loom's or shuttle's, usable only inside a model.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

use std::borrow::Borrow;
use std::cell::Cell;
use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher};
use std::num::NonZeroUsize;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use tollgate::algorithm::{Algorithm, Gcra, GcraState, PackedAlgorithm, Verdict};
use tollgate::cell::{Atomic, CellFor, Locked, Preferred};
use tollgate::clock::ManualClock;
use tollgate::store::{GlobalMutex, LockFree, PerKey, Sharded, StoreKind, WhenFull};
use tollgate::{Builder, CheckError, Decision, Quota, RateLimiter};

/// A call of user code the tests can arm a panic at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Site {
    BuildHasher,
    Hash,
    Eq,
    Borrow,
    Clone,
    Drop,
    IsIdle,
    Decide,
    Admit,
    StateDefault,
    StateDrop,
}

const SITES: [Site; 11] = [
    Site::BuildHasher,
    Site::Hash,
    Site::Eq,
    Site::Borrow,
    Site::Clone,
    Site::Drop,
    Site::IsIdle,
    Site::Decide,
    Site::Admit,
    Site::StateDefault,
    Site::StateDrop,
];

thread_local! {
    // Thread-local: each test runs its limiters on its own thread, and the
    // stores run user code on the calling thread, so parallel tests do not
    // see each other's traps.
    static ARMED: Cell<Option<(Site, u64)>> = const { Cell::new(None) };
    static CALLS: Cell<[u64; 11]> = const { Cell::new([0; 11]) };
    static LIVE_KEYS: Cell<i64> = const { Cell::new(0) };
}

/// Keeps the default panic message for every panic but the traps', which
/// the stores catch and discard by design (a key's `Drop`) or which the
/// tests catch: thousands of them would bury a real failure's message.
fn quiet_traps() {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let trap = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|message| message.starts_with("trap: "));
            if !trap {
                default(info);
            }
        }));
    });
}

/// Records a call of `site`; panics if it is the armed one.
fn reached(site: Site) {
    CALLS.with(|calls| {
        let mut counts = calls.get();
        counts[site as usize] += 1;
        calls.set(counts);
    });
    if let Some((armed, left)) = ARMED.get() {
        if armed == site {
            if left == 0 {
                ARMED.set(None);
                panic!("trap: {site:?}");
            }
            ARMED.set(Some((armed, left - 1)));
        }
    }
}

/// The borrowed form of [`Key`]: its `Hash`, `Eq` and `ToOwned` are traps.
/// Not `Clone`, so that its `ToOwned` is this one.
#[derive(Debug)]
struct Id(u64);

impl Hash for Id {
    fn hash<H: Hasher>(&self, state: &mut H) {
        reached(Site::Hash);
        self.0.hash(state);
    }
}

impl PartialEq for Id {
    fn eq(&self, other: &Self) -> bool {
        reached(Site::Eq);
        self.0 == other.0
    }
}

impl Eq for Id {}

impl ToOwned for Id {
    type Owned = Key;
    fn to_owned(&self) -> Key {
        reached(Site::Clone);
        Key::new(self.0)
    }
}

/// A key whose every trait method is a trap, and which counts its live
/// copies.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Key {
    id: Id,
}

impl Key {
    fn new(id: u64) -> Self {
        LIVE_KEYS.set(LIVE_KEYS.get() + 1);
        Self { id: Id(id) }
    }
}

impl Clone for Key {
    fn clone(&self) -> Self {
        reached(Site::Clone);
        Self::new(self.id.0)
    }
}

impl Borrow<Id> for Key {
    fn borrow(&self) -> &Id {
        reached(Site::Borrow);
        &self.id
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        LIVE_KEYS.set(LIVE_KEYS.get() - 1);
        reached(Site::Drop);
    }
}

/// A `BuildHasher` that is a trap.
#[derive(Debug, Clone, Copy, Default)]
struct TrapHasher;

impl BuildHasher for TrapHasher {
    type Hasher = DefaultHasher;
    fn build_hasher(&self) -> DefaultHasher {
        reached(Site::BuildHasher);
        DefaultHasher::new()
    }
}

/// GCRA whose `decide`, `admit` and `is_idle` are traps: an algorithm is
/// user code too, and the stores call `is_idle` while they sweep. Packed,
/// so its cells are atomic; its state is GCRA's (`Copy`).
#[derive(Debug)]
struct TrapGcra(Gcra);

impl Algorithm for TrapGcra {
    type State = GcraState;
    type Admission = GcraState;

    fn from_quota(quota: &Quota) -> Self {
        Self(Gcra::from_quota(quota))
    }
    fn capacity(&self) -> u32 {
        self.0.capacity()
    }
    fn decide(
        &self,
        state: &GcraState,
        now_ns: u64,
        cost: u32,
    ) -> Result<Verdict<GcraState>, CheckError> {
        reached(Site::Decide);
        self.0.decide(state, now_ns, cost)
    }
    fn admit(&self, state: &mut GcraState, admission: GcraState) {
        reached(Site::Admit);
        self.0.admit(state, admission);
    }
    fn is_idle(&self, state: &GcraState, now_ns: u64) -> bool {
        reached(Site::IsIdle);
        self.0.is_idle(state, now_ns)
    }
    fn rest_ns(&self) -> u64 {
        self.0.rest_ns()
    }
}

impl PackedAlgorithm for TrapGcra {
    fn pack(&self, state: &GcraState) -> u64 {
        self.0.pack(state)
    }
    fn unpack(&self, word: u64) -> GcraState {
        self.0.unpack(word)
    }
}

impl CellFor<TrapGcra> for Preferred {
    type Cell = Atomic<TrapGcra>;
}

/// GCRA whose state's `Default` and `Drop` are traps too, in a mutex cell
/// (`Locked`): the state a store keeps, evicts, moves and drops is user
/// code.
#[derive(Debug)]
struct TrapLocked(TrapGcra);

#[derive(Debug)]
struct TrapState(GcraState);

impl Default for TrapState {
    fn default() -> Self {
        reached(Site::StateDefault);
        Self(GcraState::default())
    }
}

impl Drop for TrapState {
    fn drop(&mut self) {
        reached(Site::StateDrop);
    }
}

impl Algorithm for TrapLocked {
    type State = TrapState;
    type Admission = GcraState;

    fn from_quota(quota: &Quota) -> Self {
        Self(TrapGcra::from_quota(quota))
    }
    fn capacity(&self) -> u32 {
        self.0.capacity()
    }
    fn decide(
        &self,
        state: &TrapState,
        now_ns: u64,
        cost: u32,
    ) -> Result<Verdict<GcraState>, CheckError> {
        self.0.decide(&state.0, now_ns, cost)
    }
    fn admit(&self, state: &mut TrapState, admission: GcraState) {
        self.0.admit(&mut state.0, admission);
    }
    fn is_idle(&self, state: &TrapState, now_ns: u64) -> bool {
        self.0.is_idle(&state.0, now_ns)
    }
    fn rest_ns(&self) -> u64 {
        self.0.rest_ns()
    }
}

impl CellFor<TrapLocked> for Preferred {
    type Cell = Locked<TrapLocked>;
}

/// One step of the workload.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A check of `cost` units; through `&Key` (`Borrow<Key>`, `Clone`) or
    /// through `&Id` (`Borrow<Id>`, `ToOwned`).
    Check {
        key: u64,
        cost: u32,
        by_key: bool,
    },
    Peek(u64),
    Advance(Duration),
    Evict,
}

const MINUTE: Duration = Duration::from_secs(60);

/// Three an hour (a burst of 3, one per 20 minutes, rested after an hour).
/// At 0: keys 0..24, four checks each (a denial each), with peeks; at
/// 1 h 59 min: keys 24..28, busy at 2 h; at 2 h: `evict_idle` evicts keys
/// 0..24 and compacts the lock-free table around keys 24..28 (clones and
/// hashes them); then keys 40..60, four checks each, and a last eviction
/// that finds nothing idle.
fn workload() -> Vec<Op> {
    let mut ops = Vec::new();
    let round = |ops: &mut Vec<Op>, keys: std::ops::Range<u64>, rounds: u32| {
        for round in 0..rounds {
            for key in keys.clone() {
                ops.push(Op::Check {
                    key,
                    cost: 1 + u32::from(key % 5 == 0 && round == 0),
                    by_key: (key + u64::from(round)) % 2 == 0,
                });
                if key % 3 == 0 {
                    ops.push(Op::Peek(key));
                }
            }
        }
    };
    round(&mut ops, 0..24, 4);
    ops.push(Op::Advance(119 * MINUTE));
    round(&mut ops, 24..28, 1);
    ops.push(Op::Advance(MINUTE));
    ops.push(Op::Evict);
    round(&mut ops, 40..60, 4);
    ops.push(Op::Evict);
    ops
}

const CAP: usize = 40;

fn quota() -> Quota {
    Quota::per_hour(3).unwrap()
}

/// A trapped limiter on `store`, capped at `CAP`.
fn trapped<A: Algorithm, S: StoreKind<Key, A>>(
    store: S,
    clock: &ManualClock,
) -> RateLimiter<Key, A, ManualClock, S> {
    Builder::new(quota())
        .algorithm::<A>()
        .store(store)
        .clock(clock.clone())
        .max_keys(NonZeroUsize::new(CAP).unwrap(), WhenFull::Reject)
        .build()
}

/// What one operation returned.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Decision(Result<Decision, CheckError>),
    Evicted(usize),
    Nothing,
}

/// Runs the workload on `store` with a panic armed at the `n`-th call of
/// `site` (or none), comparing every operation with the reference. Returns
/// how many operations panicked, and how many calls each site saw while
/// armed.
fn run<A: Algorithm, S: StoreKind<Key, A>>(
    store: S,
    armed: Option<(Site, u64)>,
) -> (usize, [u64; SITES.len()]) {
    let ops = workload();
    // The keys `by_key` checks borrow: made before arming, dropped after.
    let keys: Vec<Key> = (0..60).map(Key::new).collect();
    let clock = ManualClock::new();
    let limiter = trapped::<A, S>(store, &clock);
    let reference_clock = ManualClock::new();
    let reference = Builder::new(quota())
        .store(GlobalMutex)
        .clock(reference_clock.clone())
        .build::<u64>();
    CALLS.set([0; SITES.len()]);
    ARMED.set(armed);
    let mut panicked = 0;
    for (step, op) in ops.iter().enumerate() {
        let outcome = catch_unwind(AssertUnwindSafe(|| match *op {
            Op::Check { key, cost, by_key } => Outcome::Decision(if by_key {
                limiter.check_n(&keys[key as usize], cost)
            } else {
                limiter.check_n(&Id(key), cost)
            }),
            Op::Peek(key) => Outcome::Decision(limiter.peek(&Id(key))),
            Op::Advance(by) => {
                clock.advance(by);
                Outcome::Nothing
            }
            Op::Evict => Outcome::Evicted(limiter.evict_idle()),
        }));
        let Ok(outcome) = outcome else {
            panicked += 1;
            assert_eq!(
                ARMED.get(),
                None,
                "step {step}: a panic that was not the trap"
            );
            // A panic in `evict_idle` came from the algorithm's `is_idle`
            // mid-sweep (some keys evicted, some not yet), or from rebuilding
            // a table after every shard was swept (cloning and hashing the
            // keys it keeps). Either way the next `evict_idle` finishes the
            // job, and then the counts must agree with the reference's.
            if let Op::Evict = op {
                limiter.evict_idle();
                reference.evict_idle();
            }
            assert_eq!(
                limiter.len(),
                reference.len(),
                "step {step}: len after the panic"
            );
            continue;
        };
        let expected = match *op {
            Op::Check { key, cost, .. } => Outcome::Decision(reference.check_n(&key, cost)),
            Op::Peek(key) => Outcome::Decision(reference.peek(&key)),
            Op::Advance(by) => {
                reference_clock.advance(by);
                Outcome::Nothing
            }
            Op::Evict => Outcome::Evicted(reference.evict_idle()),
        };
        assert_eq!(outcome, expected, "step {step}: {op:?}, armed {armed:?}");
        assert_eq!(
            limiter.len(),
            reference.len(),
            "step {step}: {op:?}, armed {armed:?}"
        );
    }
    ARMED.set(None);
    let seen = CALLS.get();
    // The cap: exactly the room left is admitted, then the store is full.
    let room = CAP - limiter.len();
    for key in 0..room as u64 {
        assert!(limiter.check(&Id(1_000 + key)).unwrap().is_allowed());
    }
    assert_eq!(
        limiter.check(&Id(2_000)),
        Err(CheckError::StoreFull { max_keys: CAP }),
        "armed {armed:?}: room under the cap was leaked"
    );
    drop(limiter);
    drop(keys);
    assert_eq!(LIVE_KEYS.get(), 0, "armed {armed:?}: key copies leaked");
    (panicked, seen)
}

/// Arms every call of every site in turn on `store`, running algorithm `A`.
/// `unreached` are the sites this store and algorithm never call (the
/// mutex stores' hasher is std's; a packed state is GCRA's own); every
/// other site must be called, and each armed call must fire.
fn every_site<A: Algorithm, S: StoreKind<Key, A>>(store: &S, unreached: &[Site]) {
    quiet_traps();
    let (panicked, totals) = run::<A, S>(store.clone(), None);
    assert_eq!(panicked, 0);
    // Under Miri (`.ci/run`, the lock-free store only), three calls per
    // site: the first, one in the middle and the last; every call otherwise.
    let every = |total: u64| if cfg!(miri) { (total / 2).max(1) } else { 1 };
    for site in SITES {
        let total = totals[site as usize];
        assert_eq!(
            total == 0,
            unreached.contains(&site),
            "{store:?}: {site:?} called {total} times"
        );
        let (mut runs, mut fired) = (0, 0);
        for n in (0..total).step_by(every(total) as usize) {
            let (panicked, seen) = run::<A, S>(store.clone(), Some((site, n)));
            // The trap fires when the run reaches the site's `n`-th call.
            let reached = seen[site as usize] > n;
            runs += 1;
            fired += u64::from(reached);
            // A key's or a state's `Drop` never reaches a caller of the
            // limiter: the store drops what it discards itself, and discards
            // their panics. Every other site panics in exactly the call that
            // reached it.
            let discarded = matches!(site, Site::Drop | Site::StateDrop);
            let expected = usize::from(reached && !discarded);
            assert_eq!(panicked, expected, "{site:?} call {n} of {total}");
        }
        println!("{store:?}: {site:?}: the trap fired in {fired} runs of {runs}");
        // Every run reaches its call, as the unarmed run did, except on a
        // store whose hasher is std's, seeded at random per store: which
        // shard a key lands in, when a shard's table grows (and sweeps) and
        // which 7-bit tags match (each match an `Eq`, through a `Borrow`)
        // then vary between runs, and so do the calls of most sites. The
        // lock-free store runs on a fixed hasher here: every run fires.
        let seeded = unreached.contains(&STD_HASHER);
        if seeded {
            assert!(total == 0 || fired > 0, "{site:?}: never fired");
        } else {
            assert_eq!(fired, runs, "{site:?}: runs that never reached the call");
        }
    }
    println!("{store:?}: calls per site {totals:?}");
}

/// The sites the mutex stores never call: their hasher is std's.
const STD_HASHER: Site = Site::BuildHasher;

/// The sites a packed algorithm never calls: its state is GCRA's.
const PACKED_STATE: [Site; 2] = [Site::StateDefault, Site::StateDrop];

#[test]
fn panics_in_user_code_on_the_lock_free_store() {
    // Under Miri, one shard: the sites' calls are the same, and Miri runs
    // each test about a million times slower.
    let shards: &[usize] = if cfg!(miri) { &[1] } else { &[1, 4] };
    for &shards in shards {
        let store = LockFree::new(shards).with_hasher(TrapHasher);
        every_site::<TrapGcra, _>(&store, &PACKED_STATE);
        every_site::<TrapLocked, _>(&store, &[]);
    }
}

#[test]
fn panics_in_user_code_on_the_sharded_store() {
    every_site::<TrapGcra, _>(
        &Sharded::new(2),
        &[STD_HASHER, PACKED_STATE[0], PACKED_STATE[1]],
    );
    every_site::<TrapLocked, _>(&Sharded::new(2), &[STD_HASHER]);
}

#[test]
fn panics_in_user_code_on_the_global_mutex_store() {
    every_site::<TrapGcra, _>(
        &GlobalMutex,
        &[STD_HASHER, PACKED_STATE[0], PACKED_STATE[1]],
    );
    every_site::<TrapLocked, _>(&GlobalMutex, &[STD_HASHER]);
}

#[test]
fn panics_in_user_code_on_the_per_key_store() {
    every_site::<TrapGcra, _>(
        &PerKey::new(),
        &[STD_HASHER, PACKED_STATE[0], PACKED_STATE[1]],
    );
    every_site::<TrapLocked, _>(&PerKey::new(), &[STD_HASHER]);
}

/// A key whose `Drop` panics when the limiter is dropped: the panic reaches
/// the code dropping the limiter, after every other key copy is dropped.
fn drop_panics_reach_the_dropper<S: StoreKind<Key, TrapGcra>>(store: S) {
    quiet_traps();
    let limiter = trapped::<TrapGcra, S>(store, &ManualClock::new());
    for key in 0..30 {
        assert!(limiter.check(&Id(key)).unwrap().is_allowed());
    }
    assert_eq!(limiter.evict_idle(), 0);
    assert_eq!(LIVE_KEYS.get(), 30);
    ARMED.set(Some((Site::Drop, 7)));
    assert!(catch_unwind(AssertUnwindSafe(|| drop(limiter))).is_err());
    assert_eq!(ARMED.get(), None);
    assert_eq!(
        LIVE_KEYS.get(),
        0,
        "keys after the panicking one were not dropped"
    );
}

#[test]
fn drop_panics_reach_the_dropper_on_every_store() {
    drop_panics_reach_the_dropper(LockFree::new(1));
    drop_panics_reach_the_dropper(LockFree::new(4));
    drop_panics_reach_the_dropper(Sharded::new(2));
    drop_panics_reach_the_dropper(GlobalMutex);
    drop_panics_reach_the_dropper(PerKey::new());
}

thread_local! {
    static FRAGILE_LIVE: Cell<i64> = const { Cell::new(0) };
    /// Armed: odd keys' `Drop` panics.
    static FRAGILE_DROPS: Cell<bool> = const { Cell::new(false) };
    /// `Some(n)`: the `n`-th `Clone` (or `Hash`) from now panics.
    static FRAGILE_CLONE: Cell<Option<u64>> = const { Cell::new(None) };
    static FRAGILE_HASH: Cell<Option<u64>> = const { Cell::new(None) };
    /// `Some(id)`: every `Hash` of key `id` panics (a key holding a
    /// poisoned lock, say).
    static FRAGILE_POISONED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Counts down an armed trap; panics when it reaches zero.
fn countdown(trap: &'static std::thread::LocalKey<Cell<Option<u64>>>, what: &str) {
    match trap.get() {
        Some(0) => {
            trap.set(None);
            panic!("trap: fragile {what}");
        }
        Some(left) => trap.set(Some(left - 1)),
        None => {}
    }
}

/// A key whose copies' `Drop` panics for odd ids while armed, so that a
/// store discards several panicking keys at once, or while another panic
/// unwinds; its `Clone` and `Hash` can be armed too. The keys a test makes
/// are not fragile (their drops are the test's); the copies a store makes
/// with `Clone` are. Identity is the id alone.
#[derive(Debug)]
struct Fragile {
    id: u64,
    copy: bool,
}

impl Fragile {
    fn new(id: u64) -> Self {
        Self { id, copy: false }
    }
}

impl PartialEq for Fragile {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Fragile {}

impl Hash for Fragile {
    fn hash<H: Hasher>(&self, state: &mut H) {
        countdown(&FRAGILE_HASH, "hash");
        if FRAGILE_POISONED.get() == Some(self.id) {
            panic!("trap: poisoned hash {}", self.id);
        }
        self.id.hash(state);
    }
}

impl Clone for Fragile {
    fn clone(&self) -> Self {
        countdown(&FRAGILE_CLONE, "clone");
        FRAGILE_LIVE.set(FRAGILE_LIVE.get() + 1);
        Self {
            id: self.id,
            copy: true,
        }
    }
}

impl Drop for Fragile {
    fn drop(&mut self) {
        if self.copy {
            FRAGILE_LIVE.set(FRAGILE_LIVE.get() - 1);
            if FRAGILE_DROPS.get() && self.id % 2 == 1 {
                panic!("trap: fragile drop {}", self.id);
            }
        }
    }
}

/// Half the stored copies panic when dropped, and a `Clone` or a `Hash`
/// panics while discarded copies are about to be dropped: no store aborts
/// the process (a second panic during unwinding would), every count stays
/// exact, and every copy is dropped (`FRAGILE_LIVE` counts the store's).
fn fragile_drops_never_abort<S: StoreKind<Fragile, Gcra>>(store: S) {
    quiet_traps();
    FRAGILE_LIVE.set(0);
    FRAGILE_DROPS.set(true);
    let clock = ManualClock::new();
    let limiter = Builder::new(quota())
        .store(store)
        .clock(clock.clone())
        .build::<Fragile>();
    let check = |id: u64| {
        limiter
            .check(&Fragile::new(id))
            .map(|decision| decision.is_allowed())
    };
    // Forty keys, rested, evicted together: twenty panicking drops in one
    // batch, and a `Hash` armed for the table's tidying (the mutex stores).
    for id in 0..40 {
        assert_eq!(
            catch_unwind(AssertUnwindSafe(|| check(id))).ok(),
            Some(Ok(true))
        );
    }
    clock.advance(3 * 60 * MINUTE);
    FRAGILE_HASH.set(Some(0));
    let first = catch_unwind(AssertUnwindSafe(|| limiter.evict_idle()));
    FRAGILE_HASH.set(None);
    let second = limiter.evict_idle();
    assert_eq!(first.unwrap_or(0) + second, 40);
    assert_eq!(limiter.len(), 0);
    assert_eq!(FRAGILE_LIVE.get(), 0, "evicted copies left behind");
    // Growth: the lock-free store's rebuilds discard old copies, odd ones
    // panicking; a `Clone` armed mid-way panics in a rebuild or an insert.
    for id in 100..140 {
        assert_eq!(
            catch_unwind(AssertUnwindSafe(|| check(id))).ok(),
            Some(Ok(true))
        );
    }
    FRAGILE_CLONE.set(Some(5));
    let panicked = (200..260)
        .filter(|&id| catch_unwind(AssertUnwindSafe(|| check(id))).is_err())
        .count();
    assert_eq!(panicked, 1);
    assert_eq!(limiter.len(), 99);
    assert_eq!(limiter.evict_idle(), 0);
    assert_eq!(FRAGILE_LIVE.get(), 99, "copies beyond the store's keys");
    // Dropping the limiter: the first panic reaches the dropper, after
    // every copy is dropped.
    assert!(catch_unwind(AssertUnwindSafe(|| drop(limiter))).is_err());
    FRAGILE_DROPS.set(false);
    assert_eq!(FRAGILE_LIVE.get(), 0);
}

#[test]
fn fragile_drops_never_abort_on_any_store() {
    fragile_drops_never_abort(LockFree::new(1));
    fragile_drops_never_abort(LockFree::new(4));
    fragile_drops_never_abort(Sharded::new(2));
    fragile_drops_never_abort(GlobalMutex);
    fragile_drops_never_abort(PerKey::new());
}

/// Seven keys fill a table of eight buckets; then key 0's `Hash` panics on
/// every call, so every new key's growth (a rebuild, a resize) panics. What
/// each abandoned growth copied is freed before its panic reaches the
/// caller: the store's copies stay exactly its seven keys after every one
/// of 500 panicking inserts, not once they settle.
fn failed_growth_holds_nothing<S: StoreKind<Fragile, Gcra>>(store: S) {
    quiet_traps();
    FRAGILE_LIVE.set(0);
    let limiter = Builder::new(quota())
        .store(store)
        .clock(ManualClock::new())
        .build::<Fragile>();
    for id in 0..7 {
        assert!(limiter.check(&Fragile::new(id)).unwrap().is_allowed());
    }
    assert_eq!(FRAGILE_LIVE.get(), 7);
    FRAGILE_POISONED.set(Some(0));
    for id in 100..600 {
        let new_key = catch_unwind(AssertUnwindSafe(|| limiter.check(&Fragile::new(id))));
        assert!(
            new_key.is_err(),
            "key {id}: the table grew without hashing key 0"
        );
        assert_eq!(
            FRAGILE_LIVE.get(),
            7,
            "key {id}: copies held after the panic"
        );
        assert_eq!(limiter.len(), 7);
    }
    FRAGILE_POISONED.set(None);
    assert!(limiter.check(&Fragile::new(100)).unwrap().is_allowed());
    assert_eq!((limiter.len(), FRAGILE_LIVE.get()), (8, 8));
    drop(limiter);
    assert_eq!(FRAGILE_LIVE.get(), 0);
}

#[test]
fn failed_growth_holds_nothing_on_every_one_table_store() {
    failed_growth_holds_nothing(LockFree::new(1));
    failed_growth_holds_nothing(GlobalMutex);
    failed_growth_holds_nothing(PerKey::new());
}

/// A key whose `Drop` panics, evicted with a state whose `Drop` panics too:
/// the store drops them each on its own, so the second panic does not
/// abort the process (drop glue would drop the state while the key's panic
/// unwinds), and both are discarded.
fn key_and_state_drops_panic_together<S: StoreKind<Fragile, TrapLocked>>(store: S) {
    quiet_traps();
    FRAGILE_LIVE.set(0);
    let clock = ManualClock::new();
    let limiter = Builder::new(quota())
        .algorithm::<TrapLocked>()
        .store(store)
        .clock(clock.clone())
        .build::<Fragile>();
    assert!(limiter.check(&Fragile::new(1)).unwrap().is_allowed());
    clock.advance(3 * 60 * MINUTE);
    FRAGILE_DROPS.set(true);
    ARMED.set(Some((Site::StateDrop, 0)));
    assert_eq!(limiter.evict_idle(), 1);
    assert_eq!(ARMED.get(), None, "the state's Drop was not called");
    FRAGILE_DROPS.set(false);
    assert_eq!((limiter.len(), FRAGILE_LIVE.get()), (0, 0));
}

#[test]
fn key_and_state_drops_panic_together_on_every_store() {
    key_and_state_drops_panic_together(LockFree::new(1));
    key_and_state_drops_panic_together(Sharded::new(2));
    key_and_state_drops_panic_together(GlobalMutex);
    key_and_state_drops_panic_together(PerKey::new());
}

/// Puts key `id` in shard `id % 4` of a 4-shard lock-free store (the shard
/// is bits 32 and 33 of the hash), the rest of the hash mixed.
#[derive(Debug, Clone, Copy, Default)]
struct ShardById;

#[derive(Default)]
struct ShardByIdHasher(u64);

impl Hasher for ShardByIdHasher {
    fn finish(&self) -> u64 {
        let mixed = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (mixed & !(3 << 32)) | ((self.0 % 4) << 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }
    fn write_u64(&mut self, id: u64) {
        self.0 = id;
    }
}

impl BuildHasher for ShardById {
    type Hasher = ShardByIdHasher;
    fn build_hasher(&self) -> ShardByIdHasher {
        ShardByIdHasher::default()
    }
}

/// `evict_idle` evicts 199 of 200 keys across four shards, then compacts
/// each shard. Shard 0 holds key 0, busy, whose `Hash` panics: its rebuild
/// fails, and the panic reaches the caller, but only after shards 1 to 3
/// are compacted: their 150 evicted keys are freed, and shard 0's 49 stay
/// until a later `evict_idle` compacts it.
#[test]
fn a_panicking_shard_does_not_stop_compaction_of_the_others() {
    quiet_traps();
    FRAGILE_LIVE.set(0);
    let clock = ManualClock::new();
    let limiter = Builder::new(quota())
        .store(LockFree::new(4).with_hasher(ShardById))
        .clock(clock.clone())
        .build::<Fragile>();
    for id in 0..200 {
        assert!(limiter.check(&Fragile::new(id)).unwrap().is_allowed());
    }
    clock.advance(3 * 60 * MINUTE);
    assert!(limiter.check(&Fragile::new(0)).unwrap().is_allowed());
    FRAGILE_POISONED.set(Some(0));
    assert!(catch_unwind(AssertUnwindSafe(|| limiter.evict_idle())).is_err());
    assert_eq!(limiter.len(), 1);
    assert_eq!(
        FRAGILE_LIVE.get(),
        1 + 49,
        "evicted copies left in shards 1 to 3"
    );
    FRAGILE_POISONED.set(None);
    assert_eq!(limiter.evict_idle(), 0);
    assert_eq!(FRAGILE_LIVE.get(), 1);
}

/// A quota change whose clock panics after the per-key store retired its
/// cells, and one whose replaced states' `Drop` panics on a mutex store:
/// each leaves every key live and under one generation.
mod changes {
    use std::cell::Cell;
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use tollgate::algorithm::{Algorithm, Carry, CarryAt, Gcra, GcraState, Verdict};
    use tollgate::cell::{CellFor, Locked, Preferred};
    use tollgate::clock::{Clock, ManualClock};
    use tollgate::store::{GlobalMutex, LockFree, PerKey, StoreKind};
    use tollgate::{Builder, CheckError, LayoutError, Quota, RateLimiter};

    /// A manual clock whose `n`-th reading from now on panics.
    struct Flaky {
        inner: ManualClock,
        readings: AtomicU64,
        panic_at: AtomicU64,
    }

    impl Clock for Flaky {
        fn now_ns(&self) -> u64 {
            let n = self.readings.fetch_add(1, Ordering::SeqCst);
            if n == self.panic_at.load(Ordering::SeqCst) {
                panic!("clock source unavailable");
            }
            self.inner.now_ns()
        }
        fn ordered(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_clock_panicking_mid_change_leaves_per_key_cells_live() {
        let clock = Arc::new(Flaky {
            inner: ManualClock::new(),
            readings: AtomicU64::new(0),
            panic_at: AtomicU64::new(u64::MAX),
        });
        let limiter = Arc::new(
            Builder::new(Quota::per_minute(10).unwrap())
                .clock(Arc::clone(&clock))
                .store(PerKey::new())
                .build::<String>(),
        );
        assert!(limiter.check("alice").unwrap().is_allowed());
        // set_quota reads the clock in `check_carries` (1st) and again once
        // every cell is retired (2nd): panic on the 2nd.
        let next = clock.readings.load(Ordering::SeqCst) + 1;
        clock.panic_at.store(next, Ordering::SeqCst);
        let changed = catch_unwind(AssertUnwindSafe(|| {
            limiter.set_quota(Quota::per_minute(20).unwrap(), Carry::AsIs)
        }));
        assert!(changed.is_err(), "the clock's panic reaches the caller");
        clock.panic_at.store(u64::MAX, Ordering::SeqCst);

        // "alice" is under exactly one generation (the old: the change did not
        // happen) and is decided; before the fix every cell stayed retired
        // and linked, and the check looped for ever.
        let (tx, rx) = std::sync::mpsc::channel();
        let checker = Arc::clone(&limiter);
        std::thread::spawn(move || {
            let _ = tx.send(checker.check("alice").map(|d| d.is_allowed()));
        });
        let decided = rx.recv_timeout(Duration::from_secs(2));
        assert!(decided.is_ok(), "a check of a stored key never returns");
        // And a second change goes through (it found retired cells before).
        assert!(
            limiter
                .set_quota(Quota::per_minute(20).unwrap(), Carry::AsIs)
                .is_ok()
        );
    }

    thread_local! {
        static ARMED: Cell<bool> = const { Cell::new(false) };
    }

    #[derive(Debug)]
    struct Fragile(Gcra);

    #[derive(Debug, Default)]
    struct FragileState(GcraState);

    impl Drop for FragileState {
        fn drop(&mut self) {
            // Only a used state (the one key's): the fresh states the change
            // makes and drops first (`check_carries`) pass.
            if ARMED.get() && self.0.tat_ns() > 0 {
                ARMED.set(false); // once: a second would abort the test binary
                panic!("state drop");
            }
        }
    }

    impl Algorithm for Fragile {
        type State = FragileState;
        type Admission = GcraState;
        fn from_quota(quota: &Quota) -> Self {
            Self(Gcra::from_quota(quota))
        }
        fn for_quota(&self, quota: &Quota) -> Result<Self, LayoutError> {
            self.0.for_quota(quota).map(Self)
        }
        fn carry(
            &self,
            to: &Self,
            carry: Carry,
            state: &FragileState,
            at: CarryAt,
        ) -> Option<FragileState> {
            self.0.carry(&to.0, carry, &state.0, at).map(FragileState)
        }
        fn capacity(&self) -> u32 {
            self.0.capacity()
        }
        fn decide(
            &self,
            state: &FragileState,
            now_ns: u64,
            cost: u32,
        ) -> Result<Verdict<GcraState>, CheckError> {
            self.0.decide(&state.0, now_ns, cost)
        }
        fn admit(&self, state: &mut FragileState, admission: GcraState) {
            self.0.admit(&mut state.0, admission);
        }
        fn is_idle(&self, state: &FragileState, now_ns: u64) -> bool {
            self.0.is_idle(&state.0, now_ns)
        }
        fn rest_ns(&self) -> u64 {
            self.0.rest_ns()
        }
    }

    impl CellFor<Fragile> for Preferred {
        type Cell = Locked<Fragile>;
    }

    #[test]
    fn a_replaced_state_s_drop_does_not_reach_set_quota() {
        let limiter = Builder::new(Quota::per_minute(10).unwrap())
            .algorithm::<Fragile>()
            .clock(ManualClock::new())
            .store(GlobalMutex)
            .build::<u64>();
        // Admitted at 0: its TAT is one interval, above 0.
        assert!(limiter.check(&1).unwrap().is_allowed());
        ARMED.set(true);
        let changed = catch_unwind(AssertUnwindSafe(|| {
            limiter.set_quota(Quota::per_minute(20).unwrap(), Carry::AsIs)
        }));
        ARMED.set(false);
        // Before the fix: the panic reached the caller, and quota() stayed 10
        // a minute although the one shard was converted.
        assert!(matches!(changed, Ok(Ok(()))));
        assert_eq!(limiter.quota(), Quota::per_minute(20).unwrap());
    }

    fn drain<C: Clock, S: StoreKind<u64, Fragile>>(
        limiter: &RateLimiter<u64, Fragile, C, S>,
        key: u64,
    ) -> u32 {
        let mut admitted = 0;
        while limiter.check(&key).unwrap().is_allowed() {
            admitted += 1;
            if admitted > 1_000 {
                panic!("a limiter that never denies");
            }
        }
        admitted
    }

    /// 10 a minute, key 1 took one unit at 0 (9 free), then a change to 20 as
    /// is (9 stay free) whose old state's `Drop` panics.
    fn changed_with_a_panicking_drop<S: StoreKind<u64, Fragile>>(
        store: S,
    ) -> (RateLimiter<u64, Fragile, ManualClock, S>, bool) {
        let limiter = Builder::new(Quota::per_minute(10).unwrap())
            .algorithm::<Fragile>()
            .clock(ManualClock::new())
            .store(store)
            .build::<u64>();
        assert!(limiter.check(&1).unwrap().is_allowed());
        ARMED.set(true);
        let changed = catch_unwind(AssertUnwindSafe(|| {
            limiter.set_quota(Quota::per_minute(20).unwrap(), Carry::AsIs)
        }));
        ARMED.set(false);
        (limiter, matches!(changed, Ok(Ok(()))))
    }

    /// Per-key: the old states are in the cells `retire_into_new` returned,
    /// which the code before dropped at the end of `change` with no catch,
    /// after the change: the panic reached `set_quota`, and `quota()` stayed 10
    /// while every key (and every new key) was under 20.
    #[test]
    fn per_key_old_state_drop_panic_does_not_reach_set_quota() {
        let (limiter, ok) = changed_with_a_panicking_drop(PerKey::new());
        let quota = limiter.quota();
        // Consistency, whatever happened: a fresh key gets quota().burst().
        assert_eq!(drain(&limiter, 2), quota.burst(), "quota() says {quota:?}");
        assert!(ok, "the replaced state's panic reached set_quota");
    }

    /// Lock-free: the code before dropped each moved cell as it installed the
    /// carried one, inside the phase-3 catch: a panic at key i left keys
    /// 0..=i carried to 20 but the table in the old generation (read by the old
    /// GCRA: 4 free instead of 9), and reached `set_quota`.
    #[test]
    fn lock_free_old_state_drop_panic_leaves_no_half_carried_key() {
        let (limiter, ok) = changed_with_a_panicking_drop(LockFree::default());
        let quota = limiter.quota();
        // 9 free under either quota (as is); a state carried to 20 read by the
        // 10-a-minute GCRA (33 s of debt at 6 s a unit) gives 4.
        assert_eq!(drain(&limiter, 1), 9, "quota() says {quota:?}");
        assert!(ok, "the replaced state's panic reached set_quota");
    }

    /// Direct: the code before assigned the carried cell over the old one; the
    /// old `Drop` panicked and the assignment still completed on unwinding, so
    /// the carried cell was read by the old algorithm, under the old quota and
    /// issuer.
    #[test]
    fn direct_old_state_drop_panic_changes_all_or_nothing() {
        let mut limiter = Builder::new(Quota::per_minute(10).unwrap())
            .algorithm::<Fragile>()
            .clock(ManualClock::new())
            .build_direct();
        assert!(limiter.check().unwrap().is_allowed());
        ARMED.set(true);
        let changed = catch_unwind(AssertUnwindSafe(|| {
            limiter.set_quota(Quota::per_minute(20).unwrap(), Carry::AsIs)
        }));
        ARMED.set(false);
        let quota = *limiter.quota();
        let mut admitted = 0;
        while limiter.check().unwrap().is_allowed() {
            admitted += 1;
            if admitted > 1_000 {
                panic!("a limiter that never denies");
            }
        }
        // 9 free of 10 (nothing changed) or of 20 (changed); 4 before the fix.
        assert_eq!(
            admitted,
            9,
            "quota() says {quota:?}, returned {:?}",
            changed.is_ok()
        );
    }
}
