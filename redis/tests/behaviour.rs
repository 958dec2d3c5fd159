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
use tollgate_redis::{Error, RedisLimiter, Scripted, check_all};

use support::redis::command;
use support::target::{Kind, Target};

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

#[test]
fn a_flushed_script_cache_reaches_no_caller_standalone() {
    script_flush_mid_run(Kind::Standalone);
}

#[test]
fn a_flushed_script_cache_reaches_no_caller_cluster() {
    script_flush_mid_run(Kind::Cluster);
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
    let error = target
        .runtime
        .block_on(check_all(&[
            per_user.request("carol", 1),
            per_ip.request("x", 6),
        ]))
        .unwrap_err();
    assert!(matches!(error, Error::Check(_)), "{error}");
    let carol = target.runtime.block_on(per_user.peek("carol")).unwrap();
    assert_eq!(carol.remaining(), 2);
    // One key twice would be charged once for two admissions: refused.
    let error = target
        .runtime
        .block_on(check_all(&[
            per_user.request("erin", 1),
            per_user.request("erin", 1),
        ]))
        .unwrap_err();
    assert!(matches!(error, Error::SameKeyTwice), "{error}");
    let erin = target.runtime.block_on(per_user.peek("erin")).unwrap();
    assert_eq!(erin.remaining(), 2, "nothing charged");
    // Limits in different slots cannot be decided together.
    let spread = RedisLimiter::builder("spread", Quota::per_hour(5).unwrap())
        .build(target.connection.clone())
        .unwrap();
    let error = target
        .runtime
        .block_on(check_all(&[
            per_user.request("dave", 1),
            spread.request("dave", 1),
        ]))
        .unwrap_err();
    assert!(matches!(error, Error::Apart), "{error}");
}

#[test]
fn limits_checked_together_are_all_or_nothing_standalone() {
    limits_together(Kind::Standalone);
}

#[test]
fn limits_checked_together_are_all_or_nothing_cluster() {
    limits_together(Kind::Cluster);
}

/// After an admission the key expires when it would decide as a fresh key:
/// its PTTL is the rest time in milliseconds, rounded up.
fn expires<A: Scripted>(target: &Target, quota: Quota, rest: Duration) {
    let limiter = RedisLimiter::builder(format!("expiry-{}", A::CODE), quota)
        .algorithm::<A>()
        .build(target.connection.clone())
        .unwrap();
    assert!(
        target
            .runtime
            .block_on(limiter.check("k"))
            .unwrap()
            .is_allowed()
    );
    let key = limiter.redis_key("k");
    let port = target.ports()[0];
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query(&mut redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap())
        .unwrap();
    let rest_ms = i64::try_from(rest.as_millis()).unwrap();
    assert!(
        pttl > rest_ms - 1_000 && pttl <= rest_ms,
        "{}: PTTL {pttl} ms against a rest of {rest_ms} ms",
        A::CODE
    );
}

#[test]
fn every_key_expires_when_it_would_be_fresh() {
    let target = Target::start(Kind::Standalone);
    let quota = Quota::per_minute(60).unwrap();
    // One unit of a 1-a-second quota: rested in 1 s.
    expires::<Gcra>(&target, quota, Duration::from_secs(1));
    expires::<TokenBucket>(&target, quota, Duration::from_secs(1));
    // The window algorithms: at the window's end (fixed) or once the
    // count has slid out (within two windows; the log: one window).
    expires::<SlidingWindowLog>(&target, quota, Duration::from_secs(60));
    let window = Quota::new(60, Duration::from_secs(3_600)).unwrap();
    let limiter = RedisLimiter::builder("expiry-window", window)
        .algorithm::<FixedWindow>()
        .build(target.connection.clone())
        .unwrap();
    let decision = target.runtime.block_on(limiter.check("k")).unwrap();
    // The fixed window's key lives exactly until the window ends, which the
    // decision's reset_after reports.
    let port = target.ports()[0];
    let mut connection = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let pttl: u64 = redis::cmd("PTTL")
        .arg(limiter.redis_key("k"))
        .query(&mut connection)
        .unwrap();
    let reset_ms = u64::try_from(decision.reset_after().as_millis()).unwrap();
    assert!(
        pttl <= reset_ms + 1 && pttl + 1_000 > reset_ms,
        "{pttl} vs {reset_ms}"
    );
    let limiter = RedisLimiter::builder("expiry-counter", window)
        .algorithm::<SlidingWindowCounter>()
        .build(target.connection.clone())
        .unwrap();
    let decision = target.runtime.block_on(limiter.check("k")).unwrap();
    let pttl: u64 = redis::cmd("PTTL")
        .arg(limiter.redis_key("k"))
        .query(&mut connection)
        .unwrap();
    let reset_ms = u64::try_from(decision.reset_after().as_millis()).unwrap();
    assert!(
        pttl <= reset_ms + 1 && pttl + 1_000 > reset_ms,
        "{pttl} vs {reset_ms}"
    );
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
