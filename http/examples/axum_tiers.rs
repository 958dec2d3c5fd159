//! A tiered API: free and pro clients in one limiter, the tier named by a
//! header that the gateway in front sets.
//!
//! ```sh
//! cargo run -p tollgate-http --example axum_tiers            # serves on 127.0.0.1:3000
//! curl -i -H 'x-api-key: alice' -H 'x-plan: pro' http://127.0.0.1:3000/
//! cargo run -p tollgate-http --example axum_tiers -- --demo  # serves, calls itself, prints
//! ```
//!
//! Every API key is held to 3 a minute, or 6 a minute on the `pro` plan,
//! in one limiter: a key that upgrades keeps what it has used. The plan
//! header must come from something the service trusts (an API gateway that
//! sets it from the key's account and strips it from clients): a client
//! that can send it chooses its own quota.

use axum::Router;
use axum::routing::get;
use http::HeaderName;
use tollgate::{Quota, RateLimiter};
use tollgate_http::{Header, HeaderKey, RateLimitLayer, Rule, Tiers};

/// The service: one route behind the per-key limit and its tiers.
fn app() -> Result<Router, Box<dyn std::error::Error>> {
    let per_key = Rule::new(
        "per-key",
        RateLimiter::<HeaderKey>::keyed(Quota::per_minute(3)?),
        Header::new(HeaderName::from_static("x-api-key")),
    )?
    .tiers(Tiers::header(HeaderName::from_static("x-plan")).tier("pro", Quota::per_minute(6)?))?;
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::builder().rule(per_key).build()))
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
    for (key, plan) in [("alice", None), ("bob", Some("pro"))] {
        let mut admitted = 0;
        loop {
            let mut request = client
                .get(format!("http://{address}/"))
                .header("x-api-key", key);
            if let Some(plan) = plan {
                request = request.header("x-plan", plan);
            }
            let response = request.send().await?;
            let policy = response
                .headers()
                .get("ratelimit-policy")
                .map(|value| value.to_str().unwrap_or("").to_owned())
                .unwrap_or_default();
            if !response.status().is_success() {
                println!(
                    "{key} ({}): {admitted} admitted, then {} ({policy})",
                    plan.unwrap_or("free"),
                    response.status()
                );
                break;
            }
            admitted += 1;
        }
    }
    Ok(())
}
