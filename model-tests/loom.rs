//! loom models: every interleaving of each atomic protocol, up to a
//! preemption bound set per model, with canaries (deliberately broken
//! variants that loom must catch at the same bound).
//!
//! Run: `cargo loom` (an alias in `.cargo/config.toml`), or
//! `cargo test --features loom`, which hands over to it
//! (`model-tests/cargo_loom.rs`). The models build only with
//! `--cfg tollgate_loom`, a flag no Cargo feature or profile can set, and
//! need a release build, in a target directory of their own so that the
//! flag does not rebuild the ordinary one: the alias spells that out, and `cargo loom <filter>` runs
//! some of them. Each model prints how many executions loom explored
//! (`cargo loom -- --nocapture` shows them); notes/07-model-checking.md
//! records them with their times.

#![cfg(all(feature = "loom", tollgate_loom))]

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
use std::time::Duration;

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use tollgate::Decision;
use tollgate::algorithm::{
    Algorithm, Carry, FixedWindow, Gcra, PackedAlgorithm, SlidingWindowCounter,
    SlidingWindowCounterState, Verdict,
};
use tollgate::canary::{self, Canary};
use tollgate::cell::{Adaptive, Atomic, Cell};
use tollgate::clock::{Clock, ManualClock};
use tollgate::store::{GlobalMutex, LockFree, PerKey, StoreKind};
use tollgate::{Builder, Quota, RateLimiter};

/// Runs `model` under loom with `preemption_bound`, and prints how many
/// executions were explored.
fn explore(name: &str, preemption_bound: usize, model: impl Fn() + Sync + Send + 'static) {
    explore_with(None, name, preemption_bound, model);
}

/// The same with `canary` planted in the crate (see `tollgate::canary`) for
/// the whole run; it is removed again when the run ends or panics.
fn explore_with(
    canary: Option<Canary>,
    name: &str,
    preemption_bound: usize,
    model: impl Fn() + Sync + Send + 'static,
) {
    /// Removes the canary even when the model panics (a canary's model is
    /// meant to).
    struct Unplant;
    impl Drop for Unplant {
        fn drop(&mut self) {
            canary::plant(None);
        }
    }
    canary::plant(canary);
    let _unplant = Unplant;
    let executions = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&executions);
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemption_bound);
    // Branches are loom's scheduling points in one execution; the table
    // models' single-threaded setup (a dozen inserts through two rebuilds,
    // each taking a grace period's barrier and snapshot) passes the default
    // 1 000.
    builder.max_branches = 20_000;
    let started = std::time::Instant::now();
    builder.check(move || {
        counted.fetch_add(1, StdOrdering::Relaxed);
        model();
    });
    // Every model runs threads that race: one execution means loom saw no
    // interleaving to explore, and a green run would check nothing (an
    // offset's writer that loads the slots it then stores does this).
    let explored = executions.load(StdOrdering::Relaxed);
    assert!(explored > 1, "loom {name}: {explored} execution explored");
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
    /// Whether one unit would be admitted at `now_ns`, changing nothing.
    fn would_admit(&self, algorithm: &A, now_ns: u64) -> bool;
}

impl<A: PackedAlgorithm> WordCell<A> for Atomic<A> {
    fn fresh(algorithm: &A) -> Self {
        <Atomic<A> as Cell<A>>::new(algorithm)
    }
    fn admit(&self, algorithm: &A, now_ns: u64, cost: u32) -> bool {
        self.check(algorithm, now_ns, cost)
            .unwrap()
            .unwrap()
            .is_allowed()
    }
    fn would_admit(&self, algorithm: &A, now_ns: u64) -> bool {
        self.peek(algorithm, now_ns, 1)
            .unwrap()
            .unwrap()
            .is_allowed()
    }
}

/// Whether one unit would be admitted on `word` at `now_ns`: the canaries'
/// `would_admit`.
fn word_would_admit<A: PackedAlgorithm>(algorithm: &A, word: u64, now_ns: u64) -> bool {
    algorithm
        .decide(&algorithm.unpack(word), now_ns, 1)
        .unwrap()
        .decision()
        .is_allowed()
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
    // Bound 3: 112 executions, 5 ms (release build, the 2-core VM).
    explore("gcra cell, 2 threads, burst 1", 3, || {
        exact_burst::<Atomic<Gcra>>(2, 1)
    });
}

#[test]
fn gcra_cell_three_threads_admit_exactly_the_burst() {
    // Bound 3: 17 438 executions, 1.16 s (release build, the 2-core VM).
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
    fn would_admit(&self, algorithm: &Gcra, now_ns: u64) -> bool {
        word_would_admit(algorithm, self.0.load(Ordering::Relaxed), now_ns)
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
    // Bound 3: 69 executions, 3 ms (release build, the 2-core VM).
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
    fn would_admit(&self, algorithm: &Gcra, now_ns: u64) -> bool {
        word_would_admit(algorithm, self.0.load(Ordering::Relaxed), now_ns)
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
/// one admission, so a check in that window is denied, and no window admits
/// more than one: at most one admission per distinct window read. (The total
/// is a bound, not an equality, because it depends on the interleaving; the
/// stored state is exact.)
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
    // Every check read a window at most `newest_read`, and the newest one was
    // read by a check that admitted or found it full: its one unit is used.
    assert!(
        !cell.would_admit(&algorithm, newest_read * SECOND_NS),
        "window regressed: window {newest_read} admits again after {outcomes:?}"
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
    // Bound 3: 34 596 executions, 2.05 s (release build, the 2-core VM).
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
            // The documented layout for a burst of 1: the window index above
            // a one-bit count.
            let next = (now_window << 1) | u64::from(count + cost);
            match self
                .0
                .compare_exchange_weak(seen, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => seen = actual,
            }
        }
    }
    fn would_admit(&self, algorithm: &FixedWindow, now_ns: u64) -> bool {
        word_would_admit(algorithm, self.0.load(Ordering::Relaxed), now_ns)
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
// The sliding window counter's packed cell (`Adaptive`, in its packed form).

/// Two units per one-second window, one used at 0 s. Two threads check one
/// unit at 1.5 s (window 1, where window 0's unit weighs half) and a third
/// arrives with a late reading from window 0 (0.9 s), which admits if it
/// decides on window 0's word and is denied on window 1's (read at its
/// first instant, where window 0 weighs whole). Each thread checks once, so
/// a correct cell is linearizable: its outcomes and its final state (read
/// through decisions at four later instants, for one and two units) are
/// those of one of the six serial orders, replayed with the pure counter.
/// Between them the orders admit one unit or two; none admits both checks
/// at 1.5 s.
fn counter_window_roll() {
    const SECOND_NS: u64 = 1_000_000_000;
    const READINGS_NS: [u64; 3] = [3 * SECOND_NS / 2, 3 * SECOND_NS / 2, 9 * SECOND_NS / 10];
    const PROBES_NS: [u64; 4] = [
        3 * SECOND_NS / 2,
        2 * SECOND_NS,
        5 * SECOND_NS / 2,
        29 * SECOND_NS / 10,
    ];
    let counter = Arc::new(SlidingWindowCounter::from_quota(
        &Quota::per_second(2).unwrap(),
    ));
    assert!(counter.packs());
    let cell = Arc::new(Adaptive::new(&counter));
    assert!(cell.check(&counter, 0, 1).unwrap().unwrap().is_allowed());
    let handles: Vec<_> = READINGS_NS
        .into_iter()
        .map(|now_ns| {
            let (counter, cell) = (Arc::clone(&counter), Arc::clone(&cell));
            thread::spawn(move || {
                cell.check(&counter, now_ns, 1)
                    .unwrap()
                    .unwrap()
                    .is_allowed()
            })
        })
        .collect();
    let outcomes: Vec<bool> = handles
        .into_iter()
        .map(|handle| handle.join().unwrap())
        .collect();
    let probe = |decide: &dyn Fn(u64, u32) -> Decision| -> Vec<Decision> {
        PROBES_NS
            .iter()
            .flat_map(|&now_ns| [decide(now_ns, 1), decide(now_ns, 2)])
            .collect()
    };
    let observed = (
        outcomes,
        probe(&|now_ns, cost| cell.peek(&counter, now_ns, cost).unwrap().unwrap()),
    );
    let mut first = SlidingWindowCounterState::default();
    assert!(counter.check(&mut first, 0, 1).unwrap().is_allowed());
    let orders = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    let serial: Vec<(Vec<bool>, Vec<Decision>)> = orders
        .iter()
        .map(|order| {
            let mut state = first;
            let mut outcomes = vec![false; 3];
            for &thread in order {
                outcomes[thread] = counter
                    .check(&mut state, READINGS_NS[thread], 1)
                    .unwrap()
                    .is_allowed();
            }
            let state = state;
            let decisions =
                probe(&|now_ns, cost| counter.decide(&state, now_ns, cost).unwrap().decision());
            (outcomes, decisions)
        })
        .collect();
    assert!(
        serial.contains(&observed),
        "not linearizable: outcomes {:?} match no serial order",
        observed.0
    );
}

#[test]
fn sliding_counter_packed_cell_across_a_window_roll() {
    explore(
        "sliding counter packed cell, window roll",
        3,
        counter_window_roll,
    );
}

/// Canary, planted in the atomic cell itself: an admission stores its word
/// instead of compare-and-swapping it, so both checks at 1.5 s can admit
/// (or the late reading's admission be overwritten).
#[test]
#[should_panic(expected = "not linearizable")]
fn canary_counter_store_instead_of_cas_is_caught() {
    explore_with(
        Some(Canary::StoreInsteadOfCas),
        "canary: counter cell stores instead of CAS",
        3,
        counter_window_roll,
    );
}

// ---------------------------------------------------------------------------
// The lock-free store, on the real table: its read-copy-update
// (`sync::rcu`: the readers' records, the writers' barrier, which under loom
// is an exchange on each entry and a read-modify-write of every record, and
// their snapshots) runs on loom's primitives, and every slot access goes
// through loom's `UnsafeCell`, which reports any read of a slot not ordered
// after its write. A replaced table is poisoned rather than freed under
// loom (every slot written, as a free writes what it frees), and a check
// asserts before it leaves its section that the table it read was not.

/// A fixed hasher: loom replays each execution, so the slots a key lands in
/// must not change from one execution to the next (std's `RandomState`
/// would seed each run differently).
type FixedHasher = BuildHasherDefault<DefaultHasher>;

/// The lock-free store with one shard, so that every key shares one table.
type OneTable<K = u64> = RateLimiter<K, Gcra, ManualClock, LockFree<FixedHasher>>;

fn one_table(quota: Quota, clock: &ManualClock) -> Arc<OneTable> {
    one_table_of(quota, clock)
}

fn one_table_of<K: tollgate::store::Key>(quota: Quota, clock: &ManualClock) -> Arc<OneTable<K>> {
    Arc::new(
        Builder::new(quota)
            .store(LockFree::new(1).with_hasher(FixedHasher::default()))
            .clock(clock.clone())
            .build(),
    )
}

/// Set in the child process a table canary runs in.
const CANARY_CHILD: &str = "TOLLGATE_LOOM_CANARY_CHILD";

/// Runs a canary of the lock-free table in a child process (this test
/// binary, running only `test`), and asserts that it failed with `expected`.
///
/// A child, because a caught canary panics inside the model, and loom may
/// then drop the model's statics and thread-locals (loom objects) after its
/// execution state is gone, which panics again and aborts the process. The
/// child's failure is the expected outcome; a child that exits
/// successfully means the checker missed the planted bug, and fails the
/// test.
fn canary_in_child(test: &str, expected: &str, model: impl FnOnce()) {
    if std::env::var_os(CANARY_CHILD).is_some() {
        model();
        return;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(CANARY_CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "{test}: the planted bug was not caught\n{stderr}"
    );
    assert!(
        stderr.contains(expected),
        "{test}: failed, but not with {expected:?}\n{stderr}"
    );
    println!("{test}: caught ({expected:?}), {}", output.status);
}

/// Runs `check` on its own loom thread.
fn spawn_on<K: tollgate::store::Key, R: Send + 'static>(
    limiter: &Arc<OneTable<K>>,
    check: impl FnOnce(&OneTable<K>) -> R + Send + 'static,
) -> thread::JoinHandle<R> {
    let limiter = Arc::clone(limiter);
    thread::spawn(move || check(&limiter))
}

fn allowed(limiter: &OneTable, key: u64) -> bool {
    limiter.check(&key).unwrap().is_allowed()
}

/// A new key is inserted (its slot written, then its control byte published)
/// while another thread reads it through the lock-free path. The reader sees
/// the key fresh (before the insert) or holding the inserter's admission,
/// never a torn slot; a burst of 2 gives exactly 2.
fn insert_against_lookup() {
    let clock = ManualClock::new();
    let limiter = one_table(Quota::per_hour(2).unwrap(), &clock);
    let inserter = spawn_on(&limiter, |limiter| allowed(limiter, 5));
    let reader = spawn_on(&limiter, |limiter| limiter.peek(&5).unwrap().remaining());
    assert!(inserter.join().unwrap());
    let remaining = reader.join().unwrap();
    assert!(remaining <= 1, "peeked {remaining} remaining of 2");
    assert!(allowed(&limiter, 5));
    assert!(!allowed(&limiter, 5), "a third unit from a burst of 2");
}

#[test]
fn lock_free_insert_against_lookup() {
    explore(
        "lock-free table, insert vs lookup",
        3,
        insert_against_lookup,
    );
}

/// Canary: the control byte published `Relaxed`: a reader can reach the
/// slot without the write of its key being visible, which loom reports.
#[test]
fn canary_relaxed_publish_is_caught() {
    canary_in_child(
        "canary_relaxed_publish_is_caught",
        "Causality violation",
        || {
            explore_with(
                Some(Canary::RelaxedPublish),
                "canary: relaxed publish",
                2,
                insert_against_lookup,
            );
        },
    );
}

/// Two threads check the same new key (a burst of 1): the second finds the
/// first's slot under the shard's lock, so the key gets one slot and one
/// admission.
#[test]
fn lock_free_two_inserters_of_one_key() {
    explore("lock-free table, two inserters of one key", 3, || {
        let limiter = one_table(Quota::per_hour(1).unwrap(), &ManualClock::new());
        let first = spawn_on(&limiter, |limiter| allowed(limiter, 9));
        let second = spawn_on(&limiter, |limiter| allowed(limiter, 9));
        let admitted = u32::from(first.join().unwrap()) + u32::from(second.join().unwrap());
        assert_eq!(admitted, 1, "two slots for one key: admitted {admitted}");
        assert_eq!(limiter.len(), 1);
    });
}

/// A `u64` key whose comparison yields to loom's scheduler: a check that
/// compares it is inside its read section and has read the key from its slot, and the yield
/// lets every other thread run there without spending a preemption. Its
/// hash is the `u64`'s, so the table's layout is that of `u64` keys.
#[derive(Clone, Debug)]
struct YieldingKey(u64);

impl std::hash::Hash for YieldingKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl PartialEq for YieldingKey {
    fn eq(&self, other: &Self) -> bool {
        thread::yield_now();
        self.0 == other.0
    }
}

impl Eq for YieldingKey {}

/// A hot key (a burst of 2, one unit used) is checked while another thread
/// inserts the key that fills its 8-bucket table, which rebuilds it into 11
/// buckets and moves the hot key's cell. The hot key admits exactly its
/// burst: the check lands before the move (and is carried over) or after it
/// (in the new table), never in a cell left behind; and the old table is
/// freed only after the check has left it. Keys are `YieldingKey`s.
fn check_against_rebuild() {
    check_against_rebuild_with(YieldingKey);
}

/// The same model with the keys `key` makes of `0..8`.
fn check_against_rebuild_with<K: tollgate::store::Key>(key: fn(u64) -> K) {
    let limiter = one_table_of(Quota::per_hour(2).unwrap(), &ManualClock::new());
    let allowed = move |limiter: &OneTable<K>, n| limiter.check(&key(n)).unwrap().is_allowed();
    // 7 keys: the most an 8-bucket table holds (one bucket stays empty).
    for n in 0..7 {
        assert!(allowed(&limiter, n));
    }
    let hot = spawn_on(&limiter, move |limiter| allowed(limiter, 0));
    let inserter = spawn_on(&limiter, move |limiter| allowed(limiter, 7));
    assert!(hot.join().unwrap(), "the hot key's second unit");
    assert!(inserter.join().unwrap());
    assert!(!allowed(&limiter, 0), "a third unit from a burst of 2");
    assert_eq!(limiter.len(), 8);
}

/// Bound 3, like eviction and compaction, with the keys' comparison
/// yielding (`YieldingKey`). The check against the retiring move of its
/// cell and against the new table's publication each need one preemption.
/// A free that overtakes a reader needs the reader paused between a read of
/// the old table and the end of its section while the writer frees: the
/// yield gives such a pause at each key comparison (not between the
/// pointer's load and the control bytes, nor between the cell's load and
/// its compare-and-swap) with no preemption spent. The canaries below are
/// caught at bound 1, the retire-before-unlink canary with `u64` keys too.
/// (On crossbeam-epoch, whose pin and collector are many more atomic
/// operations, bound 1 took 83 376 executions and bound 2 ran past CI's
/// hour; the store's own read-copy-update takes a few per section, and
/// bound 3 takes under two thousand: notes/07.)
#[test]
fn lock_free_check_against_rebuild() {
    explore(
        "lock-free table, hot-key check vs 8->11 rebuild",
        3,
        check_against_rebuild,
    );
}

/// A check of a key that has taken 1 of its 2 units races a raise of the
/// quota to 4, carried as is: the check lands before the change (admitted
/// under 2, then 4 of 4 used) or after it (3 of 4 used, then admitted),
/// never on a carried state by the old quota's algorithm or on a cell the
/// change left behind. Either way it is admitted and the key has nothing
/// left.
fn check_against_change() {
    let limiter = one_table(Quota::per_hour(2).unwrap(), &ManualClock::new());
    assert!(allowed(&limiter, 0));
    let check = spawn_on(&limiter, |limiter| allowed(limiter, 0));
    let change = spawn_on(&limiter, |limiter| {
        limiter
            .set_quota(Quota::per_hour(4).unwrap(), Carry::AsIs)
            .unwrap();
    });
    change.join().unwrap();
    assert!(check.join().unwrap(), "the check racing the change");
    assert!(!allowed(&limiter, 0), "a unit past the carried state");
    assert_eq!(limiter.quota(), Quota::per_hour(4).unwrap());
}

/// Bound 3, as the rebuild model: the change is a rebuild that carries
/// each state.
#[test]
fn lock_free_check_against_change() {
    explore(
        "lock-free table, check vs a quota change",
        3,
        check_against_change,
    );
}

/// Canary: the check decides by the generation of a table loaded before
/// the one it reads the cell in.
#[test]
fn canary_generation_apart_is_caught() {
    rebuild_canary(
        "canary_generation_apart_is_caught",
        Canary::GenerationApart,
        "the check racing the change",
        check_against_change,
    );
}

/// The first check that carries a quota of its own (4 an hour) races a
/// cut of the limiter's quota from 2 to 1 an hour, carried as is. The tier
/// key lands before the change froze its shard (the change sees the mark
/// and carries it unchanged) or after (in the new generation): either way
/// it has exactly 3 of its 4 left, never the 4 a rescaling by the
/// limiter's numbers would hand back.
fn tier_check_against_change() {
    let limiter = one_table(Quota::per_hour(2).unwrap(), &ManualClock::new());
    let tier = spawn_on(&limiter, |limiter| {
        limiter
            .check_with(&1, &Quota::per_hour(4).unwrap())
            .unwrap()
            .is_allowed()
    });
    let change = spawn_on(&limiter, |limiter| {
        limiter
            .set_quota(Quota::per_hour(1).unwrap(), Carry::AsIs)
            .is_ok()
    });
    let changed = change.join().unwrap();
    assert!(tier.join().unwrap());
    let pro = Quota::per_hour(4).unwrap();
    let left = (0..5)
        .take_while(|_| limiter.check_with(&1, &pro).unwrap().is_allowed())
        .count();
    assert_eq!(left, 3, "the tier key after a change (changed: {changed})");
}

/// Bound 3, as the other change model: the mark, the check's
/// compare-and-swap, and the change's retiring swap and read of the mark.
#[test]
fn lock_free_tier_check_against_change() {
    explore(
        "lock-free table, a first tier check vs a quota change",
        3,
        tier_check_against_change,
    );
}

/// Canary: the change does not read the mark again once the shard is
/// frozen.
#[test]
fn canary_carry_ignores_mark_is_caught() {
    rebuild_canary(
        "canary_carry_ignores_mark_is_caught",
        Canary::CarryIgnoresMark,
        "the tier key after a change",
        tier_check_against_change,
    );
}

/// The rebuild's canaries, each at the model's bound on `model` (the
/// rebuild model, with one key type or another): the planted bug, what
/// loom must report.
fn rebuild_canary(test: &str, canary: Canary, expected: &str, model: fn()) {
    canary_in_child(test, expected, || {
        explore_with(Some(canary), &format!("canary: {canary:?}"), 1, model);
    });
}

/// What loom reports when a check reads a slot of a table freed (poisoned,
/// under loom: every slot written, as a free writes what it frees) with
/// nothing ordering the read before the free. The check's own assertion
/// that the table it read is not poisoned comes after, and would catch a
/// free that came before in schedule order only.
const READ_AFTER_FREE: &str = "Causality violation";

/// Canary: the replaced table freed at once, without waiting for the check
/// that may still be reading it: the check reads a slot the free wrote.
#[test]
fn canary_free_without_grace_is_caught() {
    rebuild_canary(
        "canary_free_without_grace_is_caught",
        Canary::FreeWithoutGrace,
        READ_AFTER_FREE,
        check_against_rebuild,
    );
}

/// Canary: the old table's snapshot of sections taken before it is
/// unlinked; the table is freed while a check that entered after the
/// snapshot still reads it.
#[test]
fn canary_retire_before_unlink_is_caught() {
    rebuild_canary(
        "canary_retire_before_unlink_is_caught",
        Canary::RetireBeforeUnlink,
        READ_AFTER_FREE,
        check_against_rebuild,
    );
}

/// The same canary with plain `u64` keys, whose comparison does not yield:
/// loom still finds a schedule with one preemption.
#[test]
fn canary_retire_before_unlink_is_caught_with_u64_keys() {
    rebuild_canary(
        "canary_retire_before_unlink_is_caught_with_u64_keys",
        Canary::RetireBeforeUnlink,
        READ_AFTER_FREE,
        || check_against_rebuild_with(|n| n),
    );
}

/// Canary of the read-copy-update itself: a reader's entry store with no
/// fence after it (the writer still fences). The writer's snapshot can read
/// the record from before the entry while the reader's load of the table
/// pointer reads from before the swap (store buffering): the table is
/// freed under the check.
#[test]
fn canary_reader_entry_without_fence_is_caught() {
    rebuild_canary(
        "canary_reader_entry_without_fence_is_caught",
        Canary::ReaderEntryWithoutFence,
        READ_AFTER_FREE,
        check_against_rebuild,
    );
}

/// Canary of the read-copy-update itself: the writer's snapshot with no
/// barrier before it (the readers still fence): as above, from the other
/// side.
#[test]
fn canary_writer_without_barrier_is_caught() {
    rebuild_canary(
        "canary_writer_without_barrier_is_caught",
        Canary::WriterWithoutBarrier,
        READ_AFTER_FREE,
        check_against_rebuild,
    );
}

/// Canary: a reader's exit store `Relaxed` (the snapshot reads the change,
/// but nothing orders the section's reads of the old table before the
/// free). Caught because the poisoning that stands in for the free writes
/// every slot through loom's `UnsafeCell`, as a free writes the memory it
/// frees: a read of a slot that does not happen before it is a causality
/// violation (a flag compared in schedule order could not see the missing
/// edge).
#[test]
fn canary_relaxed_section_exit_is_caught() {
    rebuild_canary(
        "canary_relaxed_section_exit_is_caught",
        Canary::RelaxedSectionExit,
        READ_AFTER_FREE,
        check_against_rebuild,
    );
}

/// The same canary at the model's own bound (3).
#[test]
fn canary_relaxed_section_exit_is_caught_at_bound_3() {
    canary_in_child(
        "canary_relaxed_section_exit_is_caught_at_bound_3",
        READ_AFTER_FREE,
        || {
            explore_with(
                Some(Canary::RelaxedSectionExit),
                "canary: relaxed section exit, bound 3",
                3,
                check_against_rebuild,
            );
        },
    );
}

/// Canary: the new table published with a `Relaxed` swap: a check reads a
/// moved cell's slot with nothing ordering it after the move's write.
#[test]
fn canary_relaxed_table_swap_is_caught() {
    rebuild_canary(
        "canary_relaxed_table_swap_is_caught",
        Canary::RelaxedTableSwap,
        "Causality violation",
        check_against_rebuild,
    );
}

/// One unit per second. Key 7 was admitted at 0 s; at 1 s it is idle. One
/// thread checks it while another evicts idle keys. The key is fully
/// rested, so the check is admitted, whether it lands in the old cell
/// before the eviction (which then finds it busy) or in a fresh one after
/// it, and the key holds that admission: the next check is denied.
fn check_against_eviction() {
    let clock = ManualClock::new();
    let limiter = one_table(Quota::per_second(1).unwrap(), &clock);
    assert!(allowed(&limiter, 7));
    clock.set(Duration::from_secs(1));
    let checker = spawn_on(&limiter, |limiter| allowed(limiter, 7));
    let evictor = spawn_on(&limiter, OneTable::evict_idle);
    assert!(checker.join().unwrap(), "a rested key is admitted");
    let evicted = evictor.join().unwrap();
    assert!(
        !allowed(&limiter, 7),
        "the admission was lost to the eviction (evicted {evicted})"
    );
    assert_eq!(limiter.len(), 1);
}

/// Bound 3, as for compaction below: the check against the sweep that
/// tombstones its cell needs one preemption; `evict_idle` also compacts the
/// table it leaves with a tombstone and waits for its grace period (on
/// crossbeam-epoch, bound 2 ran past 15 minutes: notes/07).
#[test]
fn lock_free_check_against_eviction() {
    explore(
        "lock-free table, check vs eviction",
        3,
        check_against_eviction,
    );
}

/// Canary: eviction that judges a key idle and deletes its slot without
/// retiring its cell: the admission that lands in between is lost.
#[test]
fn canary_eviction_without_tombstone_is_caught() {
    canary_in_child(
        "canary_eviction_without_tombstone_is_caught",
        "the admission was lost to the eviction",
        || {
            explore_with(
                Some(Canary::EvictWithoutTombstone),
                "canary: evict without tombstone",
                1,
                check_against_eviction,
            );
        },
    );
}

/// A burst of 2 at one per 30 minutes. Key 100 is drained at 0 s, idle at
/// 1 h, and evicted then (its slot becomes a tombstone) while 3 other keys
/// are busy; it is drained again at 1 h, into a new slot. At 1 h 31 min the
/// 3 others are idle and key 100 has one unit back. One thread checks it
/// while another evicts the 3 and compacts the table: rebuilds it without
/// its tombstones, moving key 100. (At the same size, 8 buckets: a table
/// is shrunk only once it has four times the buckets its keys need. With
/// the 9/8 sizing, a model that shrank needed 28 keys and ran past 20
/// minutes at bound 1, and one of 14 keys at 75 % load past 12; each probe
/// step and each swept key is a scheduling point. Shrinking is the
/// ordinary tests' to check; the race with the move is the same.) Its one
/// unit is admitted exactly once.
fn check_against_compaction() {
    const MINUTE: Duration = Duration::from_secs(60);
    let clock = ManualClock::new();
    let limiter = one_table(Quota::per_hour(2).unwrap(), &clock);
    assert!(limiter.check_n(&100, 2).unwrap().is_allowed());
    clock.set(60 * MINUTE);
    for key in 0..3 {
        assert!(allowed(&limiter, key));
    }
    assert_eq!(limiter.evict_idle(), 1);
    assert!(limiter.check_n(&100, 2).unwrap().is_allowed());
    clock.set(91 * MINUTE);
    let checker = spawn_on(&limiter, |limiter| allowed(limiter, 100));
    let evictor = spawn_on(&limiter, OneTable::evict_idle);
    assert!(checker.join().unwrap(), "the unit refilled by 1 h 30 min");
    assert_eq!(evictor.join().unwrap(), 3);
    assert!(
        !allowed(&limiter, 100),
        "key 100 admitted a unit twice across the compaction"
    );
    assert_eq!(
        limiter.len(),
        1,
        "len() differs from the keys the table holds"
    );
}

/// Bound 3: the race this model is for (the check against the swap that
/// retires its cell, and against the publication of the smaller table)
/// needs one preemption (on crossbeam-epoch, bound 2 took 2.5 million
/// executions and 16 minutes, past CI's budget: notes/07).
#[test]
fn lock_free_check_against_compaction() {
    explore(
        "lock-free table, check vs compaction",
        3,
        check_against_compaction,
    );
}

/// Canary: a rebuild that copies evicted (tombstoned) slots as if live. The
/// rebuild that follows the eviction at 1 h brings key 100 back, uncounted,
/// so `len()` no longer counts the keys the table holds.
#[test]
fn canary_rebuild_copying_a_tombstone_is_caught() {
    canary_in_child(
        "canary_rebuild_copying_a_tombstone_is_caught",
        "len() differs from the keys the table holds",
        || {
            explore_with(
                Some(Canary::RebuildCopiesTombstone),
                "canary: rebuild copies a tombstone",
                1,
                check_against_compaction,
            );
        },
    );
}

// ---------------------------------------------------------------------------
// The mutex stores: eviction racing checks, and check-then-insert.

/// GCRA, one unit per second. Key 7 was admitted at 0 s; at 1 s it is idle.
/// Two threads check it while a third evicts idle keys. The key is fully
/// rested, so exactly one of the two checks is admitted, whether it lands
/// in the old cell before the eviction, or in a fresh one after it.
#[test]
fn per_key_store_eviction_races_checks() {
    // Bound 3: 9 908 executions, 562 ms (release build, the 2-core VM).
    explore("per-key store, eviction vs 2 checks", 3, || {
        let clock = ManualClock::new();
        let limiter = Arc::new(
            Builder::new(Quota::per_second(1).unwrap())
                .store(PerKey::new())
                .clock(clock.clone())
                .build::<u64>(),
        );
        assert!(limiter.check(&7).unwrap().is_allowed());
        clock.set_ns(1_000_000_000);
        let checker = |limiter: Arc<RateLimiter<u64, Gcra, ManualClock, PerKey>>| {
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

/// Two threads check the same new key (a burst of 1) on a store: check and
/// insert are one step, so one cell is created and one check admitted.
fn check_then_insert<S: StoreKind<u64, Gcra>>(store: S) {
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
    // Bound 3: 184 executions, 8 ms (release build, the 2-core VM).
    explore("per-key store, check-then-insert", 3, || {
        check_then_insert(PerKey::new())
    });
}

#[test]
fn global_mutex_store_check_then_insert() {
    // Bound 3: 34 executions, 1.5 ms (release build, the 2-core VM).
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

/// The clocks' offset (`tollgate::remote`): a reader never sees a torn
/// pair, nor a bound below its pair's floor, while a writer records two
/// round trips, each rewriting the slot that is not the current one (the
/// second, the one the reader may be reading). The third round trip finds
/// the remote's clock stepped back: its own bound at the reading is below
/// the floor it carries (the second pair's bound at its receipt), which is
/// what the reader must see. Each pair gives a distinct bound at the
/// reading below; a reading from the fields of two pairs, or without the
/// floor, gives none of them.
fn offset_reads_one_pair() {
    let offset = Arc::new(tollgate::remote::Offset::new(
        tollgate::remote::RemoteClock::One,
    ));
    // (remote µs, sent ns, received ns): b = 1 000, 4 000 and 0; at =
    // 1 000, 2 000, 3 000; the third received at 9 000, when the second
    // allowed 9 000 + 4 000 + 13 of drift.
    offset.observe(1, 1_000, 1_000);
    let writer = {
        let offset = Arc::clone(&offset);
        thread::spawn(move || {
            offset.observe(5, 2_000, 2_000);
            offset.observe(2, 3_000, 9_000);
        })
    };
    let read = offset.remote_ns(10_000).expect("a round trip was recorded");
    writer.join().unwrap();
    // t + b + |t − at| / 512 for the first two pairs; the third's floor.
    let consistent = [10_000 + 1_000 + 17, 10_000 + 4_000 + 15, 13_013];
    assert!(
        consistent.contains(&read),
        "the offset: {read} is none of {consistent:?}"
    );
}

#[test]
fn offset_reader_sees_one_pair() {
    explore(
        "offset: a reader against two round trips",
        3,
        offset_reads_one_pair,
    );
}

#[test]
#[should_panic(expected = "the offset")]
fn canary_offset_torn_read_is_caught() {
    explore_with(
        Some(Canary::OffsetTornRead),
        "canary: offset read without its version check",
        3,
        offset_reads_one_pair,
    );
}

#[test]
#[should_panic(expected = "the offset")]
fn canary_bound_falls_back_is_caught_by_loom() {
    explore_with(
        Some(Canary::BoundFallsBack),
        "canary: a new pair without its floor",
        3,
        offset_reads_one_pair,
    );
}

/// A reader stalled inside the store (a thread inside a read section of the
/// store's read-copy-update, as a check whose key's `Eq` blocks would) while new
/// keys grow the one table through its rebuilds. The first two rebuilds
/// keep their replaced tables for the reader; the third would keep a third,
/// so it is refused, and its key gets `Reclaiming`, before 64 keys; once the
/// reader leaves, that key is admitted.
fn stalled_reader_keeps_two_replaced_tables() {
    use loom::sync::atomic::AtomicBool;

    let limiter = one_table(Quota::per_hour(1).unwrap(), &ManualClock::new());
    let (pinned, release) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let reader = {
        let (pinned, release) = (Arc::clone(&pinned), Arc::clone(&release));
        thread::spawn(move || {
            let guard = tollgate::lab_hooks::pin();
            pinned.store(true, Ordering::SeqCst);
            while !release.load(Ordering::SeqCst) {
                thread::yield_now();
            }
            drop(guard);
        })
    };
    while !pinned.load(Ordering::SeqCst) {
        thread::yield_now();
    }
    let refused = (0..64).find(|&key| match limiter.check(&key) {
        Ok(decision) => {
            assert!(decision.is_allowed(), "a new key {key} denied");
            false
        }
        Err(tollgate::CheckError::Reclaiming) => true,
        Err(error) => panic!("key {key}: {error}"),
    });
    release.store(true, Ordering::SeqCst);
    reader.join().unwrap();
    let refused = refused.expect("the stall: 64 new keys admitted, every replaced table kept");
    assert!(allowed(&limiter, refused), "key {refused} after the stall");
}

#[test]
fn a_stalled_reader_keeps_at_most_two_replaced_tables() {
    explore(
        "lock-free: a reader stalled through the table's rebuilds",
        3,
        stalled_reader_keeps_two_replaced_tables,
    );
}

/// Canary: every rebuild goes on and keeps its replaced table, as the first
/// version did.
#[test]
fn canary_keep_every_replaced_table_is_caught() {
    rebuild_canary(
        "canary_keep_every_replaced_table_is_caught",
        Canary::KeepEveryReplacedTable,
        "the stall",
        stalled_reader_keeps_two_replaced_tables,
    );
}

// ---------------------------------------------------------------------------
// All or nothing: `check_all` and the refunds behind it.

/// Two requests through a per-user limit (a fixed window of 3 a key on the
/// lock-free store) and a shared one (GCRA, burst 1), all or nothing, while
/// a third thread checks the per-user limit alone. The shared limit admits
/// exactly one request; the other's per-user unit is given back whatever
/// the interleaving of its refund with the third thread's admission, so
/// the per-user key holds exactly two units: one more is admitted, then
/// none.
fn all_or_nothing() {
    let clock = ManualClock::new();
    let per_user = Arc::new(
        Builder::new(Quota::per_hour(3).unwrap())
            .algorithm::<FixedWindow>()
            .store(LockFree::new(1).with_hasher(FixedHasher::default()))
            .clock(clock.clone())
            .build::<u64>(),
    );
    let shared = one_table(Quota::per_hour(1).unwrap(), &clock);
    let requests: Vec<_> = (0..2)
        .map(|_| {
            let (per_user, shared) = (Arc::clone(&per_user), Arc::clone(&shared));
            thread::spawn(move || {
                tollgate::check_all([&per_user.on(&1), &shared.on(&0)])
                    .unwrap()
                    .is_allowed()
            })
        })
        .collect();
    let alone = {
        let per_user = Arc::clone(&per_user);
        thread::spawn(move || per_user.check(&1).unwrap().is_allowed())
    };
    let admitted = requests
        .into_iter()
        .map(|handle| u32::from(handle.join().unwrap()))
        .sum::<u32>();
    assert!(alone.join().unwrap());
    assert_eq!(admitted, 1, "the shared limit admits one");
    let kept = per_user.check(&1).unwrap().is_allowed();
    let over = per_user.check(&1).unwrap().is_allowed();
    assert!(
        kept && !over,
        "per-user units wrong: one more admitted {kept}, two more {over}"
    );
}

#[test]
fn all_or_nothing_gives_back_the_refused_request() {
    // Bound 3: 151 513 executions, 14 s (release build, the 2-core VM).
    explore("all or nothing", 3, all_or_nothing);
}

#[test]
fn canary_update_without_cas_is_caught() {
    canary_in_child(
        "canary_update_without_cas_is_caught",
        "per-user units wrong",
        || {
            explore_with(
                Some(Canary::UpdateWithoutCas),
                "canary: a refund stores instead of CAS",
                2,
                all_or_nothing,
            );
        },
    );
}
