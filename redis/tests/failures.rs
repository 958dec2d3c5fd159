//! Real faults: a killed and restarted `redis-server`, `CLIENT PAUSE` past
//! the call timeout, a wrong password, an ACL user without the rights.
//! Every outcome is a typed result; the breaker keeps a dead Redis from
//! costing a timeout a check; recovery needs nothing from the caller.

mod support {
    #[allow(dead_code)]
    pub mod redis;
}

use std::time::Duration;

use tollgate::Quota;
use tollgate_redis::{Connection, Error, OnFailure, Options, RedisLimiter, Unavailable};

use support::redis::{RedisCluster, RedisServer, command};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn url(server: &RedisServer) -> String {
    format!("redis://127.0.0.1:{}/", server.port())
}

/// A runtime, a standalone server, and a connection to it with the tests'
/// options.
fn standalone() -> (tokio::runtime::Runtime, RedisServer, Connection) {
    let runtime = runtime();
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let connection = runtime
        .block_on(Connection::open_with(url(&server), options()))
        .unwrap();
    (runtime, server, connection)
}

fn options() -> Options {
    Options::default()
        .call_timeout(Duration::from_millis(200))
        .breaker(3, Duration::from_millis(300))
}

#[test]
fn a_killed_server_trips_the_breaker_and_a_restarted_one_is_used_again() {
    let (runtime, mut server, connection) = standalone();
    let quota = Quota::per_hour(10).unwrap();
    let strict = RedisLimiter::builder("strict", quota)
        .build(connection.clone())
        .unwrap();
    let closed = RedisLimiter::builder("closed", quota)
        .on_failure(OnFailure::Deny)
        .build(connection.clone())
        .unwrap();
    let open = RedisLimiter::builder("open", quota)
        .on_failure(OnFailure::Admit)
        .build(connection.clone())
        .unwrap();
    let local = RedisLimiter::builder("local", quota)
        .on_failure(OnFailure::Local { instances: 2 })
        .build(connection)
        .unwrap();
    for _ in 0..4 {
        assert!(runtime.block_on(strict.check("k")).unwrap().is_allowed());
    }
    // Redis decides, by the limiter's quota.
    let enforced = runtime.block_on(local.check_n_enforced("k", 1)).unwrap();
    assert_eq!(
        (enforced.decision.remaining(), enforced.quota),
        (9, Some(quota))
    );
    server.kill();
    // Three failures open the breaker; every outcome is typed.
    for attempt in 0..3 {
        match runtime.block_on(strict.check("k")) {
            Err(Error::Unavailable(Unavailable::Redis(_) | Unavailable::Timeout(_))) => {}
            other => panic!("attempt {attempt}: {other:?}"),
        }
    }
    // Open: no call is made at all (200 checks take well under the 300 ms
    // cooldown; a probe after it would fail against the dead server).
    for _ in 0..200 {
        match runtime.block_on(strict.check("k")) {
            Err(Error::Unavailable(Unavailable::BreakerOpen(wait))) => {
                assert!(wait > Duration::ZERO && wait <= Duration::from_millis(300));
            }
            other => panic!("{other:?}"),
        }
    }
    // The policies, while the breaker is open, for checks and peeks.
    for denied in [
        runtime.block_on(closed.check("k")).unwrap(),
        runtime.block_on(closed.peek("k")).unwrap(),
    ] {
        assert!(!denied.is_allowed());
        assert!(denied.retry_after() > Duration::ZERO);
    }
    assert!(runtime.block_on(open.check("k")).unwrap().is_allowed());
    assert!(runtime.block_on(open.peek("k")).unwrap().is_allowed());
    // Neither counts by any quota, and says so.
    for policy in [&closed, &open] {
        let enforced = runtime.block_on(policy.check_n_enforced("k", 1)).unwrap();
        assert_eq!(enforced.quota, None);
    }
    // A peek asks the local share and takes nothing from it...
    for _ in 0..3 {
        let peeked = runtime.block_on(local.peek("k")).unwrap();
        assert!(peeked.is_allowed());
        assert_eq!(peeked.remaining(), 4, "after the unit it would take");
    }
    // ...and half the quota is there, and said to be: exactly 5 of 8 for
    // one key.
    let share = Quota::per_hour(5).unwrap();
    let mut admitted = 0;
    for _ in 0..8 {
        let enforced = runtime.block_on(local.check_n_enforced("k", 1)).unwrap();
        assert_eq!(enforced.quota, Some(share));
        admitted += usize::from(enforced.decision.is_allowed());
    }
    assert_eq!(admitted, 5, "the local share of 10 over 2 instances");
    // Restarted (empty): after the cooldown a probe goes through, the
    // breaker closes, and the checks are Redis's again.
    server.restart().unwrap_or_else(|error| panic!("{error}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let recovered = loop {
        match runtime.block_on(strict.check("k")) {
            Ok(decision) => break decision,
            Err(Error::Unavailable(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            other => panic!("no recovery: {other:?}"),
        }
    };
    assert!(recovered.is_allowed());
    assert_eq!(
        recovered.remaining(),
        9,
        "the restarted server holds no state"
    );
    let enforced = runtime.block_on(local.check_n_enforced("k", 1)).unwrap();
    assert_eq!(
        (enforced.decision.remaining(), enforced.quota),
        (9, Some(quota)),
        "Redis's again"
    );
}

/// Pauses every server behind `connection` (`ports`) past the call
/// timeout: the check times out (200 ms) and the policy denies it, but the
/// server runs the script once the pause ends, so the unit was charged
/// although the caller was told no. At most once, never twice: 10 − 2
/// charged, and a peek reports after the unit it would take.
fn a_late_script_counts_once(
    runtime: &tokio::runtime::Runtime,
    connection: Connection,
    ports: &[u16],
) {
    let limiter = RedisLimiter::builder("paused", Quota::per_hour(10).unwrap())
        .on_failure(OnFailure::Deny)
        .build(connection)
        .unwrap();
    assert!(runtime.block_on(limiter.check("k")).unwrap().is_allowed());
    for &port in ports {
        assert_eq!(
            command(port, &["CLIENT", "PAUSE", "1000", "ALL"])
                .unwrap()
                .trim(),
            "+OK"
        );
    }
    let denied = runtime.block_on(limiter.check("k")).unwrap();
    assert!(!denied.is_allowed());
    std::thread::sleep(Duration::from_millis(1_200));
    let peeked = runtime.block_on(limiter.peek("k")).unwrap();
    assert_eq!(peeked.remaining(), 7);
}

#[test]
fn a_paused_server_times_out_and_the_late_script_still_counts_once() {
    let (runtime, server, connection) = standalone();
    a_late_script_counts_once(&runtime, connection, &[server.port()]);
}

/// The same on a Cluster: the client never resends a command whose reply
/// it did not get (redis-rs would, by default), so the late script counts
/// once.
#[test]
fn a_paused_cluster_times_out_and_the_late_script_still_counts_once() {
    let runtime = runtime();
    let cluster = RedisCluster::start().unwrap_or_else(|error| panic!("{error}"));
    let urls: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("redis://127.0.0.1:{port}/"))
        .collect();
    let connection = runtime
        .block_on(Connection::cluster_with(
            urls.iter().map(String::as_str),
            options(),
        ))
        .unwrap();
    a_late_script_counts_once(&runtime, connection, &cluster.ports());
}

#[test]
fn credentials_are_required_and_checked() {
    let runtime = runtime();
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let port = server.port();
    // An ACL user with exactly what the limiter needs, on its prefix only;
    // another without the right to run scripts; no default user.
    for acl in [
        vec![
            "ACL",
            "SETUSER",
            "limiter",
            "on",
            ">s3cret",
            "~tollgate:*",
            "+evalsha",
            "+eval",
            "+get",
            "+set",
            "+lrange",
            "+lindex",
            "+ltrim",
            "+lset",
            "+rpush",
            "+pexpire",
            "+time",
            "+ping",
        ],
        vec![
            "ACL", "SETUSER", "reader", "on", ">r3ader", "~*", "+get", "+ping",
        ],
        vec!["ACL", "SETUSER", "default", "off"],
    ] {
        assert_eq!(command(port, &acl).unwrap().trim(), "+OK", "{acl:?}");
    }
    let quota = Quota::per_hour(3).unwrap();
    let good = format!("redis://limiter:s3cret@127.0.0.1:{port}/");
    let connection = runtime.block_on(Connection::open(good.as_str())).unwrap();
    let limiter = RedisLimiter::builder("acl", quota)
        .build(connection)
        .unwrap();
    let admitted = (0..5)
        .filter(|_| runtime.block_on(limiter.check("k")).unwrap().is_allowed())
        .count();
    assert_eq!(admitted, 3);
    // A wrong password: refused at connection, a typed error.
    let wrong = format!("redis://limiter:wrong@127.0.0.1:{port}/");
    let error = runtime
        .block_on(Connection::open(wrong.as_str()))
        .unwrap_err();
    assert_eq!(
        error.kind(),
        redis::ErrorKind::AuthenticationFailed,
        "{error}"
    );
    // A user without the right to run scripts: the script's error, typed.
    let reader = format!("redis://reader:r3ader@127.0.0.1:{port}/");
    let connection = runtime.block_on(Connection::open(reader.as_str())).unwrap();
    let limiter = RedisLimiter::builder("acl", quota)
        .build(connection)
        .unwrap();
    match runtime.block_on(limiter.check("k")) {
        Err(Error::Script(error)) => assert_eq!(error.code(), Some("NOPERM"), "{error}"),
        other => panic!("{other:?}"),
    }
}

/// A server out of memory under `noeviction` refuses every write: an
/// outage like any other, under the limiter's policy and counted by the
/// breaker, not a script error (denials, which write nothing, are still
/// Redis's).
#[test]
fn a_server_out_of_memory_falls_under_the_policy() {
    let (runtime, server, connection) = standalone();
    let quota = Quota::per_hour(10).unwrap();
    let strict = RedisLimiter::builder("strict", quota)
        .build(connection.clone())
        .unwrap();
    let open = RedisLimiter::builder("open", quota)
        .on_failure(OnFailure::Admit)
        .build(connection)
        .unwrap();
    assert!(runtime.block_on(strict.check("k")).unwrap().is_allowed());
    for setting in [["maxmemory-policy", "noeviction"], ["maxmemory", "1"]] {
        let mut args = vec!["CONFIG", "SET"];
        args.extend(setting);
        assert_eq!(command(server.port(), &args).unwrap().trim(), "+OK");
    }
    match runtime.block_on(strict.check("k")) {
        Err(Error::Unavailable(Unavailable::Redis(error))) => {
            assert_eq!(error.code(), Some("OOM"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    let admitted = runtime.block_on(open.check("k")).unwrap();
    assert!(admitted.is_allowed());
    assert_eq!(admitted.remaining(), 0, "the policy's admission");
}
