//! tollgate's lab: runs the experiments behind the README's tables and
//! prints them. `cargo run --release -p tollgate-lab`.

mod alloc;
#[path = "../../tests/support/scenarios.rs"]
mod scenarios;

use std::time::Duration;

use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::clock::ManualClock;
use tollgate::{Builder, Quota};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

/// Runs `$body` with `$A` bound to each algorithm in turn, with its name.
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
    memory_table();
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

/// Retained heap bytes and allocations per key after `keys` distinct u64 keys
/// each made `per_key` unit requests on the global-mutex store.
fn bytes_per_key<A: Algorithm>(quota: Quota, keys: u64, per_key: u32) -> (f64, f64) {
    let clock = ManualClock::new();
    let (bytes_before, allocations_before) = alloc::live();
    let limiter = Builder::new(quota)
        .algorithm::<A>()
        .clock(clock)
        .build::<u64>();
    for key in 0..keys {
        for _ in 0..per_key {
            assert!(limiter.check(&key).expect("unit cost").is_allowed());
        }
    }
    let (bytes_after, allocations_after) = alloc::live();
    assert_eq!(limiter.len() as u64, keys);
    #[allow(clippy::cast_precision_loss)]
    let per = |after: u64, before: u64| (after - before) as f64 / keys as f64;
    (
        per(bytes_after, bytes_before),
        per(allocations_after, allocations_before),
    )
}

fn memory_table() {
    const KEYS: u64 = 100_000;
    let quota = Quota::per_minute(100).expect("valid");
    println!("## Memory per key: {KEYS} u64 keys, one request each, global-mutex store");
    println!(
        "{:<24} {:>12} {:>16} {:>12}",
        "algorithm", "state bytes", "retained B/key", "allocs/key"
    );
    for_each_algorithm!(|name, A| {
        let (bytes, allocations) = bytes_per_key::<A>(quota, KEYS, 1);
        println!(
            "{:<24} {:>12} {:>16.1} {:>12.2}",
            name,
            std::mem::size_of::<<A as Algorithm>::State>(),
            bytes,
            allocations
        );
    });
    println!(
        "(state bytes: the per-key state inline; retained: everything the map holds, keys included)\n"
    );

    const LOG_KEYS: u64 = 10_000;
    println!("## Sliding window log at its limit: {LOG_KEYS} keys, each drained to the limit");
    println!(
        "{:<10} {:>16} {:>12}",
        "limit", "retained B/key", "allocs/key"
    );
    for limit in [10, 100, 1_000] {
        let quota = Quota::new(limit, Duration::from_secs(60)).expect("valid");
        let (bytes, allocations) = bytes_per_key::<SlidingWindowLog>(quota, LOG_KEYS, limit);
        println!("{limit:<10} {bytes:>16.1} {allocations:>12.2}");
    }
    println!("(8 bytes per timestamp, at most `limit` per key)");
}
