//! The performance section: the workloads of `benches/support/workloads.rs`
//! at 1, 2 and 4 threads (4 oversubscribes this 2-core machine), as
//! aggregate throughput, and the ratios the lab judges.
//!
//! By default it measures the headline: the rows of the two tables that the
//! judged ratios and the headline plots read (denying on a drained hot key,
//! admitting on 65 536 distinct keys) and the judged ratios. With
//! `--diagnostics` it measures every workload: the rows that explain a
//! figure (hashers, guards, layouts, the stores on other maps), the tables
//! by clock, by key count, by algorithm and on one hot key, the pieces of a
//! keyed check, and the ratios shown but not judged.
//!
//! How it holds still on a noisy 2-core VM:
//!
//! - **Tables** are measured in interleaved rounds: each round runs every
//!   cell of a table once (its rows in a fresh random order each round),
//!   so that a slow second of the machine falls on every row alike. A cell
//!   is the median of its rounds, with its order-statistics interval.
//! - **Judged ratios** come from pairs: the subject and its baseline run
//!   back to back, alternately first, each pair giving one ratio. The pairs
//!   run in blocks (2 of 6 pairs; 6 of 10 in `--full`) spread evenly over
//!   the run's rounds, each block in a fresh process of this program
//!   (started from `/proc/self/exe` on Linux, so a rebuild during the run
//!   changes nothing) on workloads built afresh, so that what moves between
//!   processes (placement, hash seeds, the host's load) shows as a
//!   difference between blocks. A target is met only if every block's
//!   interval around its median (95 % or more: a block of 6 pairs gives its
//!   range) meets it; a block whose process fails or runs past its limit
//!   counts as missed and is named in the report, which gives every block's
//!   pairs together and the spread of the blocks' medians.
//! - Measuring threads are pinned to CPUs (`parallel.rs`).

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tollgate::algorithm::{FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket};
use tollgate::cell::AlwaysLocked;
use tollgate::clock::{Clock, CoarseClock, MonotonicClock, TscClock};
use tollgate::store::{GlobalMutex, LockFree, PerKey, Sharded};
use tollgate_peers::{Flurry, Papaya, SccIndex};

use crate::stats::{Estimate, median_ci};
use crate::{parallel, workloads};

pub const THREADS: [usize; 3] = [1, 2, 4];

/// How long to measure.
pub struct Budget {
    /// One run of one cell (calibrated to about this long).
    pub slice: Duration,
    /// Interleaved rounds per table cell.
    pub rounds: usize,
    /// Pairs per judged ratio in each block.
    pub pairs: usize,
    /// Blocks the pairs are run in, each in a fresh process of this program
    /// (`--judge-block`) on workloads built afresh (new limiters, hash
    /// seeds, heap addresses, cache-line neighbours, and the process's own
    /// placement on the host), spread over the run. A target is met only
    /// if every block's interval meets it.
    pub blocks: usize,
    /// The `--full` budget (passed on to the blocks' processes).
    pub full: bool,
    /// Every row, table and ratio, not only the headline's.
    pub diagnostics: bool,
}

/// One workload's aggregate ns per operation at 1, 2 and 4 threads.
pub struct Row {
    pub name: &'static str,
    pub ns: [Estimate; 3],
}

impl Row {
    /// Million operations per second at `column`, with its interval.
    pub fn mops(&self, column: usize) -> Estimate {
        self.ns[column].reciprocal(1_000.0)
    }
}

/// A titled group of rows.
pub struct Table {
    pub title: String,
    pub rows: Vec<Row>,
}

impl Table {
    pub fn row(&self, name: &str) -> &Row {
        self.rows
            .iter()
            .find(|row| row.name == name)
            .unwrap_or_else(|| panic!("no row {name} in {}", self.title))
    }
}

/// Which way a judged ratio must lie.
#[derive(Clone, Copy)]
pub enum Target {
    /// The ratio's interval must lie at or above this.
    AtLeast(f64),
    /// The ratio's interval must lie at or below this.
    AtMost(f64),
    /// Shown, not judged.
    Shown,
}

/// A ratio from paired runs: `baseline ns / subject ns` (how many times
/// the subject's throughput), or for an [`Target::AtMost`] target `subject
/// ns / baseline ns` (how many times the baseline's cost).
pub struct Judged {
    pub name: &'static str,
    /// Every block's pairs together.
    pub ratio: Estimate,
    /// Each block's pairs alone, in the order the blocks ran.
    pub blocks: Vec<Estimate>,
    /// How many blocks failed (their process did not finish, or printed
    /// nothing readable): each counts as a block that missed.
    pub failed: usize,
    pub target: Target,
}

/// What the blocks' intervals say of a judged ratio's target.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every block's whole interval meets the target.
    Met,
    /// Some block's interval reaches the target, but not every block's
    /// whole interval meets it: judged missed.
    Straddles,
    /// Every block's whole interval misses the target.
    Missed,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Met => "MET",
            Verdict::Straddles => "MISSED (some blocks)",
            Verdict::Missed => "MISSED",
        }
    }
}

impl Judged {
    /// Whether `estimate`'s whole interval meets the target, and whether
    /// any of it does; `None` for a ratio shown, not judged.
    fn standing(&self, estimate: &Estimate) -> Option<(bool, bool)> {
        match self.target {
            Target::AtLeast(target) => Some((estimate.low >= target, estimate.high >= target)),
            Target::AtMost(target) => Some((estimate.high <= target, estimate.low <= target)),
            Target::Shown => None,
        }
    }

    /// Met only if every block ran and its whole interval meets the target;
    /// `None` for a ratio shown, not judged.
    pub fn verdict(&self) -> Option<Verdict> {
        let blocks: Vec<(bool, bool)> = self
            .blocks
            .iter()
            .map(|block| self.standing(block))
            .collect::<Option<_>>()?;
        Some(
            if self.failed == 0 && blocks.iter().all(|&(inside, _)| inside) {
                Verdict::Met
            } else if blocks.iter().any(|&(_, reaching)| reaching) {
                Verdict::Straddles
            } else {
                Verdict::Missed
            },
        )
    }

    /// How many blocks were run, the failed ones included.
    pub fn blocks_run(&self) -> usize {
        self.blocks.len() + self.failed
    }

    /// How many blocks' whole intervals meet the target.
    pub fn blocks_met(&self) -> usize {
        self.blocks
            .iter()
            .filter(|block| self.standing(block).is_some_and(|(inside, _)| inside))
            .count()
    }

    /// The lowest and the highest of the blocks' medians.
    pub fn between_blocks(&self) -> (f64, f64) {
        if self.blocks.is_empty() {
            return (f64::NAN, f64::NAN);
        }
        self.blocks
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), block| {
                (low.min(block.median), high.max(block.median))
            })
    }
}

/// Every table of the section, and the judged ratios: the diagnostic
/// tables and pieces only with `Budget::diagnostics`.
pub struct Results {
    /// Denying on a drained hot key.
    pub deny: Table,
    pub deny_with_clock: Option<Table>,
    /// Admitting on 16 and on 1 024 distinct keys.
    pub fewer_keys: Vec<Table>,
    /// Admitting on 65 536 distinct keys.
    pub distinct: Table,
    pub by_algorithm: Option<Table>,
    pub hot: Option<Table>,
    /// One of each piece of a keyed check, ns, on one thread.
    pub pieces: Vec<(&'static str, f64)>,
    /// The judged ratios, then (with diagnostics) the ones shown.
    pub judged: Vec<Judged>,
    /// Whether the diagnostic rows, tables and ratios were measured.
    pub diagnostics: bool,
    /// Each judged block that failed, and why.
    pub failures: Vec<String>,
    /// [`line_handoff_ns`] at the run's start and at its end.
    pub handoff_ns: (f64, f64),
    /// [`line_handoff_ns`] in each judged block's process.
    pub block_handoffs: Vec<f64>,
}

/// The rows of the deny table that the headline reads: the judged ratios'
/// and the plots'.
const HEADLINE_DENY: [&str; 9] = [
    "fixed window",
    "token bucket",
    "sliding log",
    "sliding counter",
    "GCRA",
    "GCRA, foldhash",
    "governor keyed",
    "GCRA direct",
    "GCRA on papaya",
];

/// The rows of the 65 536-key table that the headline reads.
const HEADLINE_DISTINCT: [&str; 7] = [
    "global mutex",
    "sharded",
    "per-key",
    "lock-free",
    "lock-free, foldhash",
    "governor keyed",
    "papaya",
];

/// `makers` without the rows not named in `headline`.
fn headline_only(mut makers: Makers, headline: &[&str]) -> Makers {
    makers.retain(|(name, _)| headline.contains(name));
    makers
}

/// The number of operations per thread that make one run of `op` on
/// `threads` threads last about `slice`. Its runs warm the workload up.
fn calibrate(op: &workloads::Op, threads: usize, slice: Duration) -> u64 {
    let mut ops = 1_000_u64;
    let mut elapsed = parallel::run(threads, ops, op);
    while elapsed < slice / 8 && ops < 1 << 32 {
        ops *= 4;
        elapsed = parallel::run(threads, ops, op);
    }
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let ops = ((ops as f64) * slice.as_secs_f64() / elapsed.as_secs_f64()).max(1.0) as u64;
    ops
}

/// One run: aggregate ns per operation.
fn sample(op: &(dyn Fn(usize, u64) + Sync), threads: usize, ops: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let total = (ops * threads as u64) as f64;
    parallel::run(threads, ops, &op).as_nanos() as f64 / total
}

/// A fixed-seed xorshift generator for the rounds' orders: every run of
/// the lab measures in the same orders.
struct Shuffle(u64);

impl Shuffle {
    /// Puts `order` in a fresh random order (Fisher–Yates).
    fn permute(&mut self, order: &mut [usize]) {
        for index in (1..order.len()).rev() {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            // The remainder is below `index + 1`: the cast back is lossless.
            #[allow(clippy::cast_possible_truncation)]
            let other = (self.0 % (index as u64 + 1)) as usize;
            order.swap(index, other);
        }
    }
}

/// Measures a table in interleaved rounds: each round runs every row at
/// every thread count, the rows in a fresh random order at each (so that
/// no row always follows the same one). `after_round` runs after each
/// round (the run's judged blocks that are due then).
fn table(
    title: String,
    makers: &Makers,
    budget: &Budget,
    bar: &ProgressBar,
    after_round: &mut dyn FnMut(),
) -> Table {
    bar.set_message(format!("{title}: building"));
    let ops: Vec<(&'static str, workloads::Op)> =
        makers.iter().map(|(name, make)| (*name, make())).collect();
    bar.set_message(format!("{title}: calibrating"));
    let sizes: Vec<[u64; 3]> = ops
        .iter()
        .map(|(_, op)| THREADS.map(|threads| calibrate(op, threads, budget.slice)))
        .collect();
    let mut samples = vec![[const { Vec::new() }; 3]; ops.len()];
    bar.set_message(title.clone());
    let mut order: Vec<usize> = (0..ops.len()).collect();
    let mut shuffle = Shuffle(0x9E37_79B9_7F4A_7C15);
    for _ in 0..budget.rounds {
        for (column, threads) in THREADS.into_iter().enumerate() {
            shuffle.permute(&mut order);
            for &row in &order {
                let sample = sample(&ops[row].1, threads, sizes[row][column]);
                samples[row][column].push(sample);
            }
        }
        bar.inc(1);
        bar.set_message(title.clone());
        after_round();
    }
    let rows = ops
        .iter()
        .zip(samples)
        .map(|((name, _), cells)| Row {
            name,
            ns: cells.map(|mut values| median_ci(&mut values)),
        })
        .collect();
    Table { title, rows }
}

/// One side of a pair: a workload's maker and a thread count.
struct Side<'a> {
    make: &'a Make,
    threads: usize,
}

/// One block of pairs: `subject` and `baseline` built afresh, then run
/// back to back for the pairs numbered `pairs`, the subject first in the
/// even-numbered ones (numbered over the whole case, so that blocks of an
/// odd size do not put the same side first more often); the pairs' ratios
/// `subject ns / baseline ns`.
fn paired_block(
    subject: &Side<'_>,
    baseline: &Side<'_>,
    pairs: std::ops::Range<usize>,
    slice: Duration,
) -> Vec<f64> {
    let (subject_op, baseline_op) = ((subject.make)(), (baseline.make)());
    let subject_ops = calibrate(&subject_op, subject.threads, slice);
    let baseline_ops = calibrate(&baseline_op, baseline.threads, slice);
    pairs
        .map(|pair| {
            let (subject_ns, baseline_ns) = if pair % 2 == 0 {
                let s = sample(&subject_op, subject.threads, subject_ops);
                (s, sample(&baseline_op, baseline.threads, baseline_ops))
            } else {
                let b = sample(&baseline_op, baseline.threads, baseline_ops);
                (sample(&subject_op, subject.threads, subject_ops), b)
            };
            subject_ns / baseline_ns
        })
        .collect()
}

/// ns per call of `step` (given the call's index) beyond an empty step's,
/// over 2 000 000 calls on one pinned thread: the median of five runs,
/// each timed as `step` and the empty step back to back.
fn one_thread_cost(step: &(dyn Fn(u64) -> u64 + Sync)) -> f64 {
    const CALLS: u64 = 2_000_000;
    let time = |step: &(dyn Fn(u64) -> u64 + Sync)| {
        let op = |_, call| {
            std::hint::black_box(step(std::hint::black_box(call)));
        };
        sample(&op, 1, CALLS)
    };
    let empty = |call| call;
    let mut runs: Vec<f64> = (0..5).map(|_| time(step) - time(&empty)).collect();
    crate::stats::median(&mut runs)
}

/// One of each piece a keyed check is made of, on one thread: the clock
/// reads, the two hashers, the lock-free store's read section (its
/// read-copy-update's entry and exit, as every check makes them), and, for
/// comparison, a pin of crossbeam-epoch's default collector (the store's
/// read side before, its `lock cmpxchg` included).
fn components() -> Vec<(&'static str, f64)> {
    use std::hash::BuildHasher;
    let (monotonic, tsc, coarse) = (MonotonicClock::new(), TscClock::new(), CoarseClock::new());
    let sip = std::hash::RandomState::new();
    let fold = foldhash::fast::RandomState::default();
    vec![
        (
            "clock: monotonic (std Instant)",
            one_thread_cost(&|_| monotonic.now_ns()),
        ),
        ("clock: tsc (quanta)", one_thread_cost(&|_| tsc.now_ns())),
        (
            "clock: coarse (cached)",
            one_thread_cost(&|_| coarse.now_ns()),
        ),
        (
            "hash a u64: SipHash-1-3 (std)",
            one_thread_cost(&|key| sip.hash_one(key)),
        ),
        (
            "hash a u64: foldhash, seeded",
            one_thread_cost(&|key| fold.hash_one(key)),
        ),
        (
            "read section enter and leave (tollgate's RCU)",
            one_thread_cost(&|call| {
                let section = tollgate::lab_hooks::pin();
                drop(std::hint::black_box(section));
                call
            }),
        ),
        (
            "epoch pin and unpin (crossbeam-epoch, for comparison)",
            one_thread_cost(&|call| {
                let guard = crossbeam_epoch::pin();
                drop(std::hint::black_box(guard));
                call
            }),
        ),
    ]
}

/// ns for a cache line to pass from one measuring CPU to the other: two
/// threads pinned as the measurements' are hand one counter back and forth
/// 200 000 times, each waiting for the other's value before writing its
/// own; the median of five runs. What a 2-thread check pays for each line
/// it writes that the other thread also writes (governor's keyed denial:
/// its shard lock's count), which depends on where the host puts the two
/// CPUs (one core's two hyperthreads, or two cores); `NaN` on fewer than 2
/// CPUs.
pub fn line_handoff_ns() -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    const HANDOFFS: u64 = 200_000;
    if parallel::cpu_count() < 2 {
        return f64::NAN;
    }
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let ball = crossbeam_utils::CachePadded::new(AtomicU64::new(0));
            let wall = parallel::run(2, 1, &|thread, _| {
                // Thread 0 writes the odd values, thread 1 the even ones.
                let mut next = thread as u64 + 1;
                while next <= HANDOFFS {
                    while ball.load(Ordering::Acquire) != next - 1 {
                        std::hint::spin_loop();
                    }
                    ball.store(next, Ordering::Release);
                    next += 2;
                }
            });
            #[allow(clippy::cast_precision_loss)]
            let per_handoff = wall.as_secs_f64() * 1e9 / HANDOFFS as f64;
            per_handoff
        })
        .collect();
    crate::stats::median(&mut runs)
}

/// Builds a workload (its limiter built and primed).
type Make = Box<dyn Fn() -> workloads::Op>;

/// A table's rows: each name with its workload's maker.
type Makers = Vec<(&'static str, Make)>;

/// `(name, maker)` from a workload expression, built each time it is called.
macro_rules! rows {
    ($(($name:expr, $op:expr $(,)?)),* $(,)?) => {
        vec![$(($name, Box::new(move || $op) as Make)),*]
    };
}

fn deny_ops() -> Makers {
    rows![
        (
            "fixed window",
            workloads::deny_hot_key::<FixedWindow, _>(TscClock::new()),
        ),
        (
            "token bucket",
            workloads::deny_hot_key::<TokenBucket, _>(TscClock::new()),
        ),
        (
            "sliding log",
            workloads::deny_hot_key::<SlidingWindowLog, _>(TscClock::new()),
        ),
        (
            "sliding counter",
            workloads::deny_hot_key::<SlidingWindowCounter, _>(TscClock::new()),
        ),
        (
            "sliding counter, locked",
            workloads::deny_hot_key_on::<SlidingWindowCounter, _, _>(
                LockFree::default().cells::<AlwaysLocked>(),
                TscClock::new(),
            ),
        ),
        ("GCRA", workloads::deny_hot_key_default()),
        ("GCRA, a carried quota", workloads::deny_hot_key_carried()),
        ("GCRA, counted", workloads::deny_hot_key_counted()),
        ("GCRA, uncounted", workloads::deny_hot_key_uncounted()),
        (
            "GCRA in a held read section",
            workloads::in_outer_guard(workloads::deny_hot_key::<Gcra, _>(TscClock::new()), true),
        ),
        (
            "GCRA, its control",
            workloads::in_outer_guard(workloads::deny_hot_key::<Gcra, _>(TscClock::new()), false),
        ),
        (
            "GCRA, foldhash",
            workloads::deny_hot_key_on::<Gcra, _, _>(
                workloads::lock_free_foldhash(),
                TscClock::new(),
            ),
        ),
        ("governor keyed", workloads::governor_deny_hot_key()),
        (
            "GCRA on papaya",
            workloads::deny_hot_key_on::<Gcra, _, _>(Papaya::new(), TscClock::new()),
        ),
        (
            "GCRA on scc::HashIndex",
            workloads::deny_hot_key_on::<Gcra, _, _>(SccIndex::new(), TscClock::new()),
        ),
        (
            "GCRA on flurry",
            workloads::deny_hot_key_on::<Gcra, _, _>(Flurry::new(), TscClock::new()),
        ),
        (
            "GCRA cell in a HashMap",
            workloads::deny_hot_key_in_hashmap::<workloads::Unguarded>()
        ),
        (
            "the same, a crossbeam-epoch pin",
            workloads::deny_hot_key_in_hashmap::<workloads::EpochPinned>()
        ),
        (
            "the same, a read counter",
            workloads::deny_hot_key_in_hashmap::<workloads::CounterRead>()
        ),
        ("GCRA direct", workloads::direct_deny()),
        ("governor direct", workloads::governor_direct_deny()),
    ]
}

fn clock_ops() -> Makers {
    rows![
        (
            "monotonic",
            workloads::deny_hot_key::<Gcra, _>(MonotonicClock::new()),
        ),
        ("tsc", workloads::deny_hot_key::<Gcra, _>(TscClock::new())),
        (
            "coarse",
            workloads::deny_hot_key::<Gcra, _>(CoarseClock::new()),
        ),
    ]
}

fn distinct_ops(keys: u64) -> Makers {
    rows![
        (
            "global mutex",
            workloads::admit_distinct::<Gcra, _>(GlobalMutex, keys),
        ),
        (
            "sharded",
            workloads::admit_distinct::<Gcra, _>(Sharded::default(), keys),
        ),
        (
            "per-key",
            workloads::admit_distinct::<Gcra, _>(PerKey::new(), keys),
        ),
        ("lock-free", workloads::admit_distinct_default(keys)),
        (
            "lock-free, foldhash",
            workloads::admit_distinct::<Gcra, _>(workloads::lock_free_foldhash(), keys),
        ),
        (
            "lock-free, unshared",
            workloads::admit_distinct_unshared(keys),
        ),
        (
            "lock-free, keys mixed",
            workloads::admit_distinct_quarters(keys, false),
        ),
        (
            "lock-free, keys apart",
            workloads::admit_distinct_quarters(keys, true),
        ),
        (
            "lock-free, a cell a line",
            workloads::admit_distinct_line_keys(keys),
        ),
        ("governor keyed", workloads::governor_admit_distinct(keys)),
        (
            "papaya",
            workloads::admit_distinct::<Gcra, _>(Papaya::new(), keys),
        ),
        (
            "papaya, admitted in order",
            workloads::admit_distinct_admitted_in_order(Papaya::new(), keys),
        ),
        (
            "scc::HashIndex",
            workloads::admit_distinct::<Gcra, _>(SccIndex::new(), keys),
        ),
        (
            "flurry",
            workloads::admit_distinct::<Gcra, _>(Flurry::new(), keys),
        ),
    ]
}

/// The lock-free store's admissions with its section nested in a held one,
/// and its control (`workloads::in_outer_guard`): rows of the widest
/// distinct-key table only, where their pairs run.
fn held_guard_ops(keys: u64) -> Makers {
    rows![
        (
            "lock-free in a held read section",
            workloads::in_outer_guard(
                workloads::admit_distinct::<Gcra, _>(LockFree::default(), keys),
                true
            ),
        ),
        (
            "lock-free, its control",
            workloads::in_outer_guard(
                workloads::admit_distinct::<Gcra, _>(LockFree::default(), keys),
                false
            ),
        ),
    ]
}

fn algorithm_ops() -> Makers {
    let quota = workloads::packing_quota;
    rows![
        (
            "fixed window",
            workloads::admit_distinct_at::<FixedWindow, _>(quota(), LockFree::default(), 65_536),
        ),
        (
            "token bucket",
            workloads::admit_distinct_at::<TokenBucket, _>(quota(), LockFree::default(), 65_536),
        ),
        (
            "sliding log",
            workloads::admit_distinct_at::<SlidingWindowLog, _>(
                quota(),
                LockFree::default(),
                65_536,
            ),
        ),
        (
            "sliding counter",
            workloads::admit_distinct_at::<SlidingWindowCounter, _>(
                quota(),
                LockFree::default(),
                65_536,
            ),
        ),
        (
            "sliding counter, locked",
            workloads::admit_distinct_at::<SlidingWindowCounter, _>(
                quota(),
                LockFree::default().cells::<AlwaysLocked>(),
                65_536,
            ),
        ),
        (
            "sliding counter, unpacked",
            // 10^8 a second in bursts of 10^7: a quota it cannot pack, so
            // its default cell takes the boxed locked form.
            workloads::admit_distinct::<SlidingWindowCounter, _>(LockFree::default(), 65_536),
        ),
        (
            "GCRA",
            workloads::admit_distinct_at::<Gcra, _>(quota(), LockFree::default(), 65_536),
        ),
    ]
}

fn hot_ops() -> Makers {
    rows![
        ("global mutex", workloads::admit_hot_key(GlobalMutex)),
        ("sharded", workloads::admit_hot_key(Sharded::default())),
        ("per-key", workloads::admit_hot_key(PerKey::new())),
        ("lock-free", workloads::admit_hot_key(LockFree::default())),
        ("governor keyed", workloads::governor_admit_hot_key()),
        ("papaya", workloads::admit_hot_key(Papaya::new())),
        ("scc::HashIndex", workloads::admit_hot_key(SccIndex::new())),
        ("flurry", workloads::admit_hot_key(Flurry::new())),
    ]
}

/// The maker of the row named `name` in `makers`.
fn op<'a>(makers: &'a Makers, name: &str) -> &'a Make {
    &makers
        .iter()
        .find(|(row, _)| *row == name)
        .unwrap_or_else(|| panic!("no workload {name}"))
        .1
}

/// A ratio the lab judges, with the pairs' ratios measured so far.
struct Case<'a> {
    name: &'static str,
    subject: Side<'a>,
    baseline: Side<'a>,
    target: Target,
    /// A throughput ratio (the baseline's cost over the subject's), or a
    /// cost ratio.
    throughput: bool,
    /// Each block's pairs' ratios `subject ns / baseline ns`.
    blocks: Vec<Vec<f64>>,
    /// How many blocks failed.
    failed: usize,
}

/// The ratios the lab judges, each from its own pairs at 2 threads (the
/// scaling ratio: 2 threads against 1), and with `diagnostics` the ones it
/// shows.
fn cases<'a>(deny: &'a Makers, distinct: &'a Makers, diagnostics: bool) -> Vec<Case<'a>> {
    let at = |make, threads| Side { make, threads };
    let two = |op| at(op, 2);
    // The headline: `RateLimiter::keyed` and `DirectLimiter::direct` with
    // every default against governor's `RateLimiter::keyed` with its
    // defaults, and the lock-free store against papaya's on the same clock,
    // hasher and cells.
    let mut judged: Vec<(&'static str, Side<'a>, Side<'a>, Target, bool)> = vec![
        (
            "keyed deny × governor keyed (defaults)",
            two(op(deny, "GCRA")),
            two(op(deny, "governor keyed")),
            Target::AtLeast(3.0),
            true,
        ),
        (
            "keyed deny ÷ direct deny (defaults)",
            two(op(deny, "GCRA")),
            two(op(deny, "GCRA direct")),
            Target::AtMost(2.0),
            false,
        ),
        (
            "keyed deny, 2 threads × 1 thread",
            two(op(deny, "GCRA")),
            at(op(deny, "GCRA"), 1),
            Target::AtLeast(1.6),
            true,
        ),
        (
            "admit, 65 536 keys × governor keyed (defaults)",
            two(op(distinct, "lock-free")),
            two(op(distinct, "governor keyed")),
            Target::AtLeast(1.5),
            true,
        ),
        (
            "admit, 65 536 keys × global mutex",
            two(op(distinct, "lock-free")),
            two(op(distinct, "global mutex")),
            Target::AtLeast(4.0),
            true,
        ),
    ];
    for (threads, deny_name, admit_name) in [
        (
            1,
            "lock-free × papaya store, deny, 1 thread",
            "lock-free × papaya store, 65 536 keys, 1 thread",
        ),
        (
            2,
            "lock-free × papaya store, deny, 2 threads",
            "lock-free × papaya store, 65 536 keys, 2 threads",
        ),
    ] {
        judged.push((
            deny_name,
            at(op(deny, "GCRA"), threads),
            at(op(deny, "GCRA on papaya"), threads),
            Target::AtLeast(1.0),
            true,
        ));
        judged.push((
            admit_name,
            at(op(distinct, "lock-free"), threads),
            at(op(distinct, "papaya"), threads),
            Target::AtLeast(1.0),
            true,
        ));
    }
    // The engine with seeded foldhash in place of SipHash, for keys clients
    // do not choose: shown.
    judged.extend([
        (
            "  keyed deny, seeded foldhash × governor keyed",
            two(op(deny, "GCRA, foldhash")),
            two(op(deny, "governor keyed")),
            Target::Shown,
            true,
        ),
        (
            "  admit, 65 536 keys, seeded foldhash × governor keyed",
            two(op(distinct, "lock-free, foldhash")),
            two(op(distinct, "governor keyed")),
            Target::Shown,
            true,
        ),
    ]);
    if !diagnostics {
        return into_cases(judged);
    }
    // The diagnostic rows exist only with diagnostics: these resolve them.
    let mut cases = judged;
    cases.extend(vec![
        (
            "  keyed GCRA deny, a carried quota ÷ the limiter's own (cost)",
            two(op(deny, "GCRA, a carried quota")),
            two(op(deny, "GCRA")),
            Target::Shown,
            false,
        ),
        (
            "  a carried quota, 1 thread",
            at(op(deny, "GCRA, a carried quota"), 1),
            at(op(deny, "GCRA"), 1),
            Target::Shown,
            false,
        ),
        (
            "  keyed GCRA deny, counted for metrics ÷ not (cost)",
            two(op(deny, "GCRA, counted")),
            two(op(deny, "GCRA, uncounted")),
            Target::Shown,
            false,
        ),
        (
            "  counted for metrics, 1 thread",
            at(op(deny, "GCRA, counted"), 1),
            at(op(deny, "GCRA, uncounted"), 1),
            Target::Shown,
            false,
        ),
        (
            "  the uncounted baseline ÷ the keyed GCRA deny (the same code: a control)",
            two(op(deny, "GCRA, uncounted")),
            two(op(deny, "GCRA")),
            Target::Shown,
            false,
        ),
        (
            "  GCRA cell in a read-only HashMap ÷ direct (cost)",
            two(op(deny, "GCRA cell in a HashMap")),
            two(op(deny, "GCRA direct")),
            Target::Shown,
            false,
        ),
        (
            "  keyed GCRA deny ÷ the cell in a read-only HashMap (cost)",
            two(op(deny, "GCRA")),
            two(op(deny, "GCRA cell in a HashMap")),
            Target::Shown,
            false,
        ),
        (
            "  the cell in a HashMap, crossbeam-epoch pinned ÷ not guarded (cost), 2 threads",
            two(op(deny, "the same, a crossbeam-epoch pin")),
            two(op(deny, "GCRA cell in a HashMap")),
            Target::Shown,
            false,
        ),
        (
            "  crossbeam-epoch pinned, 1 thread",
            at(op(deny, "the same, a crossbeam-epoch pin"), 1),
            at(op(deny, "GCRA cell in a HashMap"), 1),
            Target::Shown,
            false,
        ),
        (
            "  the cell in a HashMap, a read counter ÷ not guarded (cost), 2 threads",
            two(op(deny, "the same, a read counter")),
            two(op(deny, "GCRA cell in a HashMap")),
            Target::Shown,
            false,
        ),
        (
            "  a read counter, 1 thread",
            at(op(deny, "the same, a read counter"), 1),
            at(op(deny, "GCRA cell in a HashMap"), 1),
            Target::Shown,
            false,
        ),
        (
            "  A/A: keyed GCRA deny ÷ the same, built again (cost): the pairs' own spread",
            two(op(deny, "GCRA")),
            two(op(deny, "GCRA")),
            Target::Shown,
            false,
        ),
        (
            "  keyed GCRA deny, wrapped ÷ in a held read section (cost): the read section's worth",
            two(op(deny, "GCRA, its control")),
            two(op(deny, "GCRA in a held read section")),
            Target::Shown,
            false,
        ),
        (
            "  the read section's worth, 1 thread",
            at(op(deny, "GCRA, its control"), 1),
            at(op(deny, "GCRA in a held read section"), 1),
            Target::Shown,
            false,
        ),
        (
            "  keyed GCRA deny, wrapped ÷ not (cost): the wrapper's own",
            two(op(deny, "GCRA, its control")),
            two(op(deny, "GCRA")),
            Target::Shown,
            false,
        ),
        (
            "  keyed GCRA deny in a held read section ÷ direct GCRA deny (cost)",
            two(op(deny, "GCRA in a held read section")),
            two(op(deny, "GCRA direct")),
            Target::Shown,
            false,
        ),
        (
            "  keyed GCRA deny in a held read section × governor keyed",
            two(op(deny, "GCRA in a held read section")),
            two(op(deny, "governor keyed")),
            Target::Shown,
            true,
        ),
        (
            "  A/A: governor keyed deny ÷ the same, built again (cost)",
            two(op(deny, "governor keyed")),
            two(op(deny, "governor keyed")),
            Target::Shown,
            false,
        ),
        (
            "GCRA admit, 65 536 keys, in a held read section × governor keyed",
            two(op(distinct, "lock-free in a held read section")),
            two(op(distinct, "governor keyed")),
            Target::Shown,
            true,
        ),
        (
            "  the same admit, wrapped ÷ in a held read section (cost): the read section's worth",
            two(op(distinct, "lock-free, its control")),
            two(op(distinct, "lock-free in a held read section")),
            Target::Shown,
            false,
        ),
        (
            "GCRA admit, 65 536 keys: one table each × shared",
            two(op(distinct, "lock-free, unshared")),
            two(op(distinct, "lock-free")),
            Target::Shown,
            true,
        ),
        (
            "  threads' keys in no common line × mixed, 2 threads",
            two(op(distinct, "lock-free, keys apart")),
            two(op(distinct, "lock-free, keys mixed")),
            Target::Shown,
            true,
        ),
        (
            "  the same, 1 thread (the control: no second core)",
            at(op(distinct, "lock-free, keys apart"), 1),
            at(op(distinct, "lock-free, keys mixed"), 1),
            Target::Shown,
            true,
        ),
        (
            "  a cell a cache line (128-byte slots) × 16-byte slots, 2 threads",
            two(op(distinct, "lock-free, a cell a line")),
            two(op(distinct, "lock-free")),
            Target::Shown,
            true,
        ),
        (
            "  a cell a line, 1 thread (its control)",
            at(op(distinct, "lock-free, a cell a line"), 1),
            at(op(distinct, "lock-free"), 1),
            Target::Shown,
            true,
        ),
    ]);
    cases.extend([
        (
            "lock-free × papaya store, 65 536 keys admitted in order, 2 threads",
            two(op(distinct, "lock-free")),
            two(op(distinct, "papaya, admitted in order")),
            Target::Shown,
            true,
        ),
        (
            "  the same, 1 thread",
            at(op(distinct, "lock-free"), 1),
            at(op(distinct, "papaya, admitted in order"), 1),
            Target::Shown,
            true,
        ),
    ]);
    // The lock-free table against the stores on the other maps (papaya's
    // are judged above), on the drained hot key and on 65 536 distinct keys.
    for (deny_name, deny_row, admit_name, peer) in [
        (
            "lock-free deny × scc::HashIndex store (throughput)",
            "GCRA on scc::HashIndex",
            "lock-free admit, 65 536 keys × scc::HashIndex store (throughput)",
            "scc::HashIndex",
        ),
        (
            "lock-free deny × flurry store (throughput)",
            "GCRA on flurry",
            "lock-free admit, 65 536 keys × flurry store (throughput)",
            "flurry",
        ),
    ] {
        cases.push((
            deny_name,
            two(op(deny, "GCRA")),
            two(op(deny, deny_row)),
            Target::Shown,
            true,
        ));
        cases.push((
            admit_name,
            two(op(distinct, "lock-free")),
            two(op(distinct, peer)),
            Target::Shown,
            true,
        ));
    }
    into_cases(cases)
}

/// The cases of `(name, subject, baseline, target, throughput)`.
fn into_cases<'a>(cases: Vec<(&'static str, Side<'a>, Side<'a>, Target, bool)>) -> Vec<Case<'a>> {
    cases
        .into_iter()
        .map(|(name, subject, baseline, target, throughput)| Case {
            name,
            subject,
            baseline,
            target,
            throughput,
            blocks: Vec::new(),
            failed: 0,
        })
        .collect()
}

/// The flag that makes this program run one block of judged pairs and
/// print its ratios ([`run_block`]) instead of the report.
pub const JUDGE_BLOCK_FLAG: &str = "--judge-block";

/// The rows the judged pairs read: the drained hot key's and the 65 536
/// distinct keys' (the headline's alone without diagnostics).
fn judged_makers(diagnostics: bool) -> (Makers, Makers) {
    let mut deny = deny_ops();
    let mut widest = distinct_ops(65_536);
    widest.extend(held_guard_ops(65_536));
    if !diagnostics {
        deny = headline_only(deny, &HEADLINE_DENY);
        widest = headline_only(widest, &HEADLINE_DISTINCT);
    }
    (deny, widest)
}

/// Runs block `block` of every judged case in this process: on stdout, the
/// line `handoff` and this process's [`line_handoff_ns`], then one line a
/// case: its index, then its pairs' ratios `subject ns / baseline ns`. The report's process runs each block in a fresh process
/// of this program ([`JUDGE_BLOCK_FLAG`]).
pub fn run_block(budget: &Budget, block: usize) {
    let (deny, widest) = judged_makers(budget.diagnostics);
    let first = block * budget.pairs;
    println!("handoff {}", line_handoff_ns());
    for (index, case) in cases(&deny, &widest, budget.diagnostics).iter().enumerate() {
        let ratios = paired_block(
            &case.subject,
            &case.baseline,
            first..first + budget.pairs,
            budget.slice,
        );
        let ratios: Vec<String> = ratios.iter().map(f64::to_string).collect();
        println!("{index} {}", ratios.join(" "));
    }
}

/// Runs block `block` of every case's pairs in a fresh process of this
/// program ([`run_block`]) and returns its line handoff and each case's
/// ratios, in the cases' order; or why the block failed (the process could not start, failed,
/// ran past `limit`, or printed something other than every case's pairs).
///
/// On Linux the process is started from `/proc/self/exe`: the very file
/// this process runs, even if a build has since replaced the lab's
/// executable at its path, so that every block measures the same code.
fn judge_block(
    cases: usize,
    budget: &Budget,
    block: usize,
    limit: Duration,
) -> Result<(f64, Vec<Vec<f64>>), String> {
    use std::io::Read;
    let program = if cfg!(target_os = "linux") {
        std::path::PathBuf::from("/proc/self/exe")
    } else {
        std::env::current_exe().map_err(|error| format!("the lab's own executable: {error}"))?
    };
    let mut command = std::process::Command::new(program);
    command.args([JUDGE_BLOCK_FLAG, &block.to_string()]);
    if budget.full {
        command.arg("--full");
    }
    if budget.diagnostics {
        command.arg("--diagnostics");
    }
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .map_err(|error| format!("could not start: {error}"))?;
    // Read on a thread of its own, so that a full pipe cannot stall the
    // child while this one waits for it to exit.
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                // Killed, then reaped: a kill that fails means it exited.
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("still running after {} s: killed", limit.as_secs()));
            }
            Err(error) => return Err(format!("could not wait for it: {error}")),
        }
    };
    let stdout = reader
        .join()
        .map_err(|_| "its output's reader panicked".to_owned())?
        .map_err(|error| format!("its output: {error}"))?;
    if !status.success() {
        return Err(format!("it failed: {status}"));
    }
    parse_block(&stdout, cases, budget.pairs)
}

/// The line handoff and each case's ratios from a block's output: the line
/// `handoff NS`, then one line a case, its index, then `pairs` ratios.
fn parse_block(stdout: &str, cases: usize, pairs: usize) -> Result<(f64, Vec<Vec<f64>>), String> {
    let mut lines = stdout.lines();
    let handoff = lines
        .next()
        .and_then(|line| line.strip_prefix("handoff "))
        .and_then(|ns| ns.parse::<f64>().ok())
        .ok_or_else(|| "its first line is not its line handoff".to_owned())?;
    let parsed = (0..cases)
        .map(|index| {
            let line = lines
                .next()
                .ok_or_else(|| format!("it printed no line for case {index}"))?;
            let mut fields = line.split(' ');
            if fields.next() != Some(index.to_string().as_str()) {
                return Err(format!("its line for case {index} is {line:?}"));
            }
            let ratios = fields
                .map(|field| {
                    field
                        .parse::<f64>()
                        .map_err(|_| format!("not a ratio: {field:?}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if ratios.len() == pairs {
                Ok(ratios)
            } else {
                Err(format!(
                    "case {index}: {} ratios, not {pairs}",
                    ratios.len()
                ))
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    match lines.next() {
        None => Ok((handoff, parsed)),
        Some(line) => Err(format!("an extra line {line:?}")),
    }
}

/// How long a block may run before it is judged stuck: ten times what its
/// pairs should take (each pair runs both sides for about a slice, after a
/// calibration of each side), and at least two minutes.
fn block_limit(cases: usize, budget: &Budget) -> Duration {
    let pairs = u32::try_from(cases * (budget.pairs + 2) * 2).unwrap_or(u32::MAX);
    (budget.slice * pairs * 10).max(Duration::from_secs(120))
}

/// Runs every workload and the judged pairs. The pairs run in blocks
/// spread over the whole run, one block after every few tables, so that
/// each judged ratio samples the machine at every stage of the run (a
/// VM's two vCPUs can change how they share their host's cores between
/// one minute and the next), not only at its end.
pub fn run(budget: &Budget) -> Results {
    let handoff_at_start = line_handoff_ns();
    let diagnostics = budget.diagnostics;
    let (deny_makers, widest) = judged_makers(diagnostics);
    let clock_makers = clock_ops();
    let (few, some) = (distinct_ops(16), distinct_ops(1_024));
    let (algorithm_makers, hot_makers) = (algorithm_ops(), hot_ops());
    // Each table's title, rows, and whether it is a diagnostic.
    let all: [(&str, &Makers, bool); 7] = [
        (
            "Deny on a drained hot key (default store, TSC clock)",
            &deny_makers,
            false,
        ),
        (
            "GCRA deny on a drained hot key, by clock",
            &clock_makers,
            true,
        ),
        ("GCRA admitting on 16 distinct keys, by store", &few, true),
        (
            "GCRA admitting on 1024 distinct keys, by store",
            &some,
            true,
        ),
        (
            "GCRA admitting on 65536 distinct keys, by store",
            &widest,
            false,
        ),
        (
            "Admitting on 65536 distinct keys, by algorithm (default store; 10 000/s in bursts \
             of 1 000, which the sliding counter packs)",
            &algorithm_makers,
            true,
        ),
        ("GCRA admitting on one hot key, by store", &hot_makers, true),
    ];
    let specs: Vec<(&str, &Makers)> = all
        .iter()
        .filter(|(_, _, diagnostic)| diagnostics || !diagnostic)
        .map(|&(title, makers, _)| (title, makers))
        .collect();
    let blocks = budget.blocks.max(1);
    let bar = ProgressBar::new((specs.len() * budget.rounds + blocks) as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed} {msg}").expect("template"),
    );
    let mut cases = cases(&deny_makers, &widest, diagnostics);
    let limit = block_limit(cases.len(), budget);
    let mut failures = Vec::new();
    let mut block_handoffs = Vec::new();
    // Block b runs after round ⌈(b + 1) × rounds / blocks⌉ of the run's
    // rounds (every table's), so that the blocks are spread evenly over the
    // run however few its tables.
    let rounds = specs.len() * budget.rounds;
    let (mut rounds_done, mut judged_blocks) = (0, 0);
    let mut after_round = || {
        rounds_done += 1;
        while judged_blocks < blocks && (judged_blocks + 1) * rounds <= rounds_done * blocks {
            bar.set_message(format!(
                "judging: block {} of {blocks}, in a fresh process",
                judged_blocks + 1
            ));
            match judge_block(cases.len(), budget, judged_blocks, limit) {
                Ok((handoff, ratios)) => {
                    block_handoffs.push(handoff);
                    for (case, ratios) in cases.iter_mut().zip(ratios) {
                        case.blocks.push(ratios);
                    }
                }
                Err(why) => {
                    for case in &mut cases {
                        case.failed += 1;
                    }
                    failures.push(format!("block {} of {blocks}: {why}", judged_blocks + 1));
                }
            }
            bar.inc(1);
            judged_blocks += 1;
        }
    };
    let tables: Vec<Table> = specs
        .iter()
        .map(|(title, makers)| table((*title).to_owned(), makers, budget, &bar, &mut after_round))
        .collect();
    bar.finish_and_clear();
    let judged = cases
        .into_iter()
        .map(|mut case| {
            let oriented = |cost: Estimate| {
                if case.throughput {
                    cost.reciprocal(1.0)
                } else {
                    cost
                }
            };
            let blocks = case
                .blocks
                .iter_mut()
                .map(|ratios| oriented(median_ci(ratios)))
                .collect();
            let mut all: Vec<f64> = case.blocks.concat();
            Judged {
                name: case.name,
                ratio: oriented(median_ci(&mut all)),
                blocks,
                failed: case.failed,
                target: case.target,
            }
        })
        .collect();
    let mut tables = tables.into_iter();
    let mut next = || tables.next().expect("a table for each spec");
    if diagnostics {
        let (deny, deny_with_clock) = (next(), Some(next()));
        let fewer_keys = vec![next(), next()];
        let distinct = next();
        let (by_algorithm, hot) = (Some(next()), Some(next()));
        Results {
            deny,
            deny_with_clock,
            fewer_keys,
            distinct,
            by_algorithm,
            hot,
            pieces: components(),
            judged,
            diagnostics,
            failures,
            handoff_ns: (handoff_at_start, line_handoff_ns()),
            block_handoffs,
        }
    } else {
        let (deny, distinct) = (next(), next());
        Results {
            deny,
            deny_with_clock: None,
            fewer_keys: Vec::new(),
            distinct,
            by_algorithm: None,
            hot: None,
            pieces: Vec::new(),
            judged,
            diagnostics,
            failures,
            handoff_ns: (handoff_at_start, line_handoff_ns()),
            block_handoffs,
        }
    }
}

/// Prints a table: each cell's median ns/op with its interval, per thread
/// count, and the 2-thread ratio of medians against `baseline`.
pub fn print_table(out: &mut String, table: &Table, baseline: Option<&str>) {
    say!(out, "## {}", table.title);
    say!(
        out,
        "{:<24} {:>20} {:>20} {:>20} {}",
        "",
        "ns 1t (95% CI)",
        "ns 2t (95% CI)",
        "ns 4t* (95% CI)",
        baseline.map_or(String::new(), |name| format!(
            "{:>10}",
            format!("× {name} @2")
        ))
    );
    let cell = |estimate: &Estimate| estimate.show(1);
    for row in &table.rows {
        let versus = baseline.map_or(String::new(), |name| {
            format!("{:>10.2}", table.row(name).ns[1].median / row.ns[1].median)
        });
        say!(
            out,
            "{:<24} {:>20} {:>20} {:>20} {}",
            row.name,
            cell(&row.ns[0]),
            cell(&row.ns[1]),
            cell(&row.ns[2]),
            versus
        );
    }
    let first = &table.rows[0].ns[0];
    say!(
        out,
        "(aggregate ns per operation over all threads, median of {} interleaved rounds, \
         interval of {:.1} %; × is a ratio of medians, the judged ratios come from pairs \
         (the summary); * 4 threads oversubscribe 2 cores)\n",
        first.samples,
        first.coverage * 100.0
    );
}

/// The flag that makes this program deny checks in a loop instead of
/// printing the report ([`deny_loop`]): `--deny-loop VARIANT N`.
pub const DENY_LOOP_FLAG: &str = "--deny-loop";

/// [`deny_loop`]'s variants.
pub const DENY_LOOP_VARIANTS: [&str; 3] = ["plain", "a carried quota", "counted for metrics"];

/// Denies `count` checks of one drained key on a keyed limiter with every
/// default but a `ManualClock` (so that no calibration runs): plain, with
/// each check carrying the limiter's own quota, or counting for the
/// metrics. For an instruction counter, which sees no host: one denial's
/// instructions are the difference between runs of `2N` and `N`, over `N`.
///
/// ```sh
/// cargo build --release -p tollgate-lab
/// for n in 10000 20000; do
///   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.2.$n \
///     target/release/tollgate-lab --deny-loop 2 $n
/// done
/// ```
pub fn deny_loop(variant: usize, count: u64) -> Result<(), String> {
    let quota = tollgate::Quota::per_hour(1).map_err(|error| error.to_string())?;
    let builder = tollgate::Builder::new(quota).clock(tollgate::clock::ManualClock::new());
    let limiter = match variant {
        0 | 1 => builder.build::<u64>(),
        2 => builder.metrics("deny-loop").build::<u64>(),
        _ => {
            return Err(format!(
                "no variant {variant}: 0 to 2 ({})",
                DENY_LOOP_VARIANTS.join(", ")
            ));
        }
    };
    let check = |key: &u64| {
        if variant == 1 {
            limiter.check_with(key, &quota)
        } else {
            limiter.check(key)
        }
    };
    assert!(check(&0).map_err(|error| error.to_string())?.is_allowed());
    for _ in 0..count {
        let denied = check(std::hint::black_box(&0)).map_err(|error| error.to_string())?;
        std::hint::black_box(denied.is_allowed());
    }
    Ok(())
}

/// The flag of [`quota_change`].
pub const CHANGE_FLAG: &str = "--change";

/// Times a quota change ([`tollgate::RateLimiter::set_quota`]) on a keyed
/// GCRA limiter holding 2^10, 2^16 and 2^20 keys, on each store: the time
/// until every key is carried, which is when the call returns. Five
/// changes a cell (10 → 20 a minute and back, carried as is), the median
/// and the range, in milliseconds and in nanoseconds a key.
pub fn quota_change() {
    fn row<S: tollgate::store::StoreKind<u64, Gcra>>(name: &str, store: S, keys: u64) {
        let quotas = [
            tollgate::Quota::per_minute(10).expect("a valid quota"),
            tollgate::Quota::per_minute(20).expect("a valid quota"),
        ];
        let limiter = tollgate::Builder::new(quotas[0])
            .store(store)
            .build::<u64>();
        for key in 0..keys {
            assert!(limiter.check(&key).expect("a unit").is_allowed());
        }
        let mut times: Vec<Duration> = (0..5)
            .map(|change| {
                let started = std::time::Instant::now();
                limiter
                    .set_quota(quotas[(change + 1) % 2], tollgate::algorithm::Carry::AsIs)
                    .expect("a change of rate");
                started.elapsed()
            })
            .collect();
        times.sort();
        let per_key = |time: Duration| time.as_nanos() as f64 / keys as f64;
        println!(
            "| {name} | {keys} | {:.2} ({:.2}–{:.2}) | {:.0} ({:.0}–{:.0}) |",
            times[2].as_secs_f64() * 1e3,
            times[0].as_secs_f64() * 1e3,
            times[4].as_secs_f64() * 1e3,
            per_key(times[2]),
            per_key(times[0]),
            per_key(times[4]),
        );
    }
    println!("A quota change on a keyed GCRA limiter: the time until every key is carried");
    println!("(five changes a row: median, and range)\n");
    println!("| store | keys | ms | ns a key |");
    println!("|---|---|---|---|");
    for keys in [1 << 10, 1 << 16, 1 << 20] {
        row("lock-free (default)", LockFree::default(), keys);
        row("sharded mutex", Sharded::default(), keys);
        row("per-key", PerKey::new(), keys);
        row("global mutex", GlobalMutex, keys);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(pairs: usize) -> Budget {
        Budget {
            slice: Duration::from_millis(25),
            rounds: 6,
            pairs,
            blocks: 2,
            full: false,
            diagnostics: false,
        }
    }

    #[test]
    fn a_block_prints_every_case_pairs() {
        let parsed = parse_block("handoff 41.5\n0 1.5 2\n1 0.25 4\n", 2, 2).unwrap();
        assert_eq!(parsed, (41.5, vec![vec![1.5, 2.0], vec![0.25, 4.0]]));
    }

    #[test]
    fn a_block_that_printed_anything_else_failed() {
        let cases = [
            ("0 1 2\n1 1 2\n", "its first line is not its line handoff"),
            ("handoff 40\n0 1 2\n", "it printed no line for case 1"),
            (
                "handoff 40\n0 1 2\n2 1 2\n",
                "its line for case 1 is \"2 1 2\"",
            ),
            ("handoff 40\n0 1 2\n1 1\n", "case 1: 1 ratios, not 2"),
            ("handoff 40\n0 1 2\n1 1 x\n", "not a ratio: \"x\""),
            (
                "handoff 40\n0 1 2\n1 1 2\nthread 'main' panicked\n",
                "an extra line \"thread 'main' panicked\"",
            ),
        ];
        for (stdout, why) in cases {
            assert_eq!(parse_block(stdout, 2, 2), Err(why.to_owned()), "{stdout:?}");
        }
    }

    #[test]
    fn a_failed_block_misses_the_target() {
        let block = Estimate {
            median: 5.0,
            low: 4.0,
            high: 6.0,
            coverage: 0.97,
            samples: 6,
        };
        let mut judged = Judged {
            name: "ratio",
            ratio: block,
            blocks: vec![block, block],
            failed: 0,
            target: Target::AtLeast(3.0),
        };
        assert!(matches!(judged.verdict(), Some(Verdict::Met)));
        judged.failed = 1;
        assert!(matches!(judged.verdict(), Some(Verdict::Straddles)));
        assert_eq!((judged.blocks_met(), judged.blocks_run()), (2, 3));
        judged.blocks.clear();
        assert!(matches!(judged.verdict(), Some(Verdict::Missed)));
        assert!(judged.between_blocks().0.is_nan());
    }

    #[test]
    fn a_block_runs_at_least_two_minutes_before_it_is_stuck() {
        assert_eq!(block_limit(4, &budget(6)), Duration::from_secs(120));
        // 10 cases × (10 + 2) × 2 slices of 100 ms, ten times over.
        let full = Budget {
            slice: Duration::from_millis(100),
            ..budget(10)
        };
        assert_eq!(block_limit(10, &full), Duration::from_secs(240));
    }
}
