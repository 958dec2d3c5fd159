//! `tollgate-sim [--struck] [instances …]`: each design on fleets of the
//! given sizes (10, 100 and 1 000 by default), steady or struck by faults
//! (`Scenario::struck`), one line of figures a run.

#[path = "../../tests/support/counting_alloc.rs"]
#[allow(dead_code)]
mod counting_alloc;

use std::sync::Arc;
use std::time::Instant;

use tollgate::remote::Leases;
use tollgate_sim::designs::envoy::Envoy;
use tollgate_sim::designs::tollgate::Tollgate;
use tollgate_sim::scenario::Scenario;
use tollgate_sim::world::run;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

fn live_bytes() -> u64 {
    counting_alloc::live().0
}

fn main() {
    let struck = std::env::args().any(|arg| arg == "--struck");
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
        for name in ["deny-cached", "leased", "leased, holds", "envoy"] {
            let scenario = Arc::new(if struck {
                Scenario::struck(instances, 3_000_000_000, 1)
            } else {
                Scenario::steady(instances, 3_000_000_000, 1)
            });
            let started = Instant::now();
            let leases = match name {
                "deny-cached" => None,
                "leased" => Some(Leases::new()),
                _ => Some(Leases::new().with_holds(true)),
            };
            let shared = Arc::clone(&scenario);
            let mut tally = if name == "envoy" {
                run(shared, &mut Envoy::new(&scenario), Some(live_bytes))
            } else {
                run(
                    shared,
                    &mut Tollgate::new(&scenario, leases),
                    Some(live_bytes),
                )
            };
            let figures = tally.figures(scenario.duration_ns, instances);
            println!(
                "{instances:>6} {name:<14} calls/check {:.4} hot {:.4} over {} ({} in faults) admitted {} ideal {} under {:.2}% wait p50 {:.0} p99 {:.0} µs all p99 {:.0} ops/s {:.0} bytes/instance {:?} background {:.3} ({:.1} s)",
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
                figures.background_ratio(),
                started.elapsed().as_secs_f64()
            );
        }
    }
}
