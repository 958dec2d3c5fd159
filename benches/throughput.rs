//! Throughput benches, each varying one thing, at 1, 2 and 4 threads (the
//! machine this was written on has 2 cores: 4 is oversubscribed). Figures are
//! aggregate: criterion's time per iteration is wall time over the total
//! operations of all threads.
//!
//! `cargo bench --bench throughput` (all), or add a filter such as
//! `-- deny_hot_key`.

#[path = "support/parallel.rs"]
mod parallel;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, criterion_group, criterion_main};
use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::clock::{Clock, CoarseClock, MonotonicClock, TscClock};
use tollgate::store::{GlobalMutex, LockFree, Sharded, StoreKind};
use tollgate::{Builder, Quota, RateLimiter};

const THREADS: [usize; 3] = [1, 2, 4];

/// Benches `op` at every thread count as aggregate throughput.
fn parallel_bench<F: Fn(usize, u64) + Sync>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    op: F,
) {
    for threads in THREADS {
        group.bench_with_input(
            BenchmarkId::new(name, threads),
            &threads,
            |bencher, &threads| {
                bencher.iter_custom(|iters| {
                    let per_thread = iters.div_ceil(threads as u64);
                    let elapsed = parallel::run(threads, per_thread, &op);
                    // Scale to exactly `iters` operations.
                    #[allow(clippy::cast_precision_loss)]
                    let scale = iters as f64 / (per_thread * threads as u64) as f64;
                    elapsed.mul_f64(scale)
                });
            },
        );
    }
}

fn keyed<A: Algorithm, S: StoreKind>(quota: Quota, store: S) -> RateLimiter<u64, A, TscClock, S> {
    Builder::new(quota)
        .algorithm::<A>()
        .store(store)
        .clock(TscClock::new())
        .build()
}

/// A quota one hot key never drains: one request per nanosecond, a burst of
/// a million, so every check is admitted.
fn hot_quota() -> Quota {
    Quota::per_second(1_000_000_000)
        .unwrap()
        .with_burst(1_000_000)
        .unwrap()
}

/// A quota distinct keys never drain: 10^8 per second per key (checks on
/// one key are further apart than 10 ns), a burst of 10^7. A key rests 100 ms
/// after its last admission, far longer than any key waits for its next
/// check here, so no key is evicted while it is in use.
fn distinct_quota() -> Quota {
    Quota::per_second(100_000_000)
        .unwrap()
        .with_burst(10_000_000)
        .unwrap()
}

fn governor_quota(per_second: u32, burst: u32) -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::new(per_second).unwrap())
        .allow_burst(NonZeroU32::new(burst).unwrap())
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
    fn drained<A: Algorithm>() -> RateLimiter<u64, A, TscClock, LockFree> {
        let limiter = keyed::<A, _>(Quota::per_hour(1).unwrap(), LockFree::default());
        assert!(limiter.check(&0).unwrap().is_allowed());
        assert!(!limiter.check(&0).unwrap().is_allowed());
        limiter
    }
    macro_rules! deny {
        ($($name:literal: $algorithm:ty),*) => {$({
            let limiter = drained::<$algorithm>();
            parallel_bench(&mut group, $name, |_, _| {
                black_box(limiter.check(black_box(&0)).unwrap().is_allowed());
            });
        })*};
    }
    deny!(
        "fixed_window": FixedWindow,
        "token_bucket": TokenBucket,
        "sliding_log": SlidingWindowLog,
        "sliding_counter": SlidingWindowCounter,
        "gcra": Gcra
    );
    let governor_keyed =
        governor::RateLimiter::keyed(governor::Quota::per_hour(NonZeroU32::new(1).unwrap()));
    assert!(governor_keyed.check_key(&0_u64).is_ok());
    parallel_bench(&mut group, "governor_keyed", |_, _| {
        black_box(governor_keyed.check_key(black_box(&0_u64)).is_ok());
    });
    let governor_direct =
        governor::RateLimiter::direct(governor::Quota::per_hour(NonZeroU32::new(1).unwrap()));
    assert!(governor_direct.check().is_ok());
    parallel_bench(&mut group, "governor_direct", |_, _| {
        black_box(governor_direct.check().is_ok());
    });
    let direct = Builder::new(Quota::per_hour(1).unwrap())
        .clock(TscClock::new())
        .build_direct();
    assert!(direct.check().unwrap().is_allowed());
    parallel_bench(&mut group, "gcra_direct", |_, _| {
        black_box(direct.check().unwrap().is_allowed());
    });
    group.finish();
}

/// GCRA admitting on distinct keys, one key set per thread, per store, beside
/// governor's keyed store. Keys exist before timing starts.
fn admit_distinct_keys(criterion: &mut Criterion) {
    for keys in [16_u64, 1_024, 65_536] {
        let mut group = criterion.benchmark_group(format!("admit_distinct_{keys}"));
        configure(&mut group);
        let key_of = move |thread: usize, i: u64| {
            let per_thread = keys / 4;
            thread as u64 % 4 * per_thread + i % per_thread
        };
        macro_rules! admit {
            ($($name:literal: $store:expr),*) => {$({
                let limiter = keyed::<Gcra, _>(distinct_quota(), $store);
                for key in 0..keys {
                    assert!(limiter.check(&key).unwrap().is_allowed());
                }
                parallel_bench(&mut group, $name, |thread, i| {
                    black_box(limiter.check(&key_of(thread, i)).unwrap().is_allowed());
                });
            })*};
        }
        admit!(
            "global_mutex": GlobalMutex,
            "sharded": Sharded::default(),
            "lock_free": LockFree::default()
        );
        let governor_keyed = governor::RateLimiter::keyed(governor_quota(100_000_000, 10_000_000));
        for key in 0..keys {
            assert!(governor_keyed.check_key(&key).is_ok());
        }
        parallel_bench(&mut group, "governor_keyed", |thread, i| {
            black_box(governor_keyed.check_key(&key_of(thread, i)).is_ok());
        });
        group.finish();
    }
}

/// GCRA admitting on one hot key: every thread updates the same state.
fn admit_hot_key(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("admit_hot_key");
    configure(&mut group);
    macro_rules! admit {
        ($($name:literal: $store:expr),*) => {$({
            let limiter = keyed::<Gcra, _>(hot_quota(), $store);
            parallel_bench(&mut group, $name, |_, _| {
                black_box(limiter.check(&0).unwrap().is_allowed());
            });
        })*};
    }
    admit!(
        "global_mutex": GlobalMutex,
        "sharded": Sharded::default(),
        "lock_free": LockFree::default()
    );
    let governor_keyed = governor::RateLimiter::keyed(governor_quota(1_000_000_000, 1_000_000));
    parallel_bench(&mut group, "governor_keyed", |_, _| {
        black_box(governor_keyed.check_key(&0_u64).is_ok());
    });
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
    admit_distinct_keys,
    admit_hot_key,
    clock_read,
    hash_key
);
criterion_main!(benches);
