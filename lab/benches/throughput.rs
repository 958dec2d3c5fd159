//! Throughput benches, each varying one thing, at 1, 2 and 4 threads (the
//! machine this was written on has 2 cores: 4 is oversubscribed). Figures are
//! aggregate: criterion's time per iteration is wall time over the total
//! operations of all threads.
//!
//! `cargo bench --bench throughput` (all), or add a filter such as
//! `-- deny_hot_key`.

#[path = "support/parallel.rs"]
mod parallel;
#[path = "support/workloads.rs"]
mod workloads;

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, criterion_group, criterion_main};
use tollgate::algorithm::{FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket};
use tollgate::clock::{Clock, CoarseClock, MonotonicClock, TscClock};
use tollgate::store::{GlobalMutex, LockFree, PerKey, Sharded};

const THREADS: [usize; 3] = [1, 2, 4];

/// Benches `op` at every thread count as aggregate throughput.
fn parallel_bench(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, op: &workloads::Op) {
    for threads in THREADS {
        group.bench_with_input(
            BenchmarkId::new(name, threads),
            &threads,
            |bencher, &threads| {
                bencher.iter_custom(|iters| {
                    let per_thread = iters.div_ceil(threads as u64);
                    let elapsed = parallel::run(threads, per_thread, op);
                    // Scale to exactly `iters` operations.
                    #[allow(clippy::cast_precision_loss)]
                    let scale = iters as f64 / (per_thread * threads as u64) as f64;
                    elapsed.mul_f64(scale)
                });
            },
        );
    }
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
}

/// Every algorithm denying on one drained hot key, on the default store with
/// its default cell, beside governor. The seed's table: under a mutex,
/// denials contend; GCRA's denial is a load.
fn deny_hot_key(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("deny_hot_key");
    configure(&mut group);
    let ops: Vec<(&str, workloads::Op)> = vec![
        (
            "fixed_window",
            workloads::deny_hot_key::<FixedWindow, _>(TscClock::new()),
        ),
        (
            "token_bucket",
            workloads::deny_hot_key::<TokenBucket, _>(TscClock::new()),
        ),
        (
            "sliding_log",
            workloads::deny_hot_key::<SlidingWindowLog, _>(TscClock::new()),
        ),
        (
            "sliding_counter",
            workloads::deny_hot_key::<SlidingWindowCounter, _>(TscClock::new()),
        ),
        ("gcra", workloads::deny_hot_key_default()),
        ("gcra_carried_quota", workloads::deny_hot_key_carried()),
        ("gcra_counted", workloads::deny_hot_key_counted()),
        ("gcra_uncounted", workloads::deny_hot_key_uncounted()),
        (
            "gcra_in_held_guard",
            workloads::in_outer_guard(workloads::deny_hot_key::<Gcra, _>(TscClock::new()), true),
        ),
        (
            "gcra_in_no_guard",
            workloads::in_outer_guard(workloads::deny_hot_key::<Gcra, _>(TscClock::new()), false),
        ),
        (
            "gcra_foldhash",
            workloads::deny_hot_key_on::<Gcra, _, _>(
                workloads::lock_free_foldhash(),
                TscClock::new(),
            ),
        ),
        ("governor_keyed", workloads::governor_deny_hot_key()),
        (
            "gcra_cell_in_hashmap",
            workloads::deny_hot_key_in_hashmap::<workloads::Unguarded>(),
        ),
        (
            "gcra_cell_in_hashmap_pinned",
            workloads::deny_hot_key_in_hashmap::<workloads::EpochPinned>(),
        ),
        (
            "gcra_cell_in_hashmap_read_counter",
            workloads::deny_hot_key_in_hashmap::<workloads::CounterRead>(),
        ),
        ("gcra_direct", workloads::direct_deny()),
        ("governor_direct", workloads::governor_direct_deny()),
    ];
    for (name, op) in &ops {
        parallel_bench(&mut group, name, op);
    }
    group.finish();
}

/// GCRA denying on a drained hot key with each clock: the clock's share of
/// a denial.
fn deny_with_clock(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("deny_with_clock");
    configure(&mut group);
    let coarse = CoarseClock::new();
    let ops: Vec<(&str, workloads::Op)> = vec![
        (
            "monotonic",
            workloads::deny_hot_key::<Gcra, _>(MonotonicClock::new()),
        ),
        ("tsc", workloads::deny_hot_key::<Gcra, _>(TscClock::new())),
        ("coarse", workloads::deny_hot_key::<Gcra, _>(coarse)),
    ];
    for (name, op) in &ops {
        parallel_bench(&mut group, name, op);
    }
    group.finish();
}

/// GCRA admitting on distinct keys, one key set per thread, per store, beside
/// governor's keyed store. Keys exist before timing starts.
fn admit_distinct_keys(criterion: &mut Criterion) {
    for keys in [16_u64, 1_024, 65_536] {
        let mut group = criterion.benchmark_group(format!("admit_distinct_{keys}"));
        configure(&mut group);
        let ops: Vec<(&str, workloads::Op)> = vec![
            (
                "global_mutex",
                workloads::admit_distinct::<Gcra, _>(GlobalMutex, keys),
            ),
            (
                "sharded",
                workloads::admit_distinct::<Gcra, _>(Sharded::default(), keys),
            ),
            (
                "per_key",
                workloads::admit_distinct::<Gcra, _>(PerKey::new(), keys),
            ),
            ("lock_free", workloads::admit_distinct_default(keys)),
            (
                "lock_free_foldhash",
                workloads::admit_distinct::<Gcra, _>(workloads::lock_free_foldhash(), keys),
            ),
            (
                "lock_free_unshared",
                workloads::admit_distinct_unshared(keys),
            ),
            (
                "lock_free_keys_mixed",
                workloads::admit_distinct_quarters(keys, false),
            ),
            (
                "lock_free_keys_apart",
                workloads::admit_distinct_quarters(keys, true),
            ),
            (
                "lock_free_a_cell_a_line",
                workloads::admit_distinct_line_keys(keys),
            ),
            ("governor_keyed", workloads::governor_admit_distinct(keys)),
        ];
        for (name, op) in &ops {
            parallel_bench(&mut group, name, op);
        }
        group.finish();
    }
}

/// Every algorithm admitting on 65 536 distinct keys on the default store.
fn admit_distinct_by_algorithm(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("admit_distinct_by_algorithm");
    configure(&mut group);
    const KEYS: u64 = 65_536;
    let ops: Vec<(&str, workloads::Op)> = vec![
        (
            "fixed_window",
            workloads::admit_distinct_at::<FixedWindow, _>(
                workloads::packing_quota(),
                LockFree::default(),
                KEYS,
            ),
        ),
        (
            "token_bucket",
            workloads::admit_distinct_at::<TokenBucket, _>(
                workloads::packing_quota(),
                LockFree::default(),
                KEYS,
            ),
        ),
        (
            "sliding_log",
            workloads::admit_distinct_at::<SlidingWindowLog, _>(
                workloads::packing_quota(),
                LockFree::default(),
                KEYS,
            ),
        ),
        (
            "sliding_counter",
            workloads::admit_distinct_at::<SlidingWindowCounter, _>(
                workloads::packing_quota(),
                LockFree::default(),
                KEYS,
            ),
        ),
        (
            "gcra",
            workloads::admit_distinct_at::<Gcra, _>(
                workloads::packing_quota(),
                LockFree::default(),
                KEYS,
            ),
        ),
    ];
    for (name, op) in &ops {
        parallel_bench(&mut group, name, op);
    }
    group.finish();
}

/// GCRA admitting on one hot key: every thread updates the same state.
fn admit_hot_key(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("admit_hot_key");
    configure(&mut group);
    let ops: Vec<(&str, workloads::Op)> = vec![
        ("global_mutex", workloads::admit_hot_key(GlobalMutex)),
        ("sharded", workloads::admit_hot_key(Sharded::default())),
        ("per_key", workloads::admit_hot_key(PerKey::new())),
        ("lock_free", workloads::admit_hot_key(LockFree::default())),
        ("governor_keyed", workloads::governor_admit_hot_key()),
    ];
    for (name, op) in &ops {
        parallel_bench(&mut group, name, op);
    }
    group.finish();
}

/// The cost of one clock reading.
fn clock_read(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("clock_read");
    let monotonic = MonotonicClock::new();
    group.bench_function("monotonic", |bencher| {
        bencher.iter(|| black_box(monotonic.now_ns()))
    });
    let tsc = TscClock::new();
    group.bench_function("tsc", |bencher| bencher.iter(|| black_box(tsc.now_ns())));
    let coarse = CoarseClock::new();
    group.bench_function("coarse", |bencher| {
        bencher.iter(|| black_box(coarse.now_ns()))
    });
    group.finish();
}

/// The cost of hashing one key with the default hasher (std `RandomState`:
/// SipHash-1-3 with random keys per limiter) and with randomly seeded
/// alternatives. Keys are attacker-chosen, so only seeded hashers qualify.
fn hash_key(criterion: &mut Criterion) {
    use std::hash::BuildHasher;
    let mut group = criterion.benchmark_group("hash_key");
    let text = "client-203.0.113.7".to_owned();
    macro_rules! hashers {
        ($($name:literal: $hasher:expr),*) => {$({
            let hasher = $hasher;
            group.bench_function(concat!($name, "/u64"), |bencher| {
                bencher.iter(|| black_box(hasher.hash_one(black_box(0x1234_5678_u64))));
            });
            group.bench_function(concat!($name, "/string"), |bencher| {
                bencher.iter(|| black_box(hasher.hash_one(black_box(&text))));
            });
        })*};
    }
    hashers!(
        "std_random_state": std::hash::RandomState::new(),
        "foldhash_random": foldhash::fast::RandomState::default(),
        "ahash_random": ahash::RandomState::new()
    );
    group.finish();
}

criterion_group!(
    benches,
    deny_hot_key,
    deny_with_clock,
    admit_distinct_keys,
    admit_distinct_by_algorithm,
    admit_hot_key,
    clock_read,
    hash_key
);
criterion_main!(benches);
