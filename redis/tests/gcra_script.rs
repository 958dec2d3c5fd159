//! The GCRA script against the in-process GCRA, on a real Redis: the same
//! trace of (time, key, cost), at microsecond times and with an emission
//! interval of whole microseconds, gives the same decision every step.

mod support {
    // The harness serves several test binaries; this one needs no Cluster.
    #[allow(dead_code)]
    pub mod redis;
}

use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::{Builder, Quota};

use support::redis::RedisServer;

const SCRIPT: &str = include_str!("../src/scripts/gcra.lua");

#[test]
fn the_gcra_script_decides_as_the_in_process_gcra() {
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", server.port())).unwrap();
    let mut connection = client.get_connection().unwrap();
    let script = redis::Script::new(SCRIPT);
    // 100 a second, a burst of 5: 10 000 µs a unit.
    let quota = Quota::per_second(100).unwrap().with_burst(5).unwrap();
    let interval_us = quota.emission_interval().as_micros() as u64;
    assert_eq!(
        interval_us * 1_000,
        quota.emission_interval().as_nanos() as u64
    );
    let clock = ManualClock::new();
    let limiter = Builder::new(quota).clock(clock.clone()).build::<u64>();
    // A deterministic irregular trace: gaps from 0 to 5 ms, keys 0..4,
    // costs 1..=3; times start at a 2026 Unix instant in µs.
    let start_us: u64 = 1_764_831_234_567_891;
    let mut now_us = start_us;
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = |modulus: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % modulus
    };
    let (mut allowed, mut denied) = (0, 0);
    for step in 0..2_000 {
        now_us += next(5_001);
        let key = next(4);
        let cost = 1 + next(3) as u32;
        clock.set(Duration::from_micros(now_us - start_us));
        let expected = limiter.check_n(&key, cost).unwrap();
        let reply: Vec<i64> = script
            .key(format!("tollgate:test:{key}"))
            .arg(interval_us)
            .arg(quota.burst())
            .arg(cost)
            .arg(now_us)
            .invoke(&mut connection)
            .unwrap();
        let got = (
            reply[0] == 1,
            reply[1] as u32,
            Duration::from_micros(reply[2] as u64),
            Duration::from_micros(reply[3] as u64),
        );
        let want = (
            expected.is_allowed(),
            expected.remaining(),
            expected.retry_after(),
            expected.reset_after(),
        );
        assert_eq!(
            got, want,
            "step {step}: key {key}, cost {cost}, at {now_us} µs"
        );
        if want.0 {
            allowed += 1;
        } else {
            denied += 1;
        }
    }
    // The trace exercises both outcomes.
    assert!(
        allowed > 200 && denied > 200,
        "{allowed} allowed, {denied} denied"
    );
}
