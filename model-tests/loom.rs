//! loom models: every interleaving of each atomic protocol, up to a
//! preemption bound set per model, with canaries (deliberately broken
//! variants that loom must catch at the same bound).
//!
//! Run: `cargo test --release --features loom --test loom`. Each model
//! prints how many executions loom explored (`--nocapture` shows them);
//! notes/07-model-checking.md records them with their times.

#![cfg(feature = "loom")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use tollgate::algorithm::{Algorithm, FixedWindow, Gcra, PackedAlgorithm, Verdict};
use tollgate::cell::{Atomic, Cell};
use tollgate::clock::{Clock, ManualClock};
use tollgate::store::{GlobalMutex, PerKey, StoreKind};
use tollgate::{Builder, Quota};

/// Runs `model` under loom with `preemption_bound`, and prints how many
/// executions were explored.
fn explore(name: &str, preemption_bound: usize, model: impl Fn() + Sync + Send + 'static) {
    let executions = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&executions);
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemption_bound);
    let started = std::time::Instant::now();
    builder.check(move || {
        counted.fetch_add(1, StdOrdering::Relaxed);
        model();
    });
    println!(
        "loom {name}: bound {preemption_bound}, {} executions, {:?}",
        executions.load(StdOrdering::Relaxed),
        started.elapsed()
    );
}

/// Spawns one loom thread per closure and sums the admissions they return.
fn admitted_by(threads: Vec<Box<dyn FnOnce() -> u32 + Send>>) -> u32 {
    let handles: Vec<_> = threads.into_iter().map(thread::spawn).collect();
    handles
        .into_iter()
        .map(|handle| handle.join().unwrap())
        .sum()
}

fn gcra(burst: u32) -> Gcra {
    Gcra::from_quota(&Quota::per_hour(1).unwrap().with_burst(burst).unwrap())
}

/// A cell over one word, as the models drive it: the real `Atomic<A>`, or a
/// canary that breaks its protocol in one place.
trait WordCell<A: PackedAlgorithm>: Send + Sync + 'static {
    fn fresh(algorithm: &A) -> Self;
    /// Checks `cost` units at `now_ns`; whether admitted.
    fn admit(&self, algorithm: &A, now_ns: u64, cost: u32) -> bool;
    fn word(&self) -> u64;
}

impl<A: PackedAlgorithm<Cell = Atomic<A>>> WordCell<A> for Atomic<A> {
    fn fresh(algorithm: &A) -> Self {
        <Atomic<A> as Cell<A>>::new(algorithm)
    }
    fn admit(&self, algorithm: &A, now_ns: u64, cost: u32) -> bool {
        self.check(algorithm, now_ns, cost)
            .unwrap()
            .unwrap()
            .is_allowed()
    }
    fn word(&self) -> u64 {
        self.load_word()
    }
}

/// Runs one check per closure-producing thread and sums the admissions.
fn race<A: PackedAlgorithm, C: WordCell<A>>(
    algorithm: &Arc<A>,
    cell: &Arc<C>,
    requests: &[&[(u64, u32)]],
) -> u32 {
    let handles: Vec<_> = requests
        .iter()
        .map(|requests| {
            let (algorithm, cell, requests) =
                (Arc::clone(algorithm), Arc::clone(cell), requests.to_vec());
            thread::spawn(move || {
                requests
                    .iter()
                    .map(|&(now_ns, cost)| {
                        if cell.admit(&algorithm, now_ns, cost) {
                            cost
                        } else {
                            0
                        }
                    })
                    .sum::<u32>()
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|handle| handle.join().unwrap())
        .sum()
}

// ---------------------------------------------------------------------------
// The atomic GCRA cell.

/// `threads` threads race one unit each on a fresh cell at a frozen instant:
/// exactly `burst` are admitted, in every interleaving.
fn exact_burst<C: WordCell<Gcra>>(threads: usize, burst: u32) {
    let algorithm = Arc::new(gcra(burst));
    let cell = Arc::new(C::fresh(&algorithm));
    let one: &[(u64, u32)] = &[(0, 1)];
    let admitted = race(&algorithm, &cell, &vec![one; threads]);
    assert_eq!(
        admitted, burst,
        "admitted {admitted} against a burst of {burst}"
    );
}

#[test]
fn gcra_cell_two_threads_admit_exactly_the_burst() {
    // Bound 3: 112 executions, 5 ms (release build, the 2-core VM, 2026-11-30).
    explore("gcra cell, 2 threads, burst 1", 3, || {
        exact_burst::<Atomic<Gcra>>(2, 1)
    });
}

#[test]
fn gcra_cell_three_threads_admit_exactly_the_burst() {
    // Bound 3: 17 438 executions, 1.16 s (release build, the 2-core VM, 2026-11-30).
    explore("gcra cell, 3 threads, burst 2", 3, || {
        exact_burst::<Atomic<Gcra>>(3, 2)
    });
}

/// Canary: read-decide-write with a plain store instead of a CAS (the lost
/// update).
struct RacyStore(AtomicU64);

impl WordCell<Gcra> for RacyStore {
    fn fresh(_: &Gcra) -> Self {
        Self(AtomicU64::new(0))
    }
    fn admit(&self, algorithm: &Gcra, now_ns: u64, cost: u32) -> bool {
        let seen = self.0.load(Ordering::Relaxed);
        match algorithm
            .decide(&algorithm.unpack(seen), now_ns, cost)
            .unwrap()
        {
            Verdict::Allow { admission, .. } => {
                self.0.store(algorithm.pack(&admission), Ordering::Relaxed); // the bug
                true
            }
            Verdict::Deny(_) => false,
        }
    }
    fn word(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[test]
#[should_panic(expected = "against a burst of 1")]
fn canary_racy_read_decide_write_is_caught() {
    explore("canary: racy load/decide/store", 3, || {
        exact_burst::<RacyStore>(2, 1)
    });
}

/// A denial writes nothing. A burst of 2 with one unit used: one thread asks
/// for 2 (denied) while another takes the last unit and then asks for one
/// more. A denial that wrote back the word it read could erase the other
/// thread's admission and let its second request in: three units from a
/// burst of 2.
fn denial_races_admission<C: WordCell<Gcra>>() {
    let algorithm = Arc::new(gcra(2));
    let cell = Arc::new(C::fresh(&algorithm));
    assert!(cell.admit(&algorithm, 0, 1));
    let units = 1 + race(&algorithm, &cell, &[&[(0, 2)], &[(0, 1), (0, 1)]]);
    assert_eq!(units, 2, "{units} units admitted from a burst of 2");
}

#[test]
fn gcra_cell_denial_writes_nothing() {
    // Bound 3: 69 executions, 3 ms (release build, the 2-core VM, 2026-11-30).
    explore(
        "gcra cell, denial vs admission",
        3,
        denial_races_admission::<Atomic<Gcra>>,
    );
}

/// Canary: the deny path stores back the word it read (a "refresh" write).
struct DenialWritesBack(AtomicU64);

impl WordCell<Gcra> for DenialWritesBack {
    fn fresh(_: &Gcra) -> Self {
        Self(AtomicU64::new(0))
    }
    fn admit(&self, algorithm: &Gcra, now_ns: u64, cost: u32) -> bool {
        let seen = self.0.load(Ordering::Relaxed);
        match algorithm
            .decide(&algorithm.unpack(seen), now_ns, cost)
            .unwrap()
        {
            Verdict::Deny(_) => {
                self.0.store(seen, Ordering::Relaxed); // the bug
                false
            }
            Verdict::Allow { admission, .. } => self
                .0
                .compare_exchange(
                    seen,
                    algorithm.pack(&admission),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok(),
        }
    }
    fn word(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[test]
#[should_panic(expected = "units admitted from a burst of 2")]
fn canary_denial_that_writes_is_caught() {
    explore(
        "canary: denial writes back",
        3,
        denial_races_admission::<DenialWritesBack>,
    );
}

// ---------------------------------------------------------------------------
// The packed fixed-window cell, with the clock moving.

const SECOND_NS: u64 = 1_000_000_000;

/// One unit per one-second window. A thread moves the clock from window 0
/// into window 1 while two others each read the clock and check, twice.
/// Whatever the interleaving, the stored window is the newest window any
/// check read (a late reading from window 0 never drags it back) with its
/// one admission, and no window admits more than one: at most one admission
/// per distinct window read. (The total is a bound, not an equality, because
/// it depends on the interleaving; the stored state is exact.)
fn window_model<C: WordCell<FixedWindow>>() {
    let algorithm = Arc::new(FixedWindow::from_quota(&Quota::per_second(1).unwrap()));
    let cell = Arc::new(C::fresh(&algorithm));
    let clock = ManualClock::new();
    let advancer = {
        let clock = clock.clone();
        thread::spawn(move || clock.advance_ns(SECOND_NS))
    };
    let checkers: Vec<_> = (0..2)
        .map(|_| {
            let (algorithm, cell, clock) =
                (Arc::clone(&algorithm), Arc::clone(&cell), clock.clone());
            thread::spawn(move || {
                (0..2)
                    .map(|_| {
                        let now_ns = clock.now_ns();
                        (now_ns / SECOND_NS, cell.admit(&algorithm, now_ns, 1))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    advancer.join().unwrap();
    let outcomes: Vec<(u64, bool)> = checkers
        .into_iter()
        .flat_map(|handle| handle.join().unwrap())
        .collect();
    let newest_read = outcomes.iter().map(|&(window, _)| window).max().unwrap();
    let stored = algorithm.unpack(cell.word());
    assert_eq!(
        stored.window_index(),
        newest_read,
        "window regressed: {outcomes:?}"
    );
    assert_eq!(
        stored.count(),
        1,
        "the newest window read holds its one admission: {outcomes:?}"
    );
    let admitted = outcomes.iter().filter(|&&(_, admitted)| admitted).count();
    let windows_read =
        1 + usize::from(newest_read == 1 && outcomes.iter().any(|&(window, _)| window == 0));
    assert!(
        admitted <= windows_read,
        "over-admitted {admitted} in {windows_read} window(s): {outcomes:?}"
    );
}

#[test]
fn fixed_window_cell_with_the_clock_advancing() {
    // Bound 3: 34 596 executions, 2.05 s (release build, the 2-core VM, 2026-11-30).
    explore(
        "fixed window cell, clock advancing",
        3,
        window_model::<Atomic<FixedWindow>>,
    );
}

/// Canary: the window comparison written `!=` instead of `>`, so a late
/// reading from an older window resets the newer one.
struct WindowNotEqual(AtomicU64);

impl WordCell<FixedWindow> for WindowNotEqual {
    fn fresh(_: &FixedWindow) -> Self {
        Self(AtomicU64::new(0))
    }
    fn admit(&self, algorithm: &FixedWindow, now_ns: u64, cost: u32) -> bool {
        let now_window = now_ns / SECOND_NS;
        let mut seen = self.0.load(Ordering::Relaxed);
        loop {
            let stored = algorithm.unpack(seen);
            // The bug: any other window, older or newer, starts afresh.
            let count = if now_window != stored.window_index() {
                0
            } else {
                stored.count()
            };
            if count + cost > 1 {
                return false;
            }
            let next = tollgate::algorithm::pack_window(now_window, count + cost, 1);
            match self
                .0
                .compare_exchange_weak(seen, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => seen = actual,
            }
        }
    }
    fn word(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[test]
#[should_panic(expected = "window regressed")]
fn canary_window_regression_is_caught() {
    explore(
        "canary: window != instead of >",
        3,
        window_model::<WindowNotEqual>,
    );
}

// ---------------------------------------------------------------------------
// Migration: moving a key to a rebuilt table while it is checked.

/// The lock-free store's rebuild, reduced to one key: `current` is the
/// table pointer, swapped under the shard's writer lock. A burst of 2; one
/// thread checks one unit twice while another migrates the key. A check that
/// meets the retired old cell retries on whatever `current` holds. Every
/// unit is admitted exactly once: the units the checker got plus those still
/// free in the final cell are exactly the burst.
fn migration_model(migrate: fn(&Atomic<Gcra>) -> Atomic<Gcra>) {
    let algorithm = Arc::new(gcra(2));
    let current = Arc::new(Mutex::new(Arc::new(Atomic::new(&*algorithm))));
    let checker = {
        let (algorithm, current) = (Arc::clone(&algorithm), Arc::clone(&current));
        thread::spawn(move || {
            (0..2)
                .map(|_| {
                    loop {
                        let cell = Arc::clone(&*current.lock().unwrap());
                        if let Some(decision) = cell.check(&algorithm, 0, 1).unwrap() {
                            break u32::from(decision.is_allowed());
                        }
                        // Retired: the migration holds the lock; let it finish.
                        thread::yield_now();
                    }
                })
                .sum::<u32>()
        })
    };
    let migrator = {
        let current = Arc::clone(&current);
        thread::spawn(move || {
            let mut table = current.lock().unwrap();
            let moved = migrate(&table);
            *table = Arc::new(moved);
        })
    };
    let admitted = checker.join().unwrap();
    migrator.join().unwrap();
    let last = Arc::clone(&*current.lock().unwrap());
    let still_free = (0..3)
        .filter(|_| last.check(&algorithm, 0, 1).unwrap().unwrap().is_allowed())
        .count();
    let units = admitted + u32::try_from(still_free).unwrap();
    assert_eq!(
        units, 2,
        "{units} units from a burst of 2 across a migration"
    );
}

#[test]
fn migration_loses_and_duplicates_no_admission() {
    // Bound 3: 200 executions, 9 ms (release build, the 2-core VM, 2026-11-30).
    explore("migration vs checks", 3, || {
        migration_model(|old| old.retire_into_new().expect("live before the migration"));
    });
}

/// Canary: a migration that copies the word without retiring the old cell,
/// so a check can still admit into the old cell after the copy.
#[test]
#[should_panic(expected = "across a migration")]
fn canary_migration_without_retiring_is_caught() {
    explore("canary: copy without retiring", 3, || {
        migration_model(|old| {
            let copy = Atomic::<Gcra>::fresh(&gcra(2));
            let word = old.load_word(); // the bug: a copy, not a swap
            let algorithm = gcra(2);
            let state = algorithm.unpack(word);
            // Rebuild the copied state in the new cell by replaying its debt:
            // admit the units the old cell had used.
            let used = 2 - algorithm.decide(&state, 0, 1).map_or(0, |verdict| {
                verdict.decision().remaining() + u32::from(verdict.decision().is_allowed())
            });
            for _ in 0..used {
                assert!(copy.admit(&algorithm, 0, 1));
            }
            copy
        });
    });
}

// ---------------------------------------------------------------------------
// Stores: eviction racing checks, and check-then-insert.

/// GCRA, one unit per second. Key 7 was admitted at 0 s; at 1 s it is idle.
/// Two threads check it while a third evicts idle keys. The key is fully
/// rested, so exactly one of the two checks is admitted, whether it lands
/// in the old cell before the eviction, or in a fresh one after it.
#[test]
fn per_key_store_eviction_races_checks() {
    // Bound 3: 9 908 executions, 562 ms (release build, the 2-core VM, 2026-11-30).
    explore("per-key store, eviction vs 2 checks", 3, || {
        let clock = ManualClock::new();
        let limiter = Arc::new(
            Builder::new(Quota::per_second(1).unwrap())
                .store(PerKey)
                .clock(clock.clone())
                .build::<u64>(),
        );
        assert!(limiter.check(&7).unwrap().is_allowed());
        clock.set_ns(1_000_000_000);
        let checker = |limiter: Arc<tollgate::RateLimiter<u64, Gcra, ManualClock, PerKey>>| {
            Box::new(move || u32::from(limiter.check(&7).unwrap().is_allowed()))
                as Box<dyn FnOnce() -> u32 + Send>
        };
        let evictor = {
            let limiter = Arc::clone(&limiter);
            Box::new(move || {
                limiter.evict_idle();
                0_u32
            }) as Box<dyn FnOnce() -> u32 + Send>
        };
        let admitted = admitted_by(vec![
            checker(Arc::clone(&limiter)),
            checker(Arc::clone(&limiter)),
            evictor,
        ]);
        assert_eq!(admitted, 1, "admitted {admitted} from one rested unit");
    });
}

/// The canary stand-in: the per-key store's shape (a mutex map of `Arc`'d
/// atomic cells, checked outside the lock) with an eviction that unlinks
/// idle cells **without retiring them first**.
struct NoTombstoneStore {
    map: Mutex<HashMap<u64, Arc<Atomic<Gcra>>>>,
}

impl NoTombstoneStore {
    fn check(&self, algorithm: &Gcra, key: u64, now_ns: u64) -> bool {
        let cell = Arc::clone(
            self.map
                .lock()
                .unwrap()
                .entry(key)
                .or_insert_with(|| Arc::new(Atomic::new(algorithm))),
        );
        cell.check(algorithm, now_ns, 1)
            .unwrap()
            .unwrap()
            .is_allowed()
    }

    fn evict_idle(&self, algorithm: &Gcra, now_ns: u64) {
        // The bug: judged idle on a load, unlinked, never retired; a check
        // holding the cell still admits into it.
        self.map
            .lock()
            .unwrap()
            .retain(|_, cell| !algorithm.is_idle(&algorithm.unpack(cell.load_word()), now_ns));
    }
}

/// Canary: eviction without a tombstone loses the race the real store wins.
#[test]
#[should_panic(expected = "from one rested unit")]
fn canary_eviction_without_tombstone_is_caught() {
    explore("canary: evict without tombstone", 3, || {
        let algorithm = Arc::new(Gcra::from_quota(&Quota::per_second(1).unwrap()));
        let store = Arc::new(NoTombstoneStore {
            map: Mutex::new(HashMap::new()),
        });
        assert!(store.check(&algorithm, 7, 0));
        let checker = |algorithm: Arc<Gcra>, store: Arc<NoTombstoneStore>| {
            Box::new(move || u32::from(store.check(&algorithm, 7, 1_000_000_000)))
                as Box<dyn FnOnce() -> u32 + Send>
        };
        let evictor = {
            let (algorithm, store) = (Arc::clone(&algorithm), Arc::clone(&store));
            Box::new(move || {
                store.evict_idle(&algorithm, SECOND_NS);
                0_u32
            }) as Box<dyn FnOnce() -> u32 + Send>
        };
        let admitted = admitted_by(vec![
            checker(Arc::clone(&algorithm), Arc::clone(&store)),
            checker(Arc::clone(&algorithm), Arc::clone(&store)),
            evictor,
        ]);
        assert_eq!(admitted, 1, "admitted {admitted} from one rested unit");
    });
}

/// Two threads check the same new key (a burst of 1) on a store: check and
/// insert are one step, so one cell is created and one check admitted.
fn check_then_insert<S: StoreKind>(store: S) {
    let limiter = Arc::new(
        Builder::new(Quota::per_hour(1).unwrap())
            .store(store)
            .clock(ManualClock::new())
            .build::<u64>(),
    );
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || u32::from(limiter.check(&9).unwrap().is_allowed()))
        })
        .collect();
    let admitted: u32 = handles
        .into_iter()
        .map(|handle| handle.join().unwrap())
        .sum();
    assert_eq!(admitted, 1, "two cells for one key: admitted {admitted}");
    assert_eq!(limiter.len(), 1);
}

#[test]
fn per_key_store_check_then_insert() {
    // Bound 3: 184 executions, 8 ms (release build, the 2-core VM, 2026-11-30).
    explore("per-key store, check-then-insert", 3, || {
        check_then_insert(PerKey)
    });
}

#[test]
fn global_mutex_store_check_then_insert() {
    // Bound 3: 34 executions, 1.5 ms (release build, the 2-core VM, 2026-11-30).
    explore("global mutex store, check-then-insert", 3, || {
        check_then_insert(GlobalMutex)
    });
}

/// Canary: look up under the lock, release it, create the cell, lock again
/// and insert (overwriting): two threads each create a cell for one key.
#[test]
#[should_panic(expected = "two cells for one key")]
fn canary_check_then_insert_with_two_fresh_cells_is_caught() {
    explore("canary: check, unlock, insert", 3, || {
        let algorithm = Arc::new(gcra(1));
        let map: Arc<Mutex<HashMap<u64, Arc<Atomic<Gcra>>>>> = Arc::new(Mutex::new(HashMap::new()));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (algorithm, map) = (Arc::clone(&algorithm), Arc::clone(&map));
                thread::spawn(move || {
                    let existing = map.lock().unwrap().get(&9).cloned();
                    let cell = existing.unwrap_or_else(|| {
                        // The bug: the lock was released between the lookup
                        // and the insert.
                        let fresh = Arc::new(Atomic::new(&*algorithm));
                        map.lock().unwrap().insert(9, Arc::clone(&fresh));
                        fresh
                    });
                    u32::from(cell.check(&algorithm, 0, 1).unwrap().unwrap().is_allowed())
                })
            })
            .collect();
        let admitted: u32 = handles
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .sum();
        assert_eq!(admitted, 1, "two cells for one key: admitted {admitted}");
    });
}
