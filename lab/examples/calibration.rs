//! How long the default clock takes to start: the first `TscClock` a
//! process builds calibrates the TSC against the OS clock (quanta's loop),
//! later ones reuse that calibration. Run it several times: each run is a
//! fresh process.
//!
//! ```sh
//! cargo run --release -p tollgate-lab --example calibration
//! ```

use std::time::Instant;

use tollgate::clock::{Clock, TscClock};

fn main() {
    let started = Instant::now();
    let first = TscClock::new();
    let calibrating = started.elapsed();
    let started = Instant::now();
    let second = TscClock::new();
    let copying = started.elapsed();
    std::hint::black_box((first.now_ns(), second.now_ns()));
    println!(
        "the first TscClock in this process: {:.1} µs; a second one: {:.3} µs",
        calibrating.as_secs_f64() * 1e6,
        copying.as_secs_f64() * 1e6
    );
}
