//! A `/metrics` endpoint on a real server, scraped by a real HTTP client:
//! the limiter's counts (feature `metrics`), handed to
//! metrics-exporter-prometheus's recorder and rendered in Prometheus's
//! text format, each line read back and checked to the exact count.

use std::net::Ipv4Addr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use http::HeaderName;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use tokio::net::TcpListener;
use tollgate::{Builder, Quota, RateLimiter};
use tollgate_http::{Header, HeaderKey, RateLimitLayer, Rule};

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
