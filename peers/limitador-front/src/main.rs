//! `tollgate-limitador-front`: Kuadrant's limitador library (the engine of
//! limitador-server) behind the gRPC front tollgate-server has (tonic,
//! Envoy's RLS v3 from `envoy-types`, `TCP_NODELAY` on every connection),
//! so that the lab measures the two engines under the same load. Each
//! `--limit DOMAIN:KEY:COUNT:SECONDS` is a limit of COUNT a window of
//! SECONDS per value of the descriptor key KEY in domain DOMAIN, read as
//! limitador-server reads Envoy's descriptors (a list bound to
//! `descriptors`, the limit's variable `descriptors[0].KEY`).
//!
//! ```sh
//! tollgate-limitador-front --storage cached --redis redis://127.0.0.1:6379/ --limit bench:hot:1000:1
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use limitador::limit::{Context, Expression, Limit, Namespace};
use limitador::storage::AsyncStorage;
use limitador::storage::redis::{AsyncRedisStorage, CachedRedisStorage};
use limitador::{AsyncRateLimiter, RateLimiter};
use tokio::net::TcpListener;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// limitador's engines: in memory it is blocking, on Redis async (as
/// limitador-server runs them).
enum Engine {
    Memory(RateLimiter),
    Redis(AsyncRateLimiter),
}

struct Front {
    engine: Engine,
}

#[tonic::async_trait]
impl RateLimitService for Front {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let namespace = Namespace::from(request.domain.as_str());
        let descriptors: Vec<HashMap<String, String>> = request
            .descriptors
            .iter()
            .map(|descriptor| {
                descriptor
                    .entries
                    .iter()
                    .map(|entry| (entry.key.clone(), entry.value.clone()))
                    .collect()
            })
            .collect();
        let mut context = Context::default();
        context.list_binding("descriptors".to_owned(), descriptors);
        let delta = u64::from(request.hits_addend.max(1));
        let checked = match &self.engine {
            Engine::Memory(limiter) => {
                limiter.check_rate_limited_and_update(&namespace, &context, delta)
            }
            Engine::Redis(limiter) => {
                limiter
                    .check_rate_limited_and_update(&namespace, &context, delta)
                    .await
            }
        }
        .map_err(|failed| Status::unavailable(failed.to_string()))?;
        Ok(Response::new(RateLimitResponse {
            overall_code: if checked.limited {
                Code::OverLimit
            } else {
                Code::Ok
            }
            .into(),
            ..RateLimitResponse::default()
        }))
    }
}

/// The flags, read by hand: `--grpc-addr A --storage memory|redis|cached
/// --redis URL` and `--limit DOMAIN:KEY:COUNT:SECONDS`, repeated.
struct Flags {
    address: SocketAddr,
    storage: String,
    redis: String,
    limits: Vec<Limit>,
}

/// A limit of `--limit DOMAIN:KEY:COUNT:SECONDS`.
fn limit(value: &str) -> Result<Limit, String> {
    let bad = || format!("--limit {value}: DOMAIN:KEY:COUNT:SECONDS");
    let [domain, key, count, seconds] = value.split(':').collect::<Vec<_>>()[..] else {
        return Err(bad());
    };
    let variable = Expression::parse(format!("descriptors[0].{key}")).map_err(|_| bad())?;
    Ok(Limit::new(
        domain,
        count.parse().map_err(|_| bad())?,
        seconds.parse().map_err(|_| bad())?,
        [],
        [variable],
    ))
}

fn flags() -> Result<Flags, String> {
    let mut flags = Flags {
        address: SocketAddr::from(([127, 0, 0, 1], 0)),
        storage: "memory".to_owned(),
        redis: "redis://127.0.0.1:6379/".to_owned(),
        limits: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--grpc-addr" => {
                flags.address = value.parse().map_err(|_| format!("{flag} {value}"))?;
            }
            "--storage" => flags.storage.clone_from(&value),
            "--redis" => flags.redis.clone_from(&value),
            "--limit" => flags.limits.push(limit(&value)?),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(flags)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let flags = flags()?;
    let engine = match flags.storage.as_str() {
        "memory" => {
            let limiter = RateLimiter::new(10_000);
            for limit in flags.limits {
                limiter.add_limit(limit);
            }
            Engine::Memory(limiter)
        }
        storage @ ("redis" | "cached") => {
            let storage = if storage == "redis" {
                AsyncStorage::with_counter_storage(Box::new(
                    AsyncRedisStorage::new(&flags.redis).await?,
                ))
            } else {
                AsyncStorage::with_counter_storage(Box::new(
                    CachedRedisStorage::new(&flags.redis).await?,
                ))
            };
            let limiter = limitador::AsyncRateLimiterBuilder::new(storage).build();
            for limit in flags.limits {
                limiter.add_limit(limit);
            }
            Engine::Redis(limiter)
        }
        other => return Err(format!("unknown storage {other}").into()),
    };
    let listener = TcpListener::bind(flags.address).await?;
    println!("limitador-front listening on {}", listener.local_addr()?);
    let incoming = TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|stream| {
            let _ = stream.set_nodelay(true);
        })
    });
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Front { engine }))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
