//! Quotas per check and quotas changed at runtime, on a real Redis
//! (standalone and a three-master Cluster), between instances that share
//! keys: each instance a limiter of its own, on a connection of its own,
//! all on one client clock so that the figures are exact.
//!
//! The key does not change with the quota: each value carries the stamp of
//! the quota that wrote it, and a check of a later revision carries the key
//! over by its strategy (notes/14). The differential test compares every
//! algorithm's carry with the in-process one; these tests follow one
//! service through a change on one instance, then the other.

mod support {
    #[allow(dead_code)]
    pub mod redis;
    #[allow(dead_code)]
    pub mod target;
}

use std::time::Duration;

use tollgate::algorithm::{Carry, FixedWindow, Gcra};
use tollgate::clock::ManualClock;
use tollgate::store::ChangeError;
use tollgate::{CheckError, LayoutError, Quota};
use tollgate_redis::{ConfigError, Error, Mode, RedisLimiter, Scripted, check_all};

use support::target::{Kind, Target};

/// An instant of the shared client clock, in seconds.
const T0_S: u64 = 1_000_000;

fn at(clock: &ManualClock, seconds: u64) {
    clock.set_ns((T0_S + seconds) * 1_000_000_000);
}

/// Two instances of the service `name`, each on a connection of its own.
fn instances<A: Scripted>(
    target: &Target,
    name: &str,
    quota: Quota,
    clock: &ManualClock,
) -> [RedisLimiter<A>; 2] {
    [0, 1].map(|_| {
        let connection = target.runtime.block_on(target.reconnect());
        RedisLimiter::builder(name, quota)
            .algorithm::<A>()
            .clock(clock.clone())
            .expiry_grace(Duration::from_secs(3_600))
            .build(connection)
            .expect("a valid limiter")
    })
}

/// Checks until the first denial; returns how many were admitted and the
/// denial's wait.
fn drain<A: Scripted>(target: &Target, limiter: &RedisLimiter<A>, key: &str) -> (u32, Duration) {
    for admitted in 0.. {
        let decision = target.runtime.block_on(limiter.check(key)).unwrap();
        if !decision.is_allowed() {
            return (admitted, decision.retry_after());
        }
        assert!(admitted < 1_000, "never denied");
    }
    unreachable!()
}

/// Checks `key` `times` times, each admitted.
fn admit<A: Scripted>(target: &Target, limiter: &RedisLimiter<A>, key: &str, times: u32) {
    for _ in 0..times {
        assert!(
            target
                .runtime
                .block_on(limiter.check(key))
                .unwrap()
                .is_allowed()
        );
    }
}

fn the_stamp(target: &Target, limiter: &RedisLimiter, key: &str) -> String {
    let value = target.get(&limiter.redis_key(key)).expect("a stored key");
    value
        .split_once(' ')
        .expect("a TAT and its stamp")
        .1
        .to_owned()
}

/// 3 a minute raised to 6 on instance `a` while `b` still runs the old
/// quota; then `b` is raised too. As is: keys keep the units they had
/// free. Every figure is exact.
fn a_change_on_one_instance_reaches_the_other_through_the_keys(kind: Kind) {
    let target = Target::start(kind);
    let clock = ManualClock::new();
    at(&clock, 0);
    let old = Quota::per_minute(3).unwrap();
    let new = Quota::per_minute(6).unwrap();
    let [a, b] = instances::<Gcra>(&target, "svc", old, &clock);
    // Before: alice drained by b, bob has used one unit of three.
    assert_eq!(drain(&target, &b, "alice"), (3, Duration::from_secs(20)));
    assert!(
        target
            .runtime
            .block_on(b.check("bob"))
            .unwrap()
            .is_allowed()
    );
    let key = a.redis_key("alice");
    assert_eq!(key, b.redis_key("alice"), "one key, whatever the quota");

    a.set_quota(new, Carry::AsIs).unwrap();
    assert_eq!((a.quota(), a.revision(), b.revision()), (new, 1, 0));
    // a carries alice on its first check: no unit free stays none, and the
    // wait is one new interval, 10 s, not 20.
    let denied = target.runtime.block_on(a.check("alice")).unwrap();
    assert_eq!(
        (denied.is_allowed(), denied.retry_after(), denied.limit()),
        (false, Duration::from_secs(10), 6)
    );
    assert_eq!(the_stamp(&target, &a, "alice"), "1 10000000 6");
    // b, not yet changed, reads the carried key by its own quota: a debt
    // of 60 s is a full burst of 3 at 20 s, so 20 s to wait.
    let denied = target.runtime.block_on(b.check("alice")).unwrap();
    assert_eq!(
        (denied.is_allowed(), denied.retry_after(), denied.limit()),
        (false, Duration::from_secs(20), 3)
    );
    // bob had two units free: as is, two, now of a burst of 6.
    assert_eq!(drain(&target, &a, "bob"), (2, Duration::from_secs(10)));
    // Fresh keys: each instance's own burst.
    assert_eq!(drain(&target, &a, "carol").0, 6);
    assert_eq!(drain(&target, &b, "dave").0, 3);
    // 20 s on, b admits carol by its own quota and leaves the later stamp:
    // the key is not carried back.
    at(&clock, 20);
    assert_eq!(drain(&target, &b, "carol"), (1, Duration::from_secs(20)));
    assert_eq!(the_stamp(&target, &b, "carol"), "1 10000000 6");
    let denied = target.runtime.block_on(a.check("carol")).unwrap();
    assert_eq!(denied.retry_after(), Duration::from_secs(10));

    // b is raised too: dave, drained by b 20 s ago (a debt of 40 s, one
    // unit free), is carried by b on its first check: one unit free.
    b.set_quota(new, Carry::AsIs).unwrap();
    assert_eq!(drain(&target, &b, "dave"), (1, Duration::from_secs(10)));
    assert_eq!(the_stamp(&target, &b, "dave"), "1 10000000 6");
    // And alice, carried by a already, is not carried again: a debt of
    // 60 − 20 = 40 s, two units free under 6 a minute, for either.
    assert_eq!(drain(&target, &b, "alice"), (2, Duration::from_secs(10)));
    let denied = target.runtime.block_on(a.check("alice")).unwrap();
    assert_eq!(denied.retry_after(), Duration::from_secs(10));
}

#[test]
fn a_change_on_one_instance_reaches_the_other_standalone() {
    a_change_on_one_instance_reaches_the_other_through_the_keys(Kind::Standalone);
}

#[test]
fn a_change_on_one_instance_reaches_the_other_cluster() {
    a_change_on_one_instance_reaches_the_other_through_the_keys(Kind::Cluster);
}

/// An instance started after the change declares the revision: it carries
/// keys as the instances changed at runtime do, in proportion here.
#[test]
fn an_instance_started_at_a_later_revision_carries_keys_over() {
    let target = Target::start(Kind::Standalone);
    let clock = ManualClock::new();
    at(&clock, 0);
    let [old, _] = instances::<Gcra>(&target, "svc", Quota::per_minute(4).unwrap(), &clock);
    // One unit used of four: a quarter of the burst.
    assert!(
        target
            .runtime
            .block_on(old.check("erin"))
            .unwrap()
            .is_allowed()
    );
    let connection = target.runtime.block_on(target.reconnect());
    let started = RedisLimiter::builder("svc", Quota::per_minute(8).unwrap())
        .clock(clock.clone())
        .expiry_grace(Duration::from_secs(3_600))
        .revision(1, Carry::Proportional)
        .build(connection)
        .unwrap();
    assert_eq!(started.revision(), 1);
    // In proportion: a quarter of 8 used, six units free.
    assert_eq!(
        drain(&target, &started, "erin"),
        (6, Duration::from_millis(7_500))
    );
}

/// A check carrying its own quota, from two instances: the key's state is
/// read as it stands by each quota (GCRA keeps the refill time owed).
#[test]
fn tiers_share_keys_across_instances() {
    let target = Target::start(Kind::Cluster);
    let clock = ManualClock::new();
    at(&clock, 0);
    let free = Quota::per_minute(2).unwrap();
    let pro = Quota::per_minute(100).unwrap();
    let [a, b] = instances::<Gcra>(&target, "tiers", free, &clock);
    let check_with = |limiter: &RedisLimiter, key: &str| {
        target
            .runtime
            .block_on(limiter.check_with(key, &pro))
            .unwrap()
    };
    for _ in 0..100 {
        assert!(check_with(&a, "paying").is_allowed());
    }
    let denied = check_with(&b, "paying");
    assert_eq!(
        (denied.is_allowed(), denied.limit(), denied.retry_after()),
        (false, 100, Duration::from_millis(600))
    );
    assert_eq!(the_stamp(&target, &a, "paying"), "0 600000 100");
    // The same key by the free quota: 60 s owed is a full free burst.
    let denied = target.runtime.block_on(b.check("paying")).unwrap();
    assert_eq!(
        (denied.limit(), denied.retry_after()),
        (2, Duration::from_secs(30))
    );
    // A free key: two units, then 60 s owed, which pro reads as a burst.
    assert_eq!(drain(&target, &b, "visitor"), (2, Duration::from_secs(30)));
    assert_eq!(
        check_with(&a, "visitor").retry_after(),
        Duration::from_millis(600)
    );
    // What no quota can be: a span past the script's exact range.
    let huge = Quota::new(1, Duration::from_secs(100 * 365 * 24 * 3_600)).unwrap();
    assert!(matches!(
        a.accepts(&huge),
        Err(Error::Quota(ConfigError::QuotaTooLarge { .. }))
    ));
}

/// A window algorithm counts in windows of its own length: a quota of
/// another window is refused, a quota of the same window carried.
#[test]
fn a_window_algorithm_keeps_its_window() {
    let target = Target::start(Kind::Standalone);
    let clock = ManualClock::new();
    at(&clock, 0);
    let [limiter, _] =
        instances::<FixedWindow>(&target, "windows", Quota::per_minute(10).unwrap(), &clock);
    let per_second = Quota::per_second(10).unwrap();
    let window_differs = LayoutError::WindowDiffers {
        limiter: Duration::from_secs(60),
        quota: Duration::from_secs(1),
    };
    assert!(matches!(
        limiter.set_quota(per_second, Carry::AsIs),
        Err(ConfigError::Change(ChangeError::Layout(error))) if error == window_differs
    ));
    assert!(matches!(
        target.runtime.block_on(limiter.check_with("k", &per_second)),
        Err(Error::Check(CheckError::Layout(error))) if error == window_differs
    ));
    // Seven of ten used; raised to 20 in proportion: 14 used, 6 free.
    admit(&target, &limiter, "k", 7);
    limiter
        .set_quota(Quota::per_minute(20).unwrap(), Carry::Proportional)
        .unwrap();
    assert_eq!(drain(&target, &limiter, "k"), (6, Duration::from_secs(20)));
}

/// A reservation waiting across a change keeps its slot: the time it
/// booked beyond the tolerance is carried as time. Given back after the
/// change, it is not (the key was carried since): over-denial only.
#[test]
fn a_reservation_waiting_across_a_change_keeps_its_slot() {
    let target = Target::start(Kind::Standalone);
    let clock = ManualClock::new();
    at(&clock, 0);
    let one_per_10_s = Quota::new(1, Duration::from_secs(10)).unwrap();
    let [limiter, _] = instances::<Gcra>(&target, "reserve", one_per_10_s, &clock);
    target.runtime.block_on(async {
        let first = limiter
            .reserve_n("k", 1, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(first.delay(), Duration::ZERO);
        let second = limiter
            .reserve_n("k", 1, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(second.delay(), Duration::from_secs(10));
        // Twice the rate: the key owed 20 s, 10 of them the tolerance (no
        // unit free, as is: the new tolerance, 5 s) and 10 booked.
        limiter
            .set_quota(Quota::new(1, Duration::from_secs(5)).unwrap(), Carry::AsIs)
            .unwrap();
        let denied = limiter.check("k").await.unwrap();
        assert_eq!(denied.retry_after(), Duration::from_secs(15));
        assert!(!second.cancel().await.unwrap(), "carried since");
        drop(first);
    });
    at(&clock, 15);
    assert_eq!(drain(&target, &limiter, "k"), (1, Duration::from_secs(5)));
}

/// `check_all` takes a limit's quota per request (`request_with`): a pro
/// key on a free limiter, beside a global limit, all or nothing.
#[test]
fn check_all_takes_a_tier_per_request() {
    let target = Target::start(Kind::Standalone);
    let clock = ManualClock::new();
    at(&clock, 0);
    let build = |name: &str, quota: Quota| {
        RedisLimiter::builder(name, quota)
            .hash_tag("t")
            .clock(clock.clone())
            .build(target.connection.clone())
            .unwrap()
    };
    let user = build("user", Quota::per_minute(2).unwrap());
    let global = build("global", Quota::per_minute(10).unwrap());
    let pro = Quota::per_minute(6).unwrap();
    let both = || {
        let requests = [
            user.request_with("alice", 1, &pro).unwrap(),
            global.request("all", 1),
        ];
        target.runtime.block_on(check_all(&requests)).unwrap()
    };
    let mut admitted = 0;
    let denied = loop {
        let decisions = both();
        if !decisions.is_allowed() {
            break decisions;
        }
        admitted += 1;
        assert!(admitted <= 100, "never denied");
    };
    // Pro's burst of 6, not free's 2; the denial is the tier's, 10 s.
    assert_eq!(admitted, 6);
    let tier = denied.decisions()[0];
    assert_eq!(
        (tier.is_allowed(), tier.limit(), tier.retry_after()),
        (false, 6, Duration::from_secs(10))
    );
    assert_eq!(the_stamp(&target, &user, "alice"), "0 10000000 6");
    // The global limit was charged the 6 admitted, not the denied one.
    assert_eq!(drain(&target, &global, "all"), (4, Duration::from_secs(6)));
}

/// One step of a service's traffic, for [`replay`].
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A check of the key, by the limiter's quota.
    Check(&'static str),
    /// A check of the key carrying the quota.
    With(&'static str, Quota),
    /// A change of the limiter's quota.
    Change(Quota, Carry),
    /// The shared clock moves to this many seconds.
    At(u64),
}

/// Runs `steps` on `limiter`; returns each check's decision (whether
/// admitted, its wait, its limit and what remains).
fn replay(
    target: &Target,
    limiter: &RedisLimiter,
    clock: &ManualClock,
    steps: &[Step],
) -> Vec<(bool, Duration, u32, u32)> {
    let mut decisions = Vec::new();
    for &step in steps {
        let decision = match step {
            Step::Check(key) => target.runtime.block_on(limiter.check(key)),
            Step::With(key, quota) => target.runtime.block_on(limiter.check_with(key, &quota)),
            Step::Change(quota, carry) => {
                limiter.set_quota(quota, carry).unwrap();
                continue;
            }
            Step::At(seconds) => {
                at(clock, seconds);
                continue;
            }
        }
        .unwrap();
        decisions.push((
            decision.is_allowed(),
            decision.retry_after(),
            decision.limit(),
            decision.remaining(),
        ));
    }
    decisions
}

/// The deny cache admits exactly what Redis alone admits, with checks
/// carrying their quotas and across a change: a service replayed on an
/// exact limiter and on a deny-cached one (each on keys of its own) takes
/// the same decisions, every field of them, and the deny cache asks Redis
/// less: a tier key's denials after the first are its own, and after the
/// change a key's first check asks again (its knowledge forgotten, the key
/// carried on Redis).
fn the_deny_cache_decides_as_redis_with_tiers_and_a_change(kind: Kind) {
    let target = Target::start(kind);
    let clock = ManualClock::new();
    at(&clock, 0);
    let free = Quota::per_minute(3).unwrap();
    let pro = Quota::per_minute(6).unwrap();
    let raised = Quota::per_minute(4).unwrap();
    let mut steps = vec![];
    steps.extend([Step::With("pro", pro); 8]);
    steps.extend([Step::Check("free"); 5]);
    steps.extend([Step::At(5), Step::With("pro", pro), Step::Check("free")]);
    steps.push(Step::Change(raised, Carry::AsIs));
    steps.extend([Step::Check("free"); 3]);
    steps.extend([Step::With("pro", pro); 2]);
    steps.extend([Step::At(20), Step::Check("free"), Step::Check("free")]);
    let build = |name: &str, mode: Mode| {
        let connection = target.runtime.block_on(target.reconnect());
        RedisLimiter::builder(name, free)
            .clock(clock.clone())
            .mode(mode)
            .build(connection)
            .unwrap()
    };
    let exact = build("exact", Mode::Exact);
    let cached = build("cached", Mode::DenyCached);
    let decided = replay(&target, &exact, &clock, &steps);
    at(&clock, 0);
    assert_eq!(replay(&target, &cached, &clock, &steps), decided);
    let (s, ms) = (Duration::from_secs, Duration::from_millis);
    assert_eq!(
        decided,
        [
            // pro: 6 admitted, then denied 10 s.
            vec![(true, s(0), 6, 5), (true, s(0), 6, 4), (true, s(0), 6, 3)],
            vec![(true, s(0), 6, 2), (true, s(0), 6, 1), (true, s(0), 6, 0)],
            vec![(false, s(10), 6, 0), (false, s(10), 6, 0)],
            // free: 3 admitted, then denied 20 s.
            vec![(true, s(0), 3, 2), (true, s(0), 3, 1), (true, s(0), 3, 0)],
            vec![(false, s(20), 3, 0), (false, s(20), 3, 0)],
            // At 5 s.
            vec![(false, s(5), 6, 0), (false, s(15), 3, 0)],
            // Raised to 4 (15 s intervals) as is, 5 s in: free owed 55 s of
            // 60, a quarter unit free, kept as is: 56.25 s owed of the new
            // 60, so 11.25 s to wait. Pro, a tier, is not carried (its
            // stamp is its own quota's): still 5 s.
            vec![(false, ms(11_250), 4, 0), (false, ms(11_250), 4, 0)],
            vec![(false, ms(11_250), 4, 0)],
            vec![(false, s(5), 6, 0), (false, s(5), 6, 0)],
            // At 20 s: one refilled, owing 56.25 s again.
            vec![(true, s(0), 4, 0), (false, ms(11_250), 4, 0)],
        ]
        .concat()
    );
    let checks = u64::try_from(decided.len()).unwrap();
    assert_eq!(exact.remote_calls(), checks);
    // Local denials (an admission's reply teaches the key's arrival time
    // too): pro's 7th, 8th and 9th (at 5 s); free's 4th, 5th and 6th (at
    // 5 s); after the change (which forgot both keys), every denial after
    // each key's first check, and the one after the admission at 20 s.
    assert_eq!(cached.remote_calls(), checks - 10);
}

#[test]
fn the_deny_cache_decides_as_redis_with_tiers_and_a_change_standalone() {
    the_deny_cache_decides_as_redis_with_tiers_and_a_change(Kind::Standalone);
}

#[test]
fn the_deny_cache_decides_as_redis_with_tiers_and_a_change_on_a_cluster() {
    the_deny_cache_decides_as_redis_with_tiers_and_a_change(Kind::Cluster);
}

/// Leases with checks of another quota on the same key, on a frozen clock:
/// those checks never spend the lease (they ask Redis, which decides them
/// on the same arrival time), the lease's units are spent here, and the
/// key admits what Redis alone admits under the two quotas. A change then
/// drops a lease's unspent units (Redis counted them spent): the key admits
/// that many fewer than an exact limiter does.
#[test]
fn leases_serve_their_own_quota_and_are_dropped_at_a_change() {
    let target = Target::start(Kind::Standalone);
    let clock = ManualClock::new();
    at(&clock, 0);
    // 10 a minute: 6 s intervals, a burst of 10; pro: 3 s, 20.
    let own = Quota::per_minute(10).unwrap();
    let pro = Quota::per_minute(20).unwrap();
    let build = |name: &str, mode: Mode| {
        let connection = target.runtime.block_on(target.reconnect());
        RedisLimiter::builder(name, own)
            .clock(clock.clone())
            .mode(mode)
            .build(connection)
            .unwrap()
    };
    let leased = build("leased", Mode::Leased(tollgate::remote::Leases::new()));
    let check = |key: &str| target.runtime.block_on(leased.check(key)).unwrap();
    let with = |key: &str| {
        target
            .runtime
            .block_on(leased.check_with(key, &pro))
            .unwrap()
    };

    // The first check leases 4 units beside its own (half of the 9 free,
    // as the script grants): Redis's arrival time is 5 units on, 30 s.
    assert!(check("k").is_allowed());
    assert_eq!(leased.remote_calls(), 1);
    // Pro checks ask Redis (the key's word holds the lease): 10 admitted
    // at 3 s each, from 30 s to 60 s; the 11th denied.
    for admitted in 0..10 {
        assert!(with("k").is_allowed(), "pro check {admitted}");
    }
    assert!(!with("k").is_allowed());
    assert_eq!(leased.remote_calls(), 12);
    // The lease's 4 units are spent here; the 5th check asks, and is
    // denied; after it, denials are local, pro's too.
    for spent in 0..4 {
        assert!(check("k").is_allowed(), "lease unit {spent}");
    }
    assert_eq!(leased.remote_calls(), 12);
    let denied = check("k");
    assert_eq!(
        (denied.is_allowed(), denied.retry_after()),
        (false, Duration::from_secs(6))
    );
    assert_eq!(leased.remote_calls(), 13);
    assert!(!check("k").is_allowed());
    let denied = with("k");
    assert_eq!(
        (denied.is_allowed(), denied.retry_after()),
        (false, Duration::from_secs(3))
    );
    assert_eq!(leased.remote_calls(), 13);

    // A change. Key c: 3 admitted (one on Redis, leasing 4, then two of
    // them spent), so Redis counts 5 used: as is, 5 stay free of 20.
    let exact = build("exact", Mode::Exact);
    for limiter in [&leased, &exact] {
        admit(&target, limiter, "c", 3);
    }
    assert_eq!(leased.remote_calls(), 14);
    let raised = Quota::per_minute(20).unwrap();
    leased.set_quota(raised, Carry::AsIs).unwrap();
    exact.set_quota(raised, Carry::AsIs).unwrap();
    assert_eq!((leased.quota(), leased.revision()), (raised, 1));
    // The lease's 2 units are gone: 5 admitted, where the exact limiter
    // (which counted 3 used) admits 7; each waits one new interval.
    assert_eq!(drain(&target, &leased, "c"), (5, Duration::from_secs(3)));
    assert_eq!(drain(&target, &exact, "c"), (7, Duration::from_secs(3)));
    assert_eq!(the_stamp(&target, &leased, "c"), "1 3000000 20");
}

/// A busy sliding log carried over: 9 000 units live at distinct
/// microseconds (more runs than Lua unpacks at once), 10 000 a minute
/// raised to 12 000 as is: 1 000 were free, 1 000 stay free.
#[test]
fn a_busy_log_is_carried_whole() {
    let target = Target::start(Kind::Standalone);
    let clock = ManualClock::new();
    at(&clock, 0);
    let [limiter, _] = instances::<tollgate::algorithm::SlidingWindowLog>(
        &target,
        "busy",
        Quota::per_minute(10_000).unwrap(),
        &clock,
    );
    let key = limiter.redis_key("k");
    let start_us = T0_S * 1_000_000 - 30_000_000;
    let mut runs = vec!["0 60000000 10000".to_owned()];
    runs.extend((0..9_000_u64).map(|j| format!("{} 1 {}", start_us + j, j + 1)));
    let port = target.ports()[0];
    let mut connection = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    for part in runs.chunks(1_000) {
        let _: u64 = redis::cmd("RPUSH")
            .arg(&key)
            .arg(part)
            .query(&mut connection)
            .unwrap();
    }
    limiter
        .set_quota(Quota::per_minute(12_000).unwrap(), Carry::AsIs)
        .unwrap();
    let decision = target.runtime.block_on(limiter.check("k")).unwrap();
    assert_eq!((decision.is_allowed(), decision.remaining()), (true, 999));
    // The stamp, the 9 000 runs, and one run at the check's instant for
    // the 2 000 units the raise kept used and the admission.
    let length: u64 = redis::cmd("LLEN").arg(&key).query(&mut connection).unwrap();
    assert_eq!(length, 1 + 9_000 + 1);
}

/// A change by `Unchanged` stamps the keys it reads even on a denial, so
/// that a later change carries them from the quota they were last under.
#[test]
fn an_unchanged_carry_stamps_the_key() {
    let target = Target::start(Kind::Standalone);
    let clock = ManualClock::new();
    at(&clock, 0);
    let window = Duration::from_secs(10);
    let [limiter, _] = instances::<tollgate::algorithm::SlidingWindowCounter>(
        &target,
        "stamped",
        Quota::new(100, window).unwrap(),
        &clock,
    );
    admit(&target, &limiter, "k", 50);
    // Cut to 10, unchanged: 50 counted, none free.
    limiter
        .set_quota(Quota::new(10, window).unwrap(), Carry::Unchanged)
        .unwrap();
    assert!(
        !target
            .runtime
            .block_on(limiter.check("k"))
            .unwrap()
            .is_allowed()
    );
    // Raised to 50 in proportion, from the 10 the key was last read under:
    // 50 of 10 counted is 250 of 50, at most the 50 counted: none free.
    limiter
        .set_quota(Quota::new(50, window).unwrap(), Carry::Proportional)
        .unwrap();
    let denied = target.runtime.block_on(limiter.check("k")).unwrap();
    assert_eq!((denied.is_allowed(), denied.remaining()), (false, 0));
}

/// A sliding window counter carried unchanged to another burst decides as
/// in process, also at a reading that steps back before the change: both
/// roll the counts forward to the change's instant (in process then,
/// through Redis at the key's first check after it), and keep them.
#[test]
fn an_unchanged_counter_carry_decides_as_in_process() {
    use tollgate::algorithm::SlidingWindowCounter;
    let target = Target::start(Kind::Standalone);
    let clock = ManualClock::new();
    let at_ms = |ms: u64| clock.set_ns(T0_S * 1_000_000_000 + ms * 1_000_000);
    let (from, to) = (
        Quota::new(4, Duration::from_secs(1)).unwrap(),
        Quota::new(2, Duration::from_secs(1)).unwrap(),
    );
    let [redis, _] = instances::<SlidingWindowCounter>(&target, "unchanged", from, &clock);
    let local = tollgate::Builder::new(from)
        .algorithm::<SlidingWindowCounter>()
        .clock(clock.clone())
        .build::<String>();
    let mut decisions = Vec::new();
    let mut both = |cost: u32| {
        let remote = target.runtime.block_on(redis.check_n("k", cost)).unwrap();
        let here = local.check_n("k", cost).unwrap();
        assert_eq!(remote, here, "cost {cost}");
        decisions.push((remote.is_allowed(), remote.retry_after()));
    };
    // Two units in one window, two in the next; changed in the one after
    // (the key is checked then, so that Redis carries it at that instant
    // as the limiter in process does); then a reading back before it.
    at_ms(500);
    both(2);
    at_ms(1_100);
    both(2);
    at_ms(2_050);
    redis.set_quota(to, Carry::Unchanged).unwrap();
    local.set_quota(to, Carry::Unchanged).unwrap();
    both(1);
    at_ms(1_500);
    both(1);
    at_ms(2_600);
    both(1);
    assert_eq!(
        decisions,
        [
            (true, Duration::ZERO),
            (true, Duration::ZERO),
            (false, Duration::from_millis(450)),
            (false, Duration::from_millis(500)),
            (true, Duration::ZERO),
        ]
    );
}
