//! The performance section: every workload of `benches/support/workloads.rs`
//! at 1, 2 and 4 threads (4 oversubscribes this 2-core machine), as
//! aggregate throughput, with ratios and the targets judged in the same run.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tollgate::algorithm::{FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket};
use tollgate::clock::{Clock, CoarseClock, MonotonicClock, TscClock};
use tollgate::store::{GlobalMutex, LockFree, PerKey, Sharded};

use crate::{parallel, workloads};

pub const THREADS: [usize; 3] = [1, 2, 4];

/// One workload's aggregate ns per operation at 1, 2 and 4 threads.
pub struct Row {
    pub name: &'static str,
    pub ns: [f64; 3],
}

impl Row {
    pub fn mops(&self, column: usize) -> f64 {
        1_000.0 / self.ns[column]
    }

    /// Throughput at 2 threads over throughput at 1.
    pub fn scaling(&self) -> f64 {
        self.ns[0] / self.ns[1]
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

/// Every table of the section.
pub struct Results {
    pub deny: Table,
    pub deny_with_clock: Table,
    pub distinct: Vec<(u64, Table)>,
    pub by_algorithm: Table,
    pub hot: Table,
    pub clock_read: Vec<(&'static str, f64)>,
}

/// How long to measure each cell.
pub struct Budget {
    pub per_cell: Duration,
}

/// Aggregate ns per operation of `op` on `threads` threads: calibrated to
/// about `budget.per_cell`, the median of five runs.
fn measure(op: &workloads::Op, threads: usize, budget: &Budget) -> f64 {
    let run_target = budget.per_cell / 5;
    let mut ops = 1_000_u64;
    let mut elapsed = parallel::run(threads, ops, op);
    while elapsed < run_target / 4 && ops < 1 << 32 {
        ops *= 4;
        elapsed = parallel::run(threads, ops, op);
    }
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let ops = ((ops as f64) * run_target.as_secs_f64() / elapsed.as_secs_f64()).max(1.0) as u64;
    let mut samples: Vec<f64> = (0..5)
        .map(|_| {
            #[allow(clippy::cast_precision_loss)]
            let total = (ops * threads as u64) as f64;
            parallel::run(threads, ops, op).as_nanos() as f64 / total
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[2]
}

fn table(
    title: String,
    ops: Vec<(&'static str, workloads::Op)>,
    budget: &Budget,
    bar: &ProgressBar,
) -> Table {
    let rows = ops
        .into_iter()
        .map(|(name, op)| {
            let mut ns = [0.0; 3];
            for (column, threads) in THREADS.into_iter().enumerate() {
                bar.set_message(format!("{title}: {name}, {threads} thread(s)"));
                ns[column] = measure(&op, threads, budget);
                bar.inc(1);
            }
            Row { name, ns }
        })
        .collect();
    Table { title, rows }
}

fn clock_cost(clock: &dyn Clock) -> f64 {
    const READS: u32 = 2_000_000;
    let started = std::time::Instant::now();
    let mut sum = 0_u64;
    for _ in 0..READS {
        sum = sum.wrapping_add(std::hint::black_box(clock).now_ns());
    }
    std::hint::black_box(sum);
    started.elapsed().as_nanos() as f64 / f64::from(READS)
}

/// Runs every workload. Cells: 9 + 3 + 3 × 7 + 5 + 5 workloads × 3 thread
/// counts.
pub fn run(budget: &Budget) -> Results {
    let cells = (9 + 3 + 3 * 7 + 5 + 5) * THREADS.len() as u64;
    let bar = ProgressBar::new(cells).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed} {msg}").expect("template"),
    );
    let deny = table(
        "Deny on a drained hot key (default store, TSC clock)".into(),
        vec![
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
            ("GCRA", workloads::deny_hot_key::<Gcra, _>(TscClock::new())),
            (
                "GCRA, foldhash",
                workloads::deny_hot_key_on::<Gcra, _, _>(
                    workloads::lock_free_foldhash(),
                    TscClock::new(),
                ),
            ),
            ("governor keyed", workloads::governor_deny_hot_key()),
            ("GCRA direct", workloads::direct_deny()),
            ("governor direct", workloads::governor_direct_deny()),
        ],
        budget,
        &bar,
    );
    let deny_with_clock = table(
        "GCRA deny on a drained hot key, by clock".into(),
        vec![
            (
                "monotonic",
                workloads::deny_hot_key::<Gcra, _>(MonotonicClock::new()),
            ),
            ("tsc", workloads::deny_hot_key::<Gcra, _>(TscClock::new())),
            (
                "coarse",
                workloads::deny_hot_key::<Gcra, _>(CoarseClock::new()),
            ),
        ],
        budget,
        &bar,
    );
    let distinct = [16_u64, 1_024, 65_536]
        .into_iter()
        .map(|keys| {
            let table = table(
                format!("GCRA admitting on {keys} distinct keys, by store"),
                vec![
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
                    (
                        "lock-free",
                        workloads::admit_distinct::<Gcra, _>(LockFree::default(), keys),
                    ),
                    (
                        "lock-free, foldhash",
                        workloads::admit_distinct::<Gcra, _>(workloads::lock_free_foldhash(), keys),
                    ),
                    (
                        "lock-free, unshared",
                        workloads::admit_distinct_unshared(keys),
                    ),
                    ("governor keyed", workloads::governor_admit_distinct(keys)),
                ],
                budget,
                &bar,
            );
            (keys, table)
        })
        .collect();
    let by_algorithm = table(
        "Admitting on 65536 distinct keys, by algorithm (default store)".into(),
        vec![
            (
                "fixed window",
                workloads::admit_distinct::<FixedWindow, _>(LockFree::default(), 65_536),
            ),
            (
                "token bucket",
                workloads::admit_distinct::<TokenBucket, _>(LockFree::default(), 65_536),
            ),
            (
                "sliding log",
                workloads::admit_distinct::<SlidingWindowLog, _>(LockFree::default(), 65_536),
            ),
            (
                "sliding counter",
                workloads::admit_distinct::<SlidingWindowCounter, _>(LockFree::default(), 65_536),
            ),
            (
                "GCRA",
                workloads::admit_distinct::<Gcra, _>(LockFree::default(), 65_536),
            ),
        ],
        budget,
        &bar,
    );
    let hot = table(
        "GCRA admitting on one hot key, by store".into(),
        vec![
            ("global mutex", workloads::admit_hot_key(GlobalMutex)),
            ("sharded", workloads::admit_hot_key(Sharded::default())),
            ("per-key", workloads::admit_hot_key(PerKey::new())),
            ("lock-free", workloads::admit_hot_key(LockFree::default())),
            ("governor keyed", workloads::governor_admit_hot_key()),
        ],
        budget,
        &bar,
    );
    bar.finish_and_clear();
    let clock_read = vec![
        (
            "monotonic (std Instant)",
            clock_cost(&MonotonicClock::new()),
        ),
        ("tsc (quanta)", clock_cost(&TscClock::new())),
        ("coarse (cached)", clock_cost(&CoarseClock::new())),
    ];
    Results {
        deny,
        deny_with_clock,
        distinct,
        by_algorithm,
        hot,
        clock_read,
    }
}

/// Prints a table: ns/op and Mops/s per thread count, 1→2 scaling, and
/// each row's throughput at 2 threads over `baseline`'s.
pub fn print_table(table: &Table, baseline: Option<&str>) {
    println!("## {}", table.title);
    println!(
        "{:<18} {:>8} {:>8} {:>8} | {:>7} {:>7} {:>7} | {:>5} {}",
        "",
        "ns 1t",
        "ns 2t",
        "ns 4t*",
        "Mop/s 1",
        "Mop/s 2",
        "Mop/s 4",
        "1→2",
        baseline.map_or(String::new(), |name| format!(
            "{:>10}",
            format!("× {name} @2")
        ))
    );
    for row in &table.rows {
        let versus = baseline.map_or(String::new(), |name| {
            format!("{:>10.2}", table.row(name).ns[1] / row.ns[1])
        });
        println!(
            "{:<18} {:>8.1} {:>8.1} {:>8.1} | {:>7.1} {:>7.1} {:>7.1} | {:>4.2}× {}",
            row.name,
            row.ns[0],
            row.ns[1],
            row.ns[2],
            row.mops(0),
            row.mops(1),
            row.mops(2),
            row.scaling(),
            versus
        );
    }
    println!("(aggregate ns per operation over all threads; * 4 threads oversubscribe 2 cores)\n");
}
