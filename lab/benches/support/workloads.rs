//! The measured workloads, written once: each returns the operation one
//! thread runs (`op(thread, i)`), with its limiter built and primed. The
//! criterion benches (`benches/throughput.rs`) and the lab's performance
//! section (`lab/src/perf.rs`) both run these, so a figure in the notes and a
//! criterion run measure the same code.
//!
//! Every tollgate limiter here reads `TscClock`, tollgate's default clock,
//! as governor reads quanta by default; the clock workloads vary it on
//! purpose. The headline's own rows ([`deny_hot_key_default`],
//! [`direct_deny`], [`admit_distinct_default`]) are built as a user builds
//! them, with `RateLimiter::keyed` and `DirectLimiter::direct`: every
//! default, clock, hasher and store alike, against governor's defaults.

use std::hint::black_box;
use std::num::NonZeroU32;

use tollgate::algorithm::{Algorithm, Gcra};
use tollgate::cell::{Atomic, Cell, CellFor, Preferred};
use tollgate::clock::{Clock, TscClock};
use tollgate::store::{LockFree, StoreKind};
use tollgate::{Builder, DirectLimiter, Quota, RateLimiter};

/// What a thread runs: `op(thread, i)`.
pub type Op = Box<dyn Fn(usize, u64) + Sync>;

/// The lock-free store hashing with seeded foldhash instead of SipHash: the
/// hash's share of a keyed check, for keys clients do not choose.
pub fn lock_free_foldhash() -> LockFree<foldhash::fast::RandomState> {
    LockFree::default().with_hasher(foldhash::fast::RandomState::default())
}

fn keyed<A: Algorithm, S: StoreKind<u64, A>, C: Clock>(
    quota: Quota,
    store: S,
    clock: C,
) -> RateLimiter<u64, A, C, S> {
    Builder::new(quota)
        .algorithm::<A>()
        .store(store)
        .clock(clock)
        .build()
}

/// A quota one hot key never drains: one request per nanosecond, a burst of
/// a million.
fn hot_quota() -> Quota {
    Quota::per_second(1_000_000_000)
        .unwrap()
        .with_burst(1_000_000)
        .unwrap()
}

/// A quota distinct keys never drain: 10^8 per second per key, a burst of
/// 10^7. A key rests 100 ms after its last admission, far longer than any
/// key here waits for its next check, so none is evicted while in use.
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

/// The key thread `thread` checks at step `i`: each of up to 4 threads owns
/// a quarter of the `keys`.
#[inline]
fn key_of(keys: u64, thread: usize, i: u64) -> u64 {
    let per_thread = (keys / 4).max(1);
    (thread as u64 % 4) * per_thread + i % per_thread
}

/// Algorithm `A` on the default store with its default cell and clock `C`,
/// denying on one drained key.
pub fn deny_hot_key<A: Algorithm, C: Clock + 'static>(clock: C) -> Op
where
    Preferred: CellFor<A>,
{
    deny_hot_key_on::<A, _, _>(LockFree::default(), clock)
}

/// The same on `store`.
pub fn deny_hot_key_on<A: Algorithm, S: StoreKind<u64, A>, C: Clock + 'static>(
    store: S,
    clock: C,
) -> Op {
    let limiter = keyed::<A, _, _>(Quota::per_hour(1).unwrap(), store, clock);
    assert!(limiter.check(&0).unwrap().is_allowed());
    assert!(!limiter.check(&0).unwrap().is_allowed());
    Box::new(move |_, _| {
        black_box(limiter.check(black_box(&0)).unwrap().is_allowed());
    })
}

/// `RateLimiter::keyed`, every default, denying on one drained key.
pub fn deny_hot_key_default() -> Op {
    let limiter = RateLimiter::<u64>::keyed(Quota::per_hour(1).unwrap());
    assert!(limiter.check(&0).unwrap().is_allowed());
    assert!(!limiter.check(&0).unwrap().is_allowed());
    Box::new(move |_, _| {
        black_box(limiter.check(black_box(&0)).unwrap().is_allowed());
    })
}

/// `RateLimiter::keyed`, every default, denying on one drained key, each
/// check carrying its quota (`check_with`, the limiter's own quota again):
/// what carrying a quota costs.
pub fn deny_hot_key_carried() -> Op {
    let quota = Quota::per_hour(1).unwrap();
    let limiter = RateLimiter::<u64>::keyed(quota);
    assert!(limiter.check_with(&0, &quota).unwrap().is_allowed());
    assert!(!limiter.check_with(&0, &quota).unwrap().is_allowed());
    Box::new(move |_, _| {
        black_box(
            limiter
                .check_with(black_box(&0), black_box(&quota))
                .unwrap()
                .is_allowed(),
        );
    })
}

/// `RateLimiter::keyed`'s defaults, denying on one drained key, counting
/// every check for the `metrics` facade (`Builder::metrics`): what the
/// counting costs.
pub fn deny_hot_key_counted() -> Op {
    deny_hot_key_built(true)
}

/// [`deny_hot_key_counted`]'s limiter built the same way, uncounted: its
/// baseline, whose code differs from it by the counting alone.
pub fn deny_hot_key_uncounted() -> Op {
    deny_hot_key_built(false)
}

/// A keyed GCRA limiter of the builder, every default, denying on one
/// drained key; counted for metrics if `counted`.
fn deny_hot_key_built(counted: bool) -> Op {
    let builder = tollgate::Builder::new(Quota::per_hour(1).unwrap());
    let limiter = if counted {
        builder.metrics("lab").build::<u64>()
    } else {
        builder.build::<u64>()
    };
    assert!(limiter.check(&0).unwrap().is_allowed());
    assert!(!limiter.check(&0).unwrap().is_allowed());
    Box::new(move |_, _| {
        black_box(limiter.check(black_box(&0)).unwrap().is_allowed());
    })
}

/// governor's keyed limiter denying on one drained key.
pub fn governor_deny_hot_key() -> Op {
    let limiter =
        governor::RateLimiter::keyed(governor::Quota::per_hour(NonZeroU32::new(1).unwrap()));
    assert!(limiter.check_key(&0_u64).is_ok());
    Box::new(move |_, _| {
        black_box(limiter.check_key(black_box(&0_u64)).is_ok());
    })
}

/// `DirectLimiter::direct`, every default, drained.
pub fn direct_deny() -> Op {
    let limiter = DirectLimiter::direct(Quota::per_hour(1).unwrap());
    assert!(limiter.check().unwrap().is_allowed());
    Box::new(move |_, _| {
        black_box(limiter.check().unwrap().is_allowed());
    })
}

/// What a keyed check holds while it reads a table that a writer may
/// replace: the read-side cost of a reclamation scheme, measured inside a
/// check by [`deny_hot_key_in_hashmap`].
pub trait ReadSection {
    /// Enters the section; leaving it is the value's drop.
    fn enter() -> Self;
}

/// No section: the bare map.
pub struct Unguarded;

impl ReadSection for Unguarded {
    #[inline]
    fn enter() -> Self {
        Self
    }
}

/// A crossbeam-epoch guard, pinned and unpinned around each check: the
/// read side the lock-free store had before its own read-copy-update
/// (`sync::rcu`), kept for comparison; this section opens before the hash
/// and the clock read.
pub struct EpochPinned(
    // Held for its drop, which unpins.
    #[allow(dead_code)] crossbeam_epoch::Guard,
);

impl ReadSection for EpochPinned {
    #[inline]
    fn enter() -> Self {
        Self(crossbeam_epoch::pin())
    }
}

thread_local! {
    /// This thread's read counter, on a line of its own (lazily made, as a
    /// registered record would be).
    static READ_COUNTER: Box<crossbeam_utils::CachePadded<std::sync::atomic::AtomicU64>> =
        Box::default();
}

/// The read side of the asymmetric-fence design (notes/08, "Why the keyed
/// denial misses its targets"): the thread's counter
/// made odd with a `Release` store and a compiler fence on entry, even again
/// with a `Release` store on leaving. No writer runs here, and the map row
/// loads no table pointer, so this measures the reader's stores alone, not
/// the scheme's correctness; it also leaves out the design's check for a
/// read inside a read.
pub struct CounterRead(());

impl CounterRead {
    /// The next value of this thread's counter (odd on entry, even on
    /// leaving), stored with `Release`: only this thread writes it.
    #[inline]
    fn step() {
        use std::sync::atomic::Ordering;
        READ_COUNTER.with(|counter| {
            let value = counter.load(Ordering::Relaxed);
            counter.store(value + 1, Ordering::Release);
        });
    }
}

impl ReadSection for CounterRead {
    #[inline]
    fn enter() -> Self {
        Self::step();
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        Self(())
    }
}

impl Drop for CounterRead {
    #[inline]
    fn drop(&mut self) {
        Self::step();
    }
}

/// A keyed denial with no reclamation and no limiter around it: the hot
/// key's GCRA cell in a `std` `HashMap` (SipHash, as the default store)
/// filled before the run and only read during it: a clock read, a hash,
/// hashbrown's probe (SIMD groups, plain control bytes), and the cell's
/// load and compare. No check picks a shard, loads a table pointer or
/// passes through `RateLimiter::check`: it differs from the lock-free
/// store's check in all of those at once. `S` adds one piece back, the
/// read section a check holds around the clock read, the lookup and the
/// cell's check ([`Unguarded`]: none), so that rows differing only in `S`
/// measure a section's cost inside a check.
pub fn deny_hot_key_in_hashmap<S: ReadSection>() -> Op {
    let algorithm = Gcra::from_quota(&Quota::per_hour(1).unwrap());
    let clock = TscClock::new();
    let cells = std::collections::HashMap::from([(0_u64, Atomic::<Gcra>::new(&algorithm))]);
    let check = move || {
        let _section = S::enter();
        let now_ns = clock.now_ns();
        let cell = &cells[black_box(&0)];
        cell.check(&algorithm, now_ns, 1)
            .unwrap()
            .expect("never retired")
            .is_allowed()
    };
    assert!(check());
    assert!(!check());
    Box::new(move |_, _| {
        black_box(check());
    })
}

thread_local! {
    /// The section [`in_outer_guard`] keeps this thread inside.
    static HELD: std::cell::RefCell<Option<tollgate::lab_hooks::Pinned>> =
        const { std::cell::RefCell::new(None) };
}

/// How many calls of [`in_outer_guard`]'s operation one outer section spans.
const HELD_CALLS: u64 = 1_024;

/// `op` run, with `hold`, with its thread already inside a read section of
/// tollgate's read-copy-update (`tollgate::lab_hooks::pin`, the one the
/// lock-free store's checks enter): an outer section, replaced every 1 024
/// calls (so that grace periods still end between them), is held around
/// each call. The store's own section then nests: it finds the thread's
/// record inside and only counts (a thread-local lookup and a counter in
/// the record), with no store a writer reads and no fence. Without `hold`,
/// the same wrapper (the same indirect call, the same thread-local step
/// every 1 024 calls) enters nothing: the control, so that the two, in
/// pairs in one process, differ in the section's entry and exit alone.
/// Sound: the store's section is a real one, nested. For checks of keys
/// already stored only: a held section keeps retired tables from being
/// freed.
///
/// # Panics
///
/// If the thread is not inside a section when it should be, or is when it
/// should not: the canary that the outer section is the one the store's
/// nests in.
pub fn in_outer_guard(op: Op, hold: bool) -> Op {
    Box::new(move |thread, i| {
        if i % HELD_CALLS == 0 {
            HELD.with(|held| {
                // The old section goes first: a fresh one under it would nest.
                drop(held.take());
                *held.borrow_mut() = hold.then(tollgate::lab_hooks::pin);
            });
            assert_eq!(
                tollgate::lab_hooks::is_pinned(),
                hold,
                "the outer section is not the store's read-copy-update's"
            );
        }
        op(thread, i);
    })
}

/// governor's direct limiter, drained.
pub fn governor_direct_deny() -> Op {
    let limiter =
        governor::RateLimiter::direct(governor::Quota::per_hour(NonZeroU32::new(1).unwrap()));
    assert!(limiter.check().is_ok());
    Box::new(move |_, _| {
        black_box(limiter.check().is_ok());
    })
}

/// A quota whose sliding window counter packs into a word (an emission
/// interval of 100 µs, bursts of 1 000: a 100 ms window), which keys spread
/// over 65 536 never drain: a thread revisits each of its 16 384 keys about
/// once a millisecond, and a key refills ten units in that time. A key
/// rests 100 ms (the counter 200 ms) after its last admission, as with
/// `distinct_quota`, so that none is evicted while in use (a shorter rest
/// lets the table's growth sweeps evict the first keys while the last are
/// primed, and the run then measures their re-insertion).
pub fn packing_quota() -> Quota {
    Quota::per_second(10_000)
        .unwrap()
        .with_burst(1_000)
        .unwrap()
}

/// Algorithm `A` on `store`, admitting on `keys` distinct keys (each thread
/// its own quarter), every key present before timing.
pub fn admit_distinct<A: Algorithm, S: StoreKind<u64, A>>(store: S, keys: u64) -> Op {
    admit_distinct_at::<A, _>(distinct_quota(), store, keys)
}

/// `RateLimiter::keyed`, every default, on the same workload.
pub fn admit_distinct_default(keys: u64) -> Op {
    let limiter = RateLimiter::<u64>::keyed(distinct_quota());
    admitting(keys, move |key| limiter.check(key).unwrap().is_allowed())
}

/// The same at `quota`.
pub fn admit_distinct_at<A: Algorithm, S: StoreKind<u64, A>>(
    quota: Quota,
    store: S,
    keys: u64,
) -> Op {
    let limiter = keyed::<A, _, _>(quota, store, TscClock::new());
    admitting(keys, move |key| limiter.check(key).unwrap().is_allowed())
}

/// The keys `0..keys` in the order the distinct-key workloads first admit
/// them: scattered (`i × p mod keys`, `p` = 0x9E37_79B9, odd, so coprime
/// to the powers of two the lab's key counts are, and every key comes
/// once; 9 mod 16, so even 16 keys are interleaved), not in the order of
/// the quarters the threads then check. In a server a key is first seen by whichever core took its first
/// request; admitted in order, the keys of one thread would sit side by
/// side in a map that allocates each entry as it arrives (papaya, flurry),
/// so that no cache line of theirs held two threads' keys, a separation
/// the tables that keep entries inline where their hash puts them
/// (tollgate's, governor's, `scc`'s) never get.
/// [`admit_distinct_admitted_in_order`] measures that difference.
pub fn first_admission_order(keys: u64) -> impl Iterator<Item = u64> {
    const STEP: u64 = 0x9E37_79B9;
    (0..keys).map(move |i| i * STEP % keys)
}

/// Admits each of `keys` keys once with `check` (in
/// [`first_admission_order`]), then returns the operation: thread `t`
/// checks its quarter's keys in turn.
fn admitting(keys: u64, check: impl Fn(&u64) -> bool + Sync + 'static) -> Op {
    for key in first_admission_order(keys) {
        assert!(check(&key));
    }
    Box::new(move |thread, i| {
        black_box(check(&key_of(keys, thread, i)));
    })
}

/// GCRA on `store` as [`admit_distinct`], its keys first admitted in order
/// (`0..keys`, each thread's quarter side by side), not scattered.
#[allow(dead_code)] // A diagnostic of the lab's; the criterion benches run no peer store.
pub fn admit_distinct_admitted_in_order<S: StoreKind<u64, Gcra>>(store: S, keys: u64) -> Op {
    let limiter = keyed::<Gcra, _, _>(distinct_quota(), store, TscClock::new());
    for key in 0..keys {
        assert!(limiter.check(&key).unwrap().is_allowed());
    }
    Box::new(move |thread, i| {
        black_box(
            limiter
                .check(&key_of(keys, thread, i))
                .unwrap()
                .is_allowed(),
        );
    })
}

/// The same workload with one limiter per thread (up to 4): nothing shared
/// between threads but the clock and the read-copy-update's registry. Set beside
/// `admit_distinct` on `LockFree`, it measures what sharing one table costs
/// (cache lines holding keys of several threads).
pub fn admit_distinct_unshared(keys: u64) -> Op {
    let limiters: Vec<_> = (0..4)
        .map(|_| {
            let limiter =
                keyed::<Gcra, _, _>(distinct_quota(), LockFree::default(), TscClock::new());
            for key in first_admission_order(keys) {
                assert!(limiter.check(&key).unwrap().is_allowed());
            }
            limiter
        })
        .collect();
    Box::new(move |thread, i| {
        let limiter = &limiters[thread % 4];
        black_box(
            limiter
                .check(&key_of(keys, thread, i))
                .unwrap()
                .is_allowed(),
        );
    })
}

/// A SipHash hasher (std's `RandomState`) for u64 keys that can set the
/// bit the lock-free store's lowest shard bit reads (bit 32) to the parity
/// of the key's quarter: with `apart`, threads 0 and 1 (and 2 and 3) keep
/// their keys in disjoint shards, so no cache line of any table holds keys
/// of two threads on two cores; without it, the same hasher mixes them as
/// SipHash does. The same keys, the same number per shard on average, the
/// same hash cost; what differs besides the lines two cores share is each
/// thread's footprint (apart, a thread's keys fill half the shards'
/// tables, so it touches fewer lines), which the ratio at 1 thread, where
/// no line is shared, measures alone. The 2-thread ratio over the 1-thread
/// one is then what sharing lines between cores costs (false sharing),
/// where hardware counters cannot be read (this VM has none: `perf c2c`
/// reports "memory events not supported").
#[derive(Clone, Debug)]
pub struct QuarterShards {
    sip: std::hash::RandomState,
    quarter: u64,
    apart: bool,
}

/// The hasher of [`QuarterShards`].
pub struct QuarterShardsHasher {
    inner: std::hash::DefaultHasher,
    key: u64,
    quarter: u64,
    apart: bool,
}

impl std::hash::BuildHasher for QuarterShards {
    type Hasher = QuarterShardsHasher;
    fn build_hasher(&self) -> QuarterShardsHasher {
        QuarterShardsHasher {
            inner: self.sip.build_hasher(),
            key: 0,
            quarter: self.quarter,
            apart: self.apart,
        }
    }
}

impl std::hash::Hasher for QuarterShardsHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.inner.write(bytes);
    }
    fn write_u64(&mut self, key: u64) {
        self.key = key;
        self.inner.write_u64(key);
    }
    fn finish(&self) -> u64 {
        let hash = self.inner.finish();
        if self.apart {
            (hash & !(1 << 32)) | (((self.key / self.quarter) & 1) << 32)
        } else {
            hash
        }
    }
}

/// GCRA on the lock-free store admitting on `keys` distinct keys, as
/// `admit_distinct`, hashed by [`QuarterShards`] with its keys `apart` by
/// thread or mixed.
pub fn admit_distinct_quarters(keys: u64, apart: bool) -> Op {
    let hasher = QuarterShards {
        sip: std::hash::RandomState::new(),
        quarter: (keys / 4).max(1),
        apart,
    };
    admit_distinct::<Gcra, _>(LockFree::default().with_hasher(hasher), keys)
}

/// A `u64` key aligned to a cache line: in the lock-free table a slot (the
/// key, then its 8-byte cell) takes two lines, the key's, which only
/// inserts write, and the cell's, alone in its line. Hashes and compares
/// as its `u64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(align(64))]
pub struct LineKey(u64);

/// GCRA on the lock-free store admitting on `keys` distinct [`LineKey`]s,
/// as `admit_distinct`: no two keys' cells share a cache line, at 128
/// bytes a slot against 16 (129 bytes a bucket against 17), and each check
/// touches two lines, its key's and its cell's. What it gains over
/// `admit_distinct` is the false sharing between cells, less what the
/// larger footprint costs.
pub fn admit_distinct_line_keys(keys: u64) -> Op {
    let limiter = Builder::new(distinct_quota())
        .store(LockFree::default())
        .clock(TscClock::new())
        .build::<LineKey>();
    for key in first_admission_order(keys) {
        assert!(limiter.check(&LineKey(key)).unwrap().is_allowed());
    }
    Box::new(move |thread, i| {
        black_box(
            limiter
                .check(&LineKey(key_of(keys, thread, i)))
                .unwrap()
                .is_allowed(),
        );
    })
}

/// governor's keyed limiter on the same workload.
pub fn governor_admit_distinct(keys: u64) -> Op {
    let limiter = governor::RateLimiter::keyed(governor_quota(100_000_000, 10_000_000));
    admitting(keys, move |key| limiter.check_key(key).is_ok())
}

/// GCRA on `store`, every thread admitting on one hot key.
pub fn admit_hot_key<S: StoreKind<u64, Gcra>>(store: S) -> Op {
    let limiter = keyed::<Gcra, _, _>(hot_quota(), store, TscClock::new());
    Box::new(move |_, _| {
        black_box(limiter.check(&0).unwrap().is_allowed());
    })
}

/// governor's keyed limiter, every thread admitting on one hot key.
pub fn governor_admit_hot_key() -> Op {
    let limiter = governor::RateLimiter::keyed(governor_quota(1_000_000_000, 1_000_000));
    Box::new(move |_, _| {
        black_box(limiter.check_key(&0_u64).is_ok());
    })
}
