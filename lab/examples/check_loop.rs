//! Runs one of the lab's denial workloads a given number of times on one
//! thread, for an instruction counter: the difference between two counts
//! (`N` and `2N` checks) is what `N` checks execute, whatever the setup.
//!
//! ```sh
//! cargo build --release -p tollgate-lab --example check_loop
//! for n in 1000000 2000000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/keyed.$n \
//!     target/release/examples/check_loop keyed $n
//! done
//! ```
//!
//! notes/08 ("Item 2, continued") has the counts; `callgrind_annotate`
//! on one output file shows where they go.

// The workloads are the lab's and the benches' own; this runs four of them.
#[allow(dead_code)]
#[path = "../benches/support/workloads.rs"]
mod workloads;

use tollgate::algorithm::Gcra;
use tollgate::clock::TscClock;
use tollgate::store::LockFree;

const USAGE: &str = "usage: check_loop keyed|foldhash|hashmap|direct|governor N";

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(workload), Some(count), None) = (args.next(), args.next(), args.next()) else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let Ok(count) = count.parse::<u64>() else {
        eprintln!("{USAGE}: N must be a whole number");
        std::process::exit(2);
    };
    let op = match workload.as_str() {
        "keyed" => workloads::deny_hot_key_on::<Gcra, _, _>(LockFree::default(), TscClock::new()),
        "foldhash" => workloads::deny_hot_key_on::<Gcra, _, _>(
            workloads::lock_free_foldhash(),
            TscClock::new(),
        ),
        "hashmap" => workloads::deny_hot_key_in_hashmap(),
        "direct" => workloads::direct_deny(),
        "governor" => workloads::governor_deny_hot_key(),
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    for i in 0..count {
        op(0, i);
    }
}
