//! Leases and the deny cache when Redis's own clock steps back (an NTP step,
//! a failover to a master whose clock is behind), on a real `redis-server`
//! whose wall clock libfaketime moves while it runs
//! (`support::redis::FakeClockRedis` says how), the limiters deciding on its
//! `TIME` (the default, standalone).
//!
//! A leased instance judges a lease unit's deadline against an upper bound
//! of Redis's `TIME` learned from its newest round trip. A unit whose
//! deadline has passed stays in the key's word until a later spend or claim
//! rewrites it; when the clock steps back, the next round trip teaches a
//! lower bound, and such a unit would be spent again, beside what Redis
//! admits. The deny cache holds no units: its floors are lower bounds of
//! the key's arrival time, which a step of the clock does not move.
//!
//! Every margin is the step's (200 ms) or the quota's interval (10 ms), far
//! above the loopback's round trips (a fraction of a millisecond); no
//! assertion is on a duration. Each test starts its own server.

mod support {
    #[allow(dead_code)]
    pub mod redis;
}

use std::time::{Duration, Instant};

use tollgate::Quota;
use tollgate::remote::Leases;
use tollgate_redis::{Connection, Mode, RedisLimiter};

use support::redis::{ClockStep, FakeClockRedis};

/// How far Redis's clock steps back.
const STEP: Duration = Duration::from_millis(200);

/// 100 a second (an interval of 10 ms) in bursts of 10 (a drained key
/// refills in 100 ms).
fn quota() -> Quota {
    Quota::per_second(100).unwrap().with_burst(10).unwrap()
}

/// A server on a steppable clock, a runtime, and a connection to it.
struct Setup {
    runtime: tokio::runtime::Runtime,
    server: FakeClockRedis,
    connection: Connection,
}

impl Setup {
    fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let server = FakeClockRedis::start().unwrap_or_else(|error| panic!("{error}"));
        let url = format!("redis://127.0.0.1:{}/", server.port());
        let connection = runtime
            .block_on(Connection::open(url.as_str()))
            .unwrap_or_else(|error| panic!("connecting to {url}: {error}"));
        Self {
            runtime,
            server,
            connection,
        }
    }

    /// A limiter named `name` in `mode` on the server's clock (the default:
    /// no client clock), with no expiry grace (the default).
    fn limiter(&self, name: &str, mode: Mode) -> RedisLimiter {
        RedisLimiter::builder(name, quota())
            .mode(mode)
            .build(self.connection.clone())
            .unwrap()
    }

    /// Whether a unit check of `key` is admitted.
    fn check(&self, limiter: &RedisLimiter, key: &str) -> bool {
        self.runtime
            .block_on(limiter.check(key))
            .unwrap_or_else(|error| panic!("{error}"))
            .is_allowed()
    }

    /// Whether Redis would admit a unit of `key` now (`limiter` exact: a
    /// peek on Redis, which writes nothing).
    fn redis_admits(&self, limiter: &RedisLimiter, key: &str) -> bool {
        self.runtime
            .block_on(limiter.peek(key))
            .unwrap_or_else(|error| panic!("{error}"))
            .is_allowed()
    }

    /// Steps the server's clock back by [`STEP`], verified on its `TIME`.
    fn step_back(&mut self) -> ClockStep {
        let step = self
            .server
            .step_back(STEP)
            .unwrap_or_else(|error| panic!("{error}"));
        println!(
            "Redis's TIME {} µs, then {} µs after the step ({} µs; offset from the real \
             clock {} µs, then {} µs, each ±{} µs)",
            step.before.time_us,
            step.after.time_us,
            i128::from(step.after.time_us) - i128::from(step.before.time_us),
            step.before.offset_us,
            step.after.offset_us,
            step.after.uncertainty_us.max(step.before.uncertainty_us)
        );
        step
    }
}

/// A leased instance admits, after Redis's clock steps back, exactly what
/// Redis alone admits on the key in that window: here nothing. A lease's
/// units whose deadline passed unspent before the step are not spent after
/// it.
///
/// The trace, on Redis's clock (`t`: the leased instance's check on `k`):
///
/// 1. The leased instance learns Redis's clock from a first round trip on
///    another key, then checks `k` once: it asks Redis for its unit and a
///    lease beside it, and Redis grants 4 units (half of the 9 still free
///    beside the unit: `lease` in `src/remote/script.rs`). The key's
///    arrival time (TAT) is then `t + 50 ms`; the lease's units are the
///    slots `t + 20` to `t + 50 ms`, each spendable until its slot less an
///    interval, `t + 10` to `t + 40 ms` (`usable` in `src/remote/word.rs`).
///    The instance's traffic on `k` stops there: the 4 units stay in the
///    key's word, unspent.
/// 2. 70 ms of quiet: every unit's deadline passes (the last, `t + 40`,
///    30 ms before), and the key rests (its TAT passes 20 ms before).
/// 3. Redis alone (an exact limiter on the same key, every check decided
///    by Redis, as another instance would be) admits its burst of 10, a
///    rested key's: the key is drained, its TAT `≈ t + 170 ms`.
/// 4. Redis's clock steps back 200 ms (to `≈ t − 130 ms`). The leased
///    instance's next round trip, a check on another key, teaches it the
///    lower bound.
/// 5. The leased instance checks `k` 20 times in a burst, then Redis alone
///    20 times. Redis owes `≈ 300 ms` on the key, far more than the 90 ms
///    that leave room for a unit, for the next 200 ms: Redis alone admits
///    0. So must the leased instance: its units' deadlines passed before
///    the step (judged now at `t − 50 ms` at the earliest, the instant its
///    lease can have been granted at, they would all be spendable again).
///
/// Margins: the quiet ends 20 ms after the key's TAT (a sleep never ends
/// early), and a longer one (a slow machine) changes nothing the assertion
/// compares until it nears the step's 200 ms; Redis alone denies for
/// 200 ms after the step, and the checks after it take a few milliseconds.
#[test]
fn a_leased_instance_admits_what_redis_alone_admits_after_its_clock_steps_back() {
    let mut setup = Setup::start();
    let leased = setup.limiter("steps", Mode::Leased(Leases::new()));
    let alone = setup.limiter("steps", Mode::Exact);

    // 1. The first round trip (no clock known yet: a plain check on
    // another key), then one check on the key, which takes a lease.
    assert!(setup.check(&leased, "first"));
    assert!(setup.check(&leased, "k"));
    assert_eq!(leased.remote_calls(), 2, "one round trip on k");

    // 2. Every unit of the lease passes its deadline unspent.
    std::thread::sleep(Duration::from_millis(70));

    // 3. Redis alone's burst on the rested key.
    let window = Instant::now();
    let burst = (0..10).filter(|_| setup.check(&alone, "k")).count();
    assert_eq!(burst, 10, "a rested key admits its burst");

    // 4. The step, and a round trip that teaches it.
    setup.step_back();
    let calls = leased.remote_calls();
    assert!(setup.check(&leased, "teach"));
    assert_eq!(leased.remote_calls(), calls + 1, "a round trip");

    // 5. The leased instance's burst, then Redis alone's, on the key.
    let hammer = Instant::now();
    let calls = leased.remote_calls();
    let by_lease = (0..20).filter(|_| setup.check(&leased, "k")).count();
    let hammer_us = hammer.elapsed().as_micros();
    let round_trips = leased.remote_calls() - calls;
    let by_redis = (0..20).filter(|_| setup.check(&alone, "k")).count();
    let window_ms = window.elapsed().as_secs_f64() * 1e3;
    println!(
        "after the step: the leased instance admitted {by_lease} of 20 checks in {hammer_us} µs \
         ({round_trips} round trips); Redis alone admitted {by_redis} of 20 on the same key \
         right after"
    );
    println!(
        "the key from Redis alone's burst on: {} admitted in {window_ms:.1} ms, where Redis \
         alone admits {}",
        burst + by_lease + by_redis,
        burst + by_redis
    );
    assert_eq!(
        by_lease, by_redis,
        "admitted after Redis's clock stepped back: the leased instance (left), Redis alone \
         (right)"
    );
}

/// What one check of the deny cache was, against Redis's own answers just
/// before and after it.
#[derive(Debug, Default)]
struct Tally {
    checks: u32,
    /// Asked Redis: its decisions, admitted and denied.
    asked_admitted: u32,
    asked_denied: u32,
    /// Denied here, and Redis denied just before and just after: right.
    denied_as_redis: u32,
    /// Denied here, Redis denied just before and admitted just after: a
    /// unit refilled between the two, at the check's instant or not.
    denied_at_a_refill: u32,
    /// Denied here while Redis admitted just before (and so at the check's
    /// instant too: nothing was admitted between, and its debt only
    /// shrinks as time passes): a denial Redis would not make.
    denied_wrongly: u32,
    /// Admitted without asking Redis: the deny cache never does.
    admitted_here: u32,
}

/// The deny cache decides as Redis alone when Redis's clock steps back:
/// it denies nothing Redis would admit and admits nothing Redis would deny.
///
/// Each check of the deny-cached instance is set between two peeks on
/// Redis (an exact limiter on the same key: a peek writes nothing). A check
/// that asked Redis (its round-trip count moved) is Redis's own decision.
/// A check decided here can only be a denial (the deny cache never
/// admits); it is wrong if Redis admitted just before it: at the check's
/// instant Redis's debt on the key was no larger (nothing was admitted in
/// between, and time only pays debt back), so Redis would have admitted
/// it too. A denial between a peek that denies and one that admits met a
/// refill between the two, and says nothing either way; the two peeks are
/// a fraction of a millisecond apart, a refill comes every 10 ms.
///
/// The trace: a burst of 15 checks on a fresh key (10 admitted by Redis,
/// then denials), 40 checks 2 ms apart (refills), the step back (the key
/// then owes 200 ms more on Redis's clock; the instance learns the new
/// clock at its next round trip), and 150 checks 2 ms apart (denials for
/// about 200 ms, then refills).
#[test]
fn the_deny_cache_decides_as_redis_alone_after_its_clock_steps_back() {
    let mut setup = Setup::start();
    let cached = setup.limiter("cached", Mode::DenyCached);
    let alone = setup.limiter("cached", Mode::Exact);
    let run = |setup: &Setup, tally: &mut Tally, checks: u32, pause: Duration| {
        for _ in 0..checks {
            let before = setup.redis_admits(&alone, "k");
            let calls = cached.remote_calls();
            let admitted = setup.check(&cached, "k");
            let asked = cached.remote_calls() > calls;
            let after = setup.redis_admits(&alone, "k");
            tally.checks += 1;
            match (asked, admitted) {
                (true, true) => tally.asked_admitted += 1,
                (true, false) => tally.asked_denied += 1,
                (false, true) => tally.admitted_here += 1,
                (false, false) if before => tally.denied_wrongly += 1,
                (false, false) if after => tally.denied_at_a_refill += 1,
                (false, false) => tally.denied_as_redis += 1,
            }
            std::thread::sleep(pause);
        }
    };
    let mut before_step = Tally::default();
    run(&setup, &mut before_step, 15, Duration::ZERO);
    run(&setup, &mut before_step, 40, Duration::from_millis(2));
    setup.step_back();
    let mut after_step = Tally::default();
    run(&setup, &mut after_step, 150, Duration::from_millis(2));
    println!("before the step: {before_step:?}");
    println!("after the step:  {after_step:?}");
    for (when, tally) in [("before", &before_step), ("after", &after_step)] {
        assert_eq!(
            (tally.denied_wrongly, tally.admitted_here),
            (0, 0),
            "{when} the step: denials Redis would not make, admissions without Redis"
        );
    }
    // The cache was at work after the step: the key owed Redis 200 ms more
    // than before it, and the cache denied in that time without asking.
    assert!(after_step.denied_as_redis > 0, "{after_step:?}");
}

/// How a leased limiter on a client clock takes a key's burst after its
/// lease expired: through its own checks (the view's asks), a reservation,
/// or a multi-limit check: each sends a reading Redis decides on.
#[derive(Debug, Clone, Copy)]
enum TakeBurst {
    Checks,
    Reservation,
    CheckAll,
}

/// A leased limiter on a client clock (100 a second, bursts of 10) leases
/// at `T0` and spends nothing; at `T0` + 199 ms, every unit expired and the
/// key rested, the same limiter takes the burst as `how` says; then its
/// client clock steps back 198 ms and it checks 10 times. Redis alone, at
/// that reading, denies (the key owes 298 ms), so the limiter must admit
/// none: every reading it sent is a floor of its local decisions, whichever
/// call sent it. Returns the burst and the admissions after the step.
fn client_clock_steps_back(how: TakeBurst) -> (u32, u32) {
    use tollgate::clock::ManualClock;
    use tollgate_redis::check_all;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = support::redis::RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let url = format!("redis://127.0.0.1:{}/", server.port());
    let connection = runtime.block_on(Connection::open(url.as_str())).unwrap();
    let clock = ManualClock::new();
    let t0 = Duration::from_secs(1_764_831_234);
    clock.set(t0);
    // One hash tag, which limits checked together need; the exact limiter
    // shares the leased one's keys.
    let leased = RedisLimiter::builder("client-steps", quota())
        .clock(clock.clone())
        .hash_tag("steps")
        .mode(Mode::Leased(Leases::new()))
        .build(connection.clone())
        .unwrap();
    let exact = RedisLimiter::builder("client-steps", quota())
        .clock(clock.clone())
        .hash_tag("steps")
        .build(connection)
        .unwrap();
    assert!(runtime.block_on(leased.check("k")).unwrap().is_allowed());
    clock.set(t0 + Duration::from_millis(199));
    let burst: u32 = match how {
        TakeBurst::Checks => (0..20)
            .map(|_| u32::from(runtime.block_on(leased.check("k")).unwrap().is_allowed()))
            .sum(),
        TakeBurst::Reservation => {
            let reservation = runtime
                .block_on(leased.reserve_n("k", 10, Duration::ZERO))
                .unwrap();
            assert_eq!(reservation.delay(), Duration::ZERO);
            // Kept: its units are admitted.
            std::mem::forget(reservation);
            10
        }
        TakeBurst::CheckAll => {
            let decisions = runtime
                .block_on(check_all(&[leased.request("k", 10)]))
                .unwrap();
            assert!(decisions.is_allowed());
            10
        }
    };
    clock.set(t0 + Duration::from_millis(1));
    let after: u32 = (0..10)
        .map(|_| u32::from(runtime.block_on(leased.check("k")).unwrap().is_allowed()))
        .sum();
    assert!(
        !runtime.block_on(exact.check("k")).unwrap().is_allowed(),
        "Redis alone denies at + 1 ms"
    );
    (burst, after)
}

#[test]
fn a_client_clock_stepped_back_admits_nothing_redis_alone_denies() {
    for how in [
        TakeBurst::Checks,
        TakeBurst::Reservation,
        TakeBurst::CheckAll,
    ] {
        let (burst, after) = client_clock_steps_back(how);
        println!("{how:?}: {burst} in the burst, {after} after the step back");
        assert_eq!((burst, after), (10, 0), "{how:?}");
    }
}
