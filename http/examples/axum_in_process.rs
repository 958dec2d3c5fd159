//! An axum service limited per API key and per client network, in process.
//!
//! ```sh
//! cargo run -p tollgate-http --example axum_in_process            # serves on 127.0.0.1:3000
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/api/hello
//! cargo run -p tollgate-http --example axum_in_process -- --demo  # serves, calls itself, prints
//! ```
//!
//! `/api/*` needs an `x-api-key` and is held to 5 a minute per key; every
//! path is held to 20 a minute per client network (IPv6 by /64). The key's
//! limit comes first: what it refuses never reaches the per-network budget.
//!
//! Clients choose their keys, so each limiter holds at most [`MAX_KEYS`]
//! of them: a new key beyond them is answered 503 until idle keys (a key is
//! idle once it has rested back to its full quota, a minute at most here)
//! make room. With API keys of at most 256 bytes (longer: 431), the keys
//! take at most about 28 MB and the networks about 4 MB
//! (`notes/11-http.md` measures what a key costs).

use std::net::SocketAddr;
use std::num::NonZeroUsize;

use axum::Router;
use axum::routing::get;
use http::HeaderName;
use tollgate::store::WhenFull;
use tollgate::{Builder, Quota};
use tollgate_http::{Header, HeaderKey, IpKey, PeerIp, RateLimitLayer, Rule};

/// The most keys each limiter holds.
const MAX_KEYS: NonZeroUsize = NonZeroUsize::new(100_000).expect("nonzero");

/// The service: its routes behind the two limits.
fn app() -> Result<Router, Box<dyn std::error::Error>> {
    let per_key = Rule::new(
        "per-key",
        Builder::new(Quota::per_minute(5)?)
            .max_keys(MAX_KEYS, WhenFull::Reject)
            .build::<HeaderKey>(),
        Header::new(HeaderName::from_static("x-api-key")),
    )?
    .when(|head| head.uri().path().starts_with("/api/"));
    let per_ip = Rule::new(
        "per-ip",
        Builder::new(Quota::per_minute(20)?)
            .max_keys(MAX_KEYS, WhenFull::Reject)
            .build::<IpKey>(),
        PeerIp::new(),
    )?;
    let layer = RateLimitLayer::builder().rule(per_key).rule(per_ip).build();
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/api/hello", get(|| async { "hello, API client\n" }))
        .layer(layer))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = std::env::args().any(|arg| arg == "--demo");
    // The demo takes any free port; serving, the usual 3000.
    let listener = tokio::net::TcpListener::bind(if demo {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    })
    .await?;
    let address = listener.local_addr()?;
    println!("listening on http://{address}");
    let server = axum::serve(
        listener,
        app()?.into_make_service_with_connect_info::<SocketAddr>(),
    );
    if !demo {
        server.await?;
        return Ok(());
    }
    tokio::spawn(async move { server.await });
    let client = reqwest::Client::new();
    for attempt in 1..=7 {
        let response = client
            .get(format!("http://{address}/api/hello"))
            .header("x-api-key", "alice")
            .send()
            .await?;
        println!("\nrequest {attempt}: {}", response.status());
        for name in [
            "retry-after",
            "ratelimit-policy",
            "ratelimit",
            "content-type",
        ] {
            for value in response.headers().get_all(name) {
                println!("  {name}: {}", value.to_str()?);
            }
        }
        println!("  {}", response.text().await?.trim_end());
    }
    Ok(())
}
