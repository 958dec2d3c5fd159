//! A key whose `Hash`, `Eq` and `Clone` panic at a chosen call, armed at
//! every call of an eviction, of a new key's insert, and of a new key's
//! insert into a full store (which sweeps to make room) in turn, also with
//! keys whose hashes collide, and at calls spread through a growth sweep:
//! after each panic, every key decides as it should, the key count is
//! exact, the cap holds, and growth sweeps go on. Each store's tests also
//! show which of the key's traits the store runs, its map included (the
//! store itself hashes a key for its stripe and clones a new one). `Ord`
//! is counted but never armed: papaya and `scc` never run it, and flurry
//! runs it only in a tree bin, where a panic wedges the bin (the `flurry`
//! module below). The crate's own stores have `tests/panics.rs`; these
//! stores run the same user code inside maps that make no promise about it
//! (`OnMap`'s documentation).

use std::cell::Cell;
use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use tollgate::algorithm::Gcra;
use tollgate::clock::ManualClock;
use tollgate::store::{StoreKind, WhenFull};
use tollgate::{Builder, CheckError, Quota, RateLimiter};
use tollgate_peers::{FIRST_SWEEP_AT, Flurry, Papaya, SccIndex};

/// The key's user code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Site {
    Hash,
    Eq,
    Ord,
    Clone,
}

thread_local! {
    /// Calls of the key's user code left before the armed one panics.
    static COUNTDOWN: Cell<Option<u64>> = const { Cell::new(None) };
    /// How many times each `Site` ran, in its order.
    static REACHED: Cell<[u64; 4]> = const { Cell::new([0; 4]) };
    /// Whether every key hashes alike (into one of flurry's bins, which
    /// turns into a tree past 8 entries and then orders keys).
    static COLLIDE: Cell<bool> = const { Cell::new(false) };
}

/// Counts one call of user code at `site`, and panics at the armed one.
fn tick(site: Site) {
    REACHED.with(|reached| {
        let mut counts = reached.get();
        counts[site as usize] += 1;
        reached.set(counts);
    });
    COUNTDOWN.with(|countdown| match countdown.get() {
        Some(0) => {
            countdown.set(None);
            panic!("armed panic in a key's user code");
        }
        Some(left) => countdown.set(Some(left - 1)),
        None => {}
    });
}

/// Arms a panic at the `call`th call from now; returns whether `work`
/// reached it (and disarms either way). Any other panic of `work` (a
/// failed assertion) goes on: counted as the armed one, it would make a
/// loop over every call never end.
fn armed_at(call: u64, work: impl FnOnce()) -> bool {
    COUNTDOWN.with(|countdown| countdown.set(Some(call)));
    let outcome = catch_unwind(AssertUnwindSafe(work));
    // `tick` disarms as it panics: still armed, the armed call never came.
    let fired = COUNTDOWN
        .with(|countdown| countdown.replace(None))
        .is_none();
    match outcome {
        Ok(()) => false,
        Err(_) if fired => true,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

#[derive(Debug)]
struct Touchy(u64);

impl Clone for Touchy {
    fn clone(&self) -> Self {
        tick(Site::Clone);
        Self(self.0)
    }
}

impl Ord for Touchy {
    fn cmp(&self, other: &Self) -> Ordering {
        tick(Site::Ord);
        self.0.cmp(&other.0)
    }
}

impl PartialOrd for Touchy {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Hash for Touchy {
    fn hash<H: Hasher>(&self, state: &mut H) {
        tick(Site::Hash);
        if !COLLIDE.get() {
            self.0.hash(state);
        }
    }
}

impl PartialEq for Touchy {
    fn eq(&self, other: &Self) -> bool {
        tick(Site::Eq);
        self.0 == other.0
    }
}

impl Eq for Touchy {}

/// How many keys a test's store holds; `keys` as a count.
#[derive(Clone, Copy)]
struct Keys {
    keys: u64,
    held: usize,
}

impl Keys {
    fn new(keys: u64) -> Self {
        Self {
            keys,
            held: usize::try_from(keys).unwrap(),
        }
    }
}

/// One unit a second, burst 1: a key admitted once denies until a second
/// passes, and is idle (as good as fresh) after it. With `cap`, at most
/// that many keys, a new key past them refused.
fn limiter<S: StoreKind<Touchy, Gcra>>(
    store: S,
    clock: &ManualClock,
    cap: Option<usize>,
) -> RateLimiter<Touchy, Gcra, ManualClock, S> {
    let builder = Builder::new(Quota::per_second(1).unwrap())
        .store(store)
        .clock(clock.clone());
    match cap {
        Some(cap) => builder.max_keys(NonZeroUsize::new(cap).unwrap(), WhenFull::Reject),
        None => builder,
    }
    .build::<Touchy>()
}

/// A limiter on `store` (capped at `cap`) holding keys `0..keys`, each
/// admitted once.
fn filled<S: StoreKind<Touchy, Gcra>>(
    store: S,
    clock: &ManualClock,
    cap: Option<usize>,
    keys: Keys,
) -> RateLimiter<Touchy, Gcra, ManualClock, S> {
    let limiter = limiter(store, clock, cap);
    for key in 0..keys.keys {
        assert!(limiter.check(&Touchy(key)).unwrap().is_allowed());
    }
    limiter
}

/// The key count is exact: once every key is idle, an eviction takes as
/// many as the count says, and leaves none.
fn count_is_exact<S: StoreKind<Touchy, Gcra>>(
    limiter: &RateLimiter<Touchy, Gcra, ManualClock, S>,
    clock: &ManualClock,
    call: u64,
) {
    let held = limiter.len();
    clock.advance(Duration::from_secs(2));
    assert_eq!(limiter.evict_idle(), held, "call {call}");
    assert_eq!(limiter.len(), 0, "call {call}");
}

/// Every call of an eviction of idle keys, armed in turn.
fn eviction_survives_a_panic_at_every_call<S: StoreKind<Touchy, Gcra>>(store: &S, keys: Keys) {
    let mut reached = 0;
    for call in 0.. {
        let clock = ManualClock::new();
        let limiter = filled(store.clone(), &clock, None, keys);
        clock.advance(Duration::from_secs(2));
        if !armed_at(call, || {
            limiter.evict_idle();
        }) {
            break;
        }
        reached += 1;
        // Evicted or not, every key was idle: each admits once, as a fresh
        // key, and denies after; and every one is held again.
        for key in 0..keys.keys {
            assert!(
                limiter.check(&Touchy(key)).unwrap().is_allowed(),
                "call {call}, key {key}"
            );
            assert!(
                !limiter.check(&Touchy(key)).unwrap().is_allowed(),
                "call {call}, key {key}"
            );
        }
        assert_eq!(limiter.len(), keys.held, "call {call}");
        // And an eviction after it takes them all.
        count_is_exact(&limiter, &clock, call);
    }
    assert!(
        reached > keys.held,
        "the eviction ran user code {reached} times"
    );
}

/// Every call of a new key's check, armed in turn.
fn new_key_survives_a_panic_at_every_call<S: StoreKind<Touchy, Gcra>>(store: &S, keys: Keys) {
    let mut reached = 0;
    for call in 0.. {
        let clock = ManualClock::new();
        let limiter = filled(store.clone(), &clock, None, keys);
        let new_key = Touchy(keys.keys);
        if !armed_at(call, || {
            assert!(limiter.check(&new_key).unwrap().is_allowed());
        }) {
            break;
        }
        reached += 1;
        // The panicking check stored nothing: the key admits as new, once.
        assert_eq!(limiter.len(), keys.held, "call {call}");
        assert!(limiter.check(&new_key).unwrap().is_allowed(), "call {call}");
        assert!(
            !limiter.check(&new_key).unwrap().is_allowed(),
            "call {call}"
        );
        assert_eq!(limiter.len(), keys.held + 1, "call {call}");
    }
    assert!(reached > 2, "the new key ran user code {reached} times");
}

/// Every call of a new key's check on a full store whose keys are all idle
/// (the check sweeps them out to make room), armed in turn.
fn full_store_survives_a_panic_at_every_call<S: StoreKind<Touchy, Gcra>>(store: &S, keys: Keys) {
    let (mut reached, mut refused) = (0, 0);
    for call in 0.. {
        let clock = ManualClock::new();
        let limiter = filled(store.clone(), &clock, Some(keys.held), keys);
        clock.advance(Duration::from_secs(2));
        let new_key = Touchy(keys.keys);
        if !armed_at(call, || {
            assert!(limiter.check(&new_key).unwrap().is_allowed());
        }) {
            break;
        }
        reached += 1;
        assert!(limiter.len() <= keys.held, "call {call}: {}", limiter.len());
        // The new key admits once, as new: whatever the sweep left, idle
        // keys make room, within the sweeps' spacing
        // (`Population::make_room`): one new key in `period` that find the
        // store full sweeps, and a sweep that panicked did not make the
        // next one due at once (a key whose `Hash` always panics would
        // otherwise make every new key sweep the whole store). So after a
        // panic inside the sweep (the spacing counted it, and nothing was
        // removed) exactly the next `period - 1` checks are refused, and
        // the one after them sweeps; after a panic anywhere else, none.
        let period = keys.held / SWEEP_SPACING + 1;
        let mut refusals = 0;
        let decision = loop {
            match limiter.check(&new_key) {
                Err(CheckError::StoreFull { max_keys }) if refusals < period => {
                    assert_eq!(max_keys, keys.held, "call {call}");
                    assert_eq!(limiter.len(), keys.held, "call {call}");
                    refusals += 1;
                }
                decided => break decided,
            }
        };
        assert!(decision.unwrap().is_allowed(), "call {call}");
        assert!(
            refusals == 0 || refusals == period - 1,
            "call {call}: {refusals} refusals"
        );
        refused += usize::from(refusals > 0);
        assert!(
            !limiter.check(&new_key).unwrap().is_allowed(),
            "call {call}"
        );
        assert!(limiter.len() <= keys.held, "call {call}: {}", limiter.len());
        count_is_exact(&limiter, &clock, call);
        // And the store holds its cap's worth again, and no more.
        for key in 0..keys.keys {
            assert!(
                limiter.check(&Touchy(key)).unwrap().is_allowed(),
                "call {call}, key {key}"
            );
        }
        assert!(
            matches!(
                limiter.check(&new_key),
                Err(CheckError::StoreFull { max_keys }) if max_keys == keys.held
            ),
            "call {call}"
        );
        assert_eq!(limiter.len(), keys.held, "call {call}");
    }
    assert!(
        reached > keys.held,
        "the full store ran user code {reached} times"
    );
    // Some panics fell inside the sweep, after the spacing counted them.
    assert!(refused > 0, "no check was refused after a panicking sweep");
}

/// A panic inside a growth sweep, at a quarter, half and three quarters of
/// the calls of user code the check that runs it makes (counted by an
/// unarmed run first: the sweep's calls are nearly all of them), leaves
/// the sweeps scheduled: waves of new keys, each idle by the next, keep the
/// count within twice a wave, as without the panic. (With the sweep's
/// reschedule skipped on unwind, a planted bug, the count reaches about
/// five waves.)
fn growth_sweep_survives_a_panic<S: StoreKind<Touchy, Gcra>>(store: &S) {
    const SWEEP_AT: u64 = FIRST_SWEEP_AT as u64;
    let keys = Keys::new(SWEEP_AT);
    // The most keys held: the sweep after the panic is scheduled at twice
    // what it left (at most every key and the new one), and each later at
    // twice a wave, the keys admitted since the last.
    let bound = 2 * (FIRST_SWEEP_AT + 1);
    // Fills the store, every key idle; the new key's check finds the first
    // sweep due.
    let due = |clock: &ManualClock| {
        let limiter = filled(store.clone(), clock, None, keys);
        clock.advance(Duration::from_secs(2));
        limiter
    };
    let calls = {
        let limiter = due(&ManualClock::new());
        let before = REACHED.get().iter().sum::<u64>();
        assert!(limiter.check(&Touchy(SWEEP_AT)).unwrap().is_allowed());
        assert_eq!(limiter.len(), 1, "the sweep evicted every idle key");
        REACHED.get().iter().sum::<u64>() - before
    };
    assert!(
        calls > 2 * SWEEP_AT,
        "the sweep ran user code {calls} times"
    );
    for call in [calls / 4, calls / 2, 3 * calls / 4] {
        let clock = ManualClock::new();
        let limiter = due(&clock);
        assert!(
            armed_at(call, || {
                assert!(limiter.check(&Touchy(SWEEP_AT)).unwrap().is_allowed());
            }),
            "call {call} not reached"
        );
        // Inside the sweep: some idle keys evicted, not all.
        assert!(
            (1..keys.held).contains(&limiter.len()),
            "call {call}: {} held",
            limiter.len()
        );
        let mut next = SWEEP_AT + 1;
        for _wave in 0..4 {
            clock.advance(Duration::from_secs(2));
            for key in next..next + SWEEP_AT {
                assert!(
                    limiter.check(&Touchy(key)).unwrap().is_allowed(),
                    "call {call}, key {key}"
                );
                assert!(
                    limiter.len() <= bound,
                    "call {call}, key {key}: {} held",
                    limiter.len()
                );
            }
            next += SWEEP_AT;
        }
        count_is_exact(&limiter, &clock, call);
    }
}

/// Runs the three armed scenarios on `keys` keys (every key hashing alike
/// with `collide`) and asserts that the store (its map included) ran
/// exactly the user code in `reaches`, each at least once.
fn reaches<S: StoreKind<Touchy, Gcra>>(store: &S, keys: Keys, collide: bool, reaches: &[Site]) {
    COLLIDE.set(collide);
    REACHED.set([0; 4]);
    eviction_survives_a_panic_at_every_call(store, keys);
    new_key_survives_a_panic_at_every_call(store, keys);
    full_store_survives_a_panic_at_every_call(store, keys);
    assert_reached(reaches);
}

/// Asserts that the key's user code ran at exactly the sites in `reaches`
/// since `REACHED` was cleared.
fn assert_reached(reaches: &[Site]) {
    let counts = REACHED.get();
    for site in [Site::Hash, Site::Eq, Site::Ord, Site::Clone] {
        assert_eq!(
            counts[site as usize] > 0,
            reaches.contains(&site),
            "{site:?} ran {} times",
            counts[site as usize]
        );
    }
}

/// tollgate's spacing of the sweeps a full store's new keys run
/// (`SWEEP_SPACING` in `src/store/mod.rs`, private there): one in every
/// `len / SWEEP_SPACING + 1`.
const SWEEP_SPACING: usize = 8;

/// The key count of the ordinary tests.
const KEYS: u64 = 8;

/// Past flurry's threshold for a tree bin (8 entries in one bin, once its
/// table has at least 64 bins, which it grows to first).
const COLLIDING: u64 = 16;

macro_rules! panic_tests {
    ($($name:ident: $store:expr, reaches [$($site:ident),*];)*) => {$(
        mod $name {
            use super::*;

            #[test]
            fn armed_at_every_call() {
                reaches(&$store, Keys::new(KEYS), false, &[$(Site::$site),*]);
            }

            #[test]
            fn armed_at_every_call_keys_colliding() {
                reaches(&$store, Keys::new(COLLIDING), true, &[$(Site::$site),*]);
            }

            #[test]
            fn growth_sweep() {
                growth_sweep_survives_a_panic(&$store);
            }
        }
    )*};
}

panic_tests! {
    papaya: Papaya::new(), reaches [Hash, Eq, Clone];
    scc_index: SccIndex::new(), reaches [Hash, Eq, Clone];
}

/// flurry, armed as the others, on keys that do not collide: the store
/// runs `Hash`, `Eq` and `Clone` (an owned key for each of flurry's
/// lookups, too), never `Ord`.
mod flurry {
    use super::*;

    #[test]
    fn armed_at_every_call() {
        reaches(
            &Flurry::new(),
            Keys::new(KEYS),
            false,
            &[Site::Hash, Site::Eq, Site::Clone],
        );
    }

    #[test]
    fn growth_sweep() {
        growth_sweep_survives_a_panic(&Flurry::new());
    }

    /// Keys that collide make a tree bin. A lookup there (`TreeBin::find`)
    /// counts itself a reader of the bin by a CAS, runs `Eq` and `Ord`, and
    /// counts itself out after, with nothing to do so on unwind: a panic
    /// leaves a reader counted for ever, and the next write that
    /// restructures the bin parks for ever waiting for it, holding the
    /// bin's lock, so that every later write to the bin blocks. Armed at
    /// every call, this test hung (2026-12-03). No store over flurry can
    /// undo that (`OnMap`'s documentation), so here the colliding keys only
    /// show that the tree bin runs `Ord`, unarmed.
    #[test]
    fn colliding_keys_run_ord_in_a_tree_bin() {
        COLLIDE.set(true);
        REACHED.set([0; 4]);
        let clock = ManualClock::new();
        let limiter = filled(Flurry::new(), &clock, None, Keys::new(COLLIDING));
        count_is_exact(&limiter, &clock, 0);
        assert_reached(&[Site::Hash, Site::Eq, Site::Ord, Site::Clone]);
    }
}
