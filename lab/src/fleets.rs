//! The fleets section: every design simulated on fleets of 10 to 10 000
//! instances (`tollgate-sim`, note 16), each instance's memory measured by
//! the counting allocator.

use std::path::Path;

use tollgate_sim::report::{Row, table};
use tollgate_sim::scenario::Scenario;

use crate::{counting_alloc, report};

/// Simulated time of a steady run, and of a struck one.
const RUN_NS: u64 = 3_000_000_000;
const STRUCK_NS: u64 = 5_000_000_000;

fn live_bytes() -> u64 {
    counting_alloc::live().0
}

/// Appends the section: fleets of 10, 100 and 1 000 instances on the steady
/// scenario, with the verdicts of tollgate's targets at 1 000 and the
/// plots (into `dir`); `full` adds 10 000, and the struck scenario at every
/// size.
pub fn run(out: &mut String, full: bool, dir: &Path) {
    say!(
        out,
        "# Fleets, simulated (tollgate-sim: the real local half and the script's twin, against the peers' published designs; note 16)\n"
    );
    say!(
        out,
        "A hot key of 20 000 a second (burst 20 000) at ten times its limit, 50 000 background checks a second over a million keys (Zipf, s = 1; 10 a second each), three masters, in-zone round trips (median 250 µs), 3 s simulated. The first second is a warm-up: calls, checks, waits and operations count after it, and so do admissions against one limiter's (what the key holds free at either end of the span, up to a burst, counts in them); the windows judge every admission. Seed 1: every figure is exact for it.\n"
    );
    let sizes: &[usize] = if full {
        &[10, 100, 1_000, 10_000]
    } else {
        &[10, 100, 1_000]
    };
    let mut progress = |run: &str| eprintln!("fleets: {run}");
    say!(out, "## Steady\n");
    let (steady, rows) = table(
        sizes,
        |instances| Scenario::steady(instances, RUN_NS, 1),
        Some(live_bytes),
        &mut progress,
    );
    say!(out, "{steady}");
    verdicts(out, &rows, &Scenario::steady(1_000, RUN_NS, 1));
    match report::fleet_plots(&rows, dir) {
        Ok(files) => {
            for file in files {
                say!(out, "Plot written to {}", file.display());
            }
            say!(out);
        }
        Err(error) => eprintln!(
            "could not write the fleets' plots to {}: {error}",
            dir.display()
        ),
    }
    if full {
        say!(
            out,
            "## Struck (5 s): a traffic shift, a tenth crashing and restarting, a tenth more joining, the hot key's master failing over at 3 s (50 ms of writes lost, its clock 20 ms ahead), 5 % cut off for 200 ms at 3.5 s\n"
        );
        let (struck, _) = table(
            sizes,
            |instances| Scenario::struck(instances, STRUCK_NS, 1),
            Some(live_bytes),
            &mut progress,
        );
        say!(out, "{struck}");
    }
}

/// The targets of tollgate on the hot key at 1 000 instances, judged on
/// `rows`: zero over-admission in every window, at most 0.001 calls a
/// check, at most 1 % under-admission, a p99 wait of at most 1 ms; and
/// the fewest calls a check of a fleet of `scenario`'s whose every
/// instance admits within each tolerance (note 16).
fn verdicts(out: &mut String, rows: &[Row], scenario: &Scenario) {
    let instances = report::thousands(scenario.instances as u64);
    let verdict = |met: bool| if met { "met" } else { "**missed**" };
    for (_, design, figures) in rows
        .iter()
        .filter(|row| row.0 == 1_000 && row.1.starts_with("tollgate"))
    {
        say!(
            out,
            "- {design}, 1 000 instances: over the contract {} ({}); {:.4} calls a check, target at most 0.001 ({}); under-admission {:.2} %, target at most 1 % ({}); p99 wait {:.0} µs, target at most 1 000 ({})",
            figures.over,
            verdict(figures.over == 0),
            figures.hot_calls_per_check,
            verdict(figures.hot_calls_per_check <= 0.001),
            100.0 * figures.under(),
            verdict(figures.under() <= 0.01),
            figures.hot_wait_p99_us,
            verdict(figures.hot_wait_p99_us <= 1_000.0),
        );
    }
    say!(
        out,
        "- the fewest calls a check when each of the {instances} instances admits within every tolerance (it calls at least once in it): {instances} / ({} × {}) = {:.4}",
        scenario.hot_load,
        report::thousands(u64::from(scenario.hot.burst)),
        scenario.instances as f64 / (scenario.hot_load * f64::from(scenario.hot.burst)),
    );
    say!(out);
}
