//! The simulations' tables: every design on the same scenarios.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use tollgate::remote::Leases;

use crate::designs::databricks::Databricks;
use crate::designs::doorman::Doorman;
use crate::designs::envoy::Envoy;
use crate::designs::gubernator::Gubernator;
use crate::designs::tollgate::Tollgate;
use crate::scenario::Scenario;
use crate::tally::Figures;
use crate::world::run;

/// The designs, in the tables' order.
pub const DESIGNS: [&str; 7] = [
    "tollgate deny-cached",
    "tollgate leased",
    "tollgate leased, holds",
    "envoyproxy/ratelimit",
    "gubernator GLOBAL",
    "local counting, 100 ms reports",
    "Doorman",
];

/// Runs `design` (one of [`DESIGNS`]) on `scenario`; `live_bytes` measures
/// the instances' memory.
///
/// # Panics
///
/// For a name not in [`DESIGNS`].
#[must_use]
pub fn figures(design: &str, scenario: &Scenario, live_bytes: Option<fn() -> u64>) -> Figures {
    let shared = Arc::new(scenario.clone());
    let mut tally = match design {
        "tollgate deny-cached" => run(shared, &mut Tollgate::new(scenario, None), live_bytes),
        "tollgate leased" => run(
            shared,
            &mut Tollgate::new(scenario, Some(Leases::new())),
            live_bytes,
        ),
        "tollgate leased, holds" => run(
            shared,
            &mut Tollgate::new(scenario, Some(Leases::new().with_holds(true))),
            live_bytes,
        ),
        "envoyproxy/ratelimit" => run(shared, &mut Envoy::new(scenario), live_bytes),
        "gubernator GLOBAL" => run(shared, &mut Gubernator::new(scenario), live_bytes),
        "local counting, 100 ms reports" => run(shared, &mut Databricks::new(scenario), live_bytes),
        "Doorman" => run(shared, &mut Doorman::new(scenario), live_bytes),
        other => panic!("no design {other}"),
    };
    tally.figures(scenario.duration_ns, scenario.instances)
}

/// A run's place in a table: its fleet's size, its design, its figures.
pub type Row = (usize, &'static str, Figures);

/// A table of every design on `scenario` made for each of `sizes`
/// (instances), in Markdown, and its rows; `progress` is told each run's
/// name.
#[must_use]
pub fn table(
    sizes: &[usize],
    scenario: impl Fn(usize) -> Scenario,
    live_bytes: Option<fn() -> u64>,
    progress: &mut dyn FnMut(&str),
) -> (String, Vec<Row>) {
    let mut rows = Vec::new();
    let mut out = String::from(
        "| instances | design | calls a check (hot key) | hot key over the contract: away from faults; near them | hot key admitted / one limiter with no delay | under | hot key's wait p50 / p99 | background admitted / reference | busiest server, operations a second | an instance's memory | simulated in |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for &instances in sizes {
        let scenario = scenario(instances);
        for design in DESIGNS {
            progress(&format!("{instances} instances, {design}"));
            let started = Instant::now();
            let f = figures(design, &scenario, live_bytes);
            rows.push((instances, design, f));
            let _ = writeln!(
                out,
                "| {instances} | {design} | {:.4} ({:.4}) | {}; {} | {} / {} | {:.2} % | {:.0} / {:.0} µs | {:.3} | {:.0} | {} | {:.1} s |",
                f.calls_per_check,
                f.hot_calls_per_check,
                f.over,
                f.over_in_faults,
                f.admitted,
                f.ideal,
                100.0 * f.under(),
                f.hot_wait_p50_us,
                f.hot_wait_p99_us,
                f.background_ratio(),
                f.operations_per_s,
                f.bytes_per_instance
                    .map_or_else(|| "—".to_owned(), |bytes| format!("{bytes} B")),
                started.elapsed().as_secs_f64()
            );
        }
    }
    (out, rows)
}
