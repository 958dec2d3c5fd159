//! Real faults: a killed and restarted `redis-server`, `CLIENT PAUSE` past
//! the call timeout, a reply lost after the script ran (a proxy between
//! client and server), a wrong password, an ACL user without the rights.
//! Every outcome is a typed result; the breaker keeps a dead Redis from
//! costing a timeout a check; recovery needs nothing from the caller.

mod support {
    #[allow(dead_code)]
    pub mod proxy;
    #[allow(dead_code)]
    pub mod redis;
}

use std::time::Duration;

use tollgate::Quota;
use tollgate_redis::{Connection, Enforced, Error, OnFailure, Options, RedisLimiter, Unavailable};

use support::proxy::Proxy;
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

/// Where the proxies stand.
#[derive(Clone, Copy, Debug)]
enum Deployment {
    /// One server behind one proxy.
    Standalone,
    /// Three masters, each behind a proxy it announces as its address
    /// (`cluster-announce-port`), so that the Cluster client reaches every
    /// master through its proxy.
    Cluster,
}

/// Servers with a proxy in front of each, and a connection through them.
struct Proxied {
    _servers: (Option<RedisServer>, Option<RedisCluster>),
    proxies: Vec<Proxy>,
    connection: Connection,
}

fn proxied(runtime: &tokio::runtime::Runtime, deployment: Deployment) -> Proxied {
    match deployment {
        Deployment::Standalone => {
            let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
            let proxy = Proxy::start(server.port()).unwrap();
            let connection = runtime
                .block_on(Connection::open_with(
                    format!("redis://127.0.0.1:{}/", proxy.port()),
                    options(),
                ))
                .unwrap();
            Proxied {
                _servers: (Some(server), None),
                proxies: vec![proxy],
                connection,
            }
        }
        Deployment::Cluster => {
            let cluster = RedisCluster::start().unwrap_or_else(|error| panic!("{error}"));
            let ports = cluster.ports();
            let proxies: Vec<Proxy> = ports
                .iter()
                .map(|&port| Proxy::start(port).unwrap())
                .collect();
            for (port, proxy) in ports.iter().zip(&proxies) {
                let announced = proxy.port().to_string();
                let set = ["CONFIG", "SET", "cluster-announce-port", announced.as_str()];
                assert_eq!(command(*port, &set).unwrap().trim(), "+OK");
            }
            // Every master must know every other by its proxy's port (the
            // bus keeps the real one, port + 10 000).
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            let announced = |port: u16| {
                let nodes = command(port, &["CLUSTER", "NODES"]).unwrap_or_default();
                proxies
                    .iter()
                    .all(|proxy| nodes.contains(&format!("127.0.0.1:{}@", proxy.port())))
            };
            while !ports.iter().all(|&port| announced(port)) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the proxies' ports were not announced"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            let urls: Vec<String> = proxies
                .iter()
                .map(|proxy| format!("redis://127.0.0.1:{}/", proxy.port()))
                .collect();
            let connection = runtime
                .block_on(Connection::cluster_with(
                    urls.iter().map(String::as_str),
                    options(),
                ))
                .unwrap();
            Proxied {
                _servers: (None, Some(cluster)),
                proxies,
                connection,
            }
        }
    }
}

/// A check whose reply is lost after the script ran: a proxy between the
/// limiter and a real server forwards the call, drops the server's reply
/// and closes the limiter's connection. Returns what the caller got, and
/// the units the server then holds for the key (10 per hour: one admitted
/// before, and whatever the lost call, and any resend of it, charged).
///
/// `resend` plants a client that sends the call again when it hears
/// nothing back, as a client with retries does, so that the canary below
/// can show the count telling it apart.
fn lose_a_reply(
    deployment: Deployment,
    policy: OnFailure,
    resend: bool,
) -> (Result<Enforced, Error>, u32) {
    let runtime = runtime();
    let proxied = proxied(&runtime, deployment);
    let quota = Quota::per_hour(10).unwrap();
    let limiter = RedisLimiter::builder("lost", quota)
        .on_failure(policy)
        .build(proxied.connection.clone())
        .unwrap();
    // The same limit, without the policy: the server's count, read by a
    // peek (once no loss is armed).
    let observer = RedisLimiter::builder("lost", quota)
        .build(proxied.connection)
        .unwrap();
    assert!(runtime.block_on(limiter.check("k")).unwrap().is_allowed());
    // Armed on every proxy: the key's master's sees the call.
    for proxy in &proxied.proxies {
        proxy.lose_next_script_reply();
    }
    let mut outcome = runtime.block_on(limiter.check_n_enforced("k", 1));
    let unanswered = match &outcome {
        Err(Error::Unavailable(_)) => true,
        Ok(enforced) => enforced.quota.is_none(),
        Err(_) => false,
    };
    if resend && unanswered {
        outcome = runtime.block_on(limiter.check_n_enforced("k", 1));
    }
    for proxy in &proxied.proxies {
        proxy.disarm();
    }
    let lost: u32 = proxied.proxies.iter().map(Proxy::replies_lost).sum();
    assert_eq!(lost, 1, "a proxy lost the call's reply");
    // The connection comes back by itself (a Cluster client may first
    // fail a call on the closed connection, before sending it).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let remaining = loop {
        match runtime.block_on(observer.peek("k")) {
            Ok(peeked) => break peeked.remaining(),
            Err(Error::Unavailable(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            other => panic!("no recovery: {other:?}"),
        }
    };
    // A peek reports what remains after the unit it would take.
    let charged = 10 - 1 - remaining;
    let after = runtime.block_on(limiter.check("k")).unwrap();
    assert!(after.is_allowed());
    assert_eq!(after.remaining(), 10 - charged - 1, "counting on");
    (outcome, charged)
}

/// At most once, for real: the lost call ran once and charged one unit,
/// and was never sent again; the caller got a typed failure (`Error`) or
/// the policy's answer (`Deny`, counted by no quota).
fn a_lost_reply_charges_once(deployment: Deployment) {
    let (outcome, charged) = lose_a_reply(deployment, OnFailure::Error, false);
    match outcome {
        Err(Error::Unavailable(Unavailable::Redis(error))) => {
            assert!(
                error.is_connection_dropped() || error.is_io_error(),
                "{error}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(charged, 2, "the admitted unit and the lost call's, once");
    let (outcome, charged) = lose_a_reply(deployment, OnFailure::Deny, false);
    let denied = outcome.unwrap();
    assert!(!denied.decision.is_allowed());
    assert_eq!(denied.quota, None, "the policy's answer");
    assert_eq!(charged, 2, "the admitted unit and the lost call's, once");
}

#[test]
fn a_lost_reply_charges_once_and_the_policy_answers() {
    a_lost_reply_charges_once(Deployment::Standalone);
}

#[test]
fn a_lost_reply_on_a_cluster_charges_once_and_the_policy_answers() {
    a_lost_reply_charges_once(Deployment::Cluster);
}

/// The tests above tell a resending client apart: with a resend planted,
/// the caller sees an admission and the server holds one unit more than
/// they allow.
#[test]
fn canary_a_resent_call_is_caught() {
    for deployment in [Deployment::Standalone, Deployment::Cluster] {
        let (outcome, charged) = lose_a_reply(deployment, OnFailure::Error, true);
        assert!(
            outcome.unwrap().decision.is_allowed(),
            "{deployment:?}: the resend answered"
        );
        assert_eq!(
            charged, 3,
            "{deployment:?}: the lost call ran, and its resend too"
        );
    }
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
