//! The layer over the Redis backend: a real `redis-server` (started on a
//! free loopback port by the Redis crate's harness) decides, a real axum
//! server answers, a real client reads; then the server is killed, and the
//! layer answers as configured, never with a panic or a hung request.

#[allow(dead_code)]
#[path = "../../redis/tests/support/redis.rs"]
mod redis_server;
mod support;

use std::time::Duration;

use redis_server::RedisServer;
use reqwest::StatusCode;
use serde_json::Value;
use support::{Item, Server, client, list, retry_after, send};
use tollgate::{Quota, RateLimiter};
use tollgate_http::{Header, IpKey, OnUnavailable, PeerIp, RateLimitLayer, Rule, Tiers};
use tollgate_redis::{Connection, OnFailure, Options, RedisLimiter};

async fn connect(server: &RedisServer) -> Connection {
    let options = Options::default()
        .call_timeout(Duration::from_millis(200))
        .breaker(1, Duration::from_millis(200));
    Connection::open_with(format!("redis://127.0.0.1:{}/", server.port()), options)
        .await
        .expect("connecting to the test's redis-server")
}

fn start_redis() -> RedisServer {
    RedisServer::start().unwrap_or_else(|error| panic!("{error}"))
}

#[tokio::test]
async fn a_redis_rule_admits_exactly_its_quota_and_reports_it() {
    let redis = start_redis();
    let limiter = RedisLimiter::builder("http-exact", Quota::per_hour(3).unwrap())
        .build(connect(&redis).await)
        .unwrap();
    let server = Server::start(
        RateLimitLayer::builder()
            .rule(Rule::new("shared", limiter, PeerIp::new()).unwrap())
            .build(),
    )
    .await;
    let (admitted, denied) = send(&client(), &server.url("/"), &[], 5).await;
    assert_eq!(admitted, 3);
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // 20 minutes an interval, on the server's clock, rounded up.
    assert_eq!(retry_after(denied.headers()), 1_200);
    let limit = list(denied.headers(), "ratelimit");
    assert_eq!((limit[0].param("r"), limit[0].param("t")), (0, 1_200));
    let policy = list(denied.headers(), "ratelimit-policy");
    assert_eq!((policy[0].param("q"), policy[0].param("w")), (3, 3_600));
}

#[tokio::test]
async fn an_in_process_admission_is_given_back_when_redis_refuses() {
    let redis = start_redis();
    let per_key = RedisLimiter::builder("http-per-key", Quota::per_hour(1).unwrap())
        .build(connect(&redis).await)
        .unwrap();
    let server = Server::start(
        RateLimitLayer::builder()
            .rule(
                Rule::new(
                    "per-ip",
                    RateLimiter::<IpKey>::keyed(Quota::per_hour(10).unwrap()),
                    PeerIp::new(),
                )
                .unwrap(),
            )
            .rule(
                Rule::new(
                    "per-key",
                    per_key,
                    Header::new(http::HeaderName::from_static("x-api-key")),
                )
                .unwrap(),
            )
            .build(),
    )
    .await;
    let client = client();
    let url = server.url("/");
    let (admitted, denied) = send(&client, &url, &[("x-api-key", "k")], 4).await;
    assert_eq!(admitted, 1);
    let limit = list(denied.headers(), "ratelimit");
    // Three refusals by Redis, each given back in process: 9 left.
    assert_eq!((limit[0].name.as_str(), limit[0].param("r")), ("per-ip", 9));
    assert_eq!(
        (limit[1].name.as_str(), limit[1].param("r")),
        ("per-key", 0)
    );
    let (admitted, last) = send(&client, &url, &[("x-api-key", "other")], 1).await;
    assert_eq!(admitted, 1);
    assert_eq!(list(last.headers(), "ratelimit")[0].param("r"), 8);
}

#[tokio::test]
async fn a_dead_redis_is_a_503_or_a_pass_as_configured() {
    let mut redis = start_redis();
    let refusing = RedisLimiter::builder("http-dead", Quota::per_hour(100).unwrap())
        .build(connect(&redis).await)
        .unwrap();
    let passing = RedisLimiter::builder("http-dead-open", Quota::per_hour(100).unwrap())
        .build(connect(&redis).await)
        .unwrap();
    let refuse = Server::start(
        RateLimitLayer::builder()
            .rule(Rule::new("shared", refusing, PeerIp::new()).unwrap())
            .build(),
    )
    .await;
    let pass = Server::start(
        RateLimitLayer::builder()
            .rule(Rule::new("shared", passing, PeerIp::new()).unwrap())
            .on_unavailable(OnUnavailable::Allow)
            .build(),
    )
    .await;
    let client = client();
    assert_eq!(send(&client, &refuse.url("/"), &[], 1).await.0, 1);
    assert_eq!(send(&client, &pass.url("/"), &[], 1).await.0, 1);
    redis.kill();
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let (admitted, response) = send(&client, &refuse.url("/"), &[], 1).await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "answered within the call timeout"
        );
        assert_eq!(admitted, 0);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after(response.headers()), 1);
        let problem: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
        assert_eq!(
            problem["type"],
            "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
        );
        assert_eq!(problem["status"], 503);
        let (admitted, response) = send(&client, &pass.url("/"), &[], 1).await;
        assert_eq!(admitted, 1);
        // Nothing decided it: no fields.
        assert!(response.headers().get("ratelimit").is_none());
    }
}

/// An item named `name` with integer parameters `params`, in order.
fn item(name: &str, params: &[(&str, i64)]) -> Item {
    Item {
        name: name.to_owned(),
        params: params
            .iter()
            .map(|&(key, value)| (key.to_owned(), value))
            .collect(),
    }
}

#[tokio::test]
async fn under_the_local_fallback_the_fields_advertise_the_fallbacks_quota() {
    let mut redis = start_redis();
    let limiter = RedisLimiter::builder("http-fallback", Quota::per_minute(20).unwrap())
        .on_failure(OnFailure::Local { instances: 3 })
        .build(connect(&redis).await)
        .unwrap();
    let server = Server::start(
        RateLimitLayer::builder()
            .rule(Rule::new("per-ip", limiter, PeerIp::new()).unwrap())
            .build(),
    )
    .await;
    let client = client();
    let url = server.url("/");
    // Redis decides: 20 a minute, one every 3 s.
    let (admitted, response) = send(&client, &url, &[], 2).await;
    assert_eq!(admitted, 2);
    assert_eq!(
        list(response.headers(), "ratelimit-policy"),
        [item("per-ip", &[("q", 20), ("w", 60)])]
    );
    assert_eq!(
        list(response.headers(), "ratelimit"),
        [item("per-ip", &[("r", 18), ("t", 6)])]
    );
    redis.kill();
    // The fallback decides, in process: a third of the quota, 6 a minute
    // (one every 10 s) with a burst of 6, and the fields say so.
    for admissions in 1..=6 {
        let (admitted, response) = send(&client, &url, &[], 1).await;
        assert_eq!(admitted, 1, "admission {admissions} of the fallback's 6");
        assert_eq!(
            list(response.headers(), "ratelimit-policy"),
            [item("per-ip", &[("q", 6), ("w", 60)])]
        );
        assert_eq!(
            list(response.headers(), "ratelimit"),
            [item(
                "per-ip",
                &[("r", 6 - admissions), ("t", 10 * admissions)]
            )]
        );
    }
    let (admitted, denied) = send(&client, &url, &[], 1).await;
    assert_eq!(
        (admitted, denied.status()),
        (0, StatusCode::TOO_MANY_REQUESTS)
    );
    assert_eq!(retry_after(denied.headers()), 10);
    assert_eq!(
        list(denied.headers(), "ratelimit-policy"),
        [item("per-ip", &[("q", 6), ("w", 60)])]
    );
    assert_eq!(
        list(denied.headers(), "ratelimit"),
        [item("per-ip", &[("r", 0), ("t", 10)])]
    );
}

#[tokio::test]
async fn a_failure_policy_that_counts_nothing_advertises_no_quota() {
    let mut redis = start_redis();
    let quota = Quota::per_minute(20).unwrap();
    let denying = RedisLimiter::builder("http-deny", quota)
        .on_failure(OnFailure::Deny)
        .build(connect(&redis).await)
        .unwrap();
    let admitting = RedisLimiter::builder("http-admit", quota)
        .on_failure(OnFailure::Admit)
        .build(connect(&redis).await)
        .unwrap();
    let deny = Server::start(
        RateLimitLayer::builder()
            .rule(Rule::new("per-ip", denying, PeerIp::new()).unwrap())
            .build(),
    )
    .await;
    let admit = Server::start(
        RateLimitLayer::builder()
            .rule(Rule::new("per-ip", admitting, PeerIp::new()).unwrap())
            .build(),
    )
    .await;
    let client = client();
    for server in [&deny, &admit] {
        let (admitted, response) = send(&client, &server.url("/"), &[], 1).await;
        assert_eq!(admitted, 1);
        assert_eq!(
            list(response.headers(), "ratelimit-policy"),
            [item("per-ip", &[("q", 20), ("w", 60)])]
        );
    }
    redis.kill();
    // Denied until the breaker lets a check through (200 ms), by no quota.
    let (admitted, denied) = send(&client, &deny.url("/"), &[], 1).await;
    assert_eq!(
        (admitted, denied.status()),
        (0, StatusCode::TOO_MANY_REQUESTS)
    );
    assert_eq!(retry_after(denied.headers()), 1);
    // Admitted, unlimited.
    let (admitted, passed) = send(&client, &admit.url("/"), &[], 1).await;
    assert_eq!(admitted, 1);
    for headers in [denied.headers(), passed.headers()] {
        assert_eq!(headers.get("ratelimit-policy"), None);
        assert_eq!(headers.get("ratelimit"), None);
    }
}

/// Tiers on a Redis rule: each request's plan header picks its quota, the
/// script decides by it, and the response advertises it.
#[tokio::test]
async fn a_redis_rule_holds_each_tier_to_its_own_quota() {
    let redis = start_redis();
    let limiter = RedisLimiter::builder("http-tiers", Quota::per_minute(2).unwrap())
        .build(connect(&redis).await)
        .unwrap();
    let rule = Rule::new(
        "per-key",
        limiter,
        Header::new(http::HeaderName::from_static("x-api-key")),
    )
    .unwrap()
    .tiers(
        Tiers::header(http::HeaderName::from_static("x-plan"))
            .tier("pro", Quota::per_minute(5).unwrap()),
    )
    .unwrap();
    let server = Server::start(RateLimitLayer::builder().rule(rule).build()).await;
    let client = client();
    let url = server.url("/");
    let (admitted, denied) = send(
        &client,
        &url,
        &[("x-api-key", "alice"), ("x-plan", "pro")],
        6,
    )
    .await;
    assert_eq!(admitted, 5);
    let policy = list(denied.headers(), "ratelimit-policy");
    assert_eq!((policy[0].param("q"), policy[0].param("w")), (5, 60));
    assert_eq!(retry_after(denied.headers()), 12);
    let (admitted, denied) = send(&client, &url, &[("x-api-key", "bob")], 3).await;
    assert_eq!(admitted, 2);
    let policy = list(denied.headers(), "ratelimit-policy");
    assert_eq!((policy[0].param("q"), policy[0].param("w")), (2, 60));
    assert_eq!(retry_after(denied.headers()), 30);
}

/// A Redis rule's admission is given back when a later rule refuses the
/// request: in a task of its own (the response does not wait for it), so
/// Redis is read until it arrives.
#[tokio::test]
async fn a_redis_admission_is_given_back_when_a_later_rule_refuses() {
    let redis = start_redis();
    let per_key = std::sync::Arc::new(
        RedisLimiter::builder("http-given-back", Quota::per_hour(3).unwrap())
            .build(connect(&redis).await)
            .unwrap(),
    );
    let server = Server::start(
        RateLimitLayer::builder()
            .rule(
                Rule::new(
                    "per-key",
                    std::sync::Arc::clone(&per_key),
                    Header::new(http::HeaderName::from_static("x-api-key")),
                )
                .unwrap(),
            )
            .rule(
                Rule::new(
                    "per-ip",
                    RateLimiter::<IpKey>::keyed(Quota::per_hour(1).unwrap()),
                    PeerIp::new(),
                )
                .unwrap(),
            )
            .build(),
    )
    .await;
    let client = client();
    let (admitted, denied) = send(&client, &server.url("/"), &[("x-api-key", "k")], 3).await;
    assert_eq!(admitted, 1);
    assert_eq!(
        list(denied.headers(), "ratelimit")[1].name.as_str(),
        "per-ip"
    );
    // Two refusals by the in-process rule, each given back on Redis: one
    // unit used of three once both refunds have arrived, and a peek of one
    // more leaves one. Before, a peek leaves none.
    let started = std::time::Instant::now();
    loop {
        let remaining = per_key.peek("k").await.unwrap().remaining();
        if remaining == 3 - 1 - 1 {
            break;
        }
        assert_eq!(remaining, 0, "no more than both refunds");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the refunds never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
