//! More checking threads than cores, no deliberate stall: how many new keys
//! the lock-free store refuses with `CheckError::Reclaiming` because a
//! reader the scheduler descheduled inside a check's read section held the
//! shard's replaced tables past a rebuild's wait. Eight threads check 64 hot keys, four
//! insert new keys (the clock moving 10 s every 20 000 of them, so growth
//! sweeps evict the idle ones and the tables rebuild all the time), for
//! `SECONDS` seconds (default 8).
//!
//! ```sh
//! cargo run --release -p tollgate-lab --example oversubscribed -- 8
//! ```
//!
//! notes/06 ("Two replaced tables, not one") has the counts.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::store::LockFree;
use tollgate::{Builder, CheckError, Quota};

fn main() {
    let seconds: u64 = match std::env::args().nth(1).map(|arg| arg.parse()) {
        None => 8,
        Some(Ok(seconds)) => seconds,
        Some(Err(_)) => {
            eprintln!("usage: oversubscribed [SECONDS]");
            std::process::exit(2);
        }
    };
    let clock = ManualClock::new();
    let limiter = Builder::new(Quota::per_second(1_000).expect("a valid quota"))
        .store(LockFree::default())
        .clock(clock.clone())
        .build::<u64>();
    let (stop, refused, admitted, checks) = (
        AtomicBool::new(false),
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
    );
    let check = |key: u64| match limiter.check(&key) {
        Ok(_) => true,
        Err(CheckError::Reclaiming) => {
            // Relaxed: counters read after the scope joins the threads.
            refused.fetch_add(1, Ordering::Relaxed);
            false
        }
        Err(error) => panic!("{error}"),
    };
    std::thread::scope(|scope| {
        for reader in 0..8_u64 {
            let (check, stop, checks) = (&check, &stop, &checks);
            scope.spawn(move || {
                let mut count = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    check((count + reader) % 64);
                    count += 1;
                }
                checks.fetch_add(count, Ordering::Relaxed);
            });
        }
        for writer in 0..4_u64 {
            let (check, stop, admitted, clock) = (&check, &stop, &admitted, &clock);
            scope.spawn(move || {
                let mut key = 1_000 + (writer << 40);
                while !stop.load(Ordering::Relaxed) {
                    if check(key) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    key += 1;
                    if key % 20_000 == 0 {
                        clock.advance(Duration::from_secs(10));
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_secs(seconds));
        stop.store(true, Ordering::Relaxed);
    });
    println!(
        "{seconds} s, 12 threads on {} cores: {} new keys admitted, {} checks of hot keys, {} refused with Reclaiming",
        std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get),
        admitted.load(Ordering::Relaxed),
        checks.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
}
