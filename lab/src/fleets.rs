//! The fleets section: every design simulated on fleets of 10 to 10 000
//! instances (`tollgate-sim`, note 16), each instance's memory measured by
//! the counting allocator.

use tollgate_sim::report::table;
use tollgate_sim::scenario::Scenario;

use crate::counting_alloc;

/// Simulated seconds a run.
const RUN_NS: u64 = 3_000_000_000;

fn live_bytes() -> u64 {
    counting_alloc::live().0
}

/// Appends the section: fleets of 10, 100 and 1 000 instances on the steady
/// scenario; `full` adds 10 000, and the struck scenario at every size.
pub fn run(out: &mut String, full: bool) {
    say!(
        out,
        "# Fleets, simulated (tollgate-sim: the real local half and the script's twin, against the peers' published designs; note 16)\n"
    );
    say!(
        out,
        "A hot key of 20 000 a second (burst 20 000) at ten times its limit, 50 000 background checks a second over a million keys (Zipf, s = 1; 10 a second each), three masters, in-zone round trips (median 250 µs), 3 s simulated, the first second a warm-up. Seed 1: every figure is exact for it.\n"
    );
    let sizes: &[usize] = if full {
        &[10, 100, 1_000, 10_000]
    } else {
        &[10, 100, 1_000]
    };
    let mut progress = |run: &str| eprintln!("fleets: {run}");
    say!(out, "## Steady\n");
    let steady = table(
        sizes,
        |instances| Scenario::steady(instances, RUN_NS, 1),
        Some(live_bytes),
        &mut progress,
    );
    say!(out, "{steady}");
    if full {
        say!(
            out,
            "## Struck: a traffic shift, a tenth crashing and restarting, a tenth more joining, the hot key's master failing over (50 ms of writes lost, its clock 20 ms ahead), 5 % cut off for 200 ms\n"
        );
        let struck = table(
            sizes,
            |instances| Scenario::struck(instances, RUN_NS, 1),
            Some(live_bytes),
            &mut progress,
        );
        say!(out, "{struck}");
    }
}
