//! A limited axum service with a Prometheus `/metrics` endpoint (the core's
//! feature `metrics`, rendered by metrics-exporter-prometheus).
//!
//! ```sh
//! cargo run -p tollgate-http --example axum_metrics            # serves on 127.0.0.1:3000
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/
//! curl http://127.0.0.1:3000/metrics
//! cargo run -p tollgate-http --example axum_metrics -- --demo  # serves, calls itself, prints
//! ```
//!
//! Each API key is held to 3 a minute. The limiter counts its checks per
//! thread, with no shared write on the check path; the `/metrics` handler
//! hands the counts to the recorder (`publish_metrics`) and renders them.

use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use http::HeaderName;
use metrics_exporter_prometheus::PrometheusBuilder;
use tollgate::{Builder, Quota, RateLimiter};
use tollgate_http::{Header, HeaderKey, RateLimitLayer, Rule};

/// The service: `/` behind the per-key limit, and `/metrics` beside it.
fn app() -> Result<Router, Box<dyn std::error::Error>> {
    let limiter: Arc<RateLimiter<HeaderKey>> = Arc::new(
        Builder::new(Quota::per_minute(3)?)
            .metrics("per-key")
            .build(),
    );
    let rule = Rule::new(
        "per-key",
        Arc::clone(&limiter),
        Header::new(HeaderName::from_static("x-api-key")),
    )?;
    let recorder = Arc::new(PrometheusBuilder::new().build_recorder());
    let handle = recorder.handle();
    let metrics = move || {
        let (recorder, handle, limiter) =
            (Arc::clone(&recorder), handle.clone(), Arc::clone(&limiter));
        async move {
            metrics::with_local_recorder(&*recorder, || limiter.publish_metrics());
            handle.render()
        }
    };
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::builder().rule(rule).build())
        .route("/metrics", get(metrics)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = std::env::args().any(|arg| arg == "--demo");
    let listener = tokio::net::TcpListener::bind(if demo {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    })
    .await?;
    let address = listener.local_addr()?;
    println!("listening on http://{address}");
    let server = axum::serve(listener, app()?);
    if !demo {
        server.await?;
        return Ok(());
    }
    tokio::spawn(async move { server.await });
    let client = reqwest::Client::new();
    for key in ["alice", "alice", "alice", "alice", "bob"] {
        let status = client
            .get(format!("http://{address}/"))
            .header("x-api-key", key)
            .send()
            .await?
            .status();
        println!("{key}: {status}");
    }
    let page = client
        .get(format!("http://{address}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    for line in page.lines().filter(|line| line.starts_with("tollgate_")) {
        println!("{line}");
    }
    Ok(())
}
