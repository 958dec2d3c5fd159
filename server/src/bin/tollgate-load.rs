//! `tollgate-load`: a load generator for a rate-limit service over gRPC
//! (Envoy's `ShouldRateLimit`), on loopback or anywhere.
//!
//! Closed loop by default (the most decisions a second the service gives),
//! open loop with `--rate R` (timed without coordinated omission); the
//! library's `load` module says how.
//!
//! ```sh
//! tollgate-load --target 127.0.0.1:8081 --domain shop --key remote_address --seconds 10
//! ```

use std::time::Duration;

use clap::Parser;
use tollgate_server::load::Load;

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

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let flags = Flags::parse();
    let load = Load {
        target: flags.target,
        domain: flags.domain,
        key: flags.key,
        values: flags.values,
        connections: flags.connections,
        streams: flags.streams,
        rate: flags.rate,
        warm_up: Duration::from_secs(1),
        measure: Duration::from_secs(flags.seconds.max(1)),
    };
    let seen = load.run().await?;
    println!(
        "decisions/s {:.0}  p50 {} µs  p99 {} µs  p99.9 {} µs  max {} µs  ok {}  over_limit {}  \
         errors {}  callers {}  rate {}",
        seen.decisions_per_second(load.measure),
        seen.quantile_us(0.50),
        seen.quantile_us(0.99),
        seen.quantile_us(0.999),
        seen.latencies_us.last().copied().unwrap_or(0),
        seen.ok,
        seen.over_limit,
        seen.errors,
        seen.callers,
        if load.rate > 0 {
            load.rate.to_string()
        } else {
            "closed loop".to_owned()
        },
    );
    Ok(())
}
