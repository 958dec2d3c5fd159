//! A quota raised at runtime while traffic runs, without handing anyone a
//! new burst: the limiter is shared with an admin route that changes it.
//!
//! ```sh
//! cargo run -p tollgate-http --example axum_quota_change            # serves on 127.0.0.1:3000
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/
//! curl -i -X POST http://127.0.0.1:3000/admin/quota/6               # 6 a minute from now on
//! cargo run -p tollgate-http --example axum_quota_change -- --demo  # serves, calls itself, prints
//! ```
//!
//! Every API key is held to 3 a minute until the admin route changes the
//! quota. Each key keeps what it has used (carried as is): a key that had
//! drained its 3 is still drained under 6 (it refills at the new rate), a
//! key that had used none has the whole new burst. The admin route must
//! not be reachable by clients (this example binds to loopback only).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use http::HeaderName;
use tollgate::algorithm::Carry;
use tollgate::{Quota, RateLimiter};
use tollgate_http::{Header, HeaderKey, RateLimitLayer, Rule};

type Limiter = Arc<RateLimiter<HeaderKey>>;

/// Sets the quota to `per_minute` a minute, every key carried as is.
async fn set_quota(
    State(limiter): State<Limiter>,
    Path(per_minute): Path<u32>,
) -> (StatusCode, String) {
    let quota = match Quota::per_minute(per_minute) {
        Ok(quota) => quota,
        Err(error) => return (StatusCode::BAD_REQUEST, format!("{error}\n")),
    };
    match limiter.set_quota(quota, Carry::AsIs) {
        Ok(()) => (StatusCode::OK, format!("{per_minute} a minute\n")),
        Err(error) => (StatusCode::CONFLICT, format!("{error}\n")),
    }
}

/// The service: one limited route, and the admin route beside it (not
/// limited), sharing the limiter.
fn app(limiter: &Limiter) -> Result<Router, Box<dyn std::error::Error>> {
    let per_key = Rule::new(
        "per-key",
        Arc::clone(limiter),
        Header::new(HeaderName::from_static("x-api-key")),
    )?;
    let limited = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::builder().rule(per_key).build());
    let admin = Router::new()
        .route("/admin/quota/{per_minute}", post(set_quota))
        .with_state(Arc::clone(limiter));
    Ok(limited.merge(admin))
}

/// Sends `key`'s requests until one is refused; prints what it got.
async fn drain(
    client: &reqwest::Client,
    address: std::net::SocketAddr,
    key: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut admitted = 0;
    loop {
        let response = client
            .get(format!("http://{address}/"))
            .header("x-api-key", key)
            .send()
            .await?;
        if !response.status().is_success() {
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or("")
                    .to_owned()
            };
            println!(
                "{key}: {admitted} admitted, then {} (retry-after {} s; {})",
                response.status(),
                header("retry-after"),
                header("ratelimit-policy"),
            );
            return Ok(());
        }
        admitted += 1;
    }
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
    let limiter: Limiter = Arc::new(RateLimiter::keyed(Quota::per_minute(3)?));
    let server = axum::serve(listener, app(&limiter)?);
    if !demo {
        server.await?;
        return Ok(());
    }
    tokio::spawn(async move { server.await });
    let client = reqwest::Client::new();
    drain(&client, address, "alice").await?;
    let raised = client
        .post(format!("http://{address}/admin/quota/6"))
        .send()
        .await?
        .text()
        .await?;
    print!("quota raised: {raised}");
    // Alice keeps what she used: still drained, refilling at the new rate.
    drain(&client, address, "alice").await?;
    // Bob, who had used nothing, has the new burst.
    drain(&client, address, "bob").await?;
    Ok(())
}
