//! A key whose `Hash` and `Eq` panic at a chosen call, armed at every call
//! of an eviction and of a new key's insert in turn: after each panic,
//! every key decides as it should and the key count is exact. The crate's
//! own stores have `tests/panics.rs`; these stores run the same user code
//! inside maps that make no promise about it (`OnMap`'s documentation).

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use tollgate::algorithm::Gcra;
use tollgate::clock::ManualClock;
use tollgate::store::StoreKind;
use tollgate::{Builder, Quota, RateLimiter};
use tollgate_peers::{Flurry, Papaya, SccIndex};

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

#[derive(Clone, Debug, PartialOrd, Ord)]
struct Touchy(u64);

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
/// passes, and is idle (as good as fresh) after it.
fn limiter<S: StoreKind<Touchy, Gcra>>(
    store: S,
    clock: &ManualClock,
) -> RateLimiter<Touchy, Gcra, ManualClock, S> {
    Builder::new(Quota::per_second(1).unwrap())
        .store(store)
        .clock(clock.clone())
        .build::<Touchy>()
}

/// A limiter on `store` holding keys `0..KEYS`, each admitted once.
fn filled<S: StoreKind<Touchy, Gcra>>(
    store: S,
    clock: &ManualClock,
) -> RateLimiter<Touchy, Gcra, ManualClock, S> {
    let limiter = limiter(store, clock);
    for key in 0..KEYS {
        assert!(limiter.check(&Touchy(key)).unwrap().is_allowed());
    }
    limiter
}

/// Every call of an eviction of idle keys, armed in turn.
fn eviction_survives_a_panic_at_every_call<S: StoreKind<Touchy, Gcra>>(store: S) {
    let mut reached = 0;
    for call in 0.. {
        let clock = ManualClock::new();
        let limiter = filled(store.clone(), &clock);
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
        clock.advance(Duration::from_secs(2));
        assert_eq!(limiter.evict_idle(), HELD, "call {call}");
        assert_eq!(limiter.len(), 0, "call {call}");
    }
    assert!(reached > HELD, "the eviction ran user code {reached} times");
}

/// Every call of a new key's check, armed in turn.
fn new_key_survives_a_panic_at_every_call<S: StoreKind<Touchy, Gcra>>(store: S) {
    let mut reached = 0;
    for call in 0.. {
        let clock = ManualClock::new();
        let limiter = filled(store.clone(), &clock);
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
        }
    )*};
}

panic_tests! {
    papaya: Papaya::new();
    scc_index: SccIndex::new();
    flurry: Flurry::new();
}
