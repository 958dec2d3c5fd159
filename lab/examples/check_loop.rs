//! Runs one of the lab's denial workloads `N` times on one thread, for an
//! instruction counter: callgrind's inclusive count of the workload's
//! closure, divided by `N`, is what one check executes, with the setup
//! (and the clock's calibration) left out.
//!
//! ```sh
//! cargo build --release -p tollgate-lab --example check_loop
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.keyed \
//!   target/release/examples/check_loop keyed 2000000
//! callgrind_annotate --inclusive=yes /tmp/cg.keyed | grep 'closure}} \['
//! ```
//!
//! notes/11 ("Measurements") has today's counts of the keyed check; notes/08
//! ("How we got here") those from before the read-copy-update.

// The workloads are the lab's and the benches' own; this runs six of them.
#[allow(dead_code)]
#[path = "../benches/support/workloads.rs"]
mod workloads;

use tollgate::algorithm::Gcra;
use tollgate::clock::TscClock;
use tollgate::store::LockFree;

const USAGE: &str = "usage: check_loop keyed|foldhash|hashmap|direct|papaya|governor N";

fn main() {
    let mut args = std::env::args_os().skip(1);
    let (Some(workload), Some(count), None) = (args.next(), args.next(), args.next()) else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let Some(count) = count.to_str().and_then(|count| count.parse::<u64>().ok()) else {
        eprintln!("{USAGE}: N must be a whole number");
        std::process::exit(2);
    };
    let op = match workload.to_str().unwrap_or_default() {
        "keyed" => workloads::deny_hot_key_on::<Gcra, _, _>(LockFree::default(), TscClock::new()),
        "foldhash" => workloads::deny_hot_key_on::<Gcra, _, _>(
            workloads::lock_free_foldhash(),
            TscClock::new(),
        ),
        "hashmap" => workloads::deny_hot_key_in_hashmap::<workloads::Unguarded>(),
        "direct" => workloads::direct_deny(),
        "papaya" => {
            workloads::deny_hot_key_on::<Gcra, _, _>(tollgate_peers::Papaya::new(), TscClock::new())
        }
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
