//! The deny cache and the leases on a real Redis (notes/12).
//!
//! * The script's lease mode against its Rust twin (`tollgate::remote::lease`)
//!   on random traces, with two planted bugs that the comparison catches.
//! * Three instances (three limiters, each with its own connection and
//!   local half) on one key with a shared client clock, standalone and on
//!   a three-master Cluster:
//!   - deny-cached, every decision is the one three exact limiters take on
//!     the same trace, with fewer round trips;
//!   - leased, no window holds more than `burst + ⌊W / interval⌋`
//!     admissions, and far fewer checks take a round trip.
//! * A leased limiter whose Redis is killed: its lease keeps serving until
//!   spent, and then the failure policy answers.

mod support {
    #[allow(dead_code)]
    pub mod redis;
    #[allow(dead_code)]
    pub mod target;
}

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use tollgate::Quota;
use tollgate::algorithm::FixedWindow;
use tollgate::clock::{Clock, ManualClock};
use tollgate::remote::{GiveBack, LeaseRequest, Leases, RemoteQuota, lease};
use tollgate_redis::{ConfigError, Connection, Mode, OnFailure, Options, RedisLimiter, SCRIPT};

use support::redis::RedisServer;
use support::target::{Kind, Target};

/// A Unix instant in 2026, in µs.
const START_US: u64 = 1_764_831_234_567_891;

// ---------------------------------------------------------------------------
// The script's lease mode against its twin.

#[derive(Debug, Clone)]
struct Case {
    interval_us: u64,
    burst: u32,
    steps: Vec<Step>,
}

#[derive(Debug, Clone, Copy)]
struct Step {
    /// µs to move the clock (negative: backwards).
    advance_us: i64,
    cost: u32,
    want: u32,
    /// 0: nothing given back; 1: the last grant's units; 2: units with a
    /// TAT the key does not hold.
    give_back: u8,
    units: u32,
}

fn cases() -> impl Strategy<Value = Case> {
    (1_u64..=1_000, 1_u32..=16).prop_flat_map(|(interval_us, burst)| {
        let span = i64::try_from(interval_us * u64::from(burst)).unwrap();
        // Costs of 0 and past the burst, and more units wanted or given
        // back than the burst, in about one step in eight: the script
        // refuses those, and so must the twin.
        let size = move |low: u32| {
            prop_oneof![7 => low..=burst, 1 => prop_oneof![Just(0), Just(burst + 1)]]
        };
        let step = (-span / 4..=span, size(1), size(0), 0_u8..3, size(1)).prop_map(
            |(advance_us, cost, want, give_back, units)| Step {
                advance_us,
                cost,
                want,
                give_back,
                units,
            },
        );
        proptest::collection::vec(step, 1..60).prop_map(move |steps| Case {
            interval_us,
            burst,
            steps,
        })
    })
}

/// Runs `case` through the script `source` (mode "4", client time, an
/// hour's grace so that no key expires) and through the twin; every reply
/// and every stored TAT must be equal.
fn lease_differential(
    connection: &mut redis::Connection,
    source: &str,
    key: &str,
    case: &Case,
    refused: &std::cell::Cell<u32>,
) -> Result<(), TestCaseError> {
    let quota = RemoteQuota::new(case.interval_us, case.burst).unwrap();
    let _: () = redis::cmd("DEL").arg(key).query(connection).unwrap();
    let (mut now_us, mut stored) = (START_US, None);
    let mut last_lease: Option<GiveBack> = None;
    for (index, step) in case.steps.iter().enumerate() {
        now_us = now_us.saturating_add_signed(step.advance_us);
        let give_back = match step.give_back {
            1 => last_lease,
            2 => Some(GiveBack::new(stored.unwrap_or(START_US) + 1, step.units)),
            _ => None,
        };
        let request = LeaseRequest::new(step.cost, step.want, give_back);
        let twin = lease(stored, now_us, &quota, &request);
        let mut command = redis::cmd("EVAL");
        command
            .arg(source)
            .arg(1)
            .arg(key)
            .arg("4")
            .arg(now_us)
            .arg(case.interval_us)
            .arg(case.burst)
            .arg(step.cost)
            .arg(step.want);
        match give_back {
            Some(GiveBack { end_us, units, .. }) => command.arg(end_us).arg(units),
            None => command.arg("").arg(0),
        };
        // The grace, revision 0, and a strategy (nothing to carry: every
        // value is this quota's).
        command.arg(3_600_000).arg(0).arg("a");
        let reply: redis::RedisResult<Vec<i64>> = command.query(connection);
        let ((expected, twin_stored), reply) = match (twin, reply) {
            (Ok(twin), Ok(reply)) => (twin, reply),
            (Err(_), Err(error)) => {
                prop_assert!(
                    error.to_string().contains("a lease call needs"),
                    "{}",
                    error
                );
                refused.set(refused.get() + 1);
                continue;
            }
            (twin, reply) => {
                return Err(TestCaseError::fail(format!(
                    "step {index}: {step:?}: the twin {twin:?}, the script {reply:?}"
                )));
            }
        };
        stored = twin_stored.or(stored);
        let as_script = vec![
            i64::from(expected.allowed),
            i64::from(expected.remaining),
            i64::try_from(expected.retry_us).unwrap(),
            i64::try_from(expected.reset_us).unwrap(),
            i64::from(expected.granted),
            i64::try_from(expected.end_us).unwrap(),
            i64::try_from(expected.now_us).unwrap(),
            i64::from(expected.returned),
        ];
        prop_assert_eq!(&reply, &as_script, "step {}: {:?}", index, step);
        let held: Option<String> = redis::cmd("GET").arg(key).query(connection).unwrap();
        prop_assert_eq!(
            held,
            stored.map(|tat| format!("{tat} 0 {} {}", case.interval_us, case.burst)),
            "step {}: stored TAT and stamp",
            index
        );
        last_lease =
            (expected.granted > 0).then_some(GiveBack::new(expected.end_us, expected.granted));
    }
    Ok(())
}

fn lease_runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    })
}

/// An instant past the script's range is refused, by the script and by
/// its twin.
#[test]
fn the_lease_script_refuses_an_instant_past_its_range() {
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", server.port())).unwrap();
    let mut connection = client.get_connection().unwrap();
    let quota = RemoteQuota::new(10, 2).unwrap();
    let request = LeaseRequest::plain(1);
    for (now_us, refused) in [((1 << 52) + 1, true), (1 << 52, false)] {
        let reply: redis::RedisResult<Vec<i64>> = redis::cmd("EVAL")
            .arg(SCRIPT)
            .arg(1)
            .arg("lease-end")
            .arg("4")
            .arg(now_us)
            .arg(10)
            .arg(2)
            .arg(1)
            .arg(0)
            .arg("")
            .arg(0)
            .arg(0)
            .arg(0)
            .arg("a")
            .query(&mut connection);
        assert_eq!(reply.is_err(), refused, "{now_us}: {reply:?}");
        assert_eq!(lease(None, now_us, &quota, &request).is_err(), refused);
    }
}

#[test]
fn the_lease_script_is_its_rust_twin() {
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", server.port())).unwrap();
    let connection = std::cell::RefCell::new(client.get_connection().unwrap());
    let refused = std::cell::Cell::new(0);
    lease_runner(128)
        .run(&cases(), |case| {
            lease_differential(
                &mut connection.borrow_mut(),
                SCRIPT,
                "lease-twin",
                &case,
                &refused,
            )
        })
        .unwrap();
    // The comparison covered refusals too: requests both refused.
    assert!(refused.get() > 0, "no request was refused");
}

/// Each planted bug, in a copy of the script, is caught by the comparison.
#[test]
fn planted_bugs_in_the_lease_script_are_caught() {
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", server.port())).unwrap();
    let connection = std::cell::RefCell::new(client.get_connection().unwrap());
    for (what, site, planted) in [
        (
            "a give-back that ignores whether the key holds the lease's TAT",
            r#"units > 0 and stored == ARGV[7] .. " " .. format("%d %d %d","#,
            r#"units > 0 and stored ~= nil or format("%d %d %d","#,
        ),
        (
            "a grant of everything left instead of half",
            "math.floor(math.floor((max_debt - debt) / interval) / 2)",
            "math.floor((max_debt - debt) / interval)",
        ),
        (
            "a script that takes costs, wants and give-backs past the burst",
            "or cost < 1 or cost > burst or want > burst or units > burst then",
            "then",
        ),
    ] {
        assert_eq!(SCRIPT.matches(site).count(), 1, "the site of {what}");
        let source = SCRIPT.replace(site, planted);
        let caught = lease_runner(256)
            .run(&cases(), |case| {
                lease_differential(
                    &mut connection.borrow_mut(),
                    &source,
                    "lease-planted",
                    &case,
                    &std::cell::Cell::new(0),
                )
            })
            .is_err();
        assert!(caught, "not caught: {what}");
    }
}

// ---------------------------------------------------------------------------
// Three instances on one key.

/// A deterministic trace: each step picks an instance, a cost and a clock
/// step (up to `max_step_us`), from a small linear congruential generator.
struct Trace(u64);

impl Trace {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// Three limiters named `name`, each with its own connection (and so its
/// own local half), on the shared client `clock`.
fn instances(
    target: &Target,
    name: &str,
    quota: Quota,
    clock: &ManualClock,
    mode: Mode,
) -> Vec<RedisLimiter> {
    (0..3)
        .map(|_| {
            let connection = target.runtime.block_on(target.reconnect());
            RedisLimiter::builder(name, quota)
                .clock(clock.clone())
                .expiry_grace(Duration::from_secs(3_600))
                .mode(mode)
                .build(connection)
                .unwrap()
        })
        .collect()
}

/// 10 a second in bursts of 5, on a trace of 600 checks whose clock steps
/// average a fifth of an interval: the key is drained most of the time and
/// refills a unit at a time.
fn quota() -> Quota {
    Quota::per_second(10).unwrap().with_burst(5).unwrap()
}

fn deny_cache_decides_as_redis_alone(kind: Kind) {
    let target = Target::start(kind);
    let clock = ManualClock::new();
    clock.set(Duration::from_micros(START_US));
    let exact = instances(&target, "exact", quota(), &clock, Mode::Exact);
    let cached = instances(&target, "cached", quota(), &clock, Mode::DenyCached);
    let mut trace = Trace(7);
    let (mut admitted, mut denied) = (0, 0);
    for step in 0..600 {
        let instance = usize::try_from(trace.next(3)).unwrap();
        let cost = u32::try_from(trace.next(2)).unwrap() + 1;
        clock.advance(Duration::from_micros(trace.next(40_000)));
        let (by_redis, by_cache) = target.runtime.block_on(async {
            (
                exact[instance].check_n("hot", cost).await.unwrap(),
                cached[instance].check_n("hot", cost).await.unwrap(),
            )
        });
        assert_eq!(
            by_cache.is_allowed(),
            by_redis.is_allowed(),
            "step {step}: instance {instance}, cost {cost}: {by_cache:?} against Redis's {by_redis:?}"
        );
        if by_redis.is_allowed() {
            admitted += 1;
        } else {
            denied += 1;
            // The cached wait is never longer than Redis's: the cache
            // knows a lower bound of the key's arrival time.
            assert!(
                by_cache.retry_after() <= by_redis.retry_after(),
                "step {step}"
            );
        }
    }
    let calls =
        |limiters: &[RedisLimiter]| limiters.iter().map(RedisLimiter::remote_calls).sum::<u64>();
    println!(
        "{kind:?}: {admitted} admitted, {denied} denied; round trips: exact {}, deny-cached {}",
        calls(&exact),
        calls(&cached)
    );
    assert_eq!(calls(&exact), 600);
    // Every admission is a round trip; most denials are not (the trace is
    // deterministic on its client clock: 114 admissions, and 142 of the
    // 486 denials asked Redis).
    assert_eq!((admitted, calls(&cached)), (114, 256));
}

#[test]
fn the_deny_cache_decides_as_redis_alone() {
    deny_cache_decides_as_redis_alone(Kind::Standalone);
}

#[test]
fn the_deny_cache_decides_as_redis_alone_on_a_cluster() {
    deny_cache_decides_as_redis_alone(Kind::Cluster);
}

/// Every window between two admissions holds at most `burst +
/// ⌊W / interval⌋` units.
fn assert_window_bound(admitted: &mut [(u64, u32)], burst: u32, interval_us: u64) {
    admitted.sort_unstable();
    for (first, &(from_us, _)) in admitted.iter().enumerate() {
        let mut units = 0;
        for &(to_us, cost) in &admitted[first..] {
            units += u64::from(cost);
            let bound = u64::from(burst) + (to_us - from_us) / interval_us;
            assert!(
                units <= bound,
                "{units} units in [{from_us}, {to_us}] µs, at most {bound}"
            );
        }
    }
}

fn leases_admit_no_more_than_redis_alone(kind: Kind) {
    let target = Target::start(kind);
    let clock = ManualClock::new();
    clock.set(Duration::from_micros(START_US));
    // 1 000 a second in bursts of 50: 1 ms an interval.
    let quota = Quota::per_second(1_000).unwrap().with_burst(50).unwrap();
    let leased = instances(
        &target,
        "leased",
        quota,
        &clock,
        Mode::Leased(Leases::new()),
    );
    let exact = instances(&target, "exact", quota, &clock, Mode::Exact);
    let mut trace = Trace(11);
    let mut admitted: Vec<(u64, u32)> = Vec::new();
    let mut admitted_exact = 0;
    let checks = 3_000;
    for _ in 0..checks {
        let instance = usize::try_from(trace.next(3)).unwrap();
        let cost = if trace.next(10) == 0 { 3 } else { 1 };
        // Bursts and pauses: mostly a fifth of an interval, now and then
        // several.
        let step_us = if trace.next(20) == 0 {
            trace.next(20_000)
        } else {
            trace.next(400)
        };
        clock.advance(Duration::from_micros(step_us));
        let at_us = clock.now_ns() / 1_000;
        let (leased_decision, exact_decision) = target.runtime.block_on(async {
            (
                leased[instance].check_n("hot", cost).await.unwrap(),
                exact[instance].check_n("hot", cost).await.unwrap(),
            )
        });
        if leased_decision.is_allowed() {
            admitted.push((at_us, cost));
        }
        admitted_exact += u32::from(exact_decision.is_allowed()) * cost;
    }
    let total: u32 = admitted.iter().map(|&(_, cost)| cost).sum();
    let calls: u64 = leased.iter().map(RedisLimiter::remote_calls).sum();
    println!(
        "{kind:?}: leased admitted {total} units (exact: {admitted_exact}) in {checks} checks with {calls} round trips"
    );
    assert_window_bound(&mut admitted, 50, 1_000);
    // Deterministic on its client clock: a drained key most of the time,
    // where leases are refill-limited.
    assert_eq!((total, calls), (1_963, 1_318));
}

#[test]
fn leases_admit_no_more_than_redis_alone_in_any_window() {
    leases_admit_no_more_than_redis_alone(Kind::Standalone);
}

#[test]
fn leases_admit_no_more_than_redis_alone_in_any_window_on_a_cluster() {
    leases_admit_no_more_than_redis_alone(Kind::Cluster);
}

// ---------------------------------------------------------------------------
// A dead Redis.

/// A runtime of two worker threads.
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A runtime, a server to kill, and a leased limiter of 100 an hour named
/// `name` on it (a client clock at `START_US`, the policy `Deny`, a breaker
/// opening after 3 failures for `cooldown`).
fn leased_on_a_server_to_kill(
    name: &str,
    cooldown: Duration,
) -> (
    tokio::runtime::Runtime,
    RedisServer,
    RedisLimiter,
    ManualClock,
) {
    let runtime = two_workers();
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let connection = runtime
        .block_on(Connection::open_with(
            format!("redis://127.0.0.1:{}/", server.port()),
            Options::default()
                .call_timeout(Duration::from_millis(200))
                .breaker(3, cooldown),
        ))
        .unwrap();
    let clock = ManualClock::new();
    clock.set(Duration::from_micros(START_US));
    let limiter = RedisLimiter::builder(name, Quota::per_hour(100).unwrap())
        .clock(clock.clone())
        .mode(Mode::Leased(Leases::new()))
        .on_failure(OnFailure::Deny)
        .build(connection)
        .unwrap();
    (runtime, server, limiter, clock)
}

#[test]
fn a_lease_serves_while_redis_is_down_then_the_policy_answers() {
    // 100 an hour (36 s an interval), bursts of 100, on a client clock that
    // holds still (the local half knows Redis's instant: the clock's): the
    // first check leases 8 units (a first lease's size), spent by the next
    // 8; the tenth leases 16, the twenty-seventh 32 (each doubles, and
    // Redis has room: half of what is left is 49, 45, then 36).
    let (runtime, mut server, limiter, clock) =
        leased_on_a_server_to_kill("dies", Duration::from_millis(300));
    let check = |limiter: &RedisLimiter| {
        runtime
            .block_on(limiter.check("k"))
            .unwrap_or_else(|error| panic!("{error}"))
    };
    for index in 1..=27 {
        assert!(check(&limiter).is_allowed(), "check {index}");
        let round_trips = match index {
            1..=9 => 1,
            10..=26 => 2,
            _ => 3,
        };
        assert_eq!(limiter.remote_calls(), round_trips, "check {index}");
    }
    server.kill();
    // The lease serves without Redis: 10 of its 32 units now.
    for index in 0..10 {
        assert!(check(&limiter).is_allowed(), "unit {index} after the kill");
    }
    // 50 intervals on, the lease's last slot is 9 intervals away: the units
    // whose deadline (their slot less an interval) has passed expire, and
    // the 9 at the top of the 22 are left.
    clock.advance(Duration::from_secs(36 * 50));
    for index in 0..9 {
        assert!(
            check(&limiter).is_allowed(),
            "unit {index} after the clock moved"
        );
    }
    assert_eq!(limiter.remote_calls(), 3, "served without a round trip");
    // Spent: the next check asks Redis, which is dead, and the policy
    // (Deny) answers.
    let denied = check(&limiter);
    assert!(!denied.is_allowed());
    assert!(denied.retry_after() > Duration::ZERO);
    assert_eq!(limiter.remote_calls(), 4);
}

/// A lease whose request the open breaker kept from Redis keeps serving:
/// nothing of it reached Redis.
#[test]
fn a_lease_survives_a_request_the_breaker_kept_back() {
    let (runtime, mut server, limiter, _clock) =
        leased_on_a_server_to_kill("kept", Duration::from_secs(60));
    runtime.block_on(async {
        // A lease of 8 units beside the first check's; one spent.
        assert!(limiter.check("k").await.unwrap().is_allowed());
        assert!(limiter.check("k").await.unwrap().is_allowed());
        server.kill();
        // Three failures on other keys open the breaker.
        for other in ["a", "b", "c"] {
            assert!(!limiter.check(other).await.unwrap().is_allowed());
        }
        // Eight units wanted, seven held: the claim gives them back, the
        // breaker keeps the call from Redis (the policy denies), and the
        // seven are the instance's again.
        assert!(!limiter.check_n("k", 8).await.unwrap().is_allowed());
        for unit in 0..7 {
            assert!(
                limiter.check("k").await.unwrap().is_allowed(),
                "unit {unit}"
            );
        }
        assert!(!limiter.check("k").await.unwrap().is_allowed());
    });
}

/// An instance's own lease never denies what giving it back admits: checks
/// of 1, 1 and 6 units at one instant on a burst of 10 are all admitted by
/// Redis alone, and by a leased instance (the 6 find 3 units leased, give
/// them back first, and are admitted).
#[test]
fn an_instances_own_lease_denies_nothing_redis_alone_admits() {
    let target = Target::start(Kind::Standalone);
    let clock = ManualClock::new();
    clock.set(Duration::from_micros(START_US));
    let quota = Quota::per_second(100).unwrap().with_burst(10).unwrap();
    for mode in [Mode::Exact, Mode::Leased(Leases::new())] {
        let limiter = RedisLimiter::builder(format!("own-{mode:?}"), quota)
            .clock(clock.clone())
            .mode(mode)
            .build(target.connection.clone())
            .unwrap();
        for cost in [1, 1, 6] {
            let decision = target.runtime.block_on(limiter.check_n("k", cost)).unwrap();
            assert!(decision.is_allowed(), "{mode:?}: {cost} units");
        }
    }
}

/// A lease's unit is not spent once its deadline has passed, though the
/// key has refilled: it would add to a fresh burst.
#[test]
fn a_unit_past_its_deadline_is_not_spent() {
    let target = Target::start(Kind::Standalone);
    let clock = ManualClock::new();
    clock.set(Duration::from_micros(START_US));
    let quota = Quota::per_second(100).unwrap().with_burst(10).unwrap();
    let [leased, exact] = [Mode::Leased(Leases::new()), Mode::Exact].map(|mode| {
        RedisLimiter::builder("deadline", quota)
            .clock(clock.clone())
            .mode(mode)
            .build(target.connection.clone())
            .unwrap()
    });
    let admitted = |limiter: &RedisLimiter| {
        target
            .runtime
            .block_on(limiter.check("k"))
            .unwrap()
            .is_allowed()
    };
    // One unit, and a lease of 4 (half of the 9 left): slots at +20 ms to
    // +50 ms, each spendable until its slot less 10 ms.
    assert!(admitted(&leased));
    // Five intervals on, the key is full again, and every unit of the
    // lease is past its deadline. Redis alone admits its burst of 10 here,
    // and not one more.
    clock.advance(Duration::from_millis(50));
    let by_redis = (0..10).filter(|_| admitted(&exact)).count();
    assert_eq!(by_redis, 10);
    assert!(!admitted(&leased), "a unit spent past its deadline");
    assert!(!admitted(&exact));
}

/// On a Cluster deciding on its masters' own clocks, a local mode needs the
/// most those clocks differ (it judges every key by a bound that covers
/// the master furthest ahead); given it, keys on every master admit exactly
/// their burst, most of it from leases.
#[test]
fn on_a_cluster_s_own_clocks_a_local_mode_needs_their_skew() {
    let target = Target::start(Kind::Cluster);
    let quota = Quota::per_hour(100).unwrap();
    let refused = RedisLimiter::builder("skew", quota)
        .mode(Mode::Leased(Leases::new()))
        .build(target.connection.clone());
    assert!(matches!(refused, Err(ConfigError::ClusterSkewUnknown)));
    let limiter = RedisLimiter::builder("skew", quota)
        .mode(Mode::Leased(Leases::new()))
        .cluster_clock_skew(Duration::from_millis(10))
        .build(target.connection.clone())
        .unwrap();
    // One key on each master: the masters' slot ranges from CLUSTER SLOTS
    // (each entry: first slot, last slot, [address, port, id], replicas…),
    // and each name's slot from CLUSTER KEYSLOT.
    let port = target.ports()[0];
    let mut connection = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let int = |value: &redis::Value| match value {
        redis::Value::Int(number) => *number,
        other => panic!("not an integer: {other:?}"),
    };
    let ranges: Vec<(i64, i64, i64)> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query::<Vec<Vec<redis::Value>>>(&mut connection)
        .unwrap()
        .iter()
        .map(|entry| match &entry[2] {
            redis::Value::Array(node) => (int(&entry[0]), int(&entry[1]), int(&node[1])),
            other => panic!("not a node: {other:?}"),
        })
        .collect();
    let mut master_of = |name: &str| -> i64 {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(limiter.redis_key(name))
            .query(&mut connection)
            .unwrap();
        ranges
            .iter()
            .find(|range| (range.0..=range.1).contains(&slot))
            .map(|range| range.2)
            .unwrap_or_else(|| panic!("slot {slot} served by no master: {ranges:?}"))
    };
    let mut keys: std::collections::BTreeMap<i64, String> = std::collections::BTreeMap::new();
    for name in (0..).map(|index| format!("key-{index}")).take(1_000) {
        keys.entry(master_of(&name)).or_insert(name);
        if keys.len() == 3 {
            break;
        }
    }
    assert_eq!(keys.len(), 3, "three masters: {keys:?}");
    for key in keys.values() {
        let admitted = (0..150)
            .filter(|_| {
                target
                    .runtime
                    .block_on(limiter.check(key.as_str()))
                    .unwrap()
                    .is_allowed()
            })
            .count();
        assert_eq!(admitted, 100, "{key}");
    }
    println!("round trips for 450 checks: {}", limiter.remote_calls());
    assert!(limiter.remote_calls() < 100, "{}", limiter.remote_calls());
}

// ---------------------------------------------------------------------------
// Configuration.

#[test]
fn local_modes_need_gcra_and_print_their_bound() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let connection = runtime
        .block_on(Connection::open(format!(
            "redis://127.0.0.1:{}/",
            server.port()
        )))
        .unwrap();
    let quota = Quota::per_second(100).unwrap();
    let refused = RedisLimiter::builder("window", quota)
        .mode(Mode::DenyCached)
        .algorithm::<FixedWindow>()
        .build(connection.clone());
    assert!(matches!(refused, Err(ConfigError::ModeNeedsGcra)));
    let leased = RedisLimiter::builder("leased", quota)
        .mode(Mode::Leased(Leases::new()))
        .build(connection.clone())
        .unwrap();
    let debug = format!("{leased:?}");
    assert!(
        debug.contains("at most 100 + ⌊W / 10000 µs⌋ in any window W (as Redis alone)"),
        "{debug}"
    );
    let slack = RedisLimiter::builder("slack", quota)
        .mode(Mode::Leased(Leases::new().with_slack(3)))
        .build(connection)
        .unwrap();
    assert!(
        format!("{slack:?}").contains("at most 100 + ⌊W / 10000 µs⌋ + 3 in any window W"),
        "{slack:?}"
    );
}

/// Checks that miss while their key's claimed ask is in flight wait for
/// its reply and decide from it, rather than each asking too: ten
/// concurrent checks of a new key while Redis is paused (`CLIENT PAUSE`)
/// take one round trip, in each local mode. A quota of one an hour: the
/// first is admitted, and the nine that waited are denied by what its
/// reply taught.
#[test]
fn checks_that_miss_during_a_claimed_ask_wait_for_its_reply() {
    for mode in [Mode::DenyCached, Mode::Leased(Leases::new())] {
        let ten = concurrent_checks(
            10,
            Quota::per_hour(1).unwrap(),
            mode,
            0,
            (Duration::from_secs(5), Duration::from_millis(500)),
        );
        assert_eq!((ten.admitted, ten.asks), (1, 1), "{mode:?}");
    }
}

/// What concurrent checks of one key saw on a paused Redis: how many were
/// admitted, the asks they made, and when the last one ended.
struct Concurrent {
    admitted: usize,
    asks: u64,
    last: Duration,
}

/// A limiter of `quota` in `mode` (calls timing out after `timeout`, the
/// failure policy denying) on a fresh Redis, its script loaded and the
/// clocks' offset learnt on another key; `consumed` checks of key `hot`
/// first, one at a time; then Redis paused for `pause` and `checks`
/// concurrent checks of `hot`.
fn concurrent_checks(
    checks: usize,
    quota: Quota,
    mode: Mode,
    consumed: usize,
    (timeout, pause): (Duration, Duration),
) -> Concurrent {
    let runtime = two_workers();
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let connection = runtime
        .block_on(Connection::open_with(
            format!("redis://127.0.0.1:{}/", server.port()),
            // No breaker within the test: every call waits its timeout.
            Options::default()
                .call_timeout(timeout)
                .breaker(1_000, Duration::from_secs(1)),
        ))
        .unwrap();
    let limiter = std::sync::Arc::new(
        RedisLimiter::builder("concurrent", quota)
            .mode(mode)
            .on_failure(OnFailure::Deny)
            .build(connection)
            .unwrap(),
    );
    for key in std::iter::once("warm").chain(std::iter::repeat_n("hot", consumed)) {
        assert!(runtime.block_on(limiter.check(key)).unwrap().is_allowed());
    }
    let before = limiter.remote_calls();
    let millis = pause.as_millis().to_string();
    support::redis::command(server.port(), &["CLIENT", "PAUSE", &millis, "ALL"]).unwrap();
    let started = std::time::Instant::now();
    let spawned: Vec<_> = (0..checks)
        .map(|_| {
            let limiter = limiter.clone();
            runtime.spawn(async move {
                let admitted = limiter.check("hot").await.unwrap().is_allowed();
                (admitted, started.elapsed())
            })
        })
        .collect();
    let ended: Vec<_> = spawned
        .into_iter()
        .map(|check| runtime.block_on(check).unwrap())
        .collect();
    Concurrent {
        admitted: ended.iter().filter(|&&(admitted, _)| admitted).count(),
        asks: limiter.remote_calls() - before,
        last: ended.iter().map(|&(_, elapsed)| elapsed).max().unwrap(),
    }
}

/// Calls that time out after half a second, under a pause of four.
const TIMEOUT: Duration = Duration::from_millis(500);
const LONG_PAUSE: Duration = Duration::from_secs(4);

/// A claimed ask that fails is no denial of Redis's, whatever the failure
/// policy answers: the checks waiting on it ask themselves at once rather
/// than wait on the next claimant's call, which would add a call's timeout
/// a wait (four or five here, where every check ends within two: the
/// claim's, then each waiter's own).
#[test]
fn checks_waiting_on_a_failed_ask_do_not_wait_again() {
    let six = concurrent_checks(
        6,
        Quota::per_hour(1).unwrap(),
        Mode::DenyCached,
        0,
        (TIMEOUT, LONG_PAUSE),
    );
    assert!(
        six.last < TIMEOUT * 3,
        "the last check ended after {:?}",
        six.last
    );
    assert_eq!((six.admitted, six.asks), (0, 6));
}

/// Without leases, a check does not wait on the claimed ask of a key with
/// more than half its burst free by what the instance knows (here, all of
/// it: a key it has never asked): the reply would teach it nothing. Each
/// check asks at once, and all end at one timeout. A key with 4 units of
/// 10 free is waited on: its checks end at two.
#[test]
fn checks_of_a_key_with_room_do_not_wait_without_leases() {
    let room = concurrent_checks(
        6,
        Quota::per_hour(100).unwrap(),
        Mode::DenyCached,
        0,
        (TIMEOUT, LONG_PAUSE),
    );
    assert!(
        room.last < TIMEOUT * 3 / 2,
        "the last check ended after {:?}",
        room.last
    );
    assert_eq!((room.admitted, room.asks), (0, 6));
    let tight = concurrent_checks(
        6,
        Quota::per_hour(10).unwrap(),
        Mode::DenyCached,
        6,
        (TIMEOUT, LONG_PAUSE),
    );
    assert!(
        tight.last > TIMEOUT * 3 / 2,
        "the last check ended after {:?}",
        tight.last
    );
    assert_eq!((tight.admitted, tight.asks), (0, 6));
}

/// A key with one unit of ten left, by what the instance knows: checks
/// behind the claimed ask wait for it, and decide from its reply (it took
/// the last unit): one ask for six checks. Asking at once would make six.
#[test]
fn checks_of_a_key_near_its_limit_wait_for_the_claimed_ask() {
    let six = concurrent_checks(
        6,
        Quota::per_hour(10).unwrap(),
        Mode::DenyCached,
        9,
        (Duration::from_secs(5), Duration::from_millis(500)),
    );
    assert_eq!((six.admitted, six.asks), (1, 1));
}

/// With leases, checks behind the claimed ask wait for it even on a key
/// with room: its reply brings a lease, which the five others spend. One
/// ask for six checks; asking at once would make six.
#[test]
fn checks_behind_a_claimed_ask_for_a_lease_wait_for_it() {
    let six = concurrent_checks(
        6,
        Quota::per_hour(100).unwrap(),
        Mode::Leased(Leases::new()),
        0,
        (Duration::from_secs(5), Duration::from_millis(500)),
    );
    assert_eq!((six.admitted, six.asks), (6, 1));
}
