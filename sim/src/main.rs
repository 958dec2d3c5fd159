//! `tollgate-sim`: the fleet simulations' tables.

#[path = "../../tests/support/counting_alloc.rs"]
#[allow(dead_code)]
mod counting_alloc;

use std::sync::Arc;
use std::time::Instant;

use tollgate::remote::Leases;
use tollgate_sim::designs::tollgate::Tollgate;
use tollgate_sim::scenario::Scenario;
use tollgate_sim::tally::Contract;
use tollgate_sim::world::run;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

fn live_bytes() -> u64 {
    counting_alloc::live().0
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|arg| arg.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![10, 100, 1_000]
    } else {
        sizes
    };
    for &instances in &sizes {
        for (name, leases) in [("deny-cached", None), ("leased", Some(Leases::new()))] {
            let scenario = Arc::new(Scenario::steady(instances, 3_000_000_000, 1));
            let started = Instant::now();
            let mut design = Tollgate::new(&scenario, leases);
            let mut tally = run(Arc::clone(&scenario), &mut design, Some(live_bytes));
            let figures = tally.figures(Contract::Gcra, scenario.duration_ns, instances);
            println!(
                "{instances:>6} {name:<12} calls/check {:.4} hot {:.4} over {} ({} in faults) admitted {} ideal {} under {:.2}% wait p50 {:.0} p99 {:.0} µs all p99 {:.0} ops/s {:.0} bytes/instance {:?} ({:.1} s)",
                figures.calls_per_check,
                figures.hot_calls_per_check,
                figures.over,
                figures.over_in_faults,
                figures.admitted,
                figures.ideal,
                100.0 * figures.under(),
                figures.hot_wait_p50_us,
                figures.hot_wait_p99_us,
                figures.wait_p99_us,
                figures.operations_per_s,
                figures.bytes_per_instance,
                started.elapsed().as_secs_f64()
            );
        }
    }
}
