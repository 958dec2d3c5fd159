//! A `/metrics` endpoint on a real server, scraped by a real HTTP client:
//! the limiter's counts (feature `metrics`), handed to
//! metrics-exporter-prometheus's recorder and rendered in Prometheus's
//! text format, each line read back and checked to the exact count.

#[allow(dead_code)]
#[path = "../../redis/tests/support/redis.rs"]
mod redis_server;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::HeaderName;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use tokio::net::TcpListener;
use tollgate::{Builder, Quota, RateLimiter};
use tollgate_http::{Header, HeaderKey, RateLimitLayer, Rule};
use tollgate_redis::{Connection, Mode, OnFailure, Options, RedisLimiter};

/// The value of the sample `name{labels}` in a Prometheus text page.
fn sample(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, rest) = series.split_once('{').unwrap_or((series, "}"));
            let found: Vec<(&str, &str)> = rest
                .trim_end_matches('}')
                .split(',')
                .filter(|pair| !pair.is_empty())
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=')?;
                    Some((key, value.trim_matches('"')))
                })
                .collect();
            let matches = series_name == name
                && found.len() == labels.len()
                && labels.iter().all(|label| found.contains(label));
            matches.then(|| value.parse().ok()).flatten()
        })
}

#[tokio::test]
async fn a_scrape_reads_each_limiters_exact_counts() {
    let recorder: Arc<PrometheusRecorder> = Arc::new(PrometheusBuilder::new().build_recorder());
    let handle = recorder.handle();
    let limiter: Arc<RateLimiter<HeaderKey>> = Arc::new(
        Builder::new(Quota::per_minute(3).unwrap())
            .metrics("per-key")
            .build(),
    );
    let rule = Rule::new(
        "per-key",
        Arc::clone(&limiter),
        Header::new(HeaderName::from_static("x-api-key")),
    )
    .unwrap();
    let scraped = {
        let limiter = Arc::clone(&limiter);
        move || {
            let (recorder, handle, limiter) =
                (Arc::clone(&recorder), handle.clone(), Arc::clone(&limiter));
            async move {
                metrics::with_local_recorder(&*recorder, || limiter.publish_metrics());
                handle.render()
            }
        }
    };
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::builder().rule(rule).build())
        .route("/metrics", get(scraped));
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for key in ["alice", "alice", "alice", "alice", "alice", "bob"] {
        let response = client
            .get(format!("http://{address}/"))
            .header("x-api-key", key)
            .send()
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 200]);

    let page = client
        .get(format!("http://{address}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let per_key = |name: &str, outcome: Option<&str>| {
        let mut labels = vec![("limiter", "per-key")];
        labels.extend(outcome.map(|outcome| ("outcome", outcome)));
        sample(&page, name, &labels).unwrap_or_else(|| panic!("no {name} {outcome:?} in\n{page}"))
    };
    assert_eq!(per_key("tollgate_checks_total", Some("admitted")), 4.0);
    assert_eq!(per_key("tollgate_checks_total", Some("denied")), 2.0);
    assert_eq!(per_key("tollgate_units_total", Some("admitted")), 4.0);
    assert_eq!(per_key("tollgate_units_total", Some("denied")), 2.0);
    assert_eq!(per_key("tollgate_keys", None), 2.0);
    let refusals = sample(
        &page,
        "tollgate_new_key_refusals_total",
        &[("limiter", "per-key"), ("reason", "full")],
    );
    assert_eq!(refusals, Some(0.0));
    assert_eq!(per_key("tollgate_evictions_total", None), 0.0);
}

/// Redis limiters' counts, scraped the same way: an exact one, a
/// deny-cached one (denials decided locally once the key is drained), and
/// one whose Redis is killed (errors, the breaker opening, the failure
/// policy's decisions). Every figure is exact.
#[tokio::test]
async fn a_scrape_reads_redis_limiters_round_trips_and_failures() {
    // The global recorder (the only test here that installs one): round
    // trips are recorded as they happen, not when published.
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("no recorder installed before");
    let redis = redis_server::RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let mut doomed = redis_server::RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    // One failure opens the breaker, for a minute.
    let options = Options::default()
        .call_timeout(Duration::from_millis(500))
        .breaker(1, Duration::from_secs(60));
    let open = |port: u16| Connection::open_with(format!("redis://127.0.0.1:{port}/"), options);
    let quota = Quota::per_minute(3).unwrap();
    let exact = Arc::new(
        RedisLimiter::builder("exact", quota)
            .metrics()
            .build(open(redis.port()).await.unwrap())
            .unwrap(),
    );
    let cached = Arc::new(
        RedisLimiter::builder("cached", quota)
            .mode(Mode::DenyCached)
            .metrics()
            .build(open(redis.port()).await.unwrap())
            .unwrap(),
    );
    let dead = Arc::new(
        RedisLimiter::builder("dead", quota)
            .on_failure(OnFailure::Deny)
            .metrics()
            .build(open(doomed.port()).await.unwrap())
            .unwrap(),
    );
    // Each limiter behind a route of its own.
    let limited = |path: &str, limiter: &Arc<RedisLimiter>| {
        let name = path.trim_start_matches('/').to_owned();
        Router::new()
            .route(path, get(|| async { "hello" }))
            .route_layer(
                RateLimitLayer::builder()
                    .rule(
                        Rule::new(
                            name,
                            Arc::clone(limiter),
                            Header::new(HeaderName::from_static("x-api-key")),
                        )
                        .unwrap(),
                    )
                    .build(),
            )
    };
    let app = limited("/exact", &exact)
        .merge(limited("/cached", &cached))
        .merge(limited("/dead", &dead))
        .route(
            "/metrics",
            get(move || {
                let handle = handle.clone();
                let limiters = [Arc::clone(&exact), Arc::clone(&cached), Arc::clone(&dead)];
                async move {
                    for limiter in &limiters {
                        limiter.publish_metrics();
                    }
                    handle.render()
                }
            }),
        );
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let statuses = |path: &'static str, times: usize| {
        let client = client.clone();
        async move {
            let mut statuses = Vec::new();
            for _ in 0..times {
                let response = client
                    .get(format!("http://{address}/{path}"))
                    .header("x-api-key", "alice")
                    .send()
                    .await
                    .unwrap();
                statuses.push(response.status().as_u16());
            }
            statuses
        }
    };
    assert_eq!(statuses("exact", 5).await, [200, 200, 200, 429, 429]);
    assert_eq!(statuses("cached", 6).await, [200, 200, 200, 429, 429, 429]);
    doomed.kill();
    assert_eq!(statuses("dead", 3).await, [429, 429, 429]);

    let page = client
        .get(format!("http://{address}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str, labels: &[(&str, &str)]| {
        sample(&page, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in\n{page}"))
    };
    for (limiter, admitted, denied, calls, local) in [
        ("exact", 3.0, 2.0, 5.0, 0.0),
        ("cached", 3.0, 3.0, 3.0, 3.0),
        // The failure policy's three denials are the limiter's decisions.
        ("dead", 0.0, 3.0, 1.0, 0.0),
    ] {
        let checks = |outcome| {
            value(
                "tollgate_checks_total",
                &[("limiter", limiter), ("outcome", outcome)],
            )
        };
        assert_eq!(
            (checks("admitted"), checks("denied")),
            (admitted, denied),
            "{limiter}"
        );
        let of = [("limiter", limiter)];
        assert_eq!(value("tollgate_redis_calls_total", &of), calls, "{limiter}");
        assert_eq!(
            value("tollgate_redis_local_decisions_total", &of),
            local,
            "{limiter}"
        );
        assert_eq!(
            value("tollgate_redis_round_trip_seconds_count", &of),
            calls,
            "{limiter}: one time a call"
        );
    }
    let dead = |name: &str, label: Option<(&str, &str)>| {
        let mut labels = vec![("limiter", "dead")];
        labels.extend(label);
        value(name, &labels)
    };
    // The first call fails (the server is gone) and opens the breaker; it
    // keeps the next two back. The policy decides all three.
    assert_eq!(
        dead("tollgate_redis_errors_total", Some(("kind", "connection"))),
        1.0
    );
    assert_eq!(
        dead(
            "tollgate_redis_errors_total",
            Some(("kind", "breaker_open"))
        ),
        2.0
    );
    assert_eq!(
        dead("tollgate_redis_errors_total", Some(("kind", "timeout"))),
        0.0
    );
    assert_eq!(dead("tollgate_redis_fallback_decisions_total", None), 3.0);
    assert_eq!(dead("tollgate_redis_breaker_open", None), 1.0);
    assert_eq!(
        dead(
            "tollgate_redis_breaker_transitions_total",
            Some(("to", "open"))
        ),
        1.0
    );
    assert_eq!(
        dead(
            "tollgate_redis_breaker_transitions_total",
            Some(("to", "closed"))
        ),
        0.0
    );
}
