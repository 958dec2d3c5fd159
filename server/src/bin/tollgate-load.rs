//! `tollgate-load`: a load generator for a rate-limit service over gRPC
//! (Envoy's `ShouldRateLimit`), on loopback or anywhere.
//!
//! Closed loop (`--rate 0`, the default): `--connections` HTTP/2
//! connections each carry `--streams` calls at once, each sent when the
//! one before it answers: the most decisions a second the service gives.
//! Open loop (`--rate R`): calls are sent on a schedule of R a second,
//! whatever the answers: a call sent late because the service held its
//! caller back is timed from its scheduled instant, so that a stalled
//! service is charged for it (no coordinated omission); one on time, from
//! when it is sent.
//!
//! ```sh
//! tollgate-load --target 127.0.0.1:8081 --domain shop --key remote_address --seconds 10
//! ```

// Counts and durations turned into rates and ranks: far below where a
// float loses a unit.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Channel, Endpoint};

/// A load generator for Envoy's rate-limit service.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    /// The service's gRPC address.
    #[arg(long, default_value = "127.0.0.1:8081")]
    target: String,
    /// The request's domain.
    #[arg(long, default_value = "shop")]
    domain: String,
    /// The descriptor's key.
    #[arg(long, default_value = "remote_address")]
    key: String,
    /// Distinct values of the key, spread evenly (1: one hot descriptor).
    #[arg(long, default_value_t = 1)]
    values: u64,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Calls in flight on each connection.
    #[arg(long, default_value_t = 32)]
    streams: usize,
    /// Calls a second, scheduled (0: as fast as answered).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// How long to measure, after a second of warm-up.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

/// What one caller saw: latencies in microseconds, and the answers.
#[derive(Default)]
struct Seen {
    latencies_us: Vec<u32>,
    ok: u64,
    over_limit: u64,
    errors: u64,
}

fn request(flags: &Flags, value: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: flags.domain.clone(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: flags.key.clone(),
                value: value.to_string(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// One caller: calls from `begin` until `end`, counting the calls planned
/// from `measured`; open loop when `schedule` is given (every interval, its
/// first call at the offset past `begin`).
async fn caller(
    flags: Arc<Flags>,
    mut client: RateLimitServiceClient<Channel>,
    index: u64,
    (begin, measured, end): (Instant, Instant, Instant),
    schedule: Option<(Duration, Duration)>,
) -> Seen {
    let mut seen = Seen::default();
    let mut call = 0_u64;
    loop {
        // A call behind its schedule is timed from its planned instant (it
        // waited on the service); one ahead of it sleeps, and is timed from
        // when it is sent (the timer wakes up to a millisecond late, which
        // is not the service's).
        let (planned, origin) = match schedule {
            Some((interval, offset)) => {
                let at = begin + offset + interval.mul_f64(call as f64);
                if at > Instant::now() {
                    tokio::time::sleep_until(at.into()).await;
                    (at, Instant::now())
                } else {
                    (at, at)
                }
            }
            None => {
                let now = Instant::now();
                (now, now)
            }
        };
        if planned >= end {
            return seen;
        }
        let value = (index + call * 7_919) % flags.values.max(1);
        call += 1;
        let answer = client.should_rate_limit(request(&flags, value)).await;
        let latency = origin.elapsed();
        if planned < measured {
            continue;
        }
        seen.latencies_us
            .push(u32::try_from(latency.as_micros()).unwrap_or(u32::MAX));
        match answer {
            Ok(response) if response.get_ref().overall_code() == Code::OverLimit => {
                seen.over_limit += 1;
            }
            Ok(_) => seen.ok += 1,
            Err(_) => seen.errors += 1,
        }
    }
}

/// The value at quantile `q` of sorted `values`.
fn quantile(values: &[u32], q: f64) -> u32 {
    if values.is_empty() {
        return 0;
    }
    let rank = ((values.len() as f64) * q).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let flags = Arc::new(Flags::parse());
    let mut channels = Vec::new();
    for _ in 0..flags.connections.max(1) {
        let endpoint = Endpoint::from_shared(format!("http://{}", flags.target))?;
        channels.push(endpoint.connect().await?);
    }
    let callers = channels.len() * flags.streams.max(1);
    let begin = Instant::now();
    let measured = begin + Duration::from_secs(1);
    let end = measured + Duration::from_secs(flags.seconds);
    // Open loop: each caller sends every `callers / rate` seconds, the
    // callers staggered evenly over one interval.
    let schedule =
        (flags.rate > 0).then(|| Duration::from_secs_f64(callers as f64 / flags.rate as f64));
    let mut tasks = Vec::new();
    for index in 0..callers {
        let client = RateLimitServiceClient::new(channels[index % channels.len()].clone());
        let offset = schedule.map(|interval| interval.mul_f64(index as f64 / callers as f64));
        let schedule = schedule.zip(offset);
        tasks.push(tokio::spawn(caller(
            flags.clone(),
            client,
            index as u64,
            (begin, measured, end),
            schedule,
        )));
    }
    let mut all = Seen::default();
    for task in tasks {
        let seen = task.await?;
        all.latencies_us.extend(seen.latencies_us);
        all.ok += seen.ok;
        all.over_limit += seen.over_limit;
        all.errors += seen.errors;
    }
    all.latencies_us.sort_unstable();
    let decisions = all.ok + all.over_limit;
    println!(
        "decisions/s {:.0}  p50 {} µs  p99 {} µs  p99.9 {} µs  max {} µs  ok {}  over_limit {}  \
         errors {}  callers {}  rate {}",
        decisions as f64 / flags.seconds as f64,
        quantile(&all.latencies_us, 0.50),
        quantile(&all.latencies_us, 0.99),
        quantile(&all.latencies_us, 0.999),
        all.latencies_us.last().copied().unwrap_or(0),
        all.ok,
        all.over_limit,
        all.errors,
        callers,
        if flags.rate > 0 {
            flags.rate.to_string()
        } else {
            "closed loop".to_owned()
        },
    );
    Ok(())
}
