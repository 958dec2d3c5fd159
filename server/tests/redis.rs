//! The real `tollgate-server` binary on the Redis backend: real
//! `redis-server` processes (a standalone server and a three-master
//! Cluster, started on free loopback ports by the Redis crate's harness),
//! several server processes on one Redis, and Redis killed and restarted
//! under them.

#[allow(dead_code)]
#[path = "../../redis/tests/support/redis.rs"]
mod redis_server;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use redis_server::{RedisCluster, RedisServer};
use support::{Server, ask, descriptor, hang_up, request, wait_for_metric};

/// One hot limit per mode, 300 a day by GCRA: no unit comes back within a
/// test (one every 288 s), so every admission counts against 300.
const FLEET: &str = "\
domain: fleet
descriptors:
  - key: exact
    rate_limit:
      unit: day
      requests_per_unit: 300
      algorithm: gcra
  - key: cached
    rate_limit:
      unit: day
      requests_per_unit: 300
      algorithm: gcra
      mode: deny_cached
  - key: leased
    rate_limit:
      unit: day
      requests_per_unit: 300
      algorithm: gcra
      mode: leased
";

fn start_redis() -> RedisServer {
    RedisServer::start().unwrap_or_else(|error| panic!("{error}"))
}

fn url(server: &RedisServer) -> String {
    format!("redis://127.0.0.1:{}/", server.port())
}

fn start_cluster() -> RedisCluster {
    RedisCluster::start().unwrap_or_else(|error| panic!("{error}"))
}

/// The `--redis` list of `cluster`'s masters.
fn nodes(cluster: &RedisCluster) -> String {
    let urls: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("redis://127.0.0.1:{port}/"))
        .collect();
    urls.join(",")
}

/// `key`'s hot descriptor.
fn hot(key: &str) -> RateLimitRequest {
    request("fleet", vec![descriptor(&[(key, "hot")])])
}

/// Drives `request` through `streams` concurrent calls on each server, each
/// stream asking until its first refusal; returns (admitted, refused).
async fn drain(
    servers: &[Server],
    streams: usize,
    request: fn() -> RateLimitRequest,
) -> (u64, u64) {
    let mut tasks = Vec::new();
    for server in servers {
        for _ in 0..streams {
            let mut client = server.client().await;
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                loop {
                    match ask(&mut client, request()).await.overall_code() {
                        Code::Ok => admitted += 1,
                        code => {
                            assert_eq!(code, Code::OverLimit);
                            return admitted;
                        }
                    }
                }
            }));
        }
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    (admitted, (servers.len() * streams) as u64)
}

/// A sample of `name` with labels `labels` on a server's `/metrics`.
async fn metric(server: &Server, name: &str, labels: &str) -> u64 {
    let text = support::metrics(server).await;
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |value| value.parse().unwrap())
}

/// The sum of a sample over `servers`' `/metrics`.
async fn summed(servers: &[Server], name: &str, labels: &str) -> u64 {
    let mut sum = 0;
    for server in servers {
        sum += metric(server, name, labels).await;
    }
    sum
}

/// Three servers, each limiting in memory, admit three times the limit;
/// three on one Redis admit exactly it, in every mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_on_one_redis_admit_exactly_the_limit_in_every_mode() {
    let apart: Vec<Server> = (0..3).map(|_| Server::start(FLEET)).collect();
    let (admitted, _) = drain(&apart, 2, || hot("exact")).await;
    assert_eq!(admitted, 900, "three servers each holding the limit");

    let redis = start_redis();
    fleet_on_one_redis(&["--redis", &url(&redis)]).await;
}

/// On a Cluster, each master decides on its own clock: the local modes
/// are refused until the most the masters' clocks differ is declared, and
/// then admit exactly the limit as on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_on_a_redis_cluster_admit_exactly_the_limit_in_every_mode() {
    let cluster = start_cluster();
    let nodes = nodes(&cluster);
    let refused = Server::refused(FLEET, &["--redis", &nodes, "--redis-cluster"]);
    assert!(
        refused.contains(": fleet.cached: ") && refused.contains("cluster_clock_skew"),
        "{refused}"
    );
    fleet_on_one_redis(&[
        "--redis",
        &nodes,
        "--redis-cluster",
        "--redis-cluster-skew-ms",
        "5",
    ])
    .await;
}

/// Three servers with `flags` on one Redis admit exactly the limit in
/// every mode: every check a round trip, denials cached, or leases (each
/// server drained by its own streams, so no lease is left unspent). Exact
/// takes one round trip a check; the local modes decide some checks
/// themselves.
async fn fleet_on_one_redis(flags: &[&str]) {
    let servers: Vec<Server> = (0..3).map(|_| Server::start_with(FLEET, flags)).collect();
    let (admitted, refused) = drain(&servers, 4, || hot("exact")).await;
    assert_eq!(admitted, 300, "exact");
    let calls = summed(
        &servers,
        "tollgate_redis_calls_total",
        "limiter=\"fleet.exact\"",
    )
    .await;
    assert_eq!(calls, admitted + refused, "one round trip a check");

    let (admitted, _) = drain(&servers, 4, || hot("cached")).await;
    assert_eq!(admitted, 300, "deny-cached");
    let cached = summed(
        &servers,
        "tollgate_redis_local_decisions_total",
        "limiter=\"fleet.cached\"",
    )
    .await;
    assert!(cached > 0, "denials cached");
    let (admitted, _) = drain(&servers, 4, || hot("leased")).await;
    assert_eq!(admitted, 300, "leased");
    let local = summed(
        &servers,
        "tollgate_redis_local_decisions_total",
        "limiter=\"fleet.leased\"",
    )
    .await;
    assert!(local > 0, "leases decide without a round trip");
}

const TWO_RULES: &str = "\
domain: shop
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 5
      algorithm: gcra
  - key: tenant
    rate_limit:
      unit: day
      requests_per_unit: 2
      algorithm: gcra
";

/// A request's descriptors all or nothing: the one a tenant's limit
/// refuses gives the user's admission back before the answer, on a
/// standalone server and on a Cluster (where each key has a slot of its
/// own, most often on different masters).
async fn all_or_nothing(flags: &[&str]) {
    let server = Server::start_with(TWO_RULES, flags);
    let mut client = server.client().await;
    let both = || {
        request(
            "shop",
            vec![
                descriptor(&[("user", "alice")]),
                descriptor(&[("tenant", "acme")]),
            ],
        )
    };
    for remaining in [(4, 1), (3, 0)] {
        let response = ask(&mut client, both()).await;
        assert_eq!(response.overall_code(), Code::Ok);
        let left: Vec<u32> = response
            .statuses
            .iter()
            .map(|status| status.limit_remaining)
            .collect();
        assert_eq!(left, [remaining.0, remaining.1]);
    }
    let refused = ask(&mut client, both()).await;
    assert_eq!(refused.overall_code(), Code::OverLimit);
    let codes: Vec<Code> = refused
        .statuses
        .iter()
        .map(|status| status.code())
        .collect();
    assert_eq!(codes, [Code::Ok, Code::OverLimit]);
    // Alice's unit of the refused request was given back: 3 left, and one
    // more request takes her to 2.
    let alone = ask(
        &mut client,
        request("shop", vec![descriptor(&[("user", "alice")])]),
    )
    .await;
    assert_eq!(alone.overall_code(), Code::Ok);
    assert_eq!(alone.statuses[0].limit_remaining, 2);
}

#[tokio::test]
async fn a_request_is_all_or_nothing_on_a_standalone_redis() {
    let redis = start_redis();
    all_or_nothing(&["--redis", &url(&redis)]).await;
}

#[tokio::test]
async fn a_request_is_all_or_nothing_on_a_redis_cluster() {
    let cluster = start_cluster();
    all_or_nothing(&["--redis", &nodes(&cluster), "--redis-cluster"]).await;
}

/// Redis killed under four servers, one a failure policy: `error` answers
/// `UNAVAILABLE` (Envoy then applies its own), `deny` over the limit,
/// `admit` within it, `local` its share of the limit in the process; the
/// breaker opens, and once Redis is back every server decides on it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted() {
    let mut redis = start_redis();
    let url = url(&redis);
    let policies = ["error", "deny", "admit", "local"];
    let servers: Vec<Server> = policies
        .iter()
        .map(|policy| {
            Server::start_with(TWO_RULES, &["--redis", &url, "--redis-on-failure", policy])
        })
        .collect();
    let user = |name: &str| request("shop", vec![descriptor(&[("user", name)])]);
    for server in &servers {
        let response = ask(&mut server.client().await, user("before")).await;
        assert_eq!(response.overall_code(), Code::Ok);
    }

    redis.kill();
    // Three failures open the breaker, and its gauge says so.
    let mut error = servers[0].client().await;
    for _ in 0..4 {
        let failed = error.should_rate_limit(user("during")).await.unwrap_err();
        assert_eq!(failed.code(), tonic::Code::Unavailable);
    }
    let mut deny = servers[1].client().await;
    assert_eq!(
        ask(&mut deny, user("during")).await.overall_code(),
        Code::OverLimit
    );
    let mut admit = servers[2].client().await;
    for _ in 0..10 {
        assert_eq!(
            ask(&mut admit, user("during")).await.overall_code(),
            Code::Ok
        );
    }
    // Alone, the local share is the whole limit: 5, then over it.
    let mut local = servers[3].client().await;
    let codes: Vec<Code> = in_turn(&mut local, || user("during"), 6).await;
    assert_eq!(
        codes,
        [[Code::Ok; 5].as_slice(), &[Code::OverLimit]].concat()
    );
    wait_for_metric(
        &servers[0],
        "tollgate_redis_breaker_open{limiter=\"shop.user\"}",
        1,
    )
    .await;

    redis.restart().unwrap_or_else(|error| panic!("{error}"));
    // Back within a breaker's cooldown and a reconnection. The restarted
    // Redis is empty and the servers share its keys: one request each of
    // the key drained during the outage leaves 4, 3, 2 and 1 of it, the
    // local server first. No policy answers so: `error` fails, `deny`
    // refuses, `admit` leaves 0, and the local share is drained.
    for (index, remaining) in [(3, 4), (0, 3), (1, 2), (2, 1)] {
        let mut client = servers[index].client().await;
        let mut decided = false;
        for _ in 0..100 {
            if let Ok(response) = client.should_rate_limit(user("during")).await {
                let response = response.into_inner();
                if response.overall_code() == Code::Ok
                    && response.statuses[0].limit_remaining == remaining
                {
                    decided = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(decided, "{} decides on Redis again", policies[index]);
    }
}

/// The codes of `count` requests sent one after another.
async fn in_turn(
    client: &mut support::Client,
    request: impl Fn() -> RateLimitRequest,
    count: usize,
) -> Vec<Code> {
    let mut codes = Vec::with_capacity(count);
    for _ in 0..count {
        codes.push(ask(client, request()).await.overall_code());
    }
    codes
}

/// Configuration reloaded five times while four streams spend a limit the
/// reloads do not change: it admits exactly its limit, every request is
/// answered, and the limit the reloads do change is the last one's. In
/// memory and on Redis.
async fn reload_under_traffic(flags: &[&str]) {
    let config = |changing: u32| {
        format!(
            "\
domain: shop
descriptors:
  - key: steady
    rate_limit:
      unit: day
      requests_per_unit: 200
      algorithm: gcra
  - key: changing
    rate_limit:
      unit: day
      requests_per_unit: {changing}
      algorithm: gcra
"
        )
    };
    let server = Server::start_with(&config(5), flags);
    let steady = || request("shop", vec![descriptor(&[("steady", "hot")])]);
    let reloading = Arc::new(AtomicBool::new(true));
    let mut streams = Vec::new();
    for _ in 0..4 {
        let mut client = server.client().await;
        let reloading = reloading.clone();
        streams.push(tokio::spawn(async move {
            let (mut admitted, mut sent) = (0, 0);
            // Until the reloads are over, and past the limit.
            while reloading.load(Ordering::Relaxed) || sent < 100 {
                if ask(&mut client, steady()).await.overall_code() == Code::Ok {
                    admitted += 1;
                }
                sent += 1;
            }
            (admitted, sent)
        }));
    }
    for (reload, changing) in [6, 7, 8, 9, 10].into_iter().enumerate() {
        std::fs::write(&server.config, config(changing)).unwrap();
        hang_up(&server);
        wait_for_metric(
            &server,
            "ratelimit_service_config_load_success",
            reload as u64 + 1,
        )
        .await;
    }
    reloading.store(false, Ordering::Relaxed);
    let (mut admitted, mut sent) = (0, 0);
    for stream in streams {
        let (stream_admitted, stream_sent) = stream.await.unwrap();
        admitted += stream_admitted;
        sent += stream_sent;
    }
    assert_eq!(
        admitted, 200,
        "the unchanged limit, exactly, of {sent} asked"
    );
    let mut client = server.client().await;
    let fresh = || request("shop", vec![descriptor(&[("changing", "fresh")])]);
    let codes = in_turn(&mut client, fresh, 11).await;
    assert_eq!(
        codes,
        [[Code::Ok; 10].as_slice(), &[Code::OverLimit]].concat(),
        "the last reload's limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_traffic_in_memory() {
    reload_under_traffic(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_traffic_on_redis() {
    let redis = start_redis();
    reload_under_traffic(&["--redis", &url(&redis)]).await;
}

/// A reload that changes a rule's mode makes it a new limiter on the same
/// keys: the state in Redis is kept, the new mode decides (its denials
/// cached), and a key is carried when the limit changes too (as is: the
/// units free stay free).
#[tokio::test]
async fn a_reload_that_changes_a_rule_s_mode_keeps_its_keys() {
    let config = |mode: &str, requests: u32| {
        format!(
            "domain: shop\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: day\n      \
             requests_per_unit: {requests}\n      algorithm: gcra\n      mode: {mode}\n"
        )
    };
    let redis = start_redis();
    let server = Server::start_with(&config("exact", 5), &["--redis", &url(&redis)]);
    let mut client = server.client().await;
    let user = |name: &str| request("shop", vec![descriptor(&[("user", name)])]);
    let remaining = async |client: &mut support::Client, name: &str| {
        let response = ask(client, user(name)).await;
        (
            response.overall_code(),
            response.statuses[0].limit_remaining,
        )
    };
    assert_eq!(remaining(&mut client, "alice").await, (Code::Ok, 4));
    assert_eq!(remaining(&mut client, "alice").await, (Code::Ok, 3));
    std::fs::write(&server.config, config("deny_cached", 5)).unwrap();
    hang_up(&server);
    wait_for_metric(&server, "ratelimit_service_config_load_success", 1).await;
    // The same keys, now with denials cached: once Alice's last unit is
    // taken, her next three checks are denied without a round trip.
    for left in [2, 1, 0] {
        assert_eq!(remaining(&mut client, "alice").await, (Code::Ok, left));
    }
    for _ in 0..3 {
        assert_eq!(remaining(&mut client, "alice").await.0, Code::OverLimit);
    }
    let local = metric(
        &server,
        "tollgate_redis_local_decisions_total",
        "limiter=\"shop.user\"",
    )
    .await;
    assert_eq!(local, 3, "denials cached");
    for left in [4, 3, 2] {
        assert_eq!(remaining(&mut client, "bob").await, (Code::Ok, left));
    }
    // Bob's two units free, carried as is to a limit of 10: one left after
    // the check. (Read as it stands, a debt of three units of a day's 5
    // would be six of 10: three left.)
    std::fs::write(&server.config, config("exact", 10)).unwrap();
    hang_up(&server);
    wait_for_metric(&server, "ratelimit_service_config_load_success", 2).await;
    assert_eq!(
        remaining(&mut client, "bob").await,
        (Code::Ok, 1),
        "carried as is"
    );
}

/// A descriptor Redis fails (its key holds a list: the script errs) is not
/// unavailability the policy covers: under `error` the request is
/// `UNAVAILABLE`, under `deny` over its limit. Either way the request's
/// other admission stays charged: given back, a request a proxy lets pass
/// on the failure would have been charged nowhere.
#[tokio::test]
async fn a_failed_descriptor_gives_nothing_back() {
    let redis = start_redis();
    let connection = tollgate_redis::Connection::open(url(&redis))
        .await
        .expect("connecting to the test's redis-server");
    // The key the server keeps for `tenant=acme` (rule `shop.tenant`, GCRA,
    // the descriptor's length-prefixed entries), made a list.
    let tenant =
        tollgate_redis::RedisLimiter::builder("shop.tenant", tollgate::Quota::per_hour(2).unwrap())
            .build(connection)
            .unwrap();
    let key = String::from_utf8(tenant.redis_key("6:tenant4:acme")).unwrap();
    redis_server::command(redis.port(), &["LPUSH", &key, "not a count"]).unwrap();
    let both = || {
        request(
            "shop",
            vec![
                descriptor(&[("user", "alice")]),
                descriptor(&[("tenant", "acme")]),
            ],
        )
    };
    let alice = || request("shop", vec![descriptor(&[("user", "alice")])]);

    let server = Server::start_with(TWO_RULES, &["--redis", &url(&redis)]);
    let mut client = server.client().await;
    let failed = client.should_rate_limit(both()).await.unwrap_err();
    assert_eq!(failed.code(), tonic::Code::Unavailable);
    // Alice's unit of the failed request stays charged: 3 left after the
    // next.
    assert_eq!(
        ask(&mut client, alice()).await.statuses[0].limit_remaining,
        3
    );

    let deny = Server::start_with(
        TWO_RULES,
        &["--redis", &url(&redis), "--redis-on-failure", "deny"],
    );
    let mut client = deny.client().await;
    let refused = ask(&mut client, both()).await;
    assert_eq!(refused.overall_code(), Code::OverLimit);
    assert_eq!(refused.statuses[1].code(), Code::OverLimit);
    assert_eq!(
        ask(&mut client, alice()).await.statuses[0].limit_remaining,
        1
    );
}

/// SIGTERM while a call is in flight (Redis paused by `CLIENT PAUSE`): the
/// call is answered, decided, and the server then exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_answers_what_is_in_flight() {
    let redis = start_redis();
    let mut server = Server::start_with(
        TWO_RULES,
        &["--redis", &url(&redis), "--redis-timeout-ms", "5000"],
    );
    let mut client = server.client().await;
    // The connection is up and Redis's script loaded before the pause.
    let alice = || request("shop", vec![descriptor(&[("user", "alice")])]);
    assert_eq!(ask(&mut client, alice()).await.overall_code(), Code::Ok);
    redis_server::command(redis.port(), &["CLIENT", "PAUSE", "700", "ALL"]).unwrap();
    let in_flight = tokio::spawn(async move { ask(&mut client, alice()).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let answered = in_flight.await.unwrap();
    assert_eq!(answered.overall_code(), Code::Ok);
    assert_eq!(answered.statuses[0].limit_remaining, 3, "decided on Redis");
    let exited = server.child.wait().unwrap();
    assert!(exited.success(), "{exited}");
}
