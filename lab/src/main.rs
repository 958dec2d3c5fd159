//! tollgate's lab: runs the experiments behind the README's tables, prints
//! them, judges the targets and draws the plots.
//!
//! `cargo run --release -p tollgate-lab` (quick: under 3 minutes on 2 cores)
//! or `cargo run --release -p tollgate-lab -- --full` (longer cells, the whole
//! memory sweep); `--out DIR` chooses where the SVG plots go (default
//! `lab-output`); `--distributed` runs only the Redis sections, which every
//! run ends with when it can start a `redis-server`, `--leases` only their
//! last (deciding locally: the deny cache and leases), `--http` only the
//! section on the HTTP layer (against tower_governor), and `--perf` only the
//! in-process performance section (its targets without the memory ones),
//! `--growth` only the table of memory at every key count while a store
//! grows, and `--peers` only the memory table of the stores on other maps
//! (issue 13; their speed rows are in the performance tables).

#[path = "../../tests/support/churn.rs"]
mod churn;
#[path = "../../tests/support/counting_alloc.rs"]
mod counting_alloc;
mod distributed;
#[path = "../../redis/tests/support/instances.rs"]
mod instances;
mod leases;
mod memory;
#[path = "../benches/support/parallel.rs"]
mod parallel;
mod perf;
// The Redis test harness: the lab starts its own server the same way.
#[path = "../../redis/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_server;
mod report;
#[path = "../../tests/support/scenarios.rs"]
mod scenarios;
mod serving;
mod stats;
#[path = "../../tests/support/waves.rs"]
mod waves;
#[path = "../benches/support/workloads.rs"]
mod workloads;

use tollgate::algorithm::{FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket};

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

/// Runs `$body` with `$A` bound to each algorithm in turn, with its name.
#[macro_export]
macro_rules! for_each_algorithm {
    (|$name:ident, $A:ident| $body:expr) => {{
        {
            type $A = FixedWindow;
            let $name = "fixed window";
            $body
        }
        {
            type $A = TokenBucket;
            let $name = "token bucket";
            $body
        }
        {
            type $A = SlidingWindowLog;
            let $name = "sliding window log";
            $body
        }
        {
            type $A = SlidingWindowCounter;
            let $name = "sliding window counter";
            $body
        }
        {
            type $A = Gcra;
            let $name = "GCRA";
            $body
        }
    }};
}

fn main() {
    let mut full = false;
    let mut only_distributed = false;
    let mut only_http = false;
    let mut only_leases = false;
    let mut only_perf = false;
    let mut only_peers = false;
    let mut only_growth = false;
    let mut out = std::path::PathBuf::from("lab-output");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--full" => full = true,
            "--distributed" => only_distributed = true,
            "--http" => only_http = true,
            "--leases" => only_leases = true,
            "--perf" => only_perf = true,
            "--growth" => only_growth = true,
            "--peers" => only_peers = true,
            "--out" => match args.next() {
                Some(dir) => out = dir.into(),
                None => usage("--out needs a directory"),
            },
            "--help" | "-h" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let started = std::time::Instant::now();
    println!(
        "tollgate lab ({} mode)\n",
        if full { "full" } else { "quick" }
    );
    let distributed = distributed::Budget {
        per_cell: std::time::Duration::from_millis(if full { 300 } else { 100 }),
        rounds: if full { 20 } else { 10 },
        leases: leases::Budget {
            run: std::time::Duration::from_millis(if full { 4_000 } else { 1_500 }),
            pairs: if full { 4_000 } else { 1_000 },
        },
    };
    let perf = perf::Budget {
        slice: std::time::Duration::from_millis(if full { 100 } else { 25 }),
        rounds: if full { 12 } else { 6 },
        pairs: if full { 30 } else { 10 },
        blocks: if full { 5 } else { 2 },
    };
    let serving = serving::Budget {
        per_cell: std::time::Duration::from_millis(if full { 200 } else { 60 }),
        rounds: if full { 20 } else { 10 },
    };
    if only_growth {
        memory::growth_table();
        println!("Total time: {:.0?}", started.elapsed());
        return;
    }
    let peer_rounds = if full { 5 } else { 3 };
    if only_peers {
        let peers = memory::peer_table(peer_rounds);
        match report::peer_plot(&peers, &out) {
            Ok(Some(file)) => println!("Plot written to {}", file.display()),
            Ok(None) => {}
            Err(error) => eprintln!("could not write the plot to {}: {error}", out.display()),
        }
        println!("Total time: {:.0?}", started.elapsed());
        return;
    }
    if only_perf {
        performance(&perf, &[], &[], &[], &out);
        println!("Total time: {:.0?}", started.elapsed());
        return;
    }
    if only_distributed || only_http || only_leases {
        if only_http {
            serving::run(&serving);
        }
        if only_distributed {
            distributed::run(&distributed);
        } else if only_leases {
            distributed::run_leases(&distributed.leases);
        }
        println!("Total time: {:.0?}", started.elapsed());
        return;
    }
    println!("# Correctness (ManualClock: exact, machine-independent)\n");
    boundary_table();
    retry_after_table();
    sustained_table();
    println!("# Memory (counting allocator)\n");
    memory::algorithm_table();
    let counts: &[u64] = if full {
        &[100_000, 200_000, 500_000, 1_000_000, 2_000_000]
    } else {
        &[100_000, 1_000_000]
    };
    let sweep = memory::store_sweep(counts);
    memory::matrix(if full { counts } else { &[100_000] });
    memory::candidate_maps();
    memory::peak_table(full);
    let peers = memory::peer_table(peer_rounds);
    let growth = memory::growth_table();
    performance(&perf, &sweep, &growth, &peers, &out);
    serving::run(&serving);
    distributed::run(&distributed);
    println!("\nTotal time: {:.0?}", started.elapsed());
}

/// The performance section, its targets (with the memory of `sweep` and
/// `growth`) and the plots (with the peer stores' of `peers`).
fn performance(
    budget: &perf::Budget,
    sweep: &[memory::SweepRow],
    growth: &[memory::Growth],
    peers: &[memory::PeerRow],
    out: &std::path::Path,
) {
    println!("# Performance (wall clock: compare within one run)\n");
    println!(
        "{} rounds of {:?} a cell, {} pairs a judged ratio, {}\n",
        budget.rounds,
        budget.slice,
        budget.pairs,
        parallel::pinning()
    );
    let results = perf::run(budget);
    report::print(&results);
    report::targets(&results, sweep, growth);
    match report::plots(&results, sweep, peers, out) {
        Ok(files) => {
            println!("Plots written to {}:", out.display());
            for file in files {
                println!("  {}", file.display());
            }
        }
        Err(error) => eprintln!("could not write the plots to {}: {error}", out.display()),
    }
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("tollgate-lab: {problem}");
    }
    eprintln!(
        "usage: tollgate-lab [--full] [--distributed] [--http] [--leases] [--perf] [--growth] [--peers] [--out DIR]"
    );
    std::process::exit(if problem.is_empty() { 0 } else { 2 });
}

fn boundary_table() {
    println!("## Boundary burst: 100 per minute, drain at 59.999 s and at 60.000 s");
    println!(
        "{:<24} {:>18} {:>18}",
        "algorithm", "with anchor at 0", "without anchor"
    );
    for_each_algorithm!(|name, A| println!(
        "{:<24} {:>18} {:>18}",
        name,
        scenarios::boundary_burst::<A>(true),
        scenarios::boundary_burst::<A>(false)
    ));
    println!("(admitted inside the 1 ms span; the limit is 100)\n");
}

fn retry_after_table() {
    println!("## Retry-After at 3 per second, after draining at t = 0");
    println!(
        "{:<24} {:>16} {:>14} {:>14}",
        "algorithm", "retry_after ns", "1 ns early", "on time"
    );
    let verdict = |admitted: bool| if admitted { "admitted" } else { "denied" };
    for_each_algorithm!(|name, A| {
        let (retry_after, early, on_time) = scenarios::retry_after_at_3_per_second::<A>();
        println!(
            "{:<24} {:>16} {:>14} {:>14}",
            name,
            retry_after.as_nanos(),
            verdict(early),
            verdict(on_time)
        );
    });
    println!(
        "(the exact wait is 333 333 333.3 ns; truncating it to 333 333 333 would be denied)\n"
    );
}

fn sustained_table() {
    println!("## Hammered every 1 ms for 60 s: 10 per second, burst 5");
    println!(
        "{:<24} {:>10} {:>22}",
        "algorithm", "admitted", "burst + rate × 60 s"
    );
    for_each_algorithm!(|name, A| println!(
        "{:<24} {:>10} {:>22}",
        name,
        scenarios::hammered::<A>(60),
        5 + 10 * 60
    ));
    println!("(window algorithms count per 500 ms window; see notes/03-algorithms.md)\n");
}
