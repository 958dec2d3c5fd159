#!/usr/bin/env bash
# The churn that broke the memory bound, on the lock-free store as it was
# before issue 8 (commit ac0a993), for comparison with the lab's
# "Memory while keys churn" table: the same workload (tests/support/waves.rs)
# and the same counting allocator (tests/support/counting_alloc.rs), one
# shard, one thread. Prints the heap's peak while it ran against the
# settled heap of the same store holding the most keys the run held, as the
# lab prints it for the current store.
#
#   lab/before-issue-8.sh             (builds the old tree: about 2 minutes)
#   WAVES=400 lab/before-issue-8.sh   (a longer run)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
old=$(mktemp -d)
git -C "$root" worktree add --detach "$old" ac0a993 >/dev/null 2>&1
trap 'git -C "$root" worktree remove --force "$old"' EXIT
cat > "$old/tests/churn_before.rs" <<RUST
#[path = "$root/tests/support/counting_alloc.rs"]
mod counting_alloc;
#[path = "$root/tests/support/waves.rs"]
mod waves;

use tollgate::clock::ManualClock;
use tollgate::store::LockFree;
use tollgate::{Builder, Quota};

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

/// WAVES from the environment, 40 by default (the lab's count).
fn waves_to_run() -> u64 {
    std::env::var("WAVES").map_or(40, |waves| waves.parse().expect("WAVES: a number"))
}

#[test]
fn churn_before_issue_8() {
    let clock = ManualClock::new();
    let before = counting_alloc::live().0;
    counting_alloc::reset_peak();
    let limiter = Builder::new(Quota::per_second(1).unwrap())
        .store(LockFree::new(1))
        .clock(clock.clone())
        .build::<u64>();
    let mut most_keys = 0;
    waves::waves(
        1,
        waves_to_run(),
        &clock,
        |key| assert!(limiter.check(&key).is_ok()),
        || most_keys = most_keys.max(limiter.len()),
    );
    let peak = counting_alloc::peak() - before;
    drop(limiter);
    // The live table, as tests/support/churn.rs measures it for the new
    // store: a fresh limiter holding the most keys the run held, settled
    // (here by flushing crossbeam's collector by hand).
    let before = counting_alloc::live().0;
    let settled = Builder::new(Quota::per_second(1).unwrap())
        .store(LockFree::new(1))
        .clock(ManualClock::new())
        .build::<u64>();
    for key in 0..most_keys as u64 {
        assert!(settled.check(&key).unwrap().is_allowed());
    }
    for _ in 0..1_024 {
        crossbeam_epoch::pin().flush();
    }
    let table = counting_alloc::live().0 - before;
    println!(
        "before issue 8, one shard, one thread, {} waves: peak {peak} B against {table} B settled for {most_keys} keys: {:.2}x",
        waves_to_run(),
        peak as f64 / table as f64,
    );
}
RUST
cd "$old"
cargo test --release --quiet --test churn_before -- --nocapture 2>&1 | grep "before issue 8"
