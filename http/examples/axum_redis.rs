//! The same service as `axum_in_process`, with both limits kept in Redis,
//! so that every instance of the service shares them.
//!
//! ```sh
//! redis-server --port 6379 &
//! cargo run -p tollgate-http --example axum_redis -- redis://127.0.0.1:6379/
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/api/hello
//! ```
//!
//! Run two of them (the second with `--port 3001`) and their counts are one.
//! While Redis is down, each instance falls back to a third of the quota
//! in process (`OnFailure::Local`: 1 a minute per key, 6 per network), and
//! its `RateLimit-Policy` says so (`q=1;w=60`, `q=6;w=60`); a limit that
//! still cannot decide answers 503 with the draft's
//! temporary-reduced-capacity problem.
//!
//! Clients choose their keys. Redis holds them, each expiring once it has
//! rested back to its full quota; in process, a limiter holds none while
//! Redis answers, and its fallback at most 100 000 (a new key beyond them
//! is denied until Redis is back). API keys longer than 256 bytes are
//! answered 431, so no key costs more than that anywhere.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use http::HeaderName;
use tollgate::Quota;
use tollgate_http::{Header, PeerIp, RateLimitLayer, Rule};
use tollgate_redis::{Connection, OnFailure, RedisLimiter};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut url = "redis://127.0.0.1:6379/".to_owned();
    let mut port = 3000;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => port = args.next().ok_or("--port needs a number")?.parse()?,
            other => url = other.to_owned(),
        }
    }
    let connection = Connection::open(url.as_str()).await?;
    let per_key = Rule::new(
        "per-key",
        RedisLimiter::builder("example-per-key", Quota::per_minute(5)?)
            .on_failure(OnFailure::Local { instances: 3 })
            .build(connection.clone())?,
        Header::new(HeaderName::from_static("x-api-key")),
    )?
    .when(|head| head.uri().path().starts_with("/api/"));
    let per_ip = Rule::new(
        "per-ip",
        RedisLimiter::builder("example-per-ip", Quota::per_minute(20)?)
            .on_failure(OnFailure::Local { instances: 3 })
            .build(connection)?,
        PeerIp::new(),
    )?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/api/hello", get(|| async { "hello, API client\n" }))
        .layer(RateLimitLayer::builder().rule(per_key).rule(per_ip).build());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{}, limits in {url}",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
