//! `tollgate-sim [--struck] [--seconds S] [--cross-region SHARE]
//! [instances …]`: every design on fleets of the given sizes (10, 100 and
//! 1 000 by default), steady or struck by faults (`Scenario::struck`), for
//! `S` simulated seconds (3 steady, 5 struck, by default; the first is a
//! warm-up), with a share of the instances in another region (none by
//! default; round trips of a median of 60 ms), as a Markdown table.

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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let struck = args.iter().any(|arg| arg == "--struck");
    let mut seconds = None;
    let mut cross_region = 0.0;
    let mut sizes = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--cross-region" {
            match rest.next().and_then(|value| value.parse::<f64>().ok()) {
                Some(share) if (0.0..=1.0).contains(&share) => cross_region = share,
                _ => {
                    eprintln!("--cross-region wants a share from 0 to 1");
                    std::process::exit(2);
                }
            }
        } else if arg == "--seconds" {
            seconds = rest
                .next()
                .and_then(|value| value.parse::<u64>().ok())
                .filter(|&seconds| (if struck { 4 } else { 2 }..=1_000_000).contains(&seconds));
            if seconds.is_none() {
                eprintln!("--seconds wants a whole number from 2 (4 struck) to 1 000 000");
                std::process::exit(2);
            }
        } else if let Ok(size) = arg.parse() {
            sizes.push(size);
        } else if arg != "--struck" {
            eprintln!(
                "unknown argument {arg:?}: tollgate-sim [--struck] [--seconds S] [--cross-region SHARE] [instances …]"
            );
            std::process::exit(2);
        }
    }
    if sizes.is_empty() {
        sizes = vec![10, 100, 1_000];
    }
    let duration_ns = seconds.unwrap_or(if struck { 5 } else { 3 }) * 1_000_000_000;
    let scenario = |instances| {
        let mut scenario = if struck {
            Scenario::struck(instances, duration_ns, 1)
        } else {
            Scenario::steady(instances, duration_ns, 1)
        };
        scenario.net.cross_region_share = cross_region;
        scenario
    };
    let (table, _) = table(&sizes, scenario, Some(live_bytes), &mut |run| {
        eprintln!("{run}");
    });
    print!("{table}");
}
