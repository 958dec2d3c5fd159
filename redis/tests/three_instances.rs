//! The three-instance break (issue 9): three OS processes, each with its own
//! in-process limiter of 100 per window, driven by one load generator that
//! spreads 1 000 requests for one key across them, as a round-robin load
//! balancer would: 300 are admitted, three times the limit. The same three
//! processes on one real Redis admit exactly 100.

mod support {
    pub mod instances;
    #[allow(dead_code)]
    pub mod redis;
}

use support::instances::{Instance, admitted};
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
