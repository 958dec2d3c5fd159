//! The HTTP section: what the layer costs in front of an axum server,
//! against the same server with no layer and with tower_governor's, on the
//! allowed path and the denied one.
//!
//! Two measurements, each in interleaved rounds (every variant once per
//! round, in turn), reported as the median and its 95 % interval over
//! rounds (the order-statistics interval of `stats::median_ci`):
//!
//! * **in memory**: the router called as a tower service on one thread,
//!   no network, timed by the thread's CPU clock (so another process's
//!   turn on a shared core is not counted), and the layer's added CPU
//!   time is the difference from the router without it. Each router is
//!   first given its state (`Router::with_state`), as `axum::serve` does
//!   through `into_make_service`: a router called without it builds each
//!   route's service, and runs each layer's `Layer::layer`, on every
//!   request, which no server does;
//! * **over loopback**: a real server (one worker thread) and a real
//!   client (reqwest), requests per second with 16 in flight, and the
//!   latency of one request at a time.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use tokio::runtime::Runtime;
use tollgate::{Builder, Quota};
use tollgate_http::{IpKey, PeerIp, RateLimitLayer, Rule};
use tower::{Service, ServiceExt};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

use crate::stats::{Estimate, median, median_ci};

/// How long each cell runs, and how many rounds.
pub struct Budget {
    pub per_cell: Duration,
    pub rounds: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Allowed,
    Denied,
}

impl Path {
    const ALL: [Path; 2] = [Path::Allowed, Path::Denied];

    fn name(self) -> &'static str {
        match self {
            Path::Allowed => "allowed",
            Path::Denied => "denied",
        }
    }

    /// tollgate's quota: every request admitted, or one an hour (drained
    /// by the warm-up).
    fn quota(self) -> Quota {
        match self {
            Path::Allowed => Quota::per_second(1_000_000_000).unwrap(),
            Path::Denied => Quota::per_hour(1).unwrap(),
        }
    }

    /// The same for tower_governor: one replenished per `period`, bursts of
    /// `burst`.
    fn governor(self) -> (Duration, u32) {
        match self {
            Path::Allowed => (Duration::from_nanos(1), 1_000_000_000),
            Path::Denied => (Duration::from_secs(3_600), 1),
        }
    }
}

/// The variants, in pairs that do the same work: each tollgate variant is
/// judged against the tower_governor variant that sends as much on an
/// admitted response (the fields or `x-ratelimit-*` headers, or nothing).
const VARIANTS: [&str; 5] = [
    "no layer",
    "tollgate, fields on success",
    "tower_governor, headers on success",
    "tollgate, nothing on success",
    "tower_governor, nothing on success",
];

/// The variant each is judged against.
const JUDGED_AGAINST: [usize; 5] = [4, 2, 2, 4, 4];

/// The router for variant `index` on `path`.
fn router(index: usize, path: Path) -> Router {
    let app = Router::new().route("/", get(|| async { "hello" }));
    let rule = || {
        Rule::new(
            "per-ip",
            Builder::new(path.quota()).build::<IpKey>(),
            PeerIp::new(),
        )
        .expect("a valid name")
    };
    let (period, burst) = path.governor();
    match index {
        0 => app,
        1 => app.layer(RateLimitLayer::builder().rule(rule()).build()),
        2 => {
            let config = GovernorConfigBuilder::default()
                .period(period)
                .burst_size(burst)
                .use_headers()
                .finish()
                .expect("a valid governor config");
            app.layer(GovernorLayer::new(Arc::new(config)))
        }
        3 => app.layer(
            RateLimitLayer::builder()
                .rule(rule())
                .fields_on_success(false)
                .build(),
        ),
        _ => {
            let config = GovernorConfigBuilder::default()
                .period(period)
                .burst_size(burst)
                .finish()
                .expect("a valid governor config");
            app.layer(GovernorLayer::new(Arc::new(config)))
        }
    }
}

/// The round-by-round ratios `a / b`: their median and its 95 % interval.
fn ratio(a: &[f64], b: &[f64]) -> Estimate {
    let mut ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    median_ci(&mut ratios)
}

/// The CPU time this thread has used: what the requests on it cost,
/// whatever else the machine runs meanwhile. Wall time since the first
/// reading where the OS has no per-thread clock.
fn thread_cpu() -> Duration {
    #[cfg(unix)]
    {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `clock_gettime` writes one `timespec` into `now`, which
        // outlives the call.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut now) } == 0 {
            // A thread's CPU time is never negative.
            #[allow(clippy::cast_sign_loss)]
            return Duration::new(now.tv_sec as u64, now.tv_nsec as u32);
        }
    }
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed()
}

/// Runs `cell` for each variant in turn, `rounds` times, starting each
/// round one variant further on (so that no variant always follows the
/// same one); returns each variant's measurements in round order.
fn interleaved(rounds: usize, mut cell: impl FnMut(usize) -> f64) -> Vec<Vec<f64>> {
    let mut results = vec![Vec::with_capacity(rounds); VARIANTS.len()];
    for round in 0..rounds {
        for offset in 0..VARIANTS.len() {
            let variant = (round + offset) % VARIANTS.len();
            results[variant].push(cell(variant));
        }
    }
    results
}

/// Requests through `service` for `budget`, one at a time; CPU ns a
/// request.
fn time_in_memory(runtime: &Runtime, service: &mut Router, budget: Duration) -> f64 {
    runtime.block_on(async {
        let started = Instant::now();
        let cpu = thread_cpu();
        let mut requests = 0u64;
        while started.elapsed() < budget {
            send(service, 64).await;
            requests += 64;
        }
        (thread_cpu() - cpu).as_nanos() as f64 / requests as f64
    })
}

/// Sends `count` requests through `service`, one at a time, each from the
/// same peer address.
async fn send(service: &mut Router, count: u64) {
    let peer: SocketAddr = (Ipv4Addr::new(198, 51, 100, 7), 40_000).into();
    for _ in 0..count {
        let mut request = axum::http::Request::get("/")
            .body(Body::empty())
            .expect("a request");
        request.extensions_mut().insert(ConnectInfo(peer));
        let response = ServiceExt::<axum::http::Request<Body>>::ready(&mut *service)
            .await
            .expect("routers are always ready")
            .call(request)
            .await
            .expect("routers never fail");
        std::hint::black_box(response);
    }
}

/// The flag that makes this program send requests through one variant's
/// router on the admitted path instead of printing the report
/// ([`request_loop`]): `--request-loop VARIANT N`.
pub const REQUEST_LOOP_FLAG: &str = "--request-loop";

/// Sends `count` admitted requests through variant `variant`'s router (an
/// index into [`VARIANTS`]), twice: for an instruction counter, which sees
/// no host. Under callgrind, a request's instructions are the inclusive
/// count of `serving::send` over the `2 × count` requests (the first
/// request's setup is amortised), less the no-layer variant's.
///
/// ```sh
/// cargo build --release -p tollgate-lab
/// valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.3 \
///   target/release/tollgate-lab --request-loop 3 100000
/// callgrind_annotate --inclusive=yes /tmp/cg.3 | grep 'serving::send'
/// ```
pub fn request_loop(variant: usize, count: u64) -> Result<(), String> {
    if variant >= VARIANTS.len() {
        return Err(format!(
            "no variant {variant}: 0 to {} ({})",
            VARIANTS.len() - 1,
            VARIANTS.join(", ")
        ));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut service = router(variant, Path::Allowed).with_state(());
    runtime.block_on(async {
        send(&mut service, count).await;
        send(&mut service, count).await;
    });
    Ok(())
}

pub fn run(budget: &Budget) {
    println!("# In front of a server: tollgate-http, no layer, and tower_governor\n");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    in_memory(&runtime, budget);
    loopback(&runtime, budget);
}

fn in_memory(runtime: &Runtime, budget: &Budget) {
    println!(
        "## In memory: CPU ns per request through the router on one thread ({} interleaved rounds of {:?})",
        budget.rounds, budget.per_cell
    );
    println!(
        "{:<36} {:>8} {:>12} {:>16} {:>30}",
        "variant", "path", "ns/request", "added ns (CPU)", "time × its governor (lower: faster)"
    );
    for path in Path::ALL {
        // As `axum::serve` runs them: each route's service built once.
        let mut services: Vec<Router> = (0..VARIANTS.len())
            .map(|index| router(index, path).with_state(()))
            .collect();
        // Warm-up: drains the denied path's key, fills caches.
        for service in &mut services {
            time_in_memory(runtime, service, Duration::from_millis(20));
        }
        let results = interleaved(budget.rounds, |variant| {
            time_in_memory(runtime, &mut services[variant], budget.per_cell)
        });
        let base = median(&mut results[0].clone());
        for (variant, samples) in results.iter().enumerate() {
            let ratio = ratio(samples, &results[JUDGED_AGAINST[variant]]);
            let ns = median(&mut samples.clone());
            println!(
                "{:<36} {:>8} {:>12.0} {:>16.0} {:>30}",
                VARIANTS[variant],
                path.name(),
                ns,
                ns - base,
                ratio.show(2)
            );
        }
    }
    println!(
        "(each variant against the tower_governor one that sends as much on success, median of the rounds'\n ratios and its 95 % interval; target: tollgate no slower than tower_governor on either path, the\n interval's upper end at most 1, and under 1 µs of added CPU time a request)\n"
    );
}

/// A server for each variant on `path`, on its own one-worker runtime.
fn servers(path: Path) -> (Runtime, Vec<SocketAddr>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a server runtime");
    let addresses = (0..VARIANTS.len())
        .map(|index| {
            let app = router(index, path);
            runtime.block_on(async {
                let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                    .await
                    .expect("binding a loopback port");
                let address = listener.local_addr().expect("a bound address");
                tokio::spawn(async move {
                    axum::serve(
                        listener,
                        app.into_make_service_with_connect_info::<SocketAddr>(),
                    )
                    .await
                    .expect("the server runs");
                });
                address
            })
        })
        .collect();
    (runtime, addresses)
}

/// Runs `requests` (one future per request slot, `in_flight` at once)
/// against `url` for `budget`; returns requests per second and the mean
/// latency in microseconds.
fn load(
    runtime: &Runtime,
    client: &reqwest::Client,
    url: &str,
    in_flight: usize,
    budget: Duration,
) -> (f64, f64) {
    runtime.block_on(async {
        let started = Instant::now();
        let workers: Vec<_> = (0..in_flight)
            .map(|_| {
                let client = client.clone();
                let url = url.to_owned();
                worker(async move {
                    let mut done = 0u64;
                    let mut latency = Duration::ZERO;
                    while started.elapsed() < budget {
                        let sent = Instant::now();
                        let response = client.get(&url).send().await.expect("the server answers");
                        let _ = response.bytes().await;
                        latency += sent.elapsed();
                        done += 1;
                    }
                    (done, latency)
                })
            })
            .collect();
        let mut done = 0;
        let mut latency = Duration::ZERO;
        for worker in workers {
            let (requests, spent) = worker.await.expect("a load task");
            done += requests;
            latency += spent;
        }
        let elapsed = started.elapsed().as_secs_f64();
        (
            done as f64 / elapsed,
            latency.as_secs_f64() * 1e6 / done.max(1) as f64,
        )
    })
}

fn worker<F: Future + Send + 'static>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F::Output: Send + 'static,
{
    tokio::spawn(future)
}

fn loopback(runtime: &Runtime, budget: &Budget) {
    println!(
        "## Over loopback: a real server (1 worker thread) and client (reqwest), {} interleaved rounds of {:?}",
        budget.rounds, budget.per_cell
    );
    println!(
        "{:<36} {:>8} {:>16} {:>30} {:>16}",
        "variant",
        "path",
        "requests/s (16)",
        "req/s × its governor (higher: faster)",
        "latency µs (1)"
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(32)
        .build()
        .expect("a client");
    for path in Path::ALL {
        let (_servers, addresses) = servers(path);
        let urls: Vec<String> = addresses
            .iter()
            .map(|address| format!("http://{address}/"))
            .collect();
        for url in &urls {
            load(runtime, &client, url, 4, Duration::from_millis(20));
        }
        let throughput = interleaved(budget.rounds, |variant| {
            load(runtime, &client, &urls[variant], 16, budget.per_cell).0
        });
        let latency = interleaved(budget.rounds, |variant| {
            load(runtime, &client, &urls[variant], 1, budget.per_cell).1
        });
        for variant in 0..VARIANTS.len() {
            let ratio = ratio(&throughput[variant], &throughput[JUDGED_AGAINST[variant]]);
            println!(
                "{:<36} {:>8} {:>16.0} {:>30} {:>16.1}",
                VARIANTS[variant],
                path.name(),
                median(&mut throughput[variant].clone()),
                ratio.show(2),
                median(&mut latency[variant].clone())
            );
        }
    }
    println!(
        "(client and server share the 2 cores: the network path dominates; the in-memory table isolates the layer)\n"
    );
}
