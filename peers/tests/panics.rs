//! A key whose `Hash`, `Eq`, `Ord` and `Clone` panic at a chosen call
//! (`scc` clones keys, flurry orders them), armed at every call of an
//! eviction, of a new key's insert, and of a new key's insert into a full
//! store (which sweeps to make room) in turn, and at calls spread through a
//! growth sweep: after each panic, every key decides as it should, the key
//! count is exact, the cap holds, and growth sweeps go on. The crate's own
//! stores have `tests/panics.rs`; these stores run the same user code
//! inside maps that make no promise about it (`OnMap`'s documentation).

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

thread_local! {
    /// Calls of `Hash` and `Eq` left before the armed one panics.
    static COUNTDOWN: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Counts one call of user code, and panics at the armed one.
fn tick() {
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
/// reached it (and disarms either way).
fn armed_at(call: u64, work: impl FnOnce()) -> bool {
    COUNTDOWN.with(|countdown| countdown.set(Some(call)));
    let panicked = catch_unwind(AssertUnwindSafe(work)).is_err();
    COUNTDOWN.with(|countdown| countdown.set(None));
    panicked
}

#[derive(Debug)]
struct Touchy(u64);

impl Clone for Touchy {
    fn clone(&self) -> Self {
        tick();
        Self(self.0)
    }
}

impl Ord for Touchy {
    fn cmp(&self, other: &Self) -> Ordering {
        tick();
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
        tick();
        self.0.hash(state);
    }
}

impl PartialEq for Touchy {
    fn eq(&self, other: &Self) -> bool {
        tick();
        self.0 == other.0
    }
}

impl Eq for Touchy {}

const KEYS: u64 = 8;
/// `KEYS`, as the count of keys the limiter holds.
#[allow(clippy::cast_possible_truncation)]
const HELD: usize = KEYS as usize;

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

/// A limiter on `store` (capped at `cap`) holding keys `0..KEYS`, each
/// admitted once.
fn filled<S: StoreKind<Touchy, Gcra>>(
    store: S,
    clock: &ManualClock,
    cap: Option<usize>,
) -> RateLimiter<Touchy, Gcra, ManualClock, S> {
    let limiter = limiter(store, clock, cap);
    for key in 0..KEYS {
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
fn eviction_survives_a_panic_at_every_call<S: StoreKind<Touchy, Gcra>>(store: S) {
    let mut reached = 0;
    for call in 0.. {
        let clock = ManualClock::new();
        let limiter = filled(store.clone(), &clock, None);
        clock.advance(Duration::from_secs(2));
        if !armed_at(call, || {
            limiter.evict_idle();
        }) {
            break;
        }
        reached += 1;
        // Evicted or not, every key was idle: each admits once, as a fresh
        // key, and denies after; and every one is held again.
        for key in 0..KEYS {
            assert!(
                limiter.check(&Touchy(key)).unwrap().is_allowed(),
                "call {call}, key {key}"
            );
            assert!(
                !limiter.check(&Touchy(key)).unwrap().is_allowed(),
                "call {call}, key {key}"
            );
        }
        assert_eq!(limiter.len(), HELD, "call {call}");
        // And an eviction after it takes them all.
        count_is_exact(&limiter, &clock, call);
    }
    assert!(reached > HELD, "the eviction ran user code {reached} times");
}

/// Every call of a new key's check, armed in turn.
fn new_key_survives_a_panic_at_every_call<S: StoreKind<Touchy, Gcra>>(store: S) {
    let mut reached = 0;
    for call in 0.. {
        let clock = ManualClock::new();
        let limiter = filled(store.clone(), &clock, None);
        let new_key = Touchy(KEYS);
        if !armed_at(call, || {
            assert!(limiter.check(&new_key).unwrap().is_allowed());
        }) {
            break;
        }
        reached += 1;
        // The panicking check stored nothing: the key admits as new, once.
        assert_eq!(limiter.len(), HELD, "call {call}");
        assert!(limiter.check(&new_key).unwrap().is_allowed(), "call {call}");
        assert!(
            !limiter.check(&new_key).unwrap().is_allowed(),
            "call {call}"
        );
        assert_eq!(limiter.len(), HELD + 1, "call {call}");
    }
    assert!(reached > 2, "the new key ran user code {reached} times");
}

/// Every call of a new key's check on a full store whose keys are all idle
/// (the check sweeps them out to make room), armed in turn.
fn full_store_survives_a_panic_at_every_call<S: StoreKind<Touchy, Gcra>>(store: S) {
    let (mut reached, mut refused) = (0, 0);
    for call in 0.. {
        let clock = ManualClock::new();
        let limiter = filled(store.clone(), &clock, Some(HELD));
        clock.advance(Duration::from_secs(2));
        let new_key = Touchy(KEYS);
        if !armed_at(call, || {
            assert!(limiter.check(&new_key).unwrap().is_allowed());
        }) {
            break;
        }
        reached += 1;
        assert!(limiter.len() <= HELD, "call {call}: {}", limiter.len());
        // The new key admits once, as new: whatever the sweep left, idle
        // keys make room, within the sweeps' spacing
        // (`Population::make_room`): at 8 keys one new key in two that
        // find the store full sweeps, and a sweep that panicked did not
        // make the next one due at once (a key whose `Hash` always panics
        // would otherwise make every new key sweep the whole store), so the
        // next check may be refused, and the one after it sweeps.
        match limiter.check(&new_key) {
            Ok(decision) => assert!(decision.is_allowed(), "call {call}"),
            Err(CheckError::StoreFull { max_keys }) => {
                assert_eq!(max_keys, HELD, "call {call}");
                refused += 1;
                assert!(limiter.check(&new_key).unwrap().is_allowed(), "call {call}");
            }
            Err(error) => panic!("call {call}: {error}"),
        }
        assert!(
            !limiter.check(&new_key).unwrap().is_allowed(),
            "call {call}"
        );
        assert!(limiter.len() <= HELD, "call {call}: {}", limiter.len());
        count_is_exact(&limiter, &clock, call);
        // And the store holds its cap's worth again, and no more.
        for key in 0..KEYS {
            assert!(
                limiter.check(&Touchy(key)).unwrap().is_allowed(),
                "call {call}, key {key}"
            );
        }
        assert!(limiter.check(&new_key).is_err(), "call {call}");
        assert_eq!(limiter.len(), HELD, "call {call}");
    }
    assert!(
        reached > HELD,
        "the full store ran user code {reached} times"
    );
    // Some panics fell inside the sweep, after the spacing counted them.
    assert!(refused > 0, "no check was refused after a panicking sweep");
}

/// A panic inside a growth sweep (at calls spread through it) leaves the
/// sweeps scheduled: waves of new keys, each idle by the next, keep the
/// count within twice a wave, as without the panic.
fn growth_sweep_survives_a_panic<S: StoreKind<Touchy, Gcra>>(store: S) {
    const SWEEP_AT: u64 = FIRST_SWEEP_AT as u64;
    // The most keys held: the sweep after the panic is scheduled at twice
    // what it left (at most every key and the new one), and each later at
    // twice a wave, the keys admitted since the last.
    let bound = 2 * (FIRST_SWEEP_AT + 1);
    for call in [0, 1, 2, 3, 50, 500, 2_000] {
        let clock = ManualClock::new();
        let limiter = limiter(store.clone(), &clock, None);
        for key in 0..SWEEP_AT {
            assert!(limiter.check(&Touchy(key)).unwrap().is_allowed());
        }
        clock.advance(Duration::from_secs(2));
        // Finds the first sweep due; every key before it idle.
        let new_key = Touchy(SWEEP_AT);
        assert!(
            armed_at(call, || {
                assert!(limiter.check(&new_key).unwrap().is_allowed());
            }),
            "call {call} not reached"
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

macro_rules! panic_tests {
    ($($name:ident: $store:expr;)*) => {$(
        mod $name {
            use super::*;

            #[test]
            fn eviction() {
                eviction_survives_a_panic_at_every_call($store);
            }

            #[test]
            fn new_key() {
                new_key_survives_a_panic_at_every_call($store);
            }

            #[test]
            fn full_store() {
                full_store_survives_a_panic_at_every_call($store);
            }

            #[test]
            fn growth_sweep() {
                growth_sweep_survives_a_panic($store);
            }
        }
    )*};
}

panic_tests! {
    papaya: Papaya::new();
    scc_index: SccIndex::new();
    flurry: Flurry::new();
}
