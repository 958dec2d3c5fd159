//! Memory per key, measured by the counting allocator: settled (what stays
//! allocated once a store is quiet) and, in `peak_table`, the peak while
//! keys churn (what a store needs at every instant).

use std::num::NonZeroU32;
use std::time::Duration;

use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::clock::ManualClock;
use tollgate::store::{GlobalMutex, LockFree, PerKey, Sharded, StoreKind};
use tollgate::{Builder, Quota};
use tollgate_peers::{Flurry, Papaya, SccIndex};

use crate::stats::{Estimate, median_ci};
use crate::{churn, counting_alloc};

/// Runs crossbeam-epoch's default collector and `scc`'s (sdd) until
/// deferred frees have happened: both are process-wide, and `scc` frees a
/// dropped map's arrays and removed entries through its own. papaya and
/// flurry reclaim through seize, a collector per map, which frees in
/// batches and has no handle here: their "settled" figures may include
/// replaced tables not yet freed. (tollgate's store runs its own collector,
/// and settles through `evict_idle`: see `tollgate_u64`.)
fn settle() {
    for _ in 0..1_024 {
        crossbeam_epoch::pin().flush();
        // `scc`'s collector (sdd) is process-wide too: a dropped map's
        // memory goes when its epoch has advanced twice.
        scc::ebr::Guard::new().accelerate();
    }
}

/// Bytes and allocations retained per key by whatever `fill` builds, measured
/// while it is alive, settled before and after (see `settle`).
fn retained_per_key<T>(keys: u64, fill: impl FnOnce() -> T) -> (f64, f64) {
    settle();
    let (bytes_before, allocations_before) = counting_alloc::live();
    let filled = fill();
    settle();
    let (bytes_after, allocations_after) = counting_alloc::live();
    drop(filled);
    #[allow(clippy::cast_precision_loss)]
    let per = |after: u64, before: u64| after.saturating_sub(before) as f64 / keys as f64;
    (
        per(bytes_after, bytes_before),
        per(allocations_after, allocations_before),
    )
}

/// A tollgate limiter over `keys` u64 keys, each with `per_key` requests.
fn tollgate_u64<A: Algorithm, S: StoreKind<u64, A>>(
    quota: Quota,
    store: S,
    keys: u64,
    per_key: u32,
) -> (f64, f64) {
    retained_per_key(keys, || {
        let limiter = Builder::new(quota)
            .algorithm::<A>()
            .store(store)
            .clock(ManualClock::new())
            .build::<u64>();
        for key in 0..keys {
            for _ in 0..per_key {
                assert!(limiter.check(&key).expect("unit cost").is_allowed());
            }
        }
        assert_eq!(limiter.len() as u64, keys);
        // Settled: nothing is idle on the frozen clock, so this only frees
        // the tables growth replaced (see `peak_table` for the heap before).
        assert_eq!(limiter.evict_idle(), 0);
        limiter
    })
}

/// The same with `String` keys (`"client-<n>"`); the strings' heap counts.
fn tollgate_strings<S: StoreKind<String, Gcra>>(store: S, keys: u64) -> f64 {
    retained_per_key(keys, || {
        let limiter = Builder::new(quota())
            .store(store)
            .clock(ManualClock::new())
            .build::<String>();
        for key in 0..keys {
            assert!(
                limiter
                    .check(&format!("client-{key}"))
                    .expect("unit cost")
                    .is_allowed()
            );
        }
        assert_eq!(limiter.evict_idle(), 0);
        limiter
    })
    .0
}

fn governor_quota() -> governor::Quota {
    governor::Quota::per_minute(NonZeroU32::new(100).expect("nonzero"))
}

/// governor's default keyed limiter (its `DashMap` store).
fn governor_u64(keys: u64) -> f64 {
    retained_per_key(keys, || {
        let limiter = governor::RateLimiter::keyed(governor_quota());
        for key in 0..keys {
            assert!(limiter.check_key(&key).is_ok());
        }
        limiter
    })
    .0
}

fn governor_strings(keys: u64) -> f64 {
    retained_per_key(keys, || {
        let limiter = governor::RateLimiter::keyed(governor_quota());
        for key in 0..keys {
            assert!(limiter.check_key(&format!("client-{key}")).is_ok());
        }
        limiter
    })
    .0
}

fn quota() -> Quota {
    Quota::per_minute(100).expect("valid")
}

/// Bytes of state per key for each algorithm on the global-mutex store, and
/// the sliding log at its limit.
pub fn algorithm_table(out: &mut String) {
    const KEYS: u64 = 100_000;
    say!(
        out,
        "## Memory per key by algorithm: {KEYS} u64 keys, one request each, global-mutex store"
    );
    say!(
        out,
        "{:<24} {:>12} {:>16} {:>12}",
        "algorithm",
        "state bytes",
        "retained B/key",
        "allocs/key"
    );
    crate::for_each_algorithm!(|name, A| {
        let (bytes, allocations) = tollgate_u64::<A, _>(quota(), GlobalMutex, KEYS, 1);
        say!(
            out,
            "{:<24} {:>12} {:>16.1} {:>12.2}",
            name,
            std::mem::size_of::<<A as Algorithm>::State>(),
            bytes,
            allocations
        );
    });
    say!(
        out,
        "(state bytes: the per-key state inline; retained: everything the map holds, keys included)\n"
    );

    const LOG_KEYS: u64 = 10_000;
    say!(
        out,
        "## Sliding window log at its limit: {LOG_KEYS} keys, each drained to the limit"
    );
    say!(
        out,
        "{:<10} {:>16} {:>12}",
        "limit",
        "retained B/key",
        "allocs/key"
    );
    for limit in [10, 100, 1_000] {
        let quota = Quota::new(limit, Duration::from_secs(60)).expect("valid");
        let (bytes, allocations) =
            tollgate_u64::<SlidingWindowLog, _>(quota, GlobalMutex, LOG_KEYS, limit);
        say!(out, "{limit:<10} {bytes:>16.1} {allocations:>12.2}");
    }
    say!(out, "(8 bytes per timestamp, at most `limit` per key)\n");
}

/// One key count of the store sweep: retained B/key per store.
pub struct SweepRow {
    pub keys: u64,
    pub governor: f64,
    pub lock_free_gcra: f64,
    pub lock_free_fixed_window: f64,
    pub lock_free_token_bucket: f64,
    pub per_key_gcra: f64,
    pub sharded_gcra: f64,
    pub global_gcra: f64,
}

/// Retained bytes per key by store, against governor, over `counts`; also
/// 100 000 string keys. Returns the u64 rows.
pub fn store_sweep(out: &mut String, counts: &[u64]) -> Vec<SweepRow> {
    say!(
        out,
        "## Memory per key by store: u64 keys, one request each (B/key retained)"
    );
    say!(
        out,
        "{:>9} {:>9} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>6}",
        "keys",
        "governor",
        "lock-free",
        "lock-free",
        "lock-free",
        "per-key",
        "sharded",
        "global",
        "floor"
    );
    say!(
        out,
        "{:>9} {:>9} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>6}",
        "",
        "keyed",
        "GCRA",
        "fixed win.",
        "tok.bucket",
        "GCRA",
        "GCRA",
        "GCRA",
        ""
    );
    let rows: Vec<SweepRow> = counts
        .iter()
        .map(|&keys| {
            let row = SweepRow {
                keys,
                governor: governor_u64(keys),
                lock_free_gcra: tollgate_u64::<Gcra, _>(quota(), LockFree::default(), keys, 1).0,
                lock_free_fixed_window: tollgate_u64::<FixedWindow, _>(
                    quota(),
                    LockFree::default(),
                    keys,
                    1,
                )
                .0,
                lock_free_token_bucket: tollgate_u64::<TokenBucket, _>(
                    quota(),
                    LockFree::default(),
                    keys,
                    1,
                )
                .0,
                per_key_gcra: tollgate_u64::<Gcra, _>(quota(), PerKey::new(), keys, 1).0,
                sharded_gcra: tollgate_u64::<Gcra, _>(quota(), Sharded::default(), keys, 1).0,
                global_gcra: tollgate_u64::<Gcra, _>(quota(), GlobalMutex, keys, 1).0,
            };
            say!(
                out,
                "{:>9} {:>9.1} {:>10.1} {:>10.1} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>6}",
                keys,
                row.governor,
                row.lock_free_gcra,
                row.lock_free_fixed_window,
                row.lock_free_token_bucket,
                row.per_key_gcra,
                row.sharded_gcra,
                row.global_gcra,
                2 * std::mem::size_of::<u64>(),
            );
            row
        })
        .collect();
    const STRING_KEYS: u64 = 100_000;
    say!(
        out,
        "{:>9} {:>9.1} {:>10.1} {:>10} {:>10} {:>9.1} {:>9.1} {:>9} {:>6}",
        "100k str",
        governor_strings(STRING_KEYS),
        tollgate_strings(LockFree::default(), STRING_KEYS),
        "",
        "",
        tollgate_strings(PerKey::new(), STRING_KEYS),
        tollgate_strings(Sharded::default(), STRING_KEYS),
        "",
        "",
    );
    say!(
        out,
        "(floor: a u64 key and an 8-byte state; string keys are \"client-<n>\", their heap included)\n"
    );
    rows
}

/// Every store × every algorithm: retained B/key after one request per key,
/// at each of `counts`.
pub fn matrix(out: &mut String, counts: &[u64]) {
    say!(
        out,
        "## Memory per key, every store × algorithm (B/key retained, u64 keys)"
    );
    say!(
        out,
        "{:>9} {:<24} {:>10} {:>10} {:>10} {:>10}",
        "keys",
        "algorithm",
        "lock-free",
        "per-key",
        "sharded",
        "global"
    );
    for &keys in counts {
        crate::for_each_algorithm!(|name, A| say!(
            out,
            "{:>9} {:<24} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            keys,
            name,
            tollgate_u64::<A, _>(quota(), LockFree::default(), keys, 1).0,
            tollgate_u64::<A, _>(quota(), PerKey::new(), keys, 1).0,
            tollgate_u64::<A, _>(quota(), Sharded::default(), keys, 1).0,
            tollgate_u64::<A, _>(quota(), GlobalMutex, keys, 1).0,
        ));
    }
    say!(out);
}

/// The lock-free maps considered for the default store, holding `u64 →
/// AtomicU64` (the cell of GCRA) with no limiter around them, beside the
/// table tollgate built and governor's store.
pub fn candidate_maps(out: &mut String) {
    use std::sync::atomic::AtomicU64;
    const KEYS: u64 = 1_000_000;
    say!(
        out,
        "## Candidate maps: {KEYS} u64 keys → AtomicU64, retained B/key"
    );
    let rows: [(&str, f64); 6] = [
        (
            "dashmap (governor's keyed store)",
            retained_per_key(KEYS, || {
                let map = dashmap::DashMap::new();
                for key in 0..KEYS {
                    map.insert(key, AtomicU64::new(key));
                }
                map
            })
            .0,
        ),
        (
            "scc::HashIndex",
            retained_per_key(KEYS, || {
                let map = scc::HashIndex::new();
                for key in 0..KEYS {
                    assert!(map.insert(key, key).is_ok());
                }
                map
            })
            .0,
        ),
        (
            "papaya",
            retained_per_key(KEYS, || {
                let map = papaya::HashMap::new();
                let pinned = map.pin();
                for key in 0..KEYS {
                    pinned.insert(key, AtomicU64::new(key));
                }
                drop(pinned);
                map
            })
            .0,
        ),
        (
            "flurry",
            retained_per_key(KEYS, || {
                let map = flurry::HashMap::new();
                let guard = map.guard();
                for key in 0..KEYS {
                    map.insert(key, AtomicU64::new(key), &guard);
                }
                drop(guard);
                map
            })
            .0,
        ),
        (
            "tollgate lock-free (GCRA limiter)",
            tollgate_u64::<Gcra, _>(quota(), LockFree::default(), KEYS, 1).0,
        ),
        ("floor (key + 8 B)", 16.0),
    ];
    for (name, bytes) in rows {
        say!(out, "{name:<36} {bytes:>8.1}");
    }
    say!(out);
}

/// The heap's peak while keys churn, measured at every allocation with no
/// settling, against the settled heap of the same store holding the most
/// keys the run held. The churn: 40 waves, each of 5 000 one-off keys then
/// two checks of 5 000 steady keys, 2 s apart. The flood: 2 000 000 keys
/// against a cap of 100 000 (the quick mode floods 500 000).
pub fn peak_table(out: &mut String, full: bool) {
    say!(
        out,
        "## Memory while keys churn: heap peak against the settled live table"
    );
    say!(
        out,
        "{:<38} {:>8} {:>12} {:>12} {:>8} {:>7}",
        "workload, store",
        "threads",
        "peak B",
        "settled B",
        "keys",
        "ratio"
    );
    let row = |out: &mut String, name: &str, threads: u64, peak: churn::Peak| {
        say!(
            out,
            "{:<38} {:>8} {:>12} {:>12} {:>8} {:>6.2}x",
            name,
            threads,
            peak.peak,
            peak.table,
            peak.most_keys,
            peak.ratio()
        );
    };
    for threads in [1, 2] {
        row(
            out,
            "churn, lock-free (1 shard)",
            threads,
            churn::churn_peak(LockFree::new(1), threads),
        );
        row(
            out,
            "churn, lock-free",
            threads,
            churn::churn_peak(LockFree::default(), threads),
        );
        row(
            out,
            "churn, sharded",
            threads,
            churn::churn_peak(Sharded::default(), threads),
        );
        row(
            out,
            "churn, global mutex",
            threads,
            churn::churn_peak(GlobalMutex, threads),
        );
        row(
            out,
            "churn, per-key",
            threads,
            churn::churn_peak(PerKey::new(), threads),
        );
    }
    let flood_keys = if full { 2_000_000 } else { 500_000 };
    for threads in [1, 2] {
        let flood = churn::flood_peak(LockFree::default(), threads, flood_keys, 100_000);
        row(
            out,
            &format!("flood {flood_keys} vs cap 100 000, lock-free"),
            threads,
            flood.peak,
        );
        say!(
            out,
            "{:<38} (admitted {}, StoreFull {}, Reclaiming {})",
            "",
            flood.admitted,
            flood.full,
            flood.refused
        );
    }
    say!(
        out,
        "(settled: after `evict_idle()`, which frees the tables growth replaced; the \
         memory tables above are settled the same way)\n"
    );
}

/// The heap of one store while it grows one key at a time, read after every
/// insert from `FROM` keys to `TO`: the settled figure at every count, not
/// at a few.
#[derive(Clone, Copy, Debug)]
pub struct Growth {
    pub store: &'static str,
    /// The most bytes per key live between two inserts, and at which count.
    pub worst: (f64, u64),
    /// The fewest bytes per key live between two inserts, and at which count.
    pub best: (f64, u64),
    /// The highest peak inside one insert (a rebuild: old and new tables
    /// live at once) against the heap after it, and at which count.
    pub peak: (f64, u64),
    /// Wall-clock nanoseconds per insert over the whole run, growth
    /// included (and the reading of the heap, the same for every store).
    pub ns_per_insert: f64,
}

impl Growth {
    /// The first count and the last.
    pub const FROM: u64 = 100_000;
    pub const TO: u64 = 2_000_000;
}

/// Tracks the extremes of `Growth` as `step` inserts key after key into
/// what `make` builds (inside the measurement: a store's fixed allocations
/// count).
fn growth_of<T>(
    store: &'static str,
    make: impl FnOnce() -> T,
    mut step: impl FnMut(&T, u64),
) -> Growth {
    settle();
    let before = counting_alloc::live().0;
    let built = make();
    let mut growth = Growth {
        store,
        worst: (0.0, 0),
        best: (f64::INFINITY, 0),
        peak: (0.0, 0),
        ns_per_insert: 0.0,
    };
    let started = std::time::Instant::now();
    for key in 0..Growth::TO {
        counting_alloc::reset_peak();
        step(&built, key);
        let keys = key + 1;
        if keys < Growth::FROM {
            continue;
        }
        let live = counting_alloc::live().0 - before;
        #[allow(clippy::cast_precision_loss)]
        let (per_key, peak) = (
            live as f64 / keys as f64,
            (counting_alloc::peak() - before) as f64 / live as f64,
        );
        if per_key > growth.worst.0 {
            growth.worst = (per_key, keys);
        }
        if per_key < growth.best.0 {
            growth.best = (per_key, keys);
        }
        if peak > growth.peak.0 {
            growth.peak = (peak, keys);
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let ns_per_insert = started.elapsed().as_nanos() as f64 / Growth::TO as f64;
    growth.ns_per_insert = ns_per_insert;
    growth
}

/// `Growth` of a GCRA limiter on `store`, u64 keys of one request each.
fn tollgate_growth<S: StoreKind<u64, Gcra>>(name: &'static str, store: S) -> Growth {
    growth_of(
        name,
        || {
            Builder::new(quota())
                .store(store)
                .clock(ManualClock::new())
                .build::<u64>()
        },
        |limiter, key| {
            assert!(limiter.check(&key).expect("unit cost").is_allowed());
        },
    )
}

/// GCRA on the lock-free store (default shards; 4, the default on one
/// core; and one shard: no stagger), on the stores on papaya, `scc` and
/// flurry (`tollgate-peers`), and governor's keyed limiter, u64 keys of one
/// request each, growing from 1 to `Growth::TO` keys on one thread. Nothing is
/// settled between inserts: a replaced table still awaiting its grace
/// period counts, so the worst figure bounds the settled one from above.
pub fn growth_table(out: &mut String) -> Vec<Growth> {
    say!(
        out,
        "## Memory at every key count while growing: u64 keys, one request each, one thread"
    );
    say!(
        out,
        "(heap after each insert from {} to {} keys; peak: the most live inside one insert ÷ \
         the heap after it)",
        Growth::FROM,
        Growth::TO
    );
    say!(
        out,
        "{:<30} {:>18} {:>18} {:>18} {:>10}",
        "store",
        "worst B/key (at)",
        "best B/key (at)",
        "peak ratio (at)",
        "ns/insert"
    );
    let rows = vec![
        tollgate_growth("lock-free GCRA", LockFree::default()),
        tollgate_growth("lock-free GCRA, 4 shards", LockFree::new(4)),
        tollgate_growth("lock-free GCRA, 1 shard", LockFree::new(1)),
        tollgate_growth("papaya store GCRA", Papaya::new()),
        tollgate_growth("scc::HashIndex store GCRA", SccIndex::new()),
        tollgate_growth("flurry store GCRA", Flurry::new()),
        growth_of(
            "governor keyed",
            || governor::RateLimiter::keyed(governor_quota()),
            |governor, key| {
                assert!(governor.check_key(&key).is_ok());
            },
        ),
    ];
    for row in &rows {
        say!(
            out,
            "{:<30} {:>9.2} ({:>7}) {:>9.2} ({:>7}) {:>9.2}x ({:>7}) {:>10.1}",
            row.store,
            row.worst.0,
            row.worst.1,
            row.best.0,
            row.best.1,
            row.peak.0,
            row.peak.1,
            row.ns_per_insert
        );
    }
    say!(out);
    rows
}

/// One store's row of the peer table: each figure the median of the rounds
/// with their order-statistics interval.
pub struct PeerRow {
    pub store: &'static str,
    /// Bytes a key settled, at 100 000 and 1 000 000 keys.
    pub bytes: [Estimate; 2],
    /// The heap's peak while keys churn ÷ the settled live table, at 1 and
    /// 2 threads.
    pub churn: [Estimate; 2],
    /// Nanoseconds a key of an `evict_idle` with `scc`'s collector settled
    /// after it: every key idle, then every other key idle (a key of the
    /// store's, idle or not).
    pub evict: [Estimate; 2],
    /// Every round's figures, in the order above: a round of one store
    /// pairs with the same round of another (both ran in that round).
    pub rounds: Vec<PeerSample>,
}

/// One round of a peer row's figures, in `PeerRow`'s order.
pub type PeerSample = [f64; 6];

/// A store's name, and a round of its figures.
type PeerStore = (&'static str, Box<dyn Fn() -> PeerSample>);

/// One round of every figure of the peer table on `store`.
fn peer_sample<S: StoreKind<u64, Gcra>>(store: &S) -> PeerSample {
    [
        tollgate_u64::<Gcra, _>(quota(), store.clone(), 100_000, 1).0,
        tollgate_u64::<Gcra, _>(quota(), store.clone(), 1_000_000, 1).0,
        churn::churn_peak_settled(store.clone(), 1, settle).ratio(),
        churn::churn_peak_settled(store.clone(), 2, settle).ratio(),
        eviction_ns_per_key(store.clone(), EVICTED, 1),
        eviction_ns_per_key(store.clone(), EVICTED, 2),
    ]
}

/// How many keys the eviction rows' stores hold.
const EVICTED: u64 = 100_000;

/// The purpose-built table against the stores on papaya, `scc::HashIndex`
/// and flurry (`tollgate-peers`), GCRA on u64 keys: bytes a key
/// settled at 100 000 and 1 000 000 keys, the heap's peak while keys churn
/// against the settled live table (1 and 2 threads), and what an
/// `evict_idle` costs a key, all keys idle and half of them. `rounds`
/// rounds, each measuring every store once, the stores in a rotated order.
/// (The peak inside growth is in the growth table; the speed rows are in the
/// performance tables.)
pub fn peer_table(out: &mut String, rounds: usize) -> Vec<PeerRow> {
    say!(
        out,
        "## The purpose-built table against general-purpose maps: GCRA, u64 keys (median of \
         {rounds} rounds, and their range)"
    );
    let stores: [PeerStore; 4] = [
        ("lock-free", Box::new(|| peer_sample(&LockFree::default()))),
        ("papaya", Box::new(|| peer_sample(&Papaya::new()))),
        ("scc::HashIndex", Box::new(|| peer_sample(&SccIndex::new()))),
        ("flurry", Box::new(|| peer_sample(&Flurry::new()))),
    ];
    let mut samples: Vec<Vec<PeerSample>> = stores.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for offset in 0..stores.len() {
            let index = (round + offset) % stores.len();
            samples[index].push((stores[index].1)());
        }
    }
    let rows: Vec<PeerRow> = stores
        .iter()
        .zip(samples)
        .map(|((store, _), samples)| {
            let column = |at: usize| {
                let mut values: Vec<f64> = samples.iter().map(|sample| sample[at]).collect();
                median_ci(&mut values)
            };
            PeerRow {
                store,
                bytes: [column(0), column(1)],
                churn: [column(2), column(3)],
                evict: [column(4), column(5)],
                rounds: samples,
            }
        })
        .collect();
    say!(
        out,
        "{:<16} {:>19} {:>19} {:>19} {:>19} {:>19} {:>19}",
        "store",
        "B/key 100 000",
        "B/key 1 000 000",
        "churn peak 1t (×)",
        "churn peak 2t (×)",
        "evict, all idle",
        "evict, half idle"
    );
    let (cell, two) = (
        |estimate: &Estimate| estimate.show(1),
        |estimate: &Estimate| estimate.show(2),
    );
    for row in &rows {
        say!(
            out,
            "{:<16} {:>19} {:>19} {:>19} {:>19} {:>19} {:>19}",
            row.store,
            cell(&row.bytes[0]),
            cell(&row.bytes[1]),
            two(&row.churn[0]),
            two(&row.churn[1]),
            cell(&row.evict[0]),
            cell(&row.evict[1])
        );
    }
    say!(
        out,
        "(settled as the memory tables above; the churn as in the peak table; eviction: ns a \
         key of the store (idle or not) of one `evict_idle` over {EVICTED} keys, all idle or \
         every other one, one thread; the lock-free store frees inside the call, through its \
         own collector; `scc`'s collector is settled before the timer stops, so that it pays \
         for its deferred frees; papaya and flurry free through seize, in batches as they \
         retire, the last perhaps after the timer; settling alone, with nothing to free, costs \
         {:.1} ns a key)\n",
        settle_ns() / EVICTED as f64
    );
    rows
}

/// Wall-clock nanoseconds of one `settle` with nothing left to free.
fn settle_ns() -> f64 {
    settle();
    let started = std::time::Instant::now();
    settle();
    #[allow(clippy::cast_precision_loss)]
    let ns = started.elapsed().as_nanos() as f64;
    ns
}

/// Wall-clock nanoseconds a key of one `evict_idle`, the collectors settled
/// after it, over a store of `keys` keys of which one in `every` is idle
/// (the others checked again just before).
fn eviction_ns_per_key<S: StoreKind<u64, Gcra>>(store: S, keys: u64, every: u64) -> f64 {
    let clock = ManualClock::new();
    let limiter = Builder::new(quota())
        .store(store)
        .clock(clock.clone())
        .build::<u64>();
    for key in 0..keys {
        assert!(limiter.check(&key).expect("unit cost").is_allowed());
    }
    clock.advance(Duration::from_secs(3_600));
    for key in (0..keys).filter(|key| key % every != 0) {
        assert!(limiter.check(&key).expect("unit cost").is_allowed());
    }
    settle();
    let started = std::time::Instant::now();
    let evicted = limiter.evict_idle();
    settle();
    let elapsed = started.elapsed();
    assert_eq!(evicted as u64, keys.div_ceil(every));
    assert_eq!(limiter.len() as u64, keys - keys.div_ceil(every));
    #[allow(clippy::cast_precision_loss)]
    let per_key = elapsed.as_nanos() as f64 / keys as f64;
    per_key
}
