//! Runs an operation on N threads released together and returns the wall
//! time: multi-thread figures are aggregate throughput (total operations over
//! wall time), shared by the criterion benches and the lab.
//!
//! Each thread is pinned to one CPU of those the process may run on
//! (thread `t` to the `t mod n`-th), where the OS allows it (Linux), so
//! that the scheduler does not move a measurement between cores mid-run or
//! stack two threads on one core while the other idles.

use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

/// Runs `op(thread, i)` for `i` in `0..ops_per_thread` on each of `threads`
/// threads, all released by one barrier; returns the wall time from the
/// first thread's start to the last thread's end, as the threads read it
/// themselves (the spawning thread may be off a core, the threads pinned to
/// every one, when they start and end).
pub fn run<F: Fn(usize, u64) + Sync>(threads: usize, ops_per_thread: u64, op: &F) -> Duration {
    let start = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let start = &start;
                scope.spawn(move || {
                    pin(thread);
                    start.wait();
                    let began = Instant::now();
                    for i in 0..ops_per_thread {
                        op(thread, i);
                    }
                    (began, Instant::now())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a measured operation panicked"))
            .collect()
    });
    let first = spans.iter().map(|span| span.0).min().expect("one thread");
    let last = spans.iter().map(|span| span.1).max().expect("one thread");
    last - first
}

/// The CPUs this process may run on, read once.
fn cpus() -> &'static [usize] {
    static CPUS: OnceLock<Vec<usize>> = OnceLock::new();
    CPUS.get_or_init(allowed_cpus)
}

/// How many CPUs the measuring threads are pinned across (0: not pinned).
#[allow(dead_code)] // The criterion benches do not ask.
pub fn cpu_count() -> usize {
    cpus().len()
}

/// Whether measuring threads are pinned, and to how many CPUs.
#[allow(dead_code)] // The criterion benches pin without printing it.
pub fn pinning() -> String {
    match cpus().len() {
        0 => "threads not pinned (no CPU affinity on this OS)".to_owned(),
        count => format!("thread t pinned to CPU t mod {count}"),
    }
}

#[cfg(target_os = "linux")]
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `cpu_set_t` is plain data, valid when zeroed, and
    // `sched_getaffinity` writes at most `size_of::<cpu_set_t>()` bytes
    // into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect()
    }
}

#[cfg(not(target_os = "linux"))]
fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

/// Pins the calling thread to the `thread mod n`-th allowed CPU; a no-op
/// where the OS gives no affinity or refuses it.
fn pin(thread: usize) {
    let cpus = cpus();
    if cpus.is_empty() {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: as in `allowed_cpus`; `CPU_SET` writes inside the set, and
    // pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpus[thread % cpus.len()], &mut set);
        // A refusal leaves the thread unpinned, as on other systems.
        let _ = libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set);
    }
}
