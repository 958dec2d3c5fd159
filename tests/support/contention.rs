//! The contention harness shared by the exact-count tests.

use std::sync::Barrier;
use std::sync::atomic::{AtomicU32, Ordering};

/// Starts `threads` threads together (a barrier), each calling `check`
/// `checks_per_thread` times; returns how many calls returned true.
pub fn admitted_under_contention(
    threads: usize,
    checks_per_thread: usize,
    check: impl Fn() -> bool + Sync,
) -> u32 {
    let admitted = AtomicU32::new(0);
    let start = Barrier::new(threads);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                start.wait();
                for _ in 0..checks_per_thread {
                    if check() {
                        // Relaxed: the count is read after the scope joins
                        // every thread, which synchronises.
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    admitted.into_inner()
}
