//! The shuttle schedulers every shuttle model runs under, shared by
//! `shuttle.rs` and `leases.rs`.

use std::time::Instant;

/// The PCT scheduler's depth: how many priority changes an execution has.
pub const PCT_DEPTH: usize = 3;

/// Runs `test` under shuttle's random scheduler, then under PCT, for
/// `executions` executions each, and prints the time each took.
pub fn random_then_pct(
    name: &str,
    executions: usize,
    test: impl Fn() + Send + Sync + Clone + 'static,
) {
    let started = Instant::now();
    shuttle::check_random(test.clone(), executions);
    println!(
        "shuttle {name}: random, {executions} executions, {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    shuttle::check_pct(test, executions, PCT_DEPTH);
    println!(
        "shuttle {name}: pct depth {PCT_DEPTH}, {executions} executions, {:?}",
        started.elapsed()
    );
}
