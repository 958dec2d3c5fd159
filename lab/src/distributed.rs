//! The distributed sections, on a `redis-server` the lab starts
//! itself on a free loopback port: the three-instance break with real
//! processes, checks per second against redis_rate's GCRA and a plain `SET`
//! through one client, the two client crates on tollgate's script, what
//! each client does with a call whose reply is lost, and Redis's memory
//! per key.

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
use proxy::Proxy;
use tollgate::algorithm::{FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket};

// The at-most-once tests' proxy, which loses a script's reply after it ran.
#[path = "../../redis/tests/support/proxy.rs"]
#[allow(dead_code)]
mod proxy;

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
    runtime.block_on(lost_replies(server.port()));
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

/// `tollgate-instance`, next to the lab's own binary.
fn instance_binary() -> Result<PathBuf, String> {
    workspace_binary("tollgate-redis", "tollgate-instance")
}

/// A workspace binary next to the lab's own: built by cargo (a no-op when
/// fresh) when the lab runs under cargo.
pub fn workspace_binary(package: &str, name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|error| format!("no current exe: {error}"))?;
    let binary = exe.with_file_name(name);
    if let Some(cargo) = std::env::var_os("CARGO") {
        let mut build = Command::new(cargo);
        build.args(["build", "--quiet", "-p", package, "--bin", name]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let status = build
            .status()
            .map_err(|error| format!("running cargo: {error}"))?;
        if !status.success() {
            return Err(format!("building {name}: {status}"));
        }
    }
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(format!(
            "{} is missing: `cargo build --release -p {package}`",
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
    /// tollgate's script called by hand through redis-rs, with the keys and
    /// arguments the limiter sends: the call without the limiter's work.
    TollgateScript,
    /// The same call through fred, at most once (`max_command_attempts`
    /// of one: a command is never written twice).
    FredTollgateScript,
    /// `SET` through fred, at most once.
    FredSet,
}

const SUBJECTS: [Subject; 6] = [
    Subject::Tollgate,
    Subject::RedisRate,
    Subject::Set,
    Subject::TollgateScript,
    Subject::FredTollgateScript,
    Subject::FredSet,
];

const NAMES: [&str; 6] = [
    "tollgate GCRA",
    "redis_rate GCRA",
    "SET",
    "tollgate's script, redis-rs",
    "tollgate's script, fred",
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
    tollgate_sha: String,
}

/// The limiter's quota in the throughput cells: a million units, one a
/// second.
const SPAN_US: u64 = 1_000_000;
const BURST: u32 = 1_000_000;

/// The arguments the limiter sends for a check of one unit on the
/// server's clock (`redis/src/limiter/wire.rs`): mode, time, algorithm,
/// cost, interval, burst, grace.
fn tollgate_arguments() -> [String; 9] {
    [
        "0".to_owned(),
        String::new(),
        "g".to_owned(),
        "1".to_owned(),
        SPAN_US.to_string(),
        BURST.to_string(),
        // The expiry grace, the quota's revision and its strategy.
        "0".to_owned(),
        "0".to_owned(),
        "a".to_owned(),
    ]
}

/// A fred client on `url` that sends a command at most once: after its
/// connection closes, it reconnects (every 50 ms), but a command already
/// written once is failed, not written again.
async fn fred_at_most_once(url: &str) -> fred::clients::Client {
    use fred::interfaces::ClientLike;
    let client = fred::types::Builder::from_config(
        fred::types::config::Config::from_url(url).expect("a fred config"),
    )
    .with_connection_config(|config| config.max_command_attempts = 1)
    .set_policy(fred::types::config::ReconnectPolicy::new_constant(0, 50))
    .build()
    .expect("a fred client");
    client.init().await.expect("connecting with fred");
    client
}

/// redis_rate's arguments: burst, rate, period (s), cost. A million units
/// with an interval of one second, as the crate's limiter here.
const REDIS_RATE_ARGS: [u64; 4] = [1_000_000, 1_000_000, 1_000_000, 1];

impl Clients {
    /// The Redis key of the calls by hand: the limiter's for `key` under
    /// another name (`lab-raw`), so that they count apart from its checks.
    fn script_key(&self, key: usize) -> Vec<u8> {
        let mut redis_key = self.limiter.redis_key(key.to_ne_bytes());
        // "{tag}3:lab:" becomes "{tag}3:law:": same length, its own keys.
        let at = redis_key
            .windows(5)
            .position(|window| window == b"3:lab")
            .expect("the limiter's name in its key");
        redis_key[at + 4] = b'w';
        redis_key
    }

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
            Subject::TollgateScript => {
                let reply: Vec<i64> = redis::cmd("EVALSHA")
                    .arg(&self.tollgate_sha)
                    .arg(1)
                    .arg(self.script_key(key))
                    .arg(&tollgate_arguments()[..])
                    .query_async(&mut self.raw.clone())
                    .await
                    .expect("tollgate's reply");
                assert_eq!(reply.first(), Some(&1));
            }
            Subject::FredTollgateScript => {
                let reply: Vec<i64> = self
                    .fred
                    .evalsha(
                        self.tollgate_sha.as_str(),
                        // One key of bytes (a Vec<u8> would be a key a byte).
                        fred::types::Key::from(&self.script_key(key)[..]),
                        tollgate_arguments().to_vec(),
                    )
                    .await
                    .expect("tollgate's reply through fred");
                assert_eq!(reply.first(), Some(&1));
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
    let tollgate_sha = load_tollgate(&mut raw).await;
    let fred = fred_at_most_once(url).await;
    let clients = Clients {
        limiter: RedisLimiter::builder(
            "lab",
            Quota::new(BURST, Duration::from_secs(SPAN_US)).expect("a quota"),
        )
        .build(connection)
        .expect("a limiter"),
        raw,
        fred,
        redis_rate_sha,
        tollgate_sha,
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
    // The server's own time per call (INFO commandstats), one task.
    let mut server_us = vec![Vec::new(); n];
    // The server's reads per call, 16 in flight: how well the client
    // batches its pipelined calls into writes.
    let mut reads = vec![Vec::new(); n];
    for round in 0..budget.rounds {
        for (m, (mode, _)) in modes.iter().enumerate() {
            for k in 0..n {
                let s = (round + k) % n;
                let single = matches!(mode, Mode::Single);
                let depth = matches!(mode, Mode::Depth);
                if single || depth {
                    reset_stats(&mut clients.raw.clone()).await;
                }
                let (rate, latency) = cell(&clients, SUBJECTS[s], *mode, budget.per_cell).await;
                rates[m][s].push(rate);
                if single {
                    latencies[s].push(latency);
                    let command = if matches!(SUBJECTS[s], Subject::Set | Subject::FredSet) {
                        "set"
                    } else {
                        "evalsha"
                    };
                    server_us[s].push(usec_per_call(&mut clients.raw.clone(), command).await);
                }
                if depth {
                    let calls = rate * budget.per_cell.as_secs_f64();
                    reads[s].push(reads_processed(&mut clients.raw.clone()).await / calls);
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
        (0, 3, "tollgate / its script by hand"),
        (4, 3, "fred / redis-rs, tollgate's script"),
        (5, 2, "fred / redis-rs, SET"),
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
    let server: Vec<String> = (0..n)
        .map(|s| format!("{} {:.2} µs", NAMES[s], median(&mut server_us[s].clone())))
        .collect();
    let (script, low, high) = ratio_spread(&server_us[0], &server_us[1]);
    println!(
        "The server's time per call, 1 task (INFO commandstats usec_per_call, median of the\nrounds): {};\ntollgate / redis_rate {script:.2}× ({low:.2}–{high:.2}).\n",
        server.join(", ")
    );
    let batched: Vec<String> = (0..n)
        .map(|s| format!("{} {:.3}", NAMES[s], median(&mut reads[s].clone())))
        .collect();
    println!(
        "The server's reads per call, 16 in flight (INFO stats total_reads_processed):\n{}.\n",
        batched.join(", ")
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

/// Zeroes the server's command statistics.
async fn reset_stats(raw: &mut ConnectionManager) {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(raw)
        .await
        .expect("CONFIG RESETSTAT");
}

/// The server's mean time per call of `command` since the statistics were
/// zeroed, µs.
async fn usec_per_call(raw: &mut ConnectionManager, command: &str) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|field| field.strip_prefix("usec_per_call="))
        })
        .and_then(|value| value.trim().parse().ok())
        .expect("usec_per_call in INFO commandstats")
}

/// The reads the server has processed since the statistics were zeroed.
async fn reads_processed(raw: &mut ConnectionManager) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(raw)
        .await
        .expect("INFO stats");
    info.lines()
        .find_map(|line| line.strip_prefix("total_reads_processed:"))
        .and_then(|value| value.trim().parse().ok())
        .expect("total_reads_processed in INFO stats")
}

/// Loads tollgate's script; its SHA-1.
async fn load_tollgate(raw: &mut ConnectionManager) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(tollgate_redis::SCRIPT)
        .query_async(raw)
        .await
        .expect("loading tollgate's script")
}

/// A call whose reply is lost after the script ran, for each client: a
/// proxy in front of the server forwards the call, drops the reply and
/// closes the client's connection (`redis/tests/support/proxy.rs`, the
/// at-most-once tests' own). Each client checks one unit of a fresh key
/// (10 per hour); the units the server then holds say how many times the
/// call ran.
async fn lost_replies(port: u16) {
    use fred::interfaces::{ClientLike, LuaInterface};
    println!("## A lost reply: how many times each client runs the call\n");
    println!("A proxy forwards one check of a fresh key, lets the server run it, drops the reply");
    println!("and closes the client's connection; the server's count after:\n");
    println!("| client | the caller got | units charged |");
    println!("|---|---|---:|");
    let url = format!("redis://127.0.0.1:{port}/");
    let quota = Quota::per_hour(10).expect("a quota");
    let direct = Connection::open(url.as_str()).await.expect("connecting");
    let observer = RedisLimiter::builder("lost", quota)
        .build(direct)
        .expect("a limiter");
    let charged = |user: &'static str| {
        let observer = &observer;
        async move {
            let peeked = observer.peek(user).await.expect("a peek");
            // What remains after the unit a peek would take.
            10 - 1 - peeked.remaining()
        }
    };
    // tollgate's connection (redis-rs, no resend).
    let proxy = Proxy::start(port).expect("a proxy");
    let through = Connection::open(format!("redis://127.0.0.1:{}/", proxy.port()).as_str())
        .await
        .expect("connecting through the proxy");
    let limiter = RedisLimiter::builder("lost", quota)
        .build(through)
        .expect("a limiter");
    proxy.lose_next_script_reply();
    let got = match limiter.check("tollgate").await {
        Ok(decision) => format!("admitted: {}", decision.is_allowed()),
        Err(error) => format!("error: {error}"),
    };
    println!(
        "| tollgate-redis (redis-rs) | {got} | {} |",
        charged("tollgate").await
    );
    // fred, with its default attempts (3) and at most once (1), both
    // reconnecting.
    for (label, attempts, user) in [
        ("fred, defaults (3 attempts)", 3, "fred-3"),
        ("fred, max_command_attempts = 1", 1, "fred-1"),
    ] {
        let proxy = Proxy::start(port).expect("a proxy");
        let client = fred::types::Builder::from_config(
            fred::types::config::Config::from_url(&format!("redis://127.0.0.1:{}/", proxy.port()))
                .expect("a fred config"),
        )
        .with_connection_config(|config| config.max_command_attempts = attempts)
        .set_policy(fred::types::config::ReconnectPolicy::new_constant(0, 50))
        .build()
        .expect("a fred client");
        client.init().await.expect("connecting with fred");
        let sha = tollgate_redis::SCRIPT;
        let loaded: String = client.script_load(sha).await.expect("SCRIPT LOAD");
        let mut arguments = tollgate_arguments();
        arguments[4] = quota.emission_interval().as_micros().to_string();
        arguments[5] = quota.burst().to_string();
        proxy.lose_next_script_reply();
        let reply: Result<Vec<i64>, _> = tokio::time::timeout(
            Duration::from_secs(5),
            client.evalsha(
                loaded.as_str(),
                fred::types::Key::from(&observer.redis_key(user)[..]),
                arguments.to_vec(),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("{label}: no answer in 5 s"));
        let got = match reply {
            Ok(reply) => format!("admitted: {}", reply.first() == Some(&1)),
            Err(error) => format!("error: {}", error.kind().to_str()),
        };
        println!("| {label} | {got} | {} |", charged(user).await);
        // Bounded: a quit through the proxy that cut the connection has
        // been seen to wait for ever (once in CI), holding the report.
        let _ = tokio::time::timeout(Duration::from_secs(5), client.quit()).await;
    }
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
