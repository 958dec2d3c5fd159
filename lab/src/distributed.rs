//! The distributed sections, on a `redis-server` the lab starts
//! itself on a free loopback port: the three-instance break with real
//! processes, checks per second against redis_rate's GCRA and a plain `SET`
//! through one client, and Redis's memory per key.

use std::future::Future;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::aio::ConnectionManager;
use tollgate::Quota;
use tollgate_redis::{Connection, Options, RedisLimiter};

use crate::for_each_algorithm;
use crate::instances::{Instance, admitted};
use crate::redis_server::RedisServer;
use crate::stats::{median, ratio_spread};
use tollgate::algorithm::{FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket};

/// The baseline script: redis_rate's algorithm (see the file).
const REDIS_RATE: &str = include_str!("redis_rate.lua");

/// Distinct keys the throughput cells cycle through. The quota (a million
/// units with an interval of one second) admits every check, so every call
/// writes, and each admission owes a second more: the keys stay in Redis
/// for the whole run, for each script alike (the cells measure the scripts,
/// not keys expiring and being created again).
const KEYS: usize = 10_000;

/// Keys for the memory table.
const MEMORY_KEYS: usize = 100_000;

/// How long each throughput cell runs, and how many interleaved rounds;
/// and the budget of the section on deciding locally.
pub struct Budget {
    pub per_cell: Duration,
    pub rounds: usize,
    pub leases: crate::leases::Budget,
}

/// Runs every distributed section, or says how to enable them.
pub fn run(budget: &Budget) {
    println!("# Beyond one process: Redis (a real redis-server on loopback)\n");
    let server = match RedisServer::start() {
        Ok(server) => server,
        Err(error) => {
            println!(
                "Skipped: no redis-server could be started ({error}).\n\
                 Install it (`apt-get update && apt-get install -y redis-server`, or run\n\
                 `.ci/test`, which does) and run the lab again.\n"
            );
            return;
        }
    };
    let url = format!("redis://127.0.0.1:{}/", server.port());
    let version = crate::redis_server::command(server.port(), &["INFO", "server"])
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("redis_version:").map(str::to_owned))
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let pinned = pin(server.pid());
    println!(
        "redis-server {version}, client and server on this machine{}.\n",
        if pinned {
            ": the server pinned to CPU 1, the lab's client (one tokio worker) to CPU 0"
        } else {
            " (not pinned: `taskset` failed)"
        }
    );
    let binary = instance_binary();
    match &binary {
        Ok(binary) => the_break(binary, &url),
        Err(error) => println!("The break: skipped, {error}\n"),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(throughput(&url, budget));
    runtime.block_on(memory(&url));
    match &binary {
        Ok(binary) => crate::leases::run(binary, &budget.leases, pin),
        Err(error) => println!("Deciding locally: skipped, {error}\n"),
    }
}

/// The section on deciding locally alone (`--leases`).
pub fn run_leases(budget: &crate::leases::Budget) {
    println!("# Beyond one process: Redis (a real redis-server on loopback)\n");
    match instance_binary() {
        Ok(binary) => crate::leases::run(&binary, budget, pin),
        Err(error) => println!("Deciding locally: skipped, {error}\n"),
    }
}

/// Pins the server to CPU 1 and this process (every thread it has and
/// will start) to CPU 0, so that client and server do not take turns on
/// one core: the cells vary far less. Whether both pins took.
fn pin(server: u32) -> bool {
    let taskset = |args: &[&str]| {
        Command::new("taskset")
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    taskset(&["-a", "-p", "-c", "1", &server.to_string()])
        && taskset(&["-a", "-p", "-c", "0", &std::process::id().to_string()])
}

/// `tollgate-instance`, next to the lab's own binary: built by cargo (a
/// no-op when fresh) when the lab runs under cargo.
fn instance_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|error| format!("no current exe: {error}"))?;
    let binary = exe.with_file_name("tollgate-instance");
    if let Some(cargo) = std::env::var_os("CARGO") {
        let mut build = Command::new(cargo);
        build.args([
            "build",
            "--quiet",
            "-p",
            "tollgate-redis",
            "--bin",
            "tollgate-instance",
        ]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let status = build
            .status()
            .map_err(|error| format!("running cargo: {error}"))?;
        if !status.success() {
            return Err(format!("building tollgate-instance: {status}"));
        }
    }
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(format!(
            "{} is missing: `cargo build --release -p tollgate-redis`",
            binary.display()
        ))
    }
}

/// Three processes with 100 an hour each, in-process and on Redis.
fn the_break(binary: &std::path::Path, url: &str) {
    println!("## The three-instance break\n");
    println!("Three `tollgate-instance` processes, 100 requests an hour for one user, 1 000");
    println!("requests spread round-robin over them:\n");
    println!("| limiters | admitted | limit |");
    println!("|---|---:|---:|");
    for (label, redis) in [
        ("in-process, one per instance", None),
        ("Redis, shared", Some(url)),
    ] {
        let instances: Vec<Instance> = (0..3).map(|_| Instance::start(binary, redis)).collect();
        println!("| {label} | {} | 100 |", admitted(&instances));
    }
    println!();
}

/// What a throughput cell calls.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Subject {
    /// The crate's limiter (its GCRA script through redis-rs).
    Tollgate,
    /// redis_rate's script through redis-rs.
    RedisRate,
    /// `SET` through redis-rs: the floor.
    Set,
    /// redis_rate's script through fred: the other client crate.
    FredRedisRate,
    /// `SET` through fred.
    FredSet,
}

const SUBJECTS: [Subject; 5] = [
    Subject::Tollgate,
    Subject::RedisRate,
    Subject::Set,
    Subject::FredRedisRate,
    Subject::FredSet,
];

const NAMES: [&str; 5] = [
    "tollgate GCRA",
    "redis_rate GCRA",
    "SET",
    "redis_rate, fred",
    "SET, fred",
];

/// How the calls are issued.
#[derive(Clone, Copy)]
enum Mode {
    /// One task, one call at a time.
    Single,
    /// 50 tasks, one call at a time each, over one multiplexed connection.
    Tasks,
    /// One task with 16 calls in flight (written together by the
    /// multiplexed connection).
    Depth,
}

struct Clients {
    limiter: RedisLimiter,
    raw: ConnectionManager,
    fred: fred::clients::Client,
    redis_rate_sha: String,
}

/// redis_rate's arguments: burst, rate, period (s), cost. A million units
/// with an interval of one second, as the crate's limiter here.
const REDIS_RATE_ARGS: [u64; 4] = [1_000_000, 1_000_000, 1_000_000, 1];

impl Clients {
    /// One call of `subject` for key number `index`.
    async fn call(&self, subject: Subject, index: usize) {
        use fred::interfaces::{KeysInterface, LuaInterface};
        let key = index % KEYS;
        match subject {
            Subject::Tollgate => {
                let decision = self
                    .limiter
                    .check(key.to_ne_bytes())
                    .await
                    .expect("a decision");
                assert!(decision.is_allowed());
            }
            Subject::RedisRate => {
                let reply: Vec<redis::Value> = redis::cmd("EVALSHA")
                    .arg(&self.redis_rate_sha)
                    .arg(1)
                    .arg(format!("rate:{key}"))
                    .arg(&REDIS_RATE_ARGS[..])
                    .query_async(&mut self.raw.clone())
                    .await
                    .expect("redis_rate's reply");
                assert_eq!(reply.first(), Some(&redis::Value::Int(1)));
            }
            Subject::Set => {
                let () = redis::cmd("SET")
                    .arg(format!("set:{key}"))
                    .arg(1)
                    .query_async(&mut self.raw.clone())
                    .await
                    .expect("SET");
            }
            Subject::FredRedisRate => {
                let reply: Vec<fred::types::Value> = self
                    .fred
                    .evalsha(
                        self.redis_rate_sha.as_str(),
                        format!("fred-rate:{key}"),
                        REDIS_RATE_ARGS.to_vec(),
                    )
                    .await
                    .expect("redis_rate's reply through fred");
                assert_eq!(reply.first(), Some(&fred::types::Value::Integer(1)));
            }
            Subject::FredSet => {
                let () = self
                    .fred
                    .set(format!("fred-set:{key}"), 1, None, None, false)
                    .await
                    .expect("SET through fred");
            }
        }
    }
}

/// Calls per second of one cell, and the median latency of a call for
/// [`Mode::Single`].
async fn cell(clients: &Clients, subject: Subject, mode: Mode, per_cell: Duration) -> (f64, f64) {
    let started = Instant::now();
    let deadline = started + per_cell;
    match mode {
        Mode::Single => {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let call = Instant::now();
                clients.call(subject, latencies.len()).await;
                latencies.push(call.elapsed().as_secs_f64());
            }
            let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
            (rate, median(&mut latencies))
        }
        Mode::Tasks => {
            let tasks = (0..50).map(|task| async move {
                let mut calls = 0;
                while Instant::now() < deadline {
                    clients.call(subject, task * 997 + calls).await;
                    calls += 1;
                }
                calls
            });
            let calls: usize = join_all(tasks).await.into_iter().sum();
            (calls as f64 / started.elapsed().as_secs_f64(), 0.0)
        }
        Mode::Depth => {
            let mut calls = 0;
            while Instant::now() < deadline {
                join_all((calls..calls + 16).map(|index| clients.call(subject, index))).await;
                calls += 16;
            }
            (calls as f64 / started.elapsed().as_secs_f64(), 0.0)
        }
    }
}

async fn throughput(url: &str, budget: &Budget) {
    use fred::interfaces::ClientLike;
    println!("## Checks per second on one connection\n");
    // Throughput, not deadlines: the peers' clients wait as long as a reply
    // takes, and so does this one (the default 250 ms deadline can fire on
    // a loaded host, which would end the run).
    let connection = Connection::open_with(
        url,
        Options::default().call_timeout(Duration::from_secs(30)),
    )
    .await
    .expect("connecting");
    let client = redis::Client::open(url).expect("a client");
    let mut raw = ConnectionManager::new(client).await.expect("connecting");
    let redis_rate_sha = load_redis_rate(&mut raw).await;
    let fred = fred::types::Builder::from_config(
        fred::types::config::Config::from_url(url).expect("a fred config"),
    )
    .build()
    .expect("a fred client");
    fred.init().await.expect("connecting with fred");
    let clients = Clients {
        limiter: RedisLimiter::builder(
            "lab",
            Quota::new(1_000_000, Duration::from_secs(1_000_000)).expect("a quota"),
        )
        .build(connection)
        .expect("a limiter"),
        raw,
        fred,
        redis_rate_sha,
    };
    // Warm every key and the script cache, then interleave: each round runs
    // every (mode, subject) cell once, the subjects in a rotating order.
    for subject in SUBJECTS {
        cell(&clients, subject, Mode::Depth, Duration::from_millis(300)).await;
    }
    let modes = [
        (Mode::Single, "1 task"),
        (Mode::Tasks, "50 tasks"),
        (Mode::Depth, "1 task, 16 in flight"),
    ];
    let n = SUBJECTS.len();
    // rates[mode][subject][round], latencies[subject][round]
    let mut rates = vec![vec![Vec::new(); n]; modes.len()];
    let mut latencies = vec![Vec::new(); n];
    for round in 0..budget.rounds {
        for (m, (mode, _)) in modes.iter().enumerate() {
            for k in 0..n {
                let s = (round + k) % n;
                let (rate, latency) = cell(&clients, SUBJECTS[s], *mode, budget.per_cell).await;
                rates[m][s].push(rate);
                if matches!(mode, Mode::Single) {
                    latencies[s].push(latency);
                }
            }
        }
    }
    println!(
        "{} interleaved rounds of {:?} a cell; medians of the rounds (calls per second):\n",
        budget.rounds, budget.per_cell
    );
    println!("| mode | {} |", NAMES.join(" | "));
    println!("|---|{}", "---:|".repeat(n));
    for (m, (_, label)) in modes.iter().enumerate() {
        let medians: Vec<String> = (0..n)
            .map(|s| format!("{:.1} k", median(&mut rates[m][s].clone()) / 1e3))
            .collect();
        println!("| {label} | {} |", medians.join(" | "));
    }
    println!("\nRatios of the same round's cells: median (range over the rounds).\n");
    let pairs = [
        (0, 1, "tollgate / redis_rate"),
        (0, 2, "tollgate / SET"),
        (3, 1, "fred / redis-rs, redis_rate's script"),
        (4, 2, "fred / redis-rs, SET"),
    ];
    println!("| mode | {} |", pairs.map(|(_, _, name)| name).join(" | "));
    println!("|---|{}", "---:|".repeat(pairs.len()));
    let mut judged = Vec::new();
    for (m, (_, label)) in modes.iter().enumerate() {
        let cells: Vec<String> = pairs
            .iter()
            .map(|&(a, b, _)| {
                let (middle, low, high) = ratio_spread(&rates[m][a], &rates[m][b]);
                format!("{middle:.2}× ({low:.2}–{high:.2})")
            })
            .collect();
        println!("| {label} | {} |", cells.join(" | "));
        if m > 0 {
            let (over_rate, ..) = ratio_spread(&rates[m][0], &rates[m][1]);
            judged.push((format!("{label}: ≥ 1.0× redis_rate"), over_rate >= 1.0));
        }
    }
    let (latency, low, high) = ratio_spread(&latencies[0], &latencies[2]);
    let medians: Vec<String> = (0..n)
        .map(|s| {
            format!(
                "{} {:.1} µs",
                NAMES[s],
                median(&mut latencies[s].clone()) * 1e6
            )
        })
        .collect();
    println!(
        "\nMedian latency of one call, 1 task: {};\ntollgate / SET {latency:.2}× ({low:.2}–{high:.2}).\n",
        medians.join(", ")
    );
    judged.push((
        "1 task: median latency ≤ 1.5× SET".to_owned(),
        latency <= 1.5,
    ));
    for (target, met) in judged {
        println!("- {target}: {}", if met { "met" } else { "missed" });
    }
    println!();
}

/// Redis's memory for `MEMORY_KEYS` keys of each algorithm, and of
/// redis_rate's layout.
async fn memory(url: &str) {
    println!("## Redis memory per key ({MEMORY_KEYS} keys, one unit each)\n");
    let client = redis::Client::open(url).expect("a client");
    let mut raw = ConnectionManager::new(client).await.expect("connecting");
    let connection = Connection::open(url).await.expect("connecting");
    println!("| layout | bytes per key (INFO used_memory) | MEMORY USAGE of one key | key name |");
    println!("|---|---:|---:|---:|");
    // Thirty-day windows and a unit refilling every three days: no key
    // expires while the table is measured (checked with DBSIZE).
    let quota = Quota::new(10, Duration::from_secs(30 * 86_400)).expect("a quota");
    for_each_algorithm!(|name, A| {
        let limiter = RedisLimiter::builder("memory", quota)
            .algorithm::<A>()
            .build(connection.clone())
            .expect("a limiter");
        let row = measure(&mut raw, |index| {
            let limiter = &limiter;
            async move {
                let decision = limiter.check(user(index)).await.expect("a decision");
                assert!(decision.is_allowed());
            }
        })
        .await;
        let key = limiter.redis_key(user(0));
        print_row(&mut raw, &format!("tollgate {name}"), row, &key).await;
    });
    let sha = load_redis_rate(&mut raw).await;
    let row = measure(&mut raw.clone(), |index| {
        let mut raw = raw.clone();
        let sha = &sha;
        async move {
            let _: Vec<redis::Value> = redis::cmd("EVALSHA")
                .arg(sha)
                .arg(1)
                .arg(rate_key(index))
                .arg(10)
                .arg(10)
                .arg(30 * 86_400)
                .arg(1)
                .query_async(&mut raw)
                .await
                .expect("redis_rate's reply");
        }
    })
    .await;
    print_row(&mut raw, "redis_rate GCRA", row, rate_key(0).as_bytes()).await;
    println!();
}

/// Loads the baseline script; its SHA-1.
async fn load_redis_rate(raw: &mut ConnectionManager) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(REDIS_RATE)
        .query_async(raw)
        .await
        .expect("loading redis_rate's script")
}

fn user(index: usize) -> String {
    format!("user-{index:06}")
}

fn rate_key(index: usize) -> String {
    format!("rate:{}", user(index))
}

/// Flushes the server, writes `MEMORY_KEYS` keys with `write` (16 in
/// flight), and returns the growth of `used_memory` per key.
async fn measure<F, W>(raw: &mut ConnectionManager, write: W) -> f64
where
    W: Fn(usize) -> F,
    F: Future<Output = ()>,
{
    let () = redis::cmd("FLUSHALL")
        .query_async(raw)
        .await
        .expect("FLUSHALL");
    let before = used_memory(raw).await;
    for start in (0..MEMORY_KEYS).step_by(16) {
        join_all((start..(start + 16).min(MEMORY_KEYS)).map(&write)).await;
    }
    let after = used_memory(raw).await;
    let keys: usize = redis::cmd("DBSIZE").query_async(raw).await.expect("DBSIZE");
    assert_eq!(keys, MEMORY_KEYS, "every key still there when measured");
    (after - before) as f64 / MEMORY_KEYS as f64
}

async fn print_row(raw: &mut ConnectionManager, label: &str, per_key: f64, key: &[u8]) {
    let usage: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .query_async(raw)
        .await
        .expect("MEMORY USAGE");
    println!(
        "| {label} | {per_key:.1} | {} | {} bytes |",
        usage.map_or_else(|| "(no key)".to_owned(), |bytes| bytes.to_string()),
        key.len()
    );
}

async fn used_memory(raw: &mut ConnectionManager) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(raw)
        .await
        .expect("INFO memory");
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|value| value.trim().parse().ok())
        .expect("used_memory in INFO")
}
