//! The lock-free table's memory handling, small enough for Miri:
//!
//! ```text
//! MIRIFLAGS="-Zmiri-tree-borrows" cargo +nightly miri test --test lock_free_table
//! ```
//!
//! (Tree Borrows, as `.ci/test` runs it; no leak is ignored: the
//! read-copy-update's records, never freed, stay reachable from its
//! registry, a static.) Heap-owning `String` keys
//! go through inserts, rebuilds (which clone them), evictions, compactions
//! and drops, on one thread and on three.
//! Miri checks every unsafe access the table makes (slot publication, keys
//! moved to a rebuilt table, cells dropped with the old one) for undefined
//! behaviour and leaks; under ordinary `cargo test` the same runs check the
//! counts.

// Ordinary tests use std's primitives; under the model-checking features the
// crate's primitives are loom's or shuttle's, usable only inside a model.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

use std::time::Duration;

use tollgate::algorithm::{Algorithm, Gcra, SlidingWindowLog};
use tollgate::cell::{CellFor, Preferred};
use tollgate::clock::ManualClock;
use tollgate::store::LockFree;
use tollgate::{Builder, Quota, RateLimiter};

fn limiter<A: Algorithm>(clock: &ManualClock) -> RateLimiter<String, A, ManualClock, LockFree>
where
    Preferred: CellFor<A>,
{
    Builder::new(Quota::per_second(2).unwrap())
        .algorithm::<A>()
        .store(LockFree::new(1))
        .clock(clock.clone())
        .build()
}

/// Inserts through several rebuilds, evicts, rebuilds over the tombstones,
/// and drops: every key admitted exactly its burst, and the counts add up.
fn churn<A: Algorithm>()
where
    Preferred: CellFor<A>,
{
    let clock = ManualClock::new();
    let limiter = limiter::<A>(&clock);
    for round in 0..3_u32 {
        for key in 0..40_u32 {
            let key = format!("client-{round}-{key}");
            assert!(limiter.check(&key).unwrap().is_allowed());
            assert!(limiter.check(&key).unwrap().is_allowed());
            assert!(!limiter.check(&key).unwrap().is_allowed());
        }
        assert_eq!(limiter.len(), 40 * (round as usize + 1));
    }
    // Rested: everything idle and evicted (cells retired, slots deleted).
    clock.advance(Duration::from_secs(5));
    assert_eq!(limiter.evict_idle(), 120);
    assert_eq!(limiter.len(), 0);
    // New keys rebuild the table over the tombstones; old keys come back fresh.
    for key in 0..60_u32 {
        assert!(
            limiter
                .check(&format!("client-0-{key}"))
                .unwrap()
                .is_allowed()
        );
    }
    assert_eq!(limiter.len(), 60);
}

#[test]
fn gcra_keys_through_rebuilds_and_evictions() {
    churn::<Gcra>();
}

#[test]
fn locked_cells_with_heap_state_through_rebuilds_and_evictions() {
    churn::<SlidingWindowLog>();
}

/// Two threads each insert `keys_per_thread` new keys (`new_key(thread, i)`)
/// into one shard, rebuilding it, while a third checks `hot` 30 times on a
/// burst of 20 (`Quota::per_hour(20)`, frozen clock): the hot key admits
/// exactly its burst, and every new key is admitted once.
fn hot_key_against_inserters<K: tollgate::store::Key>(
    hot: &K,
    keys_per_thread: u64,
    new_key: impl Fn(u64, u64) -> K + Sync,
) {
    let limiter = Builder::new(Quota::per_hour(20).unwrap())
        .store(LockFree::new(1))
        .clock(ManualClock::new())
        .build::<K>();
    let hot_admitted = std::thread::scope(|scope| {
        for thread in 0..2 {
            let (limiter, new_key) = (&limiter, &new_key);
            scope.spawn(move || {
                for index in 0..keys_per_thread {
                    let key = new_key(thread, index);
                    assert!(limiter.check(&key).unwrap().is_allowed());
                }
            });
        }
        let checker = scope.spawn(|| {
            (0..30)
                .filter(|_| limiter.check(hot).unwrap().is_allowed())
                .count()
        });
        checker.join().unwrap()
    });
    assert_eq!(hot_admitted, 20);
    assert_eq!(limiter.len() as u64, 2 * keys_per_thread + 1);
}

/// String keys: rebuilds move the hot key's cell under a concurrent check.
#[test]
fn concurrent_checks_across_rebuilds() {
    hot_key_against_inserters(&"hot".to_owned(), 30, |thread, index| {
        format!("{thread}-{index}")
    });
}

/// A key with interior mutability, which the `Key` bound admits: its `Eq`
/// takes a lock and writes under it, and its `Hash` caches the hash in an
/// atomic. Copied bitwise into a rebuilt table while another thread held
/// its lock, such a key would hang every later check on it, and the copy
/// would race with the writes (undefined behaviour, which Miri reports):
/// rebuilds clone keys, through `Clone`.
#[derive(Debug)]
struct Guarded {
    id: u64,
    comparisons: std::sync::Mutex<u64>,
    hash_cache: std::sync::atomic::AtomicU64,
}

impl Guarded {
    fn new(id: u64) -> Self {
        Self {
            id,
            comparisons: std::sync::Mutex::new(0),
            hash_cache: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Clone for Guarded {
    fn clone(&self) -> Self {
        Self::new(self.id)
    }
}

/// Calls of `Guarded::eq`, which runs on the stored copy (`stored == probe`).
static GUARDED_COMPARISONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl PartialEq for Guarded {
    fn eq(&self, other: &Self) -> bool {
        // A write into the key's own memory, under its lock, while other
        // threads may be reading the same key.
        *self.comparisons.lock().unwrap() += 1;
        // Relaxed: a statistic read after the threads are joined.
        GUARDED_COMPARISONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.id == other.id
    }
}

impl Eq for Guarded {}

impl std::hash::Hash for Guarded {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        use std::sync::atomic::Ordering;
        // Relaxed: a cache of a pure function of `id`; any value read is
        // either 0 (not cached) or the right one.
        let mut cached = self.hash_cache.load(Ordering::Relaxed);
        if cached == 0 {
            cached = self.id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            self.hash_cache.store(cached, Ordering::Relaxed);
        }
        cached.hash(state);
    }
}

/// Two threads insert new `Guarded` keys into one shard, rebuilding it from
/// 8 buckets to 39 in six steps, while a third checks a hot `Guarded` key whose stored
/// copy's lock every lookup takes: exact counts, and nothing hangs.
#[test]
fn keys_with_interior_mutability_across_rebuilds() {
    hot_key_against_inserters(&Guarded::new(u64::MAX), 15, |thread, index| {
        Guarded::new(thread * 100 + index)
    });
    // Every check of the hot key but the first (which inserted it) compared
    // it with its stored copy, at least once.
    assert!(GUARDED_COMPARISONS.load(std::sync::atomic::Ordering::Relaxed) >= 29);
}
