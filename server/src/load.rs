//! A load generator for a rate-limit service over gRPC (Envoy's
//! `ShouldRateLimit`): what `tollgate-load` runs, and what the lab's
//! service section measures with.
//!
//! Closed loop (a `rate` of 0): `connections` HTTP/2 connections each
//! carry `streams` calls at once, each sent when the one before it
//! answers: the most decisions a second the service gives. Open loop (a
//! `rate` of R): one call every 1/R s, evenly spaced over the connections,
//! each in a task of its own whatever the calls before it do, and timed
//! from its scheduled instant: a service that stalls is charged for every
//! call it held up (no coordinated omission).

// Counts and durations turned into rates and ranks: far below where a
// float loses a unit.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::{Channel, Endpoint};

/// What to send, how, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Load {
    /// The service's gRPC address (`host:port`).
    pub target: String,
    /// The request's domain.
    pub domain: String,
    /// The descriptor's key.
    pub key: String,
    /// Distinct values of the key, spread evenly (1: one hot descriptor).
    pub values: u64,
    /// HTTP/2 connections.
    pub connections: usize,
    /// Calls in flight on each connection.
    pub streams: usize,
    /// Calls a second, scheduled (0: as fast as answered).
    pub rate: u64,
    /// How long calls run before they are counted.
    pub warm_up: Duration,
    /// How long calls are counted.
    pub measure: Duration,
}

/// What a run saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// Every counted call's latency, in microseconds, sorted.
    pub latencies_us: Vec<u32>,
    /// Calls answered within the limit.
    pub ok: u64,
    /// Calls answered over the limit.
    pub over_limit: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Calls in flight at most: connections × streams in a closed loop;
    /// in an open loop, the most the schedule had waiting at once.
    pub callers: usize,
}

impl Seen {
    /// Decisions a second over `measure`.
    #[must_use]
    pub fn decisions_per_second(&self, measure: Duration) -> f64 {
        (self.ok + self.over_limit) as f64 / measure.as_secs_f64()
    }

    /// The latency at quantile `q` (0.99: the 99th percentile), in
    /// microseconds; 0 when nothing was counted.
    #[must_use]
    pub fn quantile_us(&self, q: f64) -> u32 {
        let values = &self.latencies_us;
        if values.is_empty() {
            return 0;
        }
        let rank = ((values.len() as f64) * q).ceil() as usize;
        values[rank.clamp(1, values.len()) - 1]
    }
}

impl Load {
    fn request(&self, value: u64) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: self.key.clone(),
                    value: value.to_string(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        }
    }

    /// Runs the load: connects, warms up, counts.
    ///
    /// # Errors
    ///
    /// A target that is not an address, or that refuses a connection.
    pub async fn run(&self) -> Result<Seen, tonic::transport::Error> {
        let load = Arc::new(self.clone());
        let mut channels = Vec::new();
        for _ in 0..self.connections.max(1) {
            let endpoint = Endpoint::from_shared(format!("http://{}", self.target))?;
            channels.push(endpoint.connect().await?);
        }
        let callers = channels.len() * self.streams.max(1);
        let begin = Instant::now();
        let measured = begin + self.warm_up;
        let end = measured + self.measure;
        let mut tasks = Vec::new();
        if self.rate == 0 {
            for index in 0..callers {
                let client = RateLimitServiceClient::new(channels[index % channels.len()].clone());
                tasks.push(tokio::spawn(caller(
                    load.clone(),
                    client,
                    index as u64,
                    (measured, end),
                )));
            }
        } else {
            tasks.push(tokio::spawn(paced(
                load.clone(),
                channels,
                (begin, measured, end),
            )));
        }
        let mut all = Seen {
            callers: if self.rate == 0 { callers } else { 0 },
            ..Seen::default()
        };
        for task in tasks {
            // A task never panics; one that did counts nothing.
            let Ok(seen) = task.await else { continue };
            all.latencies_us.extend(seen.latencies_us);
            all.ok += seen.ok;
            all.over_limit += seen.over_limit;
            all.errors += seen.errors;
            all.callers = all.callers.max(seen.callers);
        }
        all.latencies_us.sort_unstable();
        Ok(all)
    }
}

/// The longest a call may take: one past it counts as an error, so that a
/// stuck service cannot hang the run.
const CALL_DEADLINE: Duration = Duration::from_secs(5);

/// Sends `request` on `client`, failing past [`CALL_DEADLINE`].
async fn send(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
    tokio::time::timeout(CALL_DEADLINE, client.should_rate_limit(request))
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("no answer within 5 s")))
}

/// What one call saw: its latency and its answer, counted into `seen`.
fn count(
    seen: &mut Seen,
    latency: Duration,
    answer: &Result<tonic::Response<RateLimitResponse>, tonic::Status>,
) {
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

/// One closed-loop caller: each call sent when the one before it answers,
/// until `end`, counted from `measured`.
async fn caller(
    load: Arc<Load>,
    mut client: RateLimitServiceClient<Channel>,
    index: u64,
    (measured, end): (Instant, Instant),
) -> Seen {
    let mut seen = Seen::default();
    let mut call = 0_u64;
    loop {
        let sent = Instant::now();
        if sent >= end {
            return seen;
        }
        let value = (index + call * 7_919) % load.values.max(1);
        call += 1;
        let answer = send(&mut client, load.request(value)).await;
        if sent >= measured {
            count(&mut seen, sent.elapsed(), &answer);
        }
    }
}

/// The open loop: one dispatcher sends each call at its instant, `1 /
/// rate` apart, in a task of its own, whatever the calls before it do.
/// The dispatcher sleeps until a millisecond before a call's instant (the
/// timer's grain) and then yields until it, so that calls leave evenly
/// spaced rather than in the timer's bunches. Each call is timed from its
/// instant: one the dispatcher sent late is charged the lateness.
async fn paced(
    load: Arc<Load>,
    channels: Vec<Channel>,
    (begin, measured, end): (Instant, Instant, Instant),
) -> Seen {
    let interval = Duration::from_secs_f64(1.0 / load.rate as f64);
    let mut calls = tokio::task::JoinSet::new();
    let mut seen = Seen::default();
    let mut in_flight = 0_usize;
    for call in 0_u64.. {
        let at = begin + interval.mul_f64(call as f64);
        if at >= end {
            break;
        }
        if let Some(early) = at.checked_duration_since(Instant::now()) {
            if early > Duration::from_millis(2) {
                tokio::time::sleep(early.saturating_sub(Duration::from_millis(1))).await;
            }
            while Instant::now() < at {
                tokio::task::yield_now().await;
            }
        }
        // Answers already in: counted now, so that the set stays small.
        while let Some(Ok((planned, latency, answer))) = calls.try_join_next() {
            in_flight -= 1;
            if planned >= measured {
                count(&mut seen, latency, &answer);
            }
        }
        let mut client = RateLimitServiceClient::new(
            channels[usize::try_from(call).unwrap_or(0) % channels.len()].clone(),
        );
        let request = load.request(call % load.values.max(1));
        calls.spawn(async move {
            let answer = send(&mut client, request).await;
            (at, at.elapsed(), answer)
        });
        in_flight += 1;
        seen.callers = seen.callers.max(in_flight);
    }
    while let Some(joined) = calls.join_next().await {
        if let Ok((planned, latency, answer)) = joined {
            if planned >= measured {
                count(&mut seen, latency, &answer);
            }
        }
    }
    seen
}
