//! Runs an operation on N threads released together and returns the wall
//! time: multi-thread figures are aggregate throughput (total operations over
//! wall time), shared by the criterion benches and the lab.

use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Runs `op(thread, i)` for `i` in `0..ops_per_thread` on each of `threads`
/// threads, all released by one barrier; returns the wall time from the
/// release to the last thread's end.
pub fn run<F: Fn(usize, u64) + Sync>(threads: usize, ops_per_thread: u64, op: &F) -> Duration {
    let start = Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let start = &start;
            scope.spawn(move || {
                start.wait();
                for i in 0..ops_per_thread {
                    op(thread, i);
                }
            });
        }
        start.wait();
        let began = Instant::now();
        // Leaving the scope joins every thread.
        began
    })
    .elapsed()
}
