//! tollgate's lab: runs the experiments behind the README's tables and
//! prints them. `cargo run --release -p tollgate-lab`.

mod alloc;
mod memory;
#[path = "../../tests/support/scenarios.rs"]
mod scenarios;

use tollgate::algorithm::{FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

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
    println!("tollgate lab — correctness experiments (ManualClock: exact, machine-independent)\n");
    boundary_table();
    retry_after_table();
    sustained_table();
    memory::algorithm_table();
    memory::store_sweep();
    memory::candidate_maps();
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
