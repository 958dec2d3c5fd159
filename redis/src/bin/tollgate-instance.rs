//! One instance of a service guarded by a rate limiter: the unit of the
//! three-instance experiments (notes/10, notes/12).
//!
//! `tollgate-instance LIMIT WINDOW_SECS [REDIS_URL [MODE]]` listens on a
//! free loopback port, prints the port on its first line of output, and
//! answers each line it receives (a key) with `allow` or `deny`, and the
//! line `?calls` with the number of round trips its checks took. `LIMIT`
//! requests per `WINDOW_SECS` seconds (100 and 60 by default), from its own
//! in-process limiter, or with a Redis URL from the Redis limiter that every
//! instance shares, deciding locally as `MODE` says (`exact`, the default;
//! `deny-cached`; `leased`). Three in-process instances behind one load
//! balancer admit three times the limit, each reporting itself healthy;
//! three on Redis admit the limit.
//!
//! `tollgate-instance hammer REDIS_URL MODE LIMIT WINDOW_MS RUN_MS ROUNDS`
//! checks one hot key as fast as it can, on commands read from its input
//! (so that the lab starts three together), and prints one line of results
//! for each:
//!
//! * `run`: checks for `RUN_MS`; prints `checks admitted calls errors`.
//! * `paced NS`: the same, one check every `NS` nanoseconds.
//! * `cost`: `ROUNDS` interleaved pairs of rounds of 200 checks, one on the
//!   Redis limiter and one on an in-process lock-free limiter with the same
//!   quota, the order alternating; prints each pair as `ns-per-check,
//!   ns-per-check, round-trips` (the Redis limiter's first).
//! * `outage`: checks for `RUN_MS` while the lab kills Redis; prints the
//!   checks answered by Redis, then those answered locally after Redis's
//!   last answer (admitted, and denied), then those answered by the
//!   failure policy (an error), and the milliseconds from Redis's last
//!   answer to the policy's first.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::remote::Leases;
use tollgate::{Builder, Quota, RateLimiter};
use tollgate_redis::{Connection, Mode, RedisLimiter};

/// Where decisions come from.
enum Limiter {
    InProcess(RateLimiter<String>),
    Redis(Box<(tokio::runtime::Runtime, RedisLimiter)>),
}

impl Limiter {
    fn allows(&self, key: &str) -> bool {
        match self {
            Limiter::InProcess(limiter) => limiter.check(key).is_ok_and(|d| d.is_allowed()),
            Limiter::Redis(redis) => redis
                .0
                .block_on(redis.1.check(key))
                .is_ok_and(|d| d.is_allowed()),
        }
    }

    fn calls(&self) -> u64 {
        match self {
            Limiter::InProcess(_) => 0,
            Limiter::Redis(redis) => redis.1.remote_calls(),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|arg| arg == "hammer") {
        return hammer(&args[1..]);
    }
    let mut args = args.into_iter();
    let limit: u32 = args.next().map_or(Ok(100), |arg| arg.parse())?;
    let window_secs: u64 = args.next().map_or(Ok(60), |arg| arg.parse())?;
    let quota = Quota::new(limit, Duration::from_secs(window_secs))?;
    let limiter = Arc::new(match args.next() {
        None => Limiter::InProcess(Builder::new(quota).build::<String>()),
        Some(url) => {
            let mode = mode(args.next().as_deref().unwrap_or("exact"))?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()?;
            let connection = runtime.block_on(Connection::open(url.as_str()))?;
            let limiter = RedisLimiter::builder("instance", quota)
                .mode(mode)
                .build(connection)?;
            Limiter::Redis(Box::new((runtime, limiter)))
        }
    });
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    println!("{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    for stream in listener.incoming() {
        let stream = stream?;
        let limiter = Arc::clone(&limiter);
        std::thread::spawn(move || serve(&limiter, stream));
    }
    Ok(())
}

/// The mode a command line names: `exact`, `deny-cached`, `leased`, or
/// `leased:SLACK`.
fn mode(name: &str) -> Result<Mode, String> {
    let unknown = || format!("unknown mode {name:?}: exact, deny-cached, leased or leased:SLACK");
    match name.split_once(':') {
        None if name == "exact" => Ok(Mode::Exact),
        None if name == "deny-cached" => Ok(Mode::DenyCached),
        None if name == "leased" => Ok(Mode::Leased(Leases::new())),
        Some(("leased", slack)) => Ok(Mode::Leased(
            Leases::new().with_slack(slack.parse().map_err(|_| unknown())?),
        )),
        _ => Err(unknown()),
    }
}

/// Answers each key on `stream` until the client closes it.
fn serve(limiter: &Limiter, stream: TcpStream) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    for line in BufReader::new(stream).lines() {
        let line = line?;
        if line == "?calls" {
            writeln!(writer, "{}", limiter.calls())?;
            continue;
        }
        let reply: &[u8] = if limiter.allows(&line) {
            b"allow\n"
        } else {
            b"deny\n"
        };
        writer.write_all(reply)?;
    }
    Ok(())
}

/// The lab's hot-key experiments; see the module documentation.
fn hammer(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let [url, mode_name, limit, window_ms, run_ms, rounds] = args else {
        return Err("hammer REDIS_URL MODE LIMIT WINDOW_MS RUN_MS ROUNDS".into());
    };
    let quota = Quota::new(limit.parse()?, Duration::from_millis(window_ms.parse()?))?;
    let run = Duration::from_millis(run_ms.parse()?);
    let rounds: usize = rounds.parse()?;
    // One thread: the three instances share two cores with Redis.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let connection = runtime.block_on(Connection::open(url.as_str()))?;
    let limiter = RedisLimiter::builder(format!("hammer-{mode_name}"), quota)
        .mode(mode(mode_name)?)
        .build(connection)?;
    let in_process: RateLimiter<Vec<u8>> = Builder::new(quota).build();
    let key: &[u8] = b"hot";
    let mut output = std::io::stdout();
    for command in std::io::stdin().lock().lines() {
        let command = command?;
        let (name, argument) = command.split_once(' ').unwrap_or((&command, ""));
        match name {
            "run" | "paced" => {
                let pace = Duration::from_nanos(argument.parse().unwrap_or(0));
                let (mut checks, mut admitted, mut errors) = (0_u64, 0_u64, 0_u64);
                let calls = limiter.remote_calls();
                let started = Instant::now();
                runtime.block_on(async {
                    while started.elapsed() < run {
                        // Unpaced: 100 checks between two readings of the
                        // time; paced: one, once its instant has come.
                        let batch = if pace.is_zero() { 100 } else { 1 };
                        let due = pace * u32::try_from(checks).unwrap_or(u32::MAX);
                        // Sleep through most of the wait (three processes
                        // share a core), spin through the rest.
                        if let Some(wait) =
                            due.checked_sub(started.elapsed() + Duration::from_micros(200))
                        {
                            std::thread::sleep(wait);
                        }
                        while started.elapsed() < due {
                            std::hint::spin_loop();
                        }
                        for _ in 0..batch {
                            match limiter.check(key).await {
                                Ok(decision) => admitted += u64::from(decision.is_allowed()),
                                Err(_) => errors += 1,
                            }
                        }
                        checks += batch;
                    }
                });
                writeln!(
                    output,
                    "{checks} {admitted} {} {errors}",
                    limiter.remote_calls() - calls
                )?;
            }
            "cost" => {
                let mut pairs = Vec::with_capacity(rounds);
                for round in 0..rounds {
                    let time_redis = || {
                        let calls = limiter.remote_calls();
                        let started = Instant::now();
                        runtime.block_on(async {
                            for _ in 0..200 {
                                let _ = std::hint::black_box(limiter.check(key).await);
                            }
                        });
                        (
                            started.elapsed().as_nanos() as f64 / 200.0,
                            limiter.remote_calls() - calls,
                        )
                    };
                    let time_in_process = || {
                        let started = Instant::now();
                        for _ in 0..200 {
                            let _ = std::hint::black_box(in_process.check(key));
                        }
                        started.elapsed().as_nanos() as f64 / 200.0
                    };
                    let ((redis_ns, calls), in_process_ns) = if round % 2 == 0 {
                        let redis = time_redis();
                        (redis, time_in_process())
                    } else {
                        let in_process = time_in_process();
                        (time_redis(), in_process)
                    };
                    pairs.push(format!("{redis_ns:.1},{in_process_ns:.1},{calls}"));
                }
                writeln!(output, "{}", pairs.join(" "))?;
            }
            "outage" => {
                let (mut by_redis, mut by_policy) = (0_u64, 0_u64);
                // Admitted and denied locally since Redis's last answer.
                let mut local_after = [0_u64; 2];
                let (mut last_redis, mut first_policy) = (None, None);
                let started = Instant::now();
                runtime.block_on(async {
                    while started.elapsed() < run {
                        let calls = limiter.remote_calls();
                        let outcome = limiter.check(key).await;
                        let now = Instant::now();
                        match outcome {
                            Err(_) => {
                                by_policy += 1;
                                first_policy.get_or_insert(now);
                            }
                            Ok(_) if limiter.remote_calls() > calls => {
                                by_redis += 1;
                                local_after = [0, 0];
                                last_redis = Some(now);
                            }
                            Ok(decision) if first_policy.is_none() => {
                                local_after[usize::from(!decision.is_allowed())] += 1;
                            }
                            Ok(_) => {}
                        }
                    }
                });
                let gap_ms = match (last_redis, first_policy) {
                    (Some(last), Some(first)) => {
                        format!(
                            "{:.1}",
                            first.saturating_duration_since(last).as_secs_f64() * 1e3
                        )
                    }
                    _ => "-".to_owned(),
                };
                let [admitted, denied] = local_after;
                writeln!(
                    output,
                    "{by_redis} {admitted} {denied} {by_policy} {gap_ms}"
                )?;
            }
            other => return Err(format!("unknown command {other:?}").into()),
        }
        output.flush()?;
    }
    Ok(())
}
