//! The three-instance break: three OS processes, each with its own
//! in-process limiter of 100 per window, driven by one load generator that
//! spreads 1 000 requests for one key across them, as a round-robin load
//! balancer would: 300 are admitted, three times the limit. The same three
//! processes on one real Redis admit exactly 100, deciding every check on
//! Redis, caching denials, or leasing (notes/12).

mod support {
    pub mod instances;
    #[allow(dead_code)]
    pub mod redis;
}

use support::instances::{Instance, admitted, admitted_in_turn};
use support::redis::RedisServer;

const INSTANCE: &str = env!("CARGO_BIN_EXE_tollgate-instance");

#[test]
fn three_in_process_limiters_admit_three_times_the_limit() {
    let instances: Vec<Instance> = (0..3)
        .map(|_| Instance::start(INSTANCE.as_ref(), None))
        .collect();
    assert_eq!(
        admitted(&instances),
        300,
        "three instances of a limit of 100"
    );
}

#[test]
fn three_instances_on_one_redis_admit_exactly_the_limit() {
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let url = format!("redis://127.0.0.1:{}/", server.port());
    let instances: Vec<Instance> = (0..3)
        .map(|_| Instance::start(INSTANCE.as_ref(), Some(&url)))
        .collect();
    assert_eq!(
        admitted(&instances),
        100,
        "three instances sharing a limit of 100"
    );
}

/// Deny-cached, sent one request at a time in turn: every admission is
/// Redis's (exactly 100), and once the key is drained each instance asks
/// Redis at most once more: instance 0's last admission (request 99) left
/// the key owing a whole burst, which its cache denies from then on;
/// instances 1 and 2 last saw one and two units' less debt, ask once (on
/// requests 100 and 101), are denied, and deny the other 897 themselves.
/// 34 round trips each: 102 for 1 000 checks.
#[test]
fn deny_cached_instances_admit_exactly_the_limit_and_ask_once_when_drained() {
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let url = format!("redis://127.0.0.1:{}/", server.port());
    let instances: Vec<Instance> = (0..3)
        .map(|_| Instance::start_with(INSTANCE.as_ref(), Some((&url, "deny-cached"))))
        .collect();
    let (admitted, calls) = admitted_in_turn(&instances, 1_000);
    assert_eq!(admitted, 100);
    assert_eq!(calls, [34, 34, 34]);
}

/// Leased, the same trace: still exactly 100 (no unit refills in an hour,
/// and every leased unit is spent by its own instance's later requests),
/// in 16 round trips. Each instance's first check teaches it the clocks'
/// offset (3 calls); then each leases 8 units (a first lease), then 16
/// (doubled after a lease spent in full), then 32 asked (Redis grants half
/// of what is left: 9, 4 and 1, the key 98 units in debt); instance 2 asks
/// twice more as the last 2 units go one at a time; once drained,
/// instances 1 and 0 ask once each, are denied, and deny the rest
/// themselves: 5, 5 and 6 calls, 14 units admitted by Redis and 86 spent
/// from leases.
#[test]
fn leased_instances_admit_exactly_the_limit_with_fewer_round_trips() {
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let url = format!("redis://127.0.0.1:{}/", server.port());
    let instances: Vec<Instance> = (0..3)
        .map(|_| Instance::start_with(INSTANCE.as_ref(), Some((&url, "leased"))))
        .collect();
    let (admitted, calls) = admitted_in_turn(&instances, 1_000);
    assert_eq!(admitted, 100);
    assert_eq!(calls, [5, 5, 6]);
}
