//! The Redis limiter's own promises, on real servers: the script cache may
//! be flushed under it, limits checked together are all or nothing, keys
//! carry their expiry, and attacker-chosen key bytes neither collide,
//! escape the prefix nor choose a Cluster slot.

mod support {
    #[allow(dead_code)]
    pub mod redis;
    #[allow(dead_code)]
    pub mod target;
}

use std::time::Duration;

use tollgate::Quota;
use tollgate::algorithm::{FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket};
use tollgate::clock::ManualClock;
use tollgate_redis::{Error, RedisLimiter, Request, Scripted, check_all};

use support::redis::command;
use support::target::{Kind, Target};

/// A test module per scenario, with a test on a standalone server and one
/// on a three-master Cluster.
macro_rules! on_both_deployments {
    ($($test:ident: $scenario:ident,)*) => {$(
        mod $test {
            use super::{$scenario, Kind};

            #[test]
            fn standalone() {
                $scenario(Kind::Standalone);
            }

            #[test]
            fn cluster() {
                $scenario(Kind::Cluster);
            }
        }
    )*};
}

on_both_deployments! {
    reservations_of_two_instances_take_consecutive_slots: reservations_in_order,
    a_reservation_is_given_back_only_when_last: reservations_given_back,
    waiters_on_the_servers_clock_are_admitted_at_the_rate: waiters_at_the_rate,
    a_flushed_script_cache_reaches_no_caller: script_flush_mid_run,
    limits_checked_together_are_all_or_nothing: limits_together,
}

fn flush_scripts(target: &Target) {
    for &port in target.ports() {
        assert_eq!(command(port, &["SCRIPT", "FLUSH"]).unwrap().trim(), "+OK");
    }
}

fn script_flush_mid_run(kind: Kind) {
    let target = Target::start(kind);
    let limiter = RedisLimiter::builder("flush", Quota::per_hour(150).unwrap())
        .build(target.connection.clone())
        .unwrap();
    let mut admitted = 0;
    for check in 0..200 {
        if check % 50 == 25 {
            flush_scripts(&target);
        }
        let decision = target
            .runtime
            .block_on(limiter.check(format!("user-{}", check % 2)))
            .expect("a flushed script cache is no error");
        admitted += u32::from(decision.is_allowed());
    }
    assert_eq!(admitted, 200, "two keys of 150 each, 100 checks each");
    for _ in 0..3 {
        flush_scripts(&target);
        let decision = target
            .runtime
            .block_on(limiter.check_n("user-0", 50))
            .unwrap();
        assert_eq!(decision.remaining(), 0);
    }
    let decision = target.runtime.block_on(limiter.check("user-0")).unwrap();
    assert!(!decision.is_allowed());
}

fn limits_together(kind: Kind) {
    let target = Target::start(kind);
    let per_user = RedisLimiter::builder("user", Quota::per_hour(3).unwrap())
        .hash_tag("request")
        .build(target.connection.clone())
        .unwrap();
    let per_ip = RedisLimiter::builder("ip", Quota::per_hour(5).unwrap())
        .algorithm::<FixedWindow>()
        .hash_tag("request")
        .build(target.connection.clone())
        .unwrap();
    let both = |user: &str, ip: &str| {
        target
            .runtime
            .block_on(check_all(&[
                per_user.request(user, 1),
                per_ip.request(ip, 1),
            ]))
            .unwrap()
    };
    let refused =
        |requests: &[Request<'_>]| target.runtime.block_on(check_all(requests)).unwrap_err();
    // alice from one address: her limit of 3 binds first.
    for _ in 0..3 {
        assert!(both("alice", "198.51.100.1").is_allowed());
    }
    let denied = both("alice", "198.51.100.1");
    assert!(!denied.is_allowed());
    assert!(!denied.decisions()[0].is_allowed());
    assert!(denied.decisions()[1].is_allowed(), "the address had room");
    assert_eq!(denied.binding(), Some(&denied.decisions()[0]));
    // Nothing was charged to the address by the denied request: 2 left.
    for _ in 0..2 {
        assert!(both("bob", "198.51.100.1").is_allowed());
    }
    let denied = both("bob", "198.51.100.1");
    assert!(!denied.is_allowed());
    assert!(denied.decisions()[0].is_allowed(), "bob had room");
    // ...and bob was charged only for his two admitted requests.
    let bob = target.runtime.block_on(per_user.peek("bob")).unwrap();
    assert_eq!(
        bob.remaining(),
        0,
        "one left to take: peek reports after it"
    );
    assert!(bob.is_allowed());
    // An invalid cost anywhere: an error, nothing sent, nothing charged.
    let error = refused(&[per_user.request("carol", 1), per_ip.request("x", 6)]);
    assert!(matches!(error, Error::Check(_)), "{error}");
    let carol = target.runtime.block_on(per_user.peek("carol")).unwrap();
    assert_eq!(carol.remaining(), 2);
    // One key twice would be charged once for two admissions: refused.
    let error = refused(&[per_user.request("erin", 1), per_user.request("erin", 1)]);
    assert!(matches!(error, Error::SameKeyTwice), "{error}");
    let erin = target.runtime.block_on(per_user.peek("erin")).unwrap();
    assert_eq!(erin.remaining(), 2, "nothing charged");
    // Limits in different slots cannot be decided together, nor limits on
    // another connection (perhaps another server) under the same tag.
    let spread = RedisLimiter::builder("spread", Quota::per_hour(5).unwrap())
        .build(target.connection.clone())
        .unwrap();
    let far = RedisLimiter::builder("far", Quota::per_hour(5).unwrap())
        .hash_tag("request")
        .build(target.runtime.block_on(target.reconnect()))
        .unwrap();
    for other in [&spread, &far] {
        let error = refused(&[per_user.request("dave", 1), other.request("dave", 1)]);
        assert!(matches!(error, Error::Apart), "{error}");
    }
    // Limiters on different clocks: each limit is decided at its own
    // limiter's time. A client clock at 1 000 s stores a TAT of 1 000 s and
    // one interval, whatever the server's time.
    let clock = ManualClock::new();
    clock.set_ns(1_000_000_000_000);
    let clocked = RedisLimiter::builder("clocked", Quota::per_second(4).unwrap())
        .hash_tag("request")
        .clock(clock)
        .build(target.connection.clone())
        .unwrap();
    // Both orders: the server-time limiter first, and the clocked one.
    for (key, clocked_first) in [("grace", false), ("heidi", true)] {
        let mut requests = vec![per_user.request(key, 1), clocked.request(key, 1)];
        if clocked_first {
            requests.reverse();
        }
        let both = target.runtime.block_on(check_all(&requests)).unwrap();
        assert!(both.is_allowed());
        assert_eq!(
            target.get(&clocked.redis_key(key)).as_deref(),
            Some("1000250000 0 250000 4"),
            "µs: the clock's now plus 1/4 s, stamped with revision 0 and the quota"
        );
        let server_tat: u64 = target
            .get(&per_user.redis_key(key))
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let since_epoch_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        // Decided at the server's time (this machine's clock): a TAT about
        // 20 minutes (one unit of 3 an hour) from now, not from 1 000 s.
        assert!(
            server_tat.abs_diff(since_epoch_us + 1_200_000_000) < 60_000_000,
            "{server_tat}"
        );
    }
}

fn pttl(target: &Target, key: &[u8]) -> i64 {
    let port = target.ports()[0];
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap())
        .unwrap()
}

/// After each admission the key expires exactly when it would decide as a
/// fresh key, on the clock that decided it, also when that clock stepped
/// back behind the stored state: the PTTL is the time until then, in
/// milliseconds rounded up, plus one (PX counts from a millisecond clock).
/// The expected figures are worked out by hand for 10 per 10 s (interval
/// 1 s, window 10 s): a first unit at 105 s, a second after the clock
/// stepped back to `back_s`. An expiry grace adds itself to both.
fn expires<A: Scripted>(
    target: &Target,
    grace_ms: u64,
    back_s: u64,
    first_ms: i64,
    second_ms: i64,
) {
    let clock = ManualClock::new();
    clock.set_ns(105_000_000_000);
    let limiter = RedisLimiter::builder(
        format!("expiry-{}-{grace_ms}", A::CODE),
        Quota::new(10, Duration::from_secs(10)).unwrap(),
    )
    .algorithm::<A>()
    .clock(clock.clone())
    .expiry_grace(Duration::from_millis(grace_ms))
    .build(target.connection.clone())
    .unwrap();
    let grace_ms = grace_ms as i64;
    let (first_ms, second_ms) = (first_ms + grace_ms, second_ms + grace_ms);
    let key = limiter.redis_key("k");
    for (now_s, expected_ms) in [(105, first_ms), (back_s, second_ms)] {
        clock.set_ns(now_s * 1_000_000_000);
        assert!(
            target
                .runtime
                .block_on(limiter.check("k"))
                .unwrap()
                .is_allowed()
        );
        // Real time passes between the script and PTTL: a few ms at most.
        let pttl = pttl(target, &key);
        assert!(
            pttl <= expected_ms && pttl > expected_ms - 250,
            "{} at {now_s} s: PTTL {pttl} ms, fresh in {expected_ms} ms",
            A::CODE
        );
    }
}

#[test]
fn every_key_expires_when_it_would_be_fresh() {
    let target = Target::start(Kind::Standalone);
    // GCRA: TAT 106 s; at 97 s the debt is 9 s, one more unit fits and
    // moves the TAT to 107 s.
    expires::<Gcra>(&target, 0, 97, 1_001, 10_001);
    // Token bucket: 1 s owed at 105 s; a reading at 91 s is read as 105 s,
    // 2 s owed: fresh at 107 s, 16 s after 91 s.
    expires::<TokenBucket>(&target, 0, 91, 1_001, 16_001);
    // Fixed window: window [100, 110); 91 s reads as its first instant.
    expires::<FixedWindow>(&target, 0, 91, 5_001, 19_001);
    // Counter: its count slides out at the end of the next window, 120 s.
    expires::<SlidingWindowCounter>(&target, 0, 91, 15_001, 29_001);
    // Log: the units of 105 s leave at 115 s.
    expires::<SlidingWindowLog>(&target, 0, 91, 10_001, 24_001);
    // With a grace of 5 s (for a client clock that may lag the server's).
    expires::<Gcra>(&target, 5_000, 97, 1_001, 10_001);
    expires::<SlidingWindowLog>(&target, 5_000, 91, 10_001, 24_001);
}

/// The default clock is the server's `TIME` in microseconds: a denial's
/// wait is the exact rest of the interval (a server time read in seconds
/// or milliseconds would report the whole interval), and a retry after it
/// is admitted.
#[test]
fn server_time_gives_actionable_waits() {
    let target = Target::start(Kind::Standalone);
    let interval = Duration::from_millis(100);
    let limiter = RedisLimiter::builder("server-time", Quota::new(5, 5 * interval).unwrap())
        .build(target.connection.clone())
        .unwrap();
    for _ in 0..5 {
        assert!(
            target
                .runtime
                .block_on(limiter.check("k"))
                .unwrap()
                .is_allowed()
        );
    }
    let denied = target.runtime.block_on(limiter.check("k")).unwrap();
    let wait = denied.retry_after();
    assert!(
        !denied.is_allowed() && wait > Duration::ZERO && wait < interval,
        "{denied:?}"
    );
    assert_eq!(wait.subsec_nanos() % 1_000, 0, "whole microseconds");
    std::thread::sleep(wait);
    assert!(
        target
            .runtime
            .block_on(limiter.check("k"))
            .unwrap()
            .is_allowed()
    );
}

/// A `SCAN` with a limiter's pattern finds its keys and no other's, even a
/// key another limiter was given to look like them.
#[test]
fn the_key_pattern_matches_only_the_limiters_keys() {
    let target = Target::start(Kind::Standalone);
    let quota = Quota::per_hour(5).unwrap();
    let victim = RedisLimiter::builder("victim", quota)
        .build(target.connection.clone())
        .unwrap();
    let other = RedisLimiter::builder("o", quota)
        .build(target.connection.clone())
        .unwrap();
    let victim_key = victim.redis_key("k");
    let tag_end = victim_key.iter().position(|&b| b == b'}').unwrap();
    // "}<victim's scope>z": with a `{*}` pattern the other key would match.
    let mut crafted = victim_key[tag_end..victim_key.len() - 1].to_vec();
    crafted.push(b'z');
    for (limiter, key) in [(&victim, b"k".as_slice()), (&other, crafted.as_slice())] {
        assert!(
            target
                .runtime
                .block_on(limiter.check(key))
                .unwrap()
                .is_allowed()
        );
    }
    assert_eq!(target.count_keys(&victim.key_pattern()), 1);
    assert_eq!(target.count_keys(&other.key_pattern()), 1);
}

#[test]
fn attacker_chosen_keys_stay_in_their_place() {
    let target = Target::start(Kind::Cluster);
    let quota = Quota::per_hour(2).unwrap();
    let build = |name: &str| {
        RedisLimiter::builder(name, quota)
            .prefix("app:")
            .build(target.connection.clone())
            .unwrap()
    };
    let short = build("a");
    let long = build("a:b");
    // (name "a", key "b:c") and (name "a:b", key "c"): one string if names
    // and keys were joined with ':', two counters here.
    let drain = |limiter: &RedisLimiter, key: &str| {
        (0..5)
            .filter(|_| {
                target
                    .runtime
                    .block_on(limiter.check(key))
                    .unwrap()
                    .is_allowed()
            })
            .count()
    };
    assert_eq!(drain(&short, "b:c"), 2);
    assert_eq!(drain(&long, "c"), 2);
    // Keys full of braces, separators, glob characters and bytes that are
    // not UTF-8 each get their own counter, under the prefix, in the slot
    // of the crate's tag.
    let port = target.ports()[0];
    let mut connection = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let hostile: Vec<Vec<u8>> = vec![
        b"{x}".to_vec(),
        b"{x}1".to_vec(),
        b"}{".to_vec(),
        b"*".to_vec(),
        b"..\\..".to_vec(),
        vec![0, 255, b'{', b'}', b'\n'],
        b"".to_vec(),
    ];
    let mut slots = std::collections::HashSet::new();
    for key in &hostile {
        let admitted = (0..3)
            .filter(|_| {
                target
                    .runtime
                    .block_on(short.check(key))
                    .unwrap()
                    .is_allowed()
            })
            .count();
        assert_eq!(admitted, 2, "key {key:?}");
        let redis_key = short.redis_key(key);
        assert!(redis_key.starts_with(b"app:{"), "{redis_key:?}");
        let tag_end = redis_key.iter().position(|&b| b == b'}').unwrap();
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&redis_key)
            .query(&mut connection)
            .unwrap();
        let tag_slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&redis_key[5..tag_end])
            .query(&mut connection)
            .unwrap();
        assert_eq!(
            slot, tag_slot,
            "the crate's tag chooses the slot of {key:?}"
        );
        slots.insert(slot);
    }
    assert!(slots.len() > 1, "keys spread over slots: {slots:?}");
    // A brace in the prefix is refused.
    let error = RedisLimiter::builder("a", quota)
        .prefix("app{x}:")
        .build(target.connection.clone())
        .unwrap_err();
    assert!(error.to_string().contains("key prefix"), "{error}");
}

/// Calls of `command` on the server since its statistics were reset.
fn calls(port: u16, command: &str) -> u64 {
    let info = support::redis::command(port, &["INFO", "commandstats"]).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

/// The sliding log finds its first live run and the run a denial waits
/// for by binary search: a check on a list of 100 000 runs reads a few
/// dozen runs, whether half of them or all have left the window, and a
/// peek repeats nothing an admission would have trimmed.
#[test]
fn the_sliding_log_reads_logarithmically_many_runs() {
    let target = Target::start(Kind::Standalone);
    let port = target.ports()[0];
    let window_us: u64 = 1_000_000_000;
    let clock = ManualClock::new();
    let limiter = target.limiter::<SlidingWindowLog>(
        Quota::new(200_000, Duration::from_micros(window_us)).unwrap(),
        clock.clone(),
    );
    // The stamp (revision 0, the window, the burst), then 100 000 runs of
    // one unit, 1 ms apart, as the script writes them.
    let start_us: u64 = 1_000_000_000_000;
    let key = limiter.redis_key("k");
    let mut connection = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    let stamp = format!("0 {window_us} 200000");
    let _: u64 = redis::cmd("RPUSH")
        .arg(&key)
        .arg(&stamp)
        .query(&mut connection)
        .unwrap();
    for chunk in (0..100_000_u64).collect::<Vec<_>>().chunks(1_000) {
        let runs: Vec<String> = chunk
            .iter()
            .map(|j| format!("{} 1 {}", start_us + j * 1_000, j + 1))
            .collect();
        let _: u64 = redis::cmd("RPUSH")
            .arg(&key)
            .arg(runs)
            .query(&mut connection)
            .unwrap();
    }
    // Runs read: by LINDEX only (a walk with LRANGE reads whole chunks),
    // less the stamp's.
    let reads = || {
        assert_eq!(calls(port, "lrange"), 0);
        calls(port, "lindex") - 1
    };
    let reset = || {
        assert_eq!(
            support::redis::command(port, &["CONFIG", "RESETSTAT"])
                .unwrap()
                .trim(),
            "+OK"
        );
    };
    // Runs 0..=50 000 have left: 49 999 units live.
    clock.set_ns((start_us + window_us + 50_000 * 1_000) * 1_000);
    reset();
    let peeked = target.runtime.block_on(limiter.peek("k")).unwrap();
    assert_eq!(peeked.remaining(), 200_000 - 49_999 - 1);
    assert!(reads() <= 20, "{} runs read for a peek", reads());
    // One unit more than fits: the wait is until run 50 001 leaves, 1 ms.
    reset();
    let denied = target
        .runtime
        .block_on(limiter.check_n("k", 200_000 - 49_999 + 1))
        .unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(denied.retry_after(), Duration::from_millis(1));
    assert!(reads() <= 40, "{} runs read for a denial", reads());
    // An admission trims what left, in one command.
    let mut admit_and_count = || {
        let decision = target.runtime.block_on(limiter.check("k")).unwrap();
        assert!(decision.is_allowed());
        redis::cmd("LLEN")
            .arg(&key)
            .query::<u64>(&mut connection)
            .unwrap()
    };
    assert_eq!(
        admit_and_count(),
        1 + 49_999 + 1,
        "the stamp and the live runs"
    );
    // Everything left: the newest run says so, nothing else is read.
    clock.set_ns((start_us + 2 * window_us + 100_000 * 1_000) * 1_000);
    reset();
    let peeked = target.runtime.block_on(limiter.peek("k")).unwrap();
    assert_eq!(peeked.remaining(), 200_000 - 1);
    assert_eq!(reads(), 1, "the newest run only");
    assert_eq!(admit_and_count(), 2);
    // Lists in another layout (runs without their cumulative count; older
    // runs without it behind a newest run with three numbers; runs without
    // a stamp, as the previous layout wrote them, whose first run reads as
    // a stamp of another window) are refused, never read as something they
    // are not.
    let now_us = start_us + 2 * window_us + 100_000 * 1_000;
    let older = format!("{} 1", now_us - 10);
    let newest = format!("{} 1 2", now_us - 5);
    let unstamped = format!("{} 1 1", now_us - 5);
    for (key, runs, error) in [
        ("old", vec![&stamp, "1000 5"], "not a sliding log"),
        ("mixed", vec![&stamp, &older, &newest], "not a sliding log"),
        ("unstamped", vec![&unstamped], "windows of another length"),
    ] {
        let _: u64 = redis::cmd("RPUSH")
            .arg(limiter.redis_key(key))
            .arg(runs)
            .query(&mut connection)
            .unwrap();
        match target.runtime.block_on(limiter.check(key)) {
            Err(Error::Script(refused)) => {
                assert!(refused.to_string().contains(error), "{refused}");
            }
            other => panic!("{key}: {other:?}"),
        }
    }
}

/// The published script checks the cost itself: called directly with a
/// cost of zero or above the burst, it refuses, for every algorithm.
#[test]
fn the_script_refuses_a_cost_outside_one_to_the_burst() {
    let target = Target::start(Kind::Standalone);
    let port = target.ports()[0];
    let mut connection = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    for code in ["g", "t", "f", "c", "l"] {
        for cost in ["0", "3"] {
            let error = redis::Script::new(tollgate_redis::SCRIPT)
                .key("direct")
                .arg("0")
                .arg("")
                .arg(code)
                .arg(cost)
                .arg(1_000_000)
                .arg(2)
                .invoke::<Vec<i64>>(&mut connection)
                .unwrap_err();
            assert!(
                error
                    .to_string()
                    .contains("the cost must be 1 to the burst"),
                "{code} {cost}: {error}"
            );
        }
    }
}

/// A user clock that panics (the only user code a Redis check runs: keys
/// are bytes, encoded once, so no user `Hash` or interior mutability is
/// ever consulted) panics before anything is sent: nothing is charged, the
/// breaker is untouched, and the limiter works on after it, for single
/// checks and for limits checked together.
#[test]
fn a_panicking_clock_charges_nothing() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Flaky {
        panic_next: Arc<AtomicBool>,
    }
    impl tollgate::clock::Clock for Flaky {
        fn now_ns(&self) -> u64 {
            assert!(
                !self.panic_next.swap(false, Ordering::Relaxed),
                "the user's clock panics"
            );
            1_000_000_000_000
        }
    }

    let target = Target::start(Kind::Standalone);
    let panic_next = Arc::new(AtomicBool::new(false));
    let limiter = RedisLimiter::builder("flaky", Quota::per_hour(3).unwrap())
        .hash_tag("flaky")
        .clock(Flaky {
            panic_next: Arc::clone(&panic_next),
        })
        .build(target.connection.clone())
        .unwrap();
    let other = RedisLimiter::builder("steady", Quota::per_hour(3).unwrap())
        .hash_tag("flaky")
        .build(target.connection.clone())
        .unwrap();
    assert!(
        target
            .runtime
            .block_on(limiter.check("k"))
            .unwrap()
            .is_allowed()
    );
    panic_next.store(true, Ordering::Relaxed);
    let single = catch_unwind(AssertUnwindSafe(|| {
        target.runtime.block_on(limiter.check("k"))
    }));
    assert!(single.is_err(), "the clock's panic reaches the caller");
    panic_next.store(true, Ordering::Relaxed);
    let together = catch_unwind(AssertUnwindSafe(|| {
        target
            .runtime
            .block_on(check_all(&[other.request("k", 1), limiter.request("k", 1)]))
    }));
    assert!(together.is_err());
    // One unit charged to each limiter's key so far, or none: nothing from
    // the panicking calls.
    let peeked = target.runtime.block_on(limiter.peek("k")).unwrap();
    assert_eq!(peeked.remaining(), 1, "two left, peek reports after one");
    let peeked = target.runtime.block_on(other.peek("k")).unwrap();
    assert_eq!(peeked.remaining(), 2, "three left, peek reports after one");
}

/// 50 a second (one every 20 ms) in bursts of 2, on a frozen client clock:
/// every wait is exact.
fn waiting_quota() -> Quota {
    Quota::per_second(50).unwrap().with_burst(2).unwrap()
}

const SLOT: Duration = Duration::from_millis(20);

/// Two instances (two limiters of one name, on two connections) reserve
/// in turn on one drained key: each reservation takes the next slot after
/// every one made before it, whichever instance made it; one beyond the
/// maximum wait is refused, exactly, reserving nothing.
fn reservations_in_order(kind: Kind) {
    let target = Target::start(kind);
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(1_000));
    target.runtime.block_on(async {
        let instance = |connection| {
            RedisLimiter::builder("in-order", waiting_quota())
                .clock(clock.clone())
                .expiry_grace(Duration::from_secs(3_600))
                .build(connection)
                .unwrap()
        };
        let first = instance(target.connection.clone());
        let second = instance(target.reconnect().await);
        assert_eq!(first.redis_key("k"), second.redis_key("k"));
        for _ in 0..2 {
            assert!(first.check("k").await.unwrap().is_allowed());
        }
        let mut held = Vec::new();
        for k in 1..=10u32 {
            let instance = if k % 2 == 0 { &first } else { &second };
            let reservation = instance
                .reserve_n("k", 1, Duration::from_secs(1))
                .await
                .unwrap();
            assert_eq!(reservation.delay(), SLOT * k, "reservation {k}");
            assert!(reservation.wait() <= SLOT * k);
            assert_eq!(reservation.decision().remaining(), 0);
            held.push(reservation);
        }
        match first.reserve_n("k", 1, Duration::from_millis(100)).await {
            Err(Error::Wait(tollgate::wait::WaitError::TooLong { wait, max_wait })) => {
                assert_eq!((wait, max_wait), (SLOT * 11, Duration::from_millis(100)));
            }
            other => panic!("{other:?}"),
        }
        // Nothing reserved by the refusal: the next slot is the 11th.
        let next = second
            .reserve_n("k", 1, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(next.delay(), SLOT * 11);
        // Costs outside one to the burst are refused before any round trip.
        assert!(matches!(
            first.reserve_n("k", 3, Duration::from_secs(1)).await,
            Err(Error::Check(tollgate::CheckError::InsufficientCapacity {
                cost: 3,
                capacity: 2
            }))
        ));
        // Kept: the test ends with every reservation held to its end.
        for reservation in held {
            std::mem::forget(reservation);
        }
        std::mem::forget(next);
    });
}

/// A reservation no one reserved after is given back (by `cancel`, and
/// by being dropped), one that others followed is kept.
fn reservations_given_back(kind: Kind) {
    let target = Target::start(kind);
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(1_000));
    let limiter = target.limiter::<Gcra>(waiting_quota(), clock.clone());
    target.runtime.block_on(async {
        for _ in 0..2 {
            assert!(limiter.check("k").await.unwrap().is_allowed());
        }
        let one = limiter
            .reserve_n("k", 1, Duration::from_secs(1))
            .await
            .unwrap();
        let two = limiter
            .reserve_n("k", 1, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(!one.cancel().await.unwrap(), "two came after one: kept");
        assert!(two.cancel().await.unwrap(), "the last is given back");
        // One kept, two given back: the next reservation takes two's slot.
        let three = limiter
            .reserve_n("k", 1, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(three.delay(), SLOT * 2);
        // Dropped: given back from a task of its own.
        drop(three);
        let mut given_back = false;
        for _ in 0..200 {
            let denied = limiter.peek("k").await.unwrap();
            if denied.retry_after() == SLOT * 2 {
                given_back = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(given_back, "the dropped reservation was not given back");
    });
}

/// Thirty waiters from two instances on one key, on the server's clock and
/// a real timer: each is admitted, and no sooner than the quota allows:
/// 30 units at one every 20 ms after a burst of 2 take at least 28 slots.
fn waiters_at_the_rate(kind: Kind) {
    let target = Target::start(kind);
    target.runtime.block_on(async {
        let name = format!("waiters-{}", std::process::id());
        let build = |connection| {
            RedisLimiter::builder(name.clone(), waiting_quota())
                .build(connection)
                .unwrap()
        };
        let first = std::sync::Arc::new(build(target.connection.clone()));
        let second = std::sync::Arc::new(build(target.reconnect().await));
        let started = std::time::Instant::now();
        let waiters: Vec<_> = (0..30)
            .map(|k| {
                let limiter = std::sync::Arc::clone(if k % 2 == 0 { &first } else { &second });
                tokio::spawn(async move {
                    limiter
                        .until_ready("hot", Duration::from_secs(5))
                        .await
                        .unwrap()
                })
            })
            .collect();
        for waiter in waiters {
            assert!(waiter.await.unwrap().is_allowed());
        }
        assert!(started.elapsed() >= SLOT * 28, "{:?}", started.elapsed());
    });
}

/// On a client clock, a key must outlive readings that reach the server
/// behind the one that wrote it: a clock stepped back (written at
/// 100.900 s, read at 100.200 s, in the same window) or a call delayed in
/// flight (written and read at 100.999 s, the second arriving 300 ms
/// later). With the default grace the Redis limiter decides as the
/// in-process one; with none, the key has expired on the server's clock
/// while the client's still counts it, and 11 units pass a burst of 10.
#[test]
fn a_key_outlives_a_client_reading_that_reaches_the_server_late() {
    let target = Target::start(Kind::Standalone);
    let quota = Quota::new(10, Duration::from_secs(1)).unwrap();
    for (case, (write_ms, read_ms)) in [(100_900_u64, 100_200_u64), (100_999, 100_999)]
        .into_iter()
        .enumerate()
    {
        for grace in [None, Some(Duration::ZERO)] {
            let clock = ManualClock::new();
            let reference = tollgate::Builder::new(quota)
                .algorithm::<FixedWindow>()
                .clock(clock.clone())
                .build::<u8>();
            let builder = RedisLimiter::builder(format!("late-{case}-{grace:?}"), quota)
                .algorithm::<FixedWindow>()
                .clock(clock.clone());
            let limiter = match grace {
                Some(grace) => builder.expiry_grace(grace),
                None => builder,
            }
            .build(target.connection.clone())
            .unwrap();
            clock.set_ns(write_ms * 1_000_000);
            assert_eq!(
                target.runtime.block_on(limiter.check_n([0_u8], 5)).unwrap(),
                reference.check_n(&0, 5).unwrap()
            );
            // Longer than the key's expiry without a grace (101 ms and
            // 2 ms), shorter than the default grace.
            std::thread::sleep(Duration::from_millis(300));
            clock.set_ns(read_ms * 1_000_000);
            let expected = reference.check_n(&0, 6).unwrap();
            assert!(!expected.is_allowed());
            assert_eq!(expected.remaining(), 5);
            let actual = target.runtime.block_on(limiter.check_n([0_u8], 6)).unwrap();
            if grace.is_some() {
                assert!(actual.is_allowed(), "case {case}: {actual:?}");
                assert_eq!(actual.remaining(), 4, "case {case}");
            } else {
                assert_eq!(actual, expected, "case {case}");
            }
        }
    }
}
