//! `tollgate-sim [--struck] [instances …]`: every design on fleets of the
//! given sizes (10, 100 and 1 000 by default), steady or struck by faults
//! (`Scenario::struck`), as a Markdown table.

#[path = "../../tests/support/counting_alloc.rs"]
#[allow(dead_code)]
mod counting_alloc;

use tollgate_sim::report::table;
use tollgate_sim::scenario::Scenario;

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
    let scenario = |instances| {
        if struck {
            Scenario::struck(instances, 5_000_000_000, 1)
        } else {
            Scenario::steady(instances, 3_000_000_000, 1)
        }
    };
    let (table, _) = table(&sizes, scenario, Some(live_bytes), &mut |run| {
        eprintln!("{run}");
    });
    print!("{table}");
}
