//! tollgate's lab: runs the experiments behind the README's tables, judges
//! the targets, prints the report and draws the plots.
//!
//! ```sh
//! cargo run --release -p tollgate-lab                 # quick
//! cargo run --release -p tollgate-lab -- --full       # longer cells, the whole memory sweep
//! ```
//!
//! The report opens with a summary: each judged target, its measured ratio
//! or size with the 95 % interval, and MET or MISSED (met only if the whole
//! interval clears the target). The sections follow: correctness, memory,
//! performance, the HTTP layer, and Redis and the service when a
//! `redis-server` starts.
//!
//! Flags:
//!
//! - `--full`: longer cells, more rounds and pairs, the whole memory sweep
//!   (100 000 to 2 000 000 keys).
//! - `--diagnostics`: also the tables and rows that explain the headline
//!   figures: every store × algorithm, the candidate maps, the stores on
//!   other maps, the performance rows of hashers, guards and layouts, the
//!   tables by clock, by key count, by algorithm and on one hot key, the
//!   pieces of a keyed check, the ratios shown but not judged, and their
//!   plots.
//! - `--out DIR`: where the SVG plots go (default `lab-output`).
//! - `--perf`: only the in-process performance section (its targets
//!   without the memory ones).
//! - `--growth`: only the table of memory at every key count while a store
//!   grows (and its two targets).
//! - `--peers`: only the memory table of the stores on other maps, and its
//!   plot.
//! - `--http`: only the section on the HTTP layer (against tower_governor).
//! - `--distributed`: only the Redis sections.
//! - `--leases`: only the last Redis section (deciding locally: the deny
//!   cache and leases).
//! - `--service`: only the section on `tollgate-server` (in memory and on
//!   Redis, against limitador behind the same front).
//! - `--fleets`: only the section of simulated fleets (`tollgate-sim`).
//! - `--help`: these flags.
//!
//! The report ends with each section's wall time. On the 2-core AMD EPYC VM
//! (as `/proc/cpuinfo` names it), with other builds sharing its two cores
//! (load average 4 to 5), a quick run took 90 s, its performance section
//! 15 s; with `--diagnostics`, 157 s and 63 s. Both without the two Redis
//! sections that need `tollgate-instance`, which the lab builds itself
//! when it runs under cargo and otherwise skips, saying so, when missing.

/// Appends a line to a `String` report, as `println!` prints one.
macro_rules! say {
    ($out:expr) => {
        $out.push('\n')
    };
    ($out:expr, $($arg:tt)+) => {{
        use std::fmt::Write as _;
        writeln!($out, $($arg)+).expect("a String takes any text");
    }};
}

#[path = "../../tests/support/churn.rs"]
mod churn;
#[path = "../../tests/support/counting_alloc.rs"]
mod counting_alloc;
mod distributed;
mod fleets;
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
mod service;
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

const USAGE: &str = "\
usage: tollgate-lab [--full] [--diagnostics] [--out DIR]
                    [--perf | --growth | --peers | --http | --distributed | --leases
                     | --service | --fleets]

  (no flag)      the quick report: the summary of the judged targets, then
                 correctness, memory, performance, HTTP, Redis and the service
  --full         longer cells, more rounds and pairs, the whole memory sweep
  --diagnostics  also the tables, rows, ratios and plots that explain the
                 headline figures
  --out DIR      where the SVG plots go (default lab-output)
  --perf         only the in-process performance section
  --growth       only the table of memory while a store grows
  --peers        only the memory table of the stores on other maps
  --http         only the section on the HTTP layer
  --distributed  only the Redis sections
  --leases       only the last Redis section (deciding locally)
  --service      only the section on tollgate-server and limitador
  --fleets       only the section of simulated fleets

       tollgate-lab --request-loop VARIANT N
                 N admitted requests through one HTTP variant's router (0 no
                 layer, 1 and 3 tollgate, 2 and 4 tower_governor), for an
                 instruction counter (notes/11)
       tollgate-lab --deny-loop VARIANT N
                 N denials of one drained key (0 plain, 1 a carried quota,
                 2 counted for metrics), for an instruction counter
                 (notes/14)
       tollgate-lab --change
                 the time a quota change takes to carry every key, by store
                 and keys held (notes/14)";

/// Each section's wall time, printed at the end.
#[derive(Default)]
struct Times(Vec<(&'static str, std::time::Duration)>);

impl Times {
    /// Runs `section`, noting its wall time under `name`.
    fn time<T>(&mut self, name: &'static str, section: impl FnOnce() -> T) -> T {
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            eprintln!("tollgate-lab: {name}…");
        }
        let started = std::time::Instant::now();
        let value = section();
        self.0.push((name, started.elapsed()));
        value
    }

    /// "name 1.0 s, name 2.0 s" for the sections timed so far.
    fn so_far(&self) -> String {
        let sections: Vec<String> = self
            .0
            .iter()
            .map(|(name, time)| format!("{name} {:.1} s", time.as_secs_f64()))
            .collect();
        sections.join(", ")
    }

    fn print(&self, started: std::time::Instant) {
        println!(
            "Wall time: {}; total {:.1} s",
            self.so_far(),
            started.elapsed().as_secs_f64()
        );
    }
}

fn main() {
    let mut full = false;
    let mut diagnostics = false;
    let mut only_distributed = false;
    let mut only_http = false;
    let mut only_leases = false;
    let mut only_service = false;
    let mut only_perf = false;
    let mut only_peers = false;
    let mut only_growth = false;
    let mut only_fleets = false;
    let mut out = std::path::PathBuf::from("lab-output");
    let mut judge_block = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            perf::JUDGE_BLOCK_FLAG => match args.next().and_then(|block| block.parse().ok()) {
                Some(block) => judge_block = Some(block),
                None => usage("--judge-block needs a block number"),
            },
            serving::REQUEST_LOOP_FLAG => {
                let mut number = || args.next().and_then(|number| number.parse().ok());
                match (number(), number()) {
                    (Some(variant), Some(count)) => {
                        counting_alloc::stop();
                        let variant = usize::try_from(variant).unwrap_or(usize::MAX);
                        if let Err(problem) = serving::request_loop(variant, count) {
                            usage(&problem);
                        }
                        return;
                    }
                    _ => usage("--request-loop needs a variant and a request count"),
                }
            }
            perf::DENY_LOOP_FLAG => {
                let mut number = || args.next().and_then(|number| number.parse().ok());
                match (number(), number()) {
                    (Some(variant), Some(count)) => {
                        counting_alloc::stop();
                        let variant = usize::try_from(variant).unwrap_or(usize::MAX);
                        if let Err(problem) = perf::deny_loop(variant, count) {
                            usage(&problem);
                        }
                        return;
                    }
                    _ => usage("--deny-loop needs a variant and a check count"),
                }
            }
            perf::CHANGE_FLAG => {
                counting_alloc::stop();
                perf::quota_change();
                return;
            }
            "--full" => full = true,
            "--diagnostics" => diagnostics = true,
            "--distributed" => only_distributed = true,
            "--http" => only_http = true,
            "--leases" => only_leases = true,
            "--service" => only_service = true,
            "--fleets" => only_fleets = true,
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
    let perf = perf::Budget {
        slice: std::time::Duration::from_millis(if full { 100 } else { 25 }),
        rounds: if full { 12 } else { 6 },
        pairs: if full { 10 } else { 6 },
        blocks: if full { 6 } else { 2 },
        full,
        diagnostics,
    };
    if let Some(block) = judge_block {
        // A block of the judged pairs, for the report's process.
        counting_alloc::stop();
        perf::run_block(&perf, block);
        return;
    }
    let started = std::time::Instant::now();
    let mut times = Times::default();
    println!(
        "tollgate lab ({} mode, {})\n",
        if full { "full" } else { "quick" },
        if diagnostics {
            "with diagnostics"
        } else {
            "headline only: --diagnostics adds the tables that explain it"
        }
    );
    let distributed = distributed::Budget {
        per_cell: std::time::Duration::from_millis(if full { 300 } else { 100 }),
        rounds: if full { 20 } else { 10 },
        leases: leases::Budget {
            run: std::time::Duration::from_millis(if full { 4_000 } else { 1_500 }),
            pairs: if full { 4_000 } else { 1_000 },
        },
    };
    let serving = serving::Budget {
        per_cell: std::time::Duration::from_millis(if full { 200 } else { 60 }),
        rounds: if full { 20 } else { 10 },
    };
    let peer_rounds = if full { 5 } else { 3 };
    if only_fleets {
        let mut section = String::new();
        times.time("fleets", || fleets::run(&mut section, full, &out));
        print!("{section}");
        times.print(started);
        return;
    }
    if only_growth {
        let mut section = String::new();
        let growth = times.time("memory", || memory::growth_table(&mut section));
        let mut summary = String::new();
        report::summary(&mut summary, None, &[], &growth);
        print!("{summary}{section}");
        times.print(started);
        return;
    }
    if only_peers {
        let mut section = String::new();
        let peers = times.time("memory", || memory::peer_table(&mut section, peer_rounds));
        print!("{section}");
        match report::peer_plot(&peers, &out) {
            Ok(Some(file)) => println!("Plot written to {}\n", file.display()),
            Ok(None) => {}
            Err(error) => eprintln!("could not write the plot to {}: {error}", out.display()),
        }
        times.print(started);
        return;
    }
    if only_perf {
        counting_alloc::stop();
        let mut section = String::new();
        let results = times.time("performance", || {
            performance(&mut section, &perf, &[], &[], &out)
        });
        let mut summary = String::new();
        report::summary(&mut summary, Some(&results), &[], &[]);
        print!("{summary}{section}");
        times.print(started);
        return;
    }
    let service = service::Budget {
        cell: std::time::Duration::from_millis(if full { 2_000 } else { 700 }),
        rounds: if full { 10 } else { 6 },
        build_limitador: full || only_service,
    };
    if only_distributed || only_http || only_leases || only_service {
        counting_alloc::stop();
        if only_service {
            times.time("service", || service::run(&service));
        }
        if only_http {
            times.time("HTTP", || serving::run(&serving));
        }
        if only_distributed {
            times.time("Redis", || distributed::run(&distributed));
        } else if only_leases {
            times.time("Redis", || distributed::run_leases(&distributed.leases));
        }
        times.print(started);
        return;
    }
    // The in-process sections are written into `sections` and printed after
    // the summary of their targets.
    let mut sections = String::new();
    let (sweep, growth, peers) = times.time("correctness and memory", || {
        correctness(&mut sections);
        memory(&mut sections, full, diagnostics, peer_rounds)
    });
    // Before the counts stop: the fleets' memory is measured by them.
    let mut fleets_section = String::new();
    times.time("fleets", || fleets::run(&mut fleets_section, full, &out));
    // Nothing reads the counts after the memory section: the timed sections
    // do not pay for counting.
    counting_alloc::stop();
    let results = times.time("performance", || {
        performance(&mut sections, &perf, &sweep, &peers, &out)
    });
    let mut summary = String::new();
    report::summary(&mut summary, Some(&results), &sweep, &growth);
    say!(
        summary,
        "Wall time of the sections below: {}. HTTP and Redis follow them.\n",
        times.so_far()
    );
    print!("{summary}{sections}");
    times.time("HTTP", || serving::run(&serving));
    times.time("Redis", || distributed::run(&distributed));
    times.time("service", || service::run(&service));
    print!("{fleets_section}");
    times.print(started);
}

/// The correctness section: exact, on a `ManualClock`.
fn correctness(out: &mut String) {
    say!(
        out,
        "# Correctness (ManualClock: exact, machine-independent)\n"
    );
    boundary_table(out);
    retry_after_table(out);
    sustained_table(out);
}

/// The memory section: the tables its targets read (the store sweep, the
/// growth table) and the peaks while keys churn, with diagnostics every
/// store × algorithm, the candidate maps and the stores on other maps.
/// Returns the sweep's rows, the growth table's and the peer table's.
fn memory(
    out: &mut String,
    full: bool,
    diagnostics: bool,
    peer_rounds: usize,
) -> (
    Vec<memory::SweepRow>,
    Vec<memory::Growth>,
    Vec<memory::PeerRow>,
) {
    say!(out, "# Memory (counting allocator)\n");
    memory::algorithm_table(out);
    let counts: &[u64] = if full {
        &[100_000, 200_000, 500_000, 1_000_000, 2_000_000]
    } else {
        &[100_000, 1_000_000]
    };
    let sweep = memory::store_sweep(out, counts);
    let mut peers = Vec::new();
    if diagnostics {
        memory::matrix(out, if full { counts } else { &[100_000] });
        memory::candidate_maps(out);
    }
    memory::peak_table(out, full);
    if diagnostics {
        peers = memory::peer_table(out, peer_rounds);
    }
    let growth = memory::growth_table(out);
    (sweep, growth, peers)
}

/// The performance section and the plots (with the memory of `sweep` and
/// the peer stores' of `peers`); returns its results, whose judged ratios
/// the summary reads.
fn performance(
    out: &mut String,
    budget: &perf::Budget,
    sweep: &[memory::SweepRow],
    peers: &[memory::PeerRow],
    dir: &std::path::Path,
) -> perf::Results {
    say!(out, "# Performance (wall clock: compare within one run)\n");
    say!(
        out,
        "{} rounds of {:?} a cell, {} pairs a judged ratio, {}\n",
        budget.rounds,
        budget.slice,
        budget.pairs,
        parallel::pinning()
    );
    let results = perf::run(budget);
    say!(
        out,
        "A cache line passed between the two measuring CPUs in {:.1} ns at the section's start, \
         {:.1} ns at its end, {} in the judged blocks' processes\n(perf::line_handoff_ns: what \
         a 2-thread check pays for each line both threads write; it depends on where the host \
         puts the two CPUs).\n",
        results.handoff_ns.0,
        results.handoff_ns.1,
        results
            .block_handoffs
            .iter()
            .map(|ns| format!("{ns:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    report::print(out, &results);
    match report::plots(Some(&results), sweep, peers, dir) {
        Ok(files) => {
            say!(out, "Plots written to {}:", dir.display());
            for file in files {
                say!(out, "  {}", file.display());
            }
            say!(out);
        }
        Err(error) => eprintln!("could not write the plots to {}: {error}", dir.display()),
    }
    results
}

fn usage(problem: &str) -> ! {
    if problem.is_empty() {
        println!("{USAGE}");
        std::process::exit(0);
    }
    eprintln!("tollgate-lab: {problem}\n{USAGE}");
    std::process::exit(2);
}

fn boundary_table(out: &mut String) {
    say!(
        out,
        "## Boundary burst: 100 per minute, drain at 59.999 s and at 60.000 s"
    );
    say!(
        out,
        "{:<24} {:>18} {:>18}",
        "algorithm",
        "with anchor at 0",
        "without anchor"
    );
    for_each_algorithm!(|name, A| say!(
        out,
        "{:<24} {:>18} {:>18}",
        name,
        scenarios::boundary_burst::<A>(true),
        scenarios::boundary_burst::<A>(false)
    ));
    say!(out, "(admitted inside the 1 ms span; the limit is 100)\n");
}

fn retry_after_table(out: &mut String) {
    say!(
        out,
        "## Retry-After at 3 per second, after draining at t = 0"
    );
    say!(
        out,
        "{:<24} {:>16} {:>14} {:>14}",
        "algorithm",
        "retry_after ns",
        "1 ns early",
        "on time"
    );
    let verdict = |admitted: bool| if admitted { "admitted" } else { "denied" };
    for_each_algorithm!(|name, A| {
        let (retry_after, early, on_time) = scenarios::retry_after_at_3_per_second::<A>();
        say!(
            out,
            "{:<24} {:>16} {:>14} {:>14}",
            name,
            retry_after.as_nanos(),
            verdict(early),
            verdict(on_time)
        );
    });
    say!(
        out,
        "(the exact wait is 333 333 333.3 ns; truncating it to 333 333 333 would be denied)\n"
    );
}

fn sustained_table(out: &mut String) {
    say!(
        out,
        "## Hammered every 1 ms for 60 s: 10 per second, burst 5"
    );
    say!(
        out,
        "{:<24} {:>10} {:>22}",
        "algorithm",
        "admitted",
        "burst + rate × 60 s"
    );
    for_each_algorithm!(|name, A| say!(
        out,
        "{:<24} {:>10} {:>22}",
        name,
        scenarios::hammered::<A>(60),
        5 + 10 * 60
    ));
    say!(
        out,
        "(window algorithms count per 500 ms window; see notes/03-algorithms.md)\n"
    );
}
