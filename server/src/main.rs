//! `tollgate-server`: the rate-limit service proxies call.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use clap::{Parser, ValueEnum};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::TcpListenerStream;
use tollgate::algorithm::Carry;
use tollgate_redis::{Connection, OnFailure, Options};
use tollgate_server::config::Config;
use tollgate_server::limits::{Capacity, Reloaded};
use tollgate_server::remote::Redis;
use tollgate_server::rls::{Bounds, RateLimiting, Shared, current};
use tollgate_server::service::{Service, Store};
use tracing::{error, info, warn};

/// A rate-limit service for proxies: Envoy's RLS v3 over gRPC, on
/// envoyproxy/ratelimit's configuration files, decided by tollgate's
/// limiters in memory (the default) or on Redis (`--redis`), shared by
/// every server on it.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    /// The configuration: a YAML file, or a directory whose `.yaml` and
    /// `.yml` files are read in name order. Read again on SIGHUP and when
    /// a file changes; a configuration with an error is refused and the
    /// last good one kept.
    #[arg(long, env = "TOLLGATE_CONFIG")]
    config: PathBuf,
    /// The gRPC address (port 0: any free port, printed at start).
    #[arg(long, env = "TOLLGATE_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    grpc_addr: SocketAddr,
    /// The HTTP address of `/metrics`, `/json` and `/healthcheck` (port 0:
    /// any free port, printed at start).
    #[arg(long, env = "TOLLGATE_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// What a rule whose limit a reload changes keeps of each key.
    #[arg(long, env = "TOLLGATE_CARRY", value_enum, default_value_t = CarryFlag::AsIs)]
    carry: CarryFlag,
    /// How often the configuration's files are looked at for a change
    /// (and idle keys evicted), in milliseconds.
    #[arg(long, env = "TOLLGATE_WATCH_MS", default_value_t = 1_000)]
    watch_ms: u64,
    /// The keys each rule holds at most in this process: a descriptor that
    /// would add one past them is over its limit, and the keys held keep
    /// working. On Redis, the keys of a rule's local half (Redis's own
    /// keys are bounded by its memory, each expiring with its window).
    #[arg(long, env = "TOLLGATE_MAX_KEYS", default_value = "100000")]
    max_keys: NonZeroUsize,
    /// The limiters of limits descriptors bring themselves (a count and a
    /// unit each, per domain) held at most: one more, when none holds a
    /// key, holds its descriptor over its limit.
    #[arg(long, env = "TOLLGATE_MAX_OVERRIDES", default_value_t = 1_024)]
    max_overrides: usize,
    /// The descriptors a request may bring.
    #[arg(long, env = "TOLLGATE_MAX_DESCRIPTORS", default_value_t = Bounds::default().descriptors)]
    max_descriptors: usize,
    /// The bytes of a descriptor's keys and values together, each length
    /// written before it (`3:key5:value`): what the service keeps of it.
    #[arg(long, env = "TOLLGATE_MAX_DESCRIPTOR_BYTES", default_value_t = Bounds::default().descriptor_bytes)]
    max_descriptor_bytes: usize,
    /// Keep the limits in Redis at this URL (`redis://host:port/`), shared
    /// by every server on it, each rule decided as its `mode` says; with
    /// `--redis-cluster`, the Cluster's seed nodes (repeat the flag, or
    /// separate them by commas). Without it, the limits are in memory.
    #[arg(long, env = "TOLLGATE_REDIS", value_delimiter = ',')]
    redis: Vec<String>,
    /// `--redis` names a Redis Cluster's nodes.
    #[arg(long, env = "TOLLGATE_REDIS_CLUSTER", requires = "redis")]
    redis_cluster: bool,
    /// On a Cluster, the most its masters' clocks differ by, in
    /// milliseconds: what a rule deciding locally (`mode: deny_cached` or
    /// `leased`) needs there (without it, such a rule is refused).
    #[arg(
        long,
        env = "TOLLGATE_REDIS_CLUSTER_SKEW_MS",
        requires = "redis_cluster"
    )]
    redis_cluster_skew_ms: Option<u64>,
    /// What a descriptor gets while Redis cannot decide it (down, timed
    /// out, or behind the open circuit breaker).
    #[arg(long, env = "TOLLGATE_REDIS_ON_FAILURE", value_enum, default_value_t = FailureFlag::Error)]
    redis_on_failure: FailureFlag,
    /// With `--redis-on-failure local`: how many servers share each limit
    /// (each enforces its share while Redis is down).
    #[arg(long, env = "TOLLGATE_REDIS_SERVERS", default_value = "1")]
    redis_servers: std::num::NonZeroU32,
    /// The longest a Redis call may take, in milliseconds (a later reply
    /// is a failure). Keep the proxy's own timeout on the service (Envoy's
    /// `timeout`, 20 ms by default) at least five times this: a check may
    /// wait on others' calls before its own, and a refused request's
    /// refunds take one more; past it, the proxy's failure mode decides,
    /// not the policy.
    #[arg(long, env = "TOLLGATE_REDIS_TIMEOUT_MS", default_value_t = 250)]
    redis_timeout_ms: u64,
    /// The prefix of every Redis key the server writes (no `{` or `}`).
    #[arg(long, env = "TOLLGATE_REDIS_PREFIX", default_value = "tollgate:")]
    redis_prefix: String,
}

/// `--redis-on-failure`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum FailureFlag {
    /// The call fails with `UNAVAILABLE` (HTTP 503 on `/json`): the proxy
    /// applies its own policy (Envoy admits unless `failure_mode_deny`).
    Error,
    /// Over the limit: fails closed.
    Deny,
    /// Within the limit: fails open.
    Admit,
    /// Decided in this process on its share of each limit (the limit
    /// divided by `--redis-servers`).
    Local,
}

/// `--carry`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum CarryFlag {
    /// Each key keeps the units it had free (at most the new burst).
    AsIs,
    /// Each key keeps its fraction of the burst.
    Proportional,
    /// Each key's state as it is, read under the new limit.
    Unchanged,
}

impl From<CarryFlag> for Carry {
    fn from(flag: CarryFlag) -> Carry {
        match flag {
            CarryFlag::AsIs => Carry::AsIs,
            CarryFlag::Proportional => Carry::Proportional,
            CarryFlag::Unchanged => Carry::Unchanged,
        }
    }
}

/// The newest modification time among the configuration's files.
fn stamp(path: &Path) -> Option<SystemTime> {
    let modified = |path: &Path| {
        std::fs::metadata(path)
            .and_then(|meta| meta.modified())
            .ok()
    };
    if path.is_dir() {
        std::fs::read_dir(path)
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|entry| modified(&entry.path()))
            .chain(modified(path))
            .max()
    } else {
        modified(path)
    }
}

/// Loads the configuration again and swaps it in, keeping every unchanged
/// rule's state; a configuration with an error is logged and refused.
fn reload(flags: &Flags, limits: &Shared) {
    match Config::load(&flags.config) {
        Ok(config) => {
            let (next, report) = match current(limits).reload(config, flags.carry.into()) {
                Ok(reloaded) => reloaded,
                Err(refused) => {
                    tollgate_server::stats::reloaded(false);
                    error!(%refused, "configuration refused; the last good one is kept");
                    return;
                }
            };
            *limits.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(next);
            tollgate_server::stats::reloaded(true);
            for rule in report {
                match rule {
                    Reloaded::Carried(path) => info!(%path, "limit changed, every key carried"),
                    Reloaded::Fresh(path, why) => {
                        warn!(%path, %why, "limit changed, its keys start fresh");
                    }
                    Reloaded::Pending(path) => warn!(
                        %path,
                        "limit changed, keys not carried yet (a check stalled): the old limit \
                         decides until the next reload"
                    ),
                    Reloaded::Remade(path) => info!(
                        %path,
                        "mode changed: a new limiter on the same keys, carried if the limit \
                         changed"
                    ),
                }
            }
            info!(config = %flags.config.display(), "configuration reloaded");
        }
        Err(refused) => {
            tollgate_server::stats::reloaded(false);
            error!(%refused, "configuration refused; the last good one is kept");
        }
    }
}

/// Where the limits are kept: Redis if `--redis` names it (connected
/// now), else memory.
async fn store(flags: &Flags) -> Result<Store, String> {
    if flags.redis.is_empty() {
        return Ok(Store::Memory);
    }
    let options =
        Options::default().call_timeout(Duration::from_millis(flags.redis_timeout_ms.max(1)));
    let connection = if flags.redis_cluster {
        Connection::cluster_with(flags.redis.iter().map(String::as_str), options).await
    } else if let [url] = &flags.redis[..] {
        Connection::open_with(url.as_str(), options).await
    } else {
        return Err("--redis names one server, or a Cluster's nodes with --redis-cluster".into());
    }
    .map_err(|refused| format!("redis {}: {refused}", flags.redis.join(",")))?;
    let on_failure = match flags.redis_on_failure {
        FailureFlag::Error => OnFailure::Error,
        FailureFlag::Deny => OnFailure::Deny,
        FailureFlag::Admit => OnFailure::Admit,
        FailureFlag::Local => OnFailure::Local {
            instances: flags.redis_servers.get(),
        },
    };
    if flags.redis_prefix.contains(['{', '}']) {
        return Err(format!(
            "--redis-prefix {:?} holds a brace",
            flags.redis_prefix
        ));
    }
    let redis = Redis::new(connection, on_failure, flags.redis_prefix.clone());
    Ok(Store::Redis(match flags.redis_cluster_skew_ms {
        Some(skew) => redis.cluster_clock_skew(Duration::from_millis(skew)),
        None => redis,
    }))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let flags = Arc::new(Flags::parse());
    // Before anything is printed: a SIGHUP from then on reloads, never
    // kills.
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    // Read before loading: a write after it shows at the first tick.
    let loaded = stamp(&flags.config);
    let config = match Config::load(&flags.config) {
        Ok(config) => config,
        Err(refused) => {
            eprintln!("tollgate-server: {refused}");
            return std::process::ExitCode::from(2);
        }
    };
    let store = match store(&flags).await {
        Ok(store) => store,
        Err(refused) => {
            eprintln!("tollgate-server: {refused}");
            return std::process::ExitCode::from(2);
        }
    };
    let capacity = Capacity {
        max_keys: flags.max_keys,
        max_overrides: flags.max_overrides,
    };
    let limits: Shared = match Service::new(config, store, capacity) {
        Ok(service) => Arc::new(RwLock::new(Arc::new(service))),
        Err(refused) => {
            eprintln!("tollgate-server: {refused}");
            return std::process::ExitCode::from(2);
        }
    };
    let metrics = match metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder() {
        Ok(metrics) => metrics,
        Err(refused) => {
            eprintln!("tollgate-server: the metrics recorder: {refused}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let (listener, http_listener) = match (
        TcpListener::bind(flags.grpc_addr).await,
        TcpListener::bind(flags.http_addr).await,
    ) {
        (Ok(listener), Ok(http_listener)) => (listener, http_listener),
        (Err(refused), _) => {
            eprintln!("tollgate-server: {}: {refused}", flags.grpc_addr);
            return std::process::ExitCode::from(2);
        }
        (_, Err(refused)) => {
            eprintln!("tollgate-server: {}: {refused}", flags.http_addr);
            return std::process::ExitCode::from(2);
        }
    };
    let address = listener.local_addr().unwrap_or(flags.grpc_addr);
    let http_address = http_listener.local_addr().unwrap_or(flags.http_addr);
    // The one line on standard output: where to call.
    println!("tollgate-server listening on {address} (gRPC) and {http_address} (HTTP)");
    info!(%address, %http_address, "serving Envoy's rate-limit service");
    let bounds = Bounds {
        descriptors: flags.max_descriptors,
        descriptor_bytes: flags.max_descriptor_bytes,
    };
    let http = tokio::spawn(
        axum::serve(
            http_listener,
            tollgate_server::http::router(limits.clone(), bounds, metrics),
        )
        .into_future(),
    );

    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<RateLimitServiceServer<RateLimiting>>()
        .await;

    // Reloads: on SIGHUP, and when a file's modification time has moved
    // and then stayed for a tick (a file being written is not read half
    // way); again while a rule's change is pending.
    let watcher = {
        let (flags, limits) = (flags.clone(), limits.clone());
        tokio::spawn(async move {
            let mut hangups = hangups;
            let mut ticks = tokio::time::interval(Duration::from_millis(flags.watch_ms.max(10)));
            let mut last = loaded;
            let mut moving = last;
            loop {
                let hangup = async {
                    match hangups.as_mut() {
                        Some(hangups) => hangups.recv().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = hangup => {
                        info!("SIGHUP: reloading");
                        // Read before loading: a write after it shows at
                        // the next tick.
                        last = stamp(&flags.config);
                        moving = last;
                        reload(&flags, &limits);
                    }
                    _ = ticks.tick() => {
                        let now = stamp(&flags.config);
                        let pending = current(&limits).pending();
                        if (now != last && now == moving) || pending {
                            last = now;
                            reload(&flags, &limits);
                        }
                        moving = now;
                        let evicted = current(&limits).evict_idle();
                        if evicted > 0 {
                            tracing::debug!(evicted, "idle keys evicted");
                        }
                    }
                }
            }
        })
    };

    let shutdown = async {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut terminate) => {
                    terminate.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = terminate => {}
        }
        info!("shutting down: answering what is in flight");
    };
    // Each connection without Nagle's delay: a small answer waiting on the
    // peer's delayed acknowledgement would cost a call 40 ms.
    let incoming = TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|stream| {
            if let Err(refused) = stream.set_nodelay(true) {
                warn!(%refused, "TCP_NODELAY not set");
            }
        })
    });
    let served = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(RateLimitServiceServer::new(RateLimiting::new(
            limits, bounds,
        )))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    watcher.abort();
    http.abort();
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(failed) => {
            warn!(%failed, "the server stopped");
            std::process::ExitCode::FAILURE
        }
    }
}
